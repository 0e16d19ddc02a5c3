// tools/validate: published step times by each source's own definition, case conversion.
#include <cmath>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "moesim/strategies/output/simulate.hpp"
#include "crossval.hpp"
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
  CHECK(conv.scenario["software"] == "megatron-lm-2021");  // the source's stack, not rules here
  const strategies::Scenario s = strategies::load_scenario(conv.scenario, "t", "");
  CHECK(s.plan.dp == 6);
  CHECK(s.plan.num_microbatches == 512);
  // The stack's facts: unfused attention and dropout 0.1, recorded as applied.
  CHECK(s.training.workload.attention == models::AttentionKernel::Unfused);
  CHECK(s.training.workload.dropout == 0.1);
  CHECK(s.software.applied == std::vector<std::string>{"attention_kernel=\"unfused\"", "dropout=0.1"});
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

TEST_CASE("validate: model-zoo cases split layers + embedding + loss evenly and overlap DP, FSDP overlaps",
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

namespace {
// A small Llama (8 layers, 2048 wide) on 16 H100s, two pipeline stages, as a ready scenario.
json small_memory_case() {
  return json::parse(R"({
    "id": "mem_002", "category": "memory_test",
    "scenario": {
      "model": {"name": "small-llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
                "intermediate_size": 5632, "num_hidden_layers": 8, "num_attention_heads": 16,
                "num_key_value_heads": 4, "vocab_size": 32000},
      "cluster": {"preset": "dgx-h100", "devices": 16},
      "training": {"seq_length": 2048, "global_batch_size": 64},
      "parallelism": {"tp": 1, "pp": 2, "mbs": 1}},
    "measured": {"step_time_s": 1.0, "peak_memory_gib": 20.0}})");
}

ValidateOptions fast() {
  ValidateOptions opt;
  opt.fidelity = strategies::Fidelity::Fast;
  return opt;
}
}  // namespace

TEST_CASE("validate: the memory error compares the measured peak with the worst stage without the reserve",
          "[validate]") {
  const json c = small_memory_case();
  const ValidationReport rep = validate(json::array({c}), "mem.json", fast());
  REQUIRE(rep.cases.size() == 1);
  const CaseOutcome& o = rep.cases[0];
  REQUIRE(o.status == "ok");
  // By hand from the same scenario's simulation: the stage with the largest total, less the
  // runtime reserve that PyTorch's allocator statistics do not see.
  strategies::Scenario sc = strategies::load_scenario(c["scenario"], "t", "");
  strategies::set_fidelity(sc, strategies::Fidelity::Fast);
  const strategies::Result res = strategies::simulate(sc).result;
  REQUIRE(res.stages.size() == 2);
  const auto& m0 = res.stages[0].memory;
  const auto& m1 = res.stages[1].memory;
  const auto& worst = m1.total() > m0.total() ? m1 : m0;
  REQUIRE(worst.reserved_bytes > 0);  // else "without the reserve" would not be tested
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double allocated = (worst.total() - worst.reserved_bytes) / gib;
  CHECK(o.predicted_allocated_gib == Approx(allocated).epsilon(1e-12));
  CHECK(o.predicted_peak_gib == Approx(worst.total() / gib).epsilon(1e-12));
  CHECK(o.capacity_gib == Approx(80.0));
  REQUIRE(o.measured_peak_gib.has_value());
  CHECK(o.memory_error_pct == Approx(100.0 * (allocated - 20.0) / 20.0).epsilon(1e-12));
  CHECK(rep.memory.n == 1);
  CHECK(rep.memory.mean_abs_pct == Approx(std::abs(o.memory_error_pct)));
  CHECK(rep.memory.worst == "mem_002");
  CHECK(rep.all.n == 1);  // it has a step time too: counted in both
  CHECK(rep.predicted_not_to_fit.empty());
  // The same peak in GB (1e9 bytes) is 20e9 / 2^30 GiB.
  json in_gb = c;
  in_gb["measured"] = {{"step_time_s", 1.0}, {"peak_memory", 20.0}, {"unit", "GB"}};
  const CaseOutcome g = validate(json::array({in_gb}), "mem.json", fast()).cases.at(0);
  REQUIRE(g.measured_peak_gib.has_value());
  CHECK(*g.measured_peak_gib == Approx(20e9 / gib));
  CHECK(g.memory_error_pct == Approx(100.0 * (allocated - 20e9 / gib) / (20e9 / gib)));
  // JSON: the memory fields per case and in the summary, the step-time keys unchanged.
  const json j = to_json(rep);
  CHECK(j["cases"][0]["predicted_allocated_gib"].get<double>() == Approx(allocated));
  CHECK(j["cases"][0]["measured_peak_gib"] == 20.0);
  CHECK(j["cases"][0]["memory_error_pct"].get<double>() == Approx(o.memory_error_pct));
  CHECK(j["cases"][0].contains("error_pct"));
  CHECK(j["summary"]["memory"]["cases"] == 1);
  CHECK(j["summary"]["predicted_not_to_fit"].empty());
}

