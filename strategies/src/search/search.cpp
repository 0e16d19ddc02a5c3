#include "moesim/strategies/search/search.hpp"
#include "moesim/strategies/plan/schedule.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "moesim/sim/parallel.hpp"
#include "moesim/strategies/search/journal.hpp"
#include "moesim/topologies/topology.hpp"
#include "space.hpp"

namespace moesim::strategies {

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::TokensPerSecond: return "tokens_per_s";
    case Objective::Mfu: return "mfu";
    case Objective::TimeToTrain: return "time_to_train";
    case Objective::Cost: return "cost";
  }
  return "?";
}

std::string plan_key(const Plan& p, const std::string& recompute_name) {
  std::ostringstream os;
  os << "tp" << p.tp << "-pp" << p.pp << "-vpp" << p.vpp << "-ep" << p.ep << (p.moe_tp_extend_ep ? "x" : "") << "-etp"
     << (p.etp > 0 ? p.etp : 0) << "-cp" << p.cp << "-mbs" << p.mbs << "-" << recompute_name
     << (p.distributed_optimizer ? "-dopt" : "") << (p.alltoall == AllToAllAlgo::Hierarchical ? "-ha2a" : p.alltoall == AllToAllAlgo::AllGather ? "-aga2a" : "")
     << (p.tp_comm_overlap ? "-tpov" : "") << (p.overlap_grad_reduce ? "-dpov" : "") << (p.fb_overlap ? "-fbov" : "")
     << (p.shared_expert_overlap ? "-seov" : "") << (p.adaptive_pipe_overlap ? "-apo" : "") << (p.cp > 1 && p.cp_all_gather ? "-cpag" : "")
     << (p.swap_activations > 0 ? fmt::format("-swap{:g}", p.swap_activations) : std::string())
     << (p.swap_optimizer ? "-swapopt" : "") << (p.offload_weights ? "-offw" : "");
  if (!schedule_traits(p.schedule).automatic) os << "-" << schedule_name(p.schedule);
  return os.str();
}

std::string plan_label(const Plan& p, const models::ModelSpec& m) {
  std::string t = fmt::format("TP{} PP{}", p.tp, p.pp);
  if (p.vpp > 1) t += fmt::format(" VPP{}", p.vpp);
  if (m.is_moe()) {
    // The expert-parallel size as the plan line gives it (EP32), TP-extend-EP marked.
    t += p.moe_tp_extend_ep ? fmt::format(" EP{} tp-ext", p.ep_size()) : fmt::format(" EP{}", p.ep);
    if (!p.moe_tp_extend_ep && p.etp_size() > 1) t += fmt::format(" ETP{}", p.etp_size());
  }
  if (p.cp > 1) t += fmt::format(" CP{}", p.cp);
  t += fmt::format(" DP{} mbs{}", p.dp, p.mbs);
  switch (p.recompute) {
    case Recompute::None: t += " rc:none"; break;
    case Recompute::Full: t += " rc:full"; break;
    case Recompute::Selective: t += " rc:sel"; break;
    case Recompute::SelectiveOp: t += " rc:op"; break;
  }
  if (m.is_moe() && p.alltoall == AllToAllAlgo::Hierarchical) t += " h-a2a";
  if (m.is_moe() && p.alltoall == AllToAllAlgo::AllGather) t += " ag-a2a";
  if (p.tp_comm_overlap) t += " tp-ovl";
  if (m.is_moe() && p.fb_overlap) t += " fb-ovl";
  if (m.is_moe() && p.shared_expert_overlap) t += " se-ovl";
  if (m.is_moe() && p.adaptive_pipe_overlap) t += " apo";
  if (p.cp > 1 && p.cp_all_gather) t += " cp-ag";
  if (p.swap_activations > 0) t += fmt::format(" swap{:.0f}%", 100 * p.swap_activations);
  if (p.swap_optimizer) t += " swap-opt";
  if (p.offload_weights) t += " offload-w";
  // The schedule, where it is not the one the virtual stages imply (1F1B / interleaved).
  if (!schedule_traits(p.schedule).automatic) t += std::string(" ") + schedule_name(p.schedule);
  return t;
}

