#include "moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "layer.hpp"
#include "moesim/sim/random.hpp"
#include "moesim/strategies/lower/memory.hpp"

namespace moesim::strategies::lowering {

using models::Op;
using models::OpKind;
using models::Split;
using topologies::Algorithm;

const MoeRouting::Draw& MoeRouting::draw(int moe_layer, int mb, int group) {
  const std::array<int, 3> key{moe_layer, mb, group};
  auto it = draws_.find(key);
  if (it != draws_.end()) return it->second;
  const models::ModelSpec& m = in_.model;
  const int E = m.num_experts, ep = lay_.ep, per = E / ep;
  auto pop = popularity_.find(moe_layer);
  if (pop == popularity_.end())
    pop = popularity_.emplace(moe_layer, models::expert_probabilities(in_.routing, moe_layer, E, m.top_k, in_.seed)).first;
  // Token copies routed inside one expert-parallel group in one micro-batch.
  const double copies = tok_.Tseq * lay_.etp * m.top_k * ep;
  Rng rng = Rng::stream(in_.seed, "routing/layer" + std::to_string(moe_layer) + "/mb" + std::to_string(mb) + "/group" +
                                      std::to_string(group));
  // Balanced routing (with a user's expert map): every expert gets exactly its share.
  const std::vector<std::uint64_t> load =
      in_.routing.skewed() ? models::sample_expert_load(pop->second, static_cast<std::uint64_t>(std::llround(copies)), rng)
                           : std::vector<std::uint64_t>(static_cast<std::size_t>(E),
                                                        static_cast<std::uint64_t>(std::llround(copies / E)));
  Draw d;
  d.copies.assign(static_cast<std::size_t>(ep), std::vector<double>(static_cast<std::size_t>(per), 0.0));
  d.recv.assign(static_cast<std::size_t>(ep), 0.0);
  const double cap = in_.routing.capacity_factor > 0 ? std::ceil(in_.routing.capacity_factor * copies / E) : 0.0;
  std::vector<double> per_expert(static_cast<std::size_t>(E), 0.0);
  for (int e = 0; e < E; ++e) {
    double x = static_cast<double>(load[e]);
    d.total += x;
    if (cap > 0 && x > cap) {
      d.dropped += x - cap;
      x = cap;
    }
    d.total_kept += x;
    // Drop-and-pad: the expert computes (and the all-to-all carries) its full capacity.
    per_expert[e] = cap > 0 && in_.routing.pad_to_capacity ? cap : x;
  }
  // Experts' copies onto their ranks (a replicated expert's copies split over its replicas).
  const Placement& pl = placement(moe_layer);
  std::vector<int> fill(static_cast<std::size_t>(ep), 0);
  for (int e = 0; e < E; ++e)
    for (const auto& [rank, share] : pl.where[e]) {
      auto& slots = d.copies[rank];
      const int slot = fill[rank]++;
      if (slot >= static_cast<int>(slots.size())) slots.resize(static_cast<std::size_t>(slot) + 1, 0.0);
      slots[slot] = per_expert[e] * share;
      d.recv[rank] += per_expert[e] * share;
    }
  // All-to-all volumes: every source holds an equal share of the tokens, so member i sends
  // recv[j] / ep copies to member j.
  const double bytes_per_copy = static_cast<double>(m.hidden) * models::kActivationBytes;
  std::vector<std::vector<double>> to(static_cast<std::size_t>(ep), std::vector<double>(static_cast<std::size_t>(ep), 0.0));
  for (int i = 0; i < ep; ++i)
    for (int j = 0; j < ep; ++j) to[i][j] = d.recv[j] / ep * bytes_per_copy;
  std::vector<std::vector<double>> from(to.size(), std::vector<double>(to.size(), 0.0));
  for (int i = 0; i < ep; ++i)
    for (int j = 0; j < ep; ++j) from[j][i] = to[i][j];
  const Algorithm algo = net_.a2a_algorithm();
  const double dedup = algo == Algorithm::AllGatherAllToAll
                           ? 1.0 / std::max(1, m.top_k)
                           : alltoall_dedup_ratio(m.num_experts, m.top_k, net_.shape(GroupKind::Ep).nodes);
  d.to_experts = to_ticks(net_.ep_alltoallv(to, group, algo, dedup).time);
  d.from_experts = to_ticks(net_.ep_alltoallv(from, group, algo, dedup).time);
  return draws_.emplace(key, std::move(d)).first->second;
}

std::vector<double> MoeRouting::predicted_load(int moe_layer) const {
  // An exponential moving average of the loads of the previous steps (each a draw of one
  // step's copies of this group from the layer's popularity), newest weighted 1 - ema.
  const int E = in_.model.num_experts;
  const auto& pop = popularity_.at(moe_layer);
  const double step_copies = tok_.Tseq * lay_.etp * in_.model.top_k * lay_.ep * in_.num_microbatches;
  Rng rng = Rng::stream(in_.seed, "placement/layer" + std::to_string(moe_layer));
  std::vector<double> pred(static_cast<std::size_t>(E), 0.0);
  const int history = 32;
  for (int h = 0; h < history; ++h) {
    const auto load = models::sample_expert_load(pop, static_cast<std::uint64_t>(std::llround(step_copies)), rng);
    for (int e = 0; e < E; ++e)
      pred[e] = h == 0 ? static_cast<double>(load[e]) : in_.placement.ema * pred[e] + (1 - in_.placement.ema) * load[e];
  }
  return pred;
}

namespace {

using Where = std::vector<std::vector<std::pair<int, double>>>;  // expert -> (rank or bin, share)

/// Redundant experts: each extra replica goes to the expert with the highest load per replica.
std::vector<int> replica_counts(const std::vector<double>& pred, int redundant, int ep) {
  const int E = static_cast<int>(pred.size());
  std::vector<int> replicas(static_cast<std::size_t>(E), 1);
  for (int r = 0; r < redundant; ++r) {
    int best = 0;
    for (int e = 1; e < E; ++e)
      if (pred[e] / replicas[e] > pred[best] / replicas[best]) best = e;
    if (replicas[best] >= ep) break;  // at most one replica per rank
    ++replicas[best];
  }
  return replicas;
}

/// Greedy (longest processing time first): replicas by load, each onto the least loaded bin
/// with a free slot that does not hold the expert yet.
Where pack_replicas(const std::vector<double>& pred, const std::vector<int>& replicas, int ep, int slots) {
  const int E = static_cast<int>(pred.size());
  std::vector<std::pair<double, int>> items;  // (load per replica, expert)
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < replicas[e]; ++r) items.emplace_back(pred[e] / replicas[e], e);
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<double> rank_load(static_cast<std::size_t>(ep), 0.0);
  std::vector<int> used(static_cast<std::size_t>(ep), 0);
  Where bins(static_cast<std::size_t>(E));
  for (const auto& [load, e] : items) {
    int best = -1;
    for (int r = 0; r < ep; ++r) {
      if (used[r] >= slots) continue;
      bool holds = false;
      for (const auto& w : bins[e]) holds = holds || w.first == r;
      if (holds) continue;
      if (best < 0 || rank_load[r] < rank_load[best]) best = r;
    }
    if (best < 0) best = static_cast<int>(std::min_element(rank_load.begin(), rank_load.end()) - rank_load.begin());
    bins[e].emplace_back(best, 1.0 / replicas[e]);
    rank_load[best] += load;
    ++used[best];
  }
  return bins;
}

/// The bins are interchangeable: give each bin the rank whose static experts it keeps most of
/// (greedy on the overlap), so that as few experts as possible move.
std::vector<int> match_bins_to_ranks(const Where& bins, const std::vector<int>& home, int ep) {
  const int E = static_cast<int>(bins.size());
  std::vector<std::vector<int>> overlap(static_cast<std::size_t>(ep), std::vector<int>(static_cast<std::size_t>(ep), 0));
  for (int e = 0; e < E; ++e)
    for (const auto& [b, share] : bins[e]) ++overlap[b][home[e]];
  std::vector<int> rank_of(static_cast<std::size_t>(ep), -1);
  std::vector<bool> taken(static_cast<std::size_t>(ep), false);
  for (int round = 0; round < ep; ++round) {
    int bb = -1, br = -1;
    for (int b = 0; b < ep; ++b) {
      if (rank_of[b] >= 0) continue;
      for (int r = 0; r < ep; ++r)
        if (!taken[r] && (bb < 0 || overlap[b][r] > overlap[bb][br])) {
          bb = b;
          br = r;
        }
    }
    rank_of[bb] = br;
    taken[br] = true;
  }
  return rank_of;
}

/// Coefficient of variation of the ranks' predicted loads under a placement.
double load_cv(const Where& where, const std::vector<double>& pred, int ep) {
  std::vector<double> l(static_cast<std::size_t>(ep), 0.0);
  for (std::size_t e = 0; e < where.size(); ++e)
    for (const auto& [r, share] : where[e]) l[r] += pred[e] * share;
  const double mean = std::accumulate(l.begin(), l.end(), 0.0) / ep;
  double var = 0;
  for (double x : l) var += (x - mean) * (x - mean);
  return mean > 0 ? std::sqrt(var / ep) / mean : 0.0;
}

}  // namespace

