// Straggler runs (simulation.stragglers): every step asked for, the one nearest the mean
// reported, the same step with nothing slow for the hit, and each gate's collectives and wait.
#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "moesim/sim/progress.hpp"
#include "simulate_step.hpp"

namespace moesim::strategies {

namespace {

/// Which collectives a gating device holds back: those of its groups with other members (a slow
/// NIC only those that leave the server).
std::vector<std::string> gated_collectives(const Scenario& s, const Lowered& low, const StragglerGate& g) {
  const Plan& p = s.plan;
  std::vector<std::string> out;
  const bool compute = g.slowdown > 1.0;
  const SimRank* rank = nullptr;
  for (const SimRank& r : low.ranks)
    if (r.global_rank == g.device) rank = &r;
  auto leaves = [&](Stream st) { return rank != nullptr && (rank->scale_out_streams >> static_cast<int>(st) & 1) != 0; };
  auto add = [&](bool has, Stream st, const std::string& what) {
    if (has && (compute || leaves(st))) out.push_back(what);
  };
  add(p.tp > 1, Stream::Tp, fmt::format("tensor-parallel collectives (TP{})", p.tp));
  add(p.cp > 1, Stream::Cp, fmt::format("context-parallel ring (CP{})", p.cp));
  add(s.model.is_moe() && p.ep_size() > 1, Stream::Ep, fmt::format("expert all-to-all (EP{})", p.ep_size()));
  add(p.dp * p.cp > 1, Stream::Dp, fmt::format("data-parallel gradient reduction (DP{})", p.dp * p.cp));
  if (p.pp > 1 && compute)
    out.push_back(g.stage == 0 ? "pipeline sends to stage 1"
                  : g.stage == p.pp - 1
                      ? fmt::format("pipeline sends to stage {}", g.stage - 1)
                      : fmt::format("pipeline sends to stages {} and {}", g.stage - 1, g.stage + 1));
  return out;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const std::size_t i = static_cast<std::size_t>(pos);
  const double frac = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - frac) + v[i + 1] * frac : v[i];
}

}  // namespace

Simulation simulate_stragglers(const Scenario& s, const CancelFlag* cancel, bool memory_detail) {
  const Stragglers& g = s.simulation.stragglers;
  const auto t0 = std::chrono::steady_clock::now();
  StragglerResult sr;
  std::vector<Simulation> runs;
  for (int k = 0; k < g.steps; ++k) {
    Scenario sk = s;
    sk.simulation.step_index = k;
    if (sim::Progress* p = progress_of(cancel)) p->set_context(fmt::format("step {} of {}", k + 1, g.steps));
    runs.push_back(simulate_step(sk, cancel, memory_detail && k == 0));
    sr.step_times_s.push_back(runs.back().result.step_time_s);
  }
  double mean = 0;
  for (double t : sr.step_times_s) mean += t / static_cast<double>(sr.step_times_s.size());
  sr.mean_s = mean;
  sr.p50_s = quantile(sr.step_times_s, 0.5);
  sr.p99_s = quantile(sr.step_times_s, 0.99);
  sr.min_s = *std::min_element(sr.step_times_s.begin(), sr.step_times_s.end());
  sr.max_s = *std::max_element(sr.step_times_s.begin(), sr.step_times_s.end());
  for (std::size_t k = 0; k < runs.size(); ++k)
    if (std::abs(sr.step_times_s[k] - mean) < std::abs(sr.step_times_s[sr.reported_step] - mean))
      sr.reported_step = static_cast<int>(k);
  Simulation out = std::move(runs[sr.reported_step]);
  runs.clear();
  Scenario ideal = s;
  ideal.simulation.stragglers = Stragglers{};
  if (sim::Progress* p = progress_of(cancel)) p->set_context("the same step with nothing slow");
  sr.ideal_step_s = simulate_step(ideal, cancel, false).result.step_time_s;
  if (sim::Progress* p = progress_of(cancel)) p->set_context("");
  const StragglerInfo& info = out.lowered.stragglers;
  sr.slow_devices = info.slow_devices;
  sr.slow_nics = info.slow_nics;
  sr.column_size = info.column_size;
  // What each gate's stage spent waiting for it: the imbalance wait of that stage's ranks
  // that do not gate there, weighted as they stand for the stage's devices.
  std::vector<int> owner(out.lowered.graph.num_resources(), -1);
  for (std::size_t i = 0; i < out.lowered.ranks.size(); ++i)
    for (sim::ResourceId res : out.lowered.ranks[i].streams) owner[res] = static_cast<int>(i);
  for (const StragglerGate& gate : info.gates) {
    StragglerResult::Gate rg{gate.stage, gate.device, gate.slowdown, gate.nic_bandwidth,
                             gated_collectives(s, out.lowered, gate), 0.0};
    double wsum = 0, wait = 0;
    for (std::size_t i = 0; i < out.lowered.ranks.size(); ++i) {
      const SimRank& r = out.lowered.ranks[i];
      if (r.stage != gate.stage || r.global_rank == gate.device) continue;
      bool gates_here = false;
      for (const StragglerGate& o : info.gates) gates_here = gates_here || o.device == r.global_rank;
      if (gates_here) continue;
      wait += r.weight * rank_times(out.lowered.graph, out.run, r, static_cast<int>(i), owner, out.run.makespan)
                             .b.imbalance_wait_s;
      wsum += r.weight;
    }
    rg.wait_s = wsum > 0 ? wait / wsum : 0.0;
    sr.gates.push_back(std::move(rg));
  }
  out.result.stragglers = std::move(sr);
  out.result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace moesim::strategies
