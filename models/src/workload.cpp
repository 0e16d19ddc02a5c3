#include "moesim/models/workload.hpp"

#include <algorithm>

namespace moesim::models {

namespace recompute {

std::uint32_t module_bit(const std::string& name) {
  if (name == "activation") return kActivation;
  for (const Module& m : kModules)
    if (name == m.name) return m.bit;
  return 0;
}

std::string module_names(std::uint32_t bits) {
  std::string s;
  for (const Module& m : kModules)
    if (bits & m.bit) s += (s.empty() ? "" : "+") + std::string(m.name);
  return s;
}

std::string all_module_names() {
  std::string s;
  for (const Module& m : kModules) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

}  // namespace recompute

double Op::forward_model_flops_per_token(double seq_len) const {
  if (!model_flops) return 0.0;
  if (kind == OpKind::Gemm) return 2.0 * k * n * tokens_factor;
  if (kind == OpKind::Attention) {
    // Keys a query attends to, on average. Causal: s/2; causal with a window w < s: w - w^2/(2s).
    double keys = seq_len;
    if (causal) keys = seq_len / 2.0;
    if (window > 0 && window < seq_len) keys = causal ? window - window * window / (2.0 * seq_len) : window;
    return 2.0 * heads * (d_qk + d_v) * keys;
  }
  return 0.0;
}

double Op::backward_data_flops_per_token(double seq_len) const {
  if (kind == OpKind::Gemm) return 2.0 * k * n * tokens_factor * bwd_data_factor;
  if (kind == OpKind::Attention) {
    Op fwd = *this;
    fwd.model_flops = true;
    return fwd.forward_model_flops_per_token(seq_len) * bwd_data_factor;
  }
  return 0.0;
}

double Op::backward_weight_flops_per_token(double) const {
  return kind == OpKind::Gemm ? 2.0 * k * n * tokens_factor * bwd_weight_factor : 0.0;
}

double Program::params() const {
  double p = 0;
  for (const Op& op : ops) p += op.params;
  return p;
}

double Program::forward_model_flops_per_token(double seq_len) const {
  double f = 0;
  for (const Op& op : ops) f += op.forward_model_flops_per_token(seq_len);
  return f;
}

namespace {

constexpr double B = kActivationBytes;
// A flash-attention backward recomputes QK^T and computes dV, dP, dQ, dK: five matrix
// products against the forward's two, i.e. 2.5x the forward FLOPs (Dao, FlashAttention-2).
constexpr double kFlashBackwardFactor = 2.5;

Op gemm(std::string name, Region region, Split split, double k, double n) {
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::Gemm;
  o.region = region;
  o.split = split;
  o.k = k;
  o.n = n;
  o.params = k * n;
  // dX = dY W^T and dW = X^T dY: each as many FLOPs as the forward product.
  o.bwd_data_factor = 1.0;
  o.bwd_weight_factor = 1.0;
  return o;
}

Op vec(std::string name, Region region, double bytes_per_token) {
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::Vector;
  o.region = region;
  o.bytes_per_token = bytes_per_token;
  o.model_flops = false;
  // Read the output gradient and the saved input, write the input gradient: about twice
  // the forward traffic of a pointwise or normalisation kernel.
  o.bwd_data_factor = 2.0;
  return o;
}

Op comm(std::string name, Comm c, double bytes_per_token) {
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::Comm;
  o.comm = c;
  o.region = Region::Tensor;
  o.bytes_per_token = bytes_per_token;
  o.model_flops = false;
  return o;
}

// `note`: what is kept and where its size comes from (Op::saved_note, for memory reports).
Op saving(Op o, double bytes, SavedLayout layout, std::uint32_t tag = 0, const char* note = "") {
  o.saved_bytes = bytes;
  o.saved_layout = layout;
  o.saved_tag = tag;
  o.saved_note = note;
  return o;
}

Op rerun(Op o, std::uint32_t tag) {
  o.rerun_tag = tag;
  return o;
}

// A normalisation: reads and writes the hidden vector; keeps its input for backward.
Op norm(std::string name, double width, Region region = Region::Sequence) {
  Op o = vec(std::move(name), region, 2.0 * width * B);
  o.params = width;
  o.rerun_tag = recompute::kNorm;  // its output (the next GEMM's input) is dropped and recomputed
  return saving(o, width * B, region == Region::Sequence ? SavedLayout::Sequence : SavedLayout::Full, 0,
                "normalisation input, 2 B x width per token (Korthikanti et al. 2022, Table 2: 2sbh per "
                "LayerNorm); its FP32 statistics are not counted");
}

// Hidden dropout after a sub-layer's output projection: read, write, and a 1-byte mask kept for
// backward.
void dropout_op(std::vector<Op>& ops, const std::string& name, double h, const WorkloadOptions& opt) {
  if (opt.dropout <= 0) return;
  Op d = vec(name, Region::Sequence, h * (B + B + 1.0));
  ops.push_back(saving(d, h * 1.0, SavedLayout::Sequence, 0,
                       "dropout mask, 1 B per element: sbh (Korthikanti et al. 2022, Table 2)"));
}

void attention_block(const ModelSpec& m, std::vector<Op>& ops, const std::string& p, const WorkloadOptions& opt) {
  const double h = static_cast<double>(m.hidden);
  const double heads = m.heads;
  ops.push_back(norm(p + "attn_norm", h));
  if (m.attention == AttentionKind::MLA) {
    const double qk = m.qk_nope_dim + m.qk_rope_dim;
    const double latent = (m.q_lora_rank > 0 ? m.q_lora_rank : 0) + m.kv_lora_rank + m.qk_rope_dim;
    // Down projections run on the sequence shard with replicated weights; the small latents
    // (not the hidden states) are then gathered across TP (Megatron-core MLA with SP).
    if (m.q_lora_rank > 0) {
      ops.push_back(saving(gemm(p + "q_down", Region::Sequence, Split::None, h, m.q_lora_rank), h * B,
                           SavedLayout::Sequence, recompute::kNorm,
                           "input of q_down and kv_down (one tensor), the attn_norm output: 2sbh"));
      ops.push_back(gemm(p + "kv_down", Region::Sequence, Split::None, h, m.kv_lora_rank + m.qk_rope_dim));
      ops.push_back(norm(p + "q_norm", m.q_lora_rank));
    } else {
      ops.push_back(saving(gemm(p + "kv_down", Region::Sequence, Split::None, h, m.kv_lora_rank + m.qk_rope_dim), h * B,
                           SavedLayout::Sequence, recompute::kNorm, "input of kv_down, the attn_norm output: 2sbh"));
    }
    ops.push_back(norm(p + "kv_norm", m.kv_lora_rank));
    ops.push_back(comm(p + "latent_gather", Comm::TpGather, latent * B));
    if (m.q_lora_rank > 0) {
      ops.push_back(rerun(saving(gemm(p + "q_up", Region::Tensor, Split::Column, m.q_lora_rank, heads * qk),
                                 m.q_lora_rank * B, SavedLayout::Full, 0,
                                 "input of q_up, the gathered q_norm output: 2 B x q_lora_rank per token, all "
                                 "tokens on every TP rank (moesim estimate)"),
                          recompute::kMlaUp));
    } else {
      ops.push_back(saving(gemm(p + "q_proj", Region::Tensor, Split::Column, h, heads * qk), h * B, SavedLayout::Full,
                           recompute::kNorm,
                           "input of q_proj, the attn_norm output: 2 B x h per token, all tokens on every TP rank "
                           "(moesim estimate)"));
    }
    ops.push_back(rerun(saving(gemm(p + "kv_up", Region::Tensor, Split::Column, m.kv_lora_rank,
                                    heads * (m.qk_nope_dim + m.v_head_dim)),
                               m.kv_lora_rank * B, SavedLayout::Full, 0,
                               "input of kv_up, the gathered kv_norm output: 2 B x kv_lora_rank per token, all "
                               "tokens on every TP rank (moesim estimate)"),
                        recompute::kMlaUp));
    ops.push_back(rerun(vec(p + "rope", Region::Tensor, 2.0 * (heads + 1) * m.qk_rope_dim * B), recompute::kMlaUp));
    Op core;
    core.name = p + "core_attn";
    core.kind = OpKind::Attention;
    core.region = Region::Tensor;
    core.split = Split::Column;
    // Unfused attention keeps the probabilities: backward is dV, dP, dQ, dK (2x the forward).
    core.bwd_data_factor = opt.attention == AttentionKernel::Flash ? kFlashBackwardFactor : 2.0;
    core.attention_kernel = opt.attention;
    core.attention_dropout = opt.dropout;
    core.heads = heads;
    core.d_qk = qk;
    core.d_v = m.v_head_dim;
    core.window = static_cast<double>(m.sliding_window);
    // Flash attention keeps Q, K, V (the up-projection outputs) and its softmax statistics.
    core.rerun_tag = recompute::kCoreAttn;
    ops.push_back(saving(core, heads * (2 * qk + m.v_head_dim) * B + heads * 4.0, SavedLayout::Split, recompute::kMlaUp,
                         opt.attention == AttentionKernel::Flash
                             ? "Q, K (d_qk each) and V (d_v) of the local heads, 2 B x a(2 d_qk + d_v), and the FP32 "
                               "log-sum-exp, 4 B x a (flash attention, Dao 2022: no s^2 term)"
                             : "Q, K (d_qk each) and V (d_v) of the local heads, 2 B x a(2 d_qk + d_v) (Korthikanti "
                               "et al. 2022: QK^T inputs 4sbh, V 2sbh), plus 4 B x a statistics; the s^2 scores are "
                               "a term of their own"));
    // Recomputing core attention re-runs the kernel from the Q, K, V it keeps; its output O
    // stays, held by the output projection for its weight gradient (Megatron-core's
    // _checkpointed_attention_forward checkpoints the kernel only).
    Op o = saving(gemm(p + "o_proj", Region::Tensor, Split::Row, heads * m.v_head_dim, h), heads * m.v_head_dim * B,
                  SavedLayout::Split, 0,
                  "attention output O, input of the output projection: 2 B x a d_v (Korthikanti et al. 2022, "
                  "Table 2: 2sbh); flash attention's backward reads the same tensor");
    o.saved_input_shared = true;
    ops.push_back(o);
  } else {
    const double d = m.head_dim;
    const double kvh = m.kv_heads;
    ops.push_back(comm(p + "attn_gather", Comm::TpGather, h * B));
    ops.push_back(saving(gemm(p + "qkv", Region::Tensor, Split::Column, h, (heads + 2 * kvh) * d), h * B,
                         SavedLayout::Sequence, recompute::kNorm,
                         "input of the QKV GEMM, the attn_norm output: 2sbh (Korthikanti et al. 2022, Table 2); "
                         "the sequence shard with SP"));
    if (m.qk_norm) ops.push_back(vec(p + "qk_norm", Region::Tensor, 2.0 * (heads + kvh) * d * B));
    ops.push_back(vec(p + "rope", Region::Tensor, 2.0 * (heads + kvh) * d * B));
    Op core;
    core.name = p + "core_attn";
    core.kind = OpKind::Attention;
    core.region = Region::Tensor;
    core.split = Split::Column;
    // Unfused attention keeps the probabilities: backward is dV, dP, dQ, dK (2x the forward).
    core.bwd_data_factor = opt.attention == AttentionKernel::Flash ? kFlashBackwardFactor : 2.0;
    core.attention_kernel = opt.attention;
    core.attention_dropout = opt.dropout;
    core.heads = heads;
    core.d_qk = d;
    core.d_v = d;
    core.window = static_cast<double>(m.sliding_window);
    core.rerun_tag = recompute::kCoreAttn;
    ops.push_back(saving(core, (heads + 2 * kvh) * d * B + heads * 4.0, SavedLayout::Split, 0,
                         opt.attention == AttentionKernel::Flash
                             ? "Q, K, V after RoPE, 2 B x (a + 2 kv) d, and the FP32 log-sum-exp, 4 B x a (flash "
                               "attention, Dao 2022: no s^2 term)"
                             : "Q, K, V, 2 B x (a + 2 kv) d (Korthikanti et al. 2022: QK^T inputs 4sbh, V 2sbh with "
                               "MHA), plus 4 B x a statistics; the s^2 scores are a term of their own"));
    Op o = saving(gemm(p + "o_proj", Region::Tensor, Split::Row, heads * d, h), heads * d * B, SavedLayout::Split,
                  0,  // O stays when core attention is recomputed (as above)
                  "attention output O, input of the output projection: 2 B x a d = 2sbh (Korthikanti et al. 2022, "
                  "Table 2); flash attention's backward reads the same tensor");
    o.saved_input_shared = true;
    ops.push_back(o);
  }
  ops.push_back(comm(p + "attn_scatter", Comm::TpScatter, h * B));
  if (m.sandwich_norm) ops.push_back(norm(p + "attn_post_norm", h));
  dropout_op(ops, p + "attn_dropout", h, opt);
  ops.push_back(vec(p + "attn_residual", Region::Sequence, 3.0 * h * B));
}

// Gated (SwiGLU) or plain (GELU) MLP of width f, tensor-parallel with SP gather / scatter.
void dense_mlp(const ModelSpec& m, std::vector<Op>& ops, const std::string& p, double f, std::uint32_t tag,
               bool with_norm) {
  const double h = static_cast<double>(m.hidden);
  if (with_norm) ops.push_back(norm(p + "mlp_norm", h));
  ops.push_back(rerun(comm(p + "mlp_gather", Comm::TpGather, h * B), tag));
  const bool gated = m.mlp == MlpKind::SwiGLU;
  const double up = gated ? 2 * f : f;
  Op up_gemm = saving(gemm(p + "mlp_up", Region::Tensor, Split::Column, h, up), h * B, SavedLayout::Sequence,
                      recompute::kNorm | tag,
                      with_norm ? "input of the up GEMM, the norm output: 2sbh (Korthikanti et al. 2022, Table 2); the "
                                  "sequence shard with SP"
                                : "input of the up GEMM: the moe_norm output the router keeps (counted there), so only "
                                  "its FP8 copy in FP8 recipes");
  // Without a norm of its own (the shared experts) the input is the router's.
  up_gemm.saved_input_elsewhere = !with_norm;
  ops.push_back(rerun(up_gemm, tag));
  Op act = vec(p + "mlp_act", Region::Tensor, (up + f) * B);
  act.split = Split::Column;
  act.rerun_tag = recompute::kActivation | tag;
  ops.push_back(saving(act, up * B, SavedLayout::Split, tag,
                       gated ? "SwiGLU input 2 ffn: gate and up outputs, 2 B x 2f per token"
                             : "GeLU input, 2 B x f per token (Korthikanti et al. 2022, Table 2: 8sbh for f = 4h)"));
  ops.push_back(saving(gemm(p + "mlp_down", Region::Tensor, Split::Row, f, h), f * B, SavedLayout::Split,
                       recompute::kActivation | tag,
                       "activation output, input of the down GEMM: 2 B x f per token (Korthikanti et al. 2022, "
                       "Table 2: 8sbh for f = 4h)"));
  ops.push_back(comm(p + "mlp_scatter", Comm::TpScatter, h * B));
}

void moe_block(const ModelSpec& m, std::vector<Op>& ops, const std::string& p, const WorkloadOptions& opt) {
  const double h = static_cast<double>(m.hidden);
  const double e = m.num_experts;
  const double k = m.top_k;
  const double f = static_cast<double>(m.expert_ffn_hidden);
  ops.push_back(norm(p + "moe_norm", h));
  // Router on the sequence shard: logits, then softmax / top-k in FP32.
  Op router = saving(gemm(p + "router", Region::Sequence, Split::None, h, e), h * B, SavedLayout::Sequence,
                     recompute::kNorm, "input of the router GEMM, the moe_norm output: 2sbh");
  router.not_fp8 = true;
  // Megatron's `--recompute-modules moe` checkpoints the whole MoE layer (router, dispatch,
  // experts, combine, unpermute): it keeps only the layer's input and re-runs all of it.
  router.rerun_tag = recompute::kMoe;
  ops.push_back(router);
  ops.push_back(rerun(saving(vec(p + "router_topk", Region::Sequence, e * (B + 4.0 + 4.0)), e * 4.0,
                             SavedLayout::Sequence, recompute::kMoe,
                             "FP32 routing scores of all E experts for the softmax / top-k backward, 4 B x E per "
                             "token (moesim estimate)"),
                      recompute::kMoe));
  ops.push_back(rerun(vec(p + "permute", Region::Sequence, (1.0 + k) * h * B), recompute::kMoe | recompute::kMoeDispatch));
  ops.push_back(rerun(comm(p + "dispatch", Comm::EpDispatch, k * h * B), recompute::kMoe | recompute::kMoeDispatch));
  Op up = gemm(p + "expert_up", Region::Expert, Split::Column, h, 2 * f);
  up.tokens_factor = k;
  up.matrices = e;
  up.params = e * h * 2 * f;
  up.rerun_tag = recompute::kMoe | recompute::kMoeUp;
  up.expert_part = 1;
  ops.push_back(saving(up, h * B, SavedLayout::Expert, recompute::kMoe | recompute::kMoeDispatch,
                       "permuted tokens k sbh: input of the grouped up GEMM, 2 B x h per routed copy"));
  Op act = vec(p + "expert_act", Region::Expert, 3.0 * f * B);
  act.tokens_factor = k;
  act.split = Split::Column;
  act.rerun_tag = recompute::kMoe | recompute::kActivation;
  act.expert_part = 2;
  ops.push_back(saving(act, 2 * f * B, SavedLayout::Expert, recompute::kMoe | recompute::kMoeUp,
                       "SwiGLU input of the experts 2 ffn: gate and up outputs, 2 B x 2f per routed copy"));
  Op down = gemm(p + "expert_down", Region::Expert, Split::Row, f, h);
  down.tokens_factor = k;
  down.matrices = e;
  down.params = e * f * h;
  down.expert_part = 3;
  down.rerun_tag = recompute::kMoe;
  ops.push_back(saving(down, f * B, SavedLayout::Expert, recompute::kMoe | recompute::kActivation,
                       "expert activation output, input of the grouped down GEMM: 2 B x f per routed copy"));
  ops.push_back(rerun(comm(p + "combine", Comm::EpCombine, k * h * B), recompute::kMoe));
  // Sum of the k expert outputs per token. Weighted here (MoeProbs::Output), its backward needs
  // the outputs and the routing weights; with the weights applied in the experts' activation
  // the sum keeps nothing (the gradient is gathered back by index).
  const double unpermute_saved = opt.moe_probs == MoeProbs::Output ? k * h * B : 0.0;
  ops.push_back(rerun(saving(vec(p + "unpermute", Region::Sequence, (k + 1.0) * h * B), unpermute_saved,
                             SavedLayout::Sequence, recompute::kMoe,
                             "the k expert outputs per token for the weighted sum's backward, 2 B x k h "
                             "(routing weights applied after the experts)"),
                      recompute::kMoe));
  if (m.num_shared_experts > 0)
    dense_mlp(m, ops, p + "shared_", static_cast<double>(m.shared_expert_ffn_hidden), recompute::kShared, false);
}

Program decoder_program(const ModelSpec& m, bool moe, const std::string& name, const WorkloadOptions& opt,
                        const std::string& prefix = "") {
  Program prog;
  prog.name = name;
  attention_block(m, prog.ops, prefix, opt);
  const double h = static_cast<double>(m.hidden);
  if (moe) {
    moe_block(m, prog.ops, prefix, opt);
  } else {
    dense_mlp(m, prog.ops, prefix, static_cast<double>(m.ffn_hidden), recompute::kMlp, true);
  }
  if (m.sandwich_norm) prog.ops.push_back(norm(prefix + "mlp_post_norm", h));
  dropout_op(prog.ops, prefix + "mlp_dropout", h, opt);
  prog.ops.push_back(vec(prefix + "mlp_residual", Region::Sequence, 3.0 * h * B));
  return prog;
}

Op embedding_lookup(const ModelSpec& m, const std::string& name, bool owns_table) {
  const double h = static_cast<double>(m.hidden);
  // Vocabulary-parallel table: each TP rank looks up its rows; partial results are reduced.
  Op o = vec(name, Region::Tensor, 2.0 * h * B);
  o.split = Split::Column;
  o.is_embedding = true;
  o.params = owns_table ? static_cast<double>(m.vocab) * h : 0.0;
  return o;
}

void head_ops(const ModelSpec& m, std::vector<Op>& ops, const std::string& p, const WorkloadOptions& opt) {
  const double h = static_cast<double>(m.hidden);
  const double v = static_cast<double>(m.vocab);
  ops.push_back(norm(p + "final_norm", h));
  ops.push_back(comm(p + "head_gather", Comm::TpGather, h * B));
  Op lm = gemm(p + "lm_head", Region::Tensor, Split::Column, h, v);
  // Tied output weights are the embedding table; Megatron keeps a copy on the last pipeline
  // stage (synchronised by an embedding-gradient all-reduce), so memory still counts it there.
  lm.shares_embedding = m.tie_embeddings;
  lm.not_fp8 = true;
  ops.push_back(saving(lm, h * B, SavedLayout::Sequence, recompute::kNorm,
                       "input of the output layer, the final_norm output: 2sbh; the sequence shard with SP"));
  // Vocabulary-parallel cross-entropy in FP32: read logits, exp / max / sum passes, write
  // softmax; the softmax is kept for backward.
  Op ce = vec(p + "cross_entropy", Region::Tensor, v * (B + 4.0 + 4.0));
  ce.split = Split::Column;
  // Saved: the FP32 softmax (4 bytes per logit), except under torch.compile, whose generated
  // forward keeps the 16-bit logits and one log-sum-exp per token and whose backward rebuilds
  // the softmax inside the kernel that writes the gradient (2 bytes per logit).
  // Working buffers: Megatron-core's vocab-parallel loss (tensor_parallel/cross_entropy.py)
  // exponentiates its FP32 copy in place, so only the 16-bit logits while they are cast and the
  // 16-bit gradient handed back: 2 x 2 bytes. Plain PyTorch (F.cross_entropy on logits.float())
  // peaks in log_softmax's backward with the incoming gradient and the input gradient in FP32
  // beside the saved output: 4 + 4 bytes. Compiled: the 16-bit gradient, 2 bytes.
  double saved = v * 4.0;
  const char* note = "FP32 softmax over the vocabulary, 4 B x V per token split over TP (Megatron-core "
                     "tensor_parallel/cross_entropy.py)";
  switch (opt.cross_entropy) {
    case CrossEntropy::Fused: ce.transient_bytes_per_token = v * 2.0 * B; break;
    case CrossEntropy::PyTorch:
      ce.transient_bytes_per_token = v * 8.0;
      note = "FP32 log_softmax output, 4 B x V per token (F.cross_entropy on logits.float())";
      break;
    case CrossEntropy::Compiled:
      ce.transient_bytes_per_token = v * B;
      saved = v * B;
      note = "16-bit logits, 2 B x V per token, and a log-sum-exp (torch.compile'd cross-entropy)";
      break;
  }
  ops.push_back(saving(ce, saved, SavedLayout::Split, 0, note));
  ops.push_back(comm(p + "loss_reduce", Comm::TpReduceSmall, 3 * 4.0));
}

}  // namespace

Workload build_workload(const ModelSpec& m, std::int64_t seq_len, const WorkloadOptions& opt) {
  Workload w;
  w.seq_len = static_cast<double>(seq_len);
  const double h = static_cast<double>(m.hidden);

  Program emb;
  emb.name = "embedding";
  emb.ops.push_back(embedding_lookup(m, "embed", true));
  if (m.learned_positions > 0) {
    Op pos = vec("pos_embed", Region::Sequence, 3.0 * h * B);
    pos.params = static_cast<double>(m.learned_positions) * h;
    emb.ops.push_back(pos);
  }
  emb.ops.push_back(comm("embed_scatter", Comm::TpScatter, h * B));
  w.programs.push_back(std::move(emb));

  const int dense_prog = static_cast<int>(w.programs.size());
  w.programs.push_back(decoder_program(m, false, "dense_layer", opt));
  int moe_prog = -1;
  if (m.is_moe()) {
    moe_prog = static_cast<int>(w.programs.size());
    w.programs.push_back(decoder_program(m, true, "moe_layer", opt));
  }

  Program head;
  head.name = "head";
  head_ops(m, head.ops, "", opt);
  const int head_prog = static_cast<int>(w.programs.size());
  w.programs.push_back(std::move(head));

  int mtp_prog = -1;
  if (m.mtp_layers > 0) {
    // DeepSeek-V3 style MTP module: embedding of the next tokens (shared table, a copy on the
    // last stage), two norms, a projection of [h; e] (2h -> h), one decoder layer, the shared
    // output head and its loss.
    Program mtp;
    mtp.name = "mtp";
    mtp.ops.push_back(embedding_lookup(m, "mtp.embed", false));
    mtp.ops.push_back(comm("mtp.embed_scatter", Comm::TpScatter, h * B));
    mtp.ops.push_back(norm("mtp.enorm", h));
    mtp.ops.push_back(norm("mtp.hnorm", h));
    mtp.ops.push_back(saving(gemm("mtp.eh_proj", Region::Sequence, Split::None, 2 * h, h), 2 * h * B,
                             SavedLayout::Sequence, recompute::kNorm,
                             "input of the MTP projection [hnorm(h); enorm(e)]: 2 B x 2h per token (DeepSeek-V3 "
                             "MTP)"));
    const bool moe_layer = m.is_moe() && !m.is_moe_layer.empty() && m.is_moe_layer.back();
    Program layer = decoder_program(m, moe_layer, "mtp_layer", opt, "mtp.");
    for (auto& op : layer.ops) mtp.ops.push_back(std::move(op));
    head_ops(m, mtp.ops, "mtp.", opt);
    // The MTP head shares the main output layer's weights.
    for (auto& op : mtp.ops)
      if (op.name == "mtp.lm_head") op.params = 0;
    mtp_prog = static_cast<int>(w.programs.size());
    w.programs.push_back(std::move(mtp));
  }

  if (opt.eager_elementwise) {
    // HBM traffic per element of the eager decompositions against one fused kernel, bytes read
    // + written, BF16 activations, from torchtitan's Llama at 9dec370 (Dec 2024):
    //  - RMSNorm (models/norms.py: `_norm(x.float()).type_as(x) * weight`, `_norm` = x *
    //    rsqrt(x.pow(2).mean(-1) + eps)): float 2+4, pow 4+4, mean 4, x*rsqrt 4+4, type_as 4+2,
    //    *weight 2+2 = 36 against 2+2: x9.
    //  - RoPE (models/llama/model.py apply_rotary_emb: view_as_complex(x.float()) * freqs_cis,
    //    view_as_real, type_as): float 2+4, complex mul 4+4, type_as 4+2 = 20 against 2+2: x5.
    //  - SwiGLU (w2(F.silu(w1(x)) * w3(x))): silu 2+2, mul 2+2+2 = 10 per hidden element
    //    against the fused 3 x 2 = 6: x5/3.
    // The backward's autograd of the same chains is taken to scale alike.
    for (Program& prog : w.programs)
      for (Op& op : prog.ops) {
        if (op.kind != OpKind::Vector) continue;
        if (op.name.ends_with("norm") && m.norm == NormKind::RMSNorm) op.bytes_per_token *= 9.0;
        else if (op.name.ends_with("rope")) op.bytes_per_token *= 5.0;
        else if ((op.name.ends_with("mlp_act") || op.name.ends_with("expert_act")) && m.mlp == MlpKind::SwiGLU)
          op.bytes_per_token *= 5.0 / 3.0;
      }
  }

  w.items.push_back(PipelineItem{ItemKind::Embedding, 0, 0});
  for (int i = 0; i < m.num_layers; ++i)
    w.items.push_back(PipelineItem{ItemKind::Decoder, i, m.is_moe_layer[i] ? moe_prog : dense_prog});
  w.items.push_back(PipelineItem{ItemKind::Head, 0, head_prog});
  for (int i = 0; i < m.mtp_layers; ++i) w.items.push_back(PipelineItem{ItemKind::Mtp, i, mtp_prog});

  double fwd = 0, params = 0, active = 0;
  for (const PipelineItem& it : w.items) {
    const Program& p = w.programs[it.program];
    fwd += p.forward_model_flops_per_token(w.seq_len);
    for (const Op& op : p.ops)
      if (op.kind == OpKind::Attention && op.causal && op.model_flops) {
        Op full = op;
        full.causal = false;
        w.masked_attention_flops_per_token +=
            3.0 * (full.forward_model_flops_per_token(w.seq_len) - op.forward_model_flops_per_token(w.seq_len));
      }
    params += p.params();
    for (const Op& op : p.ops) {
      if (op.kind == OpKind::Gemm) active += op.k * op.n * op.tokens_factor;
      else if (op.is_embedding) active += op.params > 0 ? h : 0;
      else active += op.params;
    }
  }
  if (m.tie_embeddings) params -= static_cast<double>(m.vocab) * h;  // counted once, as the embedding
  w.model_flops_per_token = 3.0 * fwd;
  w.params_total = params;
  w.params_active_per_token = active;
  return w;
}

double megatron_flops_per_token(const ModelSpec& m, double seq_len) {
  const double h = static_cast<double>(m.hidden);
  const double heads = m.heads, s = seq_len;
  const double ffn_matrices = m.mlp == MlpKind::SwiGLU ? 3.0 : 2.0;
  // MTP modules count as decoder layers of the kind of the last one.
  const bool last_moe = m.is_moe() && !m.is_moe_layer.empty() && m.is_moe_layer.back();
  const double moe_layers = m.num_moe_layers() + (last_moe ? m.mtp_layers : 0);
  const double dense_layers = m.num_dense_layers() + (last_moe ? 0 : m.mtp_layers);
  const double layers = m.num_layers + m.mtp_layers;
  // Forward multiply-accumulates per token of one layer's attention (x 2 FLOPs x 3 passes below).
  double attn = 0;
  if (m.attention == AttentionKind::MLA) {
    const double qk = m.qk_nope_dim + m.qk_rope_dim;
    const double q = m.q_lora_rank > 0 ? m.q_lora_rank * (h + heads * qk + 1) : h * heads * qk;
    attn = q + m.kv_lora_rank * (h + heads * (m.qk_nope_dim + m.v_head_dim) + 1) + h * m.qk_rope_dim +
           heads * m.v_head_dim * h + s * heads * qk / 2 + s * heads * m.v_head_dim / 2;
  } else {
    const double qp = static_cast<double>(m.head_dim) * heads;
    const double kvp = static_cast<double>(m.head_dim) * m.kv_heads;
    attn = h * (qp + 2 * kvp) + qp * s / 2 * 2 + qp * h;
  }
  const double mlp = h * ffn_matrices *
                     (static_cast<double>(m.ffn_hidden) * dense_layers +
                      static_cast<double>(m.expert_ffn_hidden) * m.top_k * moe_layers +
                      static_cast<double>(m.shared_expert_ffn_hidden) * moe_layers);
  const double mtp_proj = m.mtp_layers * (3 * h + 2 * h * h);
  const double logits = h * static_cast<double>(m.vocab) * (m.mtp_layers + 1);
  return 6.0 * (mlp + attn * layers + mtp_proj + logits);
}

}  // namespace moesim::models
