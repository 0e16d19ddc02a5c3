#pragma once
// Goodput under failures and checkpoints: how much longer than its failure-free time a training
// run takes, and the checkpoint interval that makes that least — simulated, with the
// Young/Daly formula beside it as a reference.
//
//   GoodputInputs in{.work_s = 30 * 86400.0, .step_s = 10, .failure_rate_per_s = 1 / 3 h, ...};
//   GoodputResult g = expected_goodput(in);   // g.goodput, g.interval_s, g.wall_s, g.curve
//
// One run: work in intervals of training time, each followed by a checkpoint that blocks
// training for `block_s` (a two-phase checkpoint's copy to host memory, or a synchronous write
// to storage) and then, when asynchronous, becomes durable `persist_s` later (the next
// checkpoint waits for the previous one's persist). Failures arrive as a Poisson process (rate:
// devices / device MTBF + servers / server MTBF); a failure loses the work since the last
// durable checkpoint and costs `restart_s` plus reading that checkpoint (`read_s`). The
// expectation is over `trials` runs drawn from the seed; every interval sees the same failure
// arrivals (common random numbers), so intervals compare without noise between them.

#include <cstdint>
#include <utility>
#include <vector>

#include "moesim/strategies/plan/plan.hpp"

namespace moesim::strategies {

struct GoodputInputs {
  double work_s = 0;              ///< failure-free training time (the token budget / tokens per s)
  double step_s = 0;              ///< a checkpoint is taken between steps
  double failure_rate_per_s = 0;  ///< job interruptions per second of wall time
  double block_s = 0;             ///< training stops this long per checkpoint
  double persist_s = 0;           ///< asynchronous: durable this long after the block
  double restart_s = 0;           ///< after a failure, before reading the checkpoint
  double read_s = 0;              ///< reading the checkpoint back
  double interval_s = 0;          ///< training time between checkpoints (0: the best one)
  int trials = 200;
  std::uint64_t seed = 1;
};

struct GoodputResult {
  double interval_s = 0;        ///< the one used (given, or the best)
  double young_interval_s = 0;  ///< Young's sqrt(2 x block / rate), for reference
  double wall_s = 0;            ///< expected wall time of the run at `interval_s`
  double goodput = 1;           ///< work_s / wall_s
  double failures = 0;          ///< expected interruptions over the run
  double checkpoint_share = 0;  ///< of the wall time spent blocked by checkpoints
  double lost_share = 0;        ///< of the wall time redone or restarting after failures
  std::vector<std::pair<double, double>> curve;  ///< (interval s, goodput) tried, ascending
};

[[nodiscard]] GoodputResult expected_goodput(const GoodputInputs& in);

/// The inputs for a run of `work_s` at `step_s` per step on `devices` devices of the scenario
/// (its reliability section, model parameters, checkpoint state per parameter and the
/// device's host link).
[[nodiscard]] GoodputInputs goodput_inputs(const Scenario& s, int devices, double work_s, double step_s);

/// Bytes of one checkpoint: BF16 weights plus the optimizer's FP32 master weights and moments.
[[nodiscard]] double checkpoint_bytes(const Scenario& s);

}  // namespace moesim::strategies
