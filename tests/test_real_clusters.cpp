// Real clusters are not ideal (issue 18): stragglers and slow links.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>

#include "moesim/strategies/output/simulate.hpp"

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
