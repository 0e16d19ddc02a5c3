#pragma once
// Group shapes the collective tests derive their numbers by hand on.

#include "moesim/topologies/collectives.hpp"

namespace moesim::test {

/// 4 Atlas 800T A2-like servers, 8 NPUs each on a full mesh: 40 GB/s and 2 us per link inside,
/// 20 GB/s and 5 us per NIC across (round numbers, not a preset).
inline topologies::GroupShape four_mesh_servers() {
  topologies::GroupShape g;
  g.size = 32;
  g.nodes = 4;
  g.per_node = 8;
  g.mesh = true;
  g.intra_bytes_per_s = 40e9;
  g.intra_latency_s = 2e-6;
  g.inter_bytes_per_s = 20e9;
  g.inter_latency_s = 5e-6;
  return g;
}

}  // namespace moesim::test
