#include "network.hpp"

#include <algorithm>

namespace moesim::strategies::lowering {

using topologies::Algorithm;
using topologies::Collective;
using topologies::CollectiveCost;
using topologies::GroupPlacement;

StageNetwork::StageNetwork(const topologies::Topology& topo, const Layout& lay, topologies::CollectiveModel& model,
                           ShapeCache* cache, AllToAllAlgo alltoall, int top_k)
    : topo_(topo), lay_(lay), model_(model), cache_(cache), alltoall_(alltoall), top_k_(top_k) {}

void StageNetwork::set_stage(int stage) {
  stage_ = stage;
  const auto& spec = topo_.spec();
  const long long span = 1LL * spec.devices_per_node * spec.nodes_per_leaf;
  const int offset = static_cast<int>((1LL * stage * lay_.block) % std::max(1LL, span));
  const bool devices = model_.needs_devices();
  for (int g = 0; g < kNumGroupKinds; ++g) {
    const auto kind = static_cast<GroupKind>(g);
    devices_[g].clear();
    if (devices)
      for (int l : lay_.members(kind, 0)) devices_[g].push_back(stage * lay_.block + l);
    const std::array<int, 8> key{g, lay_.tp, lay_.cp, lay_.dp, lay_.ep, lay_.etp, offset, 0};
    if (cache_ != nullptr) {
      auto it = cache_->shapes.find(key);
      if (it != cache_->shapes.end()) {
        shape_[g] = it->second;
        continue;
      }
    }
    if (!devices)
      for (int l : lay_.members(kind, 0)) devices_[g].push_back(stage * lay_.block + l);
    shape_[g] = topologies::analyze_group(topo_, devices_[g]);
    if (cache_ != nullptr) cache_->shapes.emplace(key, shape_[g]);
  }
}

Algorithm StageNetwork::a2a_algorithm() const {
  switch (alltoall_) {
    case AllToAllAlgo::Hierarchical: return Algorithm::HierarchicalAllToAll;
    case AllToAllAlgo::AllGather: return Algorithm::AllGatherAllToAll;
    case AllToAllAlgo::Flat: break;
  }
  return Algorithm::Pairwise;
}

Step StageNetwork::step(GroupKind g, Collective kind, double bytes, sim::Category cat, Stream stream, sim::LabelId label,
                        int count, double dedup, topologies::CollectiveCost* cost) {
  const topologies::GroupShape& sh = shape(g);
  Step st;
  st.cat = cat;
  st.stream = stream;
  st.group = g;
  st.label = label;
  if (sh.size <= 1 || bytes <= 0) return st;
  Algorithm algo = Algorithm::Auto;
  if (kind == Collective::AllToAll) {
    algo = a2a_algorithm();
    if (algo == Algorithm::AllGatherAllToAll) dedup = 1.0 / std::max(1, top_k_);
  }
  const auto& devs = devices_[static_cast<int>(g)];
  GroupPlacement where{&sh, devs, {}, {}};
  if (kind == Collective::AllToAll && model_.needs_devices()) where.others = others(g, 0);
  const CollectiveCost c = model_.collective(kind, bytes, where, algo, dedup);
  st.duration = to_ticks(c.time);
  if (cost != nullptr) *cost = c;
  note(g, kind, c, bytes, sh.size, count);
  return st;
}

topologies::CollectiveCost StageNetwork::ep_alltoallv(const std::vector<std::vector<double>>& bytes, int group,
                                                      Algorithm algo, double dedup) {
  // The expert-parallel group `group` of the current stage; the analytical model sees the
  // servers of the stage-local members.
  std::vector<int> devs, node;
  for (int l : lay_.members(GroupKind::Ep, group * lay_.etp * lay_.ep)) devs.push_back(stage_ * lay_.block + l);
  for (int l : lay_.members(GroupKind::Ep, 0)) node.push_back(l / topo_.spec().devices_per_node);
  const GroupPlacement where{&shape(GroupKind::Ep), devs, node, others(GroupKind::Ep, group * lay_.etp * lay_.ep)};
  return model_.alltoallv(bytes, where, algo, dedup);
}

const std::vector<int>& StageNetwork::others(GroupKind g, int local) {
  const int gi = static_cast<int>(g);
  const int own = lay_.group_index(g, local);
  auto& out = others_[gi];
  if (others_key_[gi] == std::pair{stage_ + 1, own}) return out;  // stage_ + 1: the zero key is "none yet"
  others_key_[gi] = {stage_ + 1, own};
  out.clear();
  std::vector<char> seen(static_cast<std::size_t>(lay_.block), 0);
  for (int l = 0; l < lay_.block; ++l) {
    if (seen[static_cast<std::size_t>(l)]) continue;
    const auto m = lay_.members(g, l);
    for (int x : m) seen[static_cast<std::size_t>(x)] = 1;
    if (*std::min_element(m.begin(), m.end()) == own) continue;
    for (int x : m) out.push_back(stage_ * lay_.block + x);
  }
  return out;
}

void StageNetwork::note(GroupKind g, Collective kind, const CollectiveCost& c, double bytes, int size, int count) {
  if (count <= 0) return;
  const std::string algorithm = topologies::describe_algorithm(c);
  const std::string key = std::string(group_name(g)) + "|" + topologies::collective_name(kind) + "|" + algorithm + "|" +
                          std::to_string(static_cast<long long>(bytes));
  auto it = index_.find(key);
  if (it == index_.end()) {
    index_[key] = uses_.size();
    uses_.push_back(
        CollectiveUse{group_name(g), topologies::collective_name(kind), algorithm, size, bytes, c.time.value(), count});
  } else {
    uses_[it->second].count_per_step += count;
  }
}

}  // namespace moesim::strategies::lowering