TEST_CASE("validate: a peak logged by one rank is compared with that rank's pipeline stage", "[validate]") {
  // Megatron-LM logs the last rank's peak; the case says so with measured.peak_memory_stage.
  const json c = small_memory_case();
  strategies::Scenario sc = strategies::load_scenario(c["scenario"], "t", "");
  strategies::set_fidelity(sc, strategies::Fidelity::Fast);
  const strategies::Result res = strategies::simulate(sc).result;
  REQUIRE(res.stages.size() == 2);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  auto allocated = [&](std::size_t s) { return (res.stages[s].memory.total() - res.stages[s].memory.reserved_bytes) / gib; };
  REQUIRE(allocated(0) != Approx(allocated(1)));  // else the stage would not matter
  for (const auto& [stage, index] : std::vector<std::pair<json, int>>{{"first", 0}, {"last", 1}, {0, 0}, {1, 1}}) {
    json x = c;
    x["measured"]["peak_memory_stage"] = stage;
    const CaseOutcome o = validate(json::array({x}), "mem.json", fast()).cases.at(0);
    REQUIRE(o.status == "ok");
    CHECK(o.memory_stage == index);
    CHECK(o.predicted_allocated_gib == Approx(allocated(static_cast<std::size_t>(index))).epsilon(1e-12));
    CHECK(o.memory_error_pct == Approx(100.0 * (allocated(static_cast<std::size_t>(index)) - 20.0) / 20.0).epsilon(1e-12));
    // The infeasibility verdict stays the worst stage's.
    CHECK(o.predicted_peak_gib == Approx(res.peak_memory_bytes / gib).epsilon(1e-12));
  }
  // A stage that is not one: an error naming the file, the path and the value.
  json bad = c;
  bad["measured"]["peak_memory_stage"] = "middle";
  const CaseOutcome e = validate(json::array({bad}), "mem.json", fast()).cases.at(0);
  CHECK(e.status == "error");
  CHECK(e.reason.find("mem.json") != std::string::npos);
  CHECK(e.reason.find("/measured/peak_memory_stage") != std::string::npos);
  CHECK(e.reason.find("middle") != std::string::npos);
}

TEST_CASE("validate: a case with only a measured peak runs for memory and stays out of the step-time figures",
          "[validate]") {
  json mem_only = small_memory_case();
  mem_only["id"] = "mem_003";
  mem_only["measured"] = {{"peak_memory", 20.0}, {"unit", "GiB"}};
  json timed = small_memory_case();
  timed["id"] = "run_004";
  timed["measured"] = {{"step_time_s", 1.0}};
  const ValidationReport rep = validate(json::array({mem_only, timed}), "mem.json", fast());
  REQUIRE(rep.cases.size() == 2);
  const CaseOutcome& o = rep.cases[0];
  CHECK(o.status == "ok");  // not skipped for its missing step time
  CHECK_FALSE(o.timed);
  CHECK(o.predicted_allocated_gib > 0);
  CHECK(rep.skipped == 0);
  CHECK(rep.ran == 2);
  // Step-time statistics hold only the timed case; memory statistics only the measured peak.
  CHECK(rep.all.n == 1);
  CHECK(rep.all.worst == "run_004");
  CHECK(rep.held_out.n == 0);  // mem_003 (odd) would have been the held-out half's only case
  REQUIRE(rep.by_category.size() == 1);
  CHECK(rep.by_category[0].second.n == 1);
  CHECK(rep.memory.n == 1);
  CHECK(rep.memory.worst == "mem_003");
  const json j = to_json(rep);
  CHECK_FALSE(j["cases"][0].contains("error_pct"));
  CHECK_FALSE(j["cases"][0].contains("published_s"));
  CHECK(j["cases"][0].contains("memory_error_pct"));
  CHECK_FALSE(j["cases"][1].contains("memory_error_pct"));
  CHECK(j["cases"][1].contains("predicted_peak_gib"));
  // Markdown: the memory columns, dashes for what was not measured.
  const std::string md = to_markdown(rep);
  CHECK(md.find("| peak GiB | memory error |") != std::string::npos);
  CHECK(md.find(fmt::format("memory (measured peaks): 1 cases, mean |error| {:.1f}%", std::abs(o.memory_error_pct))) !=
        std::string::npos);
  CHECK(md.find("predicted not to fit: 0 of 2 runs that ran") != std::string::npos);
  const auto row = [&](const std::string& id) {
    const auto at = md.find("| " + id);
    REQUIRE(at != std::string::npos);
    return md.substr(at, md.find('\n', at) - at);
  };
  const std::string peak = fmt::format("| {:.1f}/80 |", o.predicted_peak_gib);
  CHECK(row("mem_003").find(peak + fmt::format(" {:+.1f}% |", o.memory_error_pct)) != std::string::npos);
  CHECK(row("mem_003").find("| — | — | — |") != std::string::npos);  // published s, predicted s, error
  CHECK(row("run_004*").find(peak + " — |") != std::string::npos);
}

