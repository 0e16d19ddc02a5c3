#include "capacity_table.hpp"

#include <fmt/format.h>

#include "report.hpp"

namespace moesim::tools {
namespace {


}  // namespace

std::string format_deadline(double seconds) {
  if (seconds < 2 * strategies::kSecondsPerDay) return fmt::format("{:.1f}-hour", seconds / 3600);
  return fmt::format("{:.1f}-day", seconds / strategies::kSecondsPerDay);
}

std::string describe_capacity_point(const strategies::CapacityPoint& p, const strategies::Scenario& s) {
  if (!p.feasible) return fmt::format("{} devices: {}", p.devices, p.reason);
  return fmt::format("{} devices ({}): {} tokens/s, MFU {:.1f}%, {:.1f} days, {} device-hours", p.devices,
                     short_plan(p.best.plan, s.model), human_count(p.tokens_per_s), 100 * p.mfu, p.days, human_count(p.device_hours));
}

std::string format_capacity_table(const strategies::CapacityReport& r, const strategies::Scenario& s) {
  std::string o;
  o += fmt::format("moesim {} plan: {} on {} ({}), seq {}, global batch {}, {}\n", strategies::kVersion, s.model_name,
                   s.cluster.device.name, s.cluster.name, s.training.seq_length,
                   r.batch == strategies::BatchScaling::Fixed ? fmt::format("{} (fixed)", s.training.global_batch_size)
                                                              : std::string("scaled with the devices"),
                   models::precision_name(s.training.precision));
  o += fmt::format("budget {} tokens{}; {} cluster size{}, best plan of a search at each\n\n", human_count(r.train_tokens),
                   r.deadline_s > 0 ? fmt::format(", {} deadline", format_deadline(r.deadline_s)) : std::string(),
                   r.points.size(), r.points.size() == 1 ? "" : "s");
  o += fmt::format("  {:>7} {:>6}  {:<48} {:>10} {:>6} {:>8} {:>8} {:>13}{}\n", "devices", "batch", "best plan", "tokens/s",
                   "MFU", "step s", "days", "device-hours", r.deadline_s > 0 ? "  deadline" : "");
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    const auto& p = r.points[i];
    if (!p.feasible) {
      o += fmt::format("  {:>7} {:>6}  {}\n", p.devices, p.global_batch_size, p.reason);
      continue;
    }
    o += fmt::format("  {:>7} {:>6}  {:<48} {:>10.0f} {:>5.1f}% {:>8.3f} {:>8.1f} {:>13.0f}{}\n", p.devices,
                     p.global_batch_size, short_plan(p.best.plan, s.model), p.tokens_per_s, 100 * p.mfu,
                     p.best.step_time_s, p.days, p.device_hours,
                     r.deadline_s <= 0 ? "" : p.meets_deadline ? (r.answer && *r.answer == i ? "  meets  <-" : "  meets")
                                                               : "  misses");
  }
  o += "\n";
  if (r.deadline_s > 0) {
    if (r.answer) {
      o += "  smallest cluster meeting the deadline: " + describe_capacity_point(r.points[*r.answer], s) + "\n";
      if (*r.answer == 0)
        o += "  (the smallest candidate already meets it; smaller sizes were not tried: widen --devices)\n";
    } else if (r.fastest) {
      o += fmt::format("  INFEASIBLE: no candidate size meets the {} deadline\n", format_deadline(r.deadline_s));
      o += "  fastest: " + describe_capacity_point(r.points[*r.fastest], s) + "\n";
      o += "  (try larger sizes with --devices, --batch proportional, or a longer --deadline)\n";
    } else {
      o += "  INFEASIBLE: no candidate size has a plan that fits\n";
    }
  } else if (r.fastest) {
    o += "  fastest: " + describe_capacity_point(r.points[*r.fastest], s) + "\n";
    if (r.cheapest) o += "  fewest device-hours: " + describe_capacity_point(r.points[*r.cheapest], s) + "\n";
  } else {
    o += "  no candidate size has a plan that fits\n";
  }
  return o;
}

}  // namespace moesim::tools
