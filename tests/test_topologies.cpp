// topologies/: cluster presets, graph builders and routes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "moesim/topologies/topology.hpp"

using namespace moesim;
using namespace moesim::topologies;

namespace {
Topology make(const std::string& preset, int devices) {
  Diagnostics diag("test");
  const auto j = nlohmann::json{{"preset", preset}, {"devices", devices}};
  const ClusterSpec c = load_cluster(j, "/cluster", diag);
  REQUIRE(diag.ok());
  return build_topology(c);
}
}  // namespace

TEST_CASE("topologies: Atlas 800T A2 servers are HCCS full meshes", "[topologies]") {
  const Topology t = make("atlas-800t-a2", 64);
  // Two NPUs of one server: one direct HCCS link (28 GB/s per direction x 0.6 achieved).
  const Route r = t.route(0, 7);
  REQUIRE(r.hops.size() == 1);
  CHECK(r.same_node);
  CHECK(r.bottleneck_bytes_per_s == Approx(28e9 * 0.6));
  CHECK(r.latency_s == Approx(2e-6));
}

TEST_CASE("topologies: same-rail NPUs of two servers meet at their rail leaf", "[topologies]") {
  const Topology t = make("atlas-800t-a2", 64);
  // NPU 3 of server 0 -> NPU 3 of server 1: device, NIC, leaf, NIC, device.
  const Route r = t.route(3, 11);
  CHECK_FALSE(r.same_node);
  CHECK(r.hops.size() == 4);
  CHECK_FALSE(r.crosses_fabric);
  CHECK(r.bottleneck_bytes_per_s == Approx(25e9 * 0.9));  // 200 GE at 90%
}

TEST_CASE("topologies: other rails are reached through the scale-up fabric first", "[topologies]") {
  const Topology t = make("atlas-800t-a2", 64);
  // NPU 0 of server 0 -> NPU 5 of server 1: hop to NPU 5 of server 0 over HCCS, then its rail.
  const Route r = t.route(0, 13);
  CHECK(r.hops.size() == 5);
  CHECK_FALSE(r.crosses_fabric);
  CHECK(r.hops.front().link.kind == LinkKind::ScaleUp);
}

TEST_CASE("topologies: servers under different leaves cross the spine", "[topologies]") {
  const Topology t = make("atlas-800t-a2", 8 * 64);  // 64 servers, 32 per leaf
  const Route r = t.route(0, 8 * 40);
  CHECK(r.crosses_fabric);
  CHECK(r.hops.size() == 6);
}

TEST_CASE("topologies: NVSwitch servers route through the switch", "[topologies]") {
  const Topology t = make("dgx-h100", 16);
  const Route r = t.route(0, 5);
  CHECK(r.hops.size() == 2);
  CHECK(r.bottleneck_bytes_per_s == Approx(450e9 * 0.82));
}

TEST_CASE("topologies: cluster overrides and bad values are checked", "[topologies]") {
  Diagnostics diag("s.json");
  const auto j = nlohmann::json::parse(
      R"({"preset": "atlas-800t-a2", "devices": 16, "scale_out": {"oversubscription": 0.5, "fabric": "torus"}})");
  load_cluster(j, "/cluster", diag);
  REQUIRE(diag.list().size() == 2);
  CHECK(diag.list()[0].pointer == "/cluster/scale_out/fabric");
  CHECK(diag.list()[1].pointer == "/cluster/scale_out/oversubscription");
}

TEST_CASE("topologies: CloudMatrix 384 is a 768-die UB Clos supernode", "[topologies][topology]") {
  const Topology t = make("cloudmatrix-384", 768);
  CHECK(t.num_devices() == 768);
  CHECK(t.spec().scale_up == ScaleUpKind::Clos);
  CHECK(t.spec().devices_per_node == 768);
  CHECK(t.spec().clos.server_devices == 16);
  REQUIRE(t.num_paths() == 7);
  const double eff = t.spec().scale_up_efficiency;  // the preset's fitted achieved fraction
  const double lat = t.spec().scale_up_latency.value();
  const double plane_bw = 196e9 * eff / 7;  // 28 GB/s per die per plane, nominal

  SECTION("same server: one L1 switch of the chosen plane") {
    for (int p = 0; p < 7; ++p) {
      const Route r = t.route(0, 1, p);
      REQUIRE(r.hops.size() == 2);
      CHECK(r.same_node);
      CHECK_FALSE(r.crosses_fabric);
      const auto& l1 = t.graph()[r.hops[0].to];
      CHECK(l1.kind == VertexKind::Switch);
      CHECK(l1.tier == 1);
      CHECK(l1.plane == p);
      CHECK(l1.index == 0);  // server 0
      CHECK(r.bottleneck_bytes_per_s == Approx(plane_bw));
      CHECK(r.latency_s == Approx(lat));
    }
  }
  SECTION("next server: L1, L2, L1 of the chosen plane") {
    std::set<Vertex> l1s;
    for (int p = 0; p < 7; ++p) {
      const Route r = t.route(0, 16, p);
      REQUIRE(r.hops.size() == 4);
      CHECK(r.same_node);
      const auto& g = t.graph();
      CHECK(g[r.hops[0].to].tier == 1);
      CHECK(g[r.hops[1].to].tier == 2);
      CHECK(g[r.hops[2].to].tier == 1);
      CHECK(g[r.hops[0].to].index == 0);
      CHECK(g[r.hops[2].to].index == 1);
      for (int h = 0; h < 3; ++h) CHECK(g[r.hops[h].to].plane == p);
      CHECK(g[r.hops[1].to].index == (0 + 0) % 16);  // L2 spread by the two dies' positions
      for (const Hop& h : r.hops) CHECK(h.link.kind == LinkKind::ScaleUp);
      CHECK(r.bottleneck_bytes_per_s == Approx(plane_bw));  // L1-L2 links: 16 x 28 / 16 GB/s
      CHECK(r.latency_s == Approx(lat));
      l1s.insert(r.hops[0].to);
    }
    CHECK(l1s.size() == 7);
    // Other die pairs use other L2 switches of the plane: one die's cross-server traffic to
    // the 16 dies of a server is spread over all 16 L2 switches.
    CHECK(t.graph()[t.route(0, 16 * 5 + 5, 0).hops[1].to].index == 5);
    CHECK(t.graph()[t.route(16 * 3 + 7, 16 * 47 + 12, 0).hops[1].to].index == (7 + 12) % 16);
    std::set<int> l2s;
    for (int d = 0; d < 16; ++d) l2s.insert(t.graph()[t.route(3, 16 * 9 + d, 2).hops[1].to].index);
    CHECK(l2s.size() == 16);
  }
  SECTION("route(src, dst) is plane 0 with the whole per-die UB bandwidth") {
    const Route r0 = t.route(0, 16, 0);
    const Route r = t.route(0, 16);
    REQUIRE(r.hops.size() == r0.hops.size());
    for (std::size_t i = 0; i < r.hops.size(); ++i) CHECK(r.hops[i].link.id == r0.hops[i].link.id);
    CHECK(r.bottleneck_bytes_per_s == Approx(196e9 * eff));
    CHECK(t.route(5, 700).bottleneck_bytes_per_s == Approx(196e9 * eff));
  }
}

