#pragma once
// The workload generator: for each layer of a model, the operators of its forward pass with
// their shapes, FLOPs, bytes moved, parameters and the activation bytes kept for backward.
//
//   Workload w = build_workload(spec, /*seq_len=*/4096);
//   for (const PipelineItem& it : w.items)            // embedding, layers, head, MTP modules
//     for (const Op& op : w.programs[it.program].ops) ...
//   double f = w.model_flops_per_token;               // MFU numerator per token (fwd + bwd)
//
// Operators are described unsharded, per token. Each says which *region* of a
// tensor-parallel layer it lives in (the rank's sequence shard, the full tokens of the TP group
// with split weights, or the tokens dispatched to local experts), how TP splits its weights
// (column / row), and where the layer needs communication (TP gather/scatter, EP dispatch and
// combine). The strategy layer applies the parallel plan to these descriptions; the model
// layer knows nothing of plans.

#include <cstdint>
#include <string>
#include <vector>

#include "moesim/models/model_spec.hpp"

namespace moesim::models {

enum class OpKind : std::uint8_t { Gemm, Attention, Vector, Comm };

/// How attention scores are computed: a fused flash kernel (no s x s matrix in memory), or
/// the pre-2023 Megatron path (batched QK^T GEMM, fused scale-mask-softmax, dropout, batched
/// AV GEMM) that writes the s x s scores to HBM.
enum class AttentionKernel : std::uint8_t { Flash, Unfused };


enum class Region : std::uint8_t {
  Sequence,  ///< the rank's sequence shard (tokens / TP with sequence parallelism); weights replicated
  Tensor,    ///< all tokens of the TP group; weights (heads, hidden columns) split by TP
  Expert,    ///< tokens routed to the rank's local experts (top-k copies)
};

enum class Split : std::uint8_t { None, Column, Row };  ///< which GEMM dimension TP splits (n / k)

enum class Comm : std::uint8_t {
  None,
  TpGather,       ///< sequence shard -> full tokens (all-gather with SP; nothing without)
  TpScatter,      ///< partial sums -> sequence shard (reduce-scatter with SP; all-reduce without)
  TpReduceSmall,  ///< small all-reduce over TP (cross-entropy max / sum)
  EpDispatch,     ///< all-to-all of routed token copies to the experts' ranks
  EpCombine,      ///< all-to-all back to the tokens' ranks
};

/// How an activation kept for backward is spread over the TP group.
enum class SavedLayout : std::uint8_t {
  Sequence,  ///< per token of the sequence shard (divided by TP with SP, replicated without)
  Split,     ///< divided by TP (per head / per column)
  Full,      ///< every TP rank keeps all tokens
  Expert,    ///< per routed token copy on the expert's rank
};

/// Megatron `--recompute-modules` groups an operator's saved activation belongs to.
namespace recompute {
inline constexpr std::uint32_t kNorm = 1u << 0;        ///< "layernorm"
inline constexpr std::uint32_t kCoreAttn = 1u << 1;    ///< "core_attn"
inline constexpr std::uint32_t kMlaUp = 1u << 2;       ///< "mla_up_proj"
inline constexpr std::uint32_t kActivation = 1u << 3;  ///< "moe_act" / MLP activation
inline constexpr std::uint32_t kMlp = 1u << 4;         ///< "mlp" (dense MLP)
inline constexpr std::uint32_t kMoe = 1u << 5;         ///< "moe" (routed experts)
inline constexpr std::uint32_t kShared = 1u << 6;      ///< "shared_experts"
/// MindSpeed --moe-zero-memory's parts: the routed experts' input (the permuted tokens) is not
/// kept; the backward re-runs the permutation and the dispatch all-to-all to get it back.
inline constexpr std::uint32_t kMoeDispatch = 1u << 7;  ///< "moe_dispatch"
/// The experts' up-projection is re-run in the backward, so its output (the activation
/// function's input) is not kept.
inline constexpr std::uint32_t kMoeUp = 1u << 8;        ///< "moe_expert_up"

/// Every module, in the order names are listed: {bit, name, why its bytes are not kept}.
struct Module {
  std::uint32_t bit;
  const char* name;
  const char* reason;  ///< static text for memory reports
};
inline constexpr Module kModules[] = {
    {kCoreAttn, "core_attn", "recompute module core_attn"},
    {kNorm, "layernorm", "recompute module layernorm"},
    {kMlaUp, "mla_up_proj", "recompute module mla_up_proj"},
    {kActivation, "moe_act", "recompute module moe_act"},
    {kMlp, "mlp", "recompute module mlp"},
    {kMoe, "moe", "recompute module moe"},
    {kShared, "shared_experts", "recompute module shared_experts"},
    {kMoeDispatch, "moe_dispatch", "recompute module moe_dispatch (MindSpeed moe-zero-memory)"},
    {kMoeUp, "moe_expert_up", "recompute module moe_expert_up (MindSpeed moe-zero-memory level1)"}};

/// The bit of a module name ("activation" is moe_act's other name); 0 when unknown.
std::uint32_t module_bit(const std::string& name);
/// "core_attn+moe_act": the names of the bits set, in kModules order.
std::string module_names(std::uint32_t bits);
/// "core_attn, layernorm, ...": every name, for messages.
std::string all_module_names();
/// MindSpeed --moe-zero-memory level0 (the experts' input and the activation output re-made in
/// the backward) and level1 (also the activation input: the up-projection re-run).
inline constexpr std::uint32_t kZeroMemoryLevel0 = kMoeDispatch | kActivation;
inline constexpr std::uint32_t kZeroMemoryLevel1 = kMoeDispatch | kActivation | kMoeUp;
}  // namespace recompute

struct Op {
  std::string name;
  OpKind kind = OpKind::Vector;
  Region region = Region::Sequence;
  Split split = Split::None;
  Comm comm = Comm::None;
  // GEMM: per token [1 x k] x [k x n]; `tokens_factor` copies of each token (top-k).
  double k = 0;
  double n = 0;
  double tokens_factor = 1;
  double matrices = 1;  ///< weight matrices the op owns (experts); FLOPs per token do not depend on it
  // Attention core (fused/flash).
  double heads = 0;
  double d_qk = 0;
  double d_v = 0;
  bool causal = true;
  double window = 0;  ///< sliding window in tokens; 0: full
  AttentionKernel attention_kernel = AttentionKernel::Flash;
  double attention_dropout = 0.0;
  // Vector ops: HBM bytes moved per token (forward). Comm ops: buffer bytes per token.
  double bytes_per_token = 0;
  // Parameters and activations.
  double params = 0;       ///< weights (unsharded); GEMMs: matrices x k x n
  double saved_bytes = 0;  ///< activation bytes per token kept for backward (unsharded)
  SavedLayout saved_layout = SavedLayout::Sequence;
  std::uint32_t saved_tag = 0;  ///< recompute modules that drop the saved bytes
  /// What `saved_bytes` is and where its size comes from, for memory reports (a static string).
  const char* saved_note = "";
  std::uint32_t rerun_tag = 0;  ///< recompute modules that re-run this operator in backward
  bool model_flops = true;  ///< counted in MFU
  // Backward, relative to the forward: the data-gradient part (FLOPs for GEMMs and attention,
  // HBM bytes for vector ops) and the weight-gradient part (GEMMs only).
  double bwd_data_factor = 1.0;
  double bwd_weight_factor = 0.0;
  bool is_embedding = false;
  bool shares_embedding = false;  ///< output layer tied to the embedding table
  /// The GEMM's saved input is also kept, in 16 bits, by the operator before it (o_proj: the
  /// attention output, which flash attention keeps for its backward). In FP8 recipes the GEMM
  /// keeps its own FP8 copy besides.
  bool saved_input_shared = false;
  /// The GEMM's 16-bit input is the same tensor another operator keeps and counts (a shared
  /// expert's up projection: the moe_norm output the router keeps): it adds nothing in 16 bits,
  /// only its own FP8 copy in FP8 recipes.
  bool saved_input_elsewhere = false;
  /// Working buffers per token beyond the saved bytes, where the operator's implementation fixes
  /// them (the loss); 0: the lowering's generic rule (twice the output).
  double transient_bytes_per_token = 0;
  /// Not a Transformer Engine layer: stays in 16 bits in FP8 recipes (the router, the output layer).
  bool not_fp8 = false;
  /// Routed-expert operators whose work follows the per-expert token counts: 1 up projection,
  /// 2 activation, 3 down projection (0: not an expert operator).
  std::uint8_t expert_part = 0;

