// Real clusters are not ideal (issue 18): stragglers and slow links.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <set>

#include "moesim/models/workload.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/search/goodput.hpp"
#include "moesim/strategies/search/search.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {

const std::string kRoot = MOESIM_SOURCE_DIR;

/// A dense model on 2 Atlas 800T A2 servers, TP2 x DP8, one stage, nothing overlapped, no host
/// dispatch: every layer is compute, then a tensor-parallel collective that waits for both ranks.
nlohmann::json dense() {
  return nlohmann::json::parse(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
              "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000},
    "cluster": {"preset": "atlas-800t-a2", "devices": 16},
    "training": {"seq_length": 2048, "global_batch_size": 16},
    "parallelism": {"tp": 2, "pp": 1, "sequence_parallel": true, "use_distributed_optimizer": true,
                    "tp_comm_overlap": false, "overlap_grad_reduce": false, "overlap_param_gather": false},
    "simulation": {"network": "analytical", "host_dispatch": {"launch_overhead": "0us"}}})");
}

}  // namespace

TEST_CASE("stragglers: a slow device slows its group by its own extra compute, and the others wait for it",
          "[stragglers]") {
  nlohmann::json j = dense();
  const Simulation ideal = simulate(load_scenario(j, "t.json", ""));
  j["simulation"]["stragglers"] = {{"devices", {{"list", {5}}, {"slowdown", 1.5}}}};
  const Simulation slow = simulate(load_scenario(j, "t.json", ""));
  REQUIRE(slow.result.stragglers);
  const StragglerResult& sr = *slow.result.stragglers;
  CHECK(sr.slow_devices == 1);
  CHECK(sr.ideal_step_s == Approx(ideal.result.step_time_s));
  // By hand: device 5's kernels take 1.5 x as long; each tensor-parallel collective of its pair
  // (devices 4 and 5) starts when it arrives, and its data-parallel group's reduction at the end
  // waits for it. Nothing is overlapped, so the step grows by half its compute; device 4 waits
  // at their collectives for the part of it that comes before one, and is idle at the end
  // for the rest (the compute after the last tensor-parallel collective).
  const double extra = 0.5 * ideal.result.breakdown.compute_s;
  CHECK(slow.result.step_time_s == Approx(ideal.result.step_time_s + extra).epsilon(0.01));
  REQUIRE(sr.gates.size() == 1);
  CHECK(sr.gates[0].device == 5);
  CHECK(sr.gates[0].stage == 0);
  CHECK(sr.gates[0].wait_s > 0.5 * extra);
  CHECK(sr.gates[0].wait_s < extra);
  REQUIRE(sr.gates[0].gates.size() == 2);
  CHECK(sr.gates[0].gates[0] == "tensor-parallel collectives (TP2)");
  CHECK(sr.gates[0].gates[1] == "data-parallel gradient reduction (DP8)");
  // Per device, the one slow device's extra compute and the others' wait add up: 1/16 of the
  // devices compute 1.5 x as long, 15/16 wait (their partner for the whole of it).
  CHECK(slow.result.breakdown.compute_s ==
        Approx(ideal.result.breakdown.compute_s * (1 + 0.5 / 16)).epsilon(0.01));
  CHECK(slow.result.breakdown.imbalance_wait_s > 0);
  CHECK(slow.result.ranks_simulated == 2);  // the slow device and its clean partner
}

TEST_CASE("stragglers: drawn from the seed, the same every run, another seed draws others", "[stragglers]") {
  nlohmann::json j = dense();
  j["simulation"]["stragglers"] = {{"devices", {{"fraction", 0.125}, {"slowdown", 1.2}}}};
  const Simulation a = simulate(load_scenario(j, "t.json", ""));
  const Simulation b = simulate(load_scenario(j, "t.json", ""));
  REQUIRE(a.result.stragglers);
  CHECK(a.result.stragglers->slow_devices == 2);  // 12.5% of 16
  Result ra = a.result, rb = b.result;
  ra.wall_s = rb.wall_s = 0;
  const Scenario s = load_scenario(j, "t.json", "");
  CHECK(to_json(ra, s).dump() == to_json(rb, s).dump());
  std::set<long long> devices;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    j["seed"] = seed;
    const Simulation c = simulate(load_scenario(j, "t.json", ""));
    for (const auto& g : c.result.stragglers->gates) devices.insert(g.device);
  }
  CHECK(devices.size() > 2);
}

