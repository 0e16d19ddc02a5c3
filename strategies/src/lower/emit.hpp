#pragma once
// Emission: the stages' operator programs, instantiated for every simulated rank in the order
// of the pipeline schedule, become the task graph of one training step — passes, pipeline
// sends, gradient reduction and parameter gathers in buckets, swapping, host dispatch, the
// optimizer step and expert migration.

#include <utility>
#include <vector>

#include "documents.hpp"
#include "moe.hpp"
#include "moesim/sim/cancel.hpp"
#include "moesim/strategies/plan/schedule.hpp"
#include "network.hpp"
#include "program.hpp"
#include "stragglers.hpp"

namespace moesim::strategies::lowering {

/// Per stage and chunk: the pass programs and what the emission needs to know about them.
struct StagePrograms {
  std::vector<std::vector<Program>> fwd, bwd, wgt;  ///< wgt: W passes (zero-bubble schedules)
  std::vector<std::vector<Program>> bwd_full;       ///< unsplit backward (B and W), for F&B pairs
  std::vector<std::vector<double>> act;             ///< saved activations, one micro-batch
  /// [stage][chunk][item]: (dense, expert) parameters, for the per-item gradient buckets.
  std::vector<std::vector<std::vector<std::pair<double, double>>>> item_params;
  void resize(int pp, int vpp);
};

/// Which ranks of every stage are simulated (positions 0 .. locals.size() - 1 in each stage).
struct SimulatedRanks {
  std::vector<int> locals;        ///< stage-local index of each simulated position
  std::vector<int> pos_of_local;  ///< stage-local index -> position (-1: not simulated)
  bool skewed = false;            ///< routing makes the ranks of an expert-parallel group differ
};

struct EmitInputs {
  const Scenario& scenario;
  const Plan& plan;
  const Layout& layout;
  const topologies::Topology& topo;
  const models::Workload& workload;
  const models::ComputeModel& cm;
  const SimulatedRanks& simulated;
  const std::vector<SimRank>& ranks;
  const std::vector<StageInfo>& stages;
  const std::vector<StageOrder>& schedule;
  const std::vector<double>& p2p_seconds;  ///< per virtual stage boundary
  const DocumentWork* documents;           ///< packed documents (null: whole sequences)
  MoeRouting* routing;                     ///< skewed routing (null: balanced)
  StageNetwork& net;
  const CancelFlag* cancel;
  const StragglerMap* stragglers = nullptr;  ///< slow devices and NICs this step (null: none)
};

struct EmitResult {
  double optimizer_seconds = 0;  ///< the slowest stage's optimizer step
  double migration_seconds = 0;  ///< expert migration per step, worst stage
};

/// Adds the step's tasks to `builder`. At fast fidelity each pass of `programs` is first merged
/// into one step per stream (so `programs` is modified).
EmitResult emit_step(const EmitInputs& in, StagePrograms& programs, sim::TaskGraphBuilder& builder);

}  // namespace moesim::strategies::lowering