nlohmann::json plan_to_json(const Plan& p, const models::ModelSpec& m) {
  // Every field the plan was simulated with, in the names the scenario's parser reads: pasted
  // back as the "parallelism" section it reproduces the plan (tests/test_search.cpp checks
  // every ranked plan). Fields at the parser's default are left out.
  nlohmann::json j;
  j["tensor_model_parallel_size"] = p.tp;
  j["pipeline_model_parallel_size"] = p.pp;
  if (p.vpp > 1 && !bidirectional(p.schedule)) j["virtual_pipeline_model_parallel_size"] = p.vpp;
  if (!schedule_traits(p.schedule).automatic)
    j["pipeline_schedule"] = schedule_name(p.schedule);
  if (m.is_moe()) {
    j["expert_model_parallel_size"] = p.ep;
    if (p.moe_tp_extend_ep) j["moe_tp_extend_ep"] = true;
    else j["expert_tensor_parallel_size"] = p.etp > 0 ? p.etp : p.tp;
    if (p.alltoall != AllToAllAlgo::Flat) j["moe_alltoall"] = alltoall_name(p.alltoall);
    if (p.fb_overlap) j["moe_fb_overlap"] = true;
    if (p.shared_expert_overlap) j["moe_shared_expert_overlap"] = true;
    if (p.adaptive_pipe_overlap) j["adaptive_pipe_overlap"] = true;
  }
  if (p.cp > 1) j["context_parallel_size"] = p.cp;
  if (p.cp > 1 && p.cp_all_gather) j["cp_comm_type"] = "all_gather";
  j["micro_batch_size"] = p.mbs;
  j["sequence_parallel"] = p.sequence_parallel;
  j["use_distributed_optimizer"] = p.distributed_optimizer;
  if (p.dp_sharding != DpSharding::None && p.dp_sharding != DpSharding::Optimizer)
    j["data_parallel_sharding_strategy"] = dp_sharding_name(p.dp_sharding);
  if (p.dp_sharding == DpSharding::Full && !p.reshard_after_forward) j["fsdp_reshard_after_forward"] = false;
  if (!p.grad_sync_every_microbatch) j["fsdp_gradient_sync"] = "last_microbatch";
  if (p.overlap_grad_reduce) j["overlap_grad_reduce"] = true;
  if (p.overlap_param_gather) j["overlap_param_gather"] = true;
  if (p.tp_comm_overlap) j["tp_comm_overlap"] = true;
  if (p.grad_reduce_in_bf16) j["grad_reduce_in_bf16"] = true;
  auto dtype = [](double bytes) { return bytes == 4 ? "fp32" : bytes == 1 ? "fp8" : "bf16"; };
  if (p.exp_avg_bytes != 4) j["exp_avg_dtype"] = dtype(p.exp_avg_bytes);
  if (p.exp_avg_sq_bytes != 4) j["exp_avg_sq_dtype"] = dtype(p.exp_avg_sq_bytes);
  if (p.main_params_bytes != 4) j["main_params_dtype"] = "fp16";
  if (p.fp8_param_gather) j["fp8_param_gather"] = true;
  if (p.swap_activations > 0) j["swap_activations"] = p.swap_activations;
  if (p.swap_optimizer) j["swap_optimizer"] = true;
  if (p.offload_weights) j["offload_weights"] = true;
  switch (p.recompute) {
    case Recompute::None: break;
    case Recompute::Full:
      j["recompute_granularity"] = "full";
      j["recompute_method"] = p.recompute_method == RecomputeMethod::Block ? "block" : "uniform";
      j["recompute_num_layers"] = p.recompute_num_layers;
      break;
    case Recompute::SelectiveOp: j["recompute_granularity"] = "selective_op"; break;
    case Recompute::Selective: {
      j["recompute_granularity"] = "selective";
      nlohmann::json mods = nlohmann::json::array();
      std::istringstream in(search_detail::module_names(p.recompute_modules));
      for (std::string n; std::getline(in, n, '+');) mods.push_back(n);
      j["recompute_modules"] = mods;
      break;
    }
  }
  if (p.partition == "explicit") j["pipeline_layer_partition"] = p.layers_per_stage;
  else if (p.partition == "even") j["pipeline_layer_partition"] = "even";
  if (p.first_stage_layers >= 0) j["decoder_first_pipeline_num_layers"] = p.first_stage_layers;
  if (p.last_stage_layers >= 0) j["decoder_last_pipeline_num_layers"] = p.last_stage_layers;
  if (p.noop_layers > 0) j["noop_layers"] = p.noop_layers;
  return j;
}