TEST_CASE("validate: a measured peak in another unit is an error naming the file, path and value", "[validate]") {
  json c = small_memory_case();
  c["id"] = "mem_004";
  c["measured"] = {{"step_time_s", 1.0}, {"peak_memory", 20000}, {"unit", "MB"}};
  json ok = small_memory_case();
  const ValidationReport rep = validate(json{{"cases", json::array({ok, c})}}, "mem.json", fast());
  REQUIRE(rep.cases.size() == 2);
  CHECK(rep.cases[0].status == "ok");  // the others still run
  CHECK(rep.cases[1].status == "error");
  CHECK(rep.errors == 1);
  CHECK(rep.cases[1].reason.find("mem.json:/cases/1/measured/unit: \"MB\" must be \"GiB\" or \"GB\"") !=
        std::string::npos);
  c["measured"] = {{"peak_memory", 20000}};
  CHECK(validate(json::array({c}), "mem.json", fast()).cases[0].reason.find("mem.json:/0/measured/unit: is required") !=
        std::string::npos);
  c["measured"] = {{"peak_memory_gib", "20"}};
  CHECK(validate(json::array({c}), "mem.json", fast()).cases[0].reason.find(
            "mem.json:/0/measured/peak_memory_gib: \"20\" must be a positive number") != std::string::npos);
}

TEST_CASE("validate: runs predicted not to fit are listed", "[validate]") {
  json c = small_memory_case();
  c["id"] = "big_006";
  c["scenario"]["model"] = "llama3-70b";  // 70B on one stage with no sharding: far beyond 80 GiB
  c["scenario"]["parallelism"] = {{"tp", 1}, {"pp", 1}, {"mbs", 1}};
  c["scenario"]["cluster"]["devices"] = 8;
  const ValidationReport rep = validate(json::array({c, small_memory_case()}), "mem.json", fast());
  REQUIRE(rep.cases.at(0).status == "ok");
  CHECK_FALSE(rep.cases[0].feasible);
  CHECK(rep.predicted_not_to_fit == std::vector<std::string>{"big_006"});
  CHECK(to_markdown(rep).find("predicted not to fit: 1 of 2 runs that ran (big_006)") != std::string::npos);
  CHECK(to_json(rep)["summary"]["predicted_not_to_fit"] == json::array({"big_006"}));
}

