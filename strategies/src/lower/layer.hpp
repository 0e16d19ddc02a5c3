#pragma once
// One pipeline item (embedding, decoder layer, head, MTP layer) as operator programs: its
// forward and backward steps with their durations (operator models of the device, collectives
// of the stage's network), its saved activations, working buffers and parameters.
//
//   LayerBuilder lb(ctx, LayerSpec::of(plan, layout), network, labels);
//   ItemProgram ip = lb.build(workload.items[i], /*full_recompute=*/false, /*uniform_group=*/1, m);
//
// A builder reads nothing of the plan but its LayerSpec, so the spec (with the item's program
// and recomputation) is a complete key for caching item costs across plans (the search screen).

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "moesim/models/device.hpp"
#include "moesim/models/workload.hpp"
#include "network.hpp"
#include "program.hpp"

namespace moesim::strategies::lowering {

/// Adaptive Pipe Overlap's chunks per all-to-all: the fewest that let one phase of a chunk run
/// beside the other phase of the next (Huawei does not publish its chunk count; each chunk
/// adds two collective launches and their latency).
inline constexpr int kApoChunks = 2;

/// Everything of the plan that a layer's programs depend on.
struct LayerSpec {
  int tp = 1, cp = 1, ep = 1, etp = 1, mbs = 1;
  bool sequence_parallel = false;
  bool tp_comm_overlap = false;
  bool cp_all_gather = false;  ///< context parallelism by all-gather (Plan::cp_all_gather), else the ring
  bool shared_expert_overlap = false;
  /// Huawei's Adaptive Pipe Overlap: a hierarchical all-to-all in chunks whose cross-server
  /// and in-server phases run on their own streams (Plan::adaptive_pipe_overlap).
  bool adaptive_pipe_overlap = false;
  std::uint32_t recompute_modules = 0;  ///< selective recomputation's modules (0: none, or full recomputation)
  bool op_checkpoint = false;           ///< operator-level selective checkpointing (Recompute::SelectiveOp)
  AllToAllAlgo alltoall = AllToAllAlgo::Flat;
  bool single_stage = false;  ///< pp == 1: a head tied to the embedding holds no tensor of its own
  static LayerSpec of(const Plan& p, const Layout& lay);
  auto operator<=>(const LayerSpec&) const = default;
};

/// What stays the same for every plan of a scenario.
struct LayerContext {
  const models::ModelSpec& model;
  const models::Workload& workload;
  const models::ComputeModel& cm;
  models::Precision precision;
  long long seq_length;
  bool packed_documents;
  /// The forward dispatch waits for the router's token counts on the host (dropless routing,
  /// or a capacity without padding: models::RoutingSpec::dispatch_syncs_host).
  bool dispatch_syncs_host = true;
};

struct ItemProgram {
  Program fwd, bwd;
  double act_bytes = 0;       ///< saved for backward, one micro-batch
  double act_bytes_full = 0;  ///< without any recomputation
  double transient = 0;
  double params_dense = 0, params_expert = 0;
  double fwd_seconds = 0, bwd_seconds = 0;
  double fwd_flops = 0, bwd_flops = 0;
};

/// The terms behind an item's act_bytes, act_bytes_full and transient (LayerBuilder::memory).
struct ItemMemoryDetail {
  std::vector<MemoryTerm> terms;  ///< sum of kept_bytes = act_bytes, of full_bytes = act_bytes_full
  std::string transient_op;       ///< the operator whose working buffers set `transient`
  const char* transient_why = "";
};

/// MoE layer ordinal of an item (-1: not an MoE layer); MTP layers follow the decoder's.
[[nodiscard]] int moe_ordinal(const models::ModelSpec& m, const models::PipelineItem& item);
/// Whether an item is an MoE layer (moe_ordinal(m, item) >= 0, without counting).
[[nodiscard]] bool is_moe_item(const models::ModelSpec& m, const models::PipelineItem& item);
/// Label prefix of an item's steps ("L12.", "emb.", "head.", "mtp0.").
[[nodiscard]] std::string item_prefix(const models::PipelineItem& it);
/// Transformer Engine casts (and transposes) each FP8 GEMM operand: read BF16, write FP8 twice
/// (row and column layouts): about 4 bytes per element. Zero in other precisions.
[[nodiscard]] Seconds fp8_cast(const models::ComputeModel& cm, models::Precision p, double elements);

class LayerBuilder {
 public:
  LayerBuilder(const LayerContext& ctx, const LayerSpec& spec, StageNetwork& net, sim::TaskGraphBuilder& labels);
  /// `full_recompute`: the item's activations are recomputed whole (decoder layers);
  /// `uniform_group`: layers sharing one kept input; `mb_count`: times the programs run per step
  /// (for the collective record; 0 records nothing).
  ItemProgram build(const models::PipelineItem& item, bool full_recompute, int uniform_group, int mb_count);
  /// The memory accounting of an item alone (act_bytes, act_bytes_full, transient, parameters;
  /// no programs), from the same code as build(); with `detail`, every term of it.
  ItemProgram memory(const models::PipelineItem& item, bool full_recompute, int uniform_group,
                     ItemMemoryDetail* detail) const;