namespace {

constexpr double kSecondsPerHour = 3600.0;

double objective_value(Objective o, double tokens_per_s, double mfu, double devices, double train_tokens) {
  switch (o) {
    case Objective::TokensPerSecond: return tokens_per_s;
    case Objective::Mfu: return mfu;
    case Objective::TimeToTrain: return -(train_tokens / tokens_per_s);                  // seconds, negated
    case Objective::Cost: return -(devices * train_tokens / tokens_per_s / kSecondsPerHour);  // device-hours, negated
  }
  return tokens_per_s;
}

struct Candidate {
  std::size_t index = 0;
  Plan plan;
  std::string recompute_name;
  PlanEstimate est;
  double score = 0;
  std::string key;
  double fast_step_s = 0;  ///< fast-fidelity simulation (refined candidates only; 0: not refined)
};

bool better(double a, const std::string& ka, double b, const std::string& kb) {
  if (a != b) return a > b;
  return ka < kb;
}

std::string bottleneck_of(const Breakdown& b) {
  std::pair<double, const char*> parts[] = {
      {b.tp_comm_s, "tp_comm"},          {b.cp_comm_s, "cp_comm"}, {b.ep_comm_s, "ep_comm"},
      {b.pp_comm_s, "pp_comm"},          {b.dp_comm_s, "dp_comm"}, {b.bubble_s, "bubble"},
      {b.imbalance_wait_s, "imbalance"}, {b.swap_s, "swap"},       {b.host_bound_s, "host_bound"}};
  const char* name = "compute";
  double worst = 0.15 * b.total();  // anything below 15% of the step is not "the" bottleneck
  for (auto [v, n] : parts)
    if (v > worst) {
      worst = v;
      name = n;
    }
  return name;
}

nlohmann::json result_json(const RankedPlan& r) {
  return {{"feasible", r.feasible},
          {"infeasible_reason", r.infeasible_reason},
          {"step_time_s", r.step_time_s},
          {"tokens_per_s", r.tokens_per_s},
          {"mfu", r.mfu},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"headroom_bytes", r.headroom_bytes},
          {"bottleneck", r.bottleneck},
          {"breakdown_s", to_json(r.breakdown)}};
}


/// What every stage of a search reads.
struct SearchContext {
  const Scenario& base;
  const SearchSpace& space;
  const SearchOptions& opt;
  int threads = 1;
  const models::Workload& w;
  const topologies::Topology& topo;
  double devices = 0;
  /// The plans' simulations poll this follower of opt.cancel: they run on several threads at
  /// once, so they report no phases to its progress (the search reports its own).
  const CancelFlag* sim_cancel = nullptr;
};

// ---- enumerate and screen (mixed-radix index over the axes) --------------------------------

// ---- processes sharing a search (SearchPeers) ------------------------------------------------

/// The screen's bottleneck names are string literals; a received one maps back to its literal.
const char* bottleneck_literal(const std::string& s) {
  for (const char* b : {"compute", "tp_comm", "cp_comm", "ep_comm", "bubble", "dp_comm"})
    if (s == b) return b;
  return "compute";
}

/// A candidate's estimate (and the swapping it chose) as numbers for another process.
nlohmann::json estimate_json(const Candidate& c) {
  return {c.score, c.est.step_s, c.est.tokens_per_s, c.est.mfu, c.est.peak_memory_bytes, c.est.capacity_bytes,
          c.est.compute_s, c.est.exposed_comm_s, c.est.bubble_s, c.est.dp_exposed_s, std::string(c.est.bottleneck),
          c.plan.swap_activations, c.plan.swap_optimizer, c.est.swap_exposed_s, c.est.replayed, c.est.fits,
          c.est.offload_weights};
}

void read_estimate(const nlohmann::json& e, Candidate& c) {
  c.score = e[0];
  c.est.step_s = e[1];
  c.est.tokens_per_s = e[2];
  c.est.mfu = e[3];
  c.est.peak_memory_bytes = e[4];
  c.est.capacity_bytes = e[5];
  c.est.compute_s = e[6];
  c.est.exposed_comm_s = e[7];
  c.est.bubble_s = e[8];
  c.est.dp_exposed_s = e[9];
  c.est.bottleneck = bottleneck_literal(e[10].get<std::string>());
  c.plan.swap_activations = c.est.swap_activations = e[11].get<double>();
  c.plan.swap_optimizer = c.est.swap_optimizer = e[12].get<bool>();
  c.est.swap_exposed_s = e[13];
  c.est.replayed = e[14].get<bool>();
  c.est.fits = e[15].get<bool>();
  c.est.offload_weights = e[16].get<bool>();
  apply_offload(c.plan, c.est.offload_weights);
}

/// Every process's screened candidates (and valid-plan counts) to every process: the plans are
/// rebuilt from their index, the estimates carried as numbers.
void exchange_candidates(const search_detail::PlanEnumerator& plans, const SearchPeers& peers,
                         std::vector<Candidate>& cands, std::size_t& valid) {
  nlohmann::json mine = nlohmann::json::array();
  mine.push_back(valid);
  for (const Candidate& c : cands) mine.push_back({c.index, estimate_json(c)});
  const std::vector<std::uint8_t> bytes = nlohmann::json::to_msgpack(mine);
  const std::vector<std::string> all = peers.allgather(std::string(bytes.begin(), bytes.end()));
  cands.clear();
  valid = 0;
  for (const std::string& part : all) {
    const nlohmann::json j = nlohmann::json::from_msgpack(part);
    valid += j[0].get<std::size_t>();
    for (std::size_t k = 1; k < j.size(); ++k) {
      Candidate c;
      c.index = j[k][0].get<std::size_t>();
      if (!plans.make_plan(c.index, c.plan, c.recompute_name)) continue;  // cannot happen: it was made there
      read_estimate(j[k][1], c);
      cands.push_back(std::move(c));
    }
  }
}

