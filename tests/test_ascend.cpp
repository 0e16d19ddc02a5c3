// Ascend-native input (issue 21): MindSpeed's flags mean what MindSpeed means or are refused
// with the reason, and a command line that contradicts the scenario is an error.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "moesim/models/presets.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/search/search.hpp"
#include "moesim/topologies/collectives.hpp"
#include "shapes.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {

const std::string kPangu = std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-ultra-moe-718b.json";

/// The 718B scenario with its parallelism given as a command line (plus `extra` keys).
nlohmann::json pangu_with_args(const std::string& args, const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json doc = {{"model", "pangu-ultra-moe-718b"},
                        {"cluster", {{"preset", "atlas-800t-a2"}, {"devices", 6144}}},
                        {"training", {{"seq_length", 4096}, {"global_batch_size", 6144}}}};
  doc["parallelism"] = extra;
  doc["parallelism"]["megatron_args"] =
      "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --virtual-pipeline-model-parallel-size 2 "
      "--expert-model-parallel-size 4 --moe-tp-extend-ep --micro-batch-size 2 --sequence-parallel "
      "--use-distributed-optimizer " +
      args;
  return doc;
}

Scenario load_args(const std::string& args, const nlohmann::json& extra = nlohmann::json::object()) {
  return load_scenario(pangu_with_args(args, extra), "t.json", "");
}

/// The problems of loading the command line, one string each ("" when it loads).
std::vector<std::string> problems(const std::string& args, const nlohmann::json& extra = nlohmann::json::object()) {
  std::vector<std::string> out;
  try {
    (void)load_args(args, extra);
  } catch (const ConfigError& e) {
    for (const auto& d : e.diagnostics()) out.push_back(d.to_string());
  }
  return out;
}

bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const auto& s : v)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("mindspeed flags: each one sets what MindSpeed means", "[ascend][plan]") {
  namespace rc = models::recompute;
  CHECK(load_args("--use-mc2").plan.tp_comm_overlap);  // MC2: TP collectives fused with their matmuls
  CHECK(load_args("--moe-alltoall-overlap-comm").plan.shared_expert_overlap);
  CHECK(load_args("--moe-fb-overlap").plan.fb_overlap);
  CHECK(load_args("--swap-optimizer").plan.swap_optimizer);
  CHECK(load_args("--schedules-method dualpipev").plan.schedule ==
        ScheduleKind::DualPipeV);
  CHECK(load_args("--moe-hierarchical-alltoallv").plan.alltoall == AllToAllAlgo::AllGather);
  {
    const Plan p = load_args("--recompute-activation-function").plan;
    CHECK(p.recompute == Recompute::Selective);
    CHECK(p.recompute_modules == rc::kActivation);  // the activation function alone, not core_attn
  }
  {
    const Plan p = load_args("--moe-zero-memory level0").plan;
    CHECK(p.recompute == Recompute::Selective);
    CHECK(p.recompute_modules == (rc::kMoeDispatch | rc::kActivation));
  }
  {
    // With selective recompute already on, zero-memory adds its modules to the others.
    const Plan p = load_args("--recompute-granularity selective --moe-zero-memory level1").plan;
    CHECK(p.recompute_modules == (rc::kCoreAttn | rc::kMoeDispatch | rc::kActivation | rc::kMoeUp));
  }
  // --moe-permute-fusion: moesim's permutation already moves what the fused kernel moves.
  CHECK(problems("--moe-permute-fusion").empty());
  CHECK(load_args("--moe-zero-memory disable").plan.recompute == Recompute::None);
}

TEST_CASE("mindspeed flags: the ones moesim cannot honour are refused with the reason", "[ascend][plan]") {
  CHECK(any_contains(problems("--swap-attention"), "give parallelism.swap_activations"));
  CHECK(any_contains(problems("--adaptive-recompute-device-size 60000"),
                     "\"--adaptive-recompute-device-size 60000\" is MindSpeed's adaptive selective recompute"));
  CHECK(any_contains(problems("--adaptive-memory-optimization"), "does not replay that policy"));
  CHECK(any_contains(problems("--recompute-in-bubble"), "into pipeline bubbles"));
  CHECK(any_contains(problems("--recompute-in-advance"), "into pipeline bubbles"));
  CHECK(any_contains(problems("--moe-zero-memory level0 --moe-zero-memory-num-layers 2"), "every decoder layer"));
  CHECK(any_contains(problems("--moe-zero-memory level2"), "must be disable, level0 or level1"));
  CHECK(any_contains(problems("--schedules-method zb"), "must be dualpipev"));
  // MC2 fuses the sequence-parallel collectives: without SP it is refused, as MindSpeed does.
  nlohmann::json doc = pangu_with_args("--use-mc2");
  std::string& a = doc["parallelism"]["megatron_args"].get_ref<std::string&>();
  a.replace(a.find("--sequence-parallel"), std::string("--sequence-parallel").size(), "");
  try {
    (void)load_scenario(doc, "t.json", "");
    FAIL("--use-mc2 without --sequence-parallel loaded");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("needs --sequence-parallel") != std::string::npos);
  }
}

