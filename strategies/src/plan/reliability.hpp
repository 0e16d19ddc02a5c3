#pragma once
// The scenario's sections for clusters that are not ideal: `simulation.stragglers` (slow
// devices and NICs, host jitter) and `reliability` (failures and checkpoints), read into the
// Scenario with every problem reported.

#include <nlohmann/json.hpp>

#include "moesim/sim/config.hpp"
#include "moesim/strategies/plan/plan.hpp"

namespace moesim::strategies {

/// simulation.stragglers (see Stragglers).
void parse_stragglers(const nlohmann::json& j, Scenario& s, Diagnostics& diag);

/// The reliability section: a preset name, an object (with an optional "preset" whose values it
/// overrides), or "none"; absent (null): the default preset.
void parse_reliability(const nlohmann::json* spec, Scenario& s, Diagnostics& diag);

}  // namespace moesim::strategies
