#include "moesim/strategies/schedule.hpp"

#include <algorithm>

namespace moesim::strategies {
namespace {

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
std::vector<StageOrder> zero_bubble_h1(int p, int m, const std::vector<PassCosts>& costs) {
  constexpr long long kUnset = -1;
  std::vector<StageOrder> out(static_cast<std::size_t>(p));
  std::vector<int> next_f(p, 0), w_done(p, 0), b_done(p, 0);
  std::vector<long long> free_at(p, 0);
  std::vector<std::vector<long long>> f_end(p, std::vector<long long>(m, kUnset)), b_end = f_end;
  std::vector<std::vector<int>> w_queue(p);
  std::vector<std::size_t> w_head(p, 0);
  auto cost = [&](int s, int k) {
    const PassCosts& c = costs.empty() ? PassCosts{} : costs[static_cast<std::size_t>(s)];
    return std::max<long long>(1, k == 0 ? c.f : k == 1 ? c.b : c.w);
  };
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

}  // namespace

std::vector<StageOrder> make_schedule(ScheduleKind kind, int pp, int vpp, int m, const std::vector<PassCosts>& costs) {
  std::vector<StageOrder> out(static_cast<std::size_t>(pp));
  if (kind == ScheduleKind::ZeroBubbleH1) return zero_bubble_h1(pp, m, costs);
  for (int s = 0; s < pp; ++s)
    out[s] = (kind == ScheduleKind::Interleaved && vpp > 1) ? interleaved(pp, vpp, s, m) : one_f_one_b(pp, s, m);
  return out;
}

}  // namespace moesim::strategies
