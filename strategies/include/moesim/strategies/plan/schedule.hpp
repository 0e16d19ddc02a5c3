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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moesim::strategies {

/// The pipeline schedules. Everything that differs between them is in their ScheduleTraits
/// (schedule.cpp's registry); the rest of the code asks the traits, not the kind.
enum class ScheduleKind : std::uint8_t {
  OneFOneB, Interleaved, ZeroBubbleH1, ZeroBubbleV, DualPipeV, DualPipe,
  InterleavedTorch  ///< torch.distributed.pipelining's name for the same order as Interleaved
};

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

/// Durations of one stage's F, B and W passes (any unit), for schedules that adapt to them.
struct PassCosts {
  long long f = 1000, b = 1000, w = 1000;
};

/// Pass durations per stage and chunk: costs[stage][chunk].
using StageCosts = std::vector<std::vector<PassCosts>>;

/// What the search screen knows of a plan's pipeline, per micro-batch (seconds), to estimate
/// the fill and drain of a schedule without generating it.
struct PipelineCosts {
  int pp = 1, vpp = 1;
  double t_sum = 0;    ///< forward + backward of one micro-batch, summed over the stages
  double t_max = 0;    ///< the same on the slowest stage
  double w_share = 0;  ///< weight-gradient share of t_sum
  double pair = 0;     ///< an overlapped F&B pair on the slowest stage: max(compute, t_max - compute)
  double b_slow = 0;   ///< backward of the slowest stage
  double w_slow = 0;   ///< weight gradients of the slowest stage
};

/// A schedule's constraint on the plan, for plan validation: `field` is "pp" (the pipeline
/// size) or "microbatches" (the micro-batches per pipeline, from the global batch).
struct ScheduleProblem {
  std::string field;
  std::string message;
};

/// One pipeline schedule, described in one place.
struct ScheduleTraits {
  ScheduleKind kind;
  const char* name;  ///< the scenario's `pipeline_schedule`
  /// Runs weight gradients as passes of their own (zero-bubble schedules).
  bool splits_weight_gradients;
  /// DualPipe: two directions, each a whole pipeline over p positions (virtual stages 0..p-1
  /// and p..2p-1, placed like a V); no hop between p - 1 and p; a micro-batch runs one direction.
  bool bidirectional;
  /// Places a stage's two chunks as a V (virtual stages s and 2p - 1 - s).
  bool v_shaped;
  /// A backward followed by the forward of another micro-batch runs as one overlapped F&B
  /// pair by construction (otherwise only with moe_fb_overlap).
  bool pairs_forward_backward;
  /// A list schedule that follows the passes' durations (zero-bubble): its generated orders,
  /// and so its in-flight peak, depend on the costs; the closed form below is an estimate.
  bool follows_costs;
  /// Covered by the search's "auto" schedule (1F1B, or interleaved with vpp > 1): such plans
  /// carry no schedule suffix in their search keys.
  bool automatic;
  /// Chunks per stage the schedule runs on, as the search pairs it with a vpp axis value:
  /// exactly `chunks`, or (chunks = 0) any vpp >= 2.
  int chunks;
  /// The plan's vpp for a search vpp value accepted above (DualPipe: vpp 1 becomes 2, each
  /// device holding two stages).
  int plan_vpp;
  /// Per-stage orders for `pp` stages, `vpp` chunks and `m` micro-batches.
  std::vector<StageOrder> (*generate)(int pp, int vpp, int m, const StageCosts& costs);
  /// Micro-batch chunks alive at stage `stage`'s activation peak, in closed form (the screen's
  /// memory; tests/test_house.cpp checks it against the generated orders: exact unless
  /// follows_costs — e.g. the 718B's ZB-V peaks at 37 chunks on stage 1 where it says 33).
  int (*inflight)(int pp, int vpp, int m, int stage);
  /// Fill and drain of the pipeline beyond m x the slowest stage (the screen's step time).
  double (*fill)(const PipelineCosts& c);
  /// Problems with a plan of `pp` stages, `vpp` chunks and `m` micro-batches per pipeline.
  std::vector<ScheduleProblem> (*check)(int pp, int vpp, int m);
  /// Why the scenario's virtual_pipeline_model_parallel_size does not suit the schedule ("": it does).
  std::string (*vpp_problem)(int vpp);
};

/// The registry: every schedule, in ScheduleKind order (schedule.cpp).
extern const std::span<const ScheduleTraits> kSchedules;
[[nodiscard]] inline std::span<const ScheduleTraits> all_schedules() { return kSchedules; }
[[nodiscard]] inline const ScheduleTraits& schedule_traits(ScheduleKind k) { return kSchedules[static_cast<std::size_t>(k)]; }
/// The schedule named `name` (null: no such schedule).
[[nodiscard]] const ScheduleTraits* find_schedule(std::string_view name);
/// Every schedule's name, in registry order.
[[nodiscard]] std::span<const std::string_view> schedule_names();

/// The automatic schedule: 1F1B, interleaved with more than one chunk per stage.
[[nodiscard]] inline ScheduleKind automatic_schedule(int vpp) {
  return vpp > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
}
[[nodiscard]] inline bool splits_weight_gradients(ScheduleKind k) { return schedule_traits(k).splits_weight_gradients; }
[[nodiscard]] inline bool bidirectional(ScheduleKind k) { return schedule_traits(k).bidirectional; }
[[nodiscard]] inline bool v_shaped(ScheduleKind k) { return schedule_traits(k).v_shaped; }
[[nodiscard]] inline const char* schedule_name(ScheduleKind k) { return schedule_traits(k).name; }
[[nodiscard]] inline bool pairs_forward_backward(ScheduleKind k) { return schedule_traits(k).pairs_forward_backward; }
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

/// Per-stage orders for `pp` stages, `vpp` chunks per stage and `m` micro-batches. `costs`
/// (empty: equal passes) steer the zero-bubble list schedules.
inline std::vector<StageOrder> make_schedule(ScheduleKind kind, int pp, int vpp, int m, const StageCosts& costs = {}) {
  return schedule_traits(kind).generate(pp, vpp, m, costs);
}

}  // namespace moesim::strategies