TEST_CASE("stragglers: a slow NIC slows only what leaves the server, by its bandwidth", "[stragglers]") {
  nlohmann::json j = dense();
  const Simulation ideal = simulate(load_scenario(j, "t.json", ""));
  j["simulation"]["stragglers"] = {{"nics", {{"list", {3}}, {"bandwidth", 0.5}}}};
  const Simulation slow = simulate(load_scenario(j, "t.json", ""));
  REQUIRE(slow.result.stragglers);
  const auto& sr = *slow.result.stragglers;
  CHECK(sr.slow_nics == 1);
  REQUIRE(sr.gates.size() == 1);
  // Device 3's tensor-parallel pair stays in its server; its data-parallel group (8 devices over
  // 2 servers) does not: only that reduction, twice as long (not overlapped), adds to the step.
  CHECK(sr.gates[0].gates == std::vector<std::string>{"data-parallel gradient reduction (DP8)"});
  CHECK(slow.result.step_time_s == Approx(ideal.result.step_time_s + ideal.result.breakdown.dp_comm_s).epsilon(0.01));
}

TEST_CASE("stragglers: jitter and flapping links give a distribution over steps", "[stragglers]") {
  nlohmann::json j = dense();
  j["simulation"]["stragglers"] = {{"host_jitter", 0.05}, {"nics", {{"fraction", 0.25}, {"bandwidth", 0.5}, {"flapping", 0.5}}},
                                   {"steps", 6}};
  const Simulation sim = simulate(load_scenario(j, "t.json", ""));
  REQUIRE(sim.result.stragglers);
  const auto& sr = *sim.result.stragglers;
  REQUIRE(sr.step_times_s.size() == 6);
  CHECK(sr.min_s < sr.max_s);  // the steps differ
  CHECK(sr.p50_s <= sr.p99_s);
  CHECK(sr.min_s > sr.ideal_step_s);  // every step has some jitter
  CHECK(sim.result.step_time_s == sr.step_times_s[sr.reported_step]);
}

TEST_CASE("stragglers: bad input is named with its path and constraint", "[stragglers]") {
  nlohmann::json j = dense();
  j["simulation"]["stragglers"] = {{"devices", {{"list", {3, 99}}, {"fraction", 0.1}}}, {"nics", {{"list", {1}}}},
                                   {"steps", 0}};
  try {
    (void)load_scenario(j, "t.json", "");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    std::string all;
    for (const auto& d : e.diagnostics()) all += d.pointer + ": " + d.constraint + "\n";
    INFO(all);
    CHECK(all.find("/simulation/stragglers/devices/list/1: must be a device id from 0 to 15") != std::string::npos);
    CHECK(all.find("give \"fraction\" or \"list\", not both") != std::string::npos);
    CHECK(all.find("/simulation/stragglers/devices/slowdown: is required") != std::string::npos);
    CHECK(all.find("/simulation/stragglers/nics/bandwidth: is required") != std::string::npos);
    CHECK(all.find("/simulation/stragglers/steps") != std::string::npos);
  }
}

// ---- failures and checkpoints (strategies/search/goodput.hpp) ---------------------------------

TEST_CASE("goodput: without failures a run only pays its checkpoints", "[goodput]") {
  GoodputInputs in;
  in.work_s = 1000;
  in.step_s = 1;
  in.interval_s = 100;
  in.block_s = 2;
  // Ten intervals, a checkpoint after each but the last: 1000 + 9 x 2.
  GoodputResult g = expected_goodput(in);
  CHECK(g.wall_s == Approx(1018));
  CHECK(g.goodput == Approx(1000.0 / 1018));
  CHECK(g.failures == 0);
  CHECK(g.checkpoint_share == Approx(18.0 / 1018));
  // Asynchronous with a persist longer than the interval (130 s): from the second checkpoint
  // on, each waits 30 s for the previous one to be durable: 1000 + 9 x 2 + 8 x 30.
  in.persist_s = 130;
  g = expected_goodput(in);
  CHECK(g.wall_s == Approx(1000 + 18 + 240));
}

