#include "validate.hpp"

#include "moesim/sim/progress.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <optional>

#include <fmt/format.h>

#include "moesim/strategies/output/simulate.hpp"
#include "case_fields.hpp"

namespace moesim::tools {
using namespace fields;
namespace {

std::string plan_text(const json& scenario) {
  const json& p = scenario.contains("parallelism") ? scenario["parallelism"] : json::object();
  std::string t;
  auto add = [&](const char* label, const char* key, bool always) {
    // The scenario's short keys or Megatron's long names.
    static const std::map<std::string, std::string> long_name{{"tp", "tensor_model_parallel_size"},
                                                               {"pp", "pipeline_model_parallel_size"},
                                                               {"vpp", "virtual_pipeline_model_parallel_size"},
                                                               {"cp", "context_parallel_size"},
                                                               {"ep", "expert_model_parallel_size"}};
    auto v = int_of(p, key);
    if (!v) v = int_of(p, long_name.at(key).c_str());
    if (v && (always || *v > 1)) t += fmt::format("{}{}{}", t.empty() ? "" : " ", label, *v);
  };
  add("TP", "tp", true);
  add("PP", "pp", true);
  add("VPP", "vpp", false);
  add("CP", "cp", false);
  add("EP", "ep", false);
  return t;
}

ErrorStats stats_of(const std::vector<const CaseOutcome*>& v, double CaseOutcome::*error = &CaseOutcome::error_pct) {
  ErrorStats s;
  for (const CaseOutcome* c : v) {
    const double e = std::abs(c->*error);
    s.mean_abs_pct += e;
    if (e >= s.max_abs_pct) {
      s.max_abs_pct = e;
      s.worst = c->id;
    }
    ++s.n;
  }
  if (s.n > 0) s.mean_abs_pct /= s.n;
  return s;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// The case's measured peak memory per device in GiB, or nullopt when it has none: either
/// measured.peak_memory_gib, or measured.peak_memory with measured.unit "GiB" or "GB" (1e9
/// bytes; sources print both, and they differ by 7%). Problems go to
/// `diag` at the case's JSON pointer `at`.
std::optional<double> measured_peak_gib(const json& c, const std::string& at, Diagnostics& diag) {
  if (!c.contains("measured") || !c["measured"].is_object()) return std::nullopt;
  const json& m = c["measured"];
  const bool in_gib = m.contains("peak_memory_gib"), with_unit = m.contains("peak_memory");
  if (!in_gib && !with_unit) return std::nullopt;
  if (in_gib && with_unit) {
    diag.error(at + "/measured/peak_memory", json_brief(m["peak_memory"]),
               "must not be given together with measured.peak_memory_gib");
    return std::nullopt;
  }
  const char* key = in_gib ? "peak_memory_gib" : "peak_memory";
  const json& v = m[key];
  if (!v.is_number() || v.get<double>() <= 0) {
    diag.error(at + "/measured/" + key, json_brief(v), "must be a positive number (peak memory per device)");
    return std::nullopt;
  }
  const double peak = v.get<double>();
  if (in_gib) return peak;
  const auto unit = m.find("unit");
  if (unit != m.end() && *unit == "GiB") return peak;
  if (unit != m.end() && *unit == "GB") return peak * 1e9 / kGiB;
  diag.error(at + "/measured/unit", unit == m.end() ? "" : json_brief(*unit),
             unit == m.end() ? "is required with measured.peak_memory: \"GiB\" or \"GB\" (1e9 bytes)"
                             : "must be \"GiB\" or \"GB\" (1e9 bytes), the unit of measured.peak_memory");
  return std::nullopt;
}

/// The pipeline stage whose rank logged the measured peak: measured.peak_memory_stage "worst"
/// (the default: the maximum over ranks, or unknown), "first", "last" or a stage index. Runs
/// often log memory from one rank only (Megatron-LM's last rank, torchtitan's rank 0), and
/// pipeline stages differ by tens of percent.
constexpr int kWorstStage = -1;
constexpr int kLastStage = -2;
int measured_stage(const json& c, const std::string& at, Diagnostics& diag) {
  if (!c.contains("measured") || !c["measured"].is_object() || !c["measured"].contains("peak_memory_stage"))
    return kWorstStage;
  const json& v = c["measured"]["peak_memory_stage"];
  if (v.is_string() && v == "worst") return kWorstStage;
  if (v.is_string() && v == "first") return 0;
  if (v.is_string() && v == "last") return kLastStage;
  if (v.is_number_integer() && v.get<long long>() >= 0 && v.get<long long>() <= std::numeric_limits<int>::max())
    return static_cast<int>(v.get<long long>());
  diag.error(at + "/measured/peak_memory_stage", json_brief(v),
             "must be \"worst\", \"first\", \"last\" or a pipeline stage index (the rank that logged the peak)");
  return kWorstStage;
}

/// "80" for 80.0 GiB, "167.6" otherwise: device capacities are mostly whole GiB.
std::string gib_brief(double gib) {
  std::string t = fmt::format("{:.1f}", gib);
  if (t.ends_with(".0")) t.resize(t.size() - 2);
  return t;
}

/// Held out: the id's last digit is odd (case_001, asc_013; an id without digits is in the
/// fitting half). Only the parity matters, so ids of any length are fine.
bool odd_id(const std::string& id) {
  for (auto it = id.rbegin(); it != id.rend(); ++it)
    if (std::isdigit(static_cast<unsigned char>(*it))) return (*it - '0') % 2 == 1;
  return false;
}

}  // namespace

ValidationReport validate(const json& cases, const std::string& file, const ValidateOptions& opt) {
  return validate(std::vector<CaseFile>{CaseFile{file, cases}}, opt);
}

std::string source_of(const json& c) {
  if (c.contains("source_group") && c["source_group"].is_string()) return c["source_group"].get<std::string>();
  return text_of(c, "category");
}

ValidationReport validate(const std::vector<CaseFile>& files, const ValidateOptions& opt) {
  ValidationReport rep;
  {
    std::vector<Diagnostic> bad;
    for (const CaseFile& f : files) {
      rep.file += (rep.file.empty() ? "" : ", ") + f.path;
      const json* list = &f.cases;
      if (f.cases.is_object() && f.cases.contains("cases")) list = &f.cases["cases"];
      if (!list->is_array()) bad.push_back(Diagnostic{f.path, "", json_brief(f.cases), "must be a list of cases"});
    }
    if (!bad.empty()) throw ConfigError(bad);
  }
  std::set<std::string> seen_ids;
  for (const CaseFile& f : files) {
  const std::string& file = f.path;
  const json* list = &f.cases;
  if (f.cases.is_object() && f.cases.contains("cases")) list = &f.cases["cases"];
  const std::string list_pointer = list == &f.cases ? "" : "/cases";
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& c = (*list)[i];
    const std::string at = fmt::format("{}/{}", list_pointer, i);
    CaseOutcome o;
    o.id = c.is_object() && c.contains("id") ? text_of(c, "id") : fmt::format("#{}", i);
    if (!opt.only.empty() && std::find(opt.only.begin(), opt.only.end(), o.id) == opt.only.end()) continue;
    o.held_out = odd_id(o.id);
    o.file = file;
    if (!c.is_object()) {
      o.status = "error";
      o.reason = fmt::format("{}:{}: must be an object", file, at);
      rep.cases.push_back(o);
      continue;
    }
    if (!seen_ids.insert(o.id).second) {
      o.status = "error";
      o.reason = fmt::format("{}:{}/id: \"{}\" is already the id of an earlier case (ids must be unique across files)",
                             file, at, o.id);
      rep.cases.push_back(o);
      continue;
    }
    o.category = text_of(c, "category");
    o.source = source_of(c);
    if (c.contains("model")) o.model = text_of(c["model"], "name");
    else if (c.contains("scenario") && c["scenario"].is_object() && c["scenario"].contains("model")) {
      const json& m = c["scenario"]["model"];  // a preset name or an inline config
      o.model = m.is_string() ? m.get<std::string>() : text_of(m, "name");
    }
    if (c.contains("hardware")) o.device = text_of(c["hardware"], "device");
    ConvertedCase conv = case_to_scenario(c);
    const PublishedTime pub = published_step_time(c, conv.devices);
    o.assumptions = conv.assumptions;
    o.scenario = conv.scenario;
    o.devices = conv.devices;
    o.plan = plan_text(conv.scenario);
    o.basis = pub.basis;
    o.published_s = pub.step_s;
    Diagnostics memory_diag(file);
    o.measured_peak_gib = measured_peak_gib(c, at, memory_diag);
    const int stage_of_peak = measured_stage(c, at, memory_diag);
    if (!memory_diag.ok()) {
      o.status = "error";
      o.reason = ConfigError(memory_diag.list()).what();
      rep.cases.push_back(o);
      continue;
    }
    if (!pub.skip_reason.empty() && conv.skip_reason.empty() && o.measured_peak_gib) {
      // A measured peak alone is worth a run (memory tables seldom come with step times): the
      // case is compared on memory only.
      o.timed = false;
      o.basis.clear();
      o.published_s = 0;
      o.assumptions.push_back("step time not compared: " + pub.skip_reason);
    } else if (!pub.skip_reason.empty() || !conv.skip_reason.empty()) {
      o.status = "skipped";
      o.reason = !pub.skip_reason.empty() ? pub.skip_reason : conv.skip_reason;
      rep.cases.push_back(o);
      continue;
    }
    try {
      json doc = conv.scenario;
      Diagnostics set_diag(file);
      for (const auto& ov : opt.overrides) apply_override(doc, ov, set_diag);
      set_diag.throw_if_any();
      const std::string case_file = file + " case " + o.id;
      strategies::Scenario sc;
      try {
        sc = strategies::load_scenario(doc, case_file, "");
      } catch (const ConfigError& e) {
        if (opt.overrides.empty()) throw;
        throw blame_overrides(e, case_file, opt.overrides, "--set");
      }
      strategies::set_fidelity(sc, opt.fidelity);
      if (!sc.software.applied.empty()) {
        std::string applied;
        for (const auto& a : sc.software.applied) applied += (applied.empty() ? "" : ", ") + a;
        o.assumptions.push_back(sc.software.name + " sets " + applied);
      }
      if (sim::Progress* p = progress_of(opt.cancel))
        p->set_context(fmt::format("case {} of {} ({})", i + 1, list->size(), o.id));
      const strategies::Simulation sim = strategies::simulate(sc, opt.cancel);
      o.predicted_s = sim.result.step_time_s;
      if (o.timed) o.error_pct = 100.0 * (o.predicted_s - o.published_s) / o.published_s;
      o.feasible = sim.result.feasible;
      o.mfu = sim.result.mfu;
      o.bubble_fraction = sim.result.breakdown.bubble_s / sim.result.step_time_s;
      // Memory: the peak is the worst stage's (the first with the largest total); the measured
      // peak is compared with the stage that logged it (the worst unless the case names one).
      // PyTorch's allocator statistics (what runs log) do not see the CUDA context, NCCL's
      // buffers or fragmentation, which moesim's runtime reserve stands for: the comparison is
      // with the stage's total without that reserve.
      const strategies::StageResult* worst = nullptr;
      for (const auto& st : sim.result.stages)
        if (worst == nullptr || st.memory.total() > worst->memory.total()) worst = &st;
      o.predicted_peak_gib = sim.result.peak_memory_bytes / kGiB;
      o.capacity_gib = sim.result.capacity_bytes / kGiB;
      const strategies::StageResult* measured_at = worst;
      if (stage_of_peak != kWorstStage && !sim.result.stages.empty()) {
        const int n = static_cast<int>(sim.result.stages.size());
        const int idx = stage_of_peak == kLastStage ? n - 1 : std::min(stage_of_peak, n - 1);
        measured_at = &sim.result.stages[static_cast<std::size_t>(idx)];
        if (stage_of_peak >= n)
          o.assumptions.push_back(fmt::format("measured stage {} beyond the plan's {} stages: the last", stage_of_peak, n));
      }
      if (measured_at != nullptr)
        o.predicted_allocated_gib = (measured_at->memory.total() - measured_at->memory.reserved_bytes) / kGiB;
      o.memory_stage = measured_at == nullptr ? 0 : static_cast<int>(measured_at - sim.result.stages.data());
      if (o.measured_peak_gib)
        o.memory_error_pct = 100.0 * (o.predicted_allocated_gib - *o.measured_peak_gib) / *o.measured_peak_gib;
      o.status = "ok";
      if (!o.feasible) o.assumptions.push_back("moesim predicts it does not fit: " + sim.result.infeasible_reason);
    } catch (const ConfigError& e) {
      o.status = "error";
      o.reason = e.what();
    } catch (const Cancelled&) {
      throw;
    } catch (const std::exception& e) {
      o.status = "error";
      o.reason = std::string("internal error: ") + e.what();
    }
    if (opt.progress) {
      std::string what = o.reason;
      if (o.status == "ok") {
        what = o.timed ? fmt::format("{:+.1f}%", o.error_pct) : "memory only";
        if (o.measured_peak_gib) what += fmt::format(", memory {:+.1f}%", o.memory_error_pct);
      }
      std::cerr << fmt::format("{:<10} {:<8} {}\n", o.id, o.status, what);
    }
    rep.cases.push_back(std::move(o));
  }
  }
  std::vector<const CaseOutcome*> all, fit, held, memory;
  std::map<std::string, std::vector<const CaseOutcome*>> cat, dev;
  for (const auto& c : rep.cases) {
    if (c.status == "skipped") ++rep.skipped;
    if (c.status == "error") ++rep.errors;
    if (c.status != "ok") continue;
    ++rep.ran;
    if (!c.feasible) rep.predicted_not_to_fit.push_back(c.id);
    if (c.measured_peak_gib) memory.push_back(&c);
    if (!c.timed) continue;
    all.push_back(&c);
    (c.held_out ? held : fit).push_back(&c);
    cat[c.category].push_back(&c);
    const std::string preset = cluster_preset(c.scenario);
    dev[preset].push_back(&c);
  }
  rep.all = stats_of(all);
  rep.fit = stats_of(fit);
  rep.held_out = stats_of(held);
  for (auto& [k, v] : cat) rep.by_category.emplace_back(k, stats_of(v));
  for (auto& [k, v] : dev) rep.by_device.emplace_back(k, stats_of(v));
  rep.memory = stats_of(memory, &CaseOutcome::memory_error_pct);
  return rep;
}

std::string to_markdown(const ValidationReport& r) {
  std::string o;
  o += fmt::format("# moesim validation: {}\n\n", r.file);
  o += "| split | cases | mean abs error | max abs error | worst |\n|---|---|---|---|---|\n";
  auto row = [&](const std::string& name, const ErrorStats& s) {
    o += fmt::format("| {} | {} | {:.1f}% | {:.1f}% | {} |\n", name, s.n, s.mean_abs_pct, s.max_abs_pct, s.worst);
  };
  row("all", r.all);
  row("fit half (even ids)", r.fit);
  row("held-out half (odd ids)", r.held_out);
  if (r.memory.n > 0)
    o += fmt::format("\nmemory (measured peaks): {} cases, mean |error| {:.1f}%, max {:.1f}% ({})\n", r.memory.n,
                     r.memory.mean_abs_pct, r.memory.max_abs_pct, r.memory.worst);
  else
    o += "\nmemory (measured peaks): none in this file\n";
  std::string ids;
  for (const auto& id : r.predicted_not_to_fit) ids += (ids.empty() ? "" : ", ") + id;
  o += fmt::format("\npredicted not to fit: {} of {} runs that ran{}\n", r.predicted_not_to_fit.size(), r.ran,
                   ids.empty() ? "" : " (" + ids + ")");
  o += fmt::format("\n{} skipped, {} errors.\n\n", r.skipped, r.errors);
  if (!r.by_category.empty()) {  // empty when only memory was measured
    o += "| category | cases | mean abs error | max abs error |\n|---|---|---|---|\n";
    for (const auto& [k, s] : r.by_category) o += fmt::format("| {} | {} | {:.1f}% | {:.1f}% |\n", k, s.n, s.mean_abs_pct, s.max_abs_pct);
    o += "\n| cluster | cases | mean abs error | max abs error |\n|---|---|---|---|\n";
    for (const auto& [k, s] : r.by_device) o += fmt::format("| {} | {} | {:.1f}% | {:.1f}% |\n", k, s.n, s.mean_abs_pct, s.max_abs_pct);
  }
  o += "\n| case | model | devices | plan | published s | predicted s | error | peak GiB | memory error | basis |\n";
  o += "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& c : r.cases) {
    if (c.status != "ok") continue;
    const std::string dash = "—";
    o += fmt::format("| {}{} | {} | {} x {} | {} | {} | {} | {} | {:.1f}/{} | {} | {} |\n", c.id, c.held_out ? "" : "*",
                     c.model, c.devices, cluster_preset(c.scenario), c.plan,
                     c.timed ? fmt::format("{:.3f}", c.published_s) : dash,
                     c.timed ? fmt::format("{:.3f}", c.predicted_s) : dash,
                     c.timed ? fmt::format("{:+.1f}%", c.error_pct) : dash, c.predicted_peak_gib,
                     gib_brief(c.capacity_gib),
                     c.measured_peak_gib ? fmt::format("{:+.1f}%", c.memory_error_pct) : dash,
                     c.timed ? c.basis : dash);
  }
  o += "\n`*` marks the fitting half. Peak GiB: the worst stage per device (runtime reserve included) / the "
       "capacity; the memory error compares a measured peak with the stage that logged it (measured.peak_memory_stage, else the worst) without the reserve.\n";
  bool any = false;
  for (const auto& c : r.cases) {
    if (c.status == "ok") continue;
    if (!any) o += "\n| case | status | reason |\n|---|---|---|\n";
    any = true;
    std::string reason = c.reason;
    std::replace(reason.begin(), reason.end(), '\n', ' ');
    std::replace(reason.begin(), reason.end(), '|', '/');
    o += fmt::format("| {} | {} | {} |\n", c.id, c.status, reason);
  }
  return o;
}