TEST_CASE("validate: several files at once, ids unique across them, any id's last digit gives the split",
          "[validate]") {
  json a = small_memory_case();
  a["id"] = "run-2024-12-04-001";  // a long id of digits (used to overflow stoi)
  json b = small_memory_case();
  b["id"] = "run-2024-12-04-002";
  b["source_group"] = "my_cluster_logs";
  json dup = small_memory_case();
  dup["id"] = "run-2024-12-04-001";
  const ValidationReport rep =
      validate(std::vector<CaseFile>{{"a.json", json::array({a})}, {"b.json", json{{"cases", json::array({b, dup})}}}},
               fast());
  REQUIRE(rep.cases.size() == 3);
  CHECK(rep.file == "a.json, b.json");
  CHECK(rep.cases[0].status == "ok");
  CHECK(rep.cases[0].held_out);
  CHECK(rep.cases[0].file == "a.json");
  CHECK(rep.cases[0].source == "memory_test");  // no source_group: the category
  CHECK_FALSE(rep.cases[1].held_out);
  CHECK(rep.cases[1].source == "my_cluster_logs");
  CHECK(rep.cases[2].status == "error");
  CHECK(rep.cases[2].reason ==
        "b.json:/cases/1/id: \"run-2024-12-04-001\" is already the id of an earlier case (ids must be unique across files)");
  // A file that is not a list of cases is named, with the others.
  CHECK_THROWS_WITH(validate(std::vector<CaseFile>{{"x.json", json(3)}, {"y.json", json("z")}}, fast()),
                    Catch::Contains("x.json") && Catch::Contains("y.json") && Catch::Contains("must be a list of cases"));
}

TEST_CASE("cross-validation: a source is predicted with parameters fitted on the others only", "[validate][crossval]") {
  // Three runs of one small A100 model. Sources A and B published the step time moesim gives at
  // a GEMM efficiency of 0.80; source C published one 30% slower. Leaving A out, the fit on B
  // and C lands between, and A's prediction error is what C's disagreement costs; leaving C out,
  // the fit on A and B finds 0.80 again and C's own 30% shows in full (it cannot pull the fit
  // towards itself).
  json base = small_memory_case();
  base["scenario"]["cluster"] = {{"preset", "dgx-a100"}, {"devices", 16}};
  base["measured"] = json::object();
  strategies::Scenario sc = strategies::load_scenario(base["scenario"], "t", "");
  json dev = {{"preset", "a100-sxm-80gb"}, {"gemm_peak_efficiency", 0.8}};
  json doc = base["scenario"];
  doc["cluster"]["device"] = dev;
  strategies::Scenario at80 = strategies::load_scenario(doc, "t", "");
  strategies::set_fidelity(at80, strategies::Fidelity::Fast);
  const double t80 = strategies::simulate(at80).result.step_time_s;
  auto make = [&](const char* id, const char* src, double t) {
    json c = base;
    c["id"] = id;
    c["source_group"] = src;
    c["measured"] = {{"step_time_s", t}};
    return c;
  };
  const json cases = json::array({make("a_002", "A", t80), make("b_004", "B", t80), make("c_006", "C", 1.3 * t80)});
  const ValidationReport rep = validate(cases, "cv.json", fast());
  CrossValidationOptions copt;
  copt.threads = 2;
  const CrossValidation cv = cross_validate(rep, fit_groups(), fast(), copt);
  REQUIRE(cv.cases.size() == 3);
  for (const auto& c : cv.cases) CHECK(c.group == "a100");
  CHECK(cv.simulations == 3 * 9);  // a100: GEMM and HBM efficiency, 3 x 3 grid each
  const auto& a = cv.cases[0];
  const auto& c = cv.cases[2];
  // Leaving C out: fitted on A and B (both at 0.80), C is predicted at t80: -23% (1/1.3 - 1).
  CHECK(c.loso_error_pct == Approx(100.0 * (1 / 1.3 - 1)).margin(1.5));
  // Leaving A out: B and C disagree; the mean absolute error is minimised anywhere between
  // them, so A's error is between 0 and +30%.
  CHECK(a.loso_error_pct >= -1.0);
  CHECK(a.loso_error_pct <= 31.0);
  CHECK(cv.by_source.size() == 3);
  CHECK(cv.bands.at("all").second == 3);
  const std::string md = to_markdown(cv);
  CHECK(md.find("| leave one source out | 3 |") != std::string::npos);
  CHECK(to_json(cv)["by_source"].contains("C"));
}

TEST_CASE("simulate: every result carries the cross-validated step-time error band of its cluster", "[validate]") {
  strategies::Scenario sc = strategies::load_scenario(small_memory_case()["scenario"], "t", "");
  strategies::set_fidelity(sc, strategies::Fidelity::Fast);
  const strategies::Result r = strategies::simulate(sc).result;
  REQUIRE(r.error_band.has_value());
  const auto band = strategies::error_band_for("dgx-h100");
  REQUIRE(band.has_value());
  CHECK(r.error_band->scope == "dgx-h100");
  CHECK(r.error_band->within_pct == band->within_pct);
  CHECK(r.error_band->within_pct > 0);
  CHECK(r.error_band->runs >= 5);
  CHECK(strategies::error_band_for("no-such-cluster")->scope == "all");
  const json j = strategies::to_json(r, sc, false);
  CHECK(j["step_time_error_band"]["within_pct"] == band->within_pct);
  CHECK(j["step_time_error_band"]["scope"] == "dgx-h100");
}

