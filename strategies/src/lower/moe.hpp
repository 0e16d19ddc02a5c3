#pragma once
// Routing and expert placement of MoE layers for the simulated expert-parallel groups: per
// (MoE layer, micro-batch, group) a draw of how many token copies each expert receives (from
// the routing's expert popularity, seeded), where each expert's copies are computed (static,
// a user's map, or load-aware re-placement with redundant experts), and what that does to the
// durations of expert GEMMs and all-to-alls. Draws are made on first use and cached.

#include <array>
#include <map>
#include <utility>
#include <vector>

#include "moesim/models/device.hpp"
#include "moesim/models/routing.hpp"
#include "network.hpp"
#include "program.hpp"

namespace moesim::strategies::lowering {

struct MoeInputs {
  const models::ModelSpec& model;
  const models::RoutingSpec& routing;
  const PlacementSpec& placement;
  std::uint64_t seed;
  int num_microbatches;
  bool distributed_optimizer;
  double adam_state_bytes;  ///< per parameter of an optimizer shard (adam_state_bytes_per_param)
  models::Precision precision;
};

class MoeRouting {
 public:
  MoeRouting(const MoeInputs& in, const Layout& lay, const Tokens& tok, const models::ComputeModel& cm,
             StageNetwork& net)
      : in_(in), lay_(lay), tok_(tok), cm_(cm), net_(net) {}

  /// One MoE layer, one micro-batch, one expert-parallel group.
  struct Draw {
    std::vector<std::vector<double>> copies;  ///< [ep rank][local expert] token copies (after drops)
    std::vector<double> recv;                 ///< [ep rank] copies
    Tick to_experts = 0, from_experts = 0;    ///< all-to-all durations
    double dropped = 0, total = 0, total_kept = 0;
  };
  /// Where each expert's copies are computed: per expert, (EP rank, share of its copies).
  struct Placement {
    std::vector<std::vector<std::pair<int, double>>> where;
    int moved = 0;               ///< experts (replicas) whose rank differs from the static placement
    std::vector<int> moved_in;   ///< per EP rank: replicas it has to fetch
  };

  /// The draw of (layer, micro-batch, group); its all-to-alls are timed on the network's
  /// current stage when first drawn.
  const Draw& draw(int moe_layer, int mb, int group);
  const Placement& placement(int moe_layer);
  /// A routing-dependent step's duration on the rank with stage-local index `local`.
  Tick routed_duration(const Step& st, int mb, int local);
  /// Load statistics over every MoE layer and micro-batch (draws of the first group when
  /// `skewed`, the balanced share otherwise).
  ExpertLoad expert_load(const std::vector<models::PipelineItem>& items, bool skewed);
  /// Seconds per step one rank of a stage holding `chunk_items` spends fetching migrated experts
  /// (weights and optimizer shard), the re-placement every interval_steps amortised over them.
  double migration_seconds(const std::vector<std::vector<int>>& chunk_items,
                           const std::vector<models::PipelineItem>& items) const;

 private:
  std::vector<double> predicted_load(int moe_layer) const;
  MoeInputs in_;
  Layout lay_;
  Tokens tok_;
  const models::ComputeModel& cm_;
  StageNetwork& net_;
  std::map<std::array<int, 3>, Draw> draws_;
  std::map<int, std::vector<double>> popularity_;  ///< per MoE layer
  std::map<int, Placement> placement_;             ///< per MoE layer
};

}  // namespace moesim::strategies::lowering