TEST_CASE("goodput: failures and restarts follow the exponential law", "[goodput]") {
  // One interval of work tau, failures at rate l, a restart R after each, no checkpoint: the
  // expected time is (1/l + R)(e^(l tau) - 1) (the classical result for restarts from the
  // beginning). l = 1/1000 s, tau = 1000 s, R = 100 s: 1100 x (e - 1) = 1890.1 s.
  GoodputInputs in;
  in.work_s = 1000;
  in.step_s = 1;
  in.interval_s = 1000;
  in.failure_rate_per_s = 1e-3;
  in.restart_s = 100;
  in.trials = 20000;
  const GoodputResult g = expected_goodput(in);
  CHECK(g.wall_s == Approx(1100 * (std::exp(1.0) - 1)).epsilon(0.02));
  CHECK(g.failures == Approx(std::exp(1.0) - 1).epsilon(0.03));  // e^(l tau) - 1 attempts fail
}

TEST_CASE("goodput: the best interval is Young's where failures are rare against the checkpoint", "[goodput]") {
  // Young (1974): tau* = sqrt(2 delta / l) when delta << 1/l. delta = 10 s, l = 1 / 20,000 s:
  // tau* = 632 s; the goodput there is about 1 - sqrt(2 delta l) = 96.8%.
  GoodputInputs in;
  in.work_s = 30 * 86400.0;
  in.step_s = 1;
  in.block_s = 10;
  in.failure_rate_per_s = 1.0 / 20000;
  in.trials = 100;
  const GoodputResult g = expected_goodput(in);
  CHECK(g.young_interval_s == Approx(std::sqrt(2 * 10 * 20000.0)));
  CHECK(g.interval_s > 0.6 * g.young_interval_s);
  CHECK(g.interval_s < 1.7 * g.young_interval_s);
  CHECK(g.goodput == Approx(1 - std::sqrt(2 * 10 / 20000.0)).epsilon(0.01));
  for (const auto& [tau, gp] : g.curve) CHECK(gp <= g.goodput + 1e-12);  // the best of those tried
}

TEST_CASE("goodput: the plan's inputs come from the scenario, each traceable", "[goodput]") {
  nlohmann::json j = dense();
  Scenario s = load_scenario(j, "t.json", "");
  REQUIRE(s.reliability.enabled);
  CHECK(s.reliability.name == "llama3-405b-h100");
  CHECK(s.reliability.device_mtbf_s == Approx(86300 * 3600.0));
  CHECK(s.reliability.sources.size() == 6);  // every value but the interval (optimised) has a source
  // 16 devices on 2 servers: 16 / 86,300 h + 2 / 15,300 h.
  const GoodputInputs in = goodput_inputs(s, 16, 1e6, 1.0);
  CHECK(in.failure_rate_per_s * 3600 == Approx(16 / 86300.0 + 2 / 15300.0));
  // Checkpoint: BF16 weights and FP32 master weights and Adam moments, 14 bytes a parameter;
  // each device copies its 1/16 share to host memory, storage takes it at 1 TB/s.
  const double bytes = checkpoint_bytes(s);
  CHECK(bytes == Approx(14.0 * models::build_workload(s.model, s.training.seq_length, s.training.workload).params_total));
  CHECK(in.block_s == Approx(bytes / 16 / s.cluster.device.host_bandwidth.value()));
  CHECK(in.persist_s == Approx(bytes / 1e12));
  CHECK(in.restart_s == Approx(600));
  j["reliability"] = {{"device_mtbf", "1000h"}, {"restart_time", "2min"}};
  s = load_scenario(j, "t.json", "");
  CHECK(s.reliability.device_mtbf_s == Approx(1000 * 3600.0));
  CHECK(s.reliability.node_mtbf_s == Approx(15300 * 3600.0));  // kept from the preset
  j["reliability"] = "none";
  CHECK_FALSE(load_scenario(j, "t.json", "").reliability.enabled);
}

