// moesim — command-line interface (see docs: INTERFACE.md contract v1).
//
//   moesim simulate SCENARIO [--set KEY=VALUE ...] [--format table|json] [--trace FILE] [--fidelity F]
//   moesim check    SCENARIO [--set KEY=VALUE ...]
//   moesim validate CASES.json [--out report.md] [--json report.json] [--only ids] [--progress]
//   moesim presets  [models|devices|clusters]
//
// Exit status: 0 success, 2 bad input, 3 infeasible plan, 1 internal error.

#include <cstdio>
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

  std::string out_md, out_json, only;
  bool progress = false;
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
