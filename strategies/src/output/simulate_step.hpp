#pragma once
// Inside `simulate`: one step simulated and summarised, the per-rank time accounting, and the
// straggler runs built on them (stragglers.cpp).

#include <vector>

#include "moesim/strategies/output/simulate.hpp"

namespace moesim::strategies {

/// Where one simulated rank's step went.
struct RankTimes {
  Breakdown b;  // seconds
  double comm_total = 0;
  double comm_hidden = 0;
};

/// `owner[res]`: the simulated rank whose stream `res` is (-1 for links).
RankTimes rank_times(const sim::TaskGraph& g, const sim::RunResult& run, const SimRank& r, int self,
                     const std::vector<int>& owner, Tick makespan);

/// One step of the scenario as it is (its stragglers' step_index included).
Simulation simulate_step(const Scenario& s, const CancelFlag* cancel, bool memory_detail);

/// Every step the stragglers ask for; the one nearest the mean is reported, with the hit
/// against the same step with nothing slow and what each gating device holds back.
Simulation simulate_stragglers(const Scenario& s, const CancelFlag* cancel, bool memory_detail);

}  // namespace moesim::strategies
