#include "moesim/strategies/lower/memory.hpp"

#include <algorithm>

namespace moesim::strategies {

MemoryBreakdown stage_memory(const Plan& p, int edp, models::Precision precision, double reserved_bytes,
                             const StageMemoryInput& in) {
  MemoryBreakdown mem;
  const double params = in.params_dense + in.params_expert;
  const double shard = optimizer_shard_params(p, edp, in.params_dense, in.params_expert);
  const double wb = weight_bytes_per_param(precision, p);
  mem.weights_bytes = params * wb;
  const double gb = grad_bytes_per_param(p);
  mem.gradients_bytes = params * gb;
  // Gradients accumulated unsharded until the last micro-batch: every parameter's gradient in
  // the reduce dtype, and the parameters stay gathered across the micro-batches.
  const bool accumulate_unsharded = !p.grad_sync_every_microbatch;
  if (p.dp_sharding == DpSharding::OptimizerGradients && !accumulate_unsharded) {
    mem.gradients_bytes = std::min(params, shard + std::min(params, kGradientBucketParams)) * gb;
  } else if (p.dp_sharding == DpSharding::Full) {
    const double item = std::min(params, in.largest_item_params);
    const double gathered = p.reshard_after_forward && !accumulate_unsharded ? std::min(params, 2.0 * item) : params;
    mem.weights_bytes = std::min(params, shard + gathered) * wb;
    mem.gradients_bytes = accumulate_unsharded ? params * gb : std::min(params, shard + item) * gb;
  }
  if (p.offload_weights) {
    // Two items' weights on the device (the one running and the next one arriving); the rest
    // in host memory.
    const double resident = std::min(params, 2.0 * in.largest_item_params) * wb;
    mem.swapped_bytes += mem.weights_bytes - resident;
    mem.weights_bytes = resident;
  }
  mem.optimizer_bytes = adam_state_bytes_per_param(p) * shard;
  if (p.swap_optimizer) {
    // Optimizer states live in host memory; one gradient bucket's states are on the device
    // at a time while the step streams through them.
    const double resident = std::min(mem.optimizer_bytes, adam_state_bytes_per_param(p) * kGradientBucketParams);
    mem.swapped_bytes += mem.optimizer_bytes - resident;
    mem.optimizer_bytes = resident;
  }
  // Swapping: a fraction of every chunk's saved activations waits in host memory between its
  // forward and its backward; one chunk's worth is back on the device (prefetched) at a time.
  const double f = p.swap_activations;
  const double act_swapped = f > 0 ? std::max(0.0, f * (in.peak_activations - in.largest_chunk_activations)) : 0.0;
  mem.swapped_bytes += act_swapped;
  mem.activations_bytes = in.peak_activations - act_swapped;
  mem.activations_unoptimised_bytes = in.peak_activations_unoptimised;
  mem.peak_inflight = in.peak_inflight;
  mem.transient_bytes = in.transient_bytes;
  mem.reserved_bytes = reserved_bytes;
  return mem;
}

InflightPeak walk_inflight(const StageOrder& order, const std::vector<double>& chunk_act,
                           const std::vector<double>& chunk_act_full, Phase frees) {
  InflightPeak peak;
  double cur = 0, cur_full = 0;
  int alive = 0;
  for (const PipeOp& op : order) {
    if (op.phase == Phase::Forward) {
      cur += chunk_act[op.chunk];
      cur_full += chunk_act_full[op.chunk];
      ++alive;
    } else if (op.phase == frees) {
      cur -= chunk_act[op.chunk];
      cur_full -= chunk_act_full[op.chunk];
      --alive;
    }
    if (cur > peak.activations) {
      peak.activations = cur;
      peak.chunks = alive;
    }
    peak.activations_unoptimised = std::max(peak.activations_unoptimised, cur_full);
  }
  return peak;
}

}  // namespace moesim::strategies
