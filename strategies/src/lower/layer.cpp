#include "layer.hpp"

#include <algorithm>
#include <array>

#include "moesim/strategies/lower/lower.hpp"

namespace moesim::strategies::lowering {

using models::Comm;
using models::Op;
using models::OpKind;
using models::Region;
using models::SavedLayout;
using models::Split;
using topologies::Collective;

LayerSpec LayerSpec::of(const Plan& p, const Layout& lay) {
  LayerSpec s;
  s.tp = p.tp;
  s.cp = p.cp;
  s.ep = lay.ep;
  s.etp = lay.etp;
  s.mbs = p.mbs;
  s.sequence_parallel = p.sequence_parallel;
  s.tp_comm_overlap = p.tp_comm_overlap;
  s.cp_all_gather = p.cp_all_gather;
  s.shared_expert_overlap = p.shared_expert_overlap;
  s.adaptive_pipe_overlap = p.adaptive_pipe_overlap;
  s.recompute_modules = p.recompute == Recompute::Selective ? p.recompute_modules : 0u;
  s.op_checkpoint = p.recompute == Recompute::SelectiveOp;
  s.alltoall = p.alltoall;
  s.single_stage = p.pp == 1;
  return s;
}

int moe_ordinal(const models::ModelSpec& m, const models::PipelineItem& item) {
  if (!m.is_moe()) return -1;
  if (item.kind == models::ItemKind::Decoder) {
    if (!m.is_moe_layer[item.index]) return -1;
    int k = 0;
    for (int i = 0; i < item.index; ++i) k += m.is_moe_layer[i] ? 1 : 0;
    return k;
  }
  if (item.kind == models::ItemKind::Mtp && !m.is_moe_layer.empty() && m.is_moe_layer.back())
    return m.num_moe_layers() + item.index;
  return -1;
}

bool is_moe_item(const models::ModelSpec& m, const models::PipelineItem& item) {
  if (!m.is_moe()) return false;
  if (item.kind == models::ItemKind::Decoder) return m.is_moe_layer[item.index];
  return item.kind == models::ItemKind::Mtp && !m.is_moe_layer.empty() && m.is_moe_layer.back();
}

std::string item_prefix(const models::PipelineItem& it) {
  switch (it.kind) {
    case models::ItemKind::Embedding: return "emb.";
    case models::ItemKind::Decoder: return "L" + std::to_string(it.index) + ".";
    case models::ItemKind::Head: return "head.";
    case models::ItemKind::Mtp: return "mtp" + std::to_string(it.index) + ".";
  }
  return "";
}

Seconds fp8_cast(const models::ComputeModel& cm, models::Precision p, double elements) {
  return p == models::Precision::FP8 ? cm.memory_bound(Bytes{4.0 * elements}) - cm.kernel_overhead() : Seconds{0};
}

LayerBuilder::LayerBuilder(const LayerContext& ctx, const LayerSpec& spec, StageNetwork& net,
                           sim::TaskGraphBuilder& labels)
    : ctx_(ctx), spec_(spec), net_(net), labels_(labels) {
  tok_.T = static_cast<double>(spec.mbs) * static_cast<double>(ctx.seq_length);
  tok_.Tc = tok_.T / spec.cp;
  tok_.Tseq = (spec.sequence_parallel && spec.tp > 1) ? tok_.Tc / spec.tp : tok_.Tc;
  tok_.Texp = tok_.Tseq * spec.etp;
}

double LayerBuilder::tokens_in(Region r) const {
  switch (r) {
    case Region::Sequence: return tok_.Tseq;
    case Region::Tensor: return tok_.Tc;
    case Region::Expert: return tok_.Texp;
  }
  return tok_.Tc;
}

LayerBuilder::GemmShape LayerBuilder::gemm_shape(const Op& op) const {
  if (op.region == Region::Expert) {
    const double local_experts = std::max(1.0, op.matrices / spec_.ep);
    const double copies = tok_.Texp * op.tokens_factor;
    double n = op.n, k = op.k;
    if (op.split == Split::Column) n /= spec_.etp;
    if (op.split == Split::Row) k /= spec_.etp;
    return {copies / local_experts, n, k, local_experts};
  }
  double n = op.n, k = op.k;
  if (op.region == Region::Tensor) {
    if (op.split == Split::Column) n /= spec_.tp;
    if (op.split == Split::Row) k /= spec_.tp;
  }
  return {tokens_in(op.region) * op.tokens_factor, n, k, 1.0};
}

double LayerBuilder::vector_bytes(const Op& op) const {
  double b = op.bytes_per_token * tokens_in(op.region) * op.tokens_factor;
  if (op.split == Split::Column) b /= (op.region == Region::Expert ? spec_.etp : spec_.tp);
  return b;
}

double LayerBuilder::saved_tokens(const Op& op) const {
  switch (op.saved_layout) {
    case SavedLayout::Sequence: return tok_.Tseq;
    case SavedLayout::Split: return tok_.Tc / spec_.tp;
    case SavedLayout::Full: return tok_.Tc;
    case SavedLayout::Expert: return tok_.Tseq * op.tokens_factor;
  }
  return tok_.Tc;
}

double LayerBuilder::saved_precision_factor(const Op& op, std::uint32_t modules) const {
  // FP8 recipes (Transformer Engine's Linear / LayerNormLinear / GroupedLinear; the router and
  // the output layer are not TE layers and stay in 16 bits): a GEMM keeps the
  // FP8 cast of its input for the weight gradient, 1 byte per element instead of 2. Where the
  // 16-bit input is kept anyway by the operator before it (the attention output, which flash
  // attention keeps), the FP8 copy comes on top — unless core attention is recomputed, which
  // drops flash's reference. An input another operator keeps and counts adds only the copy.
  const bool fp8 = ctx_.precision == models::Precision::FP8 && op.kind == OpKind::Gemm && !op.not_fp8;
  if (op.saved_input_elsewhere) return fp8 ? 0.5 : 0.0;
  if (!fp8) return 1.0;
  if (op.saved_input_shared) return (modules & models::recompute::kCoreAttn) != 0 ? 0.5 : 1.5;
  return 0.5;
}

Step LayerBuilder::compute(sim::Category cat, Seconds t, double flops, const std::string& label) {
  Step st;
  st.duration = to_ticks(t);
  st.cat = cat;
  st.stream = Stream::Compute;
  st.flops = flops;
  st.label = labels_.label(label);
  return st;
}

void LayerBuilder::tag(ProgramBuilder& b, int i, Role role, const Op* op) const {
  if (i < 0 || current_moe_layer_ < 0) return;
  Step& st = b.p.steps[static_cast<std::size_t>(i)];
  st.role = role;
  st.moe_layer = static_cast<std::int16_t>(current_moe_layer_);
  st.op = op;
}

void LayerBuilder::emit_forward_op(const Op& op, const std::string& pre, ProgramBuilder& b, bool recompute,
                                   ItemProgram& ip, int count) {
  const sim::Category ccat = recompute ? kRecompute : kCompute;
  const std::string label = pre + op.name + (recompute ? ".recompute" : "");
  switch (op.kind) {
    case OpKind::Gemm: {
      const GemmShape g = gemm_shape(op);
      const Seconds t = ctx_.cm.gemm(g.m, g.n, g.k, ctx_.precision, g.batch) + fp8_cast(ctx_.cm, ctx_.precision, g.m * g.k * g.batch);
      const double fl = 2.0 * g.m * g.n * g.k * g.batch;
      b.chained(compute(ccat, t, fl, label));
      if (op.expert_part != 0) tag(b, b.chain, Role::ExpertFwd, &op);
      if (b.overlap_next >= 0) {  // the gather feeding this GEMM ran beside it
        b.join(b.overlap_next);
        b.overlap_next = -1;
      }
      ip.fwd_flops += recompute ? 0 : fl;
      break;
    }
    case OpKind::Attention: {
      b.flush_overlap();
      emit_attention(op, label, b, false, ccat, ip, recompute ? 0 : count);
      break;
    }
    case OpKind::Vector: {
      b.flush_overlap();
      const double bytes = vector_bytes(op);
      if (bytes <= 0) break;
      b.chained(compute(ccat, ctx_.cm.memory_bound(Bytes{bytes}), 0.0, label));
      if (op.expert_part != 0) tag(b, b.chain, Role::ExpertFwd, &op);
      break;
    }
    case OpKind::Comm: emit_forward_comm(op, label, b, count); break;
  }
}

void LayerBuilder::emit_forward_comm(const Op& op, const std::string& label, ProgramBuilder& b, int cnt) {
  if (op.comm != Comm::TpGather) b.flush_overlap();
  switch (op.comm) {
    case Comm::TpGather:
      if (spec_.tp > 1 && spec_.sequence_parallel)
        emit_tp(b, Collective::AllGather, op.bytes_per_token * tok_.Tc, label, cnt, true);
      break;
    case Comm::TpScatter:
      if (spec_.tp > 1)
        emit_tp(b, spec_.sequence_parallel ? Collective::ReduceScatter : Collective::AllReduce,
                op.bytes_per_token * tok_.Tc, label, cnt, false);
      break;
    case Comm::TpReduceSmall:
      if (spec_.tp > 1)
        b.chained(collective(GroupKind::Tp, Collective::AllReduce, op.bytes_per_token * tok_.Tc, kTpComm, Stream::Tp,
                             label, cnt));
      break;
    case Comm::EpDispatch:
    case Comm::EpCombine: emit_ep(b, op, label, cnt, op.comm == Comm::EpDispatch); break;
    case Comm::None: break;
  }
}

void LayerBuilder::emit_backward_op(const Op& op, const std::string& pre, ProgramBuilder& b, ItemProgram& ip,
                                    int count) {
  const std::string label = pre + op.name;
  switch (op.kind) {
    case OpKind::Gemm: emit_backward_gemm(op, label, b, ip, count); break;
    case OpKind::Attention: {
      b.flush_overlap();
      emit_attention(op, label, b, true, kCompute, ip, count);
      break;
    }
    case OpKind::Vector: {
      b.flush_overlap();
      const double bytes = op.bwd_data_factor * vector_bytes(op);
      if (bytes <= 0) break;
      b.chained(compute(kCompute, ctx_.cm.memory_bound(Bytes{bytes}), 0.0, label + ".bwd"));
      if (op.expert_part != 0) tag(b, b.chain, Role::ExpertDgrad, &op);
      break;
    }
    case OpKind::Comm: emit_backward_comm(op, label + ".bwd", b, count); break;
  }
}

void LayerBuilder::emit_backward_gemm(const Op& op, const std::string& label, ProgramBuilder& b, ItemProgram& ip,
                                      int count) {
  const GemmShape g = gemm_shape(op);
  const int before = b.chain;
  int gathered = -1;
  // With SP, a column-parallel GEMM kept only its sequence shard: gather it again for the
  // weight gradient, overlapped with the data gradient (Megatron's SP backward).
  if (op.region == Region::Tensor && op.saved_layout == SavedLayout::Sequence && spec_.sequence_parallel &&
      spec_.tp > 1) {
    Step ag = collective(GroupKind::Tp, Collective::AllGather, op.k * models::kActivationBytes * tok_.Tc, kTpComm,
                         Stream::Tp, label + ".regather", count);
    if (ag.duration > 0) gathered = b.add(ag, before, -1);
  }
  // With tp_comm_overlap the gather of the output gradient runs beside the data gradient.
  const int overlapped = b.overlap_next;
  b.overlap_next = -1;
  if (gathered < 0) gathered = overlapped;
  const double fl = 2.0 * g.m * g.n * g.k * g.batch;
  const models::Precision prec = ctx_.precision;
  if (!op.is_embedding && op.bwd_data_factor > 0) {
    b.chained(compute(kCompute, ctx_.cm.gemm(g.m, g.k, g.n, prec, g.batch) + fp8_cast(ctx_.cm, prec, g.m * g.n * g.batch),
                      fl * op.bwd_data_factor, label + ".dgrad"));
    if (op.expert_part != 0) tag(b, b.chain, Role::ExpertDgrad, &op);
    ip.bwd_flops += fl * op.bwd_data_factor;
  }
  if (op.bwd_weight_factor > 0) {
    Step wg = compute(kCompute, ctx_.cm.gemm(g.k, g.n, g.m, prec, g.batch), fl * op.bwd_weight_factor, label + ".wgrad");
    // Autograd computes the weight gradient before it moves to the next node, so the next
    // backward step waits for it too (`pending`); only Megatron's explicit asynchronous
    // SP reduce-scatter overlaps it (see the TpGather backward).
    const int wi = b.add(wg, before, gathered);
    b.p.steps[static_cast<std::size_t>(wi)].wgrad = true;
    if (op.expert_part != 0) tag(b, wi, Role::ExpertWgrad, &op);
    b.join(wi);
    ip.bwd_flops += fl * op.bwd_weight_factor;
  }
  if (overlapped >= 0 && gathered != overlapped) b.join(overlapped);
}

void LayerBuilder::emit_backward_comm(const Op& op, const std::string& bl, ProgramBuilder& b, int count) {
  switch (op.comm) {
    case Comm::TpGather:  // gradient of a gather: reduce-scatter (SP) or all-reduce
      if (spec_.tp > 1) {
        // Megatron launches it asynchronously right after the data gradient and computes
        // the weight gradient meanwhile: it does not wait for the pending weight gradient,
        // the step after it waits for both.
        const int wgrad = b.pending;
        b.pending = -1;
        b.chained(collective(GroupKind::Tp, spec_.sequence_parallel ? Collective::ReduceScatter : Collective::AllReduce,
                             op.bytes_per_token * tok_.Tc, kTpComm, Stream::Tp, bl, count));
        b.pending = wgrad;
      }
      break;
    case Comm::TpScatter:  // gradient of a reduce-scatter: all-gather (SP); identity otherwise
      if (spec_.tp > 1 && spec_.sequence_parallel)
        emit_tp(b, Collective::AllGather, op.bytes_per_token * tok_.Tc, bl, count, true);
      break;
    case Comm::TpReduceSmall: break;
    case Comm::EpDispatch:  // the gradient of a dispatch flows back like a combine
    case Comm::EpCombine: emit_ep(b, op, bl, count, op.comm == Comm::EpCombine); break;
    case Comm::None: break;
  }
}

// The expert all-to-all, toward the experts (the dispatch, the combine's gradient) or back
// from them, with the expert-tensor-parallel gather / reduce-scatter around it. Under Adaptive
// Pipe Overlap a two-phase (hierarchical) all-to-all becomes kApoChunks chunks whose phases
// run on two streams: toward the experts the cross-server aggregation (Ep) then the in-server
// exchange (EpIntra), back the reverse; chunk c's second phase overlaps chunk c+1's first,
// and in a forward-backward pair one micro-batch's phases overlap the other's.
void LayerBuilder::emit_ep(ProgramBuilder& b, const Op& op, const std::string& label, int cnt, bool toward) {
  const double bytes = op.bytes_per_token * tok_.Tseq;
  const double dedup = ep_dedup();
  if (spec_.etp > 1 && !toward)  // back: reduce-scatter over ETP before the all-to-all
    b.chained(collective(GroupKind::Etp, Collective::ReduceScatter, bytes * spec_.etp, kEpComm, Stream::Ep,
                         label + ".etp", cnt));
  // Under Adaptive Pipe Overlap a weight gradient computed just before does not hold the
  // all-to-all back: it runs beside it and the step after the all-to-all waits for it (the
  // B / W split DualPipe and zero-bubble schedules make, here inside one backward).
  const int deferred = spec_.adaptive_pipe_overlap ? b.pending : -1;
  if (deferred >= 0) b.pending = -1;
  topologies::CollectiveCost cost;
  Step a2a = net_.step(GroupKind::Ep, Collective::AllToAll, bytes, kEpComm, Stream::Ep, labels_.label(label), cnt,
                       dedup, &cost);
  const bool moe = current_moe_layer_ >= 0;
  const Role role = toward ? Role::ToExperts : Role::FromExperts;
  const Tick cross = to_ticks(cost.cross_phase);
  if (spec_.adaptive_pipe_overlap && cross > 0 && cross < a2a.duration) {
    const Tick total = a2a.duration;
    const Tick first = toward ? cross : total - cross;  // the phase that runs first
    const Stream s1 = toward ? Stream::Ep : Stream::EpIntra, s2 = toward ? Stream::EpIntra : Stream::Ep;
    const sim::LabelId l1 = labels_.label(label + (toward ? ".cross" : ".intra"));
    const sim::LabelId l2 = labels_.label(label + (toward ? ".intra" : ".cross"));
    const int input = b.chain, input_pending = b.pending;
    int prev_second = -1, first_step = -1;
    auto piece = [&](Tick d, Stream st, sim::LabelId l) {
      Step x = a2a;
      x.duration = d;
      x.stream = st;
      x.label = l;
      x.part = static_cast<float>(static_cast<double>(d) / static_cast<double>(total));  // may sum past 1
      return x;
    };
    // Every chunk pays its phase's latency; the bytes divide among the chunks.
    const topologies::GroupShape& sh = net_.shape(GroupKind::Ep);
    const Tick lat_cross = to_ticks(Seconds{(sh.nodes - 1) * sh.inter_latency_s});
    const Tick lat_intra = to_ticks(Seconds{(sh.per_node - 1) * sh.intra_latency_s});
    const Tick lat1 = std::min(first, toward ? lat_cross : lat_intra);
    const Tick lat2 = std::min(total - first, toward ? lat_intra : lat_cross);
    auto chunk = [](Tick phase, Tick lat, int c) {
      const Tick bw = phase - lat;
      return lat + bw * (c + 1) / kApoChunks - bw * c / kApoChunks;
    };
    for (int c = 0; c < kApoChunks; ++c) {
      const Tick d1 = chunk(first, lat1, c);
      const Tick d2 = chunk(total - first, lat2, c);
      const int i1 = b.add(piece(d1, s1, l1), input, c == 0 ? input_pending : -1);
      if (c == 0) first_step = i1;
      prev_second = b.add(piece(d2, s2, l2), i1, prev_second);
      if (moe) {
        tag(b, i1, role, &op);
        tag(b, prev_second, role, &op);
      }
    }
    if (toward && moe) b.p.steps[static_cast<std::size_t>(first_step)].host_sync = ctx_.dispatch_syncs_host;
    b.pending = -1;
    b.prev_chain = input;
    b.chain = prev_second;
  } else if (a2a.duration > 0) {
    const int i = b.chained(a2a);
    if (moe) {
      tag(b, i, role, &op);
      if (toward) b.p.steps[static_cast<std::size_t>(i)].host_sync = ctx_.dispatch_syncs_host;
    }
  }
  if (spec_.etp > 1 && toward)  // toward: all-gather over ETP after the all-to-all
    b.chained(collective(GroupKind::Etp, Collective::AllGather, bytes * spec_.etp, kEpComm, Stream::Ep,
                         label + ".etp", cnt));
  b.join(deferred);
}

void LayerBuilder::emit_tp(ProgramBuilder& b, Collective kind, double bytes, const std::string& label, int count,
                           bool before_gemm) {
  Step c = collective(GroupKind::Tp, kind, bytes, kTpComm, Stream::Tp, label, count);
  if (c.duration == 0) return;
  if (!spec_.tp_comm_overlap) {
    b.chained(c);
    return;
  }
  if (before_gemm) {
    // Gather chunks stream into the GEMM that consumes them: the GEMM does not wait for the
    // whole gather; whatever follows the GEMM waits for both.
    b.overlap_next = b.add(c, b.chain, -1);
  } else {
    // Reduce-scatter of the GEMM's output chunks as they are produced: starts with the GEMM.
    b.join(b.add(c, b.prev_chain, -1));
  }
}

void LayerBuilder::emit_attention(const Op& op, const std::string& label, ProgramBuilder& b, bool backward,
                                  sim::Category cat, ItemProgram& ip, int count) {
  const double heads = op.heads / spec_.tp;
  const double sq = static_cast<double>(ctx_.seq_length) / spec_.cp;
  double skv = static_cast<double>(ctx_.seq_length);
  bool causal = op.causal;
  if (op.window > 0 && op.window < skv) {
    skv = op.window;
    causal = false;  // banded: each query sees about `window` keys
  }
  const double bh = static_cast<double>(spec_.mbs) * heads;
  const std::string lbl = backward ? label + ".bwd" : label;
  const int before = b.chain;
  const bool flash = op.attention_kernel == models::AttentionKernel::Flash;
  // Context parallelism: K/V blocks travel around the CP ring while blocks are computed (and
  // their gradients travel back in backward) — or, all-gather CP, the whole keys/values are
  // gathered first (again in backward, where they were not kept) and their gradients
  // reduce-scattered after one masked kernel over them.
  int ring = -1;
  double block = 0;
  if (spec_.cp > 1) {
    const double kv_heads =
        (ctx_.model.attention == models::AttentionKind::MLA ? op.heads : ctx_.model.kv_heads) / static_cast<double>(spec_.tp);
    block = spec_.mbs * sq * std::max(1.0, kv_heads) * (op.d_qk + op.d_v) * models::kActivationBytes;
    if (spec_.cp_all_gather && flash) {
      b.chained(collective(GroupKind::Cp, Collective::AllGather, block * spec_.cp, kCpComm, Stream::Cp,
                           lbl + ".kv_all_gather", count));
    } else {
      Step c = collective(GroupKind::Cp, Collective::AllGather, (backward ? 2 : 1) * block * spec_.cp, kCpComm,
                          Stream::Cp, lbl + ".kv_ring", count);
      if (c.duration > 0) ring = b.add(c, before, -1);
    }
  }
  if (!flash) {
    emit_unfused_attention(op, lbl, b, backward, cat, ip, bh, sq, skv);
    b.join(ring);
    return;
  }
  const double fwd_fl = 2.0 * bh * sq * skv * (op.d_qk + op.d_v) * (causal ? 0.5 : 1.0);
  const double fl = backward ? op.bwd_data_factor * fwd_fl : fwd_fl;
  const double bf = backward ? op.bwd_data_factor : 0.0;
  (backward ? ip.bwd_flops : ip.fwd_flops) += cat == kRecompute ? 0.0 : fl;
  // One attention kernel on the chain (packed documents rescale its work per micro-batch).
  auto kernel = [&](Seconds t, double flops, const std::string& name) {
    b.chained(compute(cat, t, flops, name));
    if (ctx_.packed_documents) b.p.steps[static_cast<std::size_t>(b.chain)].role = Role::Attention;
  };
  if (ring >= 0 && skv == static_cast<double>(ctx_.seq_length)) {
    // The ring, step by step (Megatron / Transformer Engine context parallelism; the causal
    // sequence is cut into 2 x CP chunks, rank r holding chunks r and 2CP-1-r): step 0 is the
    // local block under the mask, every later step half a block (all queries against the
    // earlier half of the arriving keys, or the later half of the queries against all of
    // them) without it, so each step has the same work and runs as its own, smaller kernel.
    // A step needs the block the previous one received: the steps before the last overlap
    // the transfers, the last waits for them; in backward the accumulated key/value
    // gradients then take one more hop home.
    const double cp = spec_.cp;
    const Seconds first = ctx_.cm.attention(bh, sq, sq, op.d_qk, op.d_v, causal, bf, ctx_.precision);
    const Seconds later =
        causal ? ctx_.cm.attention(bh, sq, 0.5 * sq, op.d_qk, op.d_v, false, bf, ctx_.precision) : first;
    const Step hop = b.p.steps[static_cast<std::size_t>(ring)];
    kernel(first + later * (cp - 2), fl * (cp - 1) / cp, lbl);
    b.join(ring);
    kernel(later, fl / cp, lbl + ".ring_last");
    if (backward) {
      // One step of the ring carries keys/values and their gradients: half of it goes home.
      Step h = hop;
      h.duration = hop.duration / static_cast<Tick>(2 * (spec_.cp - 1));
      h.label = labels_.label(lbl + ".dkv_home");
      b.chained(h);
    }
    return;
  }
  kernel(ctx_.cm.attention(bh, sq, skv, op.d_qk, op.d_v, causal, bf, ctx_.precision), fl, lbl);
  if (spec_.cp > 1 && spec_.cp_all_gather && backward)
    b.chained(collective(GroupKind::Cp, Collective::ReduceScatter, block * spec_.cp, kCpComm, Stream::Cp,
                         lbl + ".dkv_reduce_scatter", count));
  b.join(ring);
}

void LayerBuilder::emit_unfused_attention(const Op& op, const std::string& lbl, ProgramBuilder& b, bool backward,
                                          sim::Category cat, ItemProgram& ip, double bh, double sq, double skv) {
  // Unfused (Megatron before flash attention): batched GEMMs over the full s x s scores, a
  // fused scale-mask-softmax and dropout that stream the scores through HBM. Attention math
  // runs in 16-bit even in FP8 recipes (Transformer Engine keeps it in BF16).
  const models::Precision ap = ctx_.precision == models::Precision::FP8 ? models::Precision::BF16 : ctx_.precision;
  const double elems = bh * sq * skv;
  const double drop = op.attention_dropout > 0 ? 1.0 : 0.0;
  double fl = 0;
  auto gemm = [&](double m, double n, double k, const char* name) {
    fl += 2.0 * m * n * k * bh;
    b.chained(compute(cat, ctx_.cm.gemm(m, n, k, ap, bh), 2.0 * m * n * k * bh, lbl + name));
  };
  auto stream = [&](double bytes_per_elem, const char* name) {
    b.chained(compute(cat, ctx_.cm.memory_bound(Bytes{elems * bytes_per_elem}), 0.0, lbl + name));
  };
  if (!backward) {
    gemm(sq, skv, op.d_qk, ".qk");
    stream(4.0, ".softmax");                 // read scores, write probabilities
    if (drop > 0) stream(5.0, ".dropout");   // read, write, 1-byte mask
    gemm(sq, op.d_v, skv, ".av");
  } else {
    gemm(sq, skv, op.d_v, ".dp");            // dP = dO V^T
    gemm(skv, op.d_v, sq, ".dv");            // dV = P^T dO
    if (drop > 0) stream(5.0, ".dropout");
    stream(6.0, ".softmax");                 // read P and dP, write dS
    gemm(sq, op.d_qk, skv, ".dq");           // dQ = dS K
    gemm(skv, op.d_qk, sq, ".dk");           // dK = dS^T Q
  }
  (backward ? ip.bwd_flops : ip.fwd_flops) += cat == kRecompute ? 0.0 : fl;
}

void LayerBuilder::find_shared_branch(const models::Program& prog) {
  // Shared-expert overlap (Megatron --moe-shared-expert-overlap, MindSpeed
  // --moe-alltoall-overlap-comm): the shared expert branches off before the dispatch
  // all-to-all and is issued right after it, so it computes while the tokens travel; its
  // backward is issued right after the combine's backward all-to-all. Both rejoin the layer.
  shared_.assign(prog.ops.size(), false);
  dispatch_ = combine_ = unpermute_ = -1;
  if (spec_.shared_expert_overlap && current_moe_layer_ >= 0) {
    for (std::size_t i = 0; i < prog.ops.size(); ++i) {
      const Op& op = prog.ops[i];
      shared_[i] = op.name.rfind("shared_", 0) == 0;
      if (op.kind == OpKind::Comm && op.comm == models::Comm::EpDispatch) dispatch_ = static_cast<int>(i);
      if (op.kind == OpKind::Comm && op.comm == models::Comm::EpCombine) combine_ = static_cast<int>(i);
      if (op.name.find("unpermute") != std::string::npos) unpermute_ = static_cast<int>(i);
    }
    if (dispatch_ < 0 || combine_ < 0 || unpermute_ < 0) std::fill(shared_.begin(), shared_.end(), false);
  }
  branch_ = std::find(shared_.begin(), shared_.end(), true) != shared_.end();
}

int LayerBuilder::shared_branch(const models::Program& prog, const std::string& pre, ProgramBuilder& b, int from,
                                bool backward, ItemProgram& ip, int count) {
  const int main_chain = b.chain, main_pending = b.pending;
  b.chain = from;
  b.pending = -1;
  if (!backward) {
    for (std::size_t i = 0; i < prog.ops.size(); ++i)
      if (shared_[i]) emit_forward_op(prog.ops[i], pre, b, false, ip, count);
  } else {
    for (std::size_t i = prog.ops.size(); i-- > 0;)
      if (shared_[i]) emit_backward_op(prog.ops[i], pre, b, ip, count);
  }
  b.flush_overlap();
  int end = b.chain;
  if (b.pending >= 0) {
    Step j;
    j.label = labels_.label(pre + "shared_end");
    end = b.add(j, b.chain, b.pending);
  }
  b.chain = main_chain;
  b.pending = main_pending;
  return end;
}

void LayerBuilder::build_forward(const models::Program& prog, const std::string& pre, ItemProgram& ip, int count) {
  ProgramBuilder b{ip.fwd};
  int before_dispatch = -1, shared_end = -1;
  for (std::size_t i = 0; i < prog.ops.size(); ++i) {
    if (shared_[i]) continue;
    if (branch_ && static_cast<int>(i) == dispatch_) {
      b.flush_overlap();
      before_dispatch = b.chain;
    }
    emit_forward_op(prog.ops[i], pre, b, false, ip, count);
    if (branch_ && static_cast<int>(i) == dispatch_) shared_end = shared_branch(prog, pre, b, before_dispatch, false, ip, count);
    if (branch_ && static_cast<int>(i) == unpermute_) b.join(shared_end);
  }
  b.finish(labels_, pre + "end");
}

void LayerBuilder::build_backward(const models::Program& prog, const std::string& pre, ItemProgram& ip, bool full,
                                  std::uint32_t modules, int count) {
  // Re-run what recomputation dropped, then the gradients in reverse.
  ProgramBuilder b{ip.bwd};
  int gemm = 0;
  for (const Op& op : prog.ops) {
    bool rerun = full || (op.rerun_tag & modules) != 0;
    if (op_checkpoint_ && !full) {
      // Operator-level checkpointing: every other matmul (the 2nd, 4th, ...) and the
      // element-wise operators run again; attention and the other matmuls were kept. Counted
      // by moesim's fused operators (o_proj and mlp_down in a Llama block); torchtitan's
      // modules re-run wk, wo and w3 instead (account_memory counts those for memory), the
      // same FLOPs up to wk's: time follows the fused count.
      if (op.kind == OpKind::Gemm) rerun = ++gemm % 2 == 0;
      else rerun = op.kind == OpKind::Vector;
    }
    if (rerun) emit_forward_op(op, pre, b, true, ip, count);
  }
  b.flush_overlap();
  int grad_out = -1, shared_end = -1;
  for (std::size_t i = prog.ops.size(); i-- > 0;) {
    if (shared_[i]) continue;
    if (branch_ && static_cast<int>(i) == unpermute_) {
      b.flush_overlap();
      grad_out = b.chain;  // the layer's output gradient, which the shared expert also takes
    }
    emit_backward_op(prog.ops[i], pre, b, ip, count);
    if (branch_ && static_cast<int>(i) == combine_) shared_end = shared_branch(prog, pre, b, grad_out, true, ip, count);
    if (branch_ && static_cast<int>(i) == dispatch_) b.join(shared_end);
  }
  b.finish(labels_, pre + "end");  // a last weight gradient: the item ends when it is done
}

namespace {

/// Why a selective recomputation drops an operator's saved bytes: the first of the plan's
/// `--recompute-modules` that covers it.
const char* module_reason(std::uint32_t bits) {
  for (const auto& m : models::recompute::kModules)
    if (bits & m.bit) return m.reason;
  return "recompute";
}

}  // namespace

void LayerBuilder::account_memory(const models::Program& prog, ItemProgram& ip, bool decoder, bool full_recompute,
                                  int uniform_group, ItemMemoryDetail* detail) const {
  // Activations kept for backward and the largest working buffer. With `detail`, each term is
  // recorded where it is added to the sums (the sums themselves do not depend on it).
  const std::uint32_t modules = spec_.recompute_modules;
  const bool op_ckpt = decoder && spec_.op_checkpoint && !full_recompute;
  const char* const ckpt_why = "op-level checkpointing";
  auto buffer = [&](double bytes, const Op* op, const char* why) {
    if (bytes > ip.transient) {
      ip.transient = bytes;
      if (detail) {
        detail->transient_op = op ? op->name : "recomputed layer";
        detail->transient_why = why;
      }
    }
  };
  for (const Op& op : prog.ops) {
    const double factor = saved_precision_factor(op, decoder ? modules : 0u);
    const double bytes = op.saved_bytes * saved_tokens(op) * factor;
    ip.act_bytes_full += bytes;
    const bool dropped = decoder && (full_recompute || (op.saved_tag & modules) != 0);
    if (!dropped) ip.act_bytes += bytes;
    if (detail && op.saved_bytes > 0) {
      const char* why = op_ckpt ? ckpt_why : full_recompute ? "full recompute" : module_reason(op.saved_tag & modules);
      const bool gone = dropped || op_ckpt;
      detail->terms.push_back(MemoryTerm{op.name, bytes, gone ? 0.0 : bytes, gone ? why : "", op.saved_note, factor});
    }
    if (op.kind == OpKind::Attention && op.attention_kernel == models::AttentionKernel::Unfused) {
      // The s x s probabilities (2 bytes), and with dropout its mask (1) and output (2), per
      // head: Korthikanti et al.'s 5as^2b. Recomputing core attention drops them.
      const double seq = static_cast<double>(ctx_.seq_length);
      const double scores = spec_.mbs * (op.heads / spec_.tp) * (seq / spec_.cp) * seq;
      const bool with_dropout = op.attention_dropout > 0;
      const double sb = scores * (with_dropout ? 5.0 : 2.0);
      ip.act_bytes_full += sb;
      const bool gone = full_recompute || (modules & models::recompute::kCoreAttn) != 0;
      if (!gone) ip.act_bytes += sb;
      if (detail) {
        const char* why = op_ckpt ? ckpt_why : full_recompute ? "full recompute" : "recompute module core_attn";
        detail->terms.push_back(MemoryTerm{
            op.name + " s^2 scores", sb, gone || op_ckpt ? 0.0 : sb, gone || op_ckpt ? why : "",
            with_dropout ? "softmax output (2 B), dropout mask (1 B) and dropout output (2 B) per score of the local "
                           "heads: 5as^2b (Korthikanti et al. 2022, Table 2; unfused attention)"
                         : "softmax output, 2 B per score of the local heads: 2as^2b (Korthikanti et al. 2022, "
                           "Table 2, without dropout; unfused attention)",
            1.0});
      }
      buffer(2.0 * scores * 2.0, &op, "the s x s scores and their gradient, 2 B each (unfused attention)");
    }
    double out_bytes = 0;
    if (op.kind == OpKind::Gemm) {
      const GemmShape g = gemm_shape(op);
      out_bytes = g.m * g.n * g.batch * models::kActivationBytes;
    }
    buffer(2.0 * out_bytes, &op, "the GEMM's output and its gradient, 2 B each");
    // An operator whose implementation fixes its buffers (the loss, see the workload).
    if (op.transient_bytes_per_token > 0)
      buffer(op.transient_bytes_per_token * tok_.Tc / spec_.tp, &op,
             "the working buffers its implementation fixes (the loss: logits and gradient copies)");
    // Parameters held by one rank.
    double params = op.params;
    if (op.shares_embedding && spec_.single_stage) params = 0;  // the same tensor as the embedding
    if (op.region == Region::Expert) {
      ip.params_expert += params / spec_.ep / (op.split != Split::None ? spec_.etp : 1);
    } else if ((op.region == Region::Tensor && op.split != Split::None) || op.is_embedding) {
      ip.params_dense += params / spec_.tp;
    } else {
      ip.params_dense += params;
    }
  }
  if (op_ckpt) {
    // Operator-level checkpointing keeps the layer input, the outputs of every other matmul
    // (the 1st, 3rd, ...) and the attention kernel's output and softmax statistics.
    double kept = static_cast<double>(ctx_.model.hidden) * models::kActivationBytes * tok_.Tseq;
    if (detail)
      detail->terms.push_back(MemoryTerm{"layer input", 0.0, kept, "",
                                         "the layer's input, kept by operator-level checkpointing: 2sbh", 1.0});
    // torchtitan's policy counts aten.mm calls as the modules make them: a Llama block's Q, K
    // and V projections are three (wq, wk, wv), its gated MLP's gate and up two (w1, w3);
    // grouped expert GEMMs are not aten.mm and are neither counted nor kept.
    int gemm = 0;
    for (const Op& op : prog.ops) {
      if (op.kind == OpKind::Gemm && op.region != Region::Expert) {
        const GemmShape g = gemm_shape(op);
        const double out_all = g.m * g.n * g.batch * models::kActivationBytes;
        std::array<double, 3> parts{1.0, 0.0, 0.0};
        int n_parts = 1;
        const auto ends_with = [&](std::string_view suffix) {
          return op.name.size() >= suffix.size() && op.name.compare(op.name.size() - suffix.size(), suffix.size(), suffix) == 0;
        };
        const auto& m = ctx_.model;
        if (ends_with("qkv") && m.heads > 0 && m.kv_heads > 0) {
          const double all = m.heads + 2.0 * m.kv_heads;
          parts = {m.heads / all, m.kv_heads / all, m.kv_heads / all};
          n_parts = 3;
        } else if (ends_with("mlp_up") && m.mlp == models::MlpKind::SwiGLU) {
          parts = {0.5, 0.5, 0.0};
          n_parts = 2;
        }
        double out = 0;
        for (int i = 0; i < n_parts; ++i)
          if (++gemm % 2 == 1) out += parts[static_cast<std::size_t>(i)] * out_all;
        if (out <= 0) continue;
        kept += out;
        if (detail)
          detail->terms.push_back(MemoryTerm{
              op.name + " output", 0.0, out, "",
              n_parts > 1 ? "outputs of its odd matmuls (1st, 3rd, ... in the block; Q, K, V and gate, up counted "
                            "as separate matmuls, as torchtitan's modules call them), 16-bit, kept by operator-level "
                            "checkpointing"
                          : "output of an odd matmul (1st, 3rd, ... in the block), 16-bit, kept by operator-level "
                            "checkpointing",
              1.0});
      } else if (op.kind == OpKind::Attention) {
        const double out = (op.heads / spec_.tp) * (op.d_v * models::kActivationBytes + 4.0) * tok_.Tc;
        kept += out;
        if (detail)
          detail->terms.push_back(MemoryTerm{op.name + " output", 0.0, out, "",
                                             "attention output O, 2 B x a d_v, and the FP32 log-sum-exp, 4 B x a, "
                                             "kept by operator-level checkpointing",
                                             1.0});
      }
    }
    ip.act_bytes = kept;
  }
  if (decoder && full_recompute) {
    // Only the layer input is kept (one per group of `uniform_group` layers).
    ip.act_bytes =
        static_cast<double>(ctx_.model.hidden) * models::kActivationBytes * tok_.Tseq / std::max(1, uniform_group);
    if (detail)
      detail->terms.push_back(MemoryTerm{
          "layer input", 0.0, ip.act_bytes, "",
          uniform_group > 1 ? "the input at the checkpoint, 2sbh, one per recompute_num_layers layers (Megatron full "
                              "recompute, uniform method; Korthikanti et al. 2022, Sec. 4)"
                            : "the layer's input at the checkpoint, 2sbh (Megatron full recompute; Korthikanti et al. "
                              "2022, Sec. 4)",
          1.0});
    buffer(ip.act_bytes_full, nullptr, "the layer's activations, rebuilt whole by full recompute in backward");
  }
  // Adaptive Pipe Overlap: the all-to-alls of both micro-batches of a forward-backward pair are
  // in flight at once, each holding what its cross-server phase received until the in-server
  // phase forwards it (the largest: the dispatch's token copies), beside the operators' buffers.
  const topologies::GroupShape& ep = net_.shape(GroupKind::Ep);
  if (spec_.adaptive_pipe_overlap && ep.nodes > 1 && ep.per_node > 1)
    for (const Op& op : prog.ops)
      if (op.kind == OpKind::Comm && op.comm == Comm::EpDispatch) {
        const double staged = 2.0 * op.bytes_per_token * tok_.Tseq * (ep.size - ep.per_node) / ep.size * ep_dedup();
        ip.transient += staged;
        if (detail)
          detail->transient_op += " (+ " + std::to_string(static_cast<long long>(staged / (1 << 20))) +
                                  " MiB: Adaptive Pipe Overlap's cross-server staging, two micro-batches)";
      }
}

ItemProgram LayerBuilder::memory(const models::PipelineItem& item, bool full_recompute, int uniform_group,
                                 ItemMemoryDetail* detail) const {
  ItemProgram ip;
  const bool decoder = item.kind == models::ItemKind::Decoder || item.kind == models::ItemKind::Mtp;
  account_memory(ctx_.workload.programs[item.program], ip, decoder, full_recompute, uniform_group, detail);
  return ip;
}

ItemProgram LayerBuilder::build(const models::PipelineItem& item, bool full_recompute, int uniform_group,
                                int mb_count) {
  ItemProgram ip;
  const models::Program& prog = ctx_.workload.programs[item.program];
  const std::string pre = item_prefix(item);
  current_moe_layer_ = moe_ordinal(ctx_.model, item);
  const bool decoder = item.kind == models::ItemKind::Decoder || item.kind == models::ItemKind::Mtp;
  find_shared_branch(prog);
  build_forward(prog, pre, ip, mb_count);
  // Recomputation (full, or the selected modules) applies to decoder layers only.
  op_checkpoint_ = decoder && spec_.op_checkpoint;
  build_backward(prog, pre, ip, full_recompute && decoder, decoder ? spec_.recompute_modules : 0u, mb_count);
  account_memory(prog, ip, decoder, full_recompute, uniform_group, nullptr);
  for (const Step& st : ip.fwd.steps) ip.fwd_seconds += to_seconds(st.duration).value();
  for (const Step& st : ip.bwd.steps) ip.bwd_seconds += to_seconds(st.duration).value();
  return ip;
}

}  // namespace moesim::strategies::lowering
