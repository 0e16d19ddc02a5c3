#include "moesim/topologies/topology.hpp"

#include <mutex>
#include <tuple>
#include <shared_mutex>
#include <unordered_map>


#include <algorithm>
#include <cassert>
#include <limits>

#include <fmt/format.h>

#include "moesim/models/presets.hpp"

namespace moesim::topologies {

std::span<const EmbeddedFile> embedded_cluster_presets();

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> out;
  for (const auto& f : embedded_cluster_presets()) out.emplace_back(f.name);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

/// cluster.collective_algorithms: {"level0": ..., "level1": ...}, HCCL_ALGO's levels under
/// moesim's names or HCCL's (fullmesh, H-D, H-D_R); what moesim does not model is refused.
void parse_collective_algorithms(ObjectReader& r, ClusterSpec& c, Diagnostics& diag) {
  const nlohmann::json* v = r.get({"collective_algorithms"});
  if (v == nullptr) return;
  const std::string at = r.child_pointer("collective_algorithms");
  if (!v->is_object()) {
    diag.error(at, json_brief(*v), "must be an object {\"level0\": \"mesh\", \"level1\": \"halving-doubling\"}");
    return;
  }
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string ptr = at + "/" + it.key();
    if (it.key() != "level0" && it.key() != "level1") {
      diag.error(ptr, json_brief(it.value()), "is not a level: give level0 (inside a server) or level1 (between servers)");
      continue;
    }
    const bool level0 = it.key() == "level0";
    const std::string name = it.value().is_string() ? it.value().get<std::string>() : "";
    Algorithm a = Algorithm::Auto;
    if (name == "auto") a = Algorithm::Auto;
    else if (name == "ring") a = Algorithm::Ring;
    else if (name == "mesh" || name == "fullmesh") a = Algorithm::Mesh;
    else if (name == "halving-doubling" || name == "H-D" || name == "H-D_R") a = Algorithm::HalvingDoubling;
    else if (name == "NHR" || name == "NB" || name == "pipeline" || name == "pairwise" || name == "star") {
      diag.error(ptr, json_brief(it.value()),
                 "is an HCCL algorithm moesim does not model; give ring, halving-doubling" +
                     std::string(level0 ? ", mesh" : "") + " or auto");
      continue;
    } else {
      diag.error(ptr, json_brief(it.value()),
                 std::string("must be auto, ring, halving-doubling (H-D)") + (level0 ? " or mesh (fullmesh)" : ""));
      continue;
    }
    if (a == Algorithm::Mesh && !level0) {
      diag.error(ptr, json_brief(it.value()), "is a level-0 algorithm: servers are not connected as a full mesh");
      continue;
    }
    if (a == Algorithm::Mesh && c.scale_up != ScaleUpKind::FullMesh) {
      diag.error(ptr, json_brief(it.value()), "needs a full-mesh scale-up (Atlas 800T A2's HCCS); this cluster's is switched");
      continue;
    }
    (level0 ? c.level0_algorithm : c.level1_algorithm) = a;
  }
}

std::optional<nlohmann::json> cluster_preset(std::string_view name) {
  for (const auto& f : embedded_cluster_presets())
    if (f.name == name) return nlohmann::json::parse(f.text);
  return std::nullopt;
}

}  // namespace

std::optional<nlohmann::json> cluster_preset_json(std::string_view name) { return cluster_preset(name); }

