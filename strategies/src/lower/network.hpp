#pragma once
// The groups of one pipeline stage as the network sees them: their shapes (servers spanned,
// links) and devices, the network model that times their collectives, and the record of every
// collective lowered ("where the bytes go").

#include <array>
#include <map>
#include <string>
#include <vector>

#include "moesim/topologies/collective_model.hpp"
#include "program.hpp"

namespace moesim::strategies {

/// Group shapes keyed by (group kind, layout, position of the stage's block in the fabric):
/// shared by every plan a search evaluates (routes are the expensive part).
struct ShapeCache {
  std::map<std::array<int, 8>, topologies::GroupShape> shapes;
};

namespace lowering {

class StageNetwork {
 public:
  /// `cache` (may be null) shares group shapes across plans; `model` times the collectives.
  StageNetwork(const topologies::Topology& topo, const Layout& lay, topologies::CollectiveModel& model,
               ShapeCache* cache, AllToAllAlgo alltoall, int top_k);

  /// The groups of `stage` (every collective until the next call is on that stage's groups).
  void set_stage(int stage);
  [[nodiscard]] const topologies::GroupShape& shape(GroupKind g) const { return shape_[static_cast<int>(g)]; }
  [[nodiscard]] topologies::Algorithm a2a_algorithm() const;
  [[nodiscard]] const topologies::Topology& topology() const { return topo_; }

  /// A collective on the current stage's group `g` as a program step (duration 0 for a group
  /// of one or no bytes); recorded `count` times per step in the uses when count > 0. `cost`
  /// (may be null) receives the collective's cost (its phases).
  Step step(GroupKind g, topologies::Collective kind, double bytes, sim::Category cat, Stream stream, sim::LabelId label,
            int count, double dedup = 1.0, topologies::CollectiveCost* cost = nullptr);
  /// All-to-all with per-pair volumes on expert-parallel group `group` of the current stage.
  topologies::CollectiveCost ep_alltoallv(const std::vector<std::vector<double>>& bytes, int group,
                                          topologies::Algorithm algo, double dedup);

  /// Collectives recorded so far, in order of first use.
  std::vector<CollectiveUse>& uses() { return uses_; }
  void clear_uses() {
    uses_.clear();
    index_.clear();
  }

 private:
  void note(GroupKind g, topologies::Collective kind, const topologies::CollectiveCost& c, double bytes, int size,
            int count);
  /// The current stage's groups of kind `g` other than the one holding `local`, member by
  /// member (the flow model puts their bytes on the links they use).
  const std::vector<int>& others(GroupKind g, int local);
  const topologies::Topology& topo_;
  Layout lay_;
  topologies::CollectiveModel& model_;
  ShapeCache* cache_;
  AllToAllAlgo alltoall_;
  int top_k_;
  int stage_ = 0;
  std::array<topologies::GroupShape, kNumGroupKinds> shape_{};
  std::array<std::vector<int>, kNumGroupKinds> devices_;  ///< current stage, the group of local 0
  std::array<std::pair<int, int>, kNumGroupKinds> others_key_{};  ///< (stage, group) of others_[g]
  std::array<std::vector<int>, kNumGroupKinds> others_;
  std::map<std::string, std::size_t> index_;
  std::vector<CollectiveUse> uses_;
};

}  // namespace lowering
}  // namespace moesim::strategies
