// RL post-training: the inference cost model (decode bound by HBM bandwidth, MTP), rollouts
// with a long tail, deployment modes, staleness, and the rl section's bad-input errors.
#include <catch2/catch.hpp>

#include <string>

#include "moesim/models/presets.hpp"
#include "moesim/strategies/rl/inference.hpp"
#include "moesim/strategies/rl/rl.hpp"
#include "moesim/topologies/topology.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {

const std::string kRoot = MOESIM_SOURCE_DIR;

nlohmann::json small_doc() {
  Diagnostics diag("rl_small.json");
  auto j = read_json_file(kRoot + "/tests/scenarios/rl_small.json", diag);
  REQUIRE(j);
  return *j;
}

RlSimulation run(const nlohmann::json& doc) { return simulate_rl(load_rl_scenario(doc, "rl_small.json", "")); }

double phase(const RlResult& r, const std::string& name) {
  for (const auto& p : r.phases)
    if (p.name == name) return p.seconds;
  FAIL("no phase " << name);
  return 0;
}

}  // namespace

TEST_CASE("rl: decode step at batch 1 takes the weight bytes over the HBM bandwidth", "[rl]") {
  // Llama-7B-like, 2 layers, hidden 4096, FFN 11008, 32 heads, vocab 32000, on one 910C die
  // with the per-kernel overhead set to 0. GEMM weights read per token:
  //   per layer qkv 4096 x 12288 = 50,331,648; o 4096 x 4096 = 16,777,216;
  //   gate+up 4096 x 22016 = 90,177,536; down 11008 x 4096 = 45,088,768  -> 202,375,168
  //   2 layers 404,750,336 + lm_head 4096 x 32000 = 131,072,000 -> 535,822,336 parameters
  //   x 2 bytes = 1,071,644,672 B over 1.6 TB/s x 0.8 (preset) = 837.2 us.
  // At batch 1 every GEMM is bound by its weight read (compute: 2 FLOPs per weight at the
  // 1/64 row-tile efficiency is about half of that), and the KV cache of 1 token, the
  // activations and the vector operators add well under 1%.
  Diagnostics diag("test");
  const auto model = models::load_model(nlohmann::json::parse(R"({
      "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
      "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000})"),
                                        "/model", diag, "");
  const auto cluster = topologies::load_cluster(
      nlohmann::json::parse(R"({"preset": "cloudmatrix-384", "devices": 16,
                                 "device": {"preset": "ascend-910c-die", "kernel_overhead": "0us"}})"),
      "/cluster", diag);
  REQUIRE(diag.ok());
  const auto topo = topologies::build_topology(cluster);
  const InferenceModel im(model, cluster, topo, InferencePlan{}, models::Precision::BF16);
  const double expected = 1071644672.0 / (1.6e12 * 0.8);
  const StepCost c = im.decode_step(1, 1.0);
  CHECK(c.seconds == Approx(expected).epsilon(0.01));
  CHECK(c.seconds >= expected);
  // The weights held per device are those bytes plus the embedding table (and the norms).
  CHECK(im.weight_bytes_per_device() == Approx(1071644672.0 + 2.0 * 4096 * 32000).epsilon(1e-4));
  // Memory-bound: doubling the batch costs almost nothing; the step is not compute-bound.
  CHECK(im.decode_step(2, 2.0).seconds < 1.02 * c.seconds);
}

TEST_CASE("rl: MLA keeps the compressed latent in the KV cache", "[rl]") {
  // 718B: (kv_lora 512 + rope 64) x 2 bytes = 1152 B per token and layer; 61 layers, not split by TP.
  Diagnostics diag("test");
  const auto model = models::load_model("pangu-ultra-moe-718b", "/model", diag, "");
  const auto cluster = topologies::load_cluster(nlohmann::json::parse(R"({"preset": "cloudmatrix-384", "devices": 768})"),
                                                "/cluster", diag);
  REQUIRE(diag.ok());
  const auto topo = topologies::build_topology(cluster);
  InferencePlan p;
  p.tp = 4;
  p.ep = 64;
  const InferenceModel im(model, cluster, topo, p, models::Precision::BF16);
  CHECK(im.kv_bytes_per_token_per_device() == Approx(1152.0 * 61));
  CHECK(im.kv_bytes_per_token_model() == Approx(1152.0 * 61));
}

