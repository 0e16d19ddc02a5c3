#pragma once
// One training step, end to end: scenario -> workload -> topology -> task graph -> engine ->
// result (step time, tokens/s, MFU/HFU, where the time goes, memory per stage).
//
//   Scenario s = load_scenario_file("scenarios/pangu-ultra-moe-718b.json", {});
//   Simulation sim = simulate(s);
//   sim.result.mfu;  sim.result.breakdown.bubble;  to_json(sim.result).dump(2);
//
// The breakdown is per device: every instant of a simulated rank's step is either compute
// (its compute stream is busy), exposed communication of one kind (only communication is
// running; tp > cp > ep > pp > dp when several are), or idle, which is pipeline bubble. The
// parts are averaged over all devices and add up to the step time.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/models/workload.hpp"
#include "moesim/sim/engine.hpp"
#include "moesim/strategies/lower/lower.hpp"
#include "moesim/strategies/plan/plan.hpp"

namespace moesim::strategies {

inline constexpr const char* kVersion = "0.1.0";

struct Breakdown {
  double compute_s = 0;  ///< model compute_s including recomputation
  double tp_comm_s = 0;
  double cp_comm_s = 0;
  double ep_comm_s = 0;
  double pp_comm_s = 0;
  double dp_comm_s = 0;
  double bubble_s = 0;
  double imbalance_wait_s = 0;  ///< waiting for slower peers (routing skew); 0 without skew
  double swap_s = 0;            ///< activation copies to and from host memory not hidden by other_s work
  double host_bound_s = 0;      ///< device idle waiting for the host to launch the next kernel
  double other_s = 0;           ///< optimizer step
  double recompute_s = 0;       ///< part of `compute_s` spent recomputing (informational)
  [[nodiscard]] double total() const {
    return compute_s + tp_comm_s + cp_comm_s + ep_comm_s + pp_comm_s + dp_comm_s + bubble_s + imbalance_wait_s +
           swap_s + host_bound_s + other_s;
  }
};

struct StageResult {
  int stage = 0;
  int decoder_layers = 0;
  std::vector<std::string> chunks;  ///< item names per chunk, e.g. "emb,L0,L1"
  MemoryBreakdown memory;
  Breakdown breakdown;  ///< of this stage's simulated rank(s)
  double params = 0;    ///< per rank
};

/// How far off moesim's step time typically is on this kind of cluster: 68% of the published
/// runs on it were predicted within `within_pct` by the leave-one-source-out cross-validation
/// (`moesim validate --cross-validate source`; models/presets/error_bands.json).
struct ErrorBand {
  double within_pct = 0;
  int runs = 0;         ///< published runs behind the band
  std::string scope;    ///< the cluster preset, or "all" when it has too few runs
};
/// The band for a cluster preset name (the overall band for others), or nullopt when the
/// library carries no bands.
std::optional<ErrorBand> error_band_for(const std::string& cluster_preset);
/// The band as results print it in JSON ("step_time_error_band").
nlohmann::json to_json(const ErrorBand& b);

/// simulation.stragglers: what slowed the step (the simulated column's gating devices and the
/// collectives they hold back) and, over several steps, the distribution of step times.
struct StragglerResult {
  struct Gate {
    int stage = 0;
    long long device = 0;
    double slowdown = 1.0, nic_bandwidth = 1.0;
    std::vector<std::string> gates;  ///< the collectives it holds back
    double wait_s = 0;               ///< what its stage's other devices spent waiting for it (one step)
  };
  int slow_devices = 0, slow_nics = 0;  ///< of the reported step
  int column_size = 1;
  std::vector<Gate> gates;
  double ideal_step_s = 0;             ///< the same step with nothing slow
  std::vector<double> step_times_s;    ///< every step simulated, in order
  double mean_s = 0, p50_s = 0, p99_s = 0, min_s = 0, max_s = 0;
  int reported_step = 0;               ///< the step the rest of the result describes (nearest the mean)
};

struct Result {
  bool feasible = true;
  std::string infeasible_reason;
  double step_time_s = 0;
  std::optional<ErrorBand> error_band;  ///< typical step-time error (cross-validated), when known
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double tokens_per_s_per_device = 0;
  double model_flops_per_token = 0;
  double mfu = 0;
  double hfu = 0;
  /// The same throughput under Megatron-LM's FLOP formula (models::megatron_flops_per_token).
  double megatron_flops_per_token = 0;
  double mfu_megatron = 0;
  /// "Huawei-style": model FLOPs plus the masked half of causal attention
  /// (Workload::masked_attention_flops_per_token), i.e. attention counted over the full score
  /// matrix. Huawei does not state its count; its two published points (18.9% at 149 tokens/s
  /// per NPU, 30.0% at 238) are proportional, so it counts no recomputation (docs/NOTES.md,
  /// "MFU definitions").
  double huawei_flops_per_token = 0;
  double mfu_huawei = 0;

