// topologies/: cluster presets, graph builders and routes.
#include <catch2/catch.hpp>

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
  CHECK(r.bottleneck_bandwidth == Approx(28e9 * 0.6));
  CHECK(r.latency == Approx(2e-6));
}

TEST_CASE("topologies: same-rail NPUs of two servers meet at their rail leaf", "[topologies]") {
  const Topology t = make("atlas-800t-a2", 64);
  // NPU 3 of server 0 -> NPU 3 of server 1: device, NIC, leaf, NIC, device.
  const Route r = t.route(3, 11);
  CHECK_FALSE(r.same_node);
  CHECK(r.hops.size() == 4);
  CHECK_FALSE(r.crosses_fabric);
  CHECK(r.bottleneck_bandwidth == Approx(25e9 * 0.9));  // 200 GE at 90%
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
  CHECK(r.bottleneck_bandwidth == Approx(450e9 * 0.82));
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