TEST_CASE("rl: MTP with acceptance length > 1 shortens decode", "[rl]") {
  nlohmann::json doc = small_doc();
  const RlSimulation base = run(doc);
  doc["rl"]["inference"]["mtp"] = {{"draft_tokens", 1}, {"acceptance_length", 1.38}};
  const RlSimulation mtp = run(doc);
  CHECK(phase(mtp.result, "rollout") < phase(base.result, "rollout"));
  // Accepting exactly one token per step with a draft only adds work.
  doc["rl"]["inference"]["mtp"]["acceptance_length"] = 1.0;
  const RlSimulation useless = run(doc);
  CHECK(phase(useless.result, "rollout") > phase(base.result, "rollout"));
}

TEST_CASE("rl: refilling finished slots shortens the rollout phase", "[rl]") {
  // 256 rollouts per step on 4 instances of 16 slots: four waves each; without refill every
  // wave waits for its longest response.
  nlohmann::json doc = small_doc();
  doc["rl"]["inference"]["refill"] = false;
  const RlSimulation waves = run(doc);
  doc["rl"]["inference"]["refill"] = true;
  const RlSimulation refill = run(doc);
  CHECK(phase(refill.result, "rollout") < phase(waves.result, "rollout"));
  CHECK(refill.result.long_tail_share < waves.result.long_tail_share);
  CHECK(waves.result.long_tail_share > 0.2);
}

TEST_CASE("rl: staleness 0 is exactly the synchronous schedule", "[rl]") {
  for (const char* mode : {"colocated", "disaggregated"}) {
    nlohmann::json doc = small_doc();
    doc["rl"]["mode"] = mode;
    if (std::string(mode) == "disaggregated") doc["rl"]["inference"]["devices"] = 16;
    const RlSimulation s = run(doc);
    // Every phase of every step one after the other: the makespan is the sum of all durations.
    Tick sum = 0;
    for (sim::TaskId t = 0; t < s.graph.num_tasks(); ++t) sum += s.graph.duration(t);
    CHECK(s.run.makespan == sum);
    double phases = 0;
    for (const auto& p : s.result.phases) phases += p.seconds;
    CHECK(s.result.step_time_s == Approx(phases).epsilon(1e-9));
  }
}

TEST_CASE("rl: co-location without switch cost never loses to disaggregation", "[rl]") {
  nlohmann::json doc = small_doc();
  doc["rl"]["switch_cost"] = "free";
  const RlSimulation colo = run(doc);
  for (int inference : {16, 24}) {
    nlohmann::json d = small_doc();
    d["rl"]["mode"] = "disaggregated";
    d["rl"]["inference"]["devices"] = inference;
    const RlSimulation dis = run(d);
    INFO("inference devices " << inference);
    CHECK(colo.result.step_time_s <= dis.result.step_time_s);
  }
}

TEST_CASE("rl: staleness overlaps rollouts with training and fills the tail", "[rl]") {
  nlohmann::json doc = small_doc();
  doc["rl"]["mode"] = "disaggregated";
  doc["rl"]["inference"]["devices"] = 16;
  doc["rl"]["steps_simulated"] = 6;
  const RlSimulation sync = run(doc);
  doc["rl"]["staleness"] = 1;
  const RlSimulation stale = run(doc);
  CHECK(stale.result.step_time_s < sync.result.step_time_s);
  nlohmann::json colo = small_doc();
  colo["rl"]["steps_simulated"] = 6;
  const RlSimulation csync = run(colo);
  colo["rl"]["staleness"] = 1;
  const RlSimulation cstale = run(colo);
  CHECK(phase(cstale.result, "rollout") < phase(csync.result, "rollout"));
}

TEST_CASE("rl: same scenario and seed give the same result", "[rl]") {
  const nlohmann::json doc = small_doc();
  const RlScenario s = load_rl_scenario(doc, "rl_small.json", "");
  const std::string a = to_json(simulate_rl(s).result, s, false).dump(2);
  const std::string b = to_json(simulate_rl(s).result, s, false).dump(2);
  CHECK(a == b);
  CHECK(a.find("wall_s") == std::string::npos);
}

