#pragma once
// Model-architecture search: the scenario's "model_search" section sweeps model config keys
// (layers, hidden size, experts, top-k, expert FFN size, dense layers, MTP layers, attention),
// optionally refits one key so each candidate keeps a total-parameter budget, filters by
// parameter ranges, and searches each candidate's best parallel plan on the scenario's cluster.
//
//   "model_search": {
//     "axes": {"num_hidden_layers": [61, 66], "num_routed_experts": [128, 256, 512]},
//     "fit": {"key": "moe_intermediate_size", "total_params": "718B", "multiple": 64},
//     "active_params": ["30B", "50B"],
//     "top_k": 4, "refine_k": 32
//   }

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/strategies/search/search.hpp"

namespace moesim::strategies {

struct ModelSearchSpec {
  /// Config keys and the values to try (the cartesian product).
  std::vector<std::pair<std::string, std::vector<nlohmann::json>>> axes;
  /// Refit `fit_key` (an integer config key, in steps of `fit_multiple`) so that each
  /// candidate's total parameters come closest to `fit_total` (0: no refit).
  std::string fit_key;
  double fit_total = 0;
  int fit_multiple = 64;
  /// Candidates outside these ranges are listed, not searched ({0, 0}: no bound).
  std::pair<double, double> total_range{0, 0}, active_range{0, 0};
  /// Each candidate's plan search: the scenario's search section with these (small by
  /// default: a candidate needs its best plan, not a ranking of plans).
  int top_k = 4;
  int refine_k = 32;
};

/// Reads the scenario's "model_search" section; nullopt without one. Throws ConfigError naming
/// the path of each problem (unknown or non-numeric fit key, an empty axis, bad ranges).
std::optional<ModelSearchSpec> parse_model_search(const Scenario& s);

struct ModelCandidate {
  nlohmann::json overrides;   ///< the axes' values (and the refitted key)
  nlohmann::json config;      ///< the whole Hugging Face config searched
  double total_params = 0, active_params = 0;
  bool searched = false;
  std::string skipped;        ///< why not searched (outside a range, no plan fits, invalid model)
  std::optional<RankedPlan> best;
  std::size_t plans = 0;      ///< plans of its space that divide
  double seconds = 0;         ///< its plan search's wall time
};

struct ModelSearchReport {
  std::vector<ModelCandidate> candidates;  ///< searched ones best first, then the skipped ones
  Objective objective = Objective::TokensPerSecond;
  double wall_s = 0;
};

/// Every candidate of the spec, each searched for its best plan with `opt` (threads, cancel).
ModelSearchReport model_search(const Scenario& base, const ModelSearchSpec& spec, const SearchOptions& opt);

nlohmann::json to_json(const ModelSearchReport& r);

}  // namespace moesim::strategies
