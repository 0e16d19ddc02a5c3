#include "moesim/topologies/collectives.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace moesim::topologies {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all-reduce";
    case Collective::ReduceScatter: return "reduce-scatter";
    case Collective::AllGather: return "all-gather";
    case Collective::AllToAll: return "all-to-all";
    case Collective::SendRecv: return "send-recv";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::Auto: return "auto";
    case Algorithm::Ring: return "ring";
    case Algorithm::Mesh: return "mesh";
    case Algorithm::HalvingDoubling: return "halving-doubling";
    case Algorithm::Hierarchical: return "hierarchical";
    case Algorithm::Pairwise: return "pairwise";
    case Algorithm::HierarchicalAllToAll: return "hierarchical-a2a";
    case Algorithm::AllGatherAllToAll: return "allgather-a2a";
  }
  return "?";
}

std::string describe_algorithm(const CollectiveCost& c) {
  std::string s = algorithm_name(c.algorithm);
  if (c.algorithm == Algorithm::Hierarchical && c.level0 != Algorithm::Auto)
    s += std::string(" (level0 ") + algorithm_name(c.level0) + ", level1 " + algorithm_name(c.level1) + ")";
  return s;
}

GroupShape analyze_group(const Topology& topo, std::span<const int> devices) {
  GroupShape g;
  g.size = static_cast<int>(devices.size());
  if (devices.size() <= 1) return g;
  const auto& spec = topo.spec();
  std::map<int, int> per_node;
  for (int d : devices) ++per_node[topo.node_of(d)];
  g.nodes = static_cast<int>(per_node.size());
  g.per_node = 0;
  for (auto& [n, k] : per_node) g.per_node = std::max(g.per_node, k);
  g.mesh = spec.scale_up == ScaleUpKind::FullMesh;
  g.level0 = spec.level0_algorithm;
  g.level1 = spec.level1_algorithm;
  const int first = devices[0];
  // A member in the same server and one in another server, routed through the graph.
  for (int d : devices) {
    if (d == first) continue;
    if (topo.node_of(d) == topo.node_of(first) && g.intra_bytes_per_s == 0) {
      const auto r = topo.route(first, d);
      g.intra_bytes_per_s = r.bottleneck_bytes_per_s;
      g.intra_latency_s = r.latency_s;
    }
    if (topo.node_of(d) != topo.node_of(first) && g.inter_bytes_per_s == 0) {
      const auto r = topo.route(first, d);
      // The member's share of its server's NICs, and of the leaf uplinks when the route
      // crosses an oversubscribed spine.
      double bw =
          std::min(r.bottleneck_bytes_per_s, spec.nic_achieved().value() * spec.nics_per_node / spec.devices_per_node);
      if (r.crosses_fabric) bw = std::min(bw, spec.nic_achieved().value() / spec.oversubscription);
      g.inter_bytes_per_s = bw;
      g.inter_latency_s = r.latency_s;
    }
    if (g.intra_bytes_per_s > 0 && g.inter_bytes_per_s > 0) break;
  }
  if (g.intra_bytes_per_s == 0) {
    g.intra_bytes_per_s = spec.scale_up_achieved().value();
    g.intra_latency_s = spec.scale_up_latency.value();
  }
  return g;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One level: p ranks exchanging over links of bandwidth b (per link for a mesh, per rank
// otherwise) with per-step latency a.
double rs_ag_level(double n, int p, double b, double a, bool mesh, Algorithm algo) {
  if (p <= 1) return 0.0;
  const double frac = static_cast<double>(p - 1) / p;
  switch (algo) {
    case Algorithm::Mesh: return mesh ? a + n / (p * b) : kInf;
    case Algorithm::Ring: return (p - 1) * a + frac * n / b;
    case Algorithm::HalvingDoubling: {
      const double steps = std::ceil(std::log2(static_cast<double>(p)));
      const bool pow2 = (p & (p - 1)) == 0;
      // Non-powers of two add one step that moves the whole buffer (HCCL documentation).
      return steps * a + frac * n / b + (pow2 ? 0.0 : a + n / b);
    }
    default: return kInf;
  }
}

double best_rs_ag_level(double n, int p, double b, double a, bool mesh, Algorithm* chosen) {
  double best = kInf;
  for (Algorithm al : {Algorithm::Mesh, Algorithm::Ring, Algorithm::HalvingDoubling}) {
    const double t = rs_ag_level(n, p, b, a, mesh, al);
    if (t < best) {
      best = t;
      if (chosen) *chosen = al;
    }
  }
  return best;
}

/// One level's time: the forced algorithm when there is one (and it applies), the fastest
/// otherwise.
double level_time(double n, int p, double b, double a, bool mesh, Algorithm forced, Algorithm* chosen) {
  if (forced != Algorithm::Auto) {
    const double t = rs_ag_level(n, p, b, a, mesh, forced);
    if (std::isfinite(t)) {
      if (chosen) *chosen = forced;
      return t;
    }
  }
  return best_rs_ag_level(n, p, b, a, mesh, chosen);
}

}  // namespace

CollectiveCost collective_cost(Collective kind, double bytes, const GroupShape& g, Algorithm algo, double dedup) {
  CollectiveCost c;
  if (g.size <= 1 || bytes <= 0) return c;
  const int p = g.size;
  const int k = g.per_node;
  const int m = g.nodes;
  const double n = bytes;

  if (kind == Collective::AllToAll) {
    // Bytes leaving each rank: (k-1)/p of the buffer stays inside the server, (p-k)/p leaves it.
    const double intra = n * (k - 1) / p;
    const double inter = n * (p - k) / p;
    // Inside a full mesh every peer has its own link; behind a switch the rank's port is shared.
    const double intra_capacity = g.mesh ? g.intra_bytes_per_s * std::max(1, k - 1) : g.intra_bytes_per_s;
    auto pairwise = [&]() {
      const double lat = (k - 1) * g.intra_latency_s + (p - k) * g.inter_latency_s;
      const double t_intra = intra > 0 ? intra / intra_capacity : 0.0;
      const double t_inter = inter > 0 ? inter / g.inter_bytes_per_s : 0.0;
      return lat + std::max(t_intra, t_inter);
    };
    // All-gather variant: every token (n x dedup bytes) to each of the m - 1 other servers,
    // which is the hierarchical scheme with m x dedup of the cross-server bytes left.
    const double cross = algo == Algorithm::AllGatherAllToAll ? std::min(1.0, m * dedup) : dedup;
    double t_cross = 0;
    auto hierarchical = [&]() {
      if (m <= 1 || k <= 1) return kInf;
      // Phase 1: to the same-index rank of every other server, one copy per token and server.
      const double inter_dedup = inter * cross;
      const double t1 = (m - 1) * g.inter_latency_s + inter_dedup / g.inter_bytes_per_s;
      // Phase 2: inside the server, deliver what arrived plus the local share to its owners.
      const double intra2 = n * (k - 1) / k;
      const double t2 = (k - 1) * g.intra_latency_s + intra2 / intra_capacity;
      t_cross = t1;
      return t1 + t2;
    };
    double t = kInf;
    Algorithm chosen = Algorithm::Pairwise;
    if (algo == Algorithm::Auto || algo == Algorithm::Pairwise) {
      t = pairwise();
    }
    if (algo == Algorithm::HierarchicalAllToAll || algo == Algorithm::AllGatherAllToAll ||
        (algo == Algorithm::Auto && m > 1 && k > 1)) {
      const double th = hierarchical();
      if (algo != Algorithm::Auto || th < t) {
        t = th;
        chosen = algo == Algorithm::AllGatherAllToAll ? algo : Algorithm::HierarchicalAllToAll;
      }
    }
    if (!std::isfinite(t)) {  // hierarchical requested where it does not apply
      t = pairwise();
      chosen = Algorithm::Pairwise;
    }
    c.time = Seconds{t};
    c.algorithm = chosen;
    const bool two_phase = chosen == Algorithm::HierarchicalAllToAll || chosen == Algorithm::AllGatherAllToAll;
    c.inter_bytes = two_phase ? inter * cross : inter;
    if (two_phase) c.cross_phase = Seconds{t_cross};
    c.intra_bytes = two_phase ? n * (k - 1) / k : intra;
    return c;
  }

  const double mult = kind == Collective::AllReduce ? 2.0 : 1.0;
  // Single level: all members in one server, or one member per server.
  if (m == 1 || k == 1) {
    const bool intra_only = m == 1;
    const double b = intra_only ? g.intra_bytes_per_s : g.inter_bytes_per_s;
    const double a = intra_only ? g.intra_latency_s : g.inter_latency_s;
    const bool mesh = intra_only && g.mesh;
    Algorithm chosen = algo;
    double t = 0;
    if (algo == Algorithm::Auto || algo == Algorithm::Hierarchical)
      t = level_time(n, p, b, a, mesh, intra_only ? g.level0 : g.level1, &chosen);
    else t = rs_ag_level(n, p, b, a, mesh, algo);
    if (!std::isfinite(t)) t = rs_ag_level(n, p, b, a, mesh, chosen = Algorithm::Ring);
    c.time = Seconds{mult * t};
    c.algorithm = chosen;
    const double moved = mult * n * (p - 1) / p;
    (intra_only ? c.intra_bytes : c.inter_bytes) = moved;
    return c;
  }

  // Two levels: k members in each of m servers.
  Algorithm intra_alg = Algorithm::Ring, inter_alg = Algorithm::Ring;
  const double intra_t = level_time(n, k, g.intra_bytes_per_s, g.intra_latency_s, g.mesh, g.level0, &intra_alg);
  const double inter_rs_ag = level_time(n / k, m, g.inter_bytes_per_s, g.inter_latency_s, false, g.level1, &inter_alg);
  // Hierarchical: intra RS, inter RS/AR on 1/k of the buffer (each member on its own NIC), intra AG.
  double hier = 0;
  switch (kind) {
    case Collective::AllReduce: hier = 2 * intra_t + 2 * inter_rs_ag; break;
    case Collective::ReduceScatter:
    case Collective::AllGather: hier = intra_t + inter_rs_ag; break;
    default: break;
  }
  // Flat ring over all members: every step is paced by the slowest (cross-server) hop.
  const double flat =
      mult * ((p - 1) * std::max(g.intra_latency_s, g.inter_latency_s) +
              (static_cast<double>(p - 1) / p) * n / std::min(g.intra_bytes_per_s, g.inter_bytes_per_s));
  double t = hier;
  Algorithm chosen = Algorithm::Hierarchical;
  // A forced level (HCCL_ALGO) means the two-level scheme; otherwise the faster of the two.
  const bool levels_forced = g.level0 != Algorithm::Auto || g.level1 != Algorithm::Auto;
  if (algo == Algorithm::Ring || (algo == Algorithm::Auto && !levels_forced && flat < hier)) {
    t = flat;
    chosen = Algorithm::Ring;
  }
  c.time = Seconds{t};
  c.algorithm = chosen;
  if (chosen == Algorithm::Hierarchical) {
    c.level0 = intra_alg;
    c.level1 = inter_alg;
    c.intra_bytes = mult * n * (k - 1) / k;
    c.inter_bytes = mult * (n / k) * (m - 1) / m;
  } else {
    c.inter_bytes = mult * n * (p - 1) / p;
  }
  return c;
}

CollectiveCost alltoallv_cost(const std::vector<std::vector<double>>& bytes, const std::vector<int>& node,
                              const GroupShape& g, Algorithm algo, double dedup) {
  CollectiveCost c;
  const std::size_t p = bytes.size();
  if (p <= 1) return c;
  const int k = g.per_node, m = g.nodes;
  const double intra_capacity = g.mesh ? g.intra_bytes_per_s * std::max(1, k - 1) : g.intra_bytes_per_s;
  // Slot of each member inside its server (rail index): phase 1 of the hierarchical scheme
  // lands a server's share on the same-slot member, phase 2 forwards the rest.
  std::vector<int> slot(p, 0);
  {
    std::map<int, int> seen;
    for (std::size_t i = 0; i < p; ++i) slot[i] = seen[node[i]]++;
  }
  std::vector<double> tx_in(p, 0), tx_out(p, 0), rx_in(p, 0), rx_out(p, 0), rx_phase2(p, 0), sent(p, 0);
  for (std::size_t i = 0; i < p; ++i)
    for (std::size_t j = 0; j < p; ++j) {
      if (i == j) continue;
      const double b = bytes[i][j];
      sent[i] += b;
      if (!(node[i] != node[j] && slot[i] == slot[j])) rx_phase2[j] += b;
      if (node[i] == node[j]) {
        tx_in[i] += b;
        rx_in[j] += b;
      } else {
        tx_out[i] += b;
        rx_out[j] += b;
      }
    }
  auto max_of = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const double inter_peak = std::max(max_of(tx_out), max_of(rx_out));
  const double intra_peak = std::max(max_of(tx_in), max_of(rx_in));
  const bool gather = algo == Algorithm::AllGatherAllToAll;
  const bool hier = (algo == Algorithm::HierarchicalAllToAll || gather) && m > 1 && k > 1;
  double t = 0;
  if (!hier) {
    const double lat = (k - 1) * g.intra_latency_s + (static_cast<int>(p) - k) * g.inter_latency_s;
    t = lat + std::max(intra_peak > 0 ? intra_peak / intra_capacity : 0.0,
                       inter_peak > 0 ? inter_peak / g.inter_bytes_per_s : 0.0);
    c.algorithm = Algorithm::Pairwise;
    c.inter_bytes = max_of(tx_out);
    c.intra_bytes = max_of(tx_in);
  } else {
    // Phase 1 across servers (deduplicated), phase 2 inside: a member receives from its server
    // peers everything addressed to it that neither it nor its rail peers already hold.
    // All-gather variant: every member's tokens (dedup x its bytes) to each other server,
    // whatever the routing.
    const double phase1 = gather ? max_of(sent) * dedup * (m - 1) : inter_peak * dedup;
    const double t1 = (m - 1) * g.inter_latency_s + phase1 / g.inter_bytes_per_s;
    const double t2 = (k - 1) * g.intra_latency_s + max_of(rx_phase2) / intra_capacity;
    t = t1 + t2;
    c.cross_phase = Seconds{t1};
    c.algorithm = gather ? Algorithm::AllGatherAllToAll : Algorithm::HierarchicalAllToAll;
    c.inter_bytes = gather ? phase1 : max_of(tx_out) * dedup;
    c.intra_bytes = max_of(rx_phase2);
  }
  c.time = Seconds{t};
  return c;
}

Seconds p2p_time(double bytes, const Route& r) {
  if (bytes <= 0 || r.hops.empty()) return Seconds{0};
  return Seconds{r.latency_s + bytes / r.bottleneck_bytes_per_s};
}

}  // namespace moesim::topologies
