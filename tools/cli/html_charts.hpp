#pragma once
// The HTML report's data charts (memory, expert load, scaling, pipeline schedule, critical
// path), each an inline <svg> with an id, axis labels with units and a legend where colours
// carry meaning. html_report.cpp lays them out in sections with a caption under each.

#include <array>
#include <string>

#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/search/capacity.hpp"

namespace moesim::tools::html {

/// Memory parts in stacking order (CSS classes m0, m1, ...).
struct MemPart {
  const char* label;
  const char* color;
  double (*value)(const strategies::MemoryBreakdown&);
};
inline const std::array<MemPart, 5> kMemParts{{
    {"weights", "#4e79a7", [](const strategies::MemoryBreakdown& m) { return m.weights_bytes; }},
    {"gradients", "#f28e2b", [](const strategies::MemoryBreakdown& m) { return m.gradients_bytes; }},
    {"optimizer states", "#59a14f", [](const strategies::MemoryBreakdown& m) { return m.optimizer_bytes; }},
    {"activations", "#e15759", [](const strategies::MemoryBreakdown& m) { return m.activations_bytes; }},
    {"buffers and runtime reserve", "#bab0ac",
     [](const strategies::MemoryBreakdown& m) { return m.transient_bytes + m.reserved_bytes; }},
}};

/// Memory per pipeline stage, stacked by part, against the device capacity.
std::string chart_memory(const strategies::Result& r);
/// Whether every expert-parallel rank gets the same share of every MoE layer (nothing to draw).
bool expert_load_balanced(const strategies::ExpertLoad& el);
/// Token copies per (MoE layer, expert-parallel rank) relative to the mean.
std::string chart_expert_load(const strategies::ExpertLoad& el);
/// Tokens/s (log-log, with ideal linear scaling from the smallest size) and MFU against devices.
std::string chart_scaling(const strategies::CapacityReport& cap);
/// The pipeline schedule as run: per stage (its first simulated rank), the forward and backward
/// passes of each micro-batch in time, numbered; at most `max_stages` stages.
std::string chart_schedule(const strategies::Simulation& sim, int max_stages);
/// The critical path's time by category (a bar of shares of the step) and by stage.
std::string chart_critical_path(const strategies::CriticalPath& c);

}  // namespace moesim::tools::html
