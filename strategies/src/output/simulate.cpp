#include "moesim/strategies/output/simulate.hpp"

#include <unistd.h>
#include "moesim/strategies/plan/schedule.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <stdexcept>

#include <fmt/format.h>

#include "moesim/models/presets.hpp"
#include "moesim/sim/progress.hpp"
#include "moesim/topologies/topology.hpp"
#include "simulate_step.hpp"

namespace moesim::strategies {
namespace {

using Interval = std::pair<Tick, Tick>;

std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& iv : v) {
    if (iv.second <= iv.first) continue;
    if (!out.empty() && iv.first <= out.back().second) out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}

Tick measure(const std::vector<Interval>& v) {
  Tick t = 0;
  for (const auto& iv : v) t += iv.second - iv.first;
  return t;
}

/// Length of a minus b (both merged).
Tick measure_minus(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  Tick total = 0;
  std::size_t j = 0;
  for (const auto& iv : a) {
    Tick cur = iv.first;
    while (j < b.size() && b[j].second <= cur) ++j;
    std::size_t k = j;
    while (cur < iv.second) {
      if (k >= b.size() || b[k].first >= iv.second) {
        total += iv.second - cur;
        break;
      }
      if (b[k].first > cur) total += b[k].first - cur;
      cur = std::max(cur, b[k].second);
      ++k;
    }
  }
  return total;
}

/// Covered length of `iv` by `others` (merged, sorted); `j` carries the scan position between
/// calls with non-decreasing starts.
Tick covered(const std::vector<Interval>& others, std::size_t& j, Interval iv) {
  while (j < others.size() && others[j].second <= iv.first) ++j;
  Tick c = 0;
  for (std::size_t k = j; k < others.size() && others[k].first < iv.second; ++k)
    c += std::min(iv.second, others[k].second) - std::max(iv.first, others[k].first);
  return c;
}

std::vector<Interval> union_of(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> v(a);
  v.insert(v.end(), b.begin(), b.end());
  return merged(std::move(v));
}

}  // namespace

/// `owner[res]`: the simulated rank whose stream `res` is (-1 for links).
RankTimes rank_times(const sim::TaskGraph& g, const sim::RunResult& run, const SimRank& r, int self,
                     const std::vector<int>& owner, Tick makespan) {
  RankTimes rt;
  // Waiting for slower peers: a task several simulated ranks share (a collective whose members
  // are all simulated) starts when its last member is ready; the time this rank was ready
  // before that — its own previous task on the stream and its own inputs done — is imbalance
  // wait where nothing else of the rank runs. Stragglers further up the pipeline reach this
  // rank later and show as bubble.
  std::vector<Interval> waits;
  for (int s = 0; s < kNumStreams; ++s) {
    Tick prev_end = 0;
    for (sim::TaskId t : g.stream_order(r.streams[s])) {
      bool shared = false;
      for (sim::ResourceId res : g.resources_of(t)) shared = shared || (owner[res] >= 0 && owner[res] != self);
      if (shared) {
        Tick ready = prev_end;
        for (sim::TaskId p : g.predecessors(t))
          for (sim::ResourceId res : g.resources_of(p))
            if (owner[res] == self) {
              ready = std::max(ready, run.end[p]);
              break;
            }
        if (run.start[t] > ready) waits.emplace_back(ready, run.start[t]);
      }
      prev_end = run.end[t];
    }
  }
  std::vector<Interval> compute_busy, host_passes;
  Tick compute = 0, recompute = 0, optimizer = 0;
  for (sim::TaskId t : g.stream_order(r.streams[static_cast<int>(Stream::Compute)])) {
    const Tick d = run.end[t] - run.start[t];
    if (d <= 0) continue;
    const auto c = g.category(t);
    if (c == kLaunch) {  // fast fidelity: the host thread's share of a pass, the device waiting
      host_passes.emplace_back(run.start[t], run.end[t]);
      continue;
    }
    compute_busy.emplace_back(run.start[t], run.end[t]);
    if (c == kRecompute) recompute += d;
    else if (c == kOptimizer) optimizer += d;
    else compute += d;
  }
  compute_busy = merged(std::move(compute_busy));
  // Communication by category, in priority order for attributing exposed time.
  const sim::Category order[] = {kTpComm, kCpComm, kEpComm, kPpComm, kDpComm, kSwap};
  std::array<std::vector<Interval>, kNumCats> comm;
  for (int s = 1; s < kNumStreams; ++s) {
    if (s == static_cast<int>(Stream::Launch)) continue;  // host work, not device activity
    for (sim::TaskId t : g.stream_order(r.streams[s]))
      if (run.end[t] > run.start[t]) comm[g.category(t)].emplace_back(run.start[t], run.end[t]);
  }
  // Host-bound: a kernel whose launch came after everything else it waited for (its previous
  // kernel and its inputs) kept the device waiting for the host from then until it started.
  std::vector<Interval> host_waits;
  {
    const sim::ResourceId launch_stream = r.streams[static_cast<int>(Stream::Launch)];
    Tick prev_end = 0;
    for (sim::TaskId t : g.stream_order(r.streams[static_cast<int>(Stream::Compute)])) {
      Tick ready = prev_end, launched = -1;
      for (sim::TaskId p : g.predecessors(t)) {
        const auto res = g.resources_of(p);
        if (res.size() == 1 && res[0] == launch_stream) launched = std::max(launched, run.end[p]);
        else ready = std::max(ready, run.end[p]);
      }
      if (launched > ready && run.start[t] > ready) host_waits.emplace_back(ready, run.start[t]);
      prev_end = run.end[t];
    }
  }
  std::vector<Interval> covered = compute_busy;
  std::array<Tick, kNumCats> exposed{};
  for (sim::Category c : order) {
    auto u = merged(std::move(comm[c]));
    const Tick total = measure(u);
    const Tick visible = measure_minus(u, covered);
    exposed[c] = visible;
    rt.comm_total += to_seconds(total).value();
    rt.comm_hidden += to_seconds(total - measure_minus(u, compute_busy)).value();
    covered = union_of(covered, u);
  }
  const std::vector<Interval> host_pass_iv = merged(std::move(host_passes));
  const Tick host_passes_visible = measure_minus(host_pass_iv, covered);
  covered = union_of(covered, host_pass_iv);
  const Tick idle = makespan - measure(covered);
  const std::vector<Interval> wait_iv = merged(std::move(waits));
  const Tick waiting = measure_minus(wait_iv, covered);
  const Tick host_waiting = measure_minus(merged(std::move(host_waits)), union_of(covered, wait_iv));
  const Tick host_bound = host_waiting + host_passes_visible;
  rt.b.compute_s = to_seconds(compute + recompute).value();
  rt.b.recompute_s = to_seconds(recompute).value();
  rt.b.other_s = to_seconds(optimizer).value();
  rt.b.tp_comm_s = to_seconds(exposed[kTpComm]).value();
  rt.b.cp_comm_s = to_seconds(exposed[kCpComm]).value();
  rt.b.ep_comm_s = to_seconds(exposed[kEpComm]).value();
  rt.b.pp_comm_s = to_seconds(exposed[kPpComm]).value();
  rt.b.dp_comm_s = to_seconds(exposed[kDpComm]).value();
  rt.b.swap_s = to_seconds(exposed[kSwap]).value();
  rt.b.imbalance_wait_s = to_seconds(waiting).value();
  rt.b.host_bound_s = to_seconds(host_bound).value();
  rt.b.bubble_s = to_seconds(std::max<Tick>(0, idle - waiting - host_waiting)).value();
  return rt;
}