/// Every candidate's screen estimate returned; returns those that fit, best first (ties on the key),
/// and counts the valid and fitting plans into `rep`.
std::vector<Candidate> screen_plans(const SearchContext& ctx, SearchReport& rep) {
  const SearchSpace& space = ctx.space;
  const SearchOptions& opt = ctx.opt;
  const int threads = ctx.threads;
  const std::size_t total = static_cast<std::size_t>(space.size());
  const search_detail::PlanEnumerator plans(ctx.base, space);

  // Screening: every worker keeps its own estimator (caches) and candidate list; the list is
  // sorted afterwards, so the hand-out order does not matter.
  std::vector<std::vector<Candidate>> per_worker(threads);
  std::vector<std::size_t> valid_count(threads, 0);
  std::vector<std::unique_ptr<Estimator>> estimators(threads);
  ParallelOptions screen_opt{.threads = threads, .grain = 256, .cancel = opt.cancel, .tick = {}, .tick_ms = 100};
  if (opt.progress) screen_opt.tick = [&](std::size_t done) { opt.progress("screening", done, total); };
  const SearchPeers& peers = opt.peers;
  parallel_for(total, screen_opt, [&](int worker, std::size_t i) {
    if (!peers.owns(i)) return;  // another process's share
    Candidate c;
    if (!plans.make_plan(i, c.plan, c.recompute_name)) return;
    ++valid_count[worker];
    if (!estimators[worker]) estimators[worker] = std::make_unique<Estimator>(ctx.base, ctx.topo, ctx.w);
    c.index = i;
    c.est = estimators[worker]->estimate(c.plan, false, space.swap_auto);
    c.plan.swap_activations = c.est.swap_activations;  // the least that fits (swap "auto")
    c.plan.swap_optimizer = c.est.swap_optimizer;
    apply_offload(c.plan, c.est.offload_weights);
    if (c.est.fits && c.est.step_s > 0) {
      c.score = objective_value(space.objective, c.est.tokens_per_s, c.est.mfu, ctx.devices, space.train_tokens);
      per_worker[worker].push_back(std::move(c));
    }
  });
  std::vector<Candidate> cands;
  for (int t = 0; t < threads; ++t) {
    rep.valid += valid_count[t];
    for (auto& c : per_worker[t]) cands.push_back(std::move(c));
  }
  if (peers.size > 1) exchange_candidates(plans, peers, cands, rep.valid);
  // Plans the estimate deems over memory were dropped; count the fits for the report.
  rep.screened = rep.valid;
  rep.screened_fit = cands.size();
  for (auto& c : cands) c.key = plan_key(c.plan, c.recompute_name);
  std::sort(cands.begin(), cands.end(),
            [](const Candidate& a, const Candidate& b) { return better(a.score, a.key, b.score, b.key); });
  return cands;
}

// ---- multi-fidelity: the screen's best with their pipelines replayed ---------------------------

/// The first `replay_k` candidates estimated again with the pipeline replayed pass by pass (and
/// the lowering's refined layer partition) and re-ordered by that; the rest keep the closed
/// form's order behind them. Processes share the head (by position) and exchange the
/// estimates, each depending on its plan alone, so the order is the same for any number of
/// processes.
void replay_candidates(const SearchContext& ctx, std::vector<Candidate>& cands, SearchReport& rep) {
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(std::max(0, ctx.space.replay_k)), cands.size());
  if (n == 0) return;
  std::vector<std::unique_ptr<Estimator>> estimators(ctx.threads);
  ParallelOptions o{.threads = ctx.threads, .grain = 16, .cancel = ctx.opt.cancel, .tick = {}, .tick_ms = 100};
  if (ctx.opt.progress) o.tick = [&](std::size_t done) { ctx.opt.progress("replaying pipelines", done, n); };
  const SearchPeers& peers = ctx.opt.peers;
  parallel_for(n, o, [&](int worker, std::size_t i) {
    if (!peers.owns(i)) return;
    if (!estimators[worker]) estimators[worker] = std::make_unique<Estimator>(ctx.base, ctx.topo, ctx.w);
    Candidate& c = cands[i];
    c.est = estimators[worker]->estimate(c.plan, true);
    c.score = objective_value(ctx.space.objective, c.est.tokens_per_s, c.est.mfu, ctx.devices, ctx.space.train_tokens);
  });
  if (ctx.opt.cancel != nullptr && ctx.opt.cancel->requested()) throw Cancelled();
  if (peers.size > 1) {
    nlohmann::json mine = nlohmann::json::array();
    for (std::size_t i = 0; i < n; ++i)
      if (peers.owns(i)) mine.push_back({i, estimate_json(cands[i])});
    const std::vector<std::uint8_t> bytes = nlohmann::json::to_msgpack(mine);
    for (const std::string& part : peers.allgather(std::string(bytes.begin(), bytes.end())))
      for (const auto& e : nlohmann::json::from_msgpack(part)) read_estimate(e[1], cands[e[0].get<std::size_t>()]);
  }
  rep.replayed = n;
  // Those the refined partition puts over memory go behind the head's others.
  std::stable_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(n), [](const Candidate& a, const Candidate& b) {
    if (a.est.fits != b.est.fits) return a.est.fits;
    return better(a.score, a.key, b.score, b.key);
  });
}