TEST_CASE("mindspeed flags: zero-memory keeps most of full MoE recompute's saving at less cost", "[ascend][memory]") {
  // MindSpeed (reference/pangu.md G): --moe-zero-memory level0 / level1 keep 70%+ / 90%+ of the
  // memory that recomputing the whole MoE layer saves. Measured on every stage of the 718B,
  // against selective recompute of core attention only.
  auto run = [](const std::string& mods) {
    return simulate(load_scenario_file(kPangu, {"parallelism.recompute_modules=" + mods})).result;
  };
  const Result base = run(R"(["core_attn"])");
  const Result moe = run(R"(["core_attn","moe"])");
  const Result l0 = run(R"(["core_attn","moe_dispatch","moe_act"])");
  const Result l1 = run(R"(["core_attn","moe_dispatch","moe_act","moe_expert_up"])");
  REQUIRE(base.stages.size() == 16);
  for (std::size_t s = 0; s < base.stages.size(); ++s) {
    const double full = base.stages[s].memory.activations_bytes - moe.stages[s].memory.activations_bytes;
    REQUIRE(full > 0);
    CHECK(base.stages[s].memory.activations_bytes - l0.stages[s].memory.activations_bytes >= 0.70 * full);
    CHECK(base.stages[s].memory.activations_bytes - l1.stages[s].memory.activations_bytes >= 0.90 * full);
  }
  // Cheaper than re-running the whole layer (router, combine and unpermute are not re-run).
  CHECK(l0.step_time_s < l1.step_time_s);
  CHECK(l1.step_time_s < moe.step_time_s);
  CHECK(base.step_time_s < l0.step_time_s);
}

TEST_CASE("megatron_args: a command line that contradicts the scenario is an error", "[ascend][plan]") {
  // The model's shape: --num-layers 30 against a 61-layer model.
  auto p = problems("--num-layers 30");
  REQUIRE(p.size() == 1);
  CHECK(p[0].find("\"--num-layers 30\" contradicts the model's 61 decoder layers") != std::string::npos);
  // MindSpeed counts its no-op padding layers in --num-layers: 61 + 3 = 64 agrees.
  CHECK(problems("--num-layers 64 --noop-layers 61,62,63").empty());
  CHECK(problems("--num-layers 61 --hidden-size 7680 --num-attention-heads 128 --num-experts 256 "
                 "--moe-router-topk 8 --moe-ffn-hidden-size 2048")
            .empty());
  CHECK(any_contains(problems("--hidden-size 4096"), "contradicts the model's 7680 hidden size"));
  CHECK(any_contains(problems("--num-experts 64"), "contradicts the model's 256 routed experts"));
  // Training keys: the scenario's global batch against --global-batch-size 999.
  p = problems("--global-batch-size 999");
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "t.json:/training/global_batch_size: 6144 contradicts \"--global-batch-size 999\" in "
                "/parallelism/megatron_args; give the value once");
  CHECK(problems("--global-batch-size 6144 --seq-length 4096").empty());  // agreeing is fine
  // Parallelism keys, under either spelling.
  CHECK(any_contains(problems("", {{"tp", 4}}), "t.json:/parallelism/tp: 4 contradicts \"--tensor-model-parallel-size 8\""));
  CHECK(any_contains(problems("", {{"micro_batch_size", 1}}), "/parallelism/micro_batch_size: 1 contradicts"));
  CHECK(problems("", {{"tensor_model_parallel_size", 8}}).empty());
}