namespace {

/// One engine run, reported as a phase of `cancel`'s progress (its total: every task ends once).
sim::RunResult run_engine(const sim::TaskGraph& g, const CancelFlag* cancel, std::string phase) {
  sim::begin_phase(progress_of(cancel), std::move(phase), g.num_tasks());
  return sim::Engine(g, cancel).run();
}

void add_scaled(Breakdown& a, const Breakdown& b, double w) {
  a.compute_s += w * b.compute_s;
  a.tp_comm_s += w * b.tp_comm_s;
  a.cp_comm_s += w * b.cp_comm_s;
  a.ep_comm_s += w * b.ep_comm_s;
  a.pp_comm_s += w * b.pp_comm_s;
  a.dp_comm_s += w * b.dp_comm_s;
  a.swap_s += w * b.swap_s;
  a.host_bound_s += w * b.host_bound_s;
  a.bubble_s += w * b.bubble_s;
  a.imbalance_wait_s += w * b.imbalance_wait_s;
  a.other_s += w * b.other_s;
  a.recompute_s += w * b.recompute_s;
}

std::string item_name(const models::Workload& w, int idx) {
  const auto& it = w.items[idx];
  switch (it.kind) {
    case models::ItemKind::Embedding: return "emb";
    case models::ItemKind::Decoder: return "L" + std::to_string(it.index);
    case models::ItemKind::Head: return "head";
    case models::ItemKind::Mtp: return "mtp" + std::to_string(it.index);
  }
  return "?";
}

std::string gib_text(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", b / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

/// The value of an input as the scenario wrote it (JSON text), or its effective value when it
/// came from a preset.
std::string input_text(const Scenario& s, const std::string& pointer, const std::string& effective) {
  try {
    const nlohmann::json::json_pointer ptr(pointer);
    if (s.document.contains(ptr)) return json_brief(s.document.at(ptr));
  } catch (const nlohmann::json::exception&) {
  }
  return effective + " (from the preset)";
}

/// A run stopped because a task would have ended past the engine's horizon: the inputs made the
/// step absurdly long. Names the inputs that set the failed task's duration, the implausible
/// ones first (or only), with their values as written.
ConfigError out_of_range_error(const Scenario& s, const Lowered& low, const sim::RunResult& run) {
  struct Input {
    std::string pointer, value;
    bool implausible;
    std::string why;
  };
  std::vector<Input> in;
  const auto& c = s.cluster;
  const auto& d = c.device;
  auto rate = [](double v) { return fmt::format("{:.4g} B/s", v); };
  const sim::Category cat = run.failed_task != sim::kNoTask ? low.graph.category(run.failed_task) : sim::Category{kCompute};
  // Typical ranges: real links move 12.5-900 GB/s per direction (hardware.md), real devices
  // 10-5000 TFLOP/s; published training sequences reach ~1M tokens.
  constexpr double kSlowLink = 1e8, kSlowDevice = 1e12, kLongSequence = 1 << 24;
  if (is_comm(cat)) {
    in.push_back({"/cluster/scale_up/link_bandwidth",
                  input_text(s, "/cluster/scale_up/link_bandwidth", rate(c.scale_up_link_bandwidth.value())),
                  c.scale_up_achieved().value() < kSlowLink, "a scale-up link below 100 MB/s is far slower than any real one"});
    in.push_back({"/cluster/scale_out/nic_bandwidth",
                  input_text(s, "/cluster/scale_out/nic_bandwidth", rate(c.nic_bandwidth.value())),
                  c.nic_achieved().value() < kSlowLink, "a NIC below 100 MB/s is far slower than any real one"});
  } else if (cat == kSwap) {
    in.push_back({"/cluster/device/host_bandwidth", input_text(s, "/cluster/device/host_bandwidth", rate(d.host_bandwidth.value())),
                  d.host_bandwidth.value() < kSlowLink, "a device-host link below 100 MB/s is far slower than any real one"});
  } else if (cat == kLaunch) {
    in.push_back({"/simulation/host_dispatch/launch_overhead",
                  input_text(s, "/simulation/host_dispatch/launch_overhead", format_seconds(s.simulation.launch_overhead)),
                  s.simulation.launch_overhead > 1.0, "a host time above 1 s per operator is far beyond any framework"});
  } else {
    const double peak = d.peak(s.training.precision).value();
    in.push_back({"/cluster/device/peak_flops", input_text(s, "/cluster/device/peak_flops", fmt::format("{:.4g} FLOP/s", peak)),
                  peak < kSlowDevice, "a device below 1 TFLOP/s is far slower than any training accelerator"});
    in.push_back({"/cluster/device/hbm/bandwidth",
                  input_text(s, "/cluster/device/hbm/bandwidth", rate(d.hbm_bandwidth.value())),
                  d.hbm_bandwidth.value() < kSlowLink, "a memory below 100 MB/s is far slower than any real HBM"});
  }
  in.push_back({"/training/seq_length", std::to_string(s.training.seq_length),
                static_cast<double>(s.training.seq_length) > kLongSequence,
                "sequences above 16M tokens are far beyond any published training run"});
  in.push_back({"/parallelism/micro_batch_size", std::to_string(s.plan.mbs), false, ""});
  const bool any = std::any_of(in.begin(), in.end(), [](const Input& i) { return i.implausible; });
  std::string task = "a task";
  if (run.failed_task != sim::kNoTask) {
    const auto& g = low.graph;
    const auto res = g.resources_of(run.failed_task);
    task = "'" + g.label_text(g.label(run.failed_task)) + "' (" + category_names()[cat] + ")" +
           (res.empty() ? std::string() : " on " + g.resource(res[0]).name);
  }
  const std::string what = fmt::format("makes one training step last longer than the simulator's horizon of {:.1f} days ({} would end past it)",
                                       to_seconds(kMaxTick).value() / 86400.0, task);
  std::vector<Diagnostic> diags;
  for (const Input& i : in) {
    if (any && !i.implausible) continue;
    diags.push_back(Diagnostic{s.file, i.pointer, i.value,
                               any ? what + ": " + i.why
                                   : "with the other inputs listed " + what + "; no single one is out of the ordinary"});
  }
  return ConfigError(std::move(diags));
}

/// Turns an engine run that did not complete into the right failure channel.
void check_run(const sim::RunResult& run, const Scenario& s, const Lowered& low) {
  if (run.completed) return;
  if (run.cancelled) throw Cancelled();
  if (run.out_of_range) throw out_of_range_error(s, low, run);
  throw InternalError(run.error + " (this is a bug in moesim's lowering)");
}

/// Interference of communication with compute on the same device: each compute kernel is
/// stretched by slowdown x (the share of its time overlapped by the rank's communication in the
/// previous run), and the engine re-runs; two passes settle the overlap pattern.
void slow_overlapped_compute(Simulation& out, const Scenario& s, const CancelFlag* cancel) {
  const double slowdown = s.simulation.comm_compute_slowdown;
  sim::TaskGraph& g = out.lowered.graph;
  std::vector<Tick> base(g.num_tasks());
  for (sim::TaskId t = 0; t < g.num_tasks(); ++t) base[t] = g.duration(t);
  for (int pass = 0; pass < 2; ++pass) {
    for (const SimRank& r : out.lowered.ranks) {
      std::vector<Interval> comm;
      for (int s = 1; s < kNumStreams; ++s) {
        if (s == static_cast<int>(Stream::Launch)) continue;
        for (sim::TaskId t : g.stream_order(r.streams[s]))
          if (out.run.end[t] > out.run.start[t]) comm.emplace_back(out.run.start[t], out.run.end[t]);
      }
      comm = merged(std::move(comm));
      std::size_t j = 0;  // the compute stream runs in order: one scan of the communication
      for (sim::TaskId t : g.stream_order(r.streams[static_cast<int>(Stream::Compute)])) {
        const Tick d = out.run.end[t] - out.run.start[t];
        if (d <= 0 || base[t] <= 0 || g.category(t) == kLaunch) continue;  // host waits are not kernels
        const double overlapped =
            static_cast<double>(covered(comm, j, {out.run.start[t], out.run.end[t]})) / static_cast<double>(d);
        g.set_duration(t, scale_ticks(base[t], 1.0 + slowdown * overlapped));
      }
    }
    out.run = run_engine(g, cancel, fmt::format("compute slowed by overlapped communication, pass {} of 2", pass + 1));
    check_run(out.run, s, out.lowered);
  }
}

/// Different collectives running at once through one port share it: a data-parallel
/// reduce-scatter under the expert all-to-all, pipeline sends beside both, tensor- and
/// data-parallel traffic on the same NVLink. Per simulated rank and tier (scale-up port or NIC),
/// a transfer that other streams' transfers on that tier overlap for a time o gets half the port
/// during o (both at full demand), so it takes its own duration + o / 2; the engine re-runs with
/// the new durations and measures o again, at most twice, as for compute interference. Every
/// overlapping transfer counts as full demand (a latency-bound one too). Each collective's own duration already shares links inside its group and with
/// the same collective of the other groups (the flow model); this adds the rest.
void share_ports(Simulation& out, const Scenario& s, const CancelFlag* cancel) {
  static constexpr std::array<Stream, 7> kComm{Stream::Tp, Stream::Cp, Stream::Ep,      Stream::Pp,
                                               Stream::Dp, Stream::DpReduce, Stream::EpIntra};
  sim::TaskGraph& g = out.lowered.graph;
  std::vector<Tick> base(g.num_tasks());
  for (sim::TaskId t = 0; t < g.num_tasks(); ++t) base[t] = g.duration(t);
  std::array<std::array<std::vector<sim::TaskId>, kComm.size()>, 2> tasks;  // [tier][stream]
  std::vector<Interval> others;
  for (int pass = 0; pass < 2; ++pass) {
    bool changed = false;
    for (const SimRank& r : out.lowered.ranks) {
      for (auto& tier : tasks)
        for (auto& v : tier) v.clear();
      for (std::size_t i = 0; i < kComm.size(); ++i) {
        const bool out_bit = (r.scale_out_streams >> static_cast<int>(kComm[i])) & 1u;
        for (sim::TaskId t : g.stream_order(r.streams[static_cast<int>(kComm[i])])) {
          if (base[t] <= 0 || out.run.end[t] <= out.run.start[t]) continue;
          bool nic = out_bit;
          if (kComm[i] == Stream::Pp) {
            const auto res = g.resources_of(t);
            nic = std::find(res.begin(), res.end(), r.nic) != res.end();
          }
          tasks[nic ? 1 : 0][i].push_back(t);
        }
      }
      for (const auto& tier : tasks) {
        for (std::size_t i = 0; i < kComm.size(); ++i) {
          if (tier[i].empty()) continue;
          others.clear();
          for (std::size_t k = 0; k < kComm.size(); ++k)
            if (k != i)
              for (sim::TaskId t : tier[k]) others.emplace_back(out.run.start[t], out.run.end[t]);
          if (others.empty()) continue;
          others = merged(std::move(others));
          std::size_t j = 0;
          for (sim::TaskId t : tier[i]) {
            const Interval iv{out.run.start[t], out.run.end[t]};
            const Tick o = covered(others, j, iv);
            const Tick d = base[t] + o / 2;
            if (d == g.duration(t)) continue;
            g.set_duration(t, d);
            changed = true;
          }
        }
      }
    }
    if (!changed) return;
    out.run = run_engine(g, cancel, "collectives sharing ports, re-run");
    check_run(out.run, s, out.lowered);
  }
}

}  // namespace

/// A result is printed only when it is sound: finite, non-negative times whose parts add up to
/// the step, finite non-negative memory. Anything else is a bug (exit 1), never an answer.
void check_result_invariants(const Result& r) {
  std::vector<std::string> bad;
  auto time_ok = [&](const char* name, double v) {
    if (!std::isfinite(v) || v < 0) bad.push_back(fmt::format("{} = {}", name, v));
  };
  auto parts_ok = [&](const std::string& where, const Breakdown& b, double step) {
    const std::pair<const char*, double> parts[] = {{"compute", b.compute_s}, {"tp_comm", b.tp_comm_s},
                                                    {"cp_comm", b.cp_comm_s}, {"ep_comm", b.ep_comm_s},
                                                    {"pp_comm", b.pp_comm_s}, {"dp_comm", b.dp_comm_s},
                                                    {"bubble", b.bubble_s},   {"imbalance_wait", b.imbalance_wait_s},
                                                    {"swap", b.swap_s},       {"host_bound", b.host_bound_s},
                                                    {"other", b.other_s},     {"recompute", b.recompute_s}};
    const double tol = 1e-6 * step + 1e-9;
    for (const auto& [name, v] : parts)
      if (!std::isfinite(v) || v < -tol) bad.push_back(fmt::format("{}breakdown {} = {}", where, name, v));
    if (std::abs(b.total() - step) > tol)
      bad.push_back(fmt::format("{}breakdown parts add up to {} s, not the step's {} s", where, b.total(), step));
  };
  time_ok("step_time_s", r.step_time_s);
  time_ok("tokens_per_s", r.tokens_per_s);
  time_ok("mfu", r.mfu);
  time_ok("hfu", r.hfu);
  time_ok("comm_s_per_device", r.comm_seconds_per_device);
  if (!(r.comm_overlap_fraction >= 0 && r.comm_overlap_fraction <= 1 + 1e-9))
    bad.push_back(fmt::format("comm_overlap_fraction = {}", r.comm_overlap_fraction));
  parts_ok("", r.breakdown, r.step_time_s);
  for (const StageResult& st : r.stages) {
    const MemoryBreakdown& m = st.memory;
    const std::pair<const char*, double> mem[] = {
        {"weights", m.weights_bytes},         {"gradients", m.gradients_bytes}, {"optimizer", m.optimizer_bytes},
        {"activations", m.activations_bytes}, {"transient", m.transient_bytes}, {"reserved", m.reserved_bytes},
        {"swapped", m.swapped_bytes}};
    for (const auto& [name, v] : mem)
      if (!std::isfinite(v) || v < 0) bad.push_back(fmt::format("stage {} memory {} = {}", st.stage, name, v));
    parts_ok(fmt::format("stage {} ", st.stage), st.breakdown, r.step_time_s);
  }
  if (!std::isfinite(r.peak_memory_bytes) || r.peak_memory_bytes < 0)
    bad.push_back(fmt::format("peak_memory_bytes = {}", r.peak_memory_bytes));
  if (bad.empty()) return;
  std::string msg = "the result breaks its invariants (this is a bug in moesim, not in the input):";
  for (std::size_t i = 0; i < bad.size() && i < 8; ++i) msg += (i ? "; " : " ") + bad[i];
  if (bad.size() > 8) msg += fmt::format("; and {} more", bad.size() - 8);
  throw InternalError(msg);
}

/// One step, or with stragglers (simulation.stragglers) every step asked for (simulate_stragglers).
Simulation simulate(const Scenario& s, const CancelFlag* cancel, bool memory_detail) {
  if (!s.simulation.stragglers.any()) return simulate_step(s, cancel, memory_detail);
  return simulate_stragglers(s, cancel, memory_detail);
}

namespace {

/// Memory of a simulation per task, measured as the peak resident size of `moesim simulate` on
/// the 718B with Zipf routing (every member of an expert-parallel group simulated): 18.4M tasks,
/// 1.98 GB, 107 bytes per task (task arrays and edges, the builder's edge list, start and end
/// times, the engine's wait lists, port sharing's base durations), rounded up.
constexpr double kBytesPerTask = 110;

double memory_limit(const Scenario& s) {
  if (s.simulation.max_memory_bytes > 0) return s.simulation.max_memory_bytes;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? 0.75 * static_cast<double>(pages) * static_cast<double>(page) : 16e9;
}

[[noreturn]] void refuse(const Scenario& s, double tasks, double ranks, const std::string& advice) {
  const double need = tasks * kBytesPerTask;
  throw ConfigError({Diagnostic{
      s.file, "/simulation/fidelity", "\"" + std::string(fidelity_name(s.simulation.fidelity)) + "\"",
      fmt::format("would simulate {:.0f} ranks in about {:.3g}M tasks, needing about {:.1f} GB ({:.0f} bytes per task), "
                  "above the {:.1f} GB limit (simulation.max_memory or --max-memory; by default 3/4 of this "
                  "machine's RAM); {}",
                  ranks, tasks / 1e6, need / 1e9, kBytesPerTask, memory_limit(s) / 1e9, advice)}});
}

/// Full fidelity simulates every device: its size is estimated from the default fidelity's
/// lowering (tasks per simulated rank x devices) and refused before anything large is built.
void check_full_fidelity_fits(const Scenario& s, const topologies::Topology& topo, const models::Workload& w,
                              const CancelFlag* cancel) {
  if (s.simulation.fidelity != Fidelity::Full) return;
  Scenario probe = s;
  probe.simulation.fidelity = Fidelity::Balanced;
  const Lowered low = lower(probe, topo, w, cancel, false);
  const double ranks = static_cast<double>(low.ranks.size());
  const double tasks = static_cast<double>(low.graph.num_tasks()) / std::max(1.0, ranks) * s.cluster.devices;
  if (tasks * kBytesPerTask > memory_limit(s))
    refuse(s, tasks, s.cluster.devices,
           fmt::format("the default fidelity \"balanced\" simulates the {:.0f} distinct ranks ({:.2f} GB) and "
                       "predicts the same step time",
                       ranks, static_cast<double>(low.graph.num_tasks()) * kBytesPerTask / 1e9));
}

}  // namespace

Simulation simulate_step(const Scenario& s, const CancelFlag* cancel, bool memory_detail) {
  const auto t0 = std::chrono::steady_clock::now();
  Simulation out;
  Result& r = out.result;
  const models::Workload w = models::build_workload(s.model, s.training.seq_length, s.training.workload);
  const topologies::Topology topo = topologies::build_topology(s.cluster);
  check_full_fidelity_fits(s, topo, w, cancel);
  sim::begin_phase(progress_of(cancel), "building the task graph", 0);
  out.lowered = lower(s, topo, w, cancel, memory_detail);
  const Lowered& low = out.lowered;
  // Any fidelity: the engine's share comes after the graph; refuse before running it.
  if (static_cast<double>(low.graph.num_tasks()) * kBytesPerTask > memory_limit(s))
    refuse(s, static_cast<double>(low.graph.num_tasks()), static_cast<double>(low.ranks.size()),
           s.simulation.fidelity == Fidelity::Fast ? "raise the limit if the machine has the memory"
                                                   : "the fidelity \"fast\" merges each pass into a few tasks");
  out.run = run_engine(low.graph, cancel, fmt::format("simulating {} tasks", low.graph.num_tasks()));
  check_run(out.run, s, low);
  if (s.simulation.port_sharing && s.simulation.fidelity != Fidelity::Fast) share_ports(out, s, cancel);
  if (s.simulation.comm_compute_slowdown > 0) slow_overlapped_compute(out, s, cancel);

  const double devices = s.cluster.devices;
  const double step = to_seconds(out.run.makespan).value();
  const auto& dev = s.cluster.device;
  r.step_time_s = step;
  r.tokens_per_step = s.training.tokens_per_step();
  r.tokens_per_s = step > 0 ? r.tokens_per_step / step : 0;
  r.tokens_per_s_per_device = r.tokens_per_s / devices;
  r.model_flops_per_token = w.model_flops_per_token;
  const double peak = dev.mfu_peak(s.training.precision).value();
  r.peak_tflops_per_device = peak / 1e12;
  r.mfu = r.model_flops_per_token * r.tokens_per_s / (devices * peak);
  r.megatron_flops_per_token = models::megatron_flops_per_token(s.model, static_cast<double>(s.training.seq_length));
  r.mfu_megatron = r.megatron_flops_per_token * r.tokens_per_s / (devices * peak);
  r.achieved_tflops_per_device = r.mfu * r.peak_tflops_per_device;
  double executed = 0;
  for (std::size_t i = 0; i < low.ranks.size(); ++i) executed += low.executed_flops[i] * low.ranks[i].weight;
  r.hfu = step > 0 ? executed / step / (devices * peak) : 0;
  r.huawei_flops_per_token = r.model_flops_per_token + w.masked_attention_flops_per_token;
  r.mfu_huawei = r.huawei_flops_per_token * r.tokens_per_s / (devices * peak);

  // Where the time goes, per device.
  double weight_total = 0, comm_total = 0, comm_hidden = 0;
  std::vector<Breakdown> per_stage(low.stages.size());
  std::vector<double> per_stage_w(low.stages.size(), 0.0);
  std::vector<int> owner(low.graph.num_resources(), -1);
  for (std::size_t i = 0; i < low.ranks.size(); ++i)
    for (sim::ResourceId res : low.ranks[i].streams) owner[res] = static_cast<int>(i);
  for (std::size_t i = 0; i < low.ranks.size(); ++i) {
    throw_if_cancelled(cancel);
    const SimRank& rank = low.ranks[i];
    const RankTimes rt = rank_times(low.graph, out.run, rank, static_cast<int>(i), owner, out.run.makespan);
    add_scaled(r.breakdown, rt.b, rank.weight);
    add_scaled(per_stage[rank.stage], rt.b, rank.weight);
    per_stage_w[rank.stage] += rank.weight;
    weight_total += rank.weight;
    comm_total += rt.comm_total * rank.weight;
    comm_hidden += rt.comm_hidden * rank.weight;
  }
  const Breakdown sum = r.breakdown;
  r.breakdown = Breakdown{};
  add_scaled(r.breakdown, sum, 1.0 / weight_total);
  r.comm_overlap_fraction = comm_total > 0 ? comm_hidden / comm_total : 0.0;
  r.comm_seconds_per_device = comm_total / weight_total;

  // Memory.
  r.capacity_bytes = dev.hbm_capacity.value();
  int worst = 0;
  for (const StageInfo& si : low.stages) {
    StageResult sr;
    sr.stage = si.stage;
    sr.decoder_layers = si.decoder_layers;
    sr.memory = si.memory;
    sr.params = si.params_dense + si.params_expert;
    for (const auto& chunk : si.chunk_items) {
      std::string names;
      for (int idx : chunk) names += (names.empty() ? "" : ",") + item_name(w, idx);
      sr.chunks.push_back(names);
    }
    add_scaled(sr.breakdown, per_stage[si.stage], per_stage_w[si.stage] > 0 ? 1.0 / per_stage_w[si.stage] : 0.0);
    if (si.memory.total() > r.peak_memory_bytes) {
      r.peak_memory_bytes = si.memory.total();
      worst = si.stage;
    }
    r.stages.push_back(std::move(sr));
  }
  r.memory_fits = r.peak_memory_bytes <= r.capacity_bytes;
  if (!r.memory_fits) {
    const MemoryBreakdown& m = low.stages[worst].memory;
    r.feasible = false;
    r.infeasible_reason = "out of memory: pipeline stage " + std::to_string(worst) + " needs " + gib_text(m.total()) +
                          " GiB per device (weights " + gib_text(m.weights_bytes) + ", gradients " +
                          gib_text(m.gradients_bytes) + ", optimizer " + gib_text(m.optimizer_bytes) +
                          ", activations " + gib_text(m.activations_bytes) + " for " + std::to_string(m.peak_inflight) +
                          " micro-batch chunks in flight, transient " + gib_text(m.transient_bytes) + ", reserved " +
                          gib_text(m.reserved_bytes) + ") but " + dev.name + " has " + gib_text(r.capacity_bytes) +
                          " GiB";
  }
  r.collectives = low.collectives;
  r.expert_load = low.expert_load;
  r.documents_packed = s.training.documents.packed;
  r.attention_work_max_over_mean = low.attention_work_max_over_mean;
  r.attention_work_mean = low.attention_work_mean;
  r.dp = s.plan.dp;
  r.ep = s.model.is_moe() ? s.plan.ep_size() : 1;
  r.etp = s.model.is_moe() ? s.plan.etp_size() : 1;
  r.edp = s.model.is_moe() ? s.plan.edp_size() : s.plan.dp * s.plan.cp * s.plan.tp;
  r.num_microbatches = s.plan.num_microbatches;
  r.layers_per_virtual_stage = low.layers_per_virtual_stage;
  r.params_total = w.params_total;
  r.params_active = w.params_active_per_token;
  r.seed = s.seed;
  r.error_band = error_band_for(s.cluster.name);
  r.fidelity = fidelity_name(s.simulation.fidelity);
  r.ranks_simulated = static_cast<int>(low.ranks.size());
  r.tasks = low.graph.num_tasks();
  r.events = out.run.events;
  if (low.memory_detail) r.memory_detail = *low.memory_detail;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check_result_invariants(r);
  return out;
}


nlohmann::json to_json(const Breakdown& b) {
  return {{"compute", b.compute_s}, {"tp_comm", b.tp_comm_s},
          {"cp_comm", b.cp_comm_s}, {"ep_comm", b.ep_comm_s},
          {"pp_comm", b.pp_comm_s}, {"dp_comm", b.dp_comm_s},
          {"bubble", b.bubble_s},   {"imbalance_wait", b.imbalance_wait_s},
          {"swap", b.swap_s},       {"host_bound", b.host_bound_s},
          {"other", b.other_s}};
}

Breakdown breakdown_from_json(const nlohmann::json& j) {
  Breakdown b;
  b.compute_s = j.value("compute", 0.0);
  b.tp_comm_s = j.value("tp_comm", 0.0);
  b.cp_comm_s = j.value("cp_comm", 0.0);
  b.ep_comm_s = j.value("ep_comm", 0.0);
  b.pp_comm_s = j.value("pp_comm", 0.0);
  b.dp_comm_s = j.value("dp_comm", 0.0);
  b.bubble_s = j.value("bubble", 0.0);
  b.imbalance_wait_s = j.value("imbalance_wait", 0.0);
  b.swap_s = j.value("swap", 0.0);
  b.host_bound_s = j.value("host_bound", 0.0);
  b.other_s = j.value("other", 0.0);
  return b;
}

std::optional<ErrorBand> error_band_for(const std::string& cluster_preset) {
  static const std::optional<nlohmann::json> bands = models::preset_json("validation", "error_bands");
  if (!bands || !bands->contains("bands")) return std::nullopt;
  const auto& b = (*bands)["bands"];
  const std::string scope = b.contains(cluster_preset) ? cluster_preset : "all";
  if (!b.contains(scope)) return std::nullopt;
  return ErrorBand{b[scope].value("within_pct", 0.0), b[scope].value("cases", 0), scope};
}

nlohmann::json to_json(const ErrorBand& b) {
  return {{"within_pct", b.within_pct},
          {"runs", b.runs},
          {"scope", b.scope},
          {"basis", "68% of published runs predicted within this by leave-one-source-out cross-validation"}};
}

nlohmann::json to_json(const Result& r, const Scenario& s, bool include_wall_time) {
  using nlohmann::json;
  json j = json::object();
  j["feasible"] = r.feasible;
  j["infeasible_reason"] = r.feasible ? json(nullptr) : json(r.infeasible_reason);
  j["step_time_s"] = r.step_time_s;
  if (r.error_band) j["step_time_error_band"] = to_json(*r.error_band);
  if (!s.software.name.empty())
    j["software"] = {{"name", s.software.name},
                     {"framework", s.software.framework},
                     {"version", s.software.version},
                     {"year", s.software.year},
                     {"defaults_applied", s.software.applied}};
  j["placement"] = {{"devices_per_node", s.cluster.devices_per_node},
                    {"node_capacity", s.cluster.node_capacity},
                    {"order", "megatron: tp, cp, dp (experts: etp, ep, edp) within a stage, stages in blocks"}};
  j["tokens_per_step"] = r.tokens_per_step;
  j["tokens_per_s"] = r.tokens_per_s;
  j["tokens_per_s_per_device"] = r.tokens_per_s_per_device;
  j["model_flops_per_token"] = r.model_flops_per_token;
  j["mfu"] = r.mfu;
  j["hfu"] = r.hfu;
  j["mfu_definition"] = mfu_definition_name(s.simulation.mfu_definition);
  j["mfu_by_definition"] = {
      {"moesim", {{"flops_per_token", r.model_flops_per_token}, {"mfu", r.mfu}}},
      {"megatron", {{"flops_per_token", r.megatron_flops_per_token}, {"mfu", r.mfu_megatron}}},
      {"huawei",
       {{"flops_per_token", r.huawei_flops_per_token},
        {"mfu", r.mfu_huawei},
        {"assumption", "model FLOPs with causal attention counted over every key (the full score matrix)"}}}};
  j["achieved_tflops_per_device"] = r.achieved_tflops_per_device;
  j["peak_tflops_per_device"] = r.peak_tflops_per_device;
  json stages = json::array();
  for (const StageResult& st : r.stages) {
    const MemoryBreakdown& m = st.memory;
    const json bd = to_json(st.breakdown);
    stages.push_back(
        {{"stage", st.stage},
         {"chunks", st.chunks},
         {"decoder_layers", st.decoder_layers},
         {"params_per_device", st.params},
         {"total_bytes", m.total()},
         {"weights_bytes", m.weights_bytes},
         {"gradients_bytes", m.gradients_bytes},
         {"optimizer_bytes", m.optimizer_bytes},
         {"activations_bytes", m.activations_bytes},
         {"transient_bytes", m.transient_bytes},
         {"reserved_bytes", m.reserved_bytes},
         {"swapped_to_host_bytes", m.swapped_bytes},
         {"activations_unoptimised_bytes", m.activations_unoptimised_bytes},
         {"activation_saving",
          m.activations_unoptimised_bytes > 0 ? 1.0 - m.activations_bytes / m.activations_unoptimised_bytes : 0.0},
         {"peak_inflight_microbatch_chunks", m.peak_inflight},
         {"breakdown_s", bd}});
  }
  j["memory"] = {{"peak_bytes_per_device", r.peak_memory_bytes},
                 {"capacity_bytes_per_device", r.capacity_bytes},
                 {"fits", r.memory_fits},
                 {"per_stage", stages}};
  if (r.memory_detail) j["memory"]["detail"] = to_json(*r.memory_detail);
  j["breakdown_s"] = to_json(r.breakdown);
  j["recompute_s"] = r.breakdown.recompute_s;
  j["comm_overlap_fraction"] = r.comm_overlap_fraction;
  j["comm_s_per_device"] = r.comm_seconds_per_device;
  if (s.model.is_moe()) {
    const ExpertLoad& el = r.expert_load;
    j["expert_load"] = {{"routing", el.routing},
                        {"ep", el.ep},
                        {"max_over_mean", el.max_over_mean},
                        {"max_over_mean_worst", el.max_over_mean_worst},
                        {"imbalance_score", el.imbalance_score},
                        {"drop_rate", el.drop_rate},
                        {"placement", el.placement},
                        {"experts_moved", el.experts_moved},
                        {"migration_s_per_step", el.migration_seconds},
                        {"a2a_bytes_per_rank", el.a2a_bytes_per_rank},
                        {"layer_rank_share", el.layer_rank_share}};
  } else {
    j["expert_load"] = nullptr;
  }
  if (r.stragglers) {
    const StragglerResult& sr = *r.stragglers;
    json gates = json::array();
    for (const auto& g : sr.gates)
      gates.push_back({{"stage", g.stage},
                       {"device", g.device},
                       {"slowdown", g.slowdown},
                       {"nic_bandwidth", g.nic_bandwidth},
                       {"gates", g.gates},
                       {"wait_s", g.wait_s}});
    j["stragglers"] = {{"slow_devices", sr.slow_devices},
                       {"slow_nics", sr.slow_nics},
                       {"column_size", sr.column_size},
                       {"ideal_step_time_s", sr.ideal_step_s},
                       {"step_time_hit", sr.ideal_step_s > 0 ? r.step_time_s / sr.ideal_step_s - 1.0 : 0.0},
                       {"gates", gates},
                       {"steps", sr.step_times_s.size()},
                       {"step_times_s", sr.step_times_s},
                       {"step_time_mean_s", sr.mean_s},
                       {"step_time_p50_s", sr.p50_s},
                       {"step_time_p99_s", sr.p99_s},
                       {"reported_step", sr.reported_step}};
  }
  if (r.documents_packed)
    j["documents"] = {{"reorder", s.training.documents.reorder},
                      {"attention_work_mean", r.attention_work_mean},
                      {"attention_work_max_over_mean", r.attention_work_max_over_mean}};
  json plan = s.document.contains("parallelism") ? s.document["parallelism"] : json::object();
  j["plan"] = {{"tp", s.plan.tp},
               {"pp", s.plan.pp},
               {"vpp", s.plan.vpp},
               {"pipeline_schedule", schedule_name(s.plan.schedule)},
               {"cp", s.plan.cp},
               {"dp", r.dp},
               {"ep", r.ep},
               {"etp", r.etp},
               {"edp", r.edp},
               {"micro_batch_size", s.plan.mbs},
               {"num_microbatches", r.num_microbatches},
               {"layers_per_virtual_stage", r.layers_per_virtual_stage}};
  j["model"] = {{"name", s.model_name},
                {"params_total", r.params_total},
                {"params_active_per_token", r.params_active}};
  json colls = json::array();
  for (const auto& c : r.collectives)
    colls.push_back({{"group", c.group},
                     {"operation", c.operation},
                     {"algorithm", c.algorithm},
                     {"group_size", c.group_size},
                     {"bytes", c.bytes},
                     {"seconds", c.seconds},
                     {"count_per_step", c.count_per_step}});
  j["collectives"] = colls;
  json simj = {{"version", kVersion},
               {"seed", r.seed},
               {"fidelity", r.fidelity},
               {"ranks_simulated", r.ranks_simulated},
               {"tasks", r.tasks},
               {"events", r.events}};
  if (include_wall_time) simj["wall_s"] = r.wall_s;
  j["simulator"] = simj;
  return j;
}

}  // namespace moesim::strategies
