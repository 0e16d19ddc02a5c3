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

}  // namespace

std::vector<StageOrder> make_schedule(ScheduleKind kind, int pp, int vpp, int m) {
  std::vector<StageOrder> out(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s)
    out[s] = (kind == ScheduleKind::Interleaved && vpp > 1) ? interleaved(pp, vpp, s, m) : one_f_one_b(pp, s, m);
  return out;
}

}  // namespace moesim::strategies
