#pragma once
// Collectives as flows over the topology: the flow-level network model.
//
//   FlowCollectives net(topo);
//   CollectiveCost c = net.alltoallv(bytes, devices, shape, Algorithm::Pairwise);
//
// A collective on concrete devices becomes flows along the topology's routes (split evenly
// over the fabric's equal-cost paths, e.g. CloudMatrix 384's seven UB planes); the flows share
// every link max-min fairly (sim::FlowNetwork), so incast at a hot receiver, a NIC shared by
// a rail-aligned (PXN) hop and an oversubscribed spine all appear without a formula for each.
// The same collective runs at the same time in the other groups of the stage (the data-
// parallel replicas are in lockstep). Their bytes are put on the links their own routes use
// (`others`: their devices, member for member) and every link is shared in proportion to the
// bytes on it: groups that do not share a link do not slow each other down (one server per
// leaf on a non-blocking fabric costs nothing), groups that share a spine or a NIC do.
//
// Hierarchical all-to-all runs in two phases: rail peers exchange each server's aggregate
// across servers (deduplicated copies), then every server redistributes inside; a server's
// second phase starts when its first-phase traffic has arrived.
//
// The per-step software latency of the algorithms (alpha terms) is added as in the analytical
// model; bandwidth terms come from the flows.

#include <cstdint>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "moesim/topologies/collectives.hpp"
#include "moesim/topologies/topology.hpp"

namespace moesim::topologies {

class FlowCollectives {
 public:
  explicit FlowCollectives(const Topology& topo) : topo_(topo) {}

  /// bytes[i][j]: from devices[i] to devices[j].
  CollectiveCost alltoallv(const std::vector<std::vector<double>>& bytes, std::span<const int> devices,
                           const GroupShape& shape, Algorithm algo, double dedup = 1.0,
                           std::span<const int> others = {});

  /// Equal volumes: every member holds `bytes` and sends bytes/p to each member.
  CollectiveCost alltoall(double bytes, std::span<const int> devices, const GroupShape& shape, Algorithm algo,
                          double dedup = 1.0, std::span<const int> others = {});

  [[nodiscard]] std::uint64_t flows() const { return flows_; }
  [[nodiscard]] std::uint64_t recomputations() const { return recomputations_; }
  /// Bytes put on the network by all collectives so far (each flow counted once, not per hop).
  [[nodiscard]] double bytes_injected() const { return bytes_; }
  /// Links (per phase run) that carried other groups' bytes beside the simulated group's.
  [[nodiscard]] std::uint64_t shared_links() const { return shared_links_; }

 private:
  // Routes are kept flat (no allocation per pair): path k of a set is recs_[first + k], whose
  // links are links_[off, off + n) with bandwidths bw_[off, off + n).
  struct PathRec {
    std::uint32_t off = 0, n = 0;
    double latency = 0;
  };
  struct PathSet {
    std::uint32_t first = 0, count = 0;
  };
  /// Calls f(links, bandwidths, latency, paths in the set) for every path from src to dst.
  /// Equivalent endpoints share one stored set (their route class); the links of a shifted
  /// copy are produced on the fly, not stored.
  template <class F>
  void each_path(int src, int dst, F&& f);
  PathSet search(int src, int dst);  ///< routes from the topology, stored
  const Topology& topo_;
  std::vector<std::uint64_t> links_;  ///< topology links as (from vertex << 32 | to vertex)
  std::vector<double> bw_;            ///< per link, bytes/s
  std::vector<PathRec> recs_;
  std::vector<std::uint64_t> shifted_;  ///< scratch: one shifted path's links
  std::unordered_map<std::uint64_t, PathSet> exact_;  ///< pairs that are not in a route class
  /// Route class (local indices, relation of the servers) -> (servers, paths) of its first pair.
  std::unordered_map<std::uint64_t, std::tuple<int, int, PathSet>> classes_;
  std::uint64_t flows_ = 0, recomputations_ = 0, shared_links_ = 0;
  double bytes_ = 0;
};

}  // namespace moesim::topologies