TEST_CASE("rl: bad input names the path and the constraint, all at once", "[rl]") {
  nlohmann::json doc = small_doc();
  doc["rl"]["response_length"]["max"] = 8192;      // + prompt 512 > context 4096
  doc["rl"]["inference"]["ep"] = 3;                // divides neither the experts nor the pool
  try {
    (void)load_rl_scenario(doc, "rl_small.json", "");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    std::string all;
    for (const auto& d : e.diagnostics()) all += d.to_string() + "\n";
    INFO(all);
    CHECK(all.find("/rl/response_length/max: 8192 plus the longest prompt (512) is 8704 tokens, longer than the context of "
                   "4096") != std::string::npos);
    CHECK(all.find("/rl/inference/expert_parallel_size: 3 must divide the policy's num_experts=32") != std::string::npos);
    CHECK(all.find("must divide the inference pool's 32 devices") != std::string::npos);
  }
  // Rollouts that do not fit the KV cache.
  nlohmann::json kv = small_doc();
  kv["rl"]["inference"]["max_batch_size"] = 100000000;
  try {
    (void)load_rl_scenario(kv, "rl_small.json", "");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    REQUIRE(e.diagnostics().size() == 1);
    CHECK(e.diagnostics()[0].pointer == "/rl/inference/max_batch_size");
    CHECK(e.diagnostics()[0].constraint.find("do not fit KV memory") != std::string::npos);
  }
  nlohmann::json one = small_doc();
  one["rl"]["prompt_length"] = 64;
  one["rl"]["response_length"] = {{"distribution", "uniform"}, {"min", 1000}, {"max", 4000}};
  one["rl"]["max_context"] = 4096;
  one["cluster"]["device"] = {{"preset", "ascend-910c-die"}, {"hbm", {{"capacity", "4.3GiB"}}}};
  try {
    (void)load_rl_scenario(one, "rl_small.json", "");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    std::string all;
    for (const auto& d : e.diagnostics()) all += d.to_string() + "\n";
    INFO(all);
    CHECK(all.find("the rollouts do not fit KV memory") != std::string::npos);
  }
  // Disaggregated without an inference pool.
  nlohmann::json dis = small_doc();
  dis["rl"]["mode"] = "disaggregated";
  CHECK_THROWS_WITH(load_rl_scenario(dis, "rl_small.json", ""),
                    Catch::Contains("/rl/inference/devices: 0 must give the inference pool"));
}

TEST_CASE("rl: decode uses the low-latency all-to-all: a fixed cost and a small step per peer", "[rl]") {
  // Qwen3-MoE-like, 4 MoE layers, EP8 on one CloudMatrix 384 supernode. At one sequence the
  // bytes are negligible: each MoE layer's dispatch and combine cost base + 7 x per_peer =
  // 64 + 7 x 0.83 = 69.81 us (the preset's fit to DeepEP-Ascend's low-latency points).
  Diagnostics diag("test");
  const auto model = models::load_model(nlohmann::json::parse(R"({
      "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 1024, "intermediate_size": 4096,
      "moe_intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 16,
      "num_key_value_heads": 4, "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4,
      "vocab_size": 32000})"),
                                        "/model", diag, "");
  auto cluster_json = nlohmann::json::parse(R"({"preset": "cloudmatrix-384", "devices": 16})");
  const auto cluster = topologies::load_cluster(cluster_json, "/cluster", diag);
  cluster_json["scale_up"] = {{"alltoall_low_latency_base", "0us"}};
  const auto normal = topologies::load_cluster(cluster_json, "/cluster", diag);
  REQUIRE(diag.ok());
  InferencePlan p;
  p.ep = 8;
  const auto topo = topologies::build_topology(cluster);
  const InferenceModel ll(model, cluster, topo, p, models::Precision::BF16);
  const InferenceModel nm(model, normal, topo, p, models::Precision::BF16);
  const double per_a2a = 64e-6 + 7 * 0.83e-6;
  CHECK(ll.decode_breakdown(1, 1.0).ep_comm == Approx(4 * 2 * per_a2a).epsilon(0.01));
  // Without them, decode pays the normal kernels' step per peer (15 us x 7 per all-to-all).
  CHECK(nm.decode_breakdown(1, 1.0).ep_comm == Approx(4 * 2 * 7 * 15e-6).epsilon(0.02));
}
