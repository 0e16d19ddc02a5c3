#pragma once
// The HTML report's "Stragglers and failures" section: the step-time distribution of a
// straggler run, which device gates which collectives, and goodput against the checkpoint
// interval of the capacity plan.

#include <string>

#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/search/capacity.hpp"

namespace moesim::tools {

/// The capacity point whose goodput the report draws: the answer, else the fastest (null: none
/// with failures modelled).
const strategies::CapacityPoint* reliability_point(const strategies::CapacityReport* cap);

/// The section (charts "chart-step-times" with stragglers, "chart-goodput" with a plan).
std::string section_reliability(const strategies::Result& r, const strategies::CapacityReport* cap);

}  // namespace moesim::tools