TEST_CASE("presets: a 910C package is two 910C dies side by side", "[ascend][presets]") {
  Diagnostics diag("t");
  const auto die = models::load_device(nlohmann::json("ascend-910c-die"), "/d", diag);
  const auto pkg = models::load_device(nlohmann::json("ascend-910c"), "/d", diag);
  REQUIRE(diag.ok());
  CHECK(pkg.peak(models::Precision::BF16).value() == Approx(2 * die.peak(models::Precision::BF16).value()));
  CHECK(pkg.peak(models::Precision::BF16).value() == Approx(752e12));
  CHECK(pkg.hbm_capacity.value() == Approx(2 * die.hbm_capacity.value()));
  CHECK(pkg.hbm_bandwidth.value() == Approx(2 * die.hbm_bandwidth.value()));
  CHECK(pkg.compute_units == 2 * die.compute_units);
  // Efficiencies are the die's: two dies run side by side.
  CHECK(pkg.gemm_peak_efficiency == die.gemm_peak_efficiency);
  CHECK(pkg.attention_fwd_efficiency == die.attention_fwd_efficiency);
}

TEST_CASE("scenarios: the 718B on CloudMatrix 384 keeps its expert all-to-all on the Unified Bus", "[ascend][scenario]") {
  // Same ranks, batch and plan as on Atlas 800T A2: the expert all-to-all, which crosses RoCE
  // between 8-NPU servers there, stays inside a 768-die supernode here.
  const Result cm = simulate(load_scenario_file(std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-718b-cloudmatrix-384.json", {})).result;
  const Result a2 = simulate(load_scenario_file(kPangu, {})).result;
  REQUIRE(cm.feasible);
  CHECK(cm.breakdown.ep_comm_s < a2.breakdown.ep_comm_s);
  CHECK(cm.tokens_per_s > a2.tokens_per_s);
}

TEST_CASE("flops: Megatron's formula, hand-derived for Llama 3 70B, agrees with moesim's count on the 718B", "[ascend][flops]") {
  Diagnostics diag("t");
  const models::ModelSpec llama = models::load_model(nlohmann::json("llama3-70b"), "/model", diag, "");
  REQUIRE(diag.ok());
  // Per token, multiply-accumulates of one layer: QKV 8192 x (8192 + 2 x 1024) = 83,886,080; causal
  // scores and values 8192 x 8192 / 2 x 2 = 67,108,864; output 8192 x 8192 = 67,108,864; SwiGLU
  // MLP 8192 x 3 x 28672 = 704,643,072. 80 layers, logits 8192 x 128,256. x 6 (2 FLOPs, 3 passes).
  const double per_layer = 83886080.0 + 67108864.0 + 67108864.0 + 704643072.0;
  CHECK(models::megatron_flops_per_token(llama, 8192) == Approx(6.0 * (80 * per_layer + 8192.0 * 128256)).epsilon(1e-12));
  // The 718B: Megatron's count (MTP as a layer, no router) and moesim's differ by well under 1%.
  const Result r = simulate(load_scenario_file(kPangu, {})).result;
  CHECK(r.megatron_flops_per_token == Approx(r.model_flops_per_token).epsilon(0.01));
  CHECK(r.mfu_megatron == Approx(r.mfu * r.megatron_flops_per_token / r.model_flops_per_token));
}

TEST_CASE("collectives: HCCL's level0 / level1 algorithms can be forced, and the result names them", "[ascend][collectives]") {
  using namespace moesim::topologies;
  GroupShape g = test::four_mesh_servers();  // 4 Atlas 800T A2 servers, 8 NPUs each on the HCCS mesh
  const double n = 1e9;
  // Auto: mesh inside, halving-doubling across (p = 4 is a power of two: one step fewer than ring).
  const CollectiveCost a = collective_cost(Collective::AllReduce, n, g);
  CHECK(a.level0 == Algorithm::Mesh);
  CHECK(a.level1 == Algorithm::HalvingDoubling);
  CHECK(describe_algorithm(a) == "hierarchical (level0 mesh, level1 halving-doubling)");
  // HCCL_ALGO="level0:ring;level1:ring": each level as forced, hand-derived.
  g.level0 = Algorithm::Ring;
  g.level1 = Algorithm::Ring;
  const CollectiveCost r = collective_cost(Collective::AllReduce, n, g);
  const double intra_ring = 7 * 2e-6 + 7.0 / 8 * n / 40e9;
  const double inter_ring = 3 * 5e-6 + 0.75 * (n / 8) / 20e9;
  CHECK(r.time.value() == Approx(2 * intra_ring + 2 * inter_ring));
  CHECK(describe_algorithm(r) == "hierarchical (level0 ring, level1 ring)");
  CHECK(r.time.value() > a.time.value());
  // One level: an 8-NPU TP group inside a server, ring forced.
  GroupShape tp = g;
  tp.size = 8;
  tp.nodes = 1;
  const CollectiveCost t = collective_cost(Collective::ReduceScatter, n, tp);
  CHECK(t.algorithm == Algorithm::Ring);
  CHECK(t.time.value() == Approx(intra_ring));
}

TEST_CASE("collectives: cluster.collective_algorithms reaches the simulation or is refused with the reason", "[ascend][collectives]") {
  const Result base = simulate(load_scenario_file(kPangu, {})).result;
  const Result ring = simulate(load_scenario_file(kPangu, {R"(cluster.collective_algorithms={"level0": "ring"})"})).result;
  CHECK(ring.breakdown.tp_comm_s > base.breakdown.tp_comm_s);  // ring is slower than the mesh on 8 NPUs
  bool named = false;
  for (const auto& c : ring.collectives)
    if (c.group == "tp") named = named || c.algorithm == "ring";
  CHECK(named);
  auto refused = [](const std::string& set) {
    try {
      (void)load_scenario_file(kPangu, {set});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refused(R"(cluster.collective_algorithms={"level1": "mesh"})").find("is a level-0 algorithm") != std::string::npos);
  CHECK(refused(R"(cluster.collective_algorithms={"level1": "NHR"})").find("does not model") != std::string::npos);
  CHECK(refused(R"(cluster.collective_algorithms={"level2": "ring"})").find("is not a level") != std::string::npos);
  CHECK(refused(R"(cluster={"preset": "dgx-h100", "devices": 6144, "collective_algorithms": {"level0": "mesh"}})")
            .find("needs a full-mesh scale-up") != std::string::npos);
  // HCCL's own spellings.
  CHECK(refused(R"(cluster.collective_algorithms={"level0": "fullmesh", "level1": "H-D_R"})").empty());
}

TEST_CASE("operator speed: a factor per operator class, never past the hardware", "[ascend][device]") {
  Diagnostics diag("t");
  const auto base = models::load_device(nlohmann::json("ascend-910b2"), "/d", diag);
  const auto fast = models::load_device(
      nlohmann::json{{"preset", "ascend-910b2"},
                     {"operator_speed", {{"gemm", 1.1}, {"attention_forward", 1.5}, {"attention_backward", 1.3}, {"vector", 0.5}}}},
      "/d", diag);
  REQUIRE(diag.ok());
  CHECK(fast.gemm_peak_efficiency == Approx(1.1 * base.gemm_peak_efficiency));
  CHECK(fast.attention_fwd_efficiency == Approx(1.5 * base.attention_fwd_efficiency));
  CHECK(fast.attention_bwd_efficiency == Approx(1.3 * base.attention_bwd_efficiency));
  // Vector kernels at half the HBM-bound rate: a 1 GB pass takes twice as long (plus the launch).
  const models::ComputeModel b(base), f(fast);
  const double o = base.kernel_overhead.value();
  CHECK(f.memory_bound(Bytes{1e9}).value() - o == Approx(2 * (b.memory_bound(Bytes{1e9}).value() - o)));
  // A large GEMM: 1.1x the efficiency is 1/1.1 of the compute time.
  CHECK(f.gemm(8192, 8192, 8192, models::Precision::BF16).value() - o ==
        Approx((b.gemm(8192, 8192, 8192, models::Precision::BF16).value() - o) / 1.1).epsilon(0.01));
  // Past the hardware: vector 3x on top of kernels already at 0.8 of the HBM bandwidth.
  Diagnostics bad("t.json");
  (void)models::load_device(nlohmann::json{{"preset", "ascend-910b2"}, {"operator_speed", {{"vector", 3}}}}, "/cluster/device", bad);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.list().front().pointer == "/cluster/device/operator_speed/vector");
  CHECK(bad.list().front().constraint.find("2.40x the HBM bandwidth") != std::string::npos);
}

TEST_CASE("adaptive pipe overlap: the hierarchical all-to-all's cross-server phase, hand-derived", "[ascend][apo][collectives]") {
  using namespace moesim::topologies;
  GroupShape g = test::four_mesh_servers();  // 4 Atlas 800T A2 servers, 8 NPUs each on the HCCS mesh
  const double n = 128e6, dedup = 0.6;
  const CollectiveCost h = collective_cost(Collective::AllToAll, n, g, Algorithm::HierarchicalAllToAll, dedup);
  // Phase 1: the bytes bound for the 3 other servers, (p - k) / p of the buffer, deduplicated,
  // over the NIC, one latency per other server. Phase 2: (k - 1) / k of the buffer over the mesh.
  const double t1 = 3 * 5e-6 + n * 24.0 / 32.0 * dedup / 20e9;
  const double t2 = 7 * 2e-6 + n * 7.0 / 8.0 / (40e9 * 7);
  CHECK(h.cross_phase.value() == Approx(t1));
  CHECK(h.time.value() == Approx(t1 + t2));
  // The per-pair form with equal volumes has the same phases.
  std::vector<std::vector<double>> m(32, std::vector<double>(32, n / 32));
  std::vector<int> node(32);
  for (int i = 0; i < 32; ++i) node[i] = i / 8;
  const CollectiveCost v = alltoallv_cost(m, node, g, Algorithm::HierarchicalAllToAll, dedup);
  CHECK(v.cross_phase.value() == Approx(t1));
  // A one-phase (pairwise) all-to-all has no cross-server phase of its own.
  CHECK(collective_cost(Collective::AllToAll, n, g, Algorithm::Pairwise).cross_phase.value() == 0.0);
}

TEST_CASE("adaptive pipe overlap: a named option that implies its parts and refuses contradictions", "[ascend][apo][plan]") {
  const Scenario s = load_args("", {{"adaptive_pipe_overlap", true}});
  CHECK(s.plan.adaptive_pipe_overlap);
  CHECK(s.plan.alltoall == AllToAllAlgo::Hierarchical);  // implied
  CHECK(s.plan.fb_overlap);                               // implied
  auto p = problems("", {{"adaptive_pipe_overlap", true}, {"moe_alltoall", "flat"}});
  CHECK(any_contains(p, "/parallelism/moe_alltoall: \"flat\" contradicts adaptive_pipe_overlap"));
  p = problems("", {{"adaptive_pipe_overlap", true}, {"moe_fb_overlap", false}});
  CHECK(any_contains(p, "/parallelism/moe_fb_overlap: false contradicts adaptive_pipe_overlap"));
  // Nothing to overlap on a dense model.
  nlohmann::json dense = {{"model", "llama3-70b"},
                          {"cluster", {{"preset", "atlas-800t-a2"}, {"devices", 64}}},
                          {"training", {{"seq_length", 4096}, {"global_batch_size", 64}}},
                          {"parallelism", {{"tensor_model_parallel_size", 8}, {"adaptive_pipe_overlap", true}}}};
  try {
    (void)load_scenario(dense, "d.json", "");
    FAIL("a dense model with adaptive_pipe_overlap loaded");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("/parallelism/adaptive_pipe_overlap") &&
                             Catch::Contains("needs an MoE model with expert parallelism above 1"));
  }
}

TEST_CASE("adaptive pipe overlap: the phases overlap each other and the other micro-batch, at a staging cost",
          "[ascend][apo][simulate]") {
  // The 718B's published plan with a hierarchical all-to-all and forward-backward overlap,
  // without and with the phases split; uniform routing (no skew), port sharing off so each
  // transfer keeps its own duration.
  const std::vector<std::string> base = {"parallelism.moe_fb_overlap=true", "simulation.port_sharing=false"};
  auto with = [&](bool apo) {
    auto sets = base;
    sets.push_back(std::string("parallelism.adaptive_pipe_overlap=") + (apo ? "true" : "false"));
    return simulate(load_scenario_file(kPangu, sets));
  };
  const Simulation off = with(false), on = with(true);
  const Result& a = off.result;
  const Result& b = on.result;
  // The same operators; the all-to-all's bytes unchanged (one record per collective).
  CHECK(b.breakdown.compute_s == Approx(a.breakdown.compute_s).epsilon(1e-9));
  REQUIRE(b.collectives.size() == a.collectives.size());
  // Less of the expert all-to-all exposed, a faster step, the breakdown still adding up. (Balanced
  // routing gains little: a quarter of the passes are warm-up forwards and cool-down backwards
  // with no other micro-batch beside them, and the pipelined phases save ~15% of each all-to-all.)
  CHECK(b.breakdown.ep_comm_s < a.breakdown.ep_comm_s);
  CHECK(b.step_time_s < a.step_time_s);
  CHECK(b.breakdown.total() == Approx(b.step_time_s).epsilon(1e-6));
  // Each expert all-to-all is two chunks x two phases: tasks on the in-server stream exist only
  // with the option.
  auto intra_tasks = [](const Simulation& s) {
    std::size_t n = 0;
    const auto& r = s.lowered.ranks.front();
    n += s.lowered.graph.stream_order(r.streams[static_cast<int>(Stream::EpIntra)]).size();
    return n;
  };
  CHECK(intra_tasks(off) == 0);
  CHECK(intra_tasks(on) > 0);
  // Staging: both micro-batches of a pair hold what the dispatch's cross-server phase received:
  // 2 x (8 copies x 7680 x 2 B x 1024 tokens) x 24/32 leaving the server x the deduplication.
  const double dispatch = 8.0 * 7680 * 2 * 1024;
  const double staged = 2.0 * dispatch * 24.0 / 32.0 * alltoall_dedup_ratio(256, 8, 4);
  const int stage = 2;  // only MoE layers: their buffers set the stage's transient
  CHECK(on.lowered.stages[stage].memory.transient_bytes - off.lowered.stages[stage].memory.transient_bytes ==
        Approx(staged).epsilon(1e-9));
}

TEST_CASE("adaptive pipe overlap: a search axis, and a plan key the ranked plans give back", "[ascend][apo][search]") {
  const Scenario s = load_args("", {{"adaptive_pipe_overlap", true}});
  CHECK(plan_key(s.plan, "sel").find("-apo") != std::string::npos);
  const nlohmann::json j = plan_to_json(s.plan, s.model);
  CHECK(j.at("adaptive_pipe_overlap") == true);
  nlohmann::json doc = pangu_with_args("");
  doc["parallelism"] = j;
  CHECK(load_scenario(doc, "r.json", "").plan.adaptive_pipe_overlap);
}

TEST_CASE("mfu definitions: the Huawei-style count is model FLOPs plus the masked half of attention", "[ascend][flops]") {
  Diagnostics diag("t");
  const models::ModelSpec llama = models::load_model(nlohmann::json("llama3-70b"), "/model", diag, "");
  REQUIRE(diag.ok());
  // Llama 3 70B at 8K: the masked half of each layer's scores and values, 67,108,864
  // multiply-accumulates per token (as many as the causal half), x 2 FLOPs x 3 passes x 80 layers.
  const models::Workload w = models::build_workload(llama, 8192);
  CHECK(w.masked_attention_flops_per_token == Approx(6.0 * 80 * 67108864.0).epsilon(1e-12));
  // The 718B: model FLOPs + the masked half (no recomputation: Huawei's 18.9% and 30.0% are in
  // proportion to their tokens/s across a change of recomputation), and the headline follows
  // simulation.mfu_definition (every definition is always reported).
  const Scenario sh = load_scenario_file(kPangu, {"simulation.mfu_definition=huawei"});
  const Result r = simulate(sh).result;
  const models::Workload w718 = models::build_workload(load_scenario_file(kPangu, {}).model, 4096);
  CHECK(r.huawei_flops_per_token == Approx(r.model_flops_per_token + w718.masked_attention_flops_per_token).epsilon(1e-12));
  // MLA: 128 heads x (192 + 128) x 2 FLOPs x 2048 masked keys on average x 3 passes, 61 layers + 1 MTP.
  CHECK(w718.masked_attention_flops_per_token == Approx(62.0 * 3 * 2 * 128 * 320 * 2048.0).epsilon(1e-12));
  CHECK(r.huawei_flops_per_token > r.model_flops_per_token);
  CHECK(r.mfu_huawei == Approx(r.mfu * r.huawei_flops_per_token / r.model_flops_per_token));
  CHECK(sh.simulation.mfu_definition == MfuDefinition::Huawei);
  CHECK(mfu_under(r, sh.simulation.mfu_definition) == r.mfu_huawei);
  CHECK(mfu_under(r, sh.simulation.mfu_definition) != r.mfu);
  CHECK_THROWS_WITH(load_scenario_file(kPangu, {"simulation.mfu_definition=palm"}),
                    Catch::Contains("/simulation/mfu_definition") && Catch::Contains("huawei"));
}
