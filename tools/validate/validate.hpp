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
// Fit / held-out split (fixed): cases whose numeric id is even are the fitting half, odd ones
// are held out.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/sim/cancel.hpp"
#include "moesim/strategies/plan/plan.hpp"

namespace moesim::tools {

struct CaseOutcome {
  std::string id;
  std::string category;
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
  ErrorStats all, fit, held_out;
  std::vector<std::pair<std::string, ErrorStats>> by_category;
  std::vector<std::pair<std::string, ErrorStats>> by_device;
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

ValidationReport validate(const nlohmann::json& cases, const std::string& file, const ValidateOptions& opt);
std::string to_markdown(const ValidationReport& r);
nlohmann::json to_json(const ValidationReport& r);

}  // namespace moesim::tools
