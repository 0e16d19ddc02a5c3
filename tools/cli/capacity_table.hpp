#pragma once
// The text table printed by `moesim plan`: one row per cluster size with its best plan, tokens/s,
// MFU, days and device-hours, then the answer.
//
//   CapacityReport r = plan_capacity(scenario, opt);
//   std::cout << tools::format_capacity_table(r, scenario);

#include <string>

#include "moesim/strategies/search/capacity.hpp"

namespace moesim::tools {

std::string format_capacity_table(const strategies::CapacityReport& r, const strategies::Scenario& s);
/// "30.0-day", or "12.0-hour" below two days.
std::string format_deadline(double seconds);
/// One line describing a size's result: "12,288 devices, TP8 PP8 ...: 26.3 days, 7.8M device-hours".
std::string describe_capacity_point(const strategies::CapacityPoint& p, const strategies::Scenario& s);

}  // namespace moesim::tools
