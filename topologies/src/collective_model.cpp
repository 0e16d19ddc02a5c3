#include "moesim/topologies/collective_model.hpp"

namespace moesim::topologies {

CollectiveCost AnalyticalCollectives::collective(Collective kind, double bytes, const GroupPlacement& g, Algorithm algo,
                                                 double dedup) {
  return collective_cost(kind, bytes, *g.shape, algo, dedup);
}

CollectiveCost AnalyticalCollectives::alltoallv(const std::vector<std::vector<double>>& bytes, const GroupPlacement& g,
                                                Algorithm algo, double dedup) {
  const std::vector<int> node(g.nodes.begin(), g.nodes.end());
  return alltoallv_cost(bytes, node, *g.shape, algo, dedup);
}

CollectiveCost FlowCollectiveModel::collective(Collective kind, double bytes, const GroupPlacement& g, Algorithm algo,
                                               double dedup) {
  if (kind != Collective::AllToAll) return collective_cost(kind, bytes, *g.shape, algo, dedup);
  const std::tuple<int, double, double, int> key{g.devices.front(), bytes, dedup, static_cast<int>(algo)};
  auto it = uniform_.find(key);
  if (it != uniform_.end()) return it->second;
  const CollectiveCost c = flows_.alltoall(bytes, g.devices, *g.shape, algo, dedup, g.others);
  return uniform_.emplace(key, c).first->second;
}

CollectiveCost FlowCollectiveModel::alltoallv(const std::vector<std::vector<double>>& bytes, const GroupPlacement& g,
                                              Algorithm algo, double dedup) {
  return flows_.alltoallv(bytes, g.devices, *g.shape, algo, dedup, g.others);
}

std::unique_ptr<CollectiveModel> make_collective_model(NetworkKind kind, const Topology& topo) {
  if (kind == NetworkKind::Flow) return std::make_unique<FlowCollectiveModel>(topo);
  return std::make_unique<AnalyticalCollectives>();
}

}  // namespace moesim::topologies
