#pragma once
// The search screen's pipeline replay: a schedule's per-stage orders (the same generator the
// simulation uses) timed with per-(stage, chunk) pass costs — each stage runs its passes in
// order, a pass starts when its stage is free and its inputs have arrived (the previous virtual
// stage's forward, the next one's backward, plus the point-to-point hop between devices), and
// forward-backward pairs are formed exactly where the emitter forms them (DualPipe(V)'s B, F, W
// triples; a backward followed by another micro-batch's forward under moe_fb_overlap). It is
// the event simulation with one task per pass and no network: what the closed-form fill and
// drain cannot see — chunks of unequal cost, pairs that hold a forward's output back until the
// pair ends — it sees.
//
//   PipelineReplay r{.kind = plan.schedule, .pp = 4, .vpp = 2, .m = 16, ...};
//   r.f[stage * vpp + chunk] = ...;                           // seconds, for every cost vector
//   const double span = replay_pipeline(r, make_schedule(r.kind, r.pp, r.vpp, r.m));

#include <vector>

#include "moesim/strategies/plan/schedule.hpp"

namespace moesim::strategies::search_detail {

struct PipelineReplay {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int pp = 1, vpp = 1, m = 1;
  bool fb_overlap = false;  ///< moe_fb_overlap: a backward and the next other forward run as a pair
  double p2p = 0;           ///< seconds for one activation (or gradient) hop between devices
  /// Per (stage * vpp + chunk), seconds: forward; backward as the schedule runs it (data
  /// gradients only when it splits weight gradients); weight gradients; the whole backward;
  /// what pairing the chunk's forward with its own whole backward saves (F + B_whole - pair).
  std::vector<double> f, b, w, b_whole, pair_saving;
  /// Per (stage * vpp + chunk), optional: no forward of the chunk starts before this (its
  /// parameters gathered).
  std::vector<double> forward_ready;
  /// Per (stage * vpp + chunk), optional: copying a micro-batch's swapped activations back
  /// from host memory, on the stage's one host-to-device stream, from its forward's end; its
  /// backward waits for it.
  std::vector<double> swap_in;
};

struct ReplayResult {
  double span = -1;                ///< first forward to last pass; < 0: the orders wait on each other
  std::vector<double> stage_end;   ///< per stage: its last pass's end
  std::vector<double> grads_done;  ///< per (stage * vpp + chunk): its gradients complete (last B, or W)
  std::vector<double> host_in_free;  ///< per stage: its host-to-device stream done with the swap-ins
  std::vector<double> last_forward;  ///< per stage: its last forward's end
};

/// The pipeline replayed (see above).
[[nodiscard]] ReplayResult replay_pipeline(const PipelineReplay& r, const std::vector<StageOrder>& orders);

}  // namespace moesim::strategies::search_detail