  double achieved_tflops_per_device = 0;
  double peak_tflops_per_device = 0;
  double peak_memory_bytes = 0;
  double capacity_bytes = 0;
  bool memory_fits = true;
  Breakdown breakdown;
  double comm_overlap_fraction = 0;
  double comm_seconds_per_device = 0;
  std::vector<StageResult> stages;
  std::vector<CollectiveUse> collectives;
  ExpertLoad expert_load;  ///< MoE models
  bool documents_packed = false;
  double attention_work_max_over_mean = 1;  ///< slowest data-parallel rank / mean (packed documents)
  double attention_work_mean = 1;           ///< relative to whole causal sequences
  // plan as resolved
  int dp = 1, ep = 1, etp = 1, edp = 1, num_microbatches = 1;
  std::vector<int> layers_per_virtual_stage;
  double params_total = 0;
  double params_active = 0;
  // simulator
  std::uint64_t seed = 1;
  std::string fidelity;
  int ranks_simulated = 0;
  std::uint64_t tasks = 0;
  std::uint64_t events = 0;
  double wall_s = 0;
  /// simulate(..., memory_detail = true): every term of the largest stage's memory.
  std::optional<MemoryDetail> memory_detail;
  std::optional<StragglerResult> stragglers;
};

/// The result's MFU under a FLOP count (the scenario's simulation.mfu_definition picks the headline).
[[nodiscard]] inline double mfu_under(const Result& r, MfuDefinition d) {
  return d == MfuDefinition::Megatron ? r.mfu_megatron : d == MfuDefinition::Huawei ? r.mfu_huawei : r.mfu;
}

/// Everything a run produced: the result, and the graph and run for traces and reports.
struct Simulation {
  Result result;
  Lowered lowered;
  sim::RunResult run;
};

/// The chain of tasks that set the step time (sim::critical_path), summed by what they do and by
/// the pipeline stage whose device ran them: what "the step is gated by".
struct CriticalPath {
  double step_s = 0;  ///< the step time the path spans
  std::vector<std::pair<std::string, double>> by_category;  ///< "compute", "ep_comm", ...: seconds, largest first
  std::vector<std::pair<int, double>> by_stage;             ///< stage: seconds of its tasks, largest first
  double unattributed_s = 0;  ///< step time no task of the path covers (0 when the chain is gapless)
  std::size_t tasks = 0;
};

/// The critical path of a simulation, summarized. O(tasks log tasks); computed on request (the
/// CLI's simulate and report), not by searches.
CriticalPath summarize_critical_path(const Simulation& sim);
nlohmann::json to_json(const CriticalPath& c);
/// The words the result table uses for a task category ("ep_comm" -> "expert all-to-all").
std::string category_words(const std::string& category);
/// "compute 71% (stage 15: 38% of the step), expert all-to-all 14%, ..." (shares of the step).
std::string describe_critical_path(const CriticalPath& c);

/// Throws InternalError when a result is unsound: a time or part negative or not finite, parts
/// that do not add up to the step (overall and per stage), memory negative or not finite.
void check_result_invariants(const Result& r);

/// Simulates one step. Throws ConfigError when the inputs make the step leave the engine's time
/// range (naming them), Cancelled when `cancel` is raised, InternalError when the result would
/// break an invariant (a bug: never returned as a result). `memory_detail`: also fill
/// Result::memory_detail (`moesim simulate --memory-detail`); off, nothing of it is computed.
Simulation simulate(const Scenario& s, const CancelFlag* cancel = nullptr, bool memory_detail = false);

/// The breakdown as {"compute": s, "tp_comm": s, ...} and back.
nlohmann::json to_json(const Breakdown& b);
Breakdown breakdown_from_json(const nlohmann::json& j);

/// The result as INTERFACE.md's JSON object. `include_wall_time = false` omits the one
/// non-deterministic field, making the output byte-identical across runs.
nlohmann::json to_json(const Result& r, const Scenario& s, bool include_wall_time = true);

/// The memory detail as the result's `memory.detail` object: {stage, inflight_chunks, items:
/// [{kind, count, terms: [{op, full_bytes, kept_bytes, dropped_by, note}]}], static: [...], ...}.
nlohmann::json to_json(const MemoryDetail& d);

/// The memory detail as a table (units GiB / MiB), with the activations' reconciliation line.
std::string format_memory_detail(const MemoryDetail& d, double capacity_bytes);

/// What a trace keeps (`moesim simulate --trace-ranks/--trace-window/--trace-streams`). A
/// skewed-routing run simulates hundreds of ranks and its whole trace passes a gigabyte.
struct TraceOptions {
  std::vector<int> ranks;            ///< global ranks to keep (empty: all simulated)
  double from_s = 0;                 ///< keep tasks that overlap [from_s, to_s)
  double to_s = 0;                   ///< 0: to the end of the step
  std::vector<std::string> streams;  ///< stream names to keep (compute, tp, ep, ...; empty: all)
  double max_bytes = 1e9;            ///< refuse to write a trace estimated above this (0: no limit)
};

/// The trace's size before writing: events kept and bytes (about 125 per event).
struct TraceEstimate {
  std::uint64_t events = 0;
  double bytes = 0;
};
TraceEstimate estimate_chrome_trace(const Simulation& sim, const TraceOptions& opt = {});

/// Chrome trace-event JSON (Perfetto): one process per simulated rank, one thread per stream.
/// Throws ConfigError (naming the trace options) when the estimate passes opt.max_bytes or an
/// option names a rank or stream that is not there.
void write_chrome_trace(std::ostream& out, const Simulation& sim, const TraceOptions& opt = {});

}  // namespace moesim::strategies
