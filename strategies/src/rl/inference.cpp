#include "moesim/strategies/rl/inference.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moesim::strategies {

using topologies::Collective;
using topologies::analyze_group;
using topologies::collective_cost;

namespace {
double weight_elem_bytes(models::Precision p) { return p == models::Precision::FP8 ? 1.0 : 2.0; }
}  // namespace

InferenceModel::InferenceModel(const models::ModelSpec& m, const topologies::ClusterSpec& c,
                               const topologies::Topology& topo, const InferencePlan& plan, models::Precision precision)
    : m_(&m), device_(c.device), cm_(device_), plan_(plan), precision_(precision), w_(models::build_workload(m, 1)) {
  const int pp = std::max(1, plan_.pp);
  const int tp = std::max(1, plan_.tp);
  const int sd = plan_.stage_devices();
  stages_.resize(static_cast<std::size_t>(pp));
  // Decoder layers split evenly over the stages (the first stages take the remainder); the
  // embedding on the first, the head and the MTP module on the last.
  const int L = m.num_layers;
  std::vector<int> first_layer(static_cast<std::size_t>(pp) + 1, 0);
  for (int s = 0; s < pp; ++s) first_layer[s + 1] = first_layer[s] + L / pp + (s < L % pp ? 1 : 0);
  for (const auto& it : w_.items) {
    const auto& prog = w_.programs[static_cast<std::size_t>(it.program)];
    int s = 0;
    if (it.kind == models::ItemKind::Head || it.kind == models::ItemKind::Mtp) s = pp - 1;
    if (it.kind == models::ItemKind::Decoder)
      while (s + 1 < pp && it.index >= first_layer[s + 1]) ++s;
    auto& st = stages_[static_cast<std::size_t>(s)];
    if (it.kind == models::ItemKind::Mtp) {
      if (plan_.draft_tokens <= 0) continue;  // the MTP module is loaded only to draft tokens
      for (const auto& op : prog.ops) st.mtp_ops.push_back(&op);
      ++st.attention_layers;
    } else {
      for (const auto& op : prog.ops) st.ops.push_back(&op);
      if (it.kind == models::ItemKind::Decoder) ++st.attention_layers;
    }
  }
  // Weights per device, per stage.
  const double eb = weight_elem_bytes(precision_);
  for (const auto& st : stages_) {
    double bytes = 0;
    auto add = [&](const models::Op* op) {
      if (op->params <= 0) return;
      double p = op->params;
      if (op->region == models::Region::Expert) p /= plan_.ep;
      else if (op->split != models::Split::None) p /= tp;
      bytes += p * (op->kind == models::OpKind::Gemm ? eb : 2.0);
    };
    for (const auto* op : st.ops) add(op);
    for (const auto* op : st.mtp_ops) add(op);
    weight_bytes_ = std::max(weight_bytes_, bytes);
  }
  // KV cache per token and layer: MLA keeps the compressed latent and the rotary key (not split
  // by TP: every TP rank needs the whole latent); GQA keeps K and V of the rank's KV heads.
  if (m.attention == models::AttentionKind::MLA) {
    kv_per_token_layer_device_ = 2.0 * (m.kv_lora_rank + m.qk_rope_dim);
    attn_qk_ = m.kv_lora_rank + m.qk_rope_dim;  // absorbed: queries meet the latent directly
    attn_v_ = m.kv_lora_rank;
    kv_bytes_per_token_model_ = kv_per_token_layer_device_ * (m.num_layers + (plan_.draft_tokens > 0 ? m.mtp_layers : 0));
  } else {
    const int kvh = std::max(1, m.kv_heads);
    const double heads_per_rank = std::ceil(static_cast<double>(kvh) / tp);
    kv_per_token_layer_device_ = 2.0 * heads_per_rank * (m.head_dim + m.v_head_dim);
    attn_qk_ = m.head_dim;
    attn_v_ = m.v_head_dim;
    kv_bytes_per_token_model_ = 2.0 * kvh * (m.head_dim + m.v_head_dim) * (m.num_layers + (plan_.draft_tokens > 0 ? m.mtp_layers : 0));
  }
  heads_local_ = static_cast<double>(m.heads) / tp;
  for (const auto& st : stages_)
    kv_bytes_per_token_ = std::max(kv_bytes_per_token_, kv_per_token_layer_device_ * st.attention_layers);
  // Groups: TP ranks adjacent, the stage's devices adjacent, the next stage after them.
  std::vector<int> devs(static_cast<std::size_t>(std::min(sd, topo.num_devices())));
  std::iota(devs.begin(), devs.end(), 0);
  ep_shape_ = analyze_group(topo, devs);
  if (c.a2a_low_latency_base.value() > 0 && !ep_shape_.spans_nodes()) {
    ll_base_ = c.a2a_low_latency_base.value();
    ll_per_peer_ = c.a2a_low_latency_per_peer.value();
    ll_bandwidth_ = c.scale_up_achieved().value();
  }
  devs.resize(static_cast<std::size_t>(std::min(tp, topo.num_devices())));
  tp_shape_ = analyze_group(topo, devs);
  if (pp > 1 && sd < topo.num_devices()) {
    const auto r = topo.route(0, sd);
    pp_hop_bandwidth_ = r.bottleneck_bytes_per_s;
    pp_hop_latency_ = r.latency_s;
  }
}

