#include "moesim/strategies/schedule.hpp"

#include <algorithm>
#include <array>

namespace moesim::strategies {
namespace {

/// Duration of pass k (0 F, 1 B, 2 W) of stage s, chunk c; equal passes when costs is empty.
long long pass_cost(const StageCosts& costs, int s, int c, int k) {
  if (costs.empty()) return 1000;
  const PassCosts& pc = costs[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
  return std::max<long long>(1, k == 0 ? pc.f : k == 1 ? pc.b : pc.w);
}

StageOrder one_f_one_b(int p, int s, int m) {
  StageOrder o;
  o.reserve(2 * static_cast<std::size_t>(m));
  const int warmup = std::min(p - s - 1, m);
  for (int i = 0; i < warmup; ++i) o.push_back({Phase::Forward, i, 0});
  for (int i = 0; i < m - warmup; ++i) {
    o.push_back({Phase::Forward, warmup + i, 0});
    o.push_back({Phase::Backward, i, 0});
  }
  for (int i = m - warmup; i < m; ++i) o.push_back({Phase::Backward, i, 0});
  return o;
}

StageOrder interleaved(int p, int v, int s, int m) {
  const int total = m * v;
  int warmup = 0;
  if (m == p) {
    warmup = total;  // Megatron: all warm-up when micro-batches equal stages
  } else {
    warmup = std::min((p - s - 1) * 2 + (v - 1) * p, total);
  }
  auto fwd = [&](int k) {
    const int chunk = (k / p) % v;
    const int mb = (k / (p * v)) * p + k % p;
    return PipeOp{Phase::Forward, mb, chunk};
  };
  auto bwd = [&](int k) {
    const int chunk = v - 1 - (k / p) % v;
    const int mb = (k / (p * v)) * p + k % p;
    return PipeOp{Phase::Backward, mb, chunk};
  };
  StageOrder o;
  o.reserve(2 * static_cast<std::size_t>(total));
  for (int k = 0; k < warmup; ++k) o.push_back(fwd(k));
  const int remaining = total - warmup;
  for (int k = 0; k < remaining; ++k) {
    o.push_back(fwd(warmup + k));
    o.push_back(bwd(k));
  }
  for (int k = remaining; k < total; ++k) o.push_back(bwd(k));
  return o;
}

/// ZB-H1 as a list schedule over the stages' pass durations: every stage, whenever it is
/// free, runs a ready B (it lies on the gradient chain); else a pending W if more than p - s
/// are waiting (the inputs of deferred weight GEMMs stay in memory); else a forward if no
/// more than p - s micro-batches are between their F and their B (1F1B's in-flight count);
/// else a pending W. The order comes from a small event simulation of the pipeline without
/// communication; the engine then times the real passes in that order.
std::vector<StageOrder> zero_bubble_h1(int p, int m, const StageCosts& costs) {
  constexpr long long kUnset = -1;
  std::vector<StageOrder> out(static_cast<std::size_t>(p));
  std::vector<int> next_f(p, 0), w_done(p, 0), b_done(p, 0);
  std::vector<long long> free_at(p, 0);
  std::vector<std::vector<long long>> f_end(p, std::vector<long long>(m, kUnset)), b_end = f_end;
  std::vector<std::vector<int>> w_queue(p);
  std::vector<std::size_t> w_head(p, 0);
  auto cost = [&](int s, int k) { return pass_cost(costs, s, 0, k); };
  long long now = 0;
  int remaining = 3 * p * m;
  while (remaining > 0) {
    for (int s = 0; s < p; ++s) {
      if (free_at[s] > now) continue;
      const int nb = b_done[s];  // Bs run in micro-batch order
      const bool b_ready = nb < m && f_end[s][nb] != kUnset && f_end[s][nb] <= now &&
                           (s == p - 1 || (b_end[s + 1][nb] != kUnset && b_end[s + 1][nb] <= now));
      const int nf = next_f[s];
      const bool f_ready = nf < m && (s == 0 || (f_end[s - 1][nf] != kUnset && f_end[s - 1][nf] <= now)) &&
                           nf - b_done[s] < p - s;
      const bool w_ready = w_head[s] < w_queue[s].size();
      const bool w_due = w_ready && b_done[s] - w_done[s] > p - s;
      long long d = 0;
      if (b_ready) {
        out[s].push_back({Phase::Backward, nb, 0});
        d = cost(s, 1);
        b_end[s][nb] = now + d;
        ++b_done[s];
        w_queue[s].push_back(nb);
      } else if (w_due || (w_ready && !f_ready)) {
        out[s].push_back({Phase::WeightGrad, w_queue[s][w_head[s]++], 0});
        d = cost(s, 2);
        ++w_done[s];
      } else if (f_ready) {
        out[s].push_back({Phase::Forward, nf, 0});
        d = cost(s, 0);
        f_end[s][nf] = now + d;
        ++next_f[s];
      } else {
        continue;
      }
      free_at[s] = now + d;
      --remaining;
    }
    // Advance to the next time anything can change.
    long long next = -1;
    auto consider = [&](long long t) {
      if (t > now && (next < 0 || t < next)) next = t;
    };
    for (int s = 0; s < p; ++s) {
      consider(free_at[s]);
      for (int k = 0; k < m; ++k) {
        consider(f_end[s][k]);
        consider(b_end[s][k]);
      }
    }
    if (next < 0) break;
    now = next;
  }
  return out;
}

/// ZB-V as a list schedule over virtual stages placed as a V: a free stage runs a ready B
/// (lowest micro-batch, then the chunk nearer the loss), else a W if more than 2p wait, else a
/// ready F (the second chunk first, to reach the loss and start backwards), else a W. A
/// first-chunk F starts only while fewer than 2p chunk activations are between F and B (1F1B's
/// memory in half-size chunks); a second-chunk F always may, since it leads to the loss and its
/// B, so a stage that filled its budget with first chunks cannot deadlock.
std::vector<StageOrder> zero_bubble_v(int p, int m, const StageCosts& costs) {
  constexpr long long kUnset = -1;
  const int V = 2 * p;
  auto vs = [&](int s, int c) { return c == 0 ? s : V - 1 - s; };
  std::vector<StageOrder> out(static_cast<std::size_t>(p));
  std::vector<std::vector<long long>> f_end(V, std::vector<long long>(m, kUnset)), b_end = f_end;
  std::vector<std::array<int, 2>> next_f(p, {0, 0}), next_b(p, {0, 0});
  std::vector<int> open(p, 0), w_done(p, 0), b_count(p, 0);
  std::vector<std::vector<std::pair<int, int>>> w_queue(p);  // (chunk, micro-batch)
  std::vector<std::size_t> w_head(p, 0);
  std::vector<long long> free_at(p, 0);
  auto cost = [&](int s, int c, int k) { return pass_cost(costs, s, c, k); };
  auto done = [](long long t, long long now) { return t != kUnset && t <= now; };
  long long now = 0;
  int remaining = 3 * V * m;
  while (remaining > 0) {
    for (int s = 0; s < p; ++s) {
      if (free_at[s] > now) continue;
      // Ready backward: micro-batches in order within each chunk.
      int bc = -1;
      for (int c : {1, 0}) {
        const int mb = next_b[s][c], v = vs(s, c);
        if (mb >= m || !done(f_end[v][mb], now)) continue;
        if (v < V - 1 && !done(b_end[v + 1][mb], now)) continue;
        if (bc < 0 || mb < next_b[s][bc]) bc = c;
      }
      int fc = -1;
      for (int c : {1, 0}) {
        const int mb = next_f[s][c], v = vs(s, c);
        if (mb >= m || (c == 0 && open[s] >= V)) continue;
        if (v > 0 && !done(f_end[v - 1][mb], now)) continue;
        fc = c;
        break;
      }
      const bool w_ready = w_head[s] < w_queue[s].size();
      const bool w_due = w_ready && b_count[s] - w_done[s] > V;
      long long d = 0;
      if (bc >= 0) {
        const int mb = next_b[s][bc]++;
        out[s].push_back({Phase::Backward, mb, bc});
        d = cost(s, bc, 1);
        b_end[vs(s, bc)][mb] = now + d;
        w_queue[s].push_back({bc, mb});
        ++b_count[s];
        --open[s];
      } else if (w_due || (w_ready && fc < 0)) {
        const auto [c, mb] = w_queue[s][w_head[s]++];
        out[s].push_back({Phase::WeightGrad, mb, c});
        d = cost(s, c, 2);
        ++w_done[s];
      } else if (fc >= 0) {
        const int mb = next_f[s][fc]++;
        out[s].push_back({Phase::Forward, mb, fc});
        d = cost(s, fc, 0);
        f_end[vs(s, fc)][mb] = now + d;
        ++open[s];
      } else {
        continue;
      }
      free_at[s] = now + d;
      --remaining;
    }
    long long next = -1;
    auto consider = [&](long long t) {
      if (t > now && (next < 0 || t < next)) next = t;
    };
    for (int s = 0; s < p; ++s) consider(free_at[s]);
    for (int v = 0; v < V; ++v)
      for (int k = 0; k < m; ++k) {
        consider(f_end[v][k]);
        consider(b_end[v][k]);
      }
    if (next < 0) break;
    now = next;
  }
  return out;
}

}  // namespace

std::vector<StageOrder> make_schedule(ScheduleKind kind, int pp, int vpp, int m, const StageCosts& costs) {
  std::vector<StageOrder> out(static_cast<std::size_t>(pp));
  if (kind == ScheduleKind::ZeroBubbleH1) return zero_bubble_h1(pp, m, costs);
  if (kind == ScheduleKind::ZeroBubbleV) return zero_bubble_v(pp, m, costs);
  for (int s = 0; s < pp; ++s)
    out[s] = (kind == ScheduleKind::Interleaved && vpp > 1) ? interleaved(pp, vpp, s, m) : one_f_one_b(pp, s, m);
  return out;
}

}  // namespace moesim::strategies