// ---- multi-fidelity: the screen's best re-ordered by a fast event simulation ------------------

double spearman(const std::vector<double>& x, const std::vector<double>& y);

/// The first `refine_k` candidates simulated at fast fidelity (one task per pass, analytical
/// network) and re-ordered by that result, those over memory moved behind them; the rest keep
/// the screen's order. Deterministic: each candidate's result depends on it alone.
void refine_candidates(const SearchContext& ctx, std::vector<Candidate>& cands, SearchReport& rep) {
  const SearchSpace& space = ctx.space;
  if (space.refine_k <= 0 || space.fidelity == Fidelity::Fast || cands.empty()) return;
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(space.refine_k), cands.size());
  std::vector<char> fits(n, 0);
  ParallelOptions o{.threads = ctx.threads, .grain = 1, .cancel = ctx.opt.cancel, .tick = {}, .tick_ms = 100};
  if (ctx.opt.progress) o.tick = [&](std::size_t done) { ctx.opt.progress("refining", done, n); };
  const SearchPeers& peers = ctx.opt.peers;
  parallel_for(n, o, [&](int, std::size_t i) {
    if (!peers.owns(i)) return;
    Candidate& c = cands[i];
    Scenario sc = ctx.base;
    set_plan(sc, c.plan, plan_to_json(c.plan, ctx.base.model));
    set_fidelity(sc, Fidelity::Fast);
    const Result res = simulate(sc, ctx.sim_cancel).result;
    c.fast_step_s = res.step_time_s;
    fits[i] = res.feasible ? 1 : 0;
    c.score = objective_value(space.objective, res.tokens_per_s, res.mfu, ctx.devices, space.train_tokens);
  });
  if (ctx.opt.cancel != nullptr && ctx.opt.cancel->requested()) throw Cancelled();
  if (peers.size > 1) {
    nlohmann::json mine = nlohmann::json::array();
    for (std::size_t i = 0; i < n; ++i)
      if (peers.owns(i)) mine.push_back({i, cands[i].fast_step_s, fits[i] != 0, cands[i].score});
    const std::vector<std::uint8_t> bytes = nlohmann::json::to_msgpack(mine);
    for (const std::string& part : peers.allgather(std::string(bytes.begin(), bytes.end())))
      for (const auto& e : nlohmann::json::from_msgpack(part)) {
        const std::size_t i = e[0].get<std::size_t>();
        cands[i].fast_step_s = e[1];
        fits[i] = e[2].get<bool>() ? 1 : 0;
        cands[i].score = e[3];
      }
  }
  std::vector<double> est, fast;
  for (std::size_t i = 0; i < n; ++i)
    if (fits[i]) {
      est.push_back(cands[i].est.step_s);
      fast.push_back(cands[i].fast_step_s);
    }
  rep.refined = n;
  rep.screen_vs_fast_correlation = spearman(est, fast);
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (fits[a] != fits[b]) return fits[a] > fits[b];
    return better(cands[a].score, cands[a].key, cands[b].score, cands[b].key);
  });
  std::vector<Candidate> head;
  head.reserve(n);
  for (std::size_t i : order) head.push_back(std::move(cands[i]));
  std::move(head.begin(), head.end(), cands.begin());
}

// ---- the results file: earlier results (--resume), new ones as they arrive -----------------

/// What every result line of this search must agree with.
JournalChecks journal_checks(const SearchContext& ctx) {
  const Scenario& base = ctx.base;
  JournalChecks checks;
  checks.tokens_per_step = base.training.tokens_per_step();
  checks.model_flops_per_token = ctx.w.model_flops_per_token;
  checks.devices = ctx.devices;
  checks.peak_flops_per_device = base.cluster.device.mfu_peak(base.training.precision).value();
  return checks;
}

/// A result's fields from its JSON form (result_json).
void read_result(const nlohmann::json& res, RankedPlan& r) {
  r.feasible = res["feasible"].get<bool>();
  r.infeasible_reason = res["infeasible_reason"].get<std::string>();
  r.step_time_s = res["step_time_s"].get<double>();
  r.tokens_per_s = res["tokens_per_s"].get<double>();
  r.mfu = res["mfu"].get<double>();
  r.peak_memory_bytes = res["peak_memory_bytes"].get<double>();
  r.headroom_bytes = res["headroom_bytes"].get<double>();
  r.bottleneck = res["bottleneck"].get<std::string>();
  r.breakdown = breakdown_from_json(res["breakdown_s"]);
  r.simulated = true;
}

