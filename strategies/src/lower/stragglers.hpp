#pragma once
// Stragglers made concrete for one step: which devices are slow (and by how much), whose NICs
// are slow, every device's host jitter — all drawn from the scenario's seed — and which ranks
// the simulation must therefore follow.
//
// The step waits for its slowest path: devices coupled by a tensor-, context- or
// expert-parallel group at one stage run in lockstep (each collective waits for its last
// member), and the same positions at every stage form a pipeline column; columns meet only in
// the data-parallel reduction at the end of the step. So the step is gated by the column whose
// stages are slowed most, and simulating that column is enough: at each of its slowed stages
// the gating device itself, plus one device that is slow nowhere (standing for the others),
// with every collective of a group shared between its simulated members — a collective starts
// when its slowest simulated member arrives, as it does when the unsimulated members are like
// the clean one. The clean device's waits become `imbalance_wait`.

#include <vector>

#include "program.hpp"

namespace moesim::strategies::lowering {

struct StragglerMap : StragglerInfo {
  std::vector<double> compute;  ///< per device: kernel-time factor (>= 1)
  std::vector<double> nic;      ///< per device: NIC bandwidth share (<= 1)
  std::vector<int> locals;      ///< positions to simulate in every stage (sorted)
  /// [stage][position]: devices each simulated rank stands for.
  std::vector<std::vector<double>> weight;
};

/// The stragglers of step `step` for a plan laid out as `lay` on `pp` stages. `within`: only
/// columns containing that position may be chosen (-1: any).
[[nodiscard]] StragglerMap realise_stragglers(const Scenario& s, const Layout& lay, int pp, int step, int within = -1);

}  // namespace moesim::strategies::lowering
