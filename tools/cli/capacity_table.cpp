#include "capacity_table.hpp"

#include <fmt/format.h>

#include "report.hpp"

namespace moesim::tools {
namespace {

/// A checkpoint interval for a narrow column: seconds below two minutes, else minutes or hours.
std::string interval_text(double s) {
  if (s < 120) return fmt::format("{:.0f}s", s);
  if (s < 7200) return fmt::format("{:.0f}min", s / 60);
  return fmt::format("{:.1f}h", s / 3600);
}

}  // namespace

std::string format_deadline(double seconds) {
  if (seconds < 2 * strategies::kSecondsPerDay) return fmt::format("{:.1f}-hour", seconds / 3600);
  return fmt::format("{:.1f}-day", seconds / strategies::kSecondsPerDay);
}

std::string describe_capacity_point(const strategies::CapacityPoint& p, const strategies::Scenario& s) {
  if (!p.feasible) return fmt::format("{} devices: {}", p.devices, p.reason);
  std::string goodput;
  if (p.reliability)
    goodput = fmt::format(" at {:.1f}% goodput ({:.1f} without failures; {:.0f} interruptions expected, a checkpoint every "
                          "{})",
                          100 * p.goodput.goodput, p.days_failure_free, p.goodput.failures, interval_text(p.goodput.interval_s));
  return fmt::format("{} devices ({}): {} tokens/s, MFU {:.1f}%, {:.1f} days{}, {} device-hours", p.devices,
                     short_plan(p.best.plan, s.model), human_count(p.tokens_per_s), 100 * p.mfu, p.days, goodput,
                     human_count(p.device_hours));
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
  const bool rel = r.reliability.enabled;
  o += fmt::format("  {:>7} {:>6}  {:<48} {:>10} {:>6} {:>8}{} {:>8} {:>13}{}\n", "devices", "batch", "best plan", "tokens/s",
                   "MFU", "step s", rel ? fmt::format(" {:>8} {:>8} {:>8}", "no-fail", "goodput", "ckpt") : std::string(),
                   "days", "device-hours", r.deadline_s > 0 ? "  deadline" : "");
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    const auto& p = r.points[i];
    if (!p.feasible) {
      o += fmt::format("  {:>7} {:>6}  {}\n", p.devices, p.global_batch_size, p.reason);
      continue;
    }
    const std::string goodput =
        rel ? fmt::format(" {:>8.1f} {:>7.1f}% {:>8}", p.days_failure_free, 100 * p.goodput.goodput, interval_text(p.goodput.interval_s))
            : std::string();
    o += fmt::format("  {:>7} {:>6}  {:<48} {:>10.0f} {:>5.1f}% {:>8.3f}{} {:>8.1f} {:>13.0f}{}\n", p.devices,
                     p.global_batch_size, short_plan(p.best.plan, s.model), p.tokens_per_s, 100 * p.mfu,
                     p.best.step_time_s, goodput, p.days, p.device_hours,
                     r.deadline_s <= 0 ? "" : p.meets_deadline ? (r.answer && *r.answer == i ? "  meets  <-" : "  meets")
                                                               : "  misses");
  }
  o += "\n";
  if (rel) {
    const auto& rl = r.reliability;
    o += fmt::format("  failures and checkpoints ({}): days and device-hours at the expected goodput; no-fail: days\n"
                     "  without failures; ckpt: the checkpoint interval that maximises goodput (simulated, {} runs each)\n",
                     rl.name, strategies::GoodputInputs{}.trials);
    o += fmt::format("    device MTBF {:.0f} h, server MTBF {:.0f} h; checkpoint {:.2f} TB (weights and optimizer states), {}; "
                     "storage {:.0f} GB/s write, {:.0f} GB/s read; restart {:.0f} min\n",
                     rl.device_mtbf_s / 3600, rl.node_mtbf_s / 3600, r.checkpoint_bytes / 1e12,
                     rl.checkpoint_async ? "to host memory, then to storage" : "written to storage while training waits",
                     rl.storage_write_bandwidth / 1e9, rl.storage_read_bandwidth / 1e9, rl.restart_s / 60);
    for (const auto& [k, src] : rl.sources) o += fmt::format("    {}: {}\n", k, src);
    o += "\n";
  }
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
