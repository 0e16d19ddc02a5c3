#include "moesim/topologies/netflow.hpp"

#include <algorithm>
#include <map>

#include "moesim/sim/flow.hpp"

namespace moesim::topologies {

const std::vector<FlowCollectives::Path>& FlowCollectives::paths(int src, int dst) {
  const std::uint64_t key = (static_cast<std::uint64_t>(src) << 32) | static_cast<std::uint32_t>(dst);
  auto it = paths_.find(key);
  if (it != paths_.end()) return it->second;
  std::vector<Path> out;
  for (int k = 0; k < topo_.num_paths(); ++k) {
    const Route r = topo_.route(src, dst, k);
    Path p;
    p.latency = r.latency_s;
    for (const auto& h : r.hops) {
      p.links.push_back((static_cast<std::uint64_t>(h.from) << 32) | static_cast<std::uint64_t>(h.to));
      p.bandwidth.push_back(h.link.bytes_per_s);
      p.fabric.push_back(h.link.kind == LinkKind::Fabric ? 1 : 0);
    }
    out.push_back(std::move(p));
  }
  return paths_.emplace(key, std::move(out)).first->second;
}

namespace {

/// Flows of one phase on links numbered locally (only the links the phase uses).
class Phase {
 public:
  explicit Phase(int concurrent) : concurrent_(std::max(1, concurrent)) {}
  template <class PathT>
  void add(const std::vector<PathT>& paths, double bytes, Tick release, int dst_group) {
    if (bytes <= 0) return;
    const double share = bytes / static_cast<double>(paths.size());
    for (const PathT& p : paths) {
      local_.clear();
      for (std::size_t i = 0; i < p.links.size(); ++i) {
        auto [it, fresh] = index_.try_emplace(p.links[i], static_cast<std::uint32_t>(capacity_.size()));
        if (fresh) capacity_.push_back(p.fabric[i] ? p.bandwidth[i] / concurrent_ : p.bandwidth[i]);
        local_.push_back(it->second);
      }
      flows_.push_back({share, release, local_, p.latency, dst_group});
    }
  }
  /// Runs the flows; returns per destination group the last arrival (flow end + path latency).
  std::map<int, Tick> run(std::uint64_t& flows, std::uint64_t& recomputations, double& bytes) const {
    sim::FlowNetwork net(capacity_);
    for (const auto& f : flows_) net.add(f.bytes, f.links, f.release);
    const sim::FlowRun r = net.run();
    flows += flows_.size();
    for (const auto& f : flows_) bytes += f.bytes;
    recomputations += r.recomputations;
    std::map<int, Tick> arrival;
    for (std::size_t i = 0; i < flows_.size(); ++i) {
      const Tick t = add_ticks(r.finish[i], to_ticks(Seconds{flows_[i].latency}));
      auto& a = arrival[flows_[i].dst_group];
      a = std::max(a, t);
    }
    return arrival;
  }

 private:
  struct F {
    double bytes;
    Tick release;
    std::vector<std::uint32_t> links;
    double latency;
    int dst_group;
  };
  int concurrent_;
  std::unordered_map<std::uint64_t, std::uint32_t> index_;
  std::vector<double> capacity_;
  std::vector<std::uint32_t> local_;
  std::vector<F> flows_;
};

}  // namespace

CollectiveCost FlowCollectives::alltoallv(const std::vector<std::vector<double>>& bytes, std::span<const int> devices,
                                          const GroupShape& g, Algorithm algo, double dedup, int concurrent) {
  CollectiveCost c;
  const std::size_t p = devices.size();
  if (p <= 1) return c;
  std::vector<int> node(p), slot(p);
  std::map<int, std::vector<std::size_t>> members;  // server -> members in order
  for (std::size_t i = 0; i < p; ++i) {
    node[i] = topo_.node_of(devices[i]);
    auto& m = members[node[i]];
    slot[i] = static_cast<int>(m.size());
    m.push_back(i);
  }
  const int k = g.per_node, m = g.nodes;
  std::vector<double> out_inter(p, 0), out_intra(p, 0);
  const bool gather = algo == Algorithm::AllGatherAllToAll;
  const bool hier = (algo == Algorithm::HierarchicalAllToAll || gather) && m > 1 && k > 1;
  Tick end = 0;
  if (!hier) {
    Phase ph(concurrent);
    for (std::size_t i = 0; i < p; ++i)
      for (std::size_t j = 0; j < p; ++j) {
        if (i == j || bytes[i][j] <= 0) continue;
        ph.add(paths(devices[i], devices[j]), bytes[i][j], 0, 0);
        (node[i] == node[j] ? out_intra : out_inter)[i] += bytes[i][j];
      }
    for (const auto& [grp, t] : ph.run(flows_, recomputations_, bytes_)) end = std::max(end, t);
    end =
        add_ticks(end, to_ticks(Seconds{(k - 1) * g.intra_latency_s + (static_cast<int>(p) - k) * g.inter_latency_s}));
    c.algorithm = Algorithm::Pairwise;
  } else {
    // Phase 1: member i sends its server-aggregate for server n to its rail peer there.
    // (All-gather variant: every token once to each other server, dedup = 1/top_k of the
    // member's bytes, whatever the routing.)
    Phase one(concurrent);
    for (std::size_t i = 0; i < p; ++i)
      for (const auto& [n, mem] : members) {
        if (n == node[i]) continue;
        double agg = 0;
        if (gather)
          for (std::size_t j = 0; j < p; ++j) agg += bytes[i][j];
        else
          for (std::size_t j : mem) agg += bytes[i][j];
        const std::size_t peer = mem[static_cast<std::size_t>(slot[i]) % mem.size()];
        one.add(paths(devices[i], devices[peer]), agg * dedup, 0, n);
        out_inter[i] += agg * dedup;
      }
    const auto arrived = one.run(flows_, recomputations_, bytes_);
    const Tick alpha1 = to_ticks(Seconds{(m - 1) * g.inter_latency_s});
    // Phase 2: inside each server, member r forwards to j what it holds for j: its own data and
    // what its rail peers in other servers sent it.
    Phase two(1);
    for (const auto& [n, mem] : members) {
      auto a = arrived.find(n);
      const Tick release = add_ticks(a == arrived.end() ? 0 : a->second, alpha1);
      for (std::size_t r : mem)
        for (std::size_t j : mem) {
          if (r == j) continue;
          double b = bytes[r][j];
          for (std::size_t i = 0; i < p; ++i)
            if (node[i] != n && slot[i] == slot[r]) b += bytes[i][j];
          two.add(paths(devices[r], devices[j]), b, release, n);
          out_intra[r] += b;
        }
      end = std::max(end, release);
    }
    for (const auto& [grp, t] : two.run(flows_, recomputations_, bytes_)) end = std::max(end, t);
    end = add_ticks(end, to_ticks(Seconds{(k - 1) * g.intra_latency_s}));
    c.algorithm = algo;
  }
  c.time = to_seconds(end);
  c.inter_bytes = *std::max_element(out_inter.begin(), out_inter.end());
  c.intra_bytes = *std::max_element(out_intra.begin(), out_intra.end());
  return c;
}

CollectiveCost FlowCollectives::alltoall(double bytes, std::span<const int> devices, const GroupShape& g,
                                         Algorithm algo, double dedup, int concurrent) {
  const std::size_t p = devices.size();
  const std::vector<std::vector<double>> m(p, std::vector<double>(p, bytes / static_cast<double>(p)));
  return alltoallv(m, devices, g, algo, dedup, concurrent);
}

}  // namespace moesim::topologies