TEST_CASE("validate: FSDP named as off is not FSDP", "[validate]") {
  json c = gpt_1t_case();
  for (const char* off : {"distributed optimizer (recipe default; table FSDP=0)", "no FSDP", "FSDP: off"}) {
    c["parallelism"]["zero_or_fsdp"] = off;
    const json p = case_to_scenario(c).scenario["parallelism"];
    CHECK_FALSE(p.contains("data_parallel_sharding_strategy"));
  }
  c["parallelism"]["zero_or_fsdp"] = "distributed optimizer (recipe default; table FSDP=0)";
  CHECK(case_to_scenario(c).scenario["parallelism"]["use_distributed_optimizer"] == true);
  c["parallelism"]["zero_or_fsdp"] = "Megatron-FSDP (optim_grads_params)";
  CHECK(case_to_scenario(c).scenario["parallelism"]["data_parallel_sharding_strategy"] == "optim_grads_params");
  // A stated ZeRO stage 2 keeps the parameters whole; ZeRO-3-like FSDP shards them.
  c["parallelism"]["zero_or_fsdp"] = "FSDP (ZeRO-2-like per paper: optimizer states and gradients sharded)";
  CHECK(case_to_scenario(c).scenario["parallelism"]["data_parallel_sharding_strategy"] == "optim_grads");
  c["parallelism"]["zero_or_fsdp"] = "FSDP2 (torch fully_shard, ZeRO-3-like), degree 8";
  CHECK(case_to_scenario(c).scenario["parallelism"]["data_parallel_sharding_strategy"] == "optim_grads_params");
}

TEST_CASE("software stack: defaults only where the scenario is silent, conditions respected", "[validate][software]") {
  json doc = small_memory_case()["scenario"];
  doc["parallelism"] = {{"tp", 2}, {"pp", 2}, {"mbs", 1}};
  doc["software"] = "nemo-2-perf";
  strategies::Scenario s = strategies::load_scenario(doc, "t", "");
  CHECK(s.software.name == "nemo-2-perf");
  CHECK(s.software.framework == "NeMo");
  CHECK(s.plan.distributed_optimizer);
  CHECK(s.plan.overlap_grad_reduce);
  CHECK(s.plan.overlap_param_gather);
  CHECK(s.plan.sequence_parallel);  // TP > 1: TP overlap needs sequence parallelism
  CHECK(s.plan.tp_comm_overlap);
  CHECK(s.plan.grad_reduce_in_bf16);
  // What the scenario says wins; TP 1 gets no TP overlap; no optimizer sharding, no DP overlap.
  doc["parallelism"] = {{"tp", 1}, {"pp", 2}, {"mbs", 1}, {"use_distributed_optimizer", false}};
  s = strategies::load_scenario(doc, "t", "");
  CHECK_FALSE(s.plan.distributed_optimizer);
  CHECK_FALSE(s.plan.overlap_param_gather);
  CHECK_FALSE(s.plan.tp_comm_overlap);
  // CUDA graphs: no host time per operator unless the scenario sets host dispatch.
  doc["software"] = "cuda-graphs";
  CHECK(strategies::load_scenario(doc, "t", "").simulation.launch_overhead == 0.0);
  doc.erase("software");
  CHECK(strategies::load_scenario(doc, "t", "").simulation.launch_overhead > 0.0);  // H100's fitted host time
  // An unknown stack is named with the known ones.
  doc["software"] = "nemo-3";
  CHECK_THROWS_WITH(strategies::load_scenario(doc, "t", ""),
                    Catch::Contains("/software: \"nemo-3\" is not a software stack preset") &&
                        Catch::Contains("nemo-2-perf"));
  // The result says which stack ran.
  doc["software"] = "nemo-2";
  strategies::Scenario n = strategies::load_scenario(doc, "t", "");
  strategies::set_fidelity(n, strategies::Fidelity::Fast);
  CHECK(strategies::to_json(strategies::simulate(n).result, n, false)["software"]["name"] == "nemo-2");
}

