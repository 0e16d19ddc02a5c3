// models/: presets, the Hugging Face loader, the workload generator and the compute model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>

#include "moesim/models/presets.hpp"
#include "moesim/models/workload.hpp"

using namespace moesim;
using namespace moesim::models;

namespace {
ModelSpec preset_model(const std::string& name) {
  Diagnostics diag("test");
  ModelSpec m = load_model(name, "/model", diag, "");
  REQUIRE(diag.ok());
  return m;
}
}  // namespace

TEST_CASE("models: Llama3-70B model FLOPs per token match the hand count", "[models][flops]") {
  // Per layer, MACs per token (h 8192, 64 heads of 128, 8 KV heads, FFN 28672), s = 4096:
  //   q, k, v, o projections: 8192 x (8192 + 1024 + 1024 + 8192)   = 150,994,944
  //   SwiGLU MLP:              3 x 8192 x 28672                    = 704,643,072
  //   QK^T and AV, causal:     2 x 64 x 128 x 4096 / 2             =  33,554,432
  //   layer total                                                  = 889,192,448
  // 80 layers = 71,135,395,840; LM head 8192 x 128256 = 1,050,673,152;
  // total 72,186,068,992 MACs -> x 2 FLOPs x 3 (fwd + bwd) = 433,116,413,952 FLOPs per token.
  const Workload w = build_workload(preset_model("llama3-70b"), 4096);
  CHECK(w.model_flops_per_token == Approx(433'116'413'952.0).epsilon(0.005));
}

TEST_CASE("models: Pangu Ultra MoE 718B model FLOPs per token match the hand count", "[models][flops]") {
  // MLA per layer (h 7680, 128 heads, q_lora 1536, kv_lora 512, qk 128+64, v 128), MACs/token:
  //   q_down 7680x1536 = 11,796,480; kv_down 7680x576 = 4,423,680; q_up 1536x128x192 = 37,748,736
  //   kv_up 512x128x256 = 16,777,216; o_proj 16384x7680 = 125,829,120      -> 196,575,232
  //   QK^T + AV causal at s = 4096: 128 x (192 + 128) x 2048                ->  83,886,080
  // Dense MLP 3x7680x18432 = 424,673,280; MoE: router 7680x256 = 1,966,080 plus
  //   (8 routed + 1 shared) x 3 x 7680 x 2048 = 424,673,280                 -> 426,639,360
  // 3 dense layers x 705,134,592 + 58 MoE layers x 707,100,672 = 43,127,242,752
  // LM head 7680 x 153600 = 1,179,648,000
  // MTP: eh_proj 15360x7680 = 117,964,800 + MoE layer 707,100,672 + head 1,179,648,000
  // total 46,311,604,224 MACs x 6 = 277,869,625,344 FLOPs per token.
  const ModelSpec m = preset_model("pangu-ultra-moe-718b");
  CHECK(m.num_layers == 61);
  CHECK(m.num_moe_layers() == 58);
  CHECK(m.mtp_layers == 1);
  const Workload w = build_workload(m, 4096);
  CHECK(w.model_flops_per_token == Approx(277'869'625'344.0).epsilon(0.005));
}

TEST_CASE("models: parameter counts of the presets match the published sizes", "[models][params]") {
  // Published totals: Llama3-70B 70.6B, DeepSeek-V3 671B (+14B MTP), Pangu 718B, Qwen3 235B,
  // Mixtral 8x22B 141B. Norm weights and the MTP module make small differences.
  CHECK(build_workload(preset_model("llama3-70b"), 4096).params_total / 1e9 == Approx(70.6).epsilon(0.01));
  CHECK(build_workload(preset_model("deepseek-v3"), 4096).params_total / 1e9 == Approx(671 + 14).epsilon(0.02));
  CHECK(build_workload(preset_model("pangu-ultra-moe-718b"), 4096).params_total / 1e9 == Approx(718 + 12).epsilon(0.03));
  CHECK(build_workload(preset_model("qwen3-235b-a22b"), 4096).params_total / 1e9 == Approx(235).epsilon(0.01));
  CHECK(build_workload(preset_model("mixtral-8x22b"), 4096).params_total / 1e9 == Approx(141).epsilon(0.01));
  // Active parameters: Pangu 39B per token (published), Qwen3 22B.
  CHECK(build_workload(preset_model("pangu-ultra-moe-718b"), 4096).params_active_per_token / 1e9 ==
        Approx(39 + 3).epsilon(0.05));
}

TEST_CASE("models: every preset loads and every preset number has a source", "[models][presets]") {
  for (const auto& name : preset_names("device")) {
    INFO(name);
    auto j = *preset_json("device", name);
    // Every number sits inside a {"value", "source"} object.
    std::function<void(const nlohmann::json&, bool)> walk = [&](const nlohmann::json& x, bool sourced) {
      if (x.is_object()) {
        const bool s = x.contains("value") && x.contains("source");
        for (auto it = x.begin(); it != x.end(); ++it) walk(it.value(), sourced || s);
      } else if (x.is_array()) {
        for (const auto& e : x) walk(e, sourced);
      } else if (x.is_number()) {
        CHECK(sourced);
      }
    };
    walk(j, false);
    Diagnostics diag("test");
    const DeviceSpec d = load_device(name, "/device", diag);
    CHECK(diag.ok());
    CHECK(d.peak_bf16.value() > 1e14);
    CHECK(d.hbm_capacity.value() > 30e9);
  }
  for (const auto& name : preset_names("model")) {
    INFO(name);
    const ModelSpec m = preset_model(name);
    CHECK(m.num_layers > 0);
    CHECK(build_workload(m, 4096).model_flops_per_token > 0);
  }
}

TEST_CASE("models: the Hugging Face loader rejects keys it does not understand", "[models][loader]") {
  auto j = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000,
    "rope_theta": 10000, "num_experts_per_layer_magic": 4})");
  Diagnostics diag("config.json");
  parse_model_config(j, "", diag);
  REQUIRE(diag.list().size() == 1);
  CHECK(diag.list()[0].pointer == "/num_experts_per_layer_magic");
  // Listing it as irrelevant accepts it.
  j["moesim_ignore_keys"] = {"num_experts_per_layer_magic"};
  Diagnostics diag2("config.json");
  parse_model_config(j, "", diag2);
  CHECK(diag2.ok());
}

TEST_CASE("models: the loader understands each supported family", "[models][loader]") {
  Diagnostics diag("t");
  const ModelSpec q = preset_model("qwen3-235b-a22b");
  CHECK(q.num_experts == 128);
  CHECK(q.num_moe_layers() == 94);
  CHECK(q.head_dim == 128);
  const ModelSpec d = preset_model("deepseek-v3");
  CHECK(d.attention == AttentionKind::MLA);
  CHECK(d.num_moe_layers() == 58);
  const ModelSpec g = preset_model("gpt3-175b");
  CHECK(g.mlp == MlpKind::GELU);
  CHECK(g.ffn_hidden == 49152);
  CHECK(g.tie_embeddings);
  const ModelSpec x = preset_model("mixtral-8x22b");
  CHECK(x.top_k == 2);
  CHECK(x.expert_ffn_hidden == 16384);
}

TEST_CASE("models: GEMM efficiency follows tile and wave quantisation", "[models][compute]") {
  Diagnostics diag("t");
  DeviceSpec d = load_device("ascend-910b2", "/d", diag);
  d.gemm_tiles = {GemmTile{128, 256}};
  d.gemm_k_overhead = 0;
  const ComputeModel cm(d);
  // 24 tiles of 128x256 fill the 24 cube cores exactly once: full efficiency.
  CHECK(cm.gemm_efficiency(128 * 4, 256 * 6, 4096) == Approx(d.gemm_peak_efficiency));
  // 25 tiles need two waves of 24 slots: 25 / 48 of the slots do useful work.
  CHECK(cm.gemm_efficiency(128 * 5, 256 * 5, 4096) == Approx(d.gemm_peak_efficiency * 25.0 / 48.0));
  // Half-filled tiles in M: 64 useful rows of 128.
  CHECK(cm.gemm_efficiency(64 * 4, 256 * 6, 4096) == Approx(d.gemm_peak_efficiency * 0.5));
  // A large GEMM is compute-bound: time = 2MNK / (peak x efficiency) + overhead.
  const double m = 8192, n = 8192, k = 8192;
  const double expect = 2 * m * n * k / (d.peak_bf16.value() * cm.gemm_efficiency(m, n, k)) + d.kernel_overhead.value();
  CHECK(cm.gemm(m, n, k, Precision::BF16).value() == Approx(expect));
  // A skinny GEMM (one row) against 128x256 tiles: 32 tiles in 2 waves of 24 slots, so
  // 8192 useful outputs of 2 x 24 x 128 x 256 slots; K term 8192 / (8192 + 0). Its time is the
  // larger of that compute time and streaming the 8192 x 8192 weights through HBM.
  const double util = 8192.0 / (2 * 24 * 128 * 256);
  const double t_compute = 2.0 * 8192 * 8192 / (d.peak_bf16.value() * d.gemm_peak_efficiency * util);
  const double t_memory = ((1.0 * 8192 + 8192.0 * 8192) * 2.0 + 8192 * 2.0) / (d.hbm_bandwidth.value() * d.hbm_efficiency);
  CHECK(cm.gemm(1, 8192, 8192, Precision::BF16).value() ==
        Approx(std::max(t_compute, t_memory) + d.kernel_overhead.value()));
}

TEST_CASE("models: a power limit below the rating slows tensor work by the cube-law clock", "[models][compute]") {
  Diagnostics diag("t");
  const DeviceSpec rated = load_device("h100-sxm-80gb", "/d", diag);
  REQUIRE(diag.ok());
  CHECK(rated.clock_fraction() == 1.0);  // no limit: the rated clock
  DeviceSpec capped = load_device(nlohmann::json::parse(R"({"preset": "h100-sxm-80gb", "power": {"limit_watts": 500}})"),
                                  "/d", diag);
  REQUIRE(diag.ok());
  // 700 W rated, 100 W static: the clock settles where 100 + 600 (f/f0)^3 = 500 W.
  const double f = std::cbrt(400.0 / 600.0);
  CHECK(capped.clock_fraction() == Approx(f));
  CHECK(f == Approx(0.8736).epsilon(1e-3));
  // A compute-bound GEMM takes 1/f as long (less the fixed kernel overhead); a streaming
  // operator (HBM-bound) does not change; MFU's peak stays the datasheet one.
  const ComputeModel a(rated), b(capped);
  const double o = rated.kernel_overhead.value();
  CHECK((b.gemm(8192, 8192, 8192, Precision::BF16).value() - o) ==
        Approx((a.gemm(8192, 8192, 8192, Precision::BF16).value() - o) / f));
  CHECK(b.memory_bound(Bytes{1e9}).value() == Approx(a.memory_bound(Bytes{1e9}).value()));
  CHECK(capped.mfu_peak(Precision::BF16).value() == rated.mfu_peak(Precision::BF16).value());
  // A limit at or above the rating does nothing; one at or below the static power is refused.
  DeviceSpec over = load_device(nlohmann::json::parse(R"({"preset": "h100-sxm-80gb", "power": {"limit_watts": 800}})"),
                                "/d", diag);
  CHECK(over.clock_fraction() == 1.0);
  Diagnostics bad("t");
  (void)load_device(nlohmann::json::parse(R"({"preset": "h100-sxm-80gb", "power": {"limit_watts": 90}})"), "/d", bad);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.list().front().pointer == "/d/power/limit_watts");
}

TEST_CASE("models: published GEMM micro-benchmarks correct the shape model where they were measured",
          "[models][compute]") {
  Diagnostics diag("t");
  const DeviceSpec d = load_device("h100-sxm-80gb", "/d", diag);
  REQUIRE(diag.ok());
  // DeepGEMM's H800 table (16 rows with M >= 256): FP8 only.
  REQUIRE(d.gemm_benchmarks.size() == 16);
  const ComputeModel cm(d);
  const double peak8 = d.peak_fp8.value();
  // At a benchmarked shape the model gives the measured throughput times the framework's
  // fraction of it: 4096 x 7168 x 16384 ran at 1426 TFLOP/s.
  CHECK(cm.gemm_efficiency(4096, 7168, 16384, 1, Precision::FP8) ==
        Approx(d.gemm_fp8_efficiency * 1426e12 / peak8));
  // A grouped benchmark (4 groups of 8192 rows, N 4096, K 7168: 1346 TFLOP/s), through the
  // grouped-GEMM path: compute time = FLOPs / (peak x efficiency) + the kernel overhead.
  const std::vector<double> rows(4, 8192.0), ks(4, 7168.0);
  const double flops = 4 * 2.0 * 8192 * 4096 * 7168;
  CHECK(cm.grouped_gemm(rows, ks, 4096, Precision::FP8).value() ==
        Approx(flops / (peak8 * d.gemm_fp8_efficiency * 1346e12 / peak8) + d.kernel_overhead.value()));
  // BF16 has no benchmarks here: the shape model alone.
  CHECK(cm.gemm_efficiency(4096, 7168, 16384, 1, Precision::BF16) ==
        Approx(d.gemm_peak_efficiency * gemm_shape_efficiency(d, 4096, 7168, 16384)));
  // Between benchmarks the correction is an average of theirs: within their range.
  double lo = 1e9, hi = 0;
  for (const auto& b : d.gemm_benchmarks) {
    lo = std::min(lo, std::exp(b.log_ratio));
    hi = std::max(hi, std::exp(b.log_ratio));
  }
  const double mid = gemm_benchmark_correction(d, 3000, 5000, 4096, Precision::FP8);
  CHECK(mid >= lo);
  CHECK(mid <= hi);
  // Leave one out: each benchmark predicted from the others. The shape model with the
  // interpolated correction transfers better than the shape model at one fitted scale (the
  // geometric mean ratio): the table carries the K dependence the tile model lacks
  // (4096 x 32768 x 512 runs at 751 TFLOP/s, 38% of peak).
  double sq_interp = 0, sq_flat = 0, worst = 0;
  double mean_log = 0;
  for (const auto& b : d.gemm_benchmarks) mean_log += b.log_ratio / static_cast<double>(d.gemm_benchmarks.size());
  for (std::size_t i = 0; i < d.gemm_benchmarks.size(); ++i) {
    DeviceSpec others = d;
    others.gemm_benchmarks.erase(others.gemm_benchmarks.begin() + static_cast<std::ptrdiff_t>(i));
    const GemmBenchmark& b = d.gemm_benchmarks[i];
    const double e = std::log(gemm_benchmark_correction(others, b.m, b.n, b.k, Precision::FP8)) - b.log_ratio;
    sq_interp += e * e;
    worst = std::max(worst, std::abs(e));
    sq_flat += (mean_log - b.log_ratio) * (mean_log - b.log_ratio);
  }
  const double rms_interp = std::sqrt(sq_interp / 16), rms_flat = std::sqrt(sq_flat / 16);
  INFO("leave-one-out rms " << rms_interp << " (one scale: " << rms_flat << "), worst " << worst);
  CHECK(rms_interp < rms_flat);
  CHECK(rms_interp < 0.12);
  // Bad rows are named: a throughput above the peak, a missing dimension.
  Diagnostics bad("t");
  (void)load_device(nlohmann::json::parse(R"({"preset": "h100-sxm-80gb", "gemm_benchmarks": [
      {"precision": "fp8", "m": 4096, "n": 4096, "k": 4096, "tflops": 2500}, {"precision": "bf16", "m": 4096, "n": 4096, "tflops": 600}]})"),
                    "/d", bad);
  REQUIRE(bad.list().size() == 2);
  CHECK(bad.list()[0].pointer == "/d/gemm_benchmarks/0/tflops");
  CHECK(bad.list()[1].pointer == "/d/gemm_benchmarks/1/k");
}

