#pragma once
// Collective algorithms timed from the topology: ring, full-mesh, recursive halving-doubling,
// hierarchical (intra-server then inter-server) all-reduce / reduce-scatter / all-gather,
// pairwise all-to-all and hierarchical all-to-all (aggregate across servers, then exchange
// inside the server), with the alpha-beta formulas of HCCL's documentation (hardware.md).
//
//   GroupShape g = analyze_group(topo, devices_of_the_group);
//   CollectiveCost c = collective_cost(Collective::AllReduce, bytes, g);   // best algorithm
//   CollectiveCost r = collective_cost(Collective::AllReduce, bytes, g, Algorithm::Ring);
//
// Sizes: all-reduce `bytes` = the buffer; reduce-scatter = each rank's input (the full buffer);
// all-gather = each rank's output (the full buffer); all-to-all = what each rank sends in total
// (including the share it keeps). Reduction arithmetic is assumed to hide behind the transfers.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moesim/topologies/topology.hpp"

namespace moesim::topologies {

enum class Collective : std::uint8_t { AllReduce, ReduceScatter, AllGather, AllToAll, SendRecv };
const char* collective_name(Collective c);
const char* algorithm_name(Algorithm a);

/// How a group of ranks sits on the cluster, as seen by the collective models.
struct GroupShape {
  /// Per-level algorithms the cluster forces (ClusterSpec::level0_algorithm, level1_algorithm;
  /// HCCL_ALGO's level0 / level1): Auto lets the model pick the fastest, as HCCL does.
  Algorithm level0 = Algorithm::Auto;
  Algorithm level1 = Algorithm::Auto;
  int size = 1;
  int nodes = 1;     ///< servers spanned
  int per_node = 1;  ///< members per server (the groups are regular)
  bool mesh = false;  ///< scale-up is a full mesh: one link per pair of members
  double intra_bytes_per_s = 0;  ///< bytes/s: per link (mesh) or per member (switch)
  double intra_latency_s = 0;    ///< seconds per step
  double inter_bytes_per_s = 0;  ///< bytes/s per member across servers
  double inter_latency_s = 0;    ///< seconds per step
  [[nodiscard]] bool single() const { return size <= 1; }
  [[nodiscard]] bool spans_nodes() const { return nodes > 1; }
  [[nodiscard]] bool shares_node() const { return per_node > 1; }
};

/// Derives the shape from the devices of one group (routes between members of the topology).
GroupShape analyze_group(const Topology& topo, std::span<const int> devices);

struct CollectiveCost {
  Seconds time{0};
  Algorithm algorithm = Algorithm::Auto;
  double inter_bytes = 0;  ///< bytes each member sends across servers
  double intra_bytes = 0;  ///< bytes each member sends inside its server
  /// Hierarchical reduce-scatter / all-gather / all-reduce: the algorithm of each level.
  Algorithm level0 = Algorithm::Auto;
  Algorithm level1 = Algorithm::Auto;
  /// Two-phase all-to-all (hierarchical, all-gather): when its cross-server phase ends, from
  /// the start (latency included); the in-server phase takes the rest of `time`. 0 otherwise.
  Seconds cross_phase{0};
};

/// "ring", or "hierarchical (level0 mesh, level1 halving-doubling)" with the levels' algorithms.
std::string describe_algorithm(const CollectiveCost& c);

/// Cost of a collective. Algorithm::Auto picks the fastest applicable algorithm, as HCCL's and
/// NCCL's selectors do. `dedup` (all-to-all only, 0..1] is the fraction of cross-server bytes
/// left after aggregating copies bound for the same server (hierarchical all-to-all); for
/// AllGatherAllToAll it is the fraction of a member's bytes that are distinct tokens (1/top_k).
CollectiveCost collective_cost(Collective kind, double bytes, const GroupShape& g, Algorithm algo = Algorithm::Auto,
                               double dedup = 1.0);

/// All-to-all with per-pair volumes (`bytes[i][j]`: member i to member j) on a group whose
/// member i sits in server `node[i]`. Every port is a bottleneck of its own: a member's
/// sends and receives inside the server share its scale-up links, across servers its NIC — so
/// a member that many others send to (a hot expert's rank) takes as long as its incast.
/// Hierarchical: cross-server bytes shrink by `dedup` (copies of a token for one server are
/// sent once), then the server redistributes. With equal volumes this equals collective_cost.
CollectiveCost alltoallv_cost(const std::vector<std::vector<double>>& bytes, const std::vector<int>& node,
                              const GroupShape& g, Algorithm algo, double dedup = 1.0);

/// Point-to-point transfer of `bytes` along a route.
Seconds p2p_time(double bytes, const Route& r);

}  // namespace moesim::topologies