// ---- weights in host memory (offload_weights) -------------------------------------------------

TEST_CASE("offload: weights in host memory leave two layers on the device and stream each one in per pass",
          "[offload]") {
  nlohmann::json j = dense();
  j["parallelism"]["data_parallel_sharding_strategy"] = "optim_grads";
  const Simulation plain = simulate(load_scenario(j, "t.json", ""));
  j["parallelism"]["offload_weights"] = true;
  const Scenario s = load_scenario(j, "t.json", "");
  const Simulation off = simulate(s);
  const MemoryBreakdown& a = plain.result.stages[0].memory;
  const MemoryBreakdown& b = off.result.stages[0].memory;
  // By hand: the largest item is a decoder layer, (4 h^2 attention + 3 h x 8192 SwiGLU) / TP2
  // + 2 h of norms = 33,558,528 parameters (the head's 32000 x 2048 / TP2 is 32.8M); two of
  // them stay on the device.
  const double wb = 2.0;  // BF16 weights
  const double largest = b.weights_bytes / 2 / wb;
  CHECK(b.weights_bytes < a.weights_bytes);
  CHECK(b.swapped_bytes == Approx(a.weights_bytes - b.weights_bytes));
  CHECK(largest == Approx((4.0 * 2048 * 2048 + 3.0 * 2048 * 8192) / 2 + 2 * 2048));
  // Every item's weights come in before its forward and again before its backward: the copies
  // on the host link add up to twice the stage's weights per micro-batch.
  double copied = 0;
  const auto& g = off.lowered.graph;
  for (sim::TaskId t = 0; t < g.num_tasks(); ++t)
    if (g.label_text(g.label(t)).rfind("weights_in.", 0) == 0 && off.lowered.ranks.size() == 1)
      copied += to_seconds(g.duration(t)).value();
  const double per_pass = a.weights_bytes / s.cluster.device.host_bandwidth.value();
  CHECK(copied == Approx(2 * s.plan.num_microbatches * per_pass).epsilon(0.01));
  CHECK(off.result.step_time_s > plain.result.step_time_s);
  // Without sharded gradients the offload is refused, naming the setting.
  j["parallelism"].erase("data_parallel_sharding_strategy");
  try {
    (void)load_scenario(j, "t.json", "");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.diagnostics()[0].pointer == "/parallelism/offload_weights");
  }
}

TEST_CASE("offload: Calculon's 530B on 5,128 A100s fits only with offload, and the search finds it", "[offload]") {
  std::ifstream in(kRoot + "/scenarios/calculon-530b-5128-a100.json");
  nlohmann::json j = nlohmann::json::parse(in);
  const Simulation sim = simulate(load_scenario(j, "calculon.json", ""));
  CHECK(sim.result.feasible);
  // Calculon's answer for this plan: 17.30 s a step (111.16 samples/s, run side by side).
  CHECK(sim.result.step_time_s > 0.7 * 17.30);
  CHECK(sim.result.step_time_s < 1.3 * 17.30);
  for (const char* k : {"offload_weights", "swap_activations", "swap_optimizer"}) j["parallelism"].erase(k);
  const Scenario bare = load_scenario(j, "calculon.json", "");
  CHECK_FALSE(simulate(bare).result.feasible);  // 132 GB of FP16 weights per TP8 rank
  SearchOptions opt;
  opt.threads = 2;
  opt.top_k = 2;
  const SearchReport r = search(bare, parse_search_space(bare), opt);
  REQUIRE_FALSE(r.ranked.empty());
  CHECK(r.ranked.front().plan.offload_weights);
  CHECK(r.ranked.front().feasible);
}