TEST_CASE("models: eager PyTorch norms, RoPE and SwiGLU move the traffic of their kernel chains", "[models][workload]") {
  // torchtitan without torch.compile: RMSNorm 36 bytes per element against a fused kernel's 4,
  // RoPE 20 against 4, SwiGLU 10 per hidden element against 6 (workload.cpp derives each).
  const ModelSpec m = preset_model("llama3-70b");
  WorkloadOptions eager;
  eager.eager_elementwise = true;
  const Workload fused_w = build_workload(m, 8192), eager_w = build_workload(m, 8192, eager);
  auto bytes = [](const Workload& w, const std::string& name) {
    for (const auto& p : w.programs)
      for (const auto& op : p.ops)
        if (op.name == name) return op.bytes_per_token;
    return -1.0;
  };
  CHECK(bytes(eager_w, "attn_norm") == Approx(9.0 * bytes(fused_w, "attn_norm")));
  CHECK(bytes(eager_w, "final_norm") == Approx(9.0 * bytes(fused_w, "final_norm")));
  CHECK(bytes(eager_w, "rope") == Approx(5.0 * bytes(fused_w, "rope")));
  CHECK(bytes(eager_w, "mlp_act") == Approx(5.0 / 3.0 * bytes(fused_w, "mlp_act")));
  // Residual adds are one kernel either way; GEMMs and model FLOPs do not change.
  CHECK(bytes(eager_w, "attn_residual") == Approx(bytes(fused_w, "attn_residual")));
  CHECK(eager_w.model_flops_per_token == Approx(fused_w.model_flops_per_token));
  // A LayerNorm model keeps its norms (torch's LayerNorm is one kernel); GELU is one kernel.
  ModelSpec gpt = preset_model("gpt3-175b");
  REQUIRE(gpt.norm == NormKind::LayerNorm);
  const Workload g0 = build_workload(gpt, 2048), g1 = build_workload(gpt, 2048, eager);
  CHECK(bytes(g1, "attn_norm") == Approx(bytes(g0, "attn_norm")));
  CHECK(bytes(g1, "mlp_act") == Approx(bytes(g0, "mlp_act")));
}