 private:
  struct GemmShape {
    double m, n, k, batch;
  };
  [[nodiscard]] double tokens_in(models::Region r) const;
  [[nodiscard]] GemmShape gemm_shape(const models::Op& op) const;
  [[nodiscard]] double vector_bytes(const models::Op& op) const;
  [[nodiscard]] double saved_tokens(const models::Op& op) const;
  /// Saved bytes of an operator relative to its 16-bit accounting (FP8 GEMM inputs).
  [[nodiscard]] double saved_precision_factor(const models::Op& op, std::uint32_t modules) const;
  Step compute(sim::Category cat, Seconds t, double flops, const std::string& label);
  Step collective(GroupKind g, topologies::Collective kind, double bytes, sim::Category cat, Stream stream,
                  const std::string& label, int count, double dedup = 1.0) {
    return net_.step(g, kind, bytes, cat, stream, labels_.label(label), count, dedup);
  }
  /// Marks step `i` of a program as depending on the routing (expert work, all-to-all).
  void tag(ProgramBuilder& b, int i, Role role, const models::Op* op) const;
  void emit_forward_op(const models::Op& op, const std::string& pre, ProgramBuilder& b, bool recompute, ItemProgram& ip,
                       int count);
  void emit_forward_comm(const models::Op& op, const std::string& label, ProgramBuilder& b, int count);
  void emit_backward_op(const models::Op& op, const std::string& pre, ProgramBuilder& b, ItemProgram& ip, int count);
  void emit_backward_gemm(const models::Op& op, const std::string& label, ProgramBuilder& b, ItemProgram& ip,
                          int count);
  void emit_backward_comm(const models::Op& op, const std::string& label, ProgramBuilder& b, int count);
  /// Cross-server bytes of the expert all-to-all left after merging a token's copies per server.
  [[nodiscard]] double ep_dedup() const {
    return alltoall_dedup_ratio(ctx_.model.num_experts, ctx_.model.top_k, net_.shape(GroupKind::Ep).nodes);
  }
  /// The expert all-to-all toward the experts or back from them (see layer.cpp).
  void emit_ep(ProgramBuilder& b, const models::Op& op, const std::string& label, int count, bool toward);
  /// A tensor-parallel collective; with `tp_comm_overlap` it runs beside the neighbouring GEMM.
  void emit_tp(ProgramBuilder& b, topologies::Collective kind, double bytes, const std::string& label, int count,
               bool before_gemm);
  void emit_attention(const models::Op& op, const std::string& label, ProgramBuilder& b, bool backward,
                      sim::Category cat, ItemProgram& ip, int count);
  void emit_unfused_attention(const models::Op& op, const std::string& lbl, ProgramBuilder& b, bool backward,
                              sim::Category cat, ItemProgram& ip, double bh, double sq, double skv);
  void build_forward(const models::Program& prog, const std::string& pre, ItemProgram& ip, int count);
  void build_backward(const models::Program& prog, const std::string& pre, ItemProgram& ip, bool full,
                      std::uint32_t modules, int count);
  /// Activations, working buffers and parameters of an item; `detail` (may be null) receives
  /// the terms those sums are made of.
  void account_memory(const models::Program& prog, ItemProgram& ip, bool decoder, bool full_recompute,
                      int uniform_group, ItemMemoryDetail* detail) const;
  /// Shared-expert overlap: which ops form the shared expert, and the dispatch, combine and
  /// unpermute ops it branches around (all -1 when it does not apply).
  void find_shared_branch(const models::Program& prog);
  /// Emits the shared expert's ops on a branch from step `from`; returns the branch's end.
  int shared_branch(const models::Program& prog, const std::string& pre, ProgramBuilder& b, int from, bool backward,
                    ItemProgram& ip, int count);

  const LayerContext& ctx_;
  LayerSpec spec_;
  Tokens tok_;
  StageNetwork& net_;
  sim::TaskGraphBuilder& labels_;
  int current_moe_layer_ = -1;  ///< MoE layer ordinal of the item being built (-1: none)
  bool op_checkpoint_ = false;  ///< the current item is checkpointed operator by operator
  std::vector<bool> shared_;    ///< per op of the current item: part of the overlapped shared expert
  bool branch_ = false;
  int dispatch_ = -1, combine_ = -1, unpermute_ = -1;
};

}  // namespace moesim::strategies::lowering
