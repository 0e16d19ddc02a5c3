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
// ZB-H1 (Qi et al. 2023): backward split into B (data gradients) and W (weight gradients); a
// greedy list schedule over the passes' durations — a free stage runs a ready B, else a
// forward while at most p - s micro-batches are in flight (1F1B's memory), else a pending W
// (at most p - s wait) — so Ws fill the pipeline's fill and drain bubbles.

#include <cstdint>
#include <vector>

#include "moesim/strategies/plan/plan.hpp"

namespace moesim::strategies {

/// Backward is the whole backward pass, or only the data-gradient part (B) when the schedule
/// runs the weight gradients as separate WeightGrad passes (zero-bubble schedules).
enum class Phase : std::uint8_t { Forward, Backward, WeightGrad };

struct PipeOp {
  Phase phase = Phase::Forward;
  int microbatch = 0;
  int chunk = 0;
  friend bool operator==(const PipeOp&, const PipeOp&) = default;
};

using StageOrder = std::vector<PipeOp>;

/// Whether the schedule runs weight gradients as passes of their own.
[[nodiscard]] inline bool splits_weight_gradients(ScheduleKind k) {
  return k == ScheduleKind::ZeroBubbleH1 || k == ScheduleKind::ZeroBubbleV || k == ScheduleKind::DualPipeV ||
         k == ScheduleKind::DualPipe;
}
/// DualPipe: two directions, each a whole pipeline over p positions (virtual stages 0..p-1 and
/// p..2p-1, placed like a V); no hop between p - 1 and p; a micro-batch runs one direction.
[[nodiscard]] inline bool bidirectional(ScheduleKind k) { return k == ScheduleKind::DualPipe; }
/// Whether the schedule places a stage's two chunks as a V (virtual stages s and 2p - 1 - s).
[[nodiscard]] inline bool v_shaped(ScheduleKind k) {
  return k == ScheduleKind::ZeroBubbleV || k == ScheduleKind::DualPipeV || k == ScheduleKind::DualPipe;
}
/// The scenario name of a schedule (`pipeline_schedule`).
[[nodiscard]] inline const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved_1f1b";
    case ScheduleKind::ZeroBubbleH1: return "zb_h1";
    case ScheduleKind::ZeroBubbleV: return "zb_v";
    case ScheduleKind::DualPipeV: return "dualpipev";
    case ScheduleKind::DualPipe: return "dualpipe";
  }
  return "1f1b";
}
/// Whether a backward followed by the forward of another micro-batch runs as one overlapped
/// F&B pair by construction of the schedule (otherwise only with moe_fb_overlap).
[[nodiscard]] inline bool pairs_forward_backward(ScheduleKind k) {
  return k == ScheduleKind::DualPipeV || k == ScheduleKind::DualPipe;
}
/// The chunk a micro-batch runs in (bidirectional: the first half of the micro-batches from
/// device 0 in chunk 0, the rest from device p - 1 in chunk 1); -1: all chunks.
[[nodiscard]] inline int direction_of(ScheduleKind k, int m, int mb) { return bidirectional(k) ? (mb < m / 2 ? 0 : 1) : -1; }
/// Pipeline stage and chunk of virtual stage v, and back (interleaved: v = chunk x p + stage).
[[nodiscard]] inline int stage_of_virtual(ScheduleKind k, int pp, int v) {
  return v_shaped(k) ? (v < pp ? v : 2 * pp - 1 - v) : v % pp;
}
[[nodiscard]] inline int chunk_of_virtual(ScheduleKind k, int pp, int v) { return v_shaped(k) ? (v < pp ? 0 : 1) : v / pp; }
[[nodiscard]] inline int virtual_stage(ScheduleKind k, int pp, int stage, int chunk) {
  return v_shaped(k) ? (chunk == 0 ? stage : 2 * pp - 1 - stage) : chunk * pp + stage;
}

/// Durations of one stage's F, B and W passes (any unit), for schedules that adapt to them.
struct PassCosts {
  long long f = 1000, b = 1000, w = 1000;
};

/// Pass durations per stage and chunk: costs[stage][chunk].
using StageCosts = std::vector<std::vector<PassCosts>>;

/// Per-stage orders for `pp` stages, `vpp` chunks per stage and `m` micro-batches. `costs`
/// (empty: equal passes) steer the zero-bubble list schedules.
std::vector<StageOrder> make_schedule(ScheduleKind kind, int pp, int vpp, int m, const StageCosts& costs = {});

}  // namespace moesim::strategies
