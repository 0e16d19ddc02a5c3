#pragma once
// Cluster topologies as Boost.Graph graphs: devices, NICs and switches joined by directed links
// with an achievable bandwidth and a latency; routes between any two devices.
//
//   ClusterSpec c = load_cluster(json["cluster"], "/cluster", diag);  // preset + overrides
//   Topology topo = build_topology(c);
//   Route r = topo.route(0, 8);          // NPU 0 -> NPU 8 (next server): NIC, leaf, NIC
//   r.bottleneck_bandwidth; r.latency;   // bytes/s and seconds along the path
//
// Builders: scale-up as a full mesh (Atlas 800T A2 HCCS: a direct link between every pair of
// NPUs of a server) or a switch (NVSwitch); scale-out as NICs into leaf switches (rail-optimised:
// NIC i of every server on the rail-i leaf; or plain: all NICs of a server on one leaf) and a
// spine layer whose uplinks may be oversubscribed. Vertices and links are general, so two-tier
// scale-up fabrics (CloudMatrix 384's UB Clos) are expressible with the same graph type.

#include <cstdint>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>
#include <nlohmann/json.hpp>

#include "moesim/models/device.hpp"
#include "moesim/sim/config.hpp"

namespace moesim::topologies {

enum class ScaleUpKind : std::uint8_t { FullMesh, Switch };
enum class FabricKind : std::uint8_t { RailOptimized, FatTree };

struct ClusterSpec {
  std::string name;
  std::string description;
  models::DeviceSpec device;
  int devices = 0;
  int devices_per_node = 8;
  ScaleUpKind scale_up = ScaleUpKind::FullMesh;
  BytesPerSecond scale_up_link_bandwidth{0};  ///< nominal, per direction (per link; per device for a switch)
  Seconds scale_up_latency{0};
  double scale_up_efficiency = 1.0;
  BytesPerSecond nic_bandwidth{0};  ///< nominal, per direction
  int nics_per_node = 8;
  Seconds nic_latency{0};
  double nic_efficiency = 1.0;
  FabricKind fabric = FabricKind::RailOptimized;
  int nodes_per_leaf = 32;
  double oversubscription = 1.0;

  [[nodiscard]] int num_nodes() const { return (devices + devices_per_node - 1) / devices_per_node; }
  /// Achievable bandwidths (nominal x efficiency).
  [[nodiscard]] BytesPerSecond scale_up_achieved() const { return scale_up_link_bandwidth * scale_up_efficiency; }
  [[nodiscard]] BytesPerSecond nic_achieved() const { return nic_bandwidth * nic_efficiency; }
};

/// `spec` is {"preset": name, "devices": N, ...overrides} or a full description.
ClusterSpec load_cluster(const nlohmann::json& spec, const std::string& pointer, Diagnostics& diag);
std::vector<std::string> cluster_preset_names();

enum class VertexKind : std::uint8_t { Device, Nic, Switch };
enum class LinkKind : std::uint8_t { ScaleUp, NicUplink, Fabric, Internal };

struct VertexProps {
  VertexKind kind = VertexKind::Device;
  int node = -1;   ///< server index (devices and NICs)
  int index = -1;  ///< device id, NIC local index, or switch id
};

struct LinkProps {
  double bandwidth = 0;  ///< achievable bytes/s in this direction
  double latency = 0;    ///< seconds
  LinkKind kind = LinkKind::ScaleUp;
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
  double bottleneck_bandwidth = 0;  ///< bytes/s
  double latency = 0;               ///< seconds, sum over hops
  bool same_node = true;
  bool crosses_fabric = false;  ///< goes through a spine (between leaves)
};

class Topology {
 public:
  Topology(ClusterSpec spec, Graph g) : spec_(std::move(spec)), g_(std::move(g)) {}
  [[nodiscard]] const ClusterSpec& spec() const { return spec_; }
  [[nodiscard]] const Graph& graph() const { return g_; }
  [[nodiscard]] int num_devices() const { return spec_.devices; }
  [[nodiscard]] int node_of(int device) const { return device / spec_.devices_per_node; }
  [[nodiscard]] int local_index(int device) const { return device % spec_.devices_per_node; }
  /// Shortest path by hop count (ties: lowest vertex ids first, so routes are deterministic).
  [[nodiscard]] Route route(int src_device, int dst_device) const;

 private:
  ClusterSpec spec_;
  Graph g_;
};

Topology build_topology(const ClusterSpec& spec);

}  // namespace moesim::topologies
