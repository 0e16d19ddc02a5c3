// tools/validate: published step times by each source's own definition, case conversion.
#include <catch2/catch.hpp>

#include "moesim/strategies/output/simulate.hpp"
#include "validate.hpp"

using namespace moesim;
using namespace moesim::tools;
using nlohmann::json;

namespace {
json gpt_1t_case() {
  // calibration case_010 without its derived iteration time.
  return json::parse(R"({
    "id": "case_010", "category": "megatron_sc21_weak_scaling",
    "model": {"name": "GPT-1T", "type": "dense", "layers": 128, "hidden": 25600, "ffn_hidden": 102400,
              "heads": 160, "kv_heads": 160, "vocab": 51200, "seq_len": 2048, "mlp": "gelu"},
    "hardware": {"device": "NVIDIA A100 SXM 80GB", "count": 3072, "precision": "fp16 mixed precision"},
    "parallelism": {"tp": 8, "pp": 64, "vpp": null, "dp": 6, "cp": null, "ep": null, "etp": null,
                    "sequence_parallel": false, "zero_or_fsdp": null},
    "batch": {"micro_batch": 1, "global_batch": 3072, "tokens_per_batch": 6291456},
    "recompute": "full activation recomputation of every transformer layer",
    "measured": {"tflops_per_gpu": 163, "pct_of_peak": 52},
    "derived": {},
    "flops_definition": "paper Eq.(3): 96*B*s*l*h^2*(1+s/(6h)+V/(16*l*h)); % of peak vs 312 TFLOP/s fp16"})");
}
}  // namespace

TEST_CASE("validate: TFLOP/s convert to a step time with the source's own formula", "[validate]") {
  // 96 B s l h^2 (1 + s/6h + V/16lh) with B 3072, s 2048, l 128, h 25600, V 51200:
  //   96 x 3072 x 2048 x 128 x 655,360,000 = 5.0665e19, x (1 + 0.013333 + 0.000977) = 5.1390e19
  //   FLOPs per iteration; / (163 TFLOP/s x 3072 GPUs) = 102.63 s, the case file's own figure.
  const PublishedTime p = published_step_time(gpt_1t_case());
  REQUIRE(p.skip_reason.empty());
  CHECK(p.step_s == Approx(102.63).epsilon(0.001));
  CHECK(p.basis.find("96Bslh^2") != std::string::npos);
}

TEST_CASE("validate: an MFU converts with the stated peak", "[validate]") {
  json c = gpt_1t_case();
  c["measured"] = {{"mfu_pct", 52.0}};
  c["flops_definition"] = "96*B*s*l*h^2*(1+s/6h+V/16lh) vs 312 TFLOP/s";
  const PublishedTime p = published_step_time(c);
  // 5.1390e19 / (0.52 x 312e12 x 3072) = 103.1 s
  CHECK(p.step_s == Approx(5.13896e19 / (0.52 * 312e12 * 3072)).epsilon(0.001));
  // Without a stated peak an MFU cannot be converted: skipped with the reason.
  c["flops_definition"] = "MindSpeed MFU; FLOP formula and NPU peak used not stated";
  CHECK_FALSE(published_step_time(c).skip_reason.empty());
}

TEST_CASE("validate: NeMo's llama formula gives 482 GFLOP per token for Llama3-70B at 8K", "[validate]") {
  // gbs s l h^2 (12 + 12 kv/heads + 18 ffn/h + 12 s/h + 6 V/(l h)) per token:
  // 80 x 8192^2 x (12 + 1.5 + 63 + 12 + 1.1743) = 481.5e9 (the case file notes 734e12 / 1524).
  json c = json::parse(R"({
    "id": "x", "model": {"name": "Llama3-70B", "type": "dense", "layers": 80, "hidden": 8192, "ffn_hidden": 28672,
      "heads": 64, "kv_heads": 8, "vocab": 128256, "mlp": "swiglu", "seq_len": 8192},
    "hardware": {"device": "H100", "count": 1}, "batch": {"global_batch": 1},
    "measured": {"model_tflops_per_gpu": 1.0}, "flops_definition": "NeMo model TFLOP/s"})");
  const PublishedTime p = published_step_time(c);
  // step = FLOPs / (1 TFLOP/s x 1 GPU): FLOPs per 8192-token sequence / 1e12.
  CHECK(p.step_s * 1e12 / 8192 == Approx(481.5e9).epsilon(0.001));
}

TEST_CASE("validate: a case becomes a scenario that loads", "[validate]") {
  const ConvertedCase conv = case_to_scenario(gpt_1t_case());
  REQUIRE(conv.skip_reason.empty());
  CHECK(conv.scenario["cluster"]["preset"] == "dgx-a100");
  CHECK(conv.scenario["parallelism"]["recompute_granularity"] == "full");
  CHECK(conv.scenario["training"]["precision"] == "fp16");
  CHECK(conv.scenario["training"]["attention_kernel"] == "unfused");
  const strategies::Scenario s = strategies::load_scenario(conv.scenario, "t", "");
  CHECK(s.plan.dp == 6);
  CHECK(s.plan.num_microbatches == 512);
}