  /// Model FLOPs per token in the forward pass (MFU definition), for a sequence of length s.
  [[nodiscard]] double forward_model_flops_per_token(double seq_len) const;
  /// Executed FLOPs per token of the backward pass: data gradient and weight gradient.
  [[nodiscard]] double backward_data_flops_per_token(double seq_len) const;
  [[nodiscard]] double backward_weight_flops_per_token(double seq_len) const;
};

struct Program {
  std::string name;  ///< "embedding", "dense_layer", "moe_layer", "head", "mtp"
  std::vector<Op> ops;
  [[nodiscard]] double params() const;
  [[nodiscard]] double forward_model_flops_per_token(double seq_len) const;
};

enum class ItemKind : std::uint8_t { Embedding, Decoder, Head, Mtp };

struct PipelineItem {
  ItemKind kind = ItemKind::Decoder;
  int index = 0;    ///< decoder layer or MTP module index
  int program = 0;  ///< index into Workload::programs
};

struct Workload {
  std::vector<Program> programs;
  std::vector<PipelineItem> items;  ///< model order: embedding, layers, head, MTP modules
  double seq_len = 0;
  double model_flops_per_token = 0;  ///< forward x 3 (MFU numerator per token)
  /// What counting causal attention over every key would add to model_flops_per_token (forward
  /// x 3): the masked half of the score matrix, which a full-mask count includes.
  double masked_attention_flops_per_token = 0;
  double params_total = 0;
  double params_active_per_token = 0;  ///< parameters a token touches (MoE: top-k + shared experts)
};

inline constexpr double kActivationBytes = 2.0;  ///< BF16/FP16 activations

/// How the loss is computed over the vocabulary: Megatron-core's fused vocab-parallel
/// cross-entropy, plain PyTorch (`F.cross_entropy(logits.float(), labels)`, torchtitan before
/// 2025), or that same function under torch.compile (torchtitan's loss when compiling, from
/// 2025: components/loss.py `build_cross_entropy_loss`).
enum class CrossEntropy : std::uint8_t { Fused, PyTorch, Compiled };

/// Where an MoE layer multiplies the routed tokens by their routing weights: inside the
/// experts' activation (Megatron-core from 2025-04-09, commit 2659630721 "Memory efficient token
/// permutation": `activation_func_with_probs`, so the unpermute is a plain scatter-add that keeps
/// nothing), or on the experts' outputs before their weighted sum (Megatron-core before, torchtitan's
/// DeepSeek-V3 with score_before_experts false), whose backward keeps the k outputs per token.
enum class MoeProbs : std::uint8_t { Activation, Output };

struct WorkloadOptions {
  double dropout = 0.0;  ///< hidden and attention dropout probability (0: no dropout kernels)
  AttentionKernel attention = AttentionKernel::Flash;
  CrossEntropy cross_entropy = CrossEntropy::Fused;
  MoeProbs moe_probs = MoeProbs::Activation;
  /// Normalisation, RoPE and SwiGLU run as plain PyTorch eager operators (torchtitan without
  /// torch.compile), each a chain of unfused kernels, instead of fused kernels (Megatron / TE,
  /// MindSpeed, or anything torch.compile'd). Multiplies those operators' memory traffic.
  bool eager_elementwise = false;
};

Workload build_workload(const ModelSpec& m, std::int64_t seq_len, const WorkloadOptions& opt = {});

/// Training FLOPs per token by Megatron-LM's `num_floating_point_operations` (megatron/training/
/// training.py, 2025): 3 x (forward GEMM FLOPs) with causal attention counted as half of the s x s
/// scores, every MTP module counted as one more decoder layer plus its own logits, the router and
/// norms not counted. Megatron logs its TFLOP/s from this; MFU "by Megatron's formula" divides
/// it by the same peak as moesim's own count.
[[nodiscard]] double megatron_flops_per_token(const ModelSpec& m, double seq_len);

}  // namespace moesim::models
