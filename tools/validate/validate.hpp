#pragma once
// The validation harness: published (or your own) measured training runs against moesim.
//
//   nlohmann::json cases = ...;                       // calibration_cases.json format
//   ValidationReport rep = validate(cases, "cases.json", {});
//   std::cout << to_markdown(rep);                    // table + summary (MAPE, max, splits)
//
// Each case is turned into a scenario — model dimensions become an inline Hugging Face config,
// device text and count a cluster preset, the parallel layout, batch, sequence length,
// precision and recomputation the plan — and simulated. The published step time is derived by
// the case's own definition: a measured or derived iteration time, tokens per second, or
// TFLOP/s or MFU converted with the source's own FLOP formula. Every assumption the
// conversion makes is listed with the case; a case that cannot run is reported as skipped with
// the reason. A case may instead carry a ready moesim scenario under "scenario" together with
// "measured": {"step_time_s": ...} — the form to use for your own runs.
//
// Memory: a case may carry a measured peak per device, "measured": {"peak_memory_gib": ...} or
// {"peak_memory": ..., "unit": "GiB" | "GB"}. It is compared with what the framework allocates
// on the worst pipeline stage — moesim's peak without its runtime reserve, since PyTorch's
// allocator statistics do not see the CUDA context or NCCL's buffers that reserve stands for.
// A case with a measured peak and no step time still runs, for memory only.
//
// Fit / held-out split (fixed): cases whose id ends in an even digit are the fitting half, odd
// ones are held out. Cross-validation by source (crossval.hpp) is the stricter test.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/sim/cancel.hpp"
#include "moesim/strategies/plan/plan.hpp"

namespace moesim::tools {

struct CaseOutcome {
  std::string id;
  std::string file;    ///< the cases file it came from
  std::string category;
  std::string source;  ///< the publication it comes from: "source_group", else the category (cross-validation unit)
  std::string model;
  std::string device;
  int devices = 0;
  std::string plan;
  std::string status;  ///< "ok", "skipped", "error"
  std::string reason;  ///< why skipped / the error
  std::string basis;   ///< how the published step time was obtained
  double published_s = 0;
  double predicted_s = 0;
  double error_pct = 0;  ///< (predicted - published) / published x 100
  bool held_out = false;
  bool feasible = true;
  double mfu = 0;
  double bubble_fraction = 0;
  /// False for a memory-only case (a measured peak, no step time): its step-time fields are
  /// not compared and it is left out of the step-time statistics.
  bool timed = true;
  // Memory, for every case that ran: the worst pipeline stage per device.
  double predicted_peak_gib = 0;       ///< the stage's total, runtime reserve included
  double predicted_allocated_gib = 0;  ///< the measured stage (or the worst) without the reserve: what the framework allocates
  int memory_stage = 0;                ///< the pipeline stage predicted_allocated_gib belongs to
  double capacity_gib = 0;
  std::optional<double> measured_peak_gib;  ///< when the case carries one
  double memory_error_pct = 0;              ///< (allocated - measured) / measured x 100
  std::vector<std::string> assumptions;
  nlohmann::json scenario;  ///< the scenario that ran
};

struct ErrorStats {
  int n = 0;
  double mean_abs_pct = 0;
  double max_abs_pct = 0;
  std::string worst;
};

struct ValidationReport {
  std::string file;
  std::vector<CaseOutcome> cases;
  ErrorStats all, fit, held_out;  ///< step time, over the cases that ran with a published step time
  std::vector<std::pair<std::string, ErrorStats>> by_category;
  std::vector<std::pair<std::string, ErrorStats>> by_device;
  ErrorStats memory;  ///< memory error over the cases that ran with a measured peak
  /// Cases that ran and that moesim predicts not to fit in memory. Measured runs really ran,
  /// so each one is a false "does not fit".
  std::vector<std::string> predicted_not_to_fit;
  int ran = 0;  ///< cases with status "ok" (timed or memory-only)
  int skipped = 0;
  int errors = 0;
};

struct ValidateOptions {
  std::vector<std::string> only;       ///< case ids to run (empty: all)
  std::vector<std::string> overrides;  ///< --set applied to every scenario
  strategies::Fidelity fidelity = strategies::Fidelity::Balanced;
  bool progress = false;               ///< one line per case on stderr
  const CancelFlag* cancel = nullptr;  ///< polled by every case's simulation (Cancelled ends the run)
};

/// A case converted to a scenario, or the reason it cannot be.
struct ConvertedCase {
  nlohmann::json scenario;
  int devices = 0;
  std::vector<std::string> assumptions;
  std::string skip_reason;
};
ConvertedCase case_to_scenario(const nlohmann::json& c);

/// The published step time by the case's own definition, or a skip reason. Rates per device
/// are converted with `devices` (the simulated count; 0: the case's hardware.count).
struct PublishedTime {
  double step_s = 0;
  std::string basis;
  std::string skip_reason;
};
PublishedTime published_step_time(const nlohmann::json& c, int devices = 0);

/// One cases file: its path (for messages) and its parsed content.
struct CaseFile {
  std::string path;
  nlohmann::json cases;
};
ValidationReport validate(const nlohmann::json& cases, const std::string& file, const ValidateOptions& opt);
/// Several files at once (ids must be unique across them).
ValidationReport validate(const std::vector<CaseFile>& files, const ValidateOptions& opt);
/// The cross-validation unit of a case: its "source_group", else its "category".
std::string source_of(const nlohmann::json& c);
std::string to_markdown(const ValidationReport& r);
nlohmann::json to_json(const ValidationReport& r);

}  // namespace moesim::tools