const MoeRouting::Placement& MoeRouting::placement(int moe_layer) {
  auto it = placement_.find(moe_layer);
  if (it != placement_.end()) return it->second;
  const int E = in_.model.num_experts, ep = lay_.ep, per = E / ep;
  const PlacementSpec& ps = in_.placement;
  Placement st;  // static: the user's map, or expert e on rank e / per
  st.where.resize(static_cast<std::size_t>(E));
  std::vector<int> home(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) {
    if (!ps.expert_map.empty()) {
      const auto& ranks = ps.expert_map[e];
      for (int r : ranks) st.where[e].emplace_back(r, 1.0 / static_cast<double>(ranks.size()));
    } else {
      st.where[e] = {{e / per, 1.0}};
    }
    home[e] = st.where[e].front().first;
  }
  if (!ps.rebalance) return placement_.emplace(moe_layer, std::move(st)).first->second;

  const std::vector<double> pred = predicted_load(moe_layer);
  const std::vector<int> replicas = replica_counts(pred, ps.redundant_experts, ep);
  const Where bins = pack_replicas(pred, replicas, ep, per + (ps.redundant_experts + ep - 1) / ep);
  const std::vector<int> rank_of = match_bins_to_ranks(bins, home, ep);
  Placement bal;
  bal.where.resize(static_cast<std::size_t>(E));
  bal.moved_in.assign(static_cast<std::size_t>(ep), 0);
  for (int e = 0; e < E; ++e)
    for (const auto& [b, share] : bins[e]) {
      const int r = rank_of[b];
      bal.where[e].emplace_back(r, share);
      if (r != home[e]) {
        ++bal.moved;
        ++bal.moved_in[r];
      }
    }
  // Migrate only when the predicted imbalance (coefficient of variation of the ranks' loads)
  // drops by more than the threshold.
  const bool migrate = load_cv(st.where, pred, ep) - load_cv(bal.where, pred, ep) > ps.threshold;
  return placement_.emplace(moe_layer, migrate ? std::move(bal) : std::move(st)).first->second;
}