TEST_CASE("models: the K-loop's fixed cost covers twice the K elements in FP8", "[models][compute]") {
  Diagnostics diag("t");
  DeviceSpec d = load_device("b200-sxm-180gb", "/d", diag);
  REQUIRE(diag.ok());
  d.gemm_tiles = {GemmTile{128, 128}};
  d.gemm_k_overhead = 400;
  CHECK(gemm_k_overhead(d, Precision::BF16) == 400);
  CHECK(gemm_k_overhead(d, Precision::FP8) == 800);
  // 148 tiles of 128 x 128 fill B200's 148 SMs once: only the K term remains.
  // K = 768 (a fine-grained expert's down projection): 768 / 1168 in BF16, 768 / 1568 in FP8.
  CHECK(gemm_shape_efficiency(d, 128 * 4, 128 * 37, 768, 1, Precision::BF16) == Approx(768.0 / 1168.0));
  CHECK(gemm_shape_efficiency(d, 128 * 4, 128 * 37, 768, 1, Precision::FP8) == Approx(768.0 / 1568.0));
}

TEST_CASE("models: attention follows the published micro-benchmarks' fall-off with sequence, mask and head dim",
          "[models][compute]") {
  Diagnostics diag("t");
  const DeviceSpec d = load_device("h100-sxm-80gb", "/d", diag);
  REQUIRE(diag.ok());
  REQUIRE(d.attention_benchmarks.size() == 8);  // cuDNN and FA2: fwd (3 series) and bwd (1) each
  // The reference: cuDNN forward, non-causal, head dim 128 at 16K (595 TFLOP/s).
  CHECK(attention_shape_factor(d, 16384, 128, false, false) == Approx(1.0));
  // At a measured point: causal 4K ran at 518 TFLOP/s.
  CHECK(attention_shape_factor(d, 4096, 128, true, false) == Approx(518.0 / 595));
  // Between points, linear in log2(seq): causal at 2^11.5 is halfway between 484 and 518.
  CHECK(attention_shape_factor(d, std::exp2(11.5), 128, true, false) == Approx(501.0 / 595));
  // Head dim 192 (MLA's 192/128): halfway in log2 between 128 and 256 at 8K causal
  // (529 and 497): log2(192) - 7 = 0.585.
  const double w = std::log2(192.0) - 7.0;
  CHECK(attention_shape_factor(d, 8192, 192, true, false) == Approx(((1 - w) * 529 + w * 497) / 595));
  // Outside the measured range: clamped.
  CHECK(attention_shape_factor(d, 256, 128, true, false) == Approx(315.0 / 595));
  CHECK(attention_shape_factor(d, 131072, 128, true, false) == Approx(539.0 / 595));
  // Backward has no causal series: the non-causal one (8K: 518 of 516 at 16K) times the
  // forward's mask ratio at 8K (529 / 600).
  CHECK(attention_shape_factor(d, 8192, 128, true, true) == Approx(518.0 / 516 * 529.0 / 600));
  // Through the compute model: a causal 4K forward at 0.6 x 518/595 of peak (+ launch).
  const ComputeModel cm(d);
  const double bh = 32, s = 4096, flops = 2.0 * bh * s * s * 256 * 0.5;
  CHECK(cm.attention(bh, s, s, 128, 128, true, 0, Precision::BF16).value() ==
        Approx(flops / (d.peak_bf16.value() * 0.6 * 518.0 / 595) + d.kernel_overhead.value()));
  // FlashAttention-2's series when the scenario runs FA2.
  DeviceSpec fa2 = d;
  fa2.attention_flash2 = true;
  CHECK(attention_shape_factor(fa2, 2048, 128, true, false) == Approx(298.0 / 370));
  // A device without benchmarks keeps its constant efficiency.
  const DeviceSpec a = load_device("ascend-910b2", "/d", diag);
  CHECK(attention_shape_factor(a, 1024, 128, true, true) == 1.0);
  // Bad series are named: lengths that differ, a descending sequence, a causal-only kernel.
  Diagnostics bad("t");
  (void)load_device(nlohmann::json::parse(R"({"preset": "h100-sxm-80gb", "attention_benchmarks": [
      {"kernel": "flash", "direction": "forward", "causal": false, "seq": [512, 1024], "tflops": [300]},
      {"kernel": "flash", "direction": "forward", "causal": false, "seq": [1024, 512], "tflops": [300, 400]}]})"),
                    "/d", bad);
  REQUIRE(bad.list().size() == 2);
  CHECK(bad.list()[0].pointer == "/d/attention_benchmarks/0");
  CHECK(bad.list()[1].pointer == "/d/attention_benchmarks/1/seq/1");
  Diagnostics ref("t");
  (void)load_device(nlohmann::json::parse(R"({"preset": "h100-sxm-80gb", "attention_benchmarks": [
      {"kernel": "flash2", "direction": "backward", "causal": true, "seq": [512], "tflops": [300]}]})"),
                    "/d", ref);
  REQUIRE(ref.list().size() == 1);
  CHECK(ref.list()[0].constraint.find("no non-causal one") != std::string::npos);
}
