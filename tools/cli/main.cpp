// moesim — command-line interface (see docs: INTERFACE.md contract v1).
//
//   moesim simulate SCENARIO [--set KEY=VALUE ...] [--format table|json] [--trace FILE] [--fidelity F]
//   moesim search   SCENARIO [--set KEY=VALUE ...] [--top K] [--threads N] [--format table|json|csv] [--out FILE] [--resume]
//   moesim check    SCENARIO [--set KEY=VALUE ...]
//   moesim validate CASES.json [--out report.md] [--json report.json] [--only ids] [--progress]
//   moesim presets  [models|devices|clusters]
//
// Exit status: 0 success, 2 bad input, 3 infeasible plan, 1 internal error.

#include <chrono>
#include <cstdio>
#include <unistd.h>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "moesim/models/presets.hpp"
#include "moesim/strategies/plan.hpp"
#include "moesim/strategies/simulate.hpp"
#include "report.hpp"
#include "validate.hpp"

namespace {

using namespace moesim;

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

int cmd_simulate(const std::string& path, const std::vector<std::string>& sets, const std::string& format,
                 const std::string& trace, const std::string& fidelity, bool no_wall_time) {
  const strategies::Scenario s = load(path, sets, fidelity);
  const strategies::Simulation sim = strategies::simulate(s);
  if (!trace.empty()) {
    std::ofstream out(trace);
    if (!out) {
      std::cerr << "moesim: cannot write the trace to " << trace << "\n";
      return 2;
    }
    strategies::write_chrome_trace(out, sim);
  }
  if (format == "json") {
    std::cout << strategies::to_json(sim.result, s, !no_wall_time).dump(2) << "\n";
  } else {
    std::cout << tools::format_result_table(sim.result, s, !no_wall_time);
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

int cmd_validate(const std::string& path, const std::vector<std::string>& sets, const std::string& format,
                 const std::string& out_md, const std::string& out_json, const std::string& only,
                 const std::string& fidelity, bool progress) {
  Diagnostics diag(path);
  auto cases = read_json_file(path, diag);
  diag.throw_if_any();
  tools::ValidateOptions opt;
  opt.overrides = sets;
  opt.progress = progress;
  if (!fidelity.empty()) opt.fidelity = *strategies::parse_fidelity(fidelity);
  for (std::size_t start = 0; start < only.size();) {
    const auto comma = only.find(',', start);
    opt.only.push_back(only.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const tools::ValidationReport rep = tools::validate(*cases, path, opt);
  const std::string md = tools::to_markdown(rep);
  const std::string js = tools::to_json(rep).dump(2);
  auto write = [](const std::string& file, const std::string& text) {
    std::ofstream f(file);
    if (!f) throw ConfigError({Diagnostic{file, "", "", "cannot be written"}});
    f << text << "\n";
  };
  if (!out_md.empty()) write(out_md, md);
  if (!out_json.empty()) write(out_json, js);
  std::cout << (format == "json" ? js + "\n" : md);
  for (const auto& c : rep.cases)
    if (c.status == "error") std::cerr << "moesim validate: case " << c.id << ": " << c.reason << "\n";
  if (rep.all.n == 0) {
    std::cerr << "moesim validate: no case ran\n";
    return 2;
  }
  return 0;
}

int cmd_search(const std::string& path, const std::vector<std::string>& sets, const std::string& format, int top,
               int threads, const std::string& out, bool resume, bool no_wall_time) {
  const strategies::Scenario s = strategies::load_scenario_file(path, sets);
  const strategies::SearchSpace space = strategies::parse_search_space(s);
  strategies::SearchOptions opt;
  opt.threads = threads;
  opt.out_file = out;
  opt.resume = resume;
  if (top > space.top_k) opt.top_k = top;  // simulate at least as many as are shown
  const bool tty = isatty(fileno(stderr)) != 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (tty) {
    opt.progress = [t0](const char* phase, std::size_t done, std::size_t total) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double rate = el > 0 ? done / el : 0;
      const double eta = rate > 0 ? (total - done) / rate : 0;
      const int width = 30;
      const int filled = total ? static_cast<int>(width * done / total) : width;
      std::fprintf(stderr, "\r%-10s [%s%s] %zu/%zu  %.0f/s  ETA %.0f s   ", phase, std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), done, total, rate, eta);
      std::fflush(stderr);
    };
  }
  const strategies::SearchReport rep = strategies::search(s, space, opt);
  if (tty) std::fprintf(stderr, "\r%80s\r", "");
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

int cmd_presets(const std::string& which) {
  auto print = [](const char* title, const std::vector<std::string>& names) {
    std::cout << title << ":\n";
    for (const auto& n : names) std::cout << "  " << n << "\n";
  };
  if (which.empty() || which == "models") print("models", models::preset_names("model"));
  if (which.empty() || which == "devices") print("devices", models::preset_names("device"));
  if (which.empty() || which == "clusters") print("clusters", topologies::cluster_preset_names());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moesim — performance simulator for large-model training on accelerator clusters"};
  app.set_version_flag("--version", std::string("moesim ") + strategies::kVersion);
  app.require_subcommand(1);

  std::string scenario, format = "table", trace, fidelity, which;
  std::vector<std::string> sets;
  bool no_wall_time = false;

  auto* sim = app.add_subcommand("simulate", "simulate one training step of a scenario");
  sim->add_option("SCENARIO", scenario, "scenario JSON file, or - for standard input")->required();
  sim->add_option("--set", sets, "override a scenario key by its dotted path: --set parallelism.tp=4");
  sim->add_option("--format", format, "output format")->check(CLI::IsMember({"table", "json"}));
  sim->add_option("--trace", trace, "write a Chrome trace-event JSON (open in Perfetto)");
  sim->add_option("--fidelity", fidelity, "fast | balanced (default) | full")
      ->check(CLI::IsMember({"fast", "balanced", "full"}));
  sim->add_flag("--no-wall-time", no_wall_time, "omit the simulator's wall time (byte-identical output)");

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
  val->add_option("CASES", scenario, "cases JSON file")->required();
  val->add_option("--set", sets, "override a key in every case's scenario");
  val->add_option("--format", format, "output format")->check(CLI::IsMember({"table", "markdown", "json"}));
  val->add_option("--out", out_md, "also write the Markdown report to this file");
  val->add_option("--json", out_json, "also write the JSON report to this file");
  val->add_option("--only", only, "comma-separated case ids to run");
  val->add_option("--fidelity", fidelity, "fast | balanced (default) | full")
      ->check(CLI::IsMember({"fast", "balanced", "full"}));
  val->add_flag("--progress", progress, "print one line per case on stderr");

  auto* presets = app.add_subcommand("presets", "list the built-in models, devices and clusters");
  presets->add_option("WHICH", which, "models | devices | clusters")->check(CLI::IsMember({"models", "devices", "clusters"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (*sim) return cmd_simulate(scenario, sets, format, trace, fidelity, no_wall_time);
    if (*check) return cmd_check(scenario, sets);
    if (*srch) return cmd_search(scenario, sets, format, top, threads, out_lines, resume, no_wall_time);
    if (*val) return cmd_validate(scenario, sets, format, out_md, out_json, only, fidelity, progress);
    if (*presets) return cmd_presets(which);
  } catch (const ConfigError& e) {
    return print_config_error(e);
  } catch (const std::exception& e) {
    std::cerr << "moesim: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
