#pragma once
// RL post-training (GRPO/PPO-style) on an accelerator cluster: one RL step as phases on the
// engine — rollout generation (inference.hpp: prefill and KV-cache-bound decode, batched over
// prompts x rollouts with a response-length distribution), reference / reward / critic
// forward passes, policy (and critic) training through strategies::simulate on the training
// plan, and the weight sync from the training layout to the inference layout — in one of two
// deployments (disaggregated pools, or co-located with the switch between roles charged over
// the host link) and with staleness-k asynchronous pipelining.
//
//   RlScenario s = load_rl_scenario_file("scenarios/rl-pangu-718b-cm384.json", {"rl.staleness=1"});
//   RlSimulation r = simulate_rl(s);
//   r.result.step_time_s;  r.result.response_tokens_per_s;  to_json(r.result, s, false).dump(2);
//
// The scenario is a training scenario (model, cluster, training, parallelism: the training
// plan) with an `rl` section (README, "RL post-training"). Bad input is a ConfigError naming
// the JSON path and the constraint, every problem at once.

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/sim/engine.hpp"
#include "moesim/sim/task_graph.hpp"
#include "moesim/strategies/rl/inference.hpp"
#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/output/simulate.hpp"

namespace moesim {
class Rng;
}

namespace moesim::strategies {

/// Token lengths: fixed, uniform over [min, max], or lognormal with a mean (of the untruncated
/// distribution) and shape sigma, clipped to [min, max] (responses cut at the generation limit).
struct LengthDistribution {
  enum class Kind : std::uint8_t { Fixed, Uniform, Lognormal } kind = Kind::Fixed;
  double mean = 0;   ///< fixed value or lognormal mean
  double sigma = 0;  ///< lognormal shape
  std::int64_t min = 1;
  std::int64_t max = 1;
  std::int64_t draw(Rng& rng) const;
};

enum class RlMode : std::uint8_t { Colocated, Disaggregated };

/// A forward-only model of the RL step (reference policy, reward model, critic values).
struct RlForwardModel {
  std::string role;  ///< "reference", "reward", "critic_values", "old_logprobs"
  std::string name;  ///< preset or model name
  models::ModelSpec model;
};

struct RlSpec {
  std::int64_t prompts_per_step = 1;
  int rollouts_per_prompt = 1;
  LengthDistribution prompt_length;
  LengthDistribution response_length;
  std::int64_t max_context = 0;  ///< prompt + response limit (default: training.seq_length)
  RlMode mode = RlMode::Colocated;
  int staleness = 0;
  int optimizer_steps = 1;   ///< optimizer steps of the policy per RL step
  int steps_simulated = 8;   ///< RL steps on the engine (staleness warm-up excluded from means)
  bool switch_free = false;  ///< co-located: role switches and resharding cost nothing (a bound)
  InferencePlan inference;
  int inference_devices = 0;  ///< the inference pool (all devices when co-located)
  std::int64_t max_batch_size = 0;  ///< concurrent sequences per instance (0: as many as the KV cache holds)
  bool refill = true;               ///< continuous batching: a finished sequence's slot takes the next prompt
  std::vector<RlForwardModel> forwards;  ///< in the order they run
  std::string critic;                    ///< empty: no critic; else the critic model's name
  [[nodiscard]] std::int64_t sequences_per_step() const { return prompts_per_step * rollouts_per_prompt; }
};

struct RlScenario {
  std::string file = "<inline>";
  nlohmann::json document;
  RlSpec rl;
  Scenario training;                 ///< the policy's training scenario on the training pool
  std::optional<Scenario> critic;    ///< the critic's training scenario (same plan)
  topologies::ClusterSpec cluster;   ///< the whole cluster
  std::uint64_t seed = 1;
};

RlScenario load_rl_scenario(const nlohmann::json& doc, const std::string& file, const std::string& base_dir);
RlScenario load_rl_scenario_file(const std::string& path, const std::vector<std::string>& overrides);

struct RlPhase {
  std::string name;
  double seconds = 0;            ///< mean per RL step
  int devices = 0;               ///< devices the phase occupies
  double flops_utilisation = 0;  ///< model FLOPs / (devices x dense peak x seconds)
  double hbm_utilisation = 0;    ///< rollout: HBM bytes / (nominal bandwidth x seconds), busiest device
  double bytes_per_device = 0;   ///< transfers: bytes each device moves
};

struct RlResult {
  bool feasible = true;
  std::string infeasible_reason;
  std::string mode;
  int staleness = 0;
  int devices = 0, training_devices = 0, inference_devices = 0;
  double step_time_s = 0;  ///< steady-state time per RL step
  double response_tokens_per_step = 0, prompt_tokens_per_step = 0;
  double response_tokens_per_s = 0, total_tokens_per_s = 0;
  double response_tokens_per_s_per_device = 0;
  std::vector<RlPhase> phases;
  // Rollout.
  int instances = 0, devices_per_instance = 0;
  std::int64_t max_sequences_per_instance = 0;
  double weight_bytes_per_device = 0, kv_bytes_per_token_per_device = 0, kv_budget_per_device = 0;
  double acceptance_length = 1;
  double decode_step_full_s = 0;  ///< one decode step at full batch, mean context
  DecodeBreakdown decode_full;    ///< its parts
  double tokens_per_s_per_instance_full = 0;
  double long_tail_share = 0;  ///< rollout slot-time with no sequence generating (finished slots, idle instances)
  double tail_s = 0;           ///< time the last 10% of a step's responses take
  double mean_response = 0, max_response = 0, mean_prompt = 0;
  // Idle: device-time per RL step with nothing scheduled (inside the rollout: instances done early).
  double idle_share = 0;
  double training_pool_idle_s = 0, inference_pool_idle_s = 0;
  // Training.
  double training_step_time_s = 0, training_mfu = 0, training_token_coverage = 0;
  double critic_step_time_s = 0;
  double training_state_bytes_per_device = 0;
  std::string training_plan;
  std::string limit;  ///< what the simulator says limits the step
  // Simulator.
  std::uint64_t seed = 1;
  int steps_simulated = 0;
  std::uint64_t tasks = 0, events = 0;
  double wall_s = 0;
};

struct RlSimulation {
  RlResult result;
  sim::TaskGraph graph;
  sim::RunResult run;
  std::vector<int> task_step;  ///< RL step of every task
};

RlSimulation simulate_rl(const RlScenario& s);

nlohmann::json to_json(const RlResult& r, const RlScenario& s, bool include_wall_time = true);
std::string format_rl_table(const RlResult& r, const RlScenario& s, bool include_wall_time = true);
/// Chrome trace-event JSON: one process per pool, one thread per stream, one event per phase.
void write_rl_trace(std::ostream& out, const RlSimulation& sim);

}  // namespace moesim::strategies