TEST_CASE("validate: Megatron pipeline layouts become layer counts per virtual stage", "[validate]") {
  // DeepSeek-V3 on GB200 (case_174): "Et|(tt|)*30L" -> embedding + 1 layer, 30 x 2 layers, loss.
  json c = json::parse(R"J({
    "id": "case_174", "category": "megatron_dsv3_gb200_optimization",
    "model": {"name": "DeepSeek-V3", "type": "moe", "layers": 61, "hidden": 7168, "heads": 128, "kv_heads": 128,
      "vocab": 129280, "seq_len": 4096,
      "moe": {"num_experts": 256, "top_k": 8, "expert_ffn_hidden": 2048, "shared_experts": 1, "dense_layers": 3,
              "dense_ffn_hidden": 18432},
      "arch_notes": "MLA: q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128"},
    "hardware": {"device": "NVIDIA GB200 NVL72", "count": 256, "precision": "mxfp8"},
    "parallelism": {"tp": 1, "pp": 8, "vpp": 4, "dp": 32, "cp": 1, "ep": 32, "etp": 1,
                    "sequence_parallel": false, "zero_or_fsdp": "distributed optimizer",
                    "pp_layout": "Et|(tt|)*30L (32 virtual stages)", "token_dispatcher": "alltoall"},
    "batch": {"micro_batch": 1, "global_batch": 2048}, "recompute": "selective: dense-layer MLP + MLA up_proj",
    "measured": {"tflops_per_gpu": 494}, "derived": {"tokens_per_sec_per_gpu": 1974.0},
    "flops_definition": "Megatron-Core model FLOPs", "notes": "no MTP in launch script"})J");
  const ConvertedCase conv = case_to_scenario(c);
  REQUIRE(conv.skip_reason.empty());
  const auto counts = conv.scenario["parallelism"]["pipeline_layer_partition"].get<std::vector<int>>();
  REQUIRE(counts.size() == 32);
  CHECK(counts.front() == 1);
  CHECK(counts[1] == 2);
  CHECK(counts.back() == 0);
  CHECK(conv.scenario["model"]["num_nextn_predict_layers"] == 0);
  CHECK(conv.scenario["model"]["kv_lora_rank"] == 512);
  const auto mods = conv.scenario["parallelism"]["recompute_modules"];
  CHECK(mods.size() == 2);
  const strategies::Scenario s = strategies::load_scenario(conv.scenario, "t", "");
  CHECK(s.plan.ep_size() == 32);
}

TEST_CASE("validate: model-zoo cases split layers + embedding + loss evenly and overlap DP; FSDP overlaps",
          "[validate]") {
  // Qwen3-235B (case_160 shape): 94 layers + embedding + loss = 96 slots over PP8 x VPP4 = 32
  // virtual stages, 3 each: the first and last virtual stages hold 2 layers (Megatron's
  // --account-for-embedding/loss-in-pipeline-split in the zoo's benchmarking yaml).
  json c = json::parse(R"J({
    "id": "case_160", "category": "megatron_moe_modelzoo",
    "model": {"name": "Qwen3-235B-A22B", "type": "moe", "layers": 94, "hidden": 4096, "heads": 64, "kv_heads": 4,
      "vocab": 151936, "seq_len": 4096, "arch_notes": "head_dim 128, QK-norm",
      "moe": {"num_experts": 128, "top_k": 8, "expert_ffn_hidden": 1536, "shared_experts": 0, "dense_layers": 0}},
    "hardware": {"device": "NVIDIA H100 80GB", "count": 256, "precision": "bf16"},
    "parallelism": {"tp": 4, "pp": 8, "vpp": 4, "dp": 8, "cp": 1, "ep": 8, "etp": 1, "sequence_parallel": true,
                    "zero_or_fsdp": "distributed optimizer", "token_dispatcher": "DeepEP"},
    "batch": {"micro_batch": 1, "global_batch": 2048}, "recompute": "none",
    "measured": {"step_time_s": 29.0}, "flops_definition": "Megatron-Core num_floating_point_operations"})J");
  ConvertedCase conv = case_to_scenario(c);
  REQUIRE(conv.skip_reason.empty());
  const auto counts = conv.scenario["parallelism"]["pipeline_layer_partition"].get<std::vector<int>>();
  REQUIRE(counts.size() == 32);
  CHECK(counts.front() == 2);
  CHECK(counts[1] == 3);
  CHECK(counts.back() == 2);
  CHECK(conv.scenario["parallelism"]["overlap_grad_reduce"] == true);
  CHECK(conv.scenario["parallelism"]["overlap_param_gather"] == true);
  // PP32 x VPP3 = 96 virtual stages: embedding alone on the first, the loss alone on the last.
  c["parallelism"]["pp"] = 32;
  c["parallelism"]["vpp"] = 3;
  conv = case_to_scenario(c);
  const auto c96 = conv.scenario["parallelism"]["pipeline_layer_partition"].get<std::vector<int>>();
  REQUIRE(c96.size() == 96);
  CHECK(c96.front() == 0);
  CHECK(c96[1] == 1);
  CHECK(c96.back() == 0);
  CHECK_NOTHROW(strategies::load_scenario(conv.scenario, "t", ""));
  // Outside the zoo, Megatron-FSDP still overlaps its gathers and reduce-scatters.
  c["category"] = "other";
  c["parallelism"]["pp"] = 1;
  c["parallelism"]["vpp"] = nullptr;
  c["parallelism"]["zero_or_fsdp"] = "Megatron-FSDP on";
  conv = case_to_scenario(c);
  CHECK(conv.scenario["parallelism"]["pipeline_layer_partition"] == "auto");
  CHECK(conv.scenario["parallelism"]["overlap_grad_reduce"] == true);
  CHECK(conv.scenario["parallelism"]["overlap_param_gather"] == true);
}