Tick MoeRouting::routed_duration(const Step& st, int mb, int local) {
  const int ep_rank = (local / lay_.etp) % lay_.ep;
  const int group = local / (lay_.etp * lay_.ep);
  const Draw& d = draw(st.moe_layer, mb, group);
  if (st.role == Role::ToExperts) return st.part < 1.0f ? scale_ticks(d.to_experts, st.part) : d.to_experts;
  if (st.role == Role::FromExperts) return st.part < 1.0f ? scale_ticks(d.from_experts, st.part) : d.from_experts;
  const Op& op = *st.op;
  const std::vector<double>& m = d.copies[static_cast<std::size_t>(ep_rank)];
  double rows = 0;
  for (double x : m) rows += x;
  if (op.kind == OpKind::Vector) {
    double bytes = op.bytes_per_token * rows / (op.split == Split::Column ? lay_.etp : 1);
    if (st.role == Role::ExpertDgrad) bytes *= op.bwd_data_factor;
    return to_ticks(cm_.memory_bound(Bytes{bytes}));
  }
  // Expert GEMM: the split dimension is divided by the expert tensor-parallel size.
  const double n = op.split == Split::Column ? op.n / lay_.etp : op.n;
  const double k = op.split == Split::Row ? op.k / lay_.etp : op.k;
  const std::vector<double> ks(m.size(), k), ns(m.size(), n);
  const models::Precision prec = in_.precision;
  switch (st.role) {
    case Role::ExpertFwd: return to_ticks(cm_.grouped_gemm(m, ks, n, prec) + fp8_cast(cm_, prec, rows * k));
    case Role::ExpertDgrad: return to_ticks(cm_.grouped_gemm(m, ns, k, prec) + fp8_cast(cm_, prec, rows * n));
    case Role::ExpertWgrad: {
      const std::vector<double> rows_k(m.size(), k);  // [k x m_e] x [m_e x n] per expert
      return to_ticks(cm_.grouped_gemm(rows_k, m, n, prec));
    }
    default: return st.duration;
  }
}

