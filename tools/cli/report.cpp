#include "moesim/strategies/plan/schedule.hpp"
#include "report.hpp"

#include <fmt/format.h>

namespace moesim::tools {
namespace {

/// "1.54 M", "441.9 k", "441.9 " (the space before the unit is always there).
std::string human(double x) {
  if (x >= 1e9) return fmt::format("{:.2f} G", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f} M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f} k", x / 1e3);
  return fmt::format("{:.1f} ", x);
}

double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

const char* recompute_name(strategies::Recompute r) {
  switch (r) {
    case strategies::Recompute::None: return "no recompute";
    case strategies::Recompute::Selective: return "selective recompute";
    case strategies::Recompute::Full: return "full recompute";
    case strategies::Recompute::SelectiveOp: return "operator-level selective recompute";
  }
  return "";
}

/// "33 published atlas-800t-a2 runs, leave-one-source-out": what a band stands on (the scope is
/// left out when the band is the overall one).
std::string band_basis(const strategies::ErrorBand& b) {
  return fmt::format("{} published {}runs, leave-one-source-out", b.runs, b.scope == "all" ? "" : b.scope + " ");
}

}  // namespace

std::string human_count(double x) {
  if (x >= 1e12) return fmt::format("{:.2f}T", x / 1e12);
  if (x >= 1e9) return fmt::format("{:.2f}G", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f}k", x / 1e3);
  return fmt::format("{:.0f}", x);
}

std::string format_plan_line(const strategies::Scenario& s) {
  const auto& p = s.plan;
  std::string plan = fmt::format("TP{}{} PP{}", p.tp, p.sequence_parallel && p.tp > 1 ? "+SP" : "", p.pp);
  if (p.vpp > 1) plan += fmt::format(" VPP{}", p.vpp);
  if (s.model.is_moe()) {
    plan += fmt::format(" EP{}{}", p.ep_size(), p.moe_tp_extend_ep ? " (TP-extend-EP)" : "");
    if (p.etp_size() > 1) plan += fmt::format(" ETP{}", p.etp_size());
  }
  if (p.cp > 1) plan += fmt::format(" CP{}", p.cp);
  plan += fmt::format(" DP{}", p.dp);
  std::string extras = recompute_name(p.recompute);
  if (p.distributed_optimizer) extras += ", distributed optimizer";
  // Only what the plan does: a two-phase all-to-all needs an expert group across servers, TP
  // overlap a TP group, the MoE overlaps more than one expert-parallel rank.
  const bool moe_ep = s.model.is_moe() && p.ep_size() > 1;
  const bool ep_spans = moe_ep && 1LL * p.ep_size() * p.etp_size() > s.cluster.devices_per_node;
  if (p.adaptive_pipe_overlap && ep_spans)
    extras += ", Adaptive Pipe Overlap (hierarchical all-to-all, phases overlapped, fb-overlap)";
  else if (ep_spans && p.alltoall == strategies::AllToAllAlgo::Hierarchical) extras += ", hierarchical all-to-all";
  if (ep_spans && p.alltoall == strategies::AllToAllAlgo::AllGather)
    extras += ", all-gather + intra-server all-to-all (MindSpeed)";
  if (moe_ep && p.fb_overlap && !p.adaptive_pipe_overlap) extras += ", forward-backward overlap";
  if (moe_ep && p.shared_expert_overlap) extras += ", shared expert overlapped";
  if (p.tp_comm_overlap && p.tp > 1) extras += ", TP comm overlapped with GEMMs";
  if (!s.software.name.empty()) extras += ", software " + s.software.name;
  if (p.overlap_grad_reduce) extras += ", overlapped DP";
  if (p.swap_activations > 0) extras += fmt::format(", {:.0f}% of activations swapped to host", 100 * p.swap_activations);
  if (p.swap_optimizer) extras += ", optimizer states in host memory";
  if (p.offload_weights) extras += ", weights in host memory (streamed per layer)";
  return fmt::format(
      "{} on {} x {} ({}{})\nplan: {} | mbs {}, {} micro-batches, seq {}, global batch {}, {}\n      {}", s.model_name,
      s.cluster.devices, s.cluster.device.name, s.cluster.name,
      s.cluster.node_capacity > s.cluster.devices_per_node
          ? fmt::format(", {} of {} devices per scale-up domain", s.cluster.devices_per_node, s.cluster.node_capacity)
          : "",
      plan, p.mbs, p.num_microbatches, s.training.seq_length,
      s.training.global_batch_size, models::precision_name(s.training.precision), extras);
}

