#include "stragglers.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "moesim/sim/random.hpp"

namespace moesim::strategies::lowering {

namespace {

/// `count` distinct devices of `n`, in order.
std::vector<long long> draw(Rng& rng, long long n, long long count) {
  const std::vector<int> order = rng.permutation(static_cast<int>(n));
  std::vector<long long> ids(order.begin(), order.begin() + std::min(count, n));
  std::sort(ids.begin(), ids.end());
  return ids;
}

int find(std::vector<int>& parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

}  // namespace

StragglerMap realise_stragglers(const Scenario& s, const Layout& lay, int pp, int step, int within) {
  StragglerMap m;
  const Stragglers& g = s.simulation.stragglers;
  if (!g.any()) return m;
  const long long devices = static_cast<long long>(pp) * lay.block;
  m.compute.assign(static_cast<std::size_t>(devices), 1.0);
  m.nic.assign(static_cast<std::size_t>(devices), 1.0);
  // Persistent: the same slow devices and NICs every step (from the seed alone).
  Rng fixed = Rng::stream(s.seed, "stragglers/fixed");
  std::vector<long long> slow = g.devices;
  if (g.device_fraction > 0) slow = draw(fixed, devices, std::llround(g.device_fraction * static_cast<double>(devices)));
  std::vector<long long> nics = g.nics;
  if (g.nic_fraction > 0) nics = draw(fixed, devices, std::llround(g.nic_fraction * static_cast<double>(devices)));
  for (long long d : slow) m.compute[d] = g.slowdown;
  // Per step: jitter and whether each slow NIC is slow now.
  Rng per_step = Rng::stream(s.seed, "stragglers/step" + std::to_string(step));
  for (long long d : nics)
    if (g.nic_flapping >= 1.0 || per_step.uniform() < g.nic_flapping) m.nic[d] = g.nic_bandwidth;
  if (g.host_jitter > 0)
    for (double& f : m.compute) f *= 1.0 + g.host_jitter * std::fabs(per_step.normal());
  m.slow_devices = static_cast<int>(slow.size());  // jitter slows every device a little: not counted
  for (long long d = 0; d < devices; ++d) m.slow_nics += m.nic[d] < 1.0;

  // Columns: positions joined by tensor-, context- and expert-parallel groups.
  std::vector<int> parent(static_cast<std::size_t>(lay.block));
  std::iota(parent.begin(), parent.end(), 0);
  for (int l = 0; l < lay.block; ++l)
    for (GroupKind k : {GroupKind::Tp, GroupKind::Cp, GroupKind::Ep, GroupKind::Etp})
      for (int o : lay.members(k, l)) parent[find(parent, o)] = find(parent, l);
  std::vector<int> column(static_cast<std::size_t>(lay.block));
  std::vector<std::vector<int>> members(static_cast<std::size_t>(lay.block));  // by root
  for (int l = 0; l < lay.block; ++l) {
    column[l] = find(parent, l);
    members[column[l]].push_back(l);
  }
  m.column_size = static_cast<int>(members[column[0]].size());

  // Each column's slowdown: the sum over stages of what its slowest member adds (kernel
  // factor - 1, plus 1 / bandwidth share - 1 for its weakest NIC). The worst column gates.
  auto stage_factors = [&](int col, int st, int& slow_l, int& nic_l) {
    double f = 1.0, n = 1.0;
    slow_l = nic_l = -1;
    for (int l : members[col]) {
      const long long d = static_cast<long long>(st) * lay.block + l;
      if (m.compute[d] > f) f = m.compute[d], slow_l = l;
      if (m.nic[d] < n) n = m.nic[d], nic_l = l;
    }
    return (f - 1.0) + (1.0 / n - 1.0);
  };
  int best = -1;
  double best_score = 0;
  for (int l = 0; l < lay.block; ++l) {
    if (column[l] != l) continue;  // one visit per column (its root)
    if (within >= 0 && column[within] != l) continue;
    double score = 0;
    for (int st = 0; st < pp; ++st) {
      int a = 0, b = 0;
      score += stage_factors(l, st, a, b);
    }
    if (score > best_score) best_score = score, best = l;
  }
  if (best < 0) return m;  // nothing slow where it matters: the symmetric simulation holds

  m.active = true;
  std::vector<int> chosen;
  std::vector<std::vector<int>> gating(pp);  // per stage: positions that gate there
  for (int st = 0; st < pp; ++st) {
    int slow_l = -1, nic_l = -1;
    (void)stage_factors(best, st, slow_l, nic_l);
    for (int l : {slow_l, nic_l})
      if (l >= 0 && std::find(gating[st].begin(), gating[st].end(), l) == gating[st].end()) {
        gating[st].push_back(l);
        chosen.push_back(l);
        const long long d = static_cast<long long>(st) * lay.block + l;
        m.gates.push_back({st, d, m.compute[d], m.nic[d]});
      }
  }
  // One clean position standing for the rest: in the first gating device's tensor-parallel
  // group when it has room (its collectives are then shared), the least slowed over the stages.
  const int first = chosen.front();
  std::vector<int> candidates = lay.members(GroupKind::Tp, first);
  auto free_of = [&](int l) { return std::find(chosen.begin(), chosen.end(), l) == chosen.end(); };
  if (std::none_of(candidates.begin(), candidates.end(), free_of)) {
    candidates = members[best];
  }
  int clean = -1;
  double clean_score = 0;
  for (int l : candidates) {
    if (!free_of(l)) continue;
    double sc = 0;
    for (int st = 0; st < pp; ++st) {
      const long long d = static_cast<long long>(st) * lay.block + l;
      sc += (m.compute[d] - 1.0) + (1.0 / m.nic[d] - 1.0);
    }
    if (clean < 0 || sc < clean_score) clean = l, clean_score = sc;
  }
  if (clean >= 0) chosen.push_back(clean);
  std::sort(chosen.begin(), chosen.end());
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  m.locals = chosen;
  // Weights: a gating rank stands for itself; the others share the rest of their stage.
  m.weight.assign(pp, std::vector<double>(chosen.size(), 0.0));
  for (int st = 0; st < pp; ++st) {
    const double gates_here = static_cast<double>(gating[st].size());
    const double others = static_cast<double>(chosen.size()) - gates_here;
    for (std::size_t q = 0; q < chosen.size(); ++q) {
      const bool gates = std::find(gating[st].begin(), gating[st].end(), chosen[q]) != gating[st].end();
      m.weight[st][q] = gates ? 1.0 : (static_cast<double>(lay.block) - gates_here) / std::max(1.0, others);
    }
  }
  return m;
}

}  // namespace moesim::strategies::lowering