json to_json(const ValidationReport& r) {
  auto st = [](const ErrorStats& s) {
    return json{{"cases", s.n}, {"mean_abs_error_pct", s.mean_abs_pct}, {"max_abs_error_pct", s.max_abs_pct}, {"worst", s.worst}};
  };
  json j;
  j["file"] = r.file;
  j["summary"] = {{"all", st(r.all)}, {"fit", st(r.fit)}, {"held_out", st(r.held_out)}, {"skipped", r.skipped}, {"errors", r.errors}};
  json cats = json::object(), devs = json::object();
  for (const auto& [k, s] : r.by_category) cats[k] = st(s);
  for (const auto& [k, s] : r.by_device) devs[k] = st(s);
  j["summary"]["by_category"] = cats;
  j["summary"]["by_cluster"] = devs;
  j["summary"]["memory"] = st(r.memory);
  j["summary"]["predicted_not_to_fit"] = r.predicted_not_to_fit;
  json cases = json::array();
  for (const auto& c : r.cases) {
    json x = {{"id", c.id}, {"status", c.status}, {"category", c.category}, {"model", c.model}, {"devices", c.devices},
              {"split", c.held_out ? "held_out" : "fit"}};
    if (c.status == "ok") {
      x["plan"] = c.plan;
      if (c.timed) {  // a memory-only case has no step time to compare
        x["published_s"] = c.published_s;
        x["predicted_s"] = c.predicted_s;
        x["error_pct"] = c.error_pct;
        x["basis"] = c.basis;
        x["mfu"] = c.mfu;
        x["bubble_fraction"] = c.bubble_fraction;
      }
      x["feasible"] = c.feasible;
      x["predicted_peak_gib"] = c.predicted_peak_gib;
      x["predicted_allocated_gib"] = c.predicted_allocated_gib;
      x["capacity_gib"] = c.capacity_gib;
      if (c.measured_peak_gib) {
        x["measured_peak_gib"] = *c.measured_peak_gib;
        x["memory_error_pct"] = c.memory_error_pct;
        x["memory_stage"] = c.memory_stage;
      }
    } else {
      x["reason"] = c.reason;
    }
    x["assumptions"] = c.assumptions;
    if (!c.scenario.is_null()) x["scenario"] = c.scenario;
    cases.push_back(x);
  }
  j["cases"] = cases;
  return j;
}

}  // namespace moesim::tools