double InferenceModel::kv_budget_per_device() const {
  return device_.hbm_capacity.value() - device_.memory_reserved.value() - weight_bytes_;
}

std::int64_t InferenceModel::max_sequences(double context_tokens) const {
  const double budget = kv_budget_per_device();
  if (budget <= 0 || context_tokens <= 0) return 0;
  const double per_group = std::floor(budget / (context_tokens * kv_bytes_per_token_));
  return static_cast<std::int64_t>(per_group) * plan_.attention_groups();
}

double InferenceModel::op_seconds(const models::Op& op, double group_tokens, double instance_tokens, bool decode,
                                  double attn_seqs, double attn_len, double* flops, double* bytes,
                                  DecodeBreakdown* parts) const {
  const double tp = plan_.tp;
  const double a = plan_.attention_groups();
  const double sd = plan_.stage_devices();
  const double eb = weight_elem_bytes(precision_);
  double t = 0;
  switch (op.kind) {
    case models::OpKind::Gemm: {
      if (op.region == models::Region::Expert) {
        // Whole experts spread over the stage's devices (replicated when ep < stage devices):
        // a device computes its share of the routed copies with the experts they touch; at
        // small batches only some experts are touched, and only their weights are read.
        const double E = std::max(1.0, op.matrices);
        const double replicas = sd / plan_.ep;
        const double copies_total = instance_tokens * op.tokens_factor;
        const double local = E / plan_.ep;
        const double active = local * -std::expm1(copies_total * std::log1p(-1.0 / (E * replicas)));
        const double copies = copies_total / sd;
        if (active <= 0 || copies <= 0) break;
        t = cm_.gemm(copies / active, op.n, op.k, precision_, active).value();
        *flops += 2.0 * copies_total * op.k * op.n;
        *bytes += active * op.k * op.n * eb + copies * (op.k + op.n) * 2.0;
      } else {
        double k = op.k, n = op.n;
        if (op.split == models::Split::Column) n /= tp;
        if (op.split == models::Split::Row) k /= tp;
        t = cm_.gemm(group_tokens, n, k, precision_).value();
        *flops += 2.0 * group_tokens * op.k * op.n * op.tokens_factor * a;
        *bytes += k * n * eb + group_tokens * (k + n) * 2.0;
      }
      if (parts) parts->gemm += t;
      break;
    }
    case models::OpKind::Vector: {
      double b = op.bytes_per_token;
      double tokens = group_tokens;
      if (op.region == models::Region::Expert) tokens = instance_tokens * op.tokens_factor / sd;
      if (op.split != models::Split::None || op.is_embedding) b /= tp;
      t = cm_.memory_bound(Bytes{b * tokens}).value();
      *bytes += b * tokens;
      if (parts) parts->vector += t;
      break;
    }
    case models::OpKind::Attention: {
      if (decode) break;  // decode attention is the KV read, added per layer by the caller
      const double len = attn_len;
      t = cm_.attention(attn_seqs * heads_local_, len, len, op.d_qk, op.d_v, op.causal, 0, precision_).value();
      *flops += 2.0 * attn_seqs * a * op.heads * len * len * (op.d_qk + op.d_v) * (op.causal ? 0.5 : 1.0);
      *bytes += attn_seqs * heads_local_ * len * (2 * op.d_qk + 2 * op.d_v) * 2.0;
      if (parts) parts->attention += t;
      break;
    }
    case models::OpKind::Comm: {
      if (op.comm == models::Comm::TpScatter && plan_.tp > 1) {
        t = collective_cost(Collective::AllReduce, group_tokens * op.bytes_per_token, tp_shape_).time.value();
        if (parts) parts->tp_comm += t;
      } else if ((op.comm == models::Comm::EpDispatch || op.comm == models::Comm::EpCombine) && sd > 1) {
        // Each TP rank of an attention group sends its 1/tp of the group's routed copies. Decode
        // uses the low-latency kernels where the cluster has them (one fixed cost, not a step
        // per peer); prefill and clusters without them the normal all-to-all.
        const double b = group_tokens / tp * op.bytes_per_token;
        if (decode && ll_base_ > 0) {
          const double n = ep_shape_.size;
          t = ll_base_ + (n - 1) * ll_per_peer_ + b * (n - 1) / n / ll_bandwidth_;
        } else {
          t = collective_cost(Collective::AllToAll, b, ep_shape_).time.value();
        }
        if (parts) parts->ep_comm += t;
      }
      break;
    }
  }
  return t;
}

