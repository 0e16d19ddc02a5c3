// moesim — command-line interface (see docs: INTERFACE.md contract v1).
//
//   moesim simulate SCENARIO [--set KEY=VALUE ...] [--format table|json] [--trace FILE] [--fidelity F] [--memory-detail]
//                   [--max-memory 8GB]
//   moesim search   SCENARIO [--set KEY=VALUE ...] [--top K] [--threads N] [--format table|json|csv] [--out FILE] [--resume]
//   moesim check    SCENARIO [--set KEY=VALUE ...]
//   moesim validate CASES.json [--out report.md] [--json report.json] [--only ids] [--progress]
//   moesim presets  [models|devices|clusters [NAME]] [--format json]
//   moesim plan     SCENARIO --tokens 10T [--deadline 30d] [--devices 2048:16384] [--format table|json] [--threads N]
//   moesim rl       SCENARIO [--set KEY=VALUE ...] [--format table|json] [--trace FILE] [--no-wall-time]
//   moesim report   SCENARIO --out report.html [--set ...] [--devices LIST] [--tokens 10T] [--top K]
//
// Exit status: 0 success, 2 bad input, 3 infeasible plan, 1 internal error.

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "moesim/models/presets.hpp"
#include "moesim/sim/cancel.hpp"
#include "moesim/sim/output_file.hpp"
#include "capacity_table.hpp"
#include "html_report.hpp"
#include "moesim/strategies/search/capacity.hpp"
#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/plan/preset_info.hpp"
#include "moesim/strategies/rl/rl.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "peers.hpp"
#include "progress_line.hpp"
#include "report.hpp"
#include "terminal.hpp"
#include "crossval.hpp"
#include "validate.hpp"

namespace {

using namespace moesim;

// Ctrl-C: the first SIGINT raises this flag (the engine, the lowering and the search poll it and
// stop within a fraction of a second; outputs not yet committed are discarded); a second one
// ends the process at once. The one process-wide object of the CLI: a signal handler can reach
// nothing else.
CancelFlag g_interrupt;

extern "C" void on_sigint(int) {
  if (g_interrupt.requested()) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_interrupt.request();
}

void install_interrupt_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking read returns EINTR
  sigaction(SIGINT, &sa, nullptr);
}

/// The progress of one command: the library reports into `progress` through the interrupt flag
/// (engine, lowering) or a callback (search, capacity); `line` draws it on a terminal's stderr.
/// Call done() before printing results so the line is gone first.
struct CommandProgress {
  sim::Progress progress;
  tools::ProgressLine line;
  explicit CommandProgress(bool enabled = tools::stderr_is_terminal()) : line(progress, enabled) {
    g_interrupt.attach(&progress);
  }
  ~CommandProgress() { done(); }
  CommandProgress(const CommandProgress&) = delete;
  CommandProgress& operator=(const CommandProgress&) = delete;
  void done() {
    line.stop();
    g_interrupt.attach(nullptr);
  }
};

int print_config_error(const ConfigError& e) {
  std::cerr << "moesim: the input has " << e.diagnostics().size()
            << (e.diagnostics().size() == 1 ? " problem:\n" : " problems:\n");
  for (const auto& d : e.diagnostics()) std::cerr << "  " << d.to_string() << "\n";
  return 2;
}

strategies::Scenario load(const std::string& path, const std::vector<std::string>& sets, const std::string& fidelity) {
  std::vector<std::string> overrides = sets;
  if (!fidelity.empty()) overrides.push_back("simulation.fidelity=\"" + fidelity + "\"");
  return strategies::load_scenario_file(path, overrides);
}

/// The --trace-* options as TraceOptions; every problem reported at once (exit 2).
struct TraceArgs {
  std::vector<int> ranks;
  std::string window, max_size = "1GB";
  std::vector<std::string> streams;
};

