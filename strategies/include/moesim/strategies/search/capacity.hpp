#pragma once
// Capacity planning: how many devices does a training run need? For each candidate cluster size
// the strategy search runs on the scenario's model, device, cluster preset and training settings
// at that size; the best plan's tokens/s gives the time to train a token budget (days) and its
// cost (device-hours), and the answer is the smallest size that meets a deadline.
//
//   Scenario s = load_scenario_file("scenarios/pangu-ultra-moe-718b.json", {});
//   CapacityOptions opt{.train_tokens = 10e12, .deadline_s = 30 * 86400.0};
//   CapacityReport r = plan_capacity(s, opt);    // r.answer: index of the smallest size in time
//
// Candidate sizes (when none are given): a doubling ladder through the scenario's device count,
// D/4 ... 8D (6 sizes), keeping the multiples of a server between one server and 131,072 devices.
// The global batch stays the scenario's (`BatchScaling::Fixed`, default) or grows with the
// devices (`Proportional`: batch x N / D, rounded to a whole number of sequences); the token
// budget is the same either way (convergence per token is not modelled). Every plan a size's
// search ranks is divisible at that size (TP x PP x CP x DP = devices, batch by DP x mbs), so
// a size with no dividing plan, or none that fits in memory, is reported with the reason.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/search/goodput.hpp"
#include "moesim/strategies/search/search.hpp"

namespace moesim::strategies {

inline constexpr double kSecondsPerDay = 86400.0;
inline constexpr int kMaxCapacityDevices = 131072;

/// "10T", "500B", "2.5M", "1.5e12", "8000000": a token count (T = 1e12, B or G = 1e9, M = 1e6,
/// k or K = 1e3). nullopt when the text is not a positive count.
std::optional<double> parse_token_count(std::string_view text);
/// "30d", "720h", "90m" (or "90min"), "3600s", "2w": a duration in seconds. A unit is required
/// (a bare "30" is refused: days or hours?). nullopt when the text is not a positive duration.
std::optional<double> parse_duration_s(std::string_view text);
/// Device counts: "6144", a list "2048,4096,6144", a doubling range "2048:16384", or a range
/// with a step "2048:16384:2048". Throws ConfigError (file "--devices") naming the value and the
/// constraint: positive counts, at most kMaxCapacityDevices, at most 64 sizes, start <= end.
std::vector<int> parse_device_counts(std::string_view text);

enum class BatchScaling : std::uint8_t { Fixed, Proportional };

struct CapacityOptions {
  double train_tokens = 0;    ///< token budget (required, > 0)
  double deadline_s = 0;      ///< 0: no deadline (report the time for each size)
  std::vector<int> devices;   ///< candidate sizes; empty: default_capacity_sizes()
  BatchScaling batch = BatchScaling::Fixed;
  int threads = 0;            ///< search threads (0: all cores)
  int simulate_top = 0;       ///< plans event-simulated per size (0: the scenario's search top_k)
  /// A search already run on the scenario as given (same top_k): reused for that size.
  const SearchReport* known_search = nullptr;
  /// Polled by every size's search; raised, planning stops with Cancelled.
  const CancelFlag* cancel = nullptr;
  /// Progress of each size's search, as SearchOptions::progress with the phase prefixed by
  /// "size i of n (D devices): ".
  std::function<void(const char* phase, std::size_t done, std::size_t total)> progress;
};

/// One cluster size and the best plan found for it.
struct CapacityPoint {
  int devices = 0;
  std::int64_t global_batch_size = 0;
  bool feasible = false;       ///< a plan divides and fits in memory
  std::string reason;          ///< why not, when !feasible
  RankedPlan best;             ///< valid when feasible
  std::size_t plans_valid = 0, plans_fit_estimate = 0, plans_simulated = 0;
  // Derived by evaluate_capacity():
  double tokens_per_s = 0;
  double tokens_per_s_per_device = 0;
  double mfu = 0;
  double train_s = 0;          ///< train_tokens / tokens_per_s: without failures
  double days = 0;             ///< wall_s / 86400
  double device_hours = 0;     ///< devices x wall_s / 3600
  bool meets_deadline = false;  ///< by wall_s
  /// Failures and checkpoints (set by plan_capacity from the scenario's reliability section;
  /// absent: none), and what they make of train_s.
  std::optional<GoodputInputs> reliability;
  GoodputResult goodput;        ///< goodput 1 without failures
  double wall_s = 0;            ///< expected wall time: train_s / goodput
  double days_failure_free = 0;
  double device_hours_failure_free = 0;
};

struct CapacityReport {
  Reliability reliability;     ///< the assumptions behind every point's goodput
  double checkpoint_bytes = 0;
  double train_tokens = 0;
  double deadline_s = 0;
  BatchScaling batch = BatchScaling::Fixed;
  std::vector<CapacityPoint> points;  ///< ascending device count
  std::optional<std::size_t> answer;    ///< smallest size meeting the deadline (deadline given)
  std::optional<std::size_t> fastest;   ///< shortest time to train
  std::optional<std::size_t> cheapest;  ///< fewest device-hours
  /// The deadline was given and no candidate meets it (the CLI exits 3 and shows `fastest`).
  [[nodiscard]] bool deadline_unreachable() const { return deadline_s > 0 && !answer.has_value(); }
};

/// The default candidate sizes for a scenario: D x 2^k for k = -2..3, multiples of a server,
/// between one server and kMaxCapacityDevices.
std::vector<int> default_capacity_sizes(const Scenario& s);

/// The scenario at another cluster size: devices (and, when proportional, the global batch)
/// changed in the specs and the document; the plan is left for a search to replace.
Scenario scenario_at_size(const Scenario& base, int devices, BatchScaling batch);

/// Fills the derived fields of every point (time, days, device-hours, deadline) and the
/// answer, fastest and cheapest indices from each feasible point's best tokens/s. Pure.
void evaluate_capacity(CapacityReport& r);

/// Runs the search at every candidate size and evaluates. Throws ConfigError for bad options
/// (no token budget, a negative deadline, sizes out of range); a size whose search space has
/// no valid plan becomes an infeasible point with the search's message as the reason.
CapacityReport plan_capacity(const Scenario& base, const CapacityOptions& opt);

nlohmann::json to_json(const CapacityReport& r);

}  // namespace moesim::strategies