InferenceModel::Linear InferenceModel::stage_decode(const StageOps& st, double seqs_per_group, double instance_seqs) const {
  Linear lin;
  const double T = 1.0 + plan_.draft_tokens;  // tokens per sequence the main model verifies per step
  const double a = plan_.attention_groups();
  const models::DeviceSpec& d = device_;
  const double bw = d.hbm_bandwidth.value() * d.hbm_efficiency;
  const double attn_eff_peak = d.peak(precision_ == models::Precision::FP8 ? models::Precision::BF16 : precision_).value() *
                               d.attention_fwd_efficiency;
  auto attention_layer = [&](double tokens_per_seq) {
    // Per token of cached context: read its KV once; QK^T and AV for every new token of every
    // local head. Roofline of the two, linear in the context (both go through zero).
    const double byte_slope = kv_per_token_layer_device_ / bw;
    const double flop_slope = 2.0 * heads_local_ * tokens_per_seq * (attn_qk_ + attn_v_) / attn_eff_peak;
    lin.c1 += std::max(byte_slope, flop_slope);
    lin.parts.attention += d.kernel_overhead.value();
    lin.c0 += d.kernel_overhead.value();
    lin.flops1 += 2.0 * m_->heads * tokens_per_seq * (attn_qk_ + attn_v_) * a;  // instance, per group-context token
    lin.bytes1 += kv_per_token_layer_device_;
  };
  auto run = [&](const std::vector<const models::Op*>& ops, double tokens_per_seq) {
    for (const auto* op : ops) {
      if (op->kind == models::OpKind::Attention) {
        attention_layer(tokens_per_seq);
        continue;
      }
      lin.c0 += op_seconds(*op, seqs_per_group * tokens_per_seq, instance_seqs * tokens_per_seq, true, 0, 0, &lin.flops0,
                           &lin.bytes0, &lin.parts);
    }
  };
  run(st.ops, T);
  for (int i = 0; i < plan_.draft_tokens; ++i) run(st.mtp_ops, 1.0);
  if (plan_.pp > 1 && pp_hop_bandwidth_ > 0) {
    const double t = pp_hop_latency_ + seqs_per_group * T * static_cast<double>(m_->hidden) * 2.0 / pp_hop_bandwidth_;
    lin.c0 += t;
    lin.parts.pp_comm += t;
  }
  return lin;
}

