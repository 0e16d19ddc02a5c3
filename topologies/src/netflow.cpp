#include "moesim/topologies/netflow.hpp"

#include <algorithm>
#include <map>

#include "moesim/sim/flow.hpp"

namespace moesim::topologies {

FlowCollectives::PathSet FlowCollectives::search(int src, int dst) {
  PathSet set{static_cast<std::uint32_t>(recs_.size()), 0};
  for (int k = 0; k < topo_.num_paths(); ++k) {
    const Route r = topo_.route(src, dst, k);
    PathRec rec{static_cast<std::uint32_t>(links_.size()), static_cast<std::uint32_t>(r.hops.size()), r.latency_s};
    for (const auto& h : r.hops) {
      links_.push_back((static_cast<std::uint64_t>(h.from) << 32) | static_cast<std::uint64_t>(h.to));
      bw_.push_back(h.link.bytes_per_s);
    }
    recs_.push_back(rec);
    ++set.count;
  }
  return set;
}

template <class F>
void FlowCollectives::each_path(int src, int dst, F&& f) {
  const auto call = [&](PathSet set) {
    for (std::uint32_t k = set.first; k < set.first + set.count; ++k) {
      const PathRec& r = recs_[k];
      f(std::span<const std::uint64_t>(links_.data() + r.off, r.n), std::span<const double>(bw_.data() + r.off, r.n),
        r.latency, set.count);
    }
  };
  // Equivalent endpoints (same local indices, both servers full, same relation: one server,
  // one leaf group or two, and their order) have the same route shifted by their servers; the
  // first pair of a class is searched in the graph, the others are shifted copies.
  const int a = topo_.node_of(src), b = topo_.node_of(dst);
  const bool classify = topo_.shiftable() && src != dst && a < topo_.full_nodes() && b < topo_.full_nodes();
  if (!classify) {
    const std::uint64_t key = (static_cast<std::uint64_t>(src) << 32) | static_cast<std::uint32_t>(dst);
    auto it = exact_.find(key);
    if (it == exact_.end()) it = exact_.emplace(key, search(src, dst)).first;
    call(it->second);
    return;
  }
  const int rel = a == b ? 0 : (topo_.leaf_group(a) == topo_.leaf_group(b) ? 1 : 3) + (a < b ? 0 : 1);
  const std::uint64_t cls = (static_cast<std::uint64_t>(topo_.local_index(src)) << 40) |
                            (static_cast<std::uint64_t>(topo_.local_index(dst)) << 8) | static_cast<std::uint64_t>(rel);
  auto c = classes_.find(cls);
  if (c == classes_.end()) c = classes_.emplace(cls, std::tuple{a, b, search(src, dst)}).first;
  const auto [ca, cb, set] = c->second;
  if (ca == a && cb == b) {
    call(set);
    return;
  }
  for (std::uint32_t k = set.first; k < set.first + set.count; ++k) {
    const PathRec& r = recs_[k];
    shifted_.resize(r.n);
    for (std::uint32_t i = 0; i < r.n; ++i) {
      const std::uint64_t l = links_[r.off + i];
      const auto from = topo_.shift(static_cast<Vertex>(l >> 32), ca, a, cb, b);
      const auto to = topo_.shift(static_cast<Vertex>(l & 0xffffffffULL), ca, a, cb, b);
      shifted_[i] = (static_cast<std::uint64_t>(from) << 32) | static_cast<std::uint64_t>(to);
    }
    f(std::span<const std::uint64_t>(shifted_), std::span<const double>(bw_.data() + r.off, r.n), r.latency, set.count);
  }
}

namespace {

/// Flows of one phase on links numbered locally (only the links the phase uses). The other
/// groups running the same collective at the same time add their bytes to the links they
/// really use (`background`); a link's capacity is then shared in proportion to the bytes on
/// it, so the simulated group drains its part of a shared link in the time the link needs for
/// everyone's bytes, and a link no other group touches keeps its whole capacity.
class Phase {
 public:
  /// One path of a flow of `bytes` split evenly over `paths` equal-cost paths.
  void add(std::span<const std::uint64_t> links, std::span<const double> bandwidth, double latency, double bytes,
           std::uint32_t paths, Tick release, int dst_group) {
    if (bytes <= 0) return;
    const double share = bytes / static_cast<double>(paths);
    const auto first = static_cast<std::uint32_t>(flow_links_.size());
    for (std::size_t i = 0; i < links.size(); ++i) {
      auto [it, fresh] = index_.try_emplace(links[i], static_cast<std::uint32_t>(capacity_.size()));
      if (fresh) {
        capacity_.push_back(bandwidth[i]);
        own_.push_back(0);
        other_.push_back(0);
      }
      own_[it->second] += share;
      flow_links_.push_back(it->second);
    }
    flows_.push_back({share, release, first, static_cast<std::uint32_t>(links.size()), latency, dst_group});
  }
  /// Bytes of another group on one of its paths (no flow is simulated for them); only the
  /// links the simulated group uses matter, so add() all its flows first.
  void background(std::span<const std::uint64_t> links, double bytes, std::uint32_t paths) {
    if (bytes <= 0) return;
    const double share = bytes / static_cast<double>(paths);
    for (std::uint64_t l : links) {
      auto it = index_.find(l);  // the simulated group's flows are all added first
      if (it != index_.end()) other_[it->second] += share;
    }
  }
  /// Runs the flows; returns per destination group the last arrival (flow end + path latency).
  std::map<int, Tick> run(std::uint64_t& flows, std::uint64_t& recomputations, double& bytes,
                          std::uint64_t& shared_links) const {
    std::vector<double> cap = capacity_;
    for (std::size_t i = 0; i < cap.size(); ++i)
      if (other_[i] > 0) {
        cap[i] *= own_[i] / (own_[i] + other_[i]);
        ++shared_links;
      }
    sim::FlowNetwork net(cap);
    for (const auto& f : flows_)
      net.add(f.bytes, std::span<const std::uint32_t>(flow_links_.data() + f.first, f.n), f.release);
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
    std::uint32_t first, n;  ///< its links: flow_links_[first, first + n)
    double latency;
    int dst_group;
  };
  std::unordered_map<std::uint64_t, std::uint32_t> index_;
  std::vector<double> capacity_, own_;
  std::vector<double> other_;  ///< other groups' bytes on each local link
  std::vector<std::uint32_t> flow_links_;
  std::vector<F> flows_;
};

/// One group's members by server: server of each member, its slot in the server, and the
/// members of every server in order.
struct Servers {
  std::vector<int> node, slot;
  std::map<int, std::vector<std::size_t>> members;
  Servers(const Topology& topo, std::span<const int> devices) : node(devices.size()), slot(devices.size()) {
    for (std::size_t i = 0; i < devices.size(); ++i) {
      node[i] = topo.node_of(devices[i]);
      auto& m = members[node[i]];
      slot[i] = static_cast<int>(m.size());
      m.push_back(i);
    }
  }
};

}  // namespace

CollectiveCost FlowCollectives::alltoallv(const std::vector<std::vector<double>>& bytes, std::span<const int> devices,
                                          const GroupShape& g, Algorithm algo, double dedup,
                                          std::span<const int> others) {
  CollectiveCost c;
  const std::size_t p = devices.size();
  if (p <= 1) return c;
  // The groups that run the same collective at the same time: `others` holds them one after
  // another, each in the member order of `devices`, with the same volumes.
  std::vector<std::span<const int>> groups{devices};
  for (std::size_t o = 0; o + p <= others.size(); o += p) groups.push_back(others.subspan(o, p));
  const int k = g.per_node, m = g.nodes;
  std::vector<double> out_inter(p, 0), out_intra(p, 0);
  const bool gather = algo == Algorithm::AllGatherAllToAll;
  const bool hier = (algo == Algorithm::HierarchicalAllToAll || gather) && m > 1 && k > 1;
  Tick end = 0, cross_end = 0;
  if (!hier) {
    Phase ph;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const auto devs = groups[gi];
      for (std::size_t i = 0; i < p; ++i)
        for (std::size_t j = 0; j < p; ++j) {
          if (i == j || bytes[i][j] <= 0) continue;
          if (gi > 0) {
            each_path(devs[i], devs[j], [&](auto links, auto, double, std::uint32_t n) { ph.background(links, bytes[i][j], n); });
            continue;
          }
          each_path(devs[i], devs[j], [&](auto links, auto bw, double lat, std::uint32_t n) { ph.add(links, bw, lat, bytes[i][j], n, 0, 0); });
          (topo_.node_of(devs[i]) == topo_.node_of(devs[j]) ? out_intra : out_inter)[i] += bytes[i][j];
        }
    }
    for (const auto& [grp, t] : ph.run(flows_, recomputations_, bytes_, shared_links_)) end = std::max(end, t);
    end =
        add_ticks(end, to_ticks(Seconds{(k - 1) * g.intra_latency_s + (static_cast<int>(p) - k) * g.inter_latency_s}));
    c.algorithm = Algorithm::Pairwise;
  } else {
    // Phase 1: member i sends its server-aggregate for server n to its rail peer there.
    // (All-gather variant: every token once to each other server, dedup = 1/top_k of the
    // member's bytes, whatever the routing.)
    Phase one, two;
    std::vector<Servers> srv;
    for (const auto devs : groups) srv.emplace_back(topo_, devs);
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const auto devs = groups[gi];
      const Servers& s = srv[gi];
      for (std::size_t i = 0; i < p; ++i)
        for (const auto& [n, mem] : s.members) {
          if (n == s.node[i]) continue;
          double agg = 0;
          if (gather)
            for (std::size_t j = 0; j < p; ++j) agg += bytes[i][j];
          else
            for (std::size_t j : mem) agg += bytes[i][j];
          const std::size_t peer = mem[static_cast<std::size_t>(s.slot[i]) % mem.size()];
          if (gi > 0) {
            each_path(devs[i], devs[peer], [&](auto links, auto, double, std::uint32_t n) { one.background(links, agg * dedup, n); });
            continue;
          }
          const int server = n;  // (clang 14 cannot capture a structured binding)
          each_path(devs[i], devs[peer], [&](auto links, auto bw, double lat, std::uint32_t np) {
            one.add(links, bw, lat, agg * dedup, np, 0, server);
          });
          out_inter[i] += agg * dedup;
        }
    }
    const auto arrived = one.run(flows_, recomputations_, bytes_, shared_links_);
    const Tick alpha1 = to_ticks(Seconds{(m - 1) * g.inter_latency_s});
    // Phase 2: inside each server, member r forwards to j what it holds for j: its own data and
    // what its rail peers in other servers sent it.
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const auto devs = groups[gi];
      const Servers& s = srv[gi];
      for (const auto& [n, mem] : s.members) {
        auto a = arrived.find(n);
        const Tick release = add_ticks(a == arrived.end() ? 0 : a->second, alpha1);
        for (std::size_t r : mem)
          for (std::size_t j : mem) {
            if (r == j) continue;
            double b = bytes[r][j];
            for (std::size_t i = 0; i < p; ++i)
              if (s.node[i] != n && s.slot[i] == s.slot[r]) b += bytes[i][j];
            if (gi > 0) {
              each_path(devs[r], devs[j], [&](auto links, auto, double, std::uint32_t np) { two.background(links, b, np); });
              continue;
            }
            const int server = n;
            each_path(devs[r], devs[j], [&](auto links, auto bw, double lat, std::uint32_t np) {
              two.add(links, bw, lat, b, np, release, server);
            });
            out_intra[r] += b;
          }
        if (gi == 0) end = std::max(end, release);
        if (gi == 0) cross_end = std::max(cross_end, release);
      }
    }
    for (const auto& [grp, t] : two.run(flows_, recomputations_, bytes_, shared_links_)) end = std::max(end, t);
    end = add_ticks(end, to_ticks(Seconds{(k - 1) * g.intra_latency_s}));
    c.algorithm = algo;
  }
  c.time = to_seconds(end);
  c.cross_phase = to_seconds(cross_end);
  c.inter_bytes = *std::max_element(out_inter.begin(), out_inter.end());
  c.intra_bytes = *std::max_element(out_intra.begin(), out_intra.end());
  return c;
}

CollectiveCost FlowCollectives::alltoall(double bytes, std::span<const int> devices, const GroupShape& g,
                                         Algorithm algo, double dedup, std::span<const int> others) {
  const std::size_t p = devices.size();
  const std::vector<std::vector<double>> m(p, std::vector<double>(p, bytes / static_cast<double>(p)));
  return alltoallv(m, devices, g, algo, dedup, others);
}

}  // namespace moesim::topologies
