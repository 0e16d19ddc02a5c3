#include "partition.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "moesim/strategies/plan/schedule.hpp"

namespace moesim::strategies::lowering {

namespace {

std::vector<int> even_partition(const Plan& p, int L, int V) {
  std::vector<int> counts(V, 0);
  const int slots = L + p.noop_layers;
  int rest = slots, stages = V;
  if (p.first_stage_layers >= 0) {
    rest -= p.first_stage_layers;
    --stages;
  }
  if (p.last_stage_layers >= 0) {
    rest -= p.last_stage_layers;
    --stages;
  }
  const int each = stages > 0 ? rest / stages : 0;
  for (int v = 0; v < V; ++v) counts[v] = each;
  if (p.first_stage_layers >= 0) counts[0] = p.first_stage_layers;
  if (p.last_stage_layers >= 0) counts[V - 1] = p.last_stage_layers;
  // Noop padding layers occupy the last slots: remove them from the last stages' counts.
  int noop = p.noop_layers;
  for (int v = V - 1; v >= 0 && noop > 0; --v) {
    const int take = std::min(noop, counts[v]);
    counts[v] -= take;
    noop -= take;
  }
  return counts;
}

/// auto: balance the *devices* (a device runs all its chunks for every micro-batch; under
/// DualPipe it holds pipeline position s and its mirror p - 1 - s), not the virtual stages.
/// Start from a water-filling by average layer cost that leaves room for the embedding on the
/// first position and the head (and MTP) on the last, then move single layers between virtual
/// stages while the most loaded device gets lighter (ties: smaller sum of squared
/// virtual-stage loads, which keeps a device's chunks even, as the interleaved schedule needs).
/// A move's score is O(V) from prefix sums of the layer costs.
std::vector<int> auto_partition(const Plan& p, const std::vector<double>& cost, double first_extra, double last_extra,
                                bool refine, int V, int chunks) {
  const int L = static_cast<int>(cost.size());
  std::vector<int> counts(V, 0);
  const int pp = p.pp;
  const bool mirrored = bidirectional(p.schedule);  // V == pp positions, each on two devices
  std::vector<double> prefix(static_cast<std::size_t>(L) + 1, 0.0);
  for (int k = 0; k < L; ++k) prefix[k + 1] = prefix[k] + cost[k];
  std::vector<double> load(pp, 0.0);
  auto score = [&](const std::vector<int>& n) {
    std::fill(load.begin(), load.end(), 0.0);
    double sq = 0;
    int layer = 0;
    for (int v = 0; v < V; ++v) {
      const double l = (v == 0 ? first_extra : 0.0) + (v == V - 1 ? last_extra : 0.0) + prefix[layer + n[v]] - prefix[layer];
      layer += n[v];
      const int st = stage_of_virtual(p.schedule, pp, v);
      load[st] += l;
      if (mirrored && pp - 1 - st != st) load[pp - 1 - st] += l;
      sq += l * l;
    }
    return std::pair{*std::max_element(load.begin(), load.end()), sq};
  };
  const double avg = L > 0 ? prefix[L] / L : 1.0;
  {
    // Water-filling on stages, then spread each stage's layers over its chunks.
    std::vector<double> extra(pp, 0.0);
    extra[0] += first_extra;
    extra[stage_of_virtual(p.schedule, pp, V - 1)] += last_extra;
    std::vector<int> per_stage(pp, 0);
    for (int k = 0; k < L; ++k) {
      int best = 0;
      for (int st = 1; st < pp; ++st)
        if (extra[st] + per_stage[st] * avg < extra[best] + per_stage[best] * avg) best = st;
      ++per_stage[best];
    }
    for (int st = 0; st < pp; ++st)
      for (int c = 0; c < chunks; ++c)
        counts[virtual_stage(p.schedule, pp, st, c)] = per_stage[st] / chunks + (c < per_stage[st] % chunks ? 1 : 0);
  }
  // A virtual stage may end up with no decoder layer (it then only forwards activations, like
  // Megatron's "L" loss-only stage in a custom layout); the search prefers balanced counts.
  if (!refine) return counts;
  auto best = score(counts);
  for (int iter = 0; iter < 4 * L; ++iter) {
    auto cand_best = best;
    int from = -1, to = -1;
    for (int a = 0; a < V; ++a) {
      if (counts[a] <= 0) continue;
      for (int b = 0; b < V; ++b) {
        if (a == b) continue;
        --counts[a];
        ++counts[b];
        const auto sc = score(counts);
        if (sc.first < cand_best.first * (1 - 1e-9) ||
            (sc.first <= cand_best.first * (1 + 1e-9) && sc.second < cand_best.second * (1 - 1e-9))) {
          cand_best = sc;
          from = a;
          to = b;
        }
        ++counts[a];
        --counts[b];
      }
    }
    if (from < 0) break;
    --counts[from];
    ++counts[to];
    best = cand_best;
  }
  return counts;
}

std::vector<int> partition_positions(const Plan& p, const std::vector<double>& cost, double first_extra,
                                     double last_extra, bool refine, int V, int chunks) {
  if (p.partition == "explicit") return p.layers_per_stage;
  if (p.partition == "even") return even_partition(p, static_cast<int>(cost.size()), V);
  return auto_partition(p, cost, first_extra, last_extra, refine, V, chunks);
}

}  // namespace

std::vector<int> partition_layers(const Plan& p, const std::vector<double>& cost, double first_extra,
                                  double last_extra, bool refine) {
  // DualPipe: partition the p stages as for 1F1B; each is held twice (once per direction).
  if (bidirectional(p.schedule)) {
    std::vector<int> counts = partition_positions(p, cost, first_extra, last_extra, refine, p.pp, 1);
    std::vector<int> twice = counts;
    twice.insert(twice.end(), counts.begin(), counts.end());
    return twice;
  }
  return partition_positions(p, cost, first_extra, last_extra, refine, p.virtual_stages(), p.vpp);
}

std::vector<std::vector<int>> virtual_stage_items(const Plan& p, const std::vector<int>& counts,
                                                  std::size_t num_items) {
  const int V = static_cast<int>(counts.size());
  const int P = bidirectional(p.schedule) ? V / 2 : V;
  std::vector<std::vector<int>> out(static_cast<std::size_t>(V));
  int layer_item = 1;
  for (int v = 0; v < V; ++v) {
    if (v % P == 0) layer_item = 1;
    if (v % P == 0) out[v].push_back(0);
    for (int k = 0; k < counts[v]; ++k) out[v].push_back(layer_item++);
    if (v % P == P - 1)
      for (std::size_t i = static_cast<std::size_t>(layer_item); i < num_items; ++i) out[v].push_back(static_cast<int>(i));
  }
  return out;
}

}  // namespace moesim::strategies::lowering