const std::vector<InferenceModel::Linear>& InferenceModel::decode_linear(std::int64_t sequences) const {
  auto it = memo_.find(sequences);
  if (it != memo_.end()) return it->second;
  const double pp = plan_.pp;
  const double mbs = std::min<double>(pp, static_cast<double>(sequences));
  const double per_mb = std::ceil(static_cast<double>(sequences) / mbs);
  const double per_group = std::ceil(per_mb / plan_.attention_groups());
  std::vector<Linear> v;
  for (const auto& st : stages_) v.push_back(stage_decode(st, per_group, per_mb));
  return memo_.emplace(sequences, std::move(v)).first->second;
}

StepCost InferenceModel::decode_step(std::int64_t sequences, double context_sum) const {
  StepCost c;
  if (sequences <= 0) return c;
  const auto& lin = decode_linear(sequences);
  const double pp = plan_.pp;
  const double mbs = std::min<double>(pp, static_cast<double>(sequences));
  const double ctx_group = context_sum / mbs / plan_.attention_groups();
  double max_t = 0, sum_t = 0, max_b = 0;
  for (const auto& l : lin) {
    const double t = l.c0 + l.c1 * ctx_group;
    max_t = std::max(max_t, t);
    sum_t += t;
    max_b = std::max(max_b, l.bytes0 + l.bytes1 * ctx_group);
    c.flops += (l.flops0 + l.flops1 * ctx_group) * mbs;
  }
  // One token step: every micro-batch passes every stage; with mbs micro-batches in flight the
  // busiest stage works mbs times, and no step is shorter than one trip through the pipeline.
  c.seconds = std::max(mbs * max_t, sum_t);
  c.hbm_bytes_per_device = max_b * mbs;
  return c;
}

DecodeBreakdown InferenceModel::decode_breakdown(std::int64_t sequences, double context_sum) const {
  DecodeBreakdown out;
  if (sequences <= 0) return out;
  const auto& lin = decode_linear(sequences);
  const double mbs = std::min<double>(plan_.pp, static_cast<double>(sequences));
  const double ctx_group = context_sum / mbs / plan_.attention_groups();
  const Linear* worst = &lin.front();
  for (const auto& l : lin)
    if (l.c0 + l.c1 * ctx_group > worst->c0 + worst->c1 * ctx_group) worst = &l;
  out = worst->parts;
  out.attention += worst->c1 * ctx_group;
  const double k = mbs;
  out.gemm *= k; out.attention *= k; out.vector *= k; out.tp_comm *= k; out.ep_comm *= k; out.pp_comm *= k;
  return out;
}

StepCost InferenceModel::prefill(double tokens, double sum_sq, double sequences) const {
  StepCost c;
  if (tokens <= 0 || sequences <= 0) return c;
  const double a = plan_.attention_groups();
  const double group_tokens = tokens / a;
  const double group_seqs = sequences / a;
  const double len = std::sqrt(sum_sq / sequences);  // root-mean-square length: the causal work is sum of squares
  double max_t = 0, sum_t = 0, max_b = 0;
  for (const auto& st : stages_) {
    double t = 0, bytes = 0;
    for (const auto* op : st.ops)
      t += op_seconds(*op, group_tokens, tokens, false, group_seqs, len, &c.flops, &bytes, nullptr);
    if (plan_.pp > 1 && pp_hop_bandwidth_ > 0)
      t += pp_hop_latency_ + group_tokens * static_cast<double>(m_->hidden) * 2.0 / pp_hop_bandwidth_;
    max_t = std::max(max_t, t);
    sum_t += t;
    max_b = std::max(max_b, bytes);
  }
  // Sequences stream through the stages one after another: the busiest stage sets the pace,
  // plus one sequence's trip through the others.
  c.seconds = max_t + (sum_t - max_t) / std::max(1.0, sequences);
  c.hbm_bytes_per_device = max_b;
  return c;
}

}  // namespace moesim::strategies
