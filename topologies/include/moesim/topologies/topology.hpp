#pragma once
// Cluster topologies as Boost.Graph graphs: devices, NICs and switches joined by directed links
// with an achievable bandwidth and a latency; routes between any two devices.
//
//   ClusterSpec c = load_cluster(json["cluster"], "/cluster", diag);  // preset + overrides
//   Topology topo = build_topology(c);
//   Route r = topo.route(0, 8);          // NPU 0 -> NPU 8 (next server): NIC, leaf, NIC
//   r.bottleneck_bandwidth; r.latency;   // bytes/s and seconds along the path
//   for (int k = 0; k < topo.num_paths(); ++k) topo.route(0, 8, k);  // equal-cost paths (UB planes)
//   topo.link_bandwidths()[hop.link.id];  // every directed link has a dense id 0..num_links()-1
//
// Builders: scale-up as a full mesh (Atlas 800T A2 HCCS: a direct link between every pair of
// NPUs of a server) or a switch (NVSwitch); scale-out as NICs into leaf switches (rail-optimised:
// NIC i of every server on the rail-i leaf; or plain: all NICs of a server on one leaf) and a
// spine layer whose uplinks may be oversubscribed. A two-tier scale-up Clos (CloudMatrix 384's
// Unified Bus: every die on the L1 switch of each plane in its server, every L1 switch of a
// plane on all L2 switches of that plane in the supernode) is built for ScaleUpKind::Clos; there
// the "node" (devices_per_node) is the whole scale-up domain (the supernode) and
// clos.server_devices the physical server.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include <boost/graph/adjacency_list.hpp>
#include <nlohmann/json.hpp>

#include "moesim/models/device.hpp"
#include "moesim/sim/config.hpp"

namespace moesim::topologies {

/// Clos behaves as Switch for the analytical model (per-device bandwidth, no direct links).
enum class ScaleUpKind : std::uint8_t { FullMesh, Switch, Clos };

/// Two-tier scale-up Clos (ScaleUpKind::Clos). Planes = l1_per_server: each device has one link
/// to its server's L1 switch of every plane (scale_up_link_bandwidth / planes each); each L1
/// switch has one link to every L2 switch of its plane in the scale-up domain, non-blocking
/// (L1 uplink capacity = its downlink capacity, split evenly over the l2_per_plane links).
struct ClosSpec {
  int server_devices = 0;  ///< devices per physical server (shares the L1 switches)
  int l1_per_server = 0;   ///< L1 switches per server = planes
  int l2_per_plane = 0;    ///< L2 switches per plane per scale-up domain
};
enum class FabricKind : std::uint8_t { RailOptimized, FatTree };

/// Collective algorithms. HierarchicalAllToAll: aggregate each server's copies across servers
/// (deduplicated), then exchange inside the server (Pangu). AllGatherAllToAll: MindSpeed's
/// --moe-hierarchical-alltoallv — every token goes once to every other server of the group
/// (all-gather between rail peers), then an all-to-all(v) inside the server picks each
/// expert's copies; its cross-server volume does not depend on the routing.
enum class Algorithm : std::uint8_t {
  Auto,
  Ring,
  Mesh,
  HalvingDoubling,
  Hierarchical,
  Pairwise,
  HierarchicalAllToAll,
  AllGatherAllToAll
};

struct ClusterSpec {
  std::string name;
  std::string description;
  models::DeviceSpec device;
  int devices = 0;
  /// Ranks of the job placed in each scale-up domain (server, rack): the physical domain's size
  /// unless `placement.per_node` leaves some of its devices out (GB200 NVL72 jobs use 64 of a
  /// rack's 72 GPUs, so that power-of-two groups never straddle two racks).
  int devices_per_node = 8;
  int node_capacity = 0;  ///< physical devices per scale-up domain (>= devices_per_node)
  ScaleUpKind scale_up = ScaleUpKind::FullMesh;
  BytesPerSecond scale_up_link_bandwidth{0};  ///< nominal, per direction (per link; per device for a switch or Clos)
  Seconds scale_up_latency{0};
  double scale_up_efficiency = 1.0;
  /// Low-latency all-to-all kernels (DeepEP low-latency mode, used for decode): every peer is
  /// written at once, so a fixed cost plus a small per-peer step, and the bytes at the achieved
  /// scale-up rate. 0: not known for this cluster (decode then uses the normal all-to-all).
  Seconds a2a_low_latency_base{0};
  Seconds a2a_low_latency_per_peer{0};
  ClosSpec clos;  ///< only for ScaleUpKind::Clos
  BytesPerSecond nic_bandwidth{0};  ///< nominal, per direction
  int nics_per_node = 8;
  Seconds nic_latency{0};
  double nic_efficiency = 1.0;
  FabricKind fabric = FabricKind::RailOptimized;
  int nodes_per_leaf = 32;
  double oversubscription = 1.0;
  /// The reduce-scatter / all-gather / all-reduce algorithm inside a server (level 0: ring,
  /// mesh, halving-doubling) and between servers (level 1: ring, halving-doubling), as HCCL's
  /// HCCL_ALGO="level0:...;level1:..." forces them; Auto: the fastest (HCCL's and NCCL's default).
  Algorithm level0_algorithm = Algorithm::Auto;
  Algorithm level1_algorithm = Algorithm::Auto;

