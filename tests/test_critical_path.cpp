// The critical path of a step, summarized ("the step is gated by"): it spans the step, its parts
// add up, and on one device it is that device's work.
#include <catch2/catch.hpp>

#include <numeric>
#include <set>

#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/plan/plan.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {

double sum_categories(const CriticalPath& c) {
  double s = 0;
  for (const auto& [name, sec] : c.by_category) s += sec;
  return s;
}

}  // namespace

TEST_CASE("critical path: on one device it is the device's work, all of it", "[critical]") {
  // A small dense model on one device: one compute stream, no collective, no host dispatch.
  const nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 512, "intermediate_size": 2048,
              "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000},
    "cluster": {"preset": "atlas-800t-a2", "devices": 1},
    "training": {"seq_length": 1024, "global_batch_size": 4},
    "parallelism": {"tp": 1, "pp": 1, "mbs": 1},
    "simulation": {"host_dispatch": {"launch_overhead": "0us"}}})");
  const Simulation sim = simulate(load_scenario(j, "one.json", ""));
  const CriticalPath c = summarize_critical_path(sim);
  CHECK(c.step_s == Approx(sim.result.step_time_s).epsilon(1e-12));
  CHECK(c.unattributed_s == Approx(0.0).margin(1e-9));
  // Every task of the device is on the path: compute (and the optimizer) make up the step.
  double work = 0;
  for (const auto& [name, sec] : c.by_category) {
    CHECK((name == "compute" || name == "optimizer"));
    work += sec;
  }
  CHECK(work == Approx(c.step_s).epsilon(1e-9));
  REQUIRE(c.by_stage.size() == 1);
  CHECK(c.by_stage[0].first == 0);
  CHECK(c.by_stage[0].second == Approx(c.step_s).epsilon(1e-9));
  CHECK_THAT(describe_critical_path(c), Catch::StartsWith("compute ") &&
                                            Catch::Contains("(tasks of stage 0: 100% of the step), optimizer "));
}

TEST_CASE("critical path: on a pipelined MoE step its parts add up to the step", "[critical]") {
  const std::string scen = std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-ultra-moe-718b.json";
  const Simulation sim = simulate(load_scenario_file(scen, {}));
  const CriticalPath c = summarize_critical_path(sim);
  CHECK(c.tasks > 0);
  CHECK(sum_categories(c) + c.unattributed_s == Approx(c.step_s).epsilon(1e-9));
  double stages = 0;
  std::set<int> seen;
  for (const auto& [stage, sec] : c.by_stage) {
    CHECK(stage >= 0);
    CHECK(stage < 16);
    CHECK(seen.insert(stage).second);
    stages += sec;
  }
  CHECK(stages == Approx(sum_categories(c)).epsilon(1e-9));
  // Largest first.
  for (std::size_t i = 1; i < c.by_category.size(); ++i) CHECK(c.by_category[i - 1].second >= c.by_category[i].second);
  for (std::size_t i = 1; i < c.by_stage.size(); ++i) CHECK(c.by_stage[i - 1].second >= c.by_stage[i].second);
  // The expert all-to-all is on the path of the published plan (no forward-backward overlap).
  bool ep = false;
  for (const auto& [name, sec] : c.by_category) ep = ep || (name == "ep_comm" && sec > 0);
  CHECK(ep);
  const nlohmann::json js = to_json(c);
  CHECK(js.at("by_category_s").size() == c.by_category.size());
  CHECK(js.at("step_s").get<double>() == c.step_s);
}