strategies::TraceOptions trace_options(const TraceArgs& a) {
  strategies::TraceOptions o;
  std::vector<Diagnostic> bad;
  o.ranks = a.ranks;
  o.streams = a.streams;
  if (!a.window.empty()) {
    const auto colon = a.window.find(':');
    char* end1 = nullptr;
    char* end2 = nullptr;
    const std::string from = a.window.substr(0, colon), to = colon == std::string::npos ? "" : a.window.substr(colon + 1);
    o.from_s = std::strtod(from.c_str(), &end1);
    o.to_s = std::strtod(to.c_str(), &end2);
    if (colon == std::string::npos || from.empty() || to.empty() || *end1 != '\0' || *end2 != '\0' ||
        !std::isfinite(o.from_s) || !std::isfinite(o.to_s) || o.from_s < 0 || o.to_s <= o.from_s)
      bad.push_back({"--trace-window", "", "\"" + a.window + "\"", "must be FROM:TO in seconds with 0 <= FROM < TO (e.g. 0:2.5)"});
  }
  if (a.max_size == "0") {
    o.max_bytes = 0;
  } else {
    const auto q = parse_quantity(a.max_size);
    if (!q || q->dimension != Dimension::Bytes || q->value <= 0)
      bad.push_back({"--trace-max-size", "", "\"" + a.max_size + "\"", "must be a size such as 500MB or 2GB (0: no limit)"});
    else
      o.max_bytes = q->value;
  }
  if (!bad.empty()) throw ConfigError(std::move(bad));
  return o;
}

int cmd_simulate(const std::string& path, const std::vector<std::string>& sets, const std::string& format,
                 const std::string& trace, const TraceArgs& trace_args, const std::string& fidelity, bool no_wall_time,
                 bool memory_detail) {
  const strategies::Scenario s = load(path, sets, fidelity);
  const strategies::TraceOptions topt = trace_options(trace_args);
  if (!trace.empty()) refuse_output_over_input("--trace", trace, s.input_files());
  CommandProgress progress;
  const strategies::Simulation sim = strategies::simulate(s, &g_interrupt, memory_detail);
  if (!trace.empty()) {
    progress.progress.begin("writing the trace", 0);
    (void)strategies::estimate_chrome_trace(sim, topt);  // bad ranks or streams: before the file is opened
    OutputFile out(trace);
    strategies::write_chrome_trace(out.stream(), sim, topt);
    throw_if_cancelled(&g_interrupt);
    out.commit();
  }
  progress.progress.begin("finding the critical path", 0);
  const strategies::CriticalPath critical = strategies::summarize_critical_path(sim);
  progress.done();
  if (format == "json") {
    nlohmann::json j = strategies::to_json(sim.result, s, !no_wall_time);
    j["critical_path"] = strategies::to_json(critical);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << tools::format_result_table(sim.result, s, !no_wall_time, &critical);
    if (sim.result.memory_detail)
      std::cout << strategies::format_memory_detail(*sim.result.memory_detail, sim.result.capacity_bytes);
  }
  if (!sim.result.feasible) {
    if (format != "json") std::cerr << "moesim: infeasible: " << sim.result.infeasible_reason << "\n";
    return 3;
  }
  return 0;
}

int cmd_check(const std::string& path, const std::vector<std::string>& sets) {
  const strategies::Scenario s = load(path, sets, "");
  std::cout << tools::format_plan_line(s) << "\nok: " << s.file << " is valid\n";
  return 0;
}

