#pragma once
// Pipeline schedules as generators: for every pipeline stage, the order in which it runs the
// forward and backward passes of (micro-batch, model chunk) pairs. The engine turns the orders
// into timing; no bubble formula is used anywhere.
//
//   auto orders = make_schedule(ScheduleKind::Interleaved, /*pp=*/4, /*vpp=*/2, /*m=*/8);
//   for (const PipeOp& op : orders[stage]) ...   // {Forward, mb 0, chunk 0}, ...
//
// 1F1B (PipeDream-Flush): stage s runs min(p-s-1, m) warm-up forwards, then alternates one
// forward and one backward, then drains. Interleaved 1F1B (Narayanan et al. 2021, as in
// Megatron-LM's schedules.py): (p-s-1)*2 + (v-1)*p warm-up passes over virtual micro-batches
// k, with chunk (k / p) % v and micro-batch (k / (p v)) p + k % p; backward chunks reversed.

#include <cstdint>
#include <vector>

#include "moesim/strategies/plan.hpp"

namespace moesim::strategies {

enum class Phase : std::uint8_t { Forward, Backward };

struct PipeOp {
  Phase phase = Phase::Forward;
  int microbatch = 0;
  int chunk = 0;
  friend bool operator==(const PipeOp&, const PipeOp&) = default;
};

using StageOrder = std::vector<PipeOp>;

/// Per-stage orders for `pp` stages, `vpp` chunks per stage and `m` micro-batches.
std::vector<StageOrder> make_schedule(ScheduleKind kind, int pp, int vpp, int m);

}  // namespace moesim::strategies