  [[nodiscard]] int num_nodes() const { return (devices + devices_per_node - 1) / devices_per_node; }
  /// Achievable bandwidths (nominal x efficiency).
  [[nodiscard]] BytesPerSecond scale_up_achieved() const { return scale_up_link_bandwidth * scale_up_efficiency; }
  [[nodiscard]] BytesPerSecond nic_achieved() const { return nic_bandwidth * nic_efficiency; }
};

/// `spec` is {"preset": name, "devices": N, ...overrides} or a full description.
ClusterSpec load_cluster(const nlohmann::json& spec, const std::string& pointer, Diagnostics& diag);
std::vector<std::string> cluster_preset_names();
/// The parsed JSON of a cluster preset (sources kept), or nullopt.
std::optional<nlohmann::json> cluster_preset_json(std::string_view name);

enum class VertexKind : std::uint8_t { Device, Nic, Switch };
enum class LinkKind : std::uint8_t { ScaleUp, NicUplink, Fabric, Internal };

struct VertexProps {
  VertexKind kind = VertexKind::Device;
  int node = -1;   ///< server index (devices and NICs)
  int index = -1;  ///< device id, NIC local index, or switch id (Clos: L1 = global server, L2 = index in plane)
  int plane = -1;  ///< Clos scale-up switches: their plane; -1 otherwise
  int tier = 0;    ///< Clos scale-up switches: 1 = L1 (in a server), 2 = L2; 0 otherwise
};

struct LinkProps {
  double bytes_per_s = 0;  ///< achievable bytes/s in this direction
  double latency_s = 0;    ///< seconds
  LinkKind kind = LinkKind::ScaleUp;
  int id = -1;  ///< dense index 0..num_links()-1 of this directed link (set when the Topology is made)
};

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, VertexProps, LinkProps>;
using Vertex = boost::graph_traits<Graph>::vertex_descriptor;

struct Hop {
  Vertex from = 0;
  Vertex to = 0;
  LinkProps link;
};

struct Route {
  std::vector<Hop> hops;
  double bottleneck_bytes_per_s = 0;  ///< bytes/s
  double latency_s = 0;               ///< seconds, sum over hops
  bool same_node = true;
  bool crosses_fabric = false;  ///< goes through a spine (between leaves)
};

class Topology {
 public:
  /// Numbers the directed links (LinkProps::id, in vertex then out-edge order) and indexes the
  /// Clos switches. `fill` builds the graph in place (Boost's adjacency_list has no move, and
  /// its swap copies twice).
  Topology(ClusterSpec spec, const std::function<void(Graph&)>& fill);
  [[nodiscard]] const ClusterSpec& spec() const { return spec_; }
  [[nodiscard]] const Graph& graph() const;
  [[nodiscard]] int num_devices() const { return spec_.devices; }
  [[nodiscard]] int node_of(int device) const { return device / spec_.devices_per_node; }
  [[nodiscard]] int local_index(int device) const { return device % spec_.devices_per_node; }
  /// Shortest path by hop count (ties: lowest vertex ids first, so routes are deterministic).
  /// Equals route(src, dst, 0) for single-path topologies. For a Clos scale-up it is the plane-0
  /// route (its hops are plane 0's links) with bottleneck_bandwidth counting every plane on the
  /// scale-up hops (per-plane bandwidth x num_paths(), i.e. the device's whole scale-up
  /// bandwidth), so analytical users see one path with the aggregate bandwidth.
  [[nodiscard]] Route route(int src_device, int dst_device) const;
  /// Number of equal-cost paths the fabric spreads traffic over: the planes of a Clos scale-up
  /// (CloudMatrix 384: 7); 1 otherwise.
  [[nodiscard]] int num_paths() const;
  /// Route `path` in [0, num_paths()): for a Clos, the route on plane `path` (its L1 switches;
  /// between servers of one scale-up domain, L2 switch (src % server_devices + dst %
  /// server_devices) % l2_per_plane of that plane, so a die's traffic spreads over the L2s). bottleneck_bandwidth is this path's own
  /// (one plane). Pairs in different scale-up domains go over the NICs (die, NIC, leaf, [spine,
  /// leaf,] NIC, die) and do not depend on `path` unless the route also uses scale-up hops.
  [[nodiscard]] Route route(int src_device, int dst_device, int path) const;
  /// Routes between equivalent endpoints are equal up to a shift of the servers: for a
  /// topology without a Clos scale-up, the vertex `v` of a route between servers `from_a` and
  /// `from_b` maps to its counterpart on a route between `to_a` and `to_b` (devices, NICs and
  /// server switches move with their server, leaf switches with their server's leaf group, the
  /// spine stays). Only valid when all four servers are full and the route classes agree
  /// (same local indices, same server / same leaf group / order); see FlowCollectives::paths.
  [[nodiscard]] Vertex shift(Vertex v, int from_a, int to_a, int from_b, int to_b) const;
  /// Whether routes may be shifted at all (no Clos scale-up).
  [[nodiscard]] bool shiftable() const { return spec_.scale_up != ScaleUpKind::Clos; }
  /// Servers holding spec().devices_per_node devices (the last one may hold fewer).
  [[nodiscard]] int full_nodes() const { return spec_.devices / spec_.devices_per_node; }
  /// Index of the leaf switch group of `node`.
  [[nodiscard]] int leaf_group(int node) const { return node / spec_.nodes_per_leaf; }
  /// Achievable bytes/s of every directed link, indexed by LinkProps::id.
  [[nodiscard]] const std::vector<double>& link_bandwidths() const;
  [[nodiscard]] std::size_t num_links() const { return link_bandwidths().size(); }

 private:
  [[nodiscard]] Route bfs_route(int src, int dst, int plane) const;
  [[nodiscard]] Route clos_route(int src, int dst, int plane) const;

  friend Topology build_topology(const ClusterSpec& spec);
  ClusterSpec spec_;
  /// The graph, its link numbering, the Clos switch index and the route cache: immutable once
  /// built (the cache is internally locked), so copies of a Topology share it, and so do
  /// topologies built from specs with the same fabric (see build_topology).
  struct Fabric;
  std::shared_ptr<Fabric> fab_;
};

/// The topology of `spec`. The fabric depends only on the counts, bandwidths, latencies and
/// shapes of the spec (not on its name or device), and the last few fabrics built are kept
/// process-wide: a search simulates dozens of plans on one cluster, and a 131K-device graph
/// takes longer to build than the simulation of its 16 distinct ranks. Thread-safe.
Topology build_topology(const ClusterSpec& spec);

}  // namespace moesim::topologies