/// The candidate's earlier result, from the results file's line `prev`.
void resume_result(const JournalEntry& prev, const SearchJournal& journal, const Candidate& c, RankedPlan& r) {
  // The key names the plan; a line whose plan is not the one its key names in this
  // search was not written by it.
  if (prev.plan != r.plan_json)
    throw ConfigError({Diagnostic{journal.source() + ":" + std::to_string(prev.line), "/plan", json_brief(prev.plan),
                                  "is not the plan its key " + c.key + " names in this search (expected " +
                                      json_brief(r.plan_json) + "); remove the line (or the file) and resume"}});
  read_result(prev.result, r);
  r.resumed = true;
}

// ---- event-simulate the best candidates until K feasible ----------------------------------

/// The candidate's plan event-simulated, its result appended to the results file.
void simulate_result(const SearchContext& ctx, const Candidate& c, SearchJournal& journal, RankedPlan& r) {
  Scenario sc = ctx.base;
  set_plan(sc, c.plan, r.plan_json);
  set_fidelity(sc, ctx.space.fidelity);
  const Simulation sim = simulate(sc, ctx.sim_cancel);
  const Result& res = sim.result;
  r.feasible = res.feasible;
  r.infeasible_reason = res.infeasible_reason;
  r.step_time_s = res.step_time_s;
  r.tokens_per_s = res.tokens_per_s;
  r.mfu = res.mfu;
  r.peak_memory_bytes = res.peak_memory_bytes;
  r.headroom_bytes = res.capacity_bytes - res.peak_memory_bytes;
  r.breakdown = res.breakdown;
  r.bottleneck = bottleneck_of(res.breakdown);
  r.simulated = true;
  journal.append(r.key, r.plan_json, result_json(r));
}

/// The candidate's result: the results file's, or simulated now.
void candidate_result(const SearchContext& ctx, const Candidate& c, SearchJournal& journal, RankedPlan& r) {
  r.key = c.key;
  r.plan = c.plan;
  r.label = plan_label(c.plan, ctx.base.model);
  r.plan_json = plan_to_json(c.plan, ctx.base.model);
  r.estimate = c.est;
  r.fast_step_s = c.fast_step_s;
  if (const JournalEntry* prev = journal.find(c.key)) resume_result(*prev, journal, c, r);
  else simulate_result(ctx, c, journal, r);
  r.objective = objective_value(ctx.space.objective, r.tokens_per_s, r.mfu, ctx.devices, ctx.space.train_tokens);
}

/// Every process's results of a wave to every process; the first process writes the others'
/// simulated results to the results file.
void exchange_results(const SearchContext& ctx, const std::vector<Candidate>& cands, std::size_t next,
                      SearchJournal& journal, std::vector<RankedPlan>& batch) {
  const SearchPeers& peers = ctx.opt.peers;
  nlohmann::json mine = nlohmann::json::array();
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (peers.owns(next + i)) mine.push_back({i, batch[i].resumed, result_json(batch[i])});
  const std::vector<std::uint8_t> bytes = nlohmann::json::to_msgpack(mine);
  const std::vector<std::string> all = peers.allgather(std::string(bytes.begin(), bytes.end()));
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (static_cast<int>(p) == peers.rank) continue;
    for (const auto& e : nlohmann::json::from_msgpack(all[p])) {
      const std::size_t i = e[0].get<std::size_t>();
      const Candidate& c = cands[next + i];
      RankedPlan& r = batch[i];
      r.key = c.key;
      r.plan = c.plan;
      r.label = plan_label(c.plan, ctx.base.model);
      r.plan_json = plan_to_json(c.plan, ctx.base.model);
      r.estimate = c.est;
      r.fast_step_s = c.fast_step_s;
      read_result(e[2], r);
      r.resumed = e[1].get<bool>();
      r.objective = objective_value(ctx.space.objective, r.tokens_per_s, r.mfu, ctx.devices, ctx.space.train_tokens);
      if (peers.rank == 0 && !r.resumed) journal.append(r.key, r.plan_json, result_json(r));
    }
  }
}

