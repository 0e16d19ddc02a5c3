#pragma once
// The search screen: an estimate of one plan without the event engine, from the same layer
// programs, collective and memory models as the simulation.
//
//   Estimator est(base_scenario, topology, workload);   // one per thread: it caches
//   PlanEstimate e = est.estimate(plan);                 // plan valid for the scenario

#include <memory>

#include "moesim/models/workload.hpp"
#include "moesim/strategies/plan/plan.hpp"
#include "moesim/topologies/topology.hpp"

namespace moesim::strategies {

/// A fast estimate of one plan from the same operator, collective and memory models, without
/// the event engine: each layer's forward and backward programs are timed alone (streams in
/// order), stages are summed, the pipeline is the slowest stage times the micro-batches plus the
/// fill and drain of the others (divided by the virtual stages), and the data-parallel traffic
/// is exposed beyond the backward (or forward) it overlaps. Used to screen plans in a search.
struct PlanEstimate {
  double step_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double peak_memory_bytes = 0;  ///< worst stage
  double capacity_bytes = 0;
  bool fits = true;
  double compute_s = 0;          ///< per micro-batch work of the slowest stage times m
  double exposed_comm_s = 0;     ///< tp / cp / ep communication not hidden in the layers
  double bubble_s = 0;
  double dp_exposed_s = 0;
  const char* bottleneck = "compute";  ///< the largest non-compute part, or "compute"
  bool replayed = false;         ///< the pipeline replayed pass by pass, not the closed form
  double swap_exposed_s = 0;     ///< swapped optimizer states fetched after the pipeline
  /// The swapping estimated: the plan's own, or with `least_swap` the least that fits.
  double swap_activations = 0;
  bool swap_optimizer = false;
  bool offload_weights = false;  ///< and then the gradients sharded (apply_offload)
};

/// Weights offloaded (or not) as a plan needs them: with the gradients sharded as produced.
void apply_offload(Plan& p, bool offload_weights);

struct EstimatorCache;  ///< shapes and per-layer costs shared by the plans one thread screens

class Estimator {
 public:
  Estimator(const Scenario& base, const topologies::Topology& topo, const models::Workload& w);
  ~Estimator();
  Estimator(const Estimator&) = delete;
  Estimator& operator=(const Estimator&) = delete;
  /// `plan` must be valid for the scenario (validate_plan or plan_is_valid). `replay`: the
  /// pipeline replayed pass by pass through the schedule's orders (per-chunk costs, the
  /// emitter's forward-backward pairs; ~50x the closed form's cost) instead of the closed-form
  /// fill and drain. `least_swap`: a plan over memory is estimated with the least swapping to
  /// host memory that fits (activations in quarters, then the optimizer states too, then the
  /// weights; the estimate says which), the host copies charged.
  PlanEstimate estimate(const Plan& plan, bool replay = false, bool least_swap = false);

 private:
  const Scenario& base_;
  const topologies::Topology& topo_;
  const models::Workload& w_;
  std::unique_ptr<EstimatorCache> cache_;
};
}  // namespace moesim::strategies