int cmd_validate(const std::vector<std::string>& paths, const std::vector<std::string>& sets, const std::string& format,
                 const std::string& out_md, const std::string& out_json, const std::string& only,
                 const std::string& fidelity, bool progress, const std::string& cross_validate, int threads,
                 const std::string& bands_out) {
  std::vector<tools::CaseFile> files;
  {
    std::vector<Diagnostic> problems;
    for (const auto& path : paths) {
      Diagnostics diag(path);
      auto cases = read_json_file(path, diag);
      for (const auto& d : diag.list()) problems.push_back(d);
      if (cases) files.push_back({path, std::move(*cases)});
    }
    if (!problems.empty()) throw ConfigError(problems);
  }
  tools::ValidateOptions opt;
  opt.overrides = sets;
  opt.progress = progress;
  opt.cancel = &g_interrupt;
  if (!fidelity.empty()) opt.fidelity = *strategies::parse_fidelity(fidelity);
  for (std::size_t start = 0; start < only.size();) {
    const auto comma = only.find(',', start);
    opt.only.push_back(only.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (!out_md.empty()) refuse_output_over_input("--out", out_md, paths);
  if (!out_json.empty()) refuse_output_over_input("--json", out_json, paths);
  if (!bands_out.empty()) refuse_output_over_input("--bands-out", bands_out, paths);
  if (!bands_out.empty() && cross_validate.empty())
    throw ConfigError({Diagnostic{"command line", "--bands-out", bands_out, "needs --cross-validate source"}});
  // --progress logs a line per case instead of the redrawn progress line.
  CommandProgress line(!progress && tools::stderr_is_terminal());
  const tools::ValidationReport rep = tools::validate(files, opt);
  std::string md = tools::to_markdown(rep);
  nlohmann::json js = tools::to_json(rep);
  if (!cross_validate.empty()) {
    tools::CrossValidationOptions copt;
    copt.threads = threads;
    copt.progress = progress;
    copt.cancel = &g_interrupt;
    const tools::CrossValidation cv = tools::cross_validate(rep, tools::fit_groups(), opt, copt);
    md += tools::to_markdown(cv);
    js["cross_validation"] = tools::to_json(cv);
    std::string names;
    for (const auto& p : paths) names += (names.empty() ? "" : ", ") + std::filesystem::path(p).filename().string();
    if (!bands_out.empty()) write_file_atomically(bands_out, tools::error_bands_json(cv, names).dump(2) + "\n");
  }
  line.done();
  const std::string jtext = js.dump(2);
  if (!out_md.empty()) write_file_atomically(out_md, md + "\n");
  if (!out_json.empty()) write_file_atomically(out_json, jtext + "\n");
  std::cout << (format == "json" ? jtext + "\n" : md);
  for (const auto& c : rep.cases)
    if (c.status == "error") std::cerr << "moesim validate: case " << c.id << ": " << c.reason << "\n";
  if (rep.ran == 0) {  // memory-only cases count: they ran, only their step time is not compared
    std::cerr << "moesim validate: no case ran\n";
    return 2;
  }
  return 0;
}

int cmd_search(const std::string& path, const std::vector<std::string>& sets, const std::string& format, int top,
               int threads, const std::string& out, bool resume, bool no_wall_time) {
  // Under mpirun the ranks share the search; only the first prints and writes.
  const tools::Peers peers;
  if (!peers.unavailable().empty()) {
    std::cerr << "moesim search: " << peers.unavailable() << "\n";
    return 2;
  }
  const strategies::Scenario s = strategies::load_scenario_file(path, sets);
  if (const auto ms = strategies::parse_model_search(s)) {
    // Architecture search: each candidate model searched for its best plan.
    if (!out.empty() || resume) {
      std::cerr << "moesim search: --out and --resume are for plan searches; a \"model_search\" scenario prints its "
                   "candidates (use --format json to keep them)\n";
      return 2;
    }
    strategies::SearchOptions mo;
    mo.threads = threads;
    mo.cancel = &g_interrupt;
    CommandProgress progress;
    mo.progress = tools::search_progress_to(progress.progress);
    const strategies::ModelSearchReport mr = strategies::model_search(s, *ms, mo);
    progress.done();
    if (format == "json") std::cout << strategies::to_json(mr).dump(2) << "\n";
    else std::cout << tools::format_model_search_table(mr, s, !no_wall_time);
    const bool any = std::any_of(mr.candidates.begin(), mr.candidates.end(), [](const auto& c) { return c.best.has_value(); });
    if (!any) {
      std::cerr << "moesim search: no candidate model has a plan that fits\n";
      return 3;
    }
    return 0;
  }
  const strategies::SearchSpace space = strategies::parse_search_space(s);
  strategies::SearchOptions opt;
  opt.threads = threads;
  opt.out_file = out;  // the first process writes it; the others only read it when resuming
  opt.resume = resume;
  opt.cancel = &g_interrupt;
  opt.peers = peers.search_peers();
  if (top > space.top_k) opt.top_k = top;  // simulate at least as many as are shown
  CommandProgress progress(peers.leader() && tools::stderr_is_terminal());
  opt.progress = tools::search_progress_to(progress.progress);
  const strategies::SearchReport rep = strategies::search(s, space, opt);
  progress.done();
  if (!peers.leader()) return rep.ranked.empty() ? 3 : 0;
  const int shown = top > 0 ? top : 10;
  if (format == "json") std::cout << strategies::to_json(rep, shown).dump(2) << "\n";
  else if (format == "csv") std::cout << strategies::to_csv(rep, shown);
  else std::cout << tools::format_search_table(rep, s, shown, !no_wall_time);
  if (rep.ranked.empty()) {
    std::cerr << "moesim search: no plan of the space fits in memory\n";
    return 3;
  }
  return 0;
}

/// Options shared by `plan` and `report`: the token budget, deadline and candidate sizes.
struct CapacityArgs {
  std::string tokens;
  std::string deadline;
  std::string devices;
  std::string batch = "fixed";
  int simulate_top = 0;
  int threads = 0;
};

/// Parses the capacity options; prints the problem and returns false on bad input (exit 2).
bool parse_capacity_args(const char* cmd, const CapacityArgs& a, strategies::CapacityOptions& opt) {
  const auto tokens = strategies::parse_token_count(a.tokens);
  if (!tokens) {
    std::cerr << "moesim " << cmd << ": --tokens \"" << a.tokens
              << "\" is not a token count: give a positive number with an optional unit T (1e12), B (1e9), M (1e6) "
                 "or k (1e3), e.g. 10T, 500B or 1.5e12\n";
    return false;
  }
  opt.train_tokens = *tokens;
  if (!a.deadline.empty()) {
    const auto d = strategies::parse_duration_s(a.deadline);
    if (!d) {
      std::cerr << "moesim " << cmd << ": --deadline \"" << a.deadline
                << "\" is not a duration: give a positive number with a unit d (days), h (hours), w (weeks), m (minutes) "
                   "or s, e.g. 30d or 720h\n";
      return false;
    }
    opt.deadline_s = *d;
  }
  if (!a.devices.empty()) {
    try {
      opt.devices = strategies::parse_device_counts(a.devices);
    } catch (const ConfigError& e) {
      for (const auto& d : e.diagnostics())
        std::cerr << "moesim " << cmd << ": --devices " << d.value << ": " << d.constraint << "\n";
      return false;
    }
  }
  opt.batch = a.batch == "proportional" ? strategies::BatchScaling::Proportional : strategies::BatchScaling::Fixed;
  opt.simulate_top = a.simulate_top;
  opt.threads = a.threads;
  opt.cancel = &g_interrupt;
  return true;
}

int cmd_plan(const std::string& path, const std::vector<std::string>& sets, const CapacityArgs& args,
             const std::string& format) {
  strategies::CapacityOptions opt;
  if (!parse_capacity_args("plan", args, opt)) return 2;
  const strategies::Scenario s = strategies::load_scenario_file(path, sets);
  CommandProgress progress;
  opt.progress = tools::search_progress_to(progress.progress);
  const strategies::CapacityReport rep = strategies::plan_capacity(s, opt);
  progress.done();
  if (format == "json") {
    nlohmann::json j = strategies::to_json(rep);
    j["model"] = s.model_name;
    j["device"] = s.cluster.device.name;
    j["cluster"] = s.cluster.name;
    j["seq_length"] = s.training.seq_length;
    for (std::size_t i = 0; i < rep.points.size(); ++i)
      if (rep.points[i].feasible) j["points"][i]["plan_text"] = tools::short_plan(rep.points[i].best.plan, s.model);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << tools::format_capacity_table(rep, s);
  }
  if (!rep.fastest) {
    std::cerr << "moesim plan: infeasible: no candidate cluster size has a plan that fits\n";
    return 3;
  }
  if (rep.deadline_unreachable()) {
    std::cerr << fmt::format("moesim plan: infeasible: no candidate size meets the {} deadline; fastest: {}\n",
                             tools::format_deadline(rep.deadline_s),
                             tools::describe_capacity_point(rep.points[*rep.fastest], s));
    return 3;
  }
  return 0;
}

int cmd_report(const std::string& path, const std::vector<std::string>& sets, const std::string& fidelity,
               const std::string& out, const CapacityArgs& args, int top, bool no_search, bool no_scaling, bool wall_time) {
  const auto t0 = std::chrono::steady_clock::now();
  strategies::CapacityOptions opt;
  if (!parse_capacity_args("report", args, opt)) return 2;
  const strategies::Scenario s = load(path, sets, fidelity);
  refuse_output_over_input("--out", out, s.input_files());
  CommandProgress progress;
  const auto report_progress = tools::search_progress_to(progress.progress);
  const strategies::Simulation sim = strategies::simulate(s, &g_interrupt);
  std::optional<strategies::SearchReport> search;
  if (!no_search) {
    const strategies::SearchSpace space = strategies::parse_search_space(s);
    strategies::SearchOptions so;
    so.threads = args.threads;
    so.top_k = args.simulate_top > 0 ? args.simulate_top : std::max(space.top_k, top);
    so.cancel = &g_interrupt;
    so.progress = report_progress;
    search = strategies::search(s, space, so);
    opt.simulate_top = so.top_k;
    opt.known_search = &*search;
  }
  std::optional<strategies::CapacityReport> capacity;
  opt.progress = report_progress;
  if (!no_scaling) capacity = strategies::plan_capacity(s, opt);
  std::optional<strategies::ModelSearchReport> models;
  if (!no_search)
    if (const auto ms = strategies::parse_model_search(s)) {
      strategies::SearchOptions mo;
      mo.threads = args.threads;
      mo.cancel = &g_interrupt;
      mo.progress = report_progress;
      models = strategies::model_search(s, *ms, mo);
    }
  progress.done();
  tools::HtmlReportInput in;
  in.scenario = &s;
  in.sim = &sim;
  in.search = search ? &*search : nullptr;
  in.capacity = capacity ? &*capacity : nullptr;
  in.models = models ? &*models : nullptr;
  in.top = top;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (wall_time) in.wall_time_note = fmt::format("Generated in {:.1f} s.", elapsed);
  const std::string html = tools::render_html_report(in);
  write_file_atomically(out, html);
  std::cout << fmt::format("wrote {} ({:.0f} KB): {} on {} x {}", out, static_cast<double>(html.size()) / 1024, s.model_name,
                           s.cluster.devices, s.cluster.device.name);
  if (capacity && capacity->deadline_s > 0)
    std::cout << (capacity->answer ? fmt::format("; deadline met from {} devices", capacity->points[*capacity->answer].devices)
                                   : std::string("; no candidate size meets the deadline"));
  std::cout << "\n";
  return 0;
}

int cmd_rl(const std::string& path, const std::vector<std::string>& sets, const std::string& format,
           const std::string& trace, bool no_wall_time) {
  const strategies::RlScenario s = strategies::load_rl_scenario_file(path, sets);
  if (!trace.empty()) refuse_output_over_input("--trace", trace, s.training.input_files());
  CommandProgress progress;
  progress.progress.begin("simulating the RL iteration", 0);  // no cancel points inside: elapsed time only
  const strategies::RlSimulation sim = strategies::simulate_rl(s);
  if (!trace.empty()) {
    progress.progress.begin("writing the trace", 0);
    OutputFile out(trace);
    strategies::write_rl_trace(out.stream(), sim);
    throw_if_cancelled(&g_interrupt);
    out.commit();
  }
  progress.done();
  if (format == "json") std::cout << strategies::to_json(sim.result, s, !no_wall_time).dump(2) << "\n";
  else std::cout << strategies::format_rl_table(sim.result, s, !no_wall_time);
  if (!sim.result.feasible) {
    if (format != "json") std::cerr << "moesim rl: infeasible: " << sim.result.infeasible_reason << "\n";
    return 3;
  }
  return 0;
}

int cmd_presets(const std::string& which, const std::string& name, const std::string& format) {
  if (!name.empty()) {
    const nlohmann::json d = strategies::describe_preset(which, name);
    if (format == "json") std::cout << d.dump(2) << "\n";
    else std::cout << strategies::format_preset(d);
    return 0;
  }
  auto print = [](const char* title, const std::vector<std::string>& names) {
    std::cout << title << ":\n";
    for (const auto& n : names) std::cout << "  " << n << "\n";
  };
  if (format == "json") {
    std::cout << nlohmann::json{{"models", models::preset_names("model")},
                                {"devices", models::preset_names("device")},
                                {"clusters", topologies::cluster_preset_names()}}
                     .dump(2)
              << "\n";
    return 0;
  }
  if (which.empty() || which == "models") print("models", models::preset_names("model"));
  if (which.empty() || which == "devices") print("devices", models::preset_names("device"));
  if (which.empty() || which == "clusters") print("clusters", topologies::cluster_preset_names());
  if (which.empty()) std::cout << "(moesim presets KIND NAME prints a preset's values, units and sources)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moesim — performance simulator for large-model training on accelerator clusters"};
  app.set_version_flag("--version", std::string("moesim ") + strategies::kVersion);
  app.require_subcommand(1);

  std::string scenario, format = "table", trace, fidelity, which, max_memory;
  TraceArgs trace_args;
  std::vector<std::string> case_files;
  std::string cross_validate, bands_out;
  int validate_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> sets;
  bool no_wall_time = false, memory_detail = false;

  auto* sim = app.add_subcommand("simulate", "simulate one training step of a scenario");
  sim->add_option("SCENARIO", scenario, "scenario JSON file, or - for standard input")->required();
  sim->add_option("--set", sets, "override a scenario key by its dotted path: --set parallelism.tp=4");
  sim->add_option("--format", format, "output format")->check(CLI::IsMember({"table", "json"}));
  sim->add_option("--trace", trace, "write a Chrome trace-event JSON (open in Perfetto)");
  sim->add_option("--fidelity", fidelity, "fast | balanced (default) | full")
      ->check(CLI::IsMember({"fast", "balanced", "full"}));
  sim->add_option("--trace-ranks", trace_args.ranks, "keep only these global ranks in the trace: 0,128")
      ->delimiter(',');
  sim->add_option("--trace-window", trace_args.window, "keep only tasks overlapping FROM:TO seconds of the step");
  sim->add_option("--trace-streams", trace_args.streams, "keep only these streams: compute,ep (see the trace)")
      ->delimiter(',');
  sim->add_option("--trace-max-size", trace_args.max_size,
                  "refuse a trace estimated above this size (default 1GB; 0: no limit)");
  sim->add_option("--max-memory", max_memory,
                  "refuse a simulation estimated above this much memory, e.g. 8GB (default: 3/4 of the RAM)");
  sim->add_flag("--no-wall-time", no_wall_time, "omit the simulator's wall time (byte-identical output)");
  sim->add_flag("--memory-detail", memory_detail,
                "list every term of the largest stage's memory: activations per operator (with what is kept, "
                "its source and what recomputation drops), weights, gradients, optimizer (JSON: memory.detail)");

  auto* check = app.add_subcommand("check", "validate a scenario and print every problem");
  check->add_option("SCENARIO", scenario, "scenario JSON file, or - for standard input")->required();
  check->add_option("--set", sets, "override a scenario key by its dotted path");

  std::string out_md, out_json, only, out_lines;
  bool progress = false, resume = false;
  int top = 10, threads = 0;
  auto* srch = app.add_subcommand("search", "find the best parallel strategy for a scenario");
  srch->add_option("SCENARIO", scenario, "scenario JSON file (its \"search\" section narrows or widens the space)")
      ->required();
  srch->add_option("--set", sets, "override a scenario key: --set search.tp=[4,8]");
  srch->add_option("--top", top, "plans to show (and at least as many to event-simulate)")->check(CLI::Range(1, 100000));
  srch->add_option("--threads", threads, "threads (default: all cores)")->check(CLI::Range(1, 1024));
  srch->add_option("--format", format, "output format")->check(CLI::IsMember({"table", "json", "csv"}));
  srch->add_option("--out", out_lines, "stream one JSON line per simulated plan to this file");
  srch->add_flag("--resume", resume, "reuse the results already in --out and continue");
  srch->add_flag("--no-wall-time", no_wall_time, "omit timings (byte-identical output)");

  auto* val = app.add_subcommand("validate", "compare moesim with measured training runs (calibration_cases.json format)");
  val->add_option("CASES", case_files, "cases JSON files (ids unique across them)")->required();
  val->add_option("--set", sets, "override a key in every case's scenario");
  val->add_option("--format", format, "output format")->check(CLI::IsMember({"table", "markdown", "json"}));
  val->add_option("--out", out_md, "also write the Markdown report to this file");
  val->add_option("--json", out_json, "also write the JSON report to this file");
  val->add_option("--only", only, "comma-separated case ids to run");
  val->add_option("--fidelity", fidelity, "fast | balanced (default) | full")
      ->check(CLI::IsMember({"fast", "balanced", "full"}));
  val->add_flag("--progress", progress, "print one line per case on stderr");
  val->add_option("--cross-validate", cross_validate,
                  "leave-one-source-out: fit the device parameters on all sources but one, predict that one, for "
                  "every source")
      ->check(CLI::IsMember({"source"}));
  val->add_option("--threads", validate_threads, "threads for the cross-validation's simulations")->check(CLI::Range(1, 256));
  val->add_option("--bands-out", bands_out, "with --cross-validate: write the error bands (models/presets/error_bands.json form)");

  std::string preset_name, presets_format = "table";
  auto* presets = app.add_subcommand(
      "presets", "list the built-in models, devices and clusters; with a name, a preset's values, units and sources");
  presets->add_option("WHICH", which, "models | devices | clusters")->check(CLI::IsMember({"models", "devices", "clusters"}));
  presets->add_option("NAME", preset_name, "a preset of that kind: every value with its unit and source, and what "
                                           "moesim derives from them (parameters, FLOPs per token, bandwidths)");
  presets->add_option("--format", presets_format, "table | json (the whole preset, sources kept)")
      ->check(CLI::IsMember({"table", "json"}));

  CapacityArgs cap;
  std::string report_out;
  bool no_search = false, no_scaling = false, wall_time = false;
  auto* plan = app.add_subcommand("plan", "capacity planning: the smallest cluster that trains a token budget by a deadline");
  plan->add_option("SCENARIO", scenario, "scenario JSON file (model, cluster preset, training settings)")->required();
  plan->add_option("--set", sets, "override a scenario key by its dotted path");
  plan->add_option("--tokens", cap.tokens, "token budget: 10T, 500B, 1.5e12")->required();
  plan->add_option("--deadline", cap.deadline, "answer the smallest size training the budget within: 30d, 720h, 4w");
  plan->add_option("--devices", cap.devices,
                   "candidate sizes: a list 2048,4096, a doubling range 2048:16384, or START:END:STEP "
                   "(default: D/4 ... 8D around the scenario's D, doubling)");
  plan->add_option("--batch", cap.batch, "global batch: fixed (the scenario's) or proportional to the devices")
      ->check(CLI::IsMember({"fixed", "proportional"}));
  plan->add_option("--simulate-top", cap.simulate_top, "plans event-simulated per size (default: the search's top_k)")
      ->check(CLI::Range(1, 100000));
  plan->add_option("--threads", cap.threads, "threads (default: all cores)")->check(CLI::Range(1, 1024));
  plan->add_option("--format", format, "output format")->check(CLI::IsMember({"table", "json"}));

  auto* rpt = app.add_subcommand("report", "write a self-contained HTML report of a scenario");
  rpt->add_option("SCENARIO", scenario, "scenario JSON file, or - for standard input")->required();
  rpt->add_option("--out", report_out, "the HTML file to write")->required();
  rpt->add_option("--set", sets, "override a scenario key by its dotted path");
  rpt->add_option("--top", top, "plans in the best-plans table and the breakdown chart (default 5)")->check(CLI::Range(1, 100));
  rpt->add_option("--devices,--scaling-devices", cap.devices,
                  "cluster sizes of the scaling chart and the capacity answer (list, START:END or START:END:STEP; "
                  "default: D/4 ... 8D, doubling)");
  rpt->add_option("--tokens", cap.tokens, "token budget of the capacity answer (default 10T)");
  rpt->add_option("--deadline", cap.deadline, "deadline of the capacity answer: 30d, 720h");
  rpt->add_option("--batch", cap.batch, "global batch in the sweep: fixed or proportional")
      ->check(CLI::IsMember({"fixed", "proportional"}));
  rpt->add_option("--simulate-top", cap.simulate_top,
                  "plans event-simulated per search (default: the scenario's search top_k, 16)")
      ->check(CLI::Range(1, 100000));
  rpt->add_option("--threads", cap.threads, "threads (default: all cores)")->check(CLI::Range(1, 1024));
  rpt->add_option("--fidelity", fidelity, "fast | balanced (default) | full")
      ->check(CLI::IsMember({"fast", "balanced", "full"}));
  rpt->add_flag("--no-search", no_search, "skip the strategy search (best plans; the sweep still searches each size)");
  rpt->add_flag("--no-scaling", no_scaling, "skip the cluster-size sweep and the capacity answer");
  rpt->add_flag("--wall-time", wall_time, "print the generation time in the footer (output no longer byte-identical)");

  auto* rlc = app.add_subcommand("rl", "simulate RL post-training steps: rollout, reference/reward, training, weight sync");
  rlc->add_option("SCENARIO", scenario, "scenario JSON file with an \"rl\" section, or - for standard input")->required();
  rlc->add_option("--set", sets, "override a scenario key by its dotted path: --set rl.staleness=1");
  rlc->add_option("--format", format, "output format")->check(CLI::IsMember({"table", "json"}));
  rlc->add_option("--trace", trace, "write a Chrome trace-event JSON of the RL steps (open in Perfetto)");
  rlc->add_flag("--no-wall-time", no_wall_time, "omit the simulator's wall time (byte-identical output)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // Commands that poll the flag take Ctrl-C over (a clean stop); the others keep the default.
  if (*sim || *srch || *val || *plan || *rpt) install_interrupt_handler();
  // Names from the input reach the terminal through these filters (terminal.hpp).
  tools::EscapingStreambuf out_filter(std::cout.rdbuf()), err_filter(std::cerr.rdbuf());
  std::streambuf* const cout_buf = std::cout.rdbuf(&out_filter);
  std::streambuf* const cerr_buf = std::cerr.rdbuf(&err_filter);
  struct Restore {
    std::streambuf *out, *err;
    ~Restore() {
      std::cout.flush();
      std::cerr.flush();
      std::cout.rdbuf(out);
      std::cerr.rdbuf(err);
    }
  } restore{cout_buf, cerr_buf};
  int rc = 0;
  try {
    if (*sim) {
      if (!max_memory.empty()) sets.push_back("simulation.max_memory=" + nlohmann::json(max_memory).dump());
      rc = cmd_simulate(scenario, sets, format, trace, trace_args, fidelity, no_wall_time, memory_detail);
    }
    else if (*check) rc = cmd_check(scenario, sets);
    else if (*srch) rc = cmd_search(scenario, sets, format, top, threads, out_lines, resume, no_wall_time);
    else if (*val)
      rc = cmd_validate(case_files, sets, format, out_md, out_json, only, fidelity, progress, cross_validate,
                        validate_threads, bands_out);
    else if (*presets) rc = cmd_presets(which, preset_name, presets_format);
    else if (*plan) rc = cmd_plan(scenario, sets, cap, format);
    else if (*rlc) rc = cmd_rl(scenario, sets, format, trace, no_wall_time);
    else if (*rpt) {
      if (cap.tokens.empty()) cap.tokens = "10T";
      rc = cmd_report(scenario, sets, fidelity, report_out, cap, rpt->get_option("--top")->count() > 0 ? top : 5, no_search,
                      no_scaling, wall_time);
    }
  } catch (const ConfigError& e) {
    return print_config_error(e);
  } catch (const Cancelled&) {
    std::fflush(stdout);
    std::cerr << "\nmoesim: interrupted";
    if (*srch && !out_lines.empty()) std::cerr << "; the results so far are in " << out_lines << ".partial (--resume continues)";
    else std::cerr << "; no output was written";
    std::cerr << "\n";
    return 130;
  } catch (const InternalError& e) {
    std::cerr << "moesim: internal error (this is a bug in moesim; please report it with the scenario): " << e.what()
              << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "moesim: internal error: " << e.what() << "\n";
    return 1;
  }
  // Standard output is an output like any other: a full disk or a closed pipe is not success.
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    std::cerr << "moesim: cannot write the standard output" << (errno != 0 ? std::string(": ") + std::strerror(errno) : "")
              << "\n";
    return 2;
  }
  return rc;
}
