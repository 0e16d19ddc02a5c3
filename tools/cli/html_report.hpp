#pragma once
// A self-contained HTML report of one scenario (`moesim report`): summary, best plans, step-time
// breakdown, a timeline of one step, memory per stage, expert load, scaling with the cluster
// size and the capacity-planning answer. Charts are inline SVG styled by inline CSS — no
// script, no network, no external fonts — and the output is a pure function of its inputs
// (no wall times unless `wall_time_note` is set), so the same scenario and seed give the same
// bytes.
//
//   HtmlReportInput in{.scenario = &s, .sim = &sim, .search = &rep, .capacity = &cap};
//   std::ofstream("report.html") << render_html_report(in);

#include <string>
#include <string_view>
#include <vector>

#include "moesim/strategies/search/capacity.hpp"
#include "moesim/strategies/search/model_search.hpp"
#include "moesim/strategies/search/search.hpp"
#include "moesim/strategies/output/simulate.hpp"

namespace moesim::tools {

struct HtmlReportInput {
  const strategies::Scenario* scenario = nullptr;      ///< required
  const strategies::Simulation* sim = nullptr;         ///< the scenario's plan, simulated (required)
  const strategies::SearchReport* search = nullptr;    ///< best plans; null: section says it was skipped
  const strategies::CapacityReport* capacity = nullptr;  ///< scaling chart and capacity answer; null: skipped
  /// The scenario's model_search candidates (table and chart); null: no such section.
  const strategies::ModelSearchReport* models = nullptr;
  int top = 5;                   ///< plans in the best-plans table and the breakdown chart
  int timeline_max_rows = 32;    ///< simulated ranks drawn in the timeline (one per stage first)
  int timeline_bins = 960;       ///< time columns of the timeline (tasks are binned, then run-length merged)
  std::string wall_time_note;    ///< printed in the footer when not empty (non-deterministic)
};

/// Text escaped for HTML element content and attribute values (& < > " ').
std::string html_escape(std::string_view text);

/// The ids of the charts' <svg> elements a report for this scenario contains, in page order
/// (the expert-load heatmap only for MoE models, the scaling chart only with a capacity report).
std::vector<std::string> report_chart_ids(const HtmlReportInput& in);

/// The whole page.
std::string render_html_report(const HtmlReportInput& in);

}  // namespace moesim::tools