namespace {

std::string known_clusters() {
  std::string s;
  for (const auto& n : cluster_preset_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

ClusterSpec parse_cluster(const nlohmann::json& j, const std::string& pointer, Diagnostics& diag) {
  ClusterSpec c;
  ObjectReader r(j, pointer, diag);
  if (!r.valid()) return c;
  c.name = r.string({"name"}, "custom");
  c.description = r.string({"description"}, "");
  if (const auto* dev = r.get({"device"})) c.device = models::load_device(*dev, r.child_pointer("device"), diag);
  else diag.error(r.child_pointer("device"), "", "is required (a device preset name or object)");
  c.devices = static_cast<int>(r.required_integer({"devices"}, 1, 1 << 24));
  c.devices_per_node = static_cast<int>(r.required_integer({"devices_per_node"}, 1, 4096));
  if (const auto* su = r.get({"scale_up"})) {
    ObjectReader s(*su, r.child_pointer("scale_up"), diag);
    const std::string topo = s.string({"topology"}, "full_mesh", {"full_mesh", "switch", "clos"});
    c.scale_up = topo == "switch" ? ScaleUpKind::Switch : topo == "clos" ? ScaleUpKind::Clos : ScaleUpKind::FullMesh;
    if (c.scale_up == ScaleUpKind::Clos) {
      c.clos.server_devices = static_cast<int>(s.required_integer({"server_devices"}, 1, 4096));
      c.clos.l1_per_server = static_cast<int>(s.required_integer({"l1_per_server"}, 1, 256));
      c.clos.l2_per_plane = static_cast<int>(s.required_integer({"l2_per_plane"}, 1, 4096));
      if (c.devices_per_node % c.clos.server_devices != 0)
        diag.error(r.child_pointer("scale_up") + "/server_devices", std::to_string(c.clos.server_devices),
                   "must divide devices_per_node=" + std::to_string(c.devices_per_node));
    }
    c.scale_up_link_bandwidth = BytesPerSecond{s.required_quantity({"link_bandwidth"}, Dimension::BytesPerSecond, 1.0)};
    c.scale_up_latency = Seconds{s.opt_quantity({"latency"}, Dimension::Seconds).value_or(0.0)};
    c.scale_up_efficiency = s.number({"efficiency"}, 1.0, 0.01, 1.0);
    c.a2a_low_latency_base = Seconds{s.opt_quantity({"alltoall_low_latency_base"}, Dimension::Seconds).value_or(0.0)};
    c.a2a_low_latency_per_peer = Seconds{s.opt_quantity({"alltoall_low_latency_per_peer"}, Dimension::Seconds).value_or(0.0)};
    s.finish();
  } else {
    diag.error(r.child_pointer("scale_up"), "", "is required ({\"topology\", \"link_bandwidth\", ...})");
  }
  if (const auto* so = r.get({"scale_out"})) {
    ObjectReader s(*so, r.child_pointer("scale_out"), diag);
    c.nic_bandwidth = BytesPerSecond{s.required_quantity({"nic_bandwidth"}, Dimension::BytesPerSecond, 1.0)};
    c.nics_per_node = static_cast<int>(s.integer({"nics_per_node"}, c.devices_per_node, 1, 4096));
    c.nic_latency = Seconds{s.opt_quantity({"latency"}, Dimension::Seconds).value_or(0.0)};
    c.nic_efficiency = s.number({"efficiency"}, 1.0, 0.01, 1.0);
    const std::string fabric = s.string({"fabric"}, "rail_optimized", {"rail_optimized", "fat_tree"});
    c.fabric = fabric == "fat_tree" ? FabricKind::FatTree : FabricKind::RailOptimized;
    c.nodes_per_leaf = static_cast<int>(s.integer({"nodes_per_leaf"}, 32, 1, 1 << 20));
    c.oversubscription = s.number({"oversubscription"}, 1.0, 1.0, 1000.0);
    s.finish();
    if (c.devices_per_node % c.nics_per_node != 0 && c.nics_per_node % c.devices_per_node != 0)
      diag.error(r.child_pointer("scale_out") + "/nics_per_node", std::to_string(c.nics_per_node),
                 "must divide devices_per_node=" + std::to_string(c.devices_per_node));
  } else {
    diag.error(r.child_pointer("scale_out"), "", "is required ({\"nic_bandwidth\", ...})");
  }
  // Placement: how many of a domain's devices the job's ranks fill (Megatron's rank order
  // inside: consecutive ranks in one domain until it holds per_node of them).
  c.node_capacity = c.devices_per_node;
  if (const auto* pl = r.get({"placement"})) {
    ObjectReader q(*pl, r.child_pointer("placement"), diag);
    const int per = static_cast<int>(q.integer({"per_node"}, c.devices_per_node, 1, std::max(1, c.devices_per_node)));
    q.ignore({"source", "_source"});
    q.finish();
    if (per < c.devices_per_node) {
      if (c.scale_up == ScaleUpKind::Clos)
        diag.error(r.child_pointer("placement") + "/per_node", std::to_string(per),
                   "must equal devices_per_node for a Clos scale-up (its servers fill the domain)");
      else if ((1LL * c.nics_per_node * per) % c.devices_per_node != 0)
        diag.error(r.child_pointer("placement") + "/per_node", std::to_string(per),
                   fmt::format("must leave a whole number of NICs per domain ({} NICs for {} devices)", c.nics_per_node,
                               c.devices_per_node));
      else {
        c.nics_per_node = static_cast<int>(1LL * c.nics_per_node * per / c.devices_per_node);
        c.devices_per_node = per;
      }
    }
  }
  // A job over several servers whose last server is partly used: its collectives would see a
  // group shape the others do not, and a real job allocates whole servers. A single partial
  // server (a small job) is normal.
  const bool allow_partial = r.boolean({"allow_partial_node"}, false);
  if (c.devices > c.devices_per_node && c.devices % c.devices_per_node != 0 && !allow_partial)
    diag.error(r.child_pointer("devices"), std::to_string(c.devices),
               fmt::format("leaves the last server partly used ({} = {} x {} + {}); jobs over several servers "
                           "allocate whole ones. Set cluster.allow_partial_node: true if this is intended",
                           c.devices, c.devices / c.devices_per_node, c.devices_per_node,
                           c.devices % c.devices_per_node));
  parse_collective_algorithms(r, c, diag);
  r.ignore({"source", "_source"});
  r.finish();
  return c;
}

}  // namespace

ClusterSpec load_cluster(const nlohmann::json& spec, const std::string& pointer, Diagnostics& diag) {
  if (!spec.is_object()) {
    diag.error(pointer, json_brief(spec), "must be an object such as {\"preset\": \"atlas-800t-a2\", \"devices\": 6144}");
    return ClusterSpec{};
  }
  nlohmann::json merged;
  if (spec.contains("preset")) {
    const auto& p = spec["preset"];
    if (!p.is_string()) {
      diag.error(pointer + "/preset", json_brief(p), "must be a cluster preset name");
      return ClusterSpec{};
    }
    auto base = cluster_preset(p.get<std::string>());
    if (!base) {
      std::string msg = "is not a cluster preset";
      const auto near = closest_match(p.get<std::string>(), cluster_preset_names());
      if (!near.empty()) msg += "; did you mean \"" + near + "\"?";
      diag.error(pointer + "/preset", json_brief(p), msg + " Known: " + known_clusters());
      return ClusterSpec{};
    }
    Diagnostics preset_diag("topologies/presets/" + p.get<std::string>() + ".json");
    strip_sources(*base, "", preset_diag);
    for (const auto& x : preset_diag.list()) diag.error_in(x.file, x.pointer, x.value, x.constraint);
    merged = std::move(*base);
    nlohmann::json patch = spec;
    patch.erase("preset");
    merged.merge_patch(patch);
  } else {
    merged = spec;
  }
  return parse_cluster(merged, pointer, diag);
}

namespace {

void build_fabric(const ClusterSpec& c, Graph& g) {
  const int n_dev = c.devices;
  const int per_node = c.devices_per_node;
  const int nodes = c.num_nodes();
  for (int d = 0; d < n_dev; ++d) boost::add_vertex(g);
  for (int d = 0; d < n_dev; ++d) g[d] = VertexProps{VertexKind::Device, d / per_node, d};

  auto add_pair = [&g](Vertex a, Vertex b, double bw, double lat, LinkKind kind) {
    boost::add_edge(a, b, LinkProps{bw, lat, kind}, g);
    boost::add_edge(b, a, LinkProps{bw, lat, kind}, g);
  };

  // Scale-up inside each server.
  const double su_bw = c.scale_up_achieved().value();
  const double su_lat = c.scale_up_latency.value();
  for (int node = 0; node < nodes; ++node) {
    const int first = node * per_node;
    const int last = std::min(n_dev, first + per_node);
    if (c.scale_up == ScaleUpKind::FullMesh) {
      for (int a = first; a < last; ++a)
        for (int b = a + 1; b < last; ++b) add_pair(a, b, su_bw, su_lat, LinkKind::ScaleUp);
    } else if (c.scale_up == ScaleUpKind::Switch) {
      const Vertex sw = boost::add_vertex(VertexProps{VertexKind::Switch, node, -1}, g);
      for (int a = first; a < last; ++a) add_pair(a, sw, su_bw, su_lat / 2, LinkKind::ScaleUp);
    } else {
      // Two-tier Clos over the scale-up domain: L1 switches of every server (one per plane),
      // then the L2 switches of every plane. The domain's latency is end to end (the same for
      // any pair): half on each device link, nothing on the L1-L2 hops.
      const int sd = c.clos.server_devices, planes = c.clos.l1_per_server, l2n = c.clos.l2_per_plane;
      const int first_server = first / sd;
      const int servers = (last - first + sd - 1) / sd;
      const double plane_bw = su_bw / planes;        // per device per plane
      const double up_bw = sd * plane_bw / l2n;      // non-blocking: L1 uplinks = L1 downlinks
      std::vector<Vertex> l1(static_cast<std::size_t>(servers) * planes);
      for (int s = 0; s < servers; ++s)
        for (int p = 0; p < planes; ++p)
          l1[static_cast<std::size_t>(s) * planes + p] =
              boost::add_vertex(VertexProps{VertexKind::Switch, node, first_server + s, p, 1}, g);
      for (int p = 0; p < planes; ++p)
        for (int j = 0; j < l2n; ++j) {
          const Vertex l2 = boost::add_vertex(VertexProps{VertexKind::Switch, node, j, p, 2}, g);
          for (int s = 0; s < servers; ++s)
            add_pair(l1[static_cast<std::size_t>(s) * planes + p], l2, up_bw, 0.0, LinkKind::ScaleUp);
        }
      for (int a = first; a < last; ++a)
        for (int p = 0; p < planes; ++p)
          add_pair(a, l1[static_cast<std::size_t>((a - first) / sd) * planes + p], plane_bw, su_lat / 2,
                   LinkKind::ScaleUp);
    }
  }

  // NICs: device -> NIC (internal), NIC -> leaf (uplink).
  const int nics = c.nics_per_node;
  const double nic_bw = c.nic_achieved().value();
  const double nic_lat = c.nic_latency.value();
  std::vector<Vertex> nic_vertex(static_cast<std::size_t>(nodes) * nics);
  for (int node = 0; node < nodes; ++node)
    for (int i = 0; i < nics; ++i)
      nic_vertex[static_cast<std::size_t>(node) * nics + i] =
          boost::add_vertex(VertexProps{VertexKind::Nic, node, i}, g);
  for (int d = 0; d < n_dev; ++d) {
    const int node = d / per_node, local = d % per_node;
    // Devices share NICs evenly (or use several when there are more NICs than devices).
    if (nics >= per_node) {
      for (int i = local; i < nics; i += per_node)
        add_pair(d, nic_vertex[static_cast<std::size_t>(node) * nics + i], 1e15, 0.0, LinkKind::Internal);
    } else {
      add_pair(d, nic_vertex[static_cast<std::size_t>(node) * nics + local * nics / per_node], 1e15, 0.0,
               LinkKind::Internal);
    }
  }
  // Leaves and the spine layer (one aggregated spine vertex; leaf uplinks carry the leaf's
  // downlink capacity divided by the oversubscription ratio).
  const int groups = (nodes + c.nodes_per_leaf - 1) / c.nodes_per_leaf;
  const int leaves_per_group = c.fabric == FabricKind::RailOptimized ? nics : 1;
  std::vector<Vertex> leaf(static_cast<std::size_t>(groups) * leaves_per_group);
  for (int gi = 0; gi < groups; ++gi)
    for (int l = 0; l < leaves_per_group; ++l)
      leaf[static_cast<std::size_t>(gi) * leaves_per_group + l] =
          boost::add_vertex(VertexProps{VertexKind::Switch, -1, gi * leaves_per_group + l}, g);
  for (int node = 0; node < nodes; ++node)
    for (int i = 0; i < nics; ++i) {
      const int gi = node / c.nodes_per_leaf;
      const int l = c.fabric == FabricKind::RailOptimized ? i : 0;
      add_pair(nic_vertex[static_cast<std::size_t>(node) * nics + i], leaf[static_cast<std::size_t>(gi) * leaves_per_group + l],
               nic_bw, nic_lat / 2, LinkKind::NicUplink);
    }
  if (leaf.size() > 1) {
    const Vertex spine = boost::add_vertex(VertexProps{VertexKind::Switch, -1, -2}, g);
    const int ports_down = c.nodes_per_leaf * (c.fabric == FabricKind::RailOptimized ? 1 : nics);
    const double up_bw = ports_down * nic_bw / c.oversubscription;
    for (Vertex l : leaf) add_pair(l, spine, up_bw, 0.0, LinkKind::Fabric);
  }
}

/// What the graph depends on (not the name, description or device of the spec).
auto fabric_key(const ClusterSpec& c) {
  return std::tuple{c.devices,
                    c.devices_per_node,
                    static_cast<int>(c.scale_up),
                    c.scale_up_achieved().value(),
                    c.scale_up_latency.value(),
                    c.clos.server_devices,
                    c.clos.l1_per_server,
                    c.clos.l2_per_plane,
                    c.nics_per_node,
                    c.nic_achieved().value(),
                    c.nic_latency.value(),
                    static_cast<int>(c.fabric),
                    c.nodes_per_leaf,
                    c.oversubscription};
}

}  // namespace

Topology build_topology(const ClusterSpec& c) {
  using Key = decltype(fabric_key(c));
  static std::mutex mutex;
  // Most recent last. Never destroyed: freeing a 131K-device graph at exit costs more than
  // simulating on it (the memory goes back with the process).
  static auto& recent = *new std::vector<std::pair<Key, Topology>>;
  constexpr std::size_t kKept = 4;
  const Key key = fabric_key(c);
  std::lock_guard lock(mutex);  // a thread asking for a fabric being built waits for it
  for (std::size_t i = 0; i < recent.size(); ++i)
    if (recent[i].first == key) {
      std::rotate(recent.begin() + static_cast<std::ptrdiff_t>(i), recent.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                  recent.end());
      Topology t = recent.back().second;
      t.spec_ = c;
      return t;
    }
  Topology t(c, [&c](Graph& g) { build_fabric(c, g); });
  if (recent.size() == kKept) recent.erase(recent.begin());
  recent.emplace_back(key, t);
  return t;
}

struct Topology::Fabric {
  Graph g;
  std::vector<double> link_bandwidths;
  // Clos switches: clos_l1[global_server * planes + plane],
  // clos_l2[(domain * planes + plane) * l2_per_plane + j].
  std::vector<Vertex> clos_l1, clos_l2;
  /// route(src, dst) results, shared by copies of this topology (same graph) and by threads:
  /// the search asks the same few pairs for every plan it screens, and a route across a
  /// 65K-device fabric is a breadth-first search over most of it.
  std::shared_mutex mutex;
  std::unordered_map<std::uint64_t, Route> routes;
};

const Graph& Topology::graph() const { return fab_->g; }
const std::vector<double>& Topology::link_bandwidths() const { return fab_->link_bandwidths; }

Topology::Topology(ClusterSpec spec, const std::function<void(Graph&)>& fill)
    : spec_(std::move(spec)), fab_(std::make_shared<Fabric>()) {
  fill(fab_->g);
  int next = 0;
  for (auto [v, vend] = boost::vertices(fab_->g); v != vend; ++v)
    for (auto [e, eend] = boost::out_edges(*v, fab_->g); e != eend; ++e) {
      fab_->g[*e].id = next++;
      fab_->link_bandwidths.push_back(fab_->g[*e].bytes_per_s);
    }
  if (spec_.scale_up == ScaleUpKind::Clos) {
    const int planes = spec_.clos.l1_per_server, l2n = spec_.clos.l2_per_plane;
    const int servers = (spec_.devices + spec_.clos.server_devices - 1) / spec_.clos.server_devices;
    fab_->clos_l1.assign(static_cast<std::size_t>(servers) * planes, 0);
    fab_->clos_l2.assign(static_cast<std::size_t>(spec_.num_nodes()) * planes * l2n, 0);
    for (auto [v, vend] = boost::vertices(fab_->g); v != vend; ++v) {
      const VertexProps& p = fab_->g[*v];
      if (p.tier == 1) fab_->clos_l1[static_cast<std::size_t>(p.index) * planes + p.plane] = *v;
      if (p.tier == 2) fab_->clos_l2[(static_cast<std::size_t>(p.node) * planes + p.plane) * l2n + p.index] = *v;
    }
  }
}

Vertex Topology::shift(Vertex v, int from_a, int to_a, int from_b, int to_b) const {
  const VertexProps& p = fab_->g[v];
  if (p.kind == VertexKind::Switch && p.node < 0) {
    if (p.index < 0) return v;  // the spine
    const int lpg = spec_.fabric == FabricKind::RailOptimized ? spec_.nics_per_node : 1;
    const int group = p.index / lpg;
    const long long delta = group == leaf_group(from_a) ? leaf_group(to_a) - leaf_group(from_a)
                                                       : leaf_group(to_b) - leaf_group(from_b);
    return static_cast<Vertex>(static_cast<long long>(v) + delta * lpg);
  }
  const long long delta = p.node == from_a ? to_a - from_a : to_b - from_b;
  const long long stride = p.kind == VertexKind::Device ? spec_.devices_per_node
                           : p.kind == VertexKind::Nic  ? spec_.nics_per_node
                                                        : 1;  // one scale-up switch per server
  return static_cast<Vertex>(static_cast<long long>(v) + delta * stride);
}

int Topology::num_paths() const {
  return spec_.scale_up == ScaleUpKind::Clos ? spec_.clos.l1_per_server : 1;
}

Route Topology::route(int src, int dst) const {
  const std::uint64_t key = static_cast<std::uint64_t>(static_cast<std::uint32_t>(src)) << 32 | static_cast<std::uint32_t>(dst);
  {
    std::shared_lock lock(fab_->mutex);
    if (auto it = fab_->routes.find(key); it != fab_->routes.end()) return it->second;
  }
  Route r = route(src, dst, 0);
  if (spec_.scale_up == ScaleUpKind::Clos && !r.hops.empty()) {
    // One transfer spreads over every plane: the scale-up hops carry num_paths() x plane 0's.
    const double planes = num_paths();
    r.bottleneck_bytes_per_s = std::numeric_limits<double>::infinity();
    for (const Hop& h : r.hops)
      r.bottleneck_bytes_per_s =
          std::min(r.bottleneck_bytes_per_s,
                   h.link.kind == LinkKind::ScaleUp ? h.link.bytes_per_s * planes : h.link.bytes_per_s);
  }
  std::unique_lock lock(fab_->mutex);
  if (fab_->routes.size() < (1u << 20)) fab_->routes.emplace(key, r);  // bounded
  return r;
}

Route Topology::route(int src, int dst, int path) const {
  assert(path >= 0 && path < num_paths());
  if (spec_.scale_up != ScaleUpKind::Clos) return bfs_route(src, dst, -1);
  if (src != dst && node_of(src) == node_of(dst)) return clos_route(src, dst, path);
  return bfs_route(src, dst, path);
}

namespace {

void finish_route(Route& r, std::vector<Hop> hops) {
  r.bottleneck_bytes_per_s = std::numeric_limits<double>::infinity();
  for (const Hop& h : hops) {
    r.bottleneck_bytes_per_s = std::min(r.bottleneck_bytes_per_s, h.link.bytes_per_s);
    r.latency_s += h.link.latency_s;
    if (h.link.kind == LinkKind::Fabric) r.crosses_fabric = true;
  }
  r.hops = std::move(hops);
}

}  // namespace

Route Topology::clos_route(int src, int dst, int plane) const {
  // Inside one scale-up domain the Clos route is known: device, L1 of the plane in its server,
  // [an L2 of the plane chosen by the two dies' positions in their servers, the L1 of the
  // destination server,] device. Spreading by die pair (as the UB's multi-path spraying does)
  // keeps every L1-L2 link within one die's share of the plane — the Clos is non-blocking.
  Route r;
  r.same_node = true;
  const int planes = spec_.clos.l1_per_server, sd = spec_.clos.server_devices, l2n = spec_.clos.l2_per_plane;
  const int ss = src / sd, ds = dst / sd;
  std::vector<Vertex> path{static_cast<Vertex>(src), fab_->clos_l1[static_cast<std::size_t>(ss) * planes + plane]};
  if (ss != ds) {
    const int j = (src % sd + dst % sd) % l2n;
    path.push_back(fab_->clos_l2[(static_cast<std::size_t>(node_of(src)) * planes + plane) * l2n + j]);
    path.push_back(fab_->clos_l1[static_cast<std::size_t>(ds) * planes + plane]);
  }
  path.push_back(static_cast<Vertex>(dst));
  std::vector<Hop> hops;
  for (std::size_t i = 0; i + 1 < path.size(); ++i) {
    const auto [e, ok] = boost::edge(path[i], path[i + 1], fab_->g);
    assert(ok);
    hops.push_back(Hop{path[i], path[i + 1], fab_->g[e]});
  }
  finish_route(r, std::move(hops));
  return r;
}

Route Topology::bfs_route(int src, int dst, int plane) const {
  Route r;
  r.same_node = node_of(src) == node_of(dst);
  if (src == dst) {
    r.bottleneck_bytes_per_s = std::numeric_limits<double>::infinity();
    return r;
  }
  // Breadth-first search with early exit; out-edges are visited in insertion order, so the
  // chosen path among equal-length ones is deterministic. With plane >= 0, only the Clos
  // switches of that plane are used.
  // Scratch arrays reused across calls (per thread), marked by a generation number instead of
  // being cleared: a search touches a few hundred vertices of a graph of tens of thousands.
  struct Scratch {
    std::vector<Vertex> parent;
    std::vector<Graph::edge_descriptor> via;
    std::vector<std::uint32_t> seen;
    std::vector<Vertex> queue;
    std::uint32_t generation = 0;
  };
  thread_local Scratch sc;
  const std::size_t nv = boost::num_vertices(fab_->g);
  if (sc.seen.size() < nv) {
    sc.parent.resize(nv);
    sc.via.resize(nv);
    sc.seen.assign(nv, 0);
    sc.generation = 0;
  }
  if (++sc.generation == 0) {  // wrapped: forget every mark
    std::fill(sc.seen.begin(), sc.seen.end(), 0);
    sc.generation = 1;
  }
  const std::uint32_t gen = sc.generation;
  auto& parent = sc.parent;
  auto& via = sc.via;
  auto& queue = sc.queue;
  queue.clear();
  std::size_t head = 0;
  parent[src] = static_cast<Vertex>(src);
  sc.seen[src] = gen;
  queue.push_back(static_cast<Vertex>(src));
  bool found = false;
  while (head < queue.size() && !found) {
    const Vertex u = queue[head++];
    for (auto [e, end] = boost::out_edges(u, fab_->g); e != end; ++e) {
      const Vertex v = boost::target(*e, fab_->g);
      if (sc.seen[v] == gen) continue;
      if (plane >= 0 && fab_->g[v].plane >= 0 && fab_->g[v].plane != plane) continue;
      // Devices forward only as a first scale-up hop towards a NIC of their own server
      // (PXN-style rail alignment): enter an intermediate device only from the source or a
      // server switch, and leave it only to a NIC.
      const bool v_intermediate_device = fab_->g[v].kind == VertexKind::Device && static_cast<int>(v) != dst;
      if (v_intermediate_device && !(static_cast<int>(u) == src || (fab_->g[u].kind == VertexKind::Switch && fab_->g[u].node >= 0)))
        continue;
      const bool u_intermediate_device = fab_->g[u].kind == VertexKind::Device && static_cast<int>(u) != src;
      if (u_intermediate_device && fab_->g[v].kind != VertexKind::Nic) continue;
      sc.seen[v] = gen;
      parent[v] = u;
      via[v] = *e;
      if (static_cast<int>(v) == dst) {
        found = true;
        break;
      }
      queue.push_back(v);
    }
  }
  if (!found) return r;
  std::vector<Hop> hops;
  for (Vertex v = static_cast<Vertex>(dst); v != static_cast<Vertex>(src); v = parent[v])
    hops.push_back(Hop{parent[v], v, fab_->g[via[v]]});
  std::reverse(hops.begin(), hops.end());
  finish_route(r, std::move(hops));
  return r;
}

}  // namespace moesim::topologies