/// The results of the best candidates, wave by wave, until `top_k` are feasible (or none is
/// left); counts the simulated and resumed ones into `rep`.
std::vector<RankedPlan> simulate_waves(const SearchContext& ctx, const std::vector<Candidate>& cands, int top_k,
                                       SearchJournal& journal, SearchReport& rep) {
  const SearchOptions& opt = ctx.opt;
  std::vector<RankedPlan> results;
  std::size_t next = 0;
  int feasible = 0;
  while (feasible < top_k && next < cands.size()) {
    // The next wave: as many candidates as feasible results are still missing (not the
    // thread count), so the simulated set does not depend on the threads.
    const std::size_t wave = std::min<std::size_t>(static_cast<std::size_t>(top_k - feasible), cands.size() - next);
    std::vector<RankedPlan> batch(wave);
    ParallelOptions sim_opt{.threads = ctx.threads, .grain = 1, .cancel = opt.cancel, .tick = {}, .tick_ms = 100};
    // Progress counts the plans simulated against top_k (a wave after infeasible ones can pass it).
    const std::size_t before = results.size();
    if (opt.progress)
      sim_opt.tick = [&](std::size_t d) {
        opt.progress("simulating", std::min<std::size_t>(before + d, static_cast<std::size_t>(top_k)), top_k);
      };
    const SearchPeers& peers = opt.peers;
    parallel_for(wave, sim_opt, [&](int, std::size_t i) {
      if (peers.owns(next + i)) candidate_result(ctx, cands[next + i], journal, batch[i]);
    });
    if (peers.size > 1) exchange_results(ctx, cands, next, journal, batch);
    for (auto& r : batch) {
      if (r.resumed) ++rep.resumed;
      else ++rep.simulated;
      if (r.feasible) ++feasible;
      results.push_back(std::move(r));
    }
    next += wave;
  }
  return results;
}

// ---- ranking ---------------------------------------------------------------------------------

/// The feasible results ranked by the objective, the infeasible ones, and the Pareto set.
void rank_results(const std::vector<RankedPlan>& results, SearchReport& rep) {
  for (auto& r : results) (r.feasible ? rep.ranked : rep.infeasible).push_back(r);
  std::sort(rep.ranked.begin(), rep.ranked.end(),
            [](const RankedPlan& a, const RankedPlan& b) { return better(a.objective, a.key, b.objective, b.key); });
  // Pareto set: no other plan is at least as fast with at least as much headroom.
  for (const auto& r : rep.ranked) {
    bool dominated = false;
    for (const auto& o : rep.ranked)
      if (&o != &r && o.tokens_per_s >= r.tokens_per_s && o.headroom_bytes >= r.headroom_bytes &&
          (o.tokens_per_s > r.tokens_per_s || o.headroom_bytes > r.headroom_bytes)) {
        dominated = true;
        break;
      }
    if (!dominated) rep.pareto.push_back(r);
  }
}

/// Ranks of `v` (average ranks for ties), 0-based.
std::vector<double> ranks_of(const std::vector<double>& v) {
  std::vector<std::size_t> idx(v.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    for (std::size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * static_cast<double>(i + j);
    i = j + 1;
  }
  return r;
}

/// Spearman's rank correlation of two equally long series (NaN below 3 values).
double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() < 3 || x.size() != y.size()) return std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> a = ranks_of(x), b = ranks_of(y);
  const double n = static_cast<double>(a.size()), mean = 0.5 * (n - 1);
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - mean) * (b[i] - mean);
    saa += (a[i] - mean) * (a[i] - mean);
    sbb += (b[i] - mean) * (b[i] - mean);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

/// The screen's and the fast simulation's step times against the final simulation's, over the
/// ranked (simulated, fitting) plans.
void screen_correlation(SearchReport& rep) {
  std::vector<double> est, fast, sim, sim_fast;
  for (const auto& r : rep.ranked) {
    est.push_back(r.estimate.step_s);
    sim.push_back(r.step_time_s);
    if (r.fast_step_s > 0) {
      fast.push_back(r.fast_step_s);
      sim_fast.push_back(r.step_time_s);
    }
  }
  rep.correlation_plans = est.size();
  rep.screen_rank_correlation = spearman(est, sim);
  rep.fast_vs_final_correlation = spearman(fast, sim_fast);  // over those the fast stage saw
}

}  // namespace