std::string format_result_table(const strategies::Result& r, const strategies::Scenario& s, bool wall_time,
                                const strategies::CriticalPath* critical) {
  std::string o;
  o += fmt::format("moesim {}: {}\n\n", strategies::kVersion, format_plan_line(s));
  o += fmt::format("  {:<22}{:.3f} s", "step time", r.step_time_s);
  if (r.error_band)
    o += fmt::format("  (typically within ±{:.0f}%: {})", r.error_band->within_pct, band_basis(*r.error_band));
  o += "\n";
  o += fmt::format("  {:<22}{}tokens/s ({:.1f} per device)\n", "throughput", human(r.tokens_per_s),
                   r.tokens_per_s_per_device);
  // The headline MFU under the scenario's definition, the other two beside it.
  {
    using strategies::MfuDefinition;
    const MfuDefinition d = s.simulation.mfu_definition;
    std::string others;
    auto other = [&](MfuDefinition k, const char* name, double v) {
      if (k != d) others += fmt::format("{}{}: {:.1f}%", others.empty() ? "" : ", ", name, 100 * v);
    };
    other(MfuDefinition::Moesim, "model FLOPs", r.mfu);
    other(MfuDefinition::Megatron, "Megatron's formula", r.mfu_megatron);
    other(MfuDefinition::Huawei, "Huawei-style", r.mfu_huawei);
    const char* label = d == MfuDefinition::Megatron ? "MFU (Megatron) / HFU"
                        : d == MfuDefinition::Huawei ? "MFU (Huawei) / HFU"
                                                     : "MFU / HFU";
    o += fmt::format("  {:<22}{:.1f}% / {:.1f}%   ({} MFU)\n", label, 100 * strategies::mfu_under(r, d), 100 * r.hfu, others);
  }
  o += fmt::format("  {:<22}{:.1f} TFLOP/s per device (peak {:.1f})\n", "model FLOP rate", r.achieved_tflops_per_device,
                   r.peak_tflops_per_device);
  o += fmt::format("  {:<22}{:.1f} of {:.1f} GiB per device{}\n", "peak memory", gib(r.peak_memory_bytes),
                   gib(r.capacity_bytes), r.memory_fits ? "" : "  (DOES NOT FIT)");
  o += fmt::format("  {:<22}{:.1f}% of {:.3f} s communication per device\n", "comm hidden",
                   100 * r.comm_overlap_fraction, r.comm_seconds_per_device);
  if (s.model.is_moe()) {
    const auto& el = r.expert_load;
    o += fmt::format("  {:<22}{} routing: max/mean {:.2f} (worst {:.2f}), imbalance {:.3f}", "expert load", el.routing,
                     el.max_over_mean, el.max_over_mean_worst, el.imbalance_score);
    if (el.drop_rate > 0) o += fmt::format(", {:.2f}% dropped", 100 * el.drop_rate);
    o += "\n";
  }
  if (r.stragglers) {
    const auto& sr = *r.stragglers;
    o += fmt::format("  {:<22}{} slow device{}, {} slow NIC{}: step {:.3f} s against {:.3f} s with none ({:+.1f}%)\n",
                     "stragglers", sr.slow_devices, sr.slow_devices == 1 ? "" : "s", sr.slow_nics,
                     sr.slow_nics == 1 ? "" : "s", r.step_time_s, sr.ideal_step_s,
                     sr.ideal_step_s > 0 ? 100 * (r.step_time_s / sr.ideal_step_s - 1) : 0.0);
    if (sr.step_times_s.size() > 1)
      o += fmt::format("  {:<22}{} steps: mean {:.3f} s, p50 {:.3f} s, p99 {:.3f} s (min {:.3f}, max {:.3f}); step {} "
                       "reported\n",
                       "step-time spread", sr.step_times_s.size(), sr.mean_s, sr.p50_s, sr.p99_s, sr.min_s, sr.max_s,
                       sr.reported_step);
    const std::size_t shown = std::min<std::size_t>(sr.gates.size(), 8);
    for (std::size_t i = 0; i < shown; ++i) {
      const auto& g = sr.gates[i];
      std::string what;
      for (const auto& x : g.gates) what += (what.empty() ? "" : ", ") + x;
      o += fmt::format("  {:<22}stage {}: device {} ({}) holds back {}; its stage waits {:.3f} s\n",
                       i == 0 ? "the step is gated by" : "", g.stage, g.device,
                       g.slowdown > 1 && g.nic_bandwidth < 1
                           ? fmt::format("{:.2f}x slower, NIC at {:.0f}%", g.slowdown, 100 * g.nic_bandwidth)
                       : g.slowdown > 1 ? fmt::format("{:.2f}x slower", g.slowdown)
                                        : fmt::format("NIC at {:.0f}%", 100 * g.nic_bandwidth),
                       what.empty() ? "nothing (no collective)" : what, g.wait_s);
    }
    if (sr.gates.size() > shown) o += fmt::format("  {:<22}... and {} more stages\n", "", sr.gates.size() - shown);
  }
  if (!r.feasible) o += fmt::format("  {:<22}{}\n", "INFEASIBLE", r.infeasible_reason);

  o += "\n  where the time goes (per device)       seconds    share\n";
  const auto& b = r.breakdown;
  auto row = [&](const char* name, double v) {
    o += fmt::format("    {:<34}{:>9.3f}  {:>6.1f}%\n", name, v, r.step_time_s > 0 ? 100 * v / r.step_time_s : 0.0);
  };
  row("compute", b.compute_s);
  if (b.recompute_s > 0) row("  of which recompute", b.recompute_s);
  row("tensor-parallel comm (exposed)", b.tp_comm_s);
  if (s.plan.cp > 1) row("context-parallel comm (exposed)", b.cp_comm_s);
  if (s.model.is_moe()) row("expert all-to-all (exposed)", b.ep_comm_s);
  row("pipeline send/recv (exposed)", b.pp_comm_s);
  row("data-parallel comm (exposed)", b.dp_comm_s);
  row("pipeline bubble", b.bubble_s);
  if (r.stragglers) row("imbalance wait (stragglers)", b.imbalance_wait_s);
  else if (s.model.is_moe()) row("expert imbalance wait", b.imbalance_wait_s);
  if (s.plan.swap_activations > 0 || s.plan.swap_optimizer || s.plan.offload_weights) row("swap to host (exposed)", b.swap_s);
  if (s.simulation.launch_overhead > 0) row("host-bound (kernel launch)", b.host_bound_s);
  row("optimizer and other", b.other_s);

  if (critical != nullptr)
    o += fmt::format("\n  the step is gated by: {}\n", strategies::describe_critical_path(*critical));
  o += "\n  pipeline stages\n";
  o += fmt::format("    {:>5} {:>6} {:>9} {:>9} {:>9} {:>9}  {}\n", "stage", "layers", "mem GiB", "act GiB", "compute",
                   "bubble", "chunks");
  // Long pipelines: the first stages, the stage with the most memory, and the last ones.
  std::size_t peak = 0;
  for (std::size_t i = 0; i < r.stages.size(); ++i)
    if (r.stages[i].memory.total() > r.stages[peak].memory.total()) peak = i;
  const std::size_t n = r.stages.size();
  bool skipped = false;
  for (std::size_t i = 0; i < n; ++i) {
    const bool show = n <= 16 || i < 4 || i + 3 >= n || i == peak;
    if (!show) {
      if (!skipped) o += "      ...\n";
      skipped = true;
      continue;
    }
    skipped = false;
    const auto& st = r.stages[i];
    std::string chunks;
    for (const auto& c : st.chunks) chunks += (chunks.empty() ? "" : " | ") + c;
    if (chunks.size() > 60) chunks = chunks.substr(0, 57) + "...";
    o += fmt::format("    {:>5} {:>6} {:>9.1f} {:>9.1f} {:>8.2f}s {:>8.2f}s  {}{}\n", st.stage, st.decoder_layers,
                     gib(st.memory.total()), gib(st.memory.activations_bytes), st.breakdown.compute_s,
                     st.breakdown.bubble_s, chunks, i == peak && n > 16 ? "  (peak memory)" : "");
  }
  o += fmt::format("\n  simulated {} ranks, {} tasks, {} events ({} fidelity){}\n", r.ranks_simulated, r.tasks, r.events,
                   r.fidelity, wall_time ? fmt::format(" in {:.3f} s", r.wall_s) : std::string());
  return o;
}

}  // namespace moesim::tools

