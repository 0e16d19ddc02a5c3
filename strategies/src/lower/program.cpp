#include "program.hpp"

#include <cmath>

namespace moesim::strategies::lowering {

const char* group_name(GroupKind g) {
  switch (g) {
    case GroupKind::None: return "none";
    case GroupKind::Tp: return "tp";
    case GroupKind::Cp: return "cp";
    case GroupKind::Ep: return "ep";
    case GroupKind::Etp: return "etp";
    case GroupKind::Dp: return "dp";
    case GroupKind::Edp: return "edp";
  }
  return "?";
}

Layout Layout::of(const Plan& p, bool moe) {
  Layout l;
  l.tp = p.tp;
  l.cp = p.cp;
  l.dp = p.dp;
  l.ep = moe ? p.ep_size() : 1;
  l.etp = moe ? p.etp_size() : 1;
  l.block = p.tp * p.cp * p.dp;
  l.edp = l.block / (l.ep * l.etp);
  return l;
}

std::vector<int> Layout::members(GroupKind g, int local) const {
  std::vector<int> out;
  const int tp_i = local % tp, cp_i = (local / tp) % cp, dp_i = local / (tp * cp);
  const int etp_i = local % etp, ep_i = (local / etp) % ep, edp_i = local / (etp * ep);
  switch (g) {
    case GroupKind::Tp:
      for (int t = 0; t < tp; ++t) out.push_back(t + tp * (cp_i + cp * dp_i));
      break;
    case GroupKind::Cp:
      for (int c = 0; c < cp; ++c) out.push_back(tp_i + tp * (c + cp * dp_i));
      break;
    case GroupKind::Dp:  // gradients of dense weights reduce over DP x CP
      for (int x = 0; x < cp * dp; ++x) out.push_back(tp_i + tp * x);
      break;
    case GroupKind::Ep:
      for (int e = 0; e < ep; ++e) out.push_back(etp_i + etp * (e + ep * edp_i));
      break;
    case GroupKind::Etp:
      for (int t = 0; t < etp; ++t) out.push_back(t + etp * (ep_i + ep * edp_i));
      break;
    case GroupKind::Edp:
      for (int d = 0; d < edp; ++d) out.push_back(etp_i + etp * (ep_i + ep * d));
      break;
    case GroupKind::None: out.push_back(local); break;
  }
  return out;
}

Tokens Tokens::of(const Plan& p, long long seq_length, int etp) {
  Tokens t;
  t.T = static_cast<double>(p.mbs) * static_cast<double>(seq_length);
  t.Tc = t.T / p.cp;
  t.Tseq = (p.sequence_parallel && p.tp > 1) ? t.Tc / p.tp : t.Tc;
  t.Texp = t.Tseq * etp;
  return t;
}

void ProgramBuilder::join(int step) {
  if (step < 0) return;
  if (pending < 0) {
    pending = step;
    return;
  }
  Step j;
  j.label = p.steps[step].label;
  pending = add(j, pending, step);
}

void ProgramBuilder::finish(sim::TaskGraphBuilder& labels, const std::string& end_label) {
  flush_overlap();
  if (pending >= 0) {
    Step end;
    end.label = labels.label(end_label);
    chain = add(end, chain, pending);
    pending = -1;
  }
  p.chain_end = chain;
}

void append_program(Program& dst, const Program& src) {
  const int off = static_cast<int>(dst.steps.size());
  const int link = dst.chain_end;
  for (Step st : src.steps) {
    st.dep0 = st.dep0 >= 0 ? st.dep0 + off : link;
    st.dep1 = st.dep1 >= 0 ? st.dep1 + off : -1;
    dst.steps.push_back(st);
  }
  if (src.chain_end >= 0) dst.chain_end = src.chain_end + off;
  dst.item_end.push_back(static_cast<int>(dst.steps.size()) - 1);
}

void finalize_program(Program& p, sim::TaskGraphBuilder& labels) {
  int entries = 0;
  for (const Step& st : p.steps) entries += (st.dep0 < 0 && st.dep1 < 0) ? 1 : 0;
  if (entries <= 1) return;
  Step marker;
  marker.label = labels.label("begin");
  for (Step& st : p.steps) {
    const bool entry = st.dep0 < 0 && st.dep1 < 0;
    if (st.dep0 >= 0) ++st.dep0;
    if (st.dep1 >= 0) ++st.dep1;
    if (entry) st.dep0 = 0;
  }
  p.steps.insert(p.steps.begin(), marker);
  if (p.chain_end >= 0) ++p.chain_end;
  for (int& e : p.item_end) ++e;
}

void split_weight_gradients(Program& B, Program& W) {
  W = Program{};
  W.item_end.assign(B.item_end.size(), -1);
  std::vector<int> w_of(B.steps.size(), -1);
  int last = -1;
  for (std::size_t i = 0; i < B.steps.size(); ++i) {
    Step& st = B.steps[i];
    if (!st.wgrad) continue;
    Step w = st;
    w.dep0 = last;
    w.dep1 = -1;
    W.steps.push_back(w);
    last = static_cast<int>(W.steps.size()) - 1;
    w_of[i] = last;
    st.duration = 0;
    st.flops = 0;
    st.role = Role::None;
    st.wgrad = false;
  }
  W.chain_end = last;
  // An item's gradients are complete when the last W step up to its backward end has run.
  for (std::size_t k = 0; k < B.item_end.size(); ++k) {
    int best = -1;
    for (int i = 0; i <= B.item_end[k] && i < static_cast<int>(w_of.size()); ++i) best = std::max(best, w_of[i]);
    W.item_end[k] = best;
  }
}

Tick program_span(const Program& prog) {
  std::vector<Tick> end(prog.steps.size(), 0);
  Tick longest = 0;
  for (std::size_t i = 0; i < prog.steps.size(); ++i) {
    const Step& st = prog.steps[i];
    Tick start = 0;
    if (st.dep0 >= 0) start = std::max(start, end[st.dep0]);
    if (st.dep1 >= 0) start = std::max(start, end[st.dep1]);
    end[i] = add_ticks(start, st.duration);
    longest = std::max(longest, end[i]);
  }
  return longest;
}

Tick host_ticks(const Step& st, Tick launch, bool fused_vector_ops, int ep) {
  if (launch <= 0 || st.stream != Stream::Compute || st.duration <= 0 || st.cat == kLaunch ||
      (fused_vector_ops && st.flops == 0))
    return 0;
  const bool per_expert =
      st.op != nullptr && st.op->kind == models::OpKind::Gemm && st.op->region == models::Region::Expert;
  return per_expert ? scale_ticks(launch, std::max(1.0, std::round(st.op->matrices / ep))) : launch;
}

double time_alone(const Program& prog, Tick launch, bool fused_vector_ops, int ep, double& compute,
                  std::array<double, kNumCats>& comm) {
  const double launch_s = to_seconds(launch).value();
  std::array<double, kNumStreams> free{};
  std::vector<double> fin(prog.steps.size(), 0.0);
  double end = 0, host = 0;
  for (std::size_t i = 0; i < prog.steps.size(); ++i) {
    const Step& st = prog.steps[i];
    double start = free[static_cast<int>(st.stream)];
    if (st.dep0 >= 0) start = std::max(start, fin[st.dep0]);
    if (st.dep1 >= 0) start = std::max(start, fin[st.dep1]);
    if (launch > 0 && st.host_sync && (st.dep0 >= 0 || st.dep1 >= 0)) {
      host = std::max(host, std::max(st.dep0 >= 0 ? fin[st.dep0] : 0.0, st.dep1 >= 0 ? fin[st.dep1] : 0.0)) + launch_s;
      start = std::max(start, host);
    }
    if (const Tick h = host_ticks(st, launch, fused_vector_ops, ep); h > 0) {
      host += to_seconds(h).value();
      start = std::max(start, host);
    }
    const double d = to_seconds(st.duration).value();
    fin[i] = start + d;
    free[static_cast<int>(st.stream)] = fin[i];
    end = std::max(end, fin[i]);
    if (st.stream == Stream::Compute) compute += d;
    else comm[st.cat] += d;
  }
  return end;
}

}  // namespace moesim::strategies::lowering
