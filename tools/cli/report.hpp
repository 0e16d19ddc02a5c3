#pragma once
// Human-readable tables for the CLI.
//
//   std::cout << tools::format_result_table(sim.result, scenario, true);

#include <string>

#include "moesim/strategies/search/model_search.hpp"
#include "moesim/strategies/search/search.hpp"
#include "moesim/strategies/output/simulate.hpp"

namespace moesim::tools {

/// One line naming model, cluster and plan: "pangu-ultra-moe-718b on 6144 x ascend-910b2 ...".
std::string format_plan_line(const strategies::Scenario& s);
/// The result table printed by `moesim simulate`.
/// `critical` (may be null): the step's critical path, as "the step is gated by" under the breakdown.
std::string format_result_table(const strategies::Result& r, const strategies::Scenario& s, bool wall_time,
                                const strategies::CriticalPath* critical = nullptr);
/// The ranking printed by `moesim search`.
std::string format_search_table(const strategies::SearchReport& r, const strategies::Scenario& s, int top,
                                bool wall_time);
/// The candidates printed by `moesim search` on a scenario with a "model_search" section.
std::string format_model_search_table(const strategies::ModelSearchReport& r, const strategies::Scenario& s,
                                      bool wall_time);
/// A count with a unit prefix and no space: 1.46M, 10.00T, 950.
std::string human_count(double x);
/// A short plan description: "TP8 PP16 VPP2 EP4x(32) mbs2 selective ...".
std::string short_plan(const strategies::Plan& p, const models::ModelSpec& m);

}  // namespace moesim::tools
