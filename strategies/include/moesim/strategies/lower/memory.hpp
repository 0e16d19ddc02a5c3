#pragma once
#include <algorithm>
// The one memory model of a pipeline stage, used by the simulation (lower.cpp, with the
// in-flight peak walked along the stage's generated schedule) and by the search screen (with
// the schedule registry's closed form of the in-flight micro-batches). Its constants live here
// and only here.
//
//   StageMemoryInput in{.params_dense = ..., .params_expert = ..., .peak_activations = ...};
//   MemoryBreakdown mem = stage_memory(plan, layout_edp, precision, device_reserved_bytes, in);

#include "moesim/models/device.hpp"
#include "moesim/strategies/lower/lower.hpp"
#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/plan/schedule.hpp"

namespace moesim::strategies {

/// Adam's FP32 state per parameter: master weight, first and second moment (4 + 4 + 4 bytes;
/// Megatron-LM's mixed-precision optimizer, Rajbhandari et al. 2020's "12 Psi").
inline constexpr double kAdamStateBytesPerParam = 12.0;
/// Main gradients are accumulated in FP32 (Megatron-LM's default for BF16 training).
inline constexpr double kMainGradBytesPerParam = 4.0;
/// Parameters per gradient bucket (Megatron-LM's DDP default `bucket_size` = 40M parameters).
inline constexpr double kGradientBucketParams = 40e6;
/// Megatron-core's default bucket for a data-parallel group of `dp` ranks:
/// max(40M, 1M x dp) parameters ("larger DP sizes need larger buckets to ensure collectives do
/// not become latency-bound": megatron/core/distributed/distributed_data_parallel_config.py).
[[nodiscard]] inline double gradient_bucket_params(int dp) { return std::max(kGradientBucketParams, 1e6 * dp); }
/// Memory traffic of one Adam step per parameter of the local shard: read the FP32 master
/// weight, main gradient, m and v (16 bytes); write master weight, m and v (12) and the BF16
/// model copy (2); plus the gradient-norm / clipping pass that reads the gradient again (4):
/// 34 bytes. A memory-bound kernel at the device's streaming bandwidth.
inline constexpr double kOptimizerStepBytesPerParam = 34.0;

/// Adam's state per parameter of the local shard: master weight and both moments in their
/// dtypes (kAdamStateBytesPerParam by default; 8 with Megatron's precision-aware optimizer and
/// BF16 moments, --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16).
[[nodiscard]] inline double adam_state_bytes_per_param(const Plan& p) {
  return p.main_params_bytes + p.exp_avg_bytes + p.exp_avg_sq_bytes;
}
/// Memory traffic of one Adam step per parameter of the shard: kOptimizerStepBytesPerParam with
/// the states read and written in their own dtypes.
[[nodiscard]] inline double optimizer_step_bytes_per_param(const Plan& p) {
  return kOptimizerStepBytesPerParam - 2.0 * (kAdamStateBytesPerParam - adam_state_bytes_per_param(p));
}

/// Bytes per parameter of the gradient buffer: FP32 main gradients, or the parameters' BF16
/// with --grad-reduce-in-bf16 (NeMo's optim.grad_sync_dtype=bf16).
[[nodiscard]] inline double grad_bytes_per_param(const Plan& p) { return p.grad_reduce_in_bf16 ? 2.0 : kMainGradBytesPerParam; }

/// Bytes per parameter of the weights a rank holds: BF16, plus an FP8 copy in FP8 recipes.
/// With FP8 weights (fp8_param_gather) there is no BF16 copy: the FP8 data and its second
/// layout (Hopper's transpose, MXFP8's column-wise copy; Transformer Engine's Float8Tensor /
/// MXFP8Tensor), 2 bytes.
[[nodiscard]] inline double weight_bytes_per_param(models::Precision precision, const Plan& p) {
  if (precision != models::Precision::FP8) return 2.0;
  return p.fp8_param_gather ? 2.0 : 3.0;
}
/// Bytes per parameter a data-parallel parameter all-gather moves: BF16, or FP8 with FP8 weights.
[[nodiscard]] inline double param_gather_bytes_per_param(const Plan& p) { return p.fp8_param_gather ? 1.0 : 2.0; }

/// Parameters of a stage's optimizer shard on one rank: the dense part is sharded over DP x CP
/// and the expert part over expert-data-parallel ranks with the distributed optimizer.
[[nodiscard]] inline double optimizer_shard_params(const Plan& p, int edp, double params_dense, double params_expert) {
  return p.distributed_optimizer ? params_dense / (p.dp * p.cp) + params_expert / edp : params_dense + params_expert;
}

/// What a stage's memory depends on besides the plan.
struct StageMemoryInput {
  double params_dense = 0;   ///< parameters held by one rank of the stage
  double params_expert = 0;
  double peak_activations = 0;              ///< bytes saved for backward at the in-flight peak
  double peak_activations_unoptimised = 0;  ///< the same without recomputation
  double largest_chunk_activations = 0;     ///< one micro-batch of the stage's largest chunk
  int peak_inflight = 0;                    ///< micro-batch chunks alive at the peak
  double transient_bytes = 0;               ///< the largest working buffer of one operator
  /// Parameters of the stage's largest pipeline item (one layer), per rank: with sharded
  /// parameters, what one all-gather makes whole.
  double largest_item_params = 0;
};

/// The in-flight peak of a stage walked along its schedule: chunk activations are added at
/// each forward and released at `frees` (the backward, or the W pass when weight gradients
/// run separately).
struct InflightPeak {
  double activations = 0;              ///< bytes at the peak
  double activations_unoptimised = 0;  ///< the peak of the activations without recomputation
  int chunks = 0;                      ///< micro-batch chunks alive at the peak
};
[[nodiscard]] InflightPeak walk_inflight(const StageOrder& order, const std::vector<double>& chunk_act,
                                         const std::vector<double>& chunk_act_full, Phase frees);

/// Weights, FP32 gradients, the (sharded) optimizer states, in-flight activations net of
/// swapping, transient buffers and the runtime reserve of one rank of a stage. Data-parallel
/// sharding (Plan::dp_sharding) divides the optimizer states (ZeRO-1), then the gradients
/// (ZeRO-2: the local shard plus one bucket being reduce-scattered), then the weights (ZeRO-3 /
/// FSDP: the local shard plus the layers gathered at once — the current and the prefetched one,
/// or every layer of the stage between forward and backward without reshard_after_forward —
/// and one layer's unsharded gradients before their reduce-scatter). With gradients synchronised
/// at the last micro-batch only (Plan::grad_sync_every_microbatch false), every gradient is held
/// unsharded and the gathered weights stay for the whole step.
[[nodiscard]] MemoryBreakdown stage_memory(const Plan& p, int edp, models::Precision precision,
                                           double reserved_bytes, const StageMemoryInput& in);

}  // namespace moesim::strategies
