#pragma once
// Leave-one-source-out cross-validation of the calibration: how well moesim predicts a
// publication it was not fitted to.
//
//   ValidationReport base = validate(files, opt);            // presets as they are
//   CrossValidation cv = cross_validate(base, fit_groups(), {.threads = 2});
//   cv.all.mean_abs_pct;                                     // the number the README reports
//
// Each fit group is one device preset and training precision with at most two
// physical parameters (GEMM efficiency, HBM or attention efficiency, host time per operator).
// Every case of a group is simulated on a small grid of its parameters (3 points for an
// efficiency, evenly spaced in 1/efficiency, where a compute-bound step time is linear; 4 for a
// host time); between grid points the step time is interpolated (bilinear). Then for every
// source (publication) and every group it has cases in, the group's parameters are fitted to
// the other sources' cases of the group (golden-section coordinate descent on the mean
// absolute error of the interpolated step times) and the held-out source's cases are
// predicted with them. A group without cases from another source predicts the held-out source
// with the parameters' prior values (the pre-fit estimates), never with values fitted on it.
// The same grid also gives the fit on all sources (the values a re-calibration would put in
// the presets).
//
// Error bands: for every cluster preset, the 68th percentile of the absolute leave-one-source-
// out errors of its cases ("typically within ±x%"), over all cases when a preset has fewer
// than 5.

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "validate.hpp"

namespace moesim::tools {

struct FitParam {
  std::string key;    ///< device preset key, e.g. "gemm_peak_efficiency", "hbm.efficiency", "host_op_time"
  double lo = 0, hi = 1;
  double prior = 0;   ///< the value before any fit (used when no other source has cases)
  bool inverse = true;  ///< grid and interpolation in 1/value (efficiencies); linear otherwise
  int points = 3;
};

struct FitGroup {
  std::string name;       ///< e.g. "h100-bf16"
  std::string device;     ///< device preset the cases run on (whatever the cluster)
  std::string precision;  ///< "bf16", "fp16", "fp8"; empty: any
  std::vector<FitParam> params;
};

/// The groups moesim is calibrated with (one or two physical parameters per device and
/// precision); bench/validation/README.md lists them with the evidence for each.
std::vector<FitGroup> fit_groups();

struct CrossValidationOptions {
  int threads = 2;
  bool progress = false;               ///< grid progress on stderr
  const CancelFlag* cancel = nullptr;
};

struct CrossValidatedCase {
  std::string id, source, cluster, group;  ///< group: empty when no fit group covers the case
  double published_s = 0;
  double preset_s = 0;      ///< with the presets as they are
  double loso_s = 0;        ///< with parameters fitted on the other sources
  double loso_error_pct = 0;
  double preset_error_pct = 0;
};

struct CrossValidation {
  std::vector<CrossValidatedCase> cases;
  ErrorStats all;                                          ///< leave-one-source-out, over every timed case
  ErrorStats preset;                                       ///< the same cases with the presets as they are
  std::vector<std::pair<std::string, ErrorStats>> by_source;   ///< each source predicted by the others
  std::vector<std::pair<std::string, ErrorStats>> by_cluster;
  /// The 68th percentile of |leave-one-source-out error| per cluster preset ("all" for the
  /// whole set), with the number of cases behind it.
  std::map<std::string, std::pair<double, int>> bands;
  /// Per group: parameter values fitted on all sources, and the mean error they give.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, double>>>> fitted_all;
  int simulations = 0;  ///< grid simulations run
};

CrossValidation cross_validate(const ValidationReport& base, const std::vector<FitGroup>& groups,
                               const ValidateOptions& vopt, const CrossValidationOptions& opt);
std::string to_markdown(const CrossValidation& cv);
nlohmann::json to_json(const CrossValidation& cv);
/// The error bands as the presets file embeds them (models/presets/error_bands.json).
nlohmann::json error_bands_json(const CrossValidation& cv, const std::string& cases_files);

}  // namespace moesim::tools