namespace moesim::tools {

std::string short_plan(const strategies::Plan& p, const models::ModelSpec& m) { return strategies::plan_label(p, m); }

std::string format_search_table(const strategies::SearchReport& r, const strategies::Scenario& s, int top,
                                bool wall_time) {
  std::string o;
  o += fmt::format("moesim {} search: {} on {} x {} ({}), seq {}, global batch {}, {}\n", strategies::kVersion,
                   s.model_name, s.cluster.devices, s.cluster.device.name, s.cluster.name, s.training.seq_length,
                   s.training.global_batch_size, models::precision_name(s.training.precision));
  o += fmt::format("space {:.0f} plans, {} divide, {} estimated to fit; {} event-simulated{}; objective {}\n\n",
                   r.space_size, r.valid, r.screened_fit, r.simulated,
                   r.resumed ? fmt::format(" (+{} resumed)", r.resumed) : std::string(), objective_name(r.objective));
  if (r.error_band) {
    o.pop_back();  // the blank line goes after the band
    o += fmt::format("step times typically within ±{:.0f}% ({})\n\n", r.error_band->within_pct,
                     band_basis(*r.error_band));
  }
  // The plan column is as wide as its longest label (schedules and overlap flags make some long).
  std::size_t width = 40;
  for (std::size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i)
    width = std::max(width, short_plan(r.ranked[i].plan, s.model).size());
  for (const auto& p : r.pareto) width = std::max(width, short_plan(p.plan, s.model).size());
  o += fmt::format("  {:>4}  {:<{}} {:>11} {:>6} {:>8} {:>9}  {:<10} {:>8}\n", "rank", "plan", width, "tokens/s", "MFU",
                   "step s", "free GiB", "bottleneck", "est. s");
  for (std::size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i) {
    const auto& p = r.ranked[i];
    o += fmt::format("  {:>4}  {:<{}} {:>11.0f} {:>5.1f}% {:>8.3f} {:>9.1f}  {:<10} {:>8.3f}\n", i + 1,
                     short_plan(p.plan, s.model), width, p.tokens_per_s, 100 * p.mfu, p.step_time_s,
                     p.headroom_bytes / (1024.0 * 1024 * 1024), p.bottleneck, p.estimate.step_s);
  }
  if (r.ranked.empty()) o += "  (no simulated plan fits in memory)\n";
  o += "\n  Pareto set, throughput vs memory headroom:\n";
  for (const auto& p : r.pareto)
    o += fmt::format("        {:<{}} {:>11.0f} tokens/s, {:>6.1f} GiB free\n", short_plan(p.plan, s.model), width,
                     p.tokens_per_s, p.headroom_bytes / (1024.0 * 1024 * 1024));
  if (!r.ranked.empty()) {
    o += "\n  best plan, as a \"parallelism\" section:\n  " + r.ranked.front().plan_json.dump() + "\n";
  }
  if (!r.infeasible.empty())
    o += fmt::format("\n  {} simulated plan{} exceeded memory (the screening estimate is approximate); not ranked\n",
                     r.infeasible.size(), r.infeasible.size() == 1 ? "" : "s");
  if (std::isfinite(r.screen_vs_fast_correlation) || std::isfinite(r.screen_rank_correlation)) {
    o += "\n  rank agreement (Spearman):";
    if (std::isfinite(r.screen_vs_fast_correlation))
      o += fmt::format(" screen vs fast simulation {:.2f} over the {} best screened;", r.screen_vs_fast_correlation,
                       r.refined);
    if (std::isfinite(r.fast_vs_final_correlation))
      o += fmt::format(" fast vs {} simulation {:.2f};", r.fidelity_name, r.fast_vs_final_correlation);
    if (std::isfinite(r.screen_rank_correlation))
      o += fmt::format(" screen vs {} simulation {:.2f} over the {} ranked", r.fidelity_name, r.screen_rank_correlation,
                       r.correlation_plans);
    o += "\n";
  }
  if (wall_time)
    o += fmt::format("\n  screening {:.2f} s ({:.0f} plans/s on {}{} threads), pipelines of {} replayed {:.2f} s, "
                     "fast simulation of {} {:.2f} s, simulation {:.2f} s\n",
                     r.screening_s, r.valid / std::max(1e-9, r.screening_s),
                     r.processes > 1 ? fmt::format("{} processes x ", r.processes) : std::string(), r.threads,
                     r.replayed, r.replay_s, r.refined, r.refine_s, r.simulation_s);
  return o;
}

std::string format_model_search_table(const strategies::ModelSearchReport& r, const strategies::Scenario& s,
                                      bool wall_time) {
  std::string o = fmt::format("moesim {} model search: {} candidates of {} on {} x {} ({}), seq {}, global batch {}\n\n",
                              strategies::kVersion, r.candidates.size(), s.model_name, s.cluster.devices,
                              s.cluster.device.name, s.cluster.name, s.training.seq_length, s.training.global_batch_size);
  // The candidates' own keys, as columns.
  std::vector<std::string> keys;
  for (const auto& c : r.candidates)
    for (const auto& [k, v] : c.overrides.items())
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  std::string head = fmt::format("  {:>4} ", "rank");
  for (const auto& k : keys) head += fmt::format(" {:>{}}", k, std::max<std::size_t>(6, k.size()));
  head += fmt::format("  {:>8} {:>8}  {:>11} {:>6} {:>8} {:>7}  {}\n", "total", "active", "tokens/s", "MFU", "step s",
                      "vs best", "best plan");
  o += head;
  double best = 0;
  for (const auto& c : r.candidates)
    if (c.best) best = std::max(best, c.best->tokens_per_s);
  int rank = 0;
  for (const auto& c : r.candidates) {
    std::string line = c.best ? fmt::format("  {:>4} ", ++rank) : std::string("     - ");
    for (const auto& k : keys) {
      const auto it = c.overrides.find(k);
      line += fmt::format(" {:>{}}", it == c.overrides.end() ? std::string("") : it->dump(),
                          std::max<std::size_t>(6, k.size()));
    }
    line += fmt::format("  {:>7.1f}B {:>7.1f}B", c.total_params / 1e9, c.active_params / 1e9);
    if (c.best)
      line += fmt::format("  {:>11.0f} {:>5.1f}% {:>8.3f} {:>+6.1f}%  {}", c.best->tokens_per_s, 100 * c.best->mfu,
                          c.best->step_time_s, 100 * (c.best->tokens_per_s / best - 1), short_plan(c.best->plan, s.model));
    else
      line += "  " + c.skipped;
    o += line + "\n";
  }
  o += "\n  each candidate's best plan from a search of the scenario's space (its top plans event-simulated)\n";
  if (wall_time) o += fmt::format("  {:.1f} s\n", r.wall_s);
  return o;
}

}  // namespace moesim::tools
