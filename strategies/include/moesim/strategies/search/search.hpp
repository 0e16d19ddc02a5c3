#pragma once
// Strategy search: every plan of a space is checked for divisibility, screened with the fast
// estimator (same operator, collective and memory models, no events), and the best K are
// event-simulated and ranked by the objective.
//
//   Scenario s = load_scenario_file("scenarios/pangu-ultra-moe-718b.json", {});
//   SearchSpace space = parse_search_space(s);          // the scenario's "search" section
//   SearchReport r = search(s, space, {.threads = 2});
//   r.ranked[0].plan_json;                               // paste back as "parallelism"
//
// Determinism: plans are enumerated in a fixed order, every estimate and simulation is a pure
// function of its plan, ties break on the plan key, and which plans get simulated does not
// depend on the thread count — so the ranking is identical for any number of threads.

#include <limits>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/strategies/lower/lower.hpp"
#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/search/screen.hpp"

namespace moesim::strategies {

enum class Objective : std::uint8_t { TokensPerSecond, Mfu, TimeToTrain, Cost };
const char* objective_name(Objective o);

/// One recomputation choice of the space.
struct RecomputeChoice {
  Recompute granularity = Recompute::None;
  std::uint32_t modules = 0;  ///< selective modules
  std::string name;           ///< "none", "selective", "full", or "selective:mla_up_proj+moe_act"
};

struct SearchSpace {
  std::vector<int> tp, pp, vpp, ep, etp, cp, mbs;
  std::vector<bool> tp_extend_ep, distributed_optimizer, tp_comm_overlap, overlap_dp;
  /// MoE: forward-backward overlap (MindSpeed --moe-fb-overlap) and shared-expert overlap
  /// (models with shared experts); both values by default.
  std::vector<bool> fb_overlap{false}, shared_expert_overlap{false};
  /// Adaptive Pipe Overlap (Huawei's; a hierarchical all-to-all with forward-backward overlap):
  /// both values by default for MoE models; "true" applies to plans that have both.
  std::vector<bool> adaptive_pipe_overlap{false};
  /// Swapping to host memory (activations: the share of each chunk's saved bytes; optimizer
  /// states): the scenario's own values unless the section lists others.
  std::vector<double> swap_activations{0};
  std::vector<bool> swap_optimizer{false};
  /// Swapping chosen per plan (both swap axes "auto", the default where the device has a host
  /// link): a plan over memory gets the least swapping that fits (Estimator's least_swap).
  bool swap_auto = false;
  std::vector<AllToAllAlgo> alltoall;
  std::vector<RecomputeChoice> recompute;
  /// Pipeline schedules to try: -1 is "auto" (1F1B, or interleaved when vpp > 1), otherwise a
  /// ScheduleKind; a schedule only pairs with the vpp values it runs on. Default: every schedule.
  std::vector<int> schedule{-1};
  Objective objective = Objective::TokensPerSecond;
  double train_tokens = 0;        ///< for time_to_train / cost (0: not given)
  int top_k = 16;
  /// Multi-fidelity: the screen's best `replay_k` plans are estimated again with their pipeline
  /// replayed pass by pass (per-chunk costs, the schedule's generated orders, the emitter's
  /// forward-backward pairs) instead of the closed-form fill and drain, and re-ordered. 0: none.
  int replay_k = 4096;
  /// Multi-fidelity: the screen's best `refine_k` plans are event-simulated at fast fidelity
  /// (one task per pass) and re-ordered by that before the top_k are simulated at `fidelity`.
  /// 0: no refinement (also when `fidelity` is fast).
  int refine_k = 96;
  Fidelity fidelity = Fidelity::Balanced;
  double max_plans = 20e6;        ///< refuse larger spaces (with an estimate and advice)
  [[nodiscard]] double size() const;
  [[nodiscard]] nlohmann::json to_json() const;
};

/// Reads the scenario's "search" section (absent axes take automatic values derived from the
/// model and cluster). Throws ConfigError naming the axis that leaves no valid plan or makes
/// the space too large.
SearchSpace parse_search_space(const Scenario& s);

/// Processes sharing one search (MPI ranks): each screens and simulates its share of the plans,
/// and `allgather` exchanges the shares — every process passes its bytes and gets every
/// process's, in rank order. The ranking is the same for any number of processes. Default: one.
struct SearchPeers {
  int rank = 0;
  int size = 1;
  std::function<std::vector<std::string>(const std::string&)> allgather;
  [[nodiscard]] bool owns(std::size_t i) const { return size <= 1 || static_cast<int>(i % static_cast<std::size_t>(size)) == rank; }
};

struct SearchOptions {
  int threads = 0;          ///< 0: all cores
  int top_k = 0;            ///< 0: the space's top_k
  std::string out_file;     ///< one JSON line per simulated plan (search_journal.hpp)
  bool resume = false;      ///< reuse the results already in out_file
  /// Polled while screening and simulating; raised, the search stops its workers and throws
  /// Cancelled (the results file keeps what was simulated, for --resume).
  const CancelFlag* cancel = nullptr;
  /// Progress: (phase, done, total). Called from the calling thread.
  std::function<void(const char*, std::size_t, std::size_t)> progress;
  SearchPeers peers;
};

struct RankedPlan {
  std::string key;    ///< unique, for files and resuming ("tp8-pp16-vpp2-ep4x-...")
  std::string label;  ///< for people (plan_label: "TP8 PP16 VPP2 EP32 tp-ext DP48 mbs2 rc:sel h-a2a")
  Plan plan;
  nlohmann::json plan_json;  ///< in the scenario's "parallelism" form
  PlanEstimate estimate;
  double fast_step_s = 0;  ///< the multi-fidelity stage's fast simulation (0: not refined)
  bool simulated = false;
  bool resumed = false;
  // Simulation summary.
  bool feasible = true;
  std::string infeasible_reason;
  double step_time_s = 0, tokens_per_s = 0, mfu = 0, peak_memory_bytes = 0, headroom_bytes = 0;
  Breakdown breakdown;
  std::string bottleneck;
  double objective = 0;  ///< larger is better (time and cost are negated)
};

struct SearchReport {
  double space_size = 0;
  std::size_t valid = 0;          ///< plans that divide
  std::size_t screened = 0;       ///< estimated
  std::size_t screened_fit = 0;   ///< estimated to fit in memory
  std::size_t simulated = 0;      ///< event simulations run now
  std::size_t resumed = 0;        ///< results reused from the out file
  std::vector<RankedPlan> ranked;  ///< simulated, feasible, best first
  std::vector<RankedPlan> pareto;  ///< throughput vs memory headroom
  std::vector<RankedPlan> infeasible;  ///< simulated but over memory
  double screening_s = 0, simulation_s = 0;
  /// How well the screen ranked what the event simulation ranked: Spearman's rank correlation
  /// between the screen's and the simulation's step times over the simulated plans that fit
  /// (NaN with fewer than 3).
  double screen_rank_correlation = std::numeric_limits<double>::quiet_NaN();
  std::size_t correlation_plans = 0;
  /// The screen against the fast-fidelity event simulation over the refined plans, and the
  /// fast simulation against the final one over the ranked plans (NaN: not refined).
  double screen_vs_fast_correlation = std::numeric_limits<double>::quiet_NaN();
  std::size_t refined = 0;
  double fast_vs_final_correlation = std::numeric_limits<double>::quiet_NaN();
  double refine_s = 0;
  std::size_t replayed = 0;  ///< plans whose pipeline the screen replayed
  double replay_s = 0;
  const char* fidelity_name = "balanced";  ///< of the final simulation
  int threads = 1;
  int processes = 1;  ///< SearchPeers sharing it
  Objective objective = Objective::TokensPerSecond;
  /// The cluster's cross-validated step-time error band (every ranked step time carries it).
  std::optional<ErrorBand> error_band;
};

SearchReport search(const Scenario& base, const SearchSpace& space, const SearchOptions& opt);

/// Canonical key of a plan (also the deterministic tie-break).
std::string plan_key(const Plan& p, const std::string& recompute_name);
/// The plan in the scenario's "parallelism" form.
nlohmann::json plan_to_json(const Plan& p, const models::ModelSpec& m);
/// A plan for people, as tables show it: "TP8 PP16 VPP2 EP32 tp-ext DP48 mbs2 rc:sel h-a2a tp-ovl"
/// (the expert-parallel size as the plan line gives it; switches abbreviated; the schedule when
/// it is not the one the virtual stages imply).
std::string plan_label(const Plan& p, const models::ModelSpec& m);

nlohmann::json to_json(const SearchReport& r, int top);
std::string to_csv(const SearchReport& r, int top);

}  // namespace moesim::strategies