TEST_CASE("validate: 'full (every TransformerBlock)' is uniform full recompute, Megatron's block method is block",
          "[validate]") {
  json c = gpt_1t_case();
  c["recompute"] = "full (every TransformerBlock)";
  CHECK(case_to_scenario(c).scenario["parallelism"]["recompute_method"] == "uniform");
  c["recompute"] = "full, block, 8 (--recompute-granularity full --recompute-method block --recompute-num-layers 8)";
  const json p = case_to_scenario(c).scenario["parallelism"];
  CHECK(p["recompute_method"] == "block");
  CHECK(p["recompute_num_layers"] == 8);
}

TEST_CASE("software stack: torchtitan's FlashAttention-2 uses the device's FA2 efficiencies", "[validate][software]") {
  json doc = small_memory_case()["scenario"];  // H100
  strategies::Scenario best = strategies::load_scenario(doc, "t", "");
  doc["software"] = "torchtitan-2024";
  strategies::Scenario fa2 = strategies::load_scenario(doc, "t", "");
  CHECK(fa2.cluster.device.attention_fwd_efficiency == 0.374);  // FlashAttention-3 paper's FA2 figure
  CHECK(fa2.cluster.device.attention_bwd_efficiency == 0.326);
  CHECK(fa2.cluster.device.attention_flash2);
  CHECK(best.cluster.device.attention_fwd_efficiency == 0.6);
  CHECK(fa2.training.workload.cross_entropy == models::CrossEntropy::PyTorch);
  strategies::set_fidelity(best, strategies::Fidelity::Fast);
  strategies::set_fidelity(fa2, strategies::Fidelity::Fast);
  CHECK(strategies::simulate(fa2).result.step_time_s > strategies::simulate(best).result.step_time_s);
  // A device without FA2 figures refuses it by name.
  doc["cluster"] = {{"preset", "atlas-800t-a2"}, {"devices", 16}};
  doc.erase("software");
  doc["training"]["attention_kernel"] = "flash2";
  CHECK_THROWS_WITH(strategies::load_scenario(doc, "t", ""),
                    Catch::Contains("/training/attention_kernel") && Catch::Contains("attention_efficiency_fa2") &&
                        Catch::Contains("ascend-910b2"));
}

TEST_CASE("validate: BLOOM's Jean Zay nodes are their own cluster (four Omni-Path links per node)", "[validate]") {
  json c = gpt_1t_case();
  c["hardware"]["device"] = "NVIDIA A100 SXM 80GB (Jean Zay gpu_p5: 8 GPUs/node, NVLink, 4x Omni-Path 100 Gb/s per node)";
  const json s = case_to_scenario(c).scenario;
  CHECK(s["cluster"]["preset"] == "jean-zay-a100");
  const strategies::Scenario sc = strategies::load_scenario(s, "t", "");
  CHECK(sc.cluster.nics_per_node == 4);
  CHECK(sc.cluster.nic_bandwidth.value() == Approx(100e9 / 8));
  CHECK(sc.cluster.device.name == "a100-sxm-80gb");  // the same device: the same fit group
}

