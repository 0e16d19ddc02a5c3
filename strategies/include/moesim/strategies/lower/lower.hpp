#pragma once
// Lowering: a scenario (model workload + cluster + plan) becomes a flat task graph for the
// simulated ranks, plus the memory plan of every pipeline stage.
//
//   Lowered low = lower(scenario, topology, workload);
//   sim::RunResult run = sim::Engine(low.graph).run();
//
// Which ranks are simulated depends on the fidelity: `balanced` and `fast` simulate one rank
// per pipeline stage (every other rank of a stage is identical: same operators, same
// collectives), `full` simulates every rank and runs each collective as one task that holds
// the communication streams of all its members. `fast` also merges each (micro-batch, chunk,
// pass) into one task per stream. Each simulated rank has streams (compute, tp, cp, ep, pp, dp)
// and two link resources (its scale-up port and its NIC) that pipeline sends hold while they
// transfer. Collectives are timed by the analytical models of collectives.hpp and hold only
// streams: bandwidth shared between concurrent collectives belongs to the flow-level model.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moesim/models/workload.hpp"
#include "moesim/sim/cancel.hpp"
#include "moesim/sim/task_graph.hpp"
#include "moesim/topologies/collectives.hpp"
#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/plan/schedule.hpp"

namespace moesim::strategies {

/// Task categories (sim::Category values).
enum Cat : sim::Category { kCompute, kRecompute, kTpComm, kCpComm, kEpComm, kPpComm, kDpComm, kOptimizer, kSwap, kLaunch, kNumCats };
const std::vector<std::string>& category_names();
[[nodiscard]] inline bool is_comm(sim::Category c) { return c >= kTpComm && c <= kDpComm; }

/// Host / HostIn: device-to-host and host-to-device copies (swap; the link is full duplex).
/// Launch: the host thread that issues kernels (host dispatch).
/// DpReduce: gradient reduce-scatters of fully sharded data parallelism, on a stream of their own
/// beside the parameter all-gathers (FSDP2 and Megatron-FSDP use separate streams for the two).
/// EpIntra: the in-server phase of a hierarchical all-to-all under Adaptive Pipe Overlap (its
/// cross-server phase stays on Ep), so the two phases of different chunks and micro-batches overlap.
enum class Stream : std::uint8_t { Compute, Tp, Cp, Ep, Pp, Dp, Host, Launch, HostIn, DpReduce, EpIntra };
inline constexpr int kNumStreams = 11;
const char* stream_name(Stream s);

struct SimRank {
  int global_rank = 0;
  int stage = 0;
  int local = 0;        ///< index inside the stage (tp fastest, then cp, then dp)
  double weight = 1.0;  ///< real ranks this simulated rank stands for
  std::array<sim::ResourceId, kNumStreams> streams{};
  sim::ResourceId scaleup_port = 0;
  sim::ResourceId nic = 0;
  /// Bit per Stream: the group that stream's collectives run over spans servers (its traffic
  /// goes through the NIC, else through the scale-up port). Pipeline sends say it by resource.
  std::uint16_t scale_out_streams = 0;
};

struct MemoryBreakdown {
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;  ///< peak of the in-flight micro-batches under the schedule
  double transient_bytes = 0;    ///< working buffers of one operator (logits, gathered inputs)
  double reserved_bytes = 0;     ///< runtime, communication buffers, fragmentation
  int peak_inflight = 0;         ///< micro-batch chunks alive at the activation peak
  double swapped_bytes = 0;      ///< activation bytes held in host memory at the peak (not in total())
  /// In-flight activations at the peak under the same schedule without recomputation or
  /// swapping: what the memory optimisations save is 1 - activations_bytes / this.
  double activations_unoptimised_bytes = 0;
  [[nodiscard]] double total() const {
    return weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes + transient_bytes + reserved_bytes;
  }
};

struct StageInfo {
  int stage = 0;
  std::vector<std::vector<int>> chunk_items;  ///< per chunk: indices into Workload::items
  int decoder_layers = 0;
  double params_dense = 0;   ///< parameters held by one rank of this stage
  double params_expert = 0;
  double activation_bytes_per_microbatch = 0;  ///< all chunks of the stage, one micro-batch each
  MemoryBreakdown memory;
  double forward_seconds = 0;   ///< one micro-batch through all chunks of the stage
  double backward_seconds = 0;  ///< including recomputation
};

/// One tensor (or tensors) an operator keeps for backward, on one rank for one micro-batch.
struct MemoryTerm {
  std::string op;               ///< operator name ("core_attn", "mtp.expert_up"; "... s^2 scores", "layer input")
  double full_bytes = 0;        ///< kept without any recomputation
  double kept_bytes = 0;        ///< kept under the plan's recomputation / checkpointing
  const char* dropped_by = "";  ///< why full_bytes - kept_bytes is not kept ("": all kept); static text
  const char* note = "";        ///< what is kept and where its size comes from; static text
  double precision_factor = 1;  ///< bytes relative to the 16-bit accounting (FP8 GEMM inputs)
};

/// The terms of one kind of pipeline item (a distinct program under one recomputation) in a stage.
struct MemoryItem {
  std::string kind;  ///< program name ("moe_layer", "dense_layer", "embedding", "head", "mtp"), "+ full recompute"
  int count = 0;     ///< items of this kind in the stage (all its chunks)
  double full_bytes = 0, kept_bytes = 0;  ///< per item and micro-batch: the sums of the terms
  std::vector<MemoryTerm> terms;          ///< in the item's operator order
};

/// A memory part that does not scale with the micro-batches: weights, gradients, optimizer, ...
struct MemoryStaticTerm {
  std::string name;
  double bytes = 0;
  double params = 0;           ///< parameters it is counted for (0: not per parameter)
  double bytes_per_param = 0;
  std::string note;            ///< where it comes from
};

/// Every term of one stage's memory (the stage with the largest total, the one that decides
/// whether the plan fits). The activations reconcile as
///   per_microbatch_bytes = sum over items of kept_bytes x count  (= sum of chunk_bytes)
///   estimate = per_microbatch_bytes / chunks x inflight_chunks    (exact when the chunks are even)
///   walked_peak_bytes = the peak walked along the schedule;  residual = walked - estimate
///   activations_bytes = walked_peak_bytes - swapped_activation_bytes
struct MemoryDetail {
  int stage = 0;
  int chunks = 1;           ///< model chunks of the stage (virtual pipeline stages)
  int inflight_chunks = 0;  ///< micro-batch chunks alive at the activation peak
  std::vector<double> chunk_bytes;  ///< kept activations of one micro-batch, per chunk
  double per_microbatch_bytes = 0;
  double estimate_bytes = 0;
  double walked_peak_bytes = 0;
  double swapped_activation_bytes = 0;
  double activations_bytes = 0;
  double transient_bytes = 0;
  std::string transient_source;  ///< the operator whose working buffers are the largest, and why
  std::vector<MemoryItem> items;
  std::vector<MemoryStaticTerm> statics;  ///< weights ... reserve, then the total
  double total_bytes = 0;
};

/// One collective as lowered, for reports ("where the bytes go").
struct CollectiveUse {
  std::string group;      ///< "tp", "ep", "dp", ...
  std::string operation;  ///< "all-gather", "all-to-all", ...
  std::string algorithm;
  int group_size = 1;
  double bytes = 0;
  double seconds = 0;
  int count_per_step = 0;  ///< on one simulated rank
};

/// How the routing spread token copies over the expert-parallel ranks of the simulated group,
/// over every MoE layer and micro-batch of the step.
struct ExpertLoad {
  std::string routing = "balanced";
  int ep = 1;
  double max_over_mean = 1;        ///< mean over (MoE layer, micro-batch) of max / mean copies per EP rank
  double max_over_mean_worst = 1;  ///< the worst (MoE layer, micro-batch)
  double imbalance_score = 0;      ///< mean over (MoE layer, micro-batch) of (max - min) / total
  double drop_rate = 0;            ///< copies dropped by the capacity factor / copies routed
  std::string placement = "static";
  int experts_moved = 0;           ///< replicas placed away from the static placement, all MoE layers
  double migration_seconds = 0;    ///< per step, worst stage: moved experts' bytes amortised
  /// Bytes each EP rank sends (and, with sources holding equal token shares, receives) in the
  /// expert all-to-alls of one step: dispatch and combine, forward and backward.
  std::vector<double> a2a_bytes_per_rank;
  /// [MoE layer][EP rank]: share of the layer's copies the rank received, mean over micro-batches.
  std::vector<std::vector<double>> layer_rank_share;
};

/// A device that gates the simulated pipeline column at one stage (simulation.stragglers).
struct StragglerGate {
  int stage = 0;
  long long device = 0;        ///< global rank (stage x block + local)
  double slowdown = 1.0;       ///< its kernels take this many times as long
  double nic_bandwidth = 1.0;  ///< share of its NIC's bandwidth left
};

/// The stragglers of the simulated step (strategies/src/lower/stragglers.hpp says how they
/// are drawn and which ranks are followed).
struct StragglerInfo {
  bool active = false;  ///< a column was slowed: its gating ranks were simulated
  int slow_devices = 0, slow_nics = 0;  ///< this step, over the whole cluster (jitter not counted)
  int column_size = 1;                  ///< positions a tensor/context/expert-parallel column couples
  std::vector<StragglerGate> gates;     ///< the simulated column's gating devices, by stage
};

struct Lowered {
  sim::TaskGraph graph;
  StragglerInfo stragglers;
  std::vector<SimRank> ranks;
  std::vector<StageInfo> stages;
  std::vector<double> executed_flops;  ///< per simulated rank, one step (incl. recompute)
  std::vector<int> layers_per_virtual_stage;
  std::vector<CollectiveUse> collectives;
  std::vector<StageOrder> schedule;
  double optimizer_seconds = 0;
  ExpertLoad expert_load;  ///< MoE models only
  /// Packed documents: attention work of the slowest data-parallel rank over the mean, and the
  /// mean work per micro-batch relative to whole causal sequences.
  double attention_work_max_over_mean = 1;
  double attention_work_mean = 1;
  /// Lowered with `memory_detail`: every term of the largest stage's memory.
  std::optional<MemoryDetail> memory_detail;
};

/// `cancel` (may be null) is polled between pipeline operations; raised, lowering throws Cancelled.
/// `memory_detail`: also fill Lowered::memory_detail (off: nothing of it is computed).
Lowered lower(const Scenario& s, const topologies::Topology& topo, const models::Workload& w,
              const CancelFlag* cancel = nullptr, bool memory_detail = false);

/// Expected fraction of cross-server all-to-all bytes left after merging the copies of a token
/// bound for the same server: `experts` spread evenly over `servers`, top-k chosen uniformly.
double alltoall_dedup_ratio(int experts, int top_k, int servers);

}  // namespace moesim::strategies