TEST_CASE("topologies: every directed link has a dense id and its bandwidth", "[topologies][topology]") {
  for (const auto& [preset, devices] : std::vector<std::pair<std::string, int>>{
           {"cloudmatrix-384", 1536}, {"atlas-800t-a2", 64}, {"dgx-h100", 16}}) {
    const Topology t = make(preset, devices);
    const auto& g = t.graph();
    REQUIRE(t.num_links() == boost::num_edges(g));
    REQUIRE(t.link_bandwidths().size() == t.num_links());
    std::vector<int> seen(t.num_links(), 0);
    for (auto [e, end] = boost::edges(g); e != end; ++e) {
      const int id = g[*e].id;
      REQUIRE(id >= 0);
      REQUIRE(static_cast<std::size_t>(id) < t.num_links());
      ++seen[static_cast<std::size_t>(id)];
      CHECK(t.link_bandwidths()[static_cast<std::size_t>(id)] == g[*e].bytes_per_s);
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    // Routes carry the ids of the graph's links.
    const Route r = t.route(0, devices - 1, 0);
    REQUIRE_FALSE(r.hops.empty());
    for (const Hop& h : r.hops) {
      const auto [e, ok] = boost::edge(h.from, h.to, g);
      REQUIRE(ok);
      CHECK(h.link.id == g[e].id);
    }
  }
}

TEST_CASE("topologies: CloudMatrix supernodes meet over the RDMA fabric", "[topologies][topology]") {
  const Topology t = make("cloudmatrix-384", 1536);
  CHECK(t.spec().num_nodes() == 2);
  for (int p = 0; p < t.num_paths(); ++p) {
    const Route r = t.route(0, 768, p);
    // die, NIC, leaf, spine, leaf, NIC, die
    REQUIRE(r.hops.size() == 6);
    CHECK_FALSE(r.same_node);
    CHECK(r.crosses_fabric);
    CHECK(r.hops.front().link.kind == LinkKind::Internal);
    CHECK(t.graph()[r.hops[0].to].kind == VertexKind::Nic);
    CHECK(t.graph()[r.hops[4].to].kind == VertexKind::Nic);
    CHECK(r.bottleneck_bytes_per_s == Approx(25e9 * 0.9));  // 200 Gb/s per die at 90%
    for (const Hop& h : r.hops) CHECK(h.link.kind != LinkKind::ScaleUp);
  }
  // The aggregate route does not scale the NIC hops.
  CHECK(t.route(0, 768).bottleneck_bytes_per_s == Approx(25e9 * 0.9));
  CHECK(t.route(3, 768 + 100).hops.size() == 6);
  // Inside the second supernode the UB Clos is used as in the first.
  CHECK(t.route(768, 768 + 16, 2).hops.size() == 4);
}

TEST_CASE("topologies: single-path presets report one path", "[topologies][topology]") {
  for (const auto& name : cluster_preset_names()) {
    if (name == "cloudmatrix-384") continue;
    const Topology t = make(name, 16);
    CHECK(t.num_paths() == 1);
    const Route a = t.route(0, 9), b = t.route(0, 9, 0);
    REQUIRE(a.hops.size() == b.hops.size());
    CHECK(a.bottleneck_bytes_per_s == b.bottleneck_bytes_per_s);
  }
}

TEST_CASE("topologies: a Clos scale-up needs its shape", "[topologies][topology]") {
  Diagnostics diag("s.json");
  const auto j = nlohmann::json::parse(
      R"({"preset": "cloudmatrix-384", "devices": 768, "scale_up": {"server_devices": 10}})");
  load_cluster(j, "/cluster", diag);
  REQUIRE(diag.list().size() == 1);
  CHECK(diag.list()[0].pointer == "/cluster/scale_up/server_devices");
}