TEST_CASE("validate: a sliding window in the model notes bounds the attention (Mistral-7B, 4K window at 32K)",
          "[validate]") {
  // MindSpeed-LLM's Mistral-7B script passes --sliding-window 4096: a banded causal mask, so a
  // query attends to w - w^2/(2s) = 4096 - 4096^2/65536 = 3840 keys on average, not s/2 = 16384.
  json c = json::parse(R"J({
    "id": "asc_924", "category": "ascend_mindspeed_llm",
    "model": {"name": "Mistral-7B", "type": "dense", "layers": 32, "hidden": 4096, "ffn_hidden": 14336,
      "heads": 32, "kv_heads": 8, "vocab": 32000, "seq_len": 32768, "mlp": "swiglu",
      "arch_notes": "sliding window 4096 (--sliding-window 4096)"},
    "hardware": {"device": "Atlas 900 A2 PODc", "count": 8, "precision": "bf16"},
    "parallelism": {"tp": 8, "pp": 1, "dp": 1, "cp": 1, "sequence_parallel": true},
    "batch": {"micro_batch": 1, "global_batch": 32}, "recompute": "none",
    "measured": {"tokens_per_sec_per_npu": 2900}})J");
  const ConvertedCase conv = case_to_scenario(c);
  REQUIRE(conv.skip_reason.empty());
  CHECK(conv.scenario["model"]["sliding_window"] == 4096);
  const strategies::Scenario s = strategies::load_scenario(conv.scenario, "t", "");
  REQUIRE(s.model.sliding_window == 4096);
  // Attention FLOPs per token and layer: 2 x heads x (d_qk + d_v) x keys = 2 x 32 x 256 x 3840.
  auto attention_flops = [](const models::Workload& w) {
    double f = 0;
    for (const auto& prog : w.programs)
      if (prog.name == "dense_layer")
        for (const auto& op : prog.ops)
          if (op.kind == models::OpKind::Attention) f += op.forward_model_flops_per_token(32768);
    return f;
  };
  const double windowed = attention_flops(models::build_workload(s.model, 32768));
  CHECK(windowed == Approx(2.0 * 32 * 256 * 3840));
  c["model"].erase("arch_notes");
  const strategies::Scenario full = strategies::load_scenario(case_to_scenario(c).scenario, "t", "");
  CHECK(attention_flops(models::build_workload(full.model, 32768)) == Approx(2.0 * 32 * 256 * 16384));
}

TEST_CASE("scenario: training.elementwise \"eager\" reaches the workload, a wrong value is named", "[validate][software]") {
  json doc = small_memory_case()["scenario"];
  doc["training"]["elementwise"] = "eager";
  const strategies::Scenario s = strategies::load_scenario(doc, "t", "");
  CHECK(s.training.workload.eager_elementwise);
  doc["training"]["elementwise"] = "compiled";
  try {
    (void)strategies::load_scenario(doc, "t.json", "");
    FAIL("a bad elementwise value was accepted");
  } catch (const std::exception& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("/training/elementwise") && Catch::Contains("compiled"));
  }
}

TEST_CASE("validate: torchtitan's 'op' SAC policy is operator-level selective checkpointing", "[validate]") {
  json c = gpt_1t_case();
  c["recompute"] = "selective (torchtitan 'op' SAC policy: saves mm outputs except every second mm, SDPA outputs)";
  CHECK(case_to_scenario(c).scenario["parallelism"]["recompute_granularity"] == "selective_op");
  c["recompute"] = "selective: layernorm, moe_act";
  const json p = case_to_scenario(c).scenario["parallelism"];
  CHECK(p["recompute_granularity"] == "selective");
  CHECK(p["recompute_modules"] == json::array({"layernorm", "moe_act"}));
}

TEST_CASE("validate: a case that states unfused attention gets it (BLOOM-176B on MindSpeed without --use-flash-attn)",
          "[validate]") {
  json c = gpt_1t_case();
  CHECK_FALSE(case_to_scenario(c).scenario["training"].contains("attention_kernel"));
  c["software"] = {{"framework", "MindSpeed-LLM"}, {"year", 2024},
                   {"attention_kernel", "unfused (the script has no --use-flash-attn)"}};
  const ConvertedCase conv = case_to_scenario(c);
  CHECK(conv.scenario["training"]["attention_kernel"] == "unfused");
  const strategies::Scenario s = strategies::load_scenario(conv.scenario, "t", "");
  CHECK(s.training.workload.attention == models::AttentionKernel::Unfused);
}

TEST_CASE("validate: a run's stated CUDA graphs remove host launches, keeping its stack", "[validate][software]") {
  json c = gpt_1t_case();
  c["category"] = "nemo_perf_summary_25.09_megatron_bridge";
  c["software"] = {{"framework", "Megatron-Bridge"}, {"year", 2025}, {"cuda_graphs", true}};
  const ConvertedCase conv = case_to_scenario(c);
  REQUIRE(conv.scenario["software"].is_object());
  CHECK(conv.scenario["software"]["preset"] == "nemo-2-perf");
  CHECK(conv.scenario["software"]["host_dispatch"] == "graphs");
  const strategies::Scenario s = strategies::load_scenario(conv.scenario, "t", "");
  CHECK(s.software.host_graphs);
  CHECK(s.simulation.launch_overhead == 0.0);
  CHECK(s.plan.distributed_optimizer);  // the stack's defaults still apply
  c["software"]["cuda_graphs"] = false;
  CHECK(case_to_scenario(c).scenario["software"] == "nemo-2-perf");
}