SearchReport search(const Scenario& base, const SearchSpace& space, const SearchOptions& opt) {
  SearchReport rep;
  rep.objective = space.objective;
  rep.fidelity_name = strategies::fidelity_name(space.fidelity);
  rep.error_band = error_band_for(base.cluster.name);
  rep.space_size = space.size();
  const int threads = opt.threads > 0 ? opt.threads : hardware_threads();
  rep.threads = threads;
  rep.processes = std::max(1, opt.peers.size);
  const int top_k = opt.top_k > 0 ? opt.top_k : space.top_k;
  const models::Workload w = models::build_workload(base.model, base.training.seq_length, base.training.workload);
  const topologies::Topology topo = topologies::build_topology(base.cluster);
  const double devices = base.cluster.devices;
  const CancelFlag sim_cancel(opt.cancel);
  const SearchContext ctx{base, space, opt, threads, w, topo, devices, &sim_cancel};

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Candidate> cands = screen_plans(ctx, rep);
  rep.screening_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto tp = std::chrono::steady_clock::now();
  replay_candidates(ctx, cands, rep);
  rep.replay_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tp).count();
  const auto tr = std::chrono::steady_clock::now();
  refine_candidates(ctx, cands, rep);
  rep.refine_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();

  // Shared by processes: the first writes the results file; the others read it (resuming)
  // once the first has opened it, and everyone starts simulating after they have.
  // A problem opening it on one process stops them all (none may wait for the others forever):
  // each passes its error, or nothing, to the others.
  const SearchPeers& peers = opt.peers;
  std::optional<SearchJournal> own;
  const auto step = [&](bool mine, auto&& open) {
    std::exception_ptr error;
    std::string message;
    if (mine) try {
        open();
      } catch (const std::exception& e) {
        error = std::current_exception();
        message = e.what();
      }
    if (peers.size > 1)
      for (const std::string& other : peers.allgather(message))
        if (!error && !other.empty())
          throw ConfigError({Diagnostic{opt.out_file, "", "", "another process of the search failed: " + other}});
    if (error) std::rethrow_exception(error);
  };
  step(peers.rank == 0, [&] {
    own.emplace(opt.out_file, opt.resume, search_fingerprint(base, space.fidelity), journal_checks(ctx),
                base.input_files());
  });
  step(peers.rank != 0, [&] {
    own.emplace(SearchJournal::ReadOnly{}, opt.out_file, opt.resume, search_fingerprint(base, space.fidelity),
                journal_checks(ctx));
  });
  SearchJournal& journal = *own;
  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<RankedPlan> results = simulate_waves(ctx, cands, top_k, journal, rep);
  journal.finish();
  rep.simulation_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();

  rank_results(results, rep);
  screen_correlation(rep);
  return rep;
}

nlohmann::json to_json(const SearchReport& r, int top) {
  nlohmann::json j;
  j["space_size"] = r.space_size;
  j["valid_plans"] = r.valid;
  j["fit_in_memory_estimate"] = r.screened_fit;
  j["simulated"] = r.simulated;
  j["resumed"] = r.resumed;
  j["objective"] = objective_name(r.objective);
  if (r.error_band) j["step_time_error_band"] = to_json(*r.error_band);
  j["screen_rank_correlation"] = std::isfinite(r.screen_rank_correlation) ? nlohmann::json(r.screen_rank_correlation)
                                                                          : nlohmann::json(nullptr);
  j["screen_rank_correlation_plans"] = r.correlation_plans;
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  j["replayed_plans"] = r.replayed;
  j["refined_plans"] = r.refined;
  j["screen_vs_fast_correlation"] = num(r.screen_vs_fast_correlation);
  j["fast_vs_final_correlation"] = num(r.fast_vs_final_correlation);
  auto entry = [](const RankedPlan& p, int rank) {
    nlohmann::json e = result_json(p);
    e["rank"] = rank;
    e["key"] = p.key;
    e["label"] = p.label;
    e["plan"] = p.plan_json;
    e["estimate"] = {{"step_time_s", p.estimate.step_s},
                     {"pipeline_replayed", p.estimate.replayed},
                     {"tokens_per_s", p.estimate.tokens_per_s},
                     {"peak_memory_bytes", p.estimate.peak_memory_bytes},
                     {"bottleneck", p.estimate.bottleneck}};
    if (p.fast_step_s > 0) e["estimate"]["fast_simulation_step_time_s"] = p.fast_step_s;
    return e;
  };
  nlohmann::json ranked = nlohmann::json::array(), pareto = nlohmann::json::array();
  for (std::size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i) ranked.push_back(entry(r.ranked[i], static_cast<int>(i) + 1));
  for (const auto& p : r.pareto) pareto.push_back(entry(p, 0));
  j["ranked"] = ranked;
  j["pareto"] = pareto;
  nlohmann::json inf = nlohmann::json::array();
  for (const auto& p : r.infeasible) inf.push_back({{"key", p.key}, {"reason", p.infeasible_reason}});
  j["simulated_infeasible"] = inf;
  return j;
}

std::string to_csv(const SearchReport& r, int top) {
  std::ostringstream os;
  os << "rank,key,tokens_per_s,mfu,step_time_s,peak_memory_gib,headroom_gib,bottleneck,estimated_step_time_s\n";
  for (std::size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i) {
    const auto& p = r.ranked[i];
    os << i + 1 << "," << p.key << "," << p.tokens_per_s << "," << p.mfu << "," << p.step_time_s << ","
       << p.peak_memory_bytes / (1 << 30) << "," << p.headroom_bytes / (1 << 30) << "," << p.bottleneck << ","
       << p.estimate.step_s << "\n";
  }
  return os.str();
}

}  // namespace moesim::strategies