ExpertLoad MoeRouting::expert_load(const std::vector<models::PipelineItem>& items, bool skewed) {
  ExpertLoad el;
  const int ep = lay_.ep;
  el.routing = models::routing_name(in_.routing.kind);
  el.ep = ep;
  el.a2a_bytes_per_rank.assign(static_cast<std::size_t>(ep), 0.0);
  const double bytes_per_copy = static_cast<double>(in_.model.hidden) * models::kActivationBytes;
  // One (layer, micro-batch): rank i sends recv[j]/ep copies to every other j and gets
  // recv[i]/ep from each; the combine reverses it and the backward repeats both.
  auto add_bytes = [&](const std::vector<double>& recv) {
    double total = 0;
    for (double x : recv) total += x;
    for (int i = 0; i < ep; ++i) {
      const double dispatch_out = (total - recv[i]) / ep, dispatch_in = recv[i] * (ep - 1) / ep;
      el.a2a_bytes_per_rank[i] += 2.0 * (dispatch_out + dispatch_in) * bytes_per_copy;
    }
  };
  std::vector<int> layers;
  for (const auto& item : items)
    if (const int k = moe_ordinal(in_.model, item); k >= 0) layers.push_back(k);
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  const int m = in_.num_microbatches;
  el.layer_rank_share.assign(layers.size(), std::vector<double>(static_cast<std::size_t>(ep), 1.0 / ep));
  if (!skewed) {
    const std::vector<double> recv(static_cast<std::size_t>(ep), tok_.Tseq * lay_.etp * in_.model.top_k);
    for (std::size_t l = 0; l < layers.size(); ++l)
      for (int mb = 0; mb < m; ++mb) add_bytes(recv);
    return el;
  }
  // Skewed routing: the draws of the first expert-parallel group (every group at full
  // fidelity draws alike in distribution); one per (layer, micro-batch).
  double sum_mom = 0, sum_score = 0, worst = 0, dropped = 0, routed = 0;
  int n = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    std::vector<double>& share = el.layer_rank_share[l];
    std::fill(share.begin(), share.end(), 0.0);
    for (int mb = 0; mb < m; ++mb) {
      const Draw& d = draw(layers[l], mb, 0);
      double total = 0, mx = 0, mn = d.recv.empty() ? 0 : d.recv[0];
      for (double x : d.recv) {
        total += x;
        mx = std::max(mx, x);
        mn = std::min(mn, x);
      }
      if (total <= 0) continue;
      const double mom = mx / (total / ep);
      sum_mom += mom;
      worst = std::max(worst, mom);
      sum_score += (mx - mn) / total;
      for (int i = 0; i < ep; ++i) share[i] += d.recv[i] / total / m;
      dropped += d.dropped;
      routed += d.total;
      ++n;
      add_bytes(d.recv);
    }
  }
  if (n > 0) {
    el.max_over_mean = sum_mom / n;
    el.max_over_mean_worst = worst;
    el.imbalance_score = sum_score / n;
  }
  el.drop_rate = routed > 0 ? dropped / routed : 0.0;
  el.placement = in_.placement.rebalance ? "rebalanced" : "static";
  for (const auto& [k, pl] : placement_) el.experts_moved += pl.moved;
  return el;
}

double MoeRouting::migration_seconds(const std::vector<std::vector<int>>& chunk_items,
                                     const std::vector<models::PipelineItem>& items) const {
  const double params =
      3.0 * static_cast<double>(in_.model.hidden) * static_cast<double>(in_.model.expert_ffn_hidden) / lay_.etp;
  // BF16 weights and the expert's Adam states (its shard with the distributed optimizer).
  const double bytes_per_param =
      2.0 + (in_.distributed_optimizer ? in_.adam_state_bytes / lay_.edp : in_.adam_state_bytes);
  const topologies::GroupShape& sh = net_.shape(GroupKind::Ep);
  const double bw = sh.spans_nodes() ? sh.inter_bytes_per_s : sh.intra_bytes_per_s;
  double worst_total = 0;
  for (const auto& chunk : chunk_items)
    for (int idx : chunk) {
      const int k = moe_ordinal(in_.model, items[idx]);
      if (k < 0 || placement_.find(k) == placement_.end()) continue;
      const auto& mi = placement_.at(k).moved_in;
      if (!mi.empty()) worst_total += *std::max_element(mi.begin(), mi.end());
    }
  return bw > 0 ? worst_total * params * bytes_per_param / bw / in_.placement.interval_steps : 0.0;
}

}  // namespace moesim::strategies::lowering
