#include "crossval.hpp"

#include "case_fields.hpp"
#include "moesim/sim/progress.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "moesim/strategies/output/simulate.hpp"
#include "moesim/models/presets.hpp"
#include "moesim/topologies/topology.hpp"

namespace moesim::tools {

using nlohmann::json;

std::vector<FitGroup> fit_groups() {
  // Priors are the estimates a preset would carry without a fit ([E] values): GEMMs at 70%
  // (BF16) and 55% (FP8) of peak, streaming at 80% of HBM, FlashAttention-2-like 50% forward,
  // 20 us of host time per operator (eager PyTorch dispatch of a launch). Bounds are physical.
  const FitParam gemm{"gemm_peak_efficiency", 0.45, 0.95, 0.70, true, 3};
  const FitParam fp8{"gemm_fp8_efficiency", 0.25, 0.85, 0.55, true, 3};
  const FitParam hbm{"hbm.efficiency", 0.5, 0.95, 0.80, true, 3};
  // Attention efficiency is not fitted any more: it comes from FlashAttention / cuDNN
  // micro-benchmarks in the device presets (fitted, it moved only the long-context source).
  const FitParam host{"host_op_time", 0.0, 150e-6, 20e-6, false, 4};
  return {
      {"a100", "a100-sxm-80gb", "", {gemm, hbm}},
      {"h100-bf16", "h100-sxm-80gb", "bf16", {gemm, host}},
      {"h100-fp8", "h100-sxm-80gb", "fp8", {fp8}},
      {"b200-bf16", "b200-sxm-180gb", "bf16", {gemm, host}},
      {"b200-fp8", "b200-sxm-180gb", "fp8", {fp8, host}},
      {"gb200-bf16", "gb200-gpu", "bf16", {gemm, host}},
      {"gb200-fp8", "gb200-gpu", "fp8", {fp8, host}},
      {"atlas-800t-a2", "ascend-910b2", "", {gemm, host}},
  };
}

namespace {

double to_u(const FitParam& p, double x) { return p.inverse ? 1.0 / x : x; }
double from_u(const FitParam& p, double u) { return p.inverse ? 1.0 / u : u; }

/// The grid values of a parameter: evenly spaced in its interpolation coordinate.
std::vector<double> grid_of(const FitParam& p) {
  std::vector<double> v;
  const double a = to_u(p, p.lo), b = to_u(p, p.hi);
  for (int i = 0; i < p.points; ++i) v.push_back(from_u(p, a + (b - a) * i / (p.points - 1)));
  return v;
}

/// Position of x between the grid's nodes: (cell, weight of the upper node), clamped.
std::pair<int, double> locate(const FitParam& p, const std::vector<double>& g, double x) {
  const double u = to_u(p, x);
  const int n = static_cast<int>(g.size());
  for (int i = 0; i + 1 < n; ++i) {
    const double a = to_u(p, g[static_cast<std::size_t>(i)]), b = to_u(p, g[static_cast<std::size_t>(i) + 1]);
    const double lo = std::min(a, b), hi = std::max(a, b);
    if ((u >= lo && u <= hi) || i + 2 == n) {
      const double w = std::clamp((u - a) / (b - a), 0.0, 1.0);
      return {i, w};
    }
  }
  return {0, 0.0};
}

std::string num(double v) { return fmt::format("{:.6g}", v); }

ErrorStats stats(const std::vector<double>& errors, const std::vector<std::string>& ids) {
  ErrorStats s;
  for (std::size_t i = 0; i < errors.size(); ++i) {
    const double e = std::abs(errors[i]);
    s.mean_abs_pct += e;
    if (e >= s.max_abs_pct) {
      s.max_abs_pct = e;
      s.worst = ids[i];
    }
    ++s.n;
  }
  if (s.n > 0) s.mean_abs_pct /= s.n;
  return s;
}

double percentile68(std::vector<double> v) {
  if (v.empty()) return 0;
  for (double& x : v) x = std::abs(x);
  std::sort(v.begin(), v.end());
  const double pos = 0.68 * static_cast<double>(v.size() - 1);
  const auto i = static_cast<std::size_t>(pos);
  const double f = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

/// A group's cases with their step time on the parameter grid.
struct GroupGrid {
  const FitGroup* group = nullptr;
  std::vector<std::vector<double>> axes;  ///< grid values per parameter
  std::vector<std::size_t> cases;         ///< indices into the cross-validated cases
  std::vector<std::vector<double>> times; ///< per case, row-major over the axes (NaN: failed)

  [[nodiscard]] std::size_t cells() const {
    std::size_t n = 1;
    for (const auto& a : axes) n *= a.size();
    return n;
  }
  /// Interpolated step time of case k at parameter values x.
  [[nodiscard]] double at(std::size_t k, const std::vector<double>& x) const {
    const auto& p = group->params;
    if (p.size() == 1) {
      const auto [i, w] = locate(p[0], axes[0], x[0]);
      return times[k][static_cast<std::size_t>(i)] * (1 - w) + times[k][static_cast<std::size_t>(i) + 1] * w;
    }
    const auto [i, wi] = locate(p[0], axes[0], x[0]);
    const auto [j, wj] = locate(p[1], axes[1], x[1]);
    const std::size_t n1 = axes[1].size();
    auto t = [&](int a, int b) { return times[k][static_cast<std::size_t>(a) * n1 + static_cast<std::size_t>(b)]; };
    return (1 - wi) * ((1 - wj) * t(i, j) + wj * t(i, j + 1)) + wi * ((1 - wj) * t(i + 1, j) + wj * t(i + 1, j + 1));
  }
};

/// Golden-section coordinate descent on the mean absolute error of `members` (indices into
/// grid.cases) against their published step times.
std::vector<double> fit(const GroupGrid& grid, const std::vector<std::size_t>& members,
                        const std::vector<CrossValidatedCase>& cases) {
  const auto& params = grid.group->params;
  std::vector<double> x;
  for (const auto& p : params) x.push_back(p.prior);
  if (members.empty()) return x;
  auto objective = [&](const std::vector<double>& v) {
    double sum = 0;
    for (std::size_t k : members) {
      const double pub = cases[grid.cases[k]].published_s;
      sum += std::abs(grid.at(k, v) / pub - 1.0);
    }
    return sum / static_cast<double>(members.size());
  };
  const double g = (std::sqrt(5.0) - 1) / 2;
  for (int sweep = 0; sweep < 3; ++sweep)
    for (std::size_t pi = 0; pi < params.size(); ++pi) {
      double a = params[pi].lo, b = params[pi].hi;
      std::vector<double> v = x;
      auto f = [&](double val) {
        v[pi] = val;
        return objective(v);
      };
      double c = b - g * (b - a), d = a + g * (b - a);
      double fc = f(c), fd = f(d);
      for (int it = 0; it < 40; ++it) {
        if (fc < fd) {
          b = d;
          d = c;
          fd = fc;
          c = b - g * (b - a);
          fc = f(c);
        } else {
          a = c;
          c = d;
          fc = fd;
          d = a + g * (b - a);
          fd = f(d);
        }
      }
      x[pi] = fc < fd ? c : d;
    }
  return x;
}

std::string precision_of(const json& scenario) {
  const std::string p = fields::text_of(fields::field(scenario, "training"), "precision");
  return p.empty() ? "bf16" : p;
}

}  // namespace

CrossValidation cross_validate(const ValidationReport& base, const std::vector<FitGroup>& groups,
                               const ValidateOptions& vopt, const CrossValidationOptions& opt) {
  CrossValidation cv;
  std::vector<const CaseOutcome*> outcomes;
  for (const auto& c : base.cases)
    if (c.status == "ok" && c.timed) outcomes.push_back(&c);
  std::vector<GroupGrid> grids(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    grids[g].group = &groups[g];
    for (const auto& p : groups[g].params) grids[g].axes.push_back(grid_of(p));
  }
  for (const CaseOutcome* o : outcomes) {
    CrossValidatedCase c;
    c.id = o->id;
    c.source = o->source.empty() ? "(no source)" : o->source;
    c.cluster = fields::cluster_preset(o->scenario);
    c.published_s = o->published_s;
    c.preset_s = o->predicted_s;
    c.preset_error_pct = o->error_pct;
    const std::string prec = precision_of(o->scenario);
    std::string device;  // the case's device preset (a cluster preset may name another machine's device)
    {
      Diagnostics d("cross-validation");
      const auto spec = topologies::load_cluster(fields::field(o->scenario, "cluster"), "/cluster", d);
      if (d.ok()) device = spec.device.name;
    }
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (groups[g].device == device && (groups[g].precision.empty() || groups[g].precision == prec)) {
        c.group = groups[g].name;
        grids[g].cases.push_back(cv.cases.size());
        break;
      }
    cv.cases.push_back(c);
  }

  // The grid simulations, spread over threads (each job is independent; results land in place).
  struct Job {
    std::size_t grid, member, cell;
  };
  std::vector<Job> jobs;
  std::map<std::string, double> attention_ratio;  // device preset -> backward / forward attention efficiency
  for (std::size_t g = 0; g < grids.size(); ++g) {
    auto& gr = grids[g];
    gr.times.assign(gr.cases.size(), std::vector<double>(gr.cells(), std::numeric_limits<double>::quiet_NaN()));
    for (std::size_t k = 0; k < gr.cases.size(); ++k)
      for (std::size_t cell = 0; cell < gr.cells(); ++cell) jobs.push_back({g, k, cell});
    Diagnostics d("cross-validation");
    const auto dev = models::load_device(json(groups[g].device), "/device", d);
    if (!d.ok()) continue;
    attention_ratio[groups[g].device] = dev.attention_bwd_efficiency / dev.attention_fwd_efficiency;
  }
  std::map<std::string, const CaseOutcome*> by_id;
  for (const CaseOutcome* o : outcomes) by_id[o->id] = o;
  std::atomic<std::size_t> next{0}, done{0};
  std::mutex io;
  // The workers' engines run at once: they follow the caller's flag without reporting to its
  // progress, which counts the grid simulations instead.
  sim::Progress* progress = progress_of(opt.cancel);
  if (progress != nullptr) {
    progress->set_context("");
    progress->begin("cross-validation grid simulations", jobs.size());
  }
  auto worker = [&] {
    CancelFlag quiet(opt.cancel);
    for (;;) {
      const std::size_t j = next.fetch_add(1);
      if (j >= jobs.size()) return;
      if (opt.cancel != nullptr && opt.cancel->requested()) return;
      const Job& job = jobs[j];
      GroupGrid& gr = grids[job.grid];
      const CrossValidatedCase& c = cv.cases[gr.cases[job.member]];
      const CaseOutcome& o = *by_id.at(c.id);
      // Parameter values of this grid cell (row-major over the axes).
      std::vector<double> x(gr.axes.size());
      std::size_t rest = job.cell;
      for (std::size_t a = gr.axes.size(); a-- > 0;) {
        x[a] = gr.axes[a][rest % gr.axes[a].size()];
        rest /= gr.axes[a].size();
      }
      try {
        json doc = o.scenario;
        Diagnostics sd(o.file);
        for (const auto& ov : vopt.overrides) apply_override(doc, ov, sd);
        apply_override(doc, "cluster.device.preset=\"" + gr.group->device + "\"", sd);
        for (std::size_t a = 0; a < x.size(); ++a) {
          const std::string& key = gr.group->params[a].key;
          if (key == "attention_efficiency") {
            apply_override(doc, "cluster.device.attention_efficiency.forward=" + num(x[a]), sd);
            apply_override(doc, "cluster.device.attention_efficiency.backward=" +
                                    num(x[a] * attention_ratio.at(gr.group->device)), sd);
          } else if (key == "host_op_time") {
            apply_override(doc, "cluster.device.host_op_time=\"" + num(x[a] * 1e6) + "us\"", sd);
          } else {
            apply_override(doc, "cluster.device." + key + "=" + num(x[a]), sd);
          }
        }
        sd.throw_if_any();
        strategies::Scenario sc = strategies::load_scenario(doc, o.file + " case " + o.id, "");
        strategies::set_fidelity(sc, vopt.fidelity);
        gr.times[job.member][job.cell] = strategies::simulate(sc, &quiet).result.step_time_s;
      } catch (const Cancelled&) {
        return;
      } catch (const std::exception& e) {
        std::lock_guard lock(io);
        std::cerr << "moesim validate: cross-validation: case " << c.id << ": " << e.what() << "\n";
      }
      const std::size_t n = done.fetch_add(1) + 1;
      if (progress != nullptr) progress->advance(n);
      if (opt.progress && (n % 50 == 0 || n == jobs.size())) {
        std::lock_guard lock(io);
        std::cerr << fmt::format("cross-validation: {} of {} grid simulations\n", n, jobs.size());
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, opt.threads); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (opt.cancel != nullptr && opt.cancel->requested()) throw Cancelled();
  cv.simulations = static_cast<int>(jobs.size());

  // A case whose grid has a failed point is not fitted on and keeps its preset prediction.
  std::vector<std::vector<char>> usable(grids.size());
  for (std::size_t g = 0; g < grids.size(); ++g)
    for (const auto& row : grids[g].times)
      usable[g].push_back(std::none_of(row.begin(), row.end(), [](double t) { return !(t > 0); }));

  std::set<std::string> sources;
  for (const auto& c : cv.cases) sources.insert(c.source);
  for (auto& c : cv.cases) c.loso_s = c.preset_s;  // cases outside every group
  for (std::size_t g = 0; g < grids.size(); ++g) {
    const GroupGrid& gr = grids[g];
    if (gr.cases.empty()) continue;
    std::vector<std::size_t> all_members;
    for (std::size_t k = 0; k < gr.cases.size(); ++k)
      if (usable[g][k]) all_members.push_back(k);
    const auto x_all = fit(gr, all_members, cv.cases);
    std::vector<std::pair<std::string, double>> vals;
    for (std::size_t a = 0; a < x_all.size(); ++a) vals.emplace_back(gr.group->params[a].key, x_all[a]);
    cv.fitted_all.emplace_back(gr.group->name, vals);
    for (const std::string& s : sources) {
      std::vector<std::size_t> train, test;
      for (std::size_t k : all_members) (cv.cases[gr.cases[k]].source == s ? test : train).push_back(k);
      if (test.empty()) continue;
      const auto x = fit(gr, train, cv.cases);
      for (std::size_t k : test) cv.cases[gr.cases[k]].loso_s = gr.at(k, x);
    }
  }
  std::vector<double> errs, preset_errs;
  std::vector<std::string> ids;
  std::map<std::string, std::vector<double>> e_src, e_cluster;
  std::map<std::string, std::vector<std::string>> id_src, id_cluster;
  for (auto& c : cv.cases) {
    c.loso_error_pct = 100.0 * (c.loso_s - c.published_s) / c.published_s;
    errs.push_back(c.loso_error_pct);
    preset_errs.push_back(c.preset_error_pct);
    ids.push_back(c.id);
    e_src[c.source].push_back(c.loso_error_pct);
    id_src[c.source].push_back(c.id);
    e_cluster[c.cluster].push_back(c.loso_error_pct);
    id_cluster[c.cluster].push_back(c.id);
  }
  cv.all = stats(errs, ids);
  cv.preset = stats(preset_errs, ids);
  for (const auto& [k, v] : e_src) cv.by_source.emplace_back(k, stats(v, id_src[k]));
  for (const auto& [k, v] : e_cluster) {
    cv.by_cluster.emplace_back(k, stats(v, id_cluster[k]));
    if (v.size() >= 5) cv.bands[k] = {percentile68(v), static_cast<int>(v.size())};
  }
  cv.bands["all"] = {percentile68(errs), static_cast<int>(errs.size())};
  return cv;
}

std::string to_markdown(const CrossValidation& cv) {
  std::string o = "\n## Leave-one-source-out cross-validation\n\n";
  o += fmt::format(
      "Every source (publication) predicted with the device parameters fitted on all the other sources "
      "({} grid simulations).\n\n",
      cv.simulations);
  o += "| | cases | mean abs error | max abs error | worst |\n|---|---|---|---|---|\n";
  o += fmt::format("| leave one source out | {} | {:.1f}% | {:.1f}% | {} |\n", cv.all.n, cv.all.mean_abs_pct,
                   cv.all.max_abs_pct, cv.all.worst);
  o += fmt::format("| presets as they are | {} | {:.1f}% | {:.1f}% | {} |\n", cv.preset.n, cv.preset.mean_abs_pct,
                   cv.preset.max_abs_pct, cv.preset.worst);
  o += "\n| held-out source | cases | mean abs error | max abs error | worst |\n|---|---|---|---|---|\n";
  for (const auto& [k, s] : cv.by_source)
    o += fmt::format("| {} | {} | {:.1f}% | {:.1f}% | {} |\n", k, s.n, s.mean_abs_pct, s.max_abs_pct, s.worst);
  o += "\n| cluster | cases | mean abs error | max abs error | error band (68% of cases within) |\n|---|---|---|---|---|\n";
  for (const auto& [k, s] : cv.by_cluster) {
    auto b = cv.bands.find(k);
    o += fmt::format("| {} | {} | {:.1f}% | {:.1f}% | {} |\n", k, s.n, s.mean_abs_pct, s.max_abs_pct,
                     b == cv.bands.end() ? "— (fewer than 5 cases: the overall band)" : fmt::format("±{:.1f}%", b->second.first));
  }
  o += fmt::format("\nOverall band: ±{:.1f}% ({} cases).\n", cv.bands.at("all").first, cv.bands.at("all").second);
  o += "\n| fit group | parameters fitted on all sources |\n|---|---|\n";
  for (const auto& [g, vals] : cv.fitted_all) {
    std::string t;
    for (const auto& [k, v] : vals) t += (t.empty() ? "" : ", ") + fmt::format("{} = {:.4g}", k, v);
    o += fmt::format("| {} | {} |\n", g, t);
  }
  o += "\n| case | source | cluster | group | published s | presets | error | leave-one-source-out | error |\n"
       "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& c : cv.cases)
    o += fmt::format("| {} | {} | {} | {} | {:.3f} | {:.3f} | {:+.1f}% | {:.3f} | {:+.1f}% |\n", c.id, c.source, c.cluster,
                     c.group.empty() ? "—" : c.group, c.published_s, c.preset_s, c.preset_error_pct, c.loso_s,
                     c.loso_error_pct);
  return o;
}

json to_json(const CrossValidation& cv) {
  auto st = [](const ErrorStats& s) {
    return json{{"cases", s.n}, {"mean_abs_error_pct", s.mean_abs_pct}, {"max_abs_error_pct", s.max_abs_pct}, {"worst", s.worst}};
  };
  json j;
  j["leave_one_source_out"] = st(cv.all);
  j["presets"] = st(cv.preset);
  j["simulations"] = cv.simulations;
  json src = json::object(), cl = json::object(), bands = json::object(), fitted = json::object();
  for (const auto& [k, s] : cv.by_source) src[k] = st(s);
  for (const auto& [k, s] : cv.by_cluster) cl[k] = st(s);
  for (const auto& [k, b] : cv.bands) bands[k] = {{"within_pct", b.first}, {"cases", b.second}};
  for (const auto& [g, vals] : cv.fitted_all) {
    json v = json::object();
    for (const auto& [k, x] : vals) v[k] = x;
    fitted[g] = v;
  }
  j["by_source"] = src;
  j["by_cluster"] = cl;
  j["error_bands"] = bands;
  j["fitted_on_all_sources"] = fitted;
  json cases = json::array();
  for (const auto& c : cv.cases)
    cases.push_back({{"id", c.id}, {"source", c.source}, {"cluster", c.cluster}, {"group", c.group},
                     {"published_s", c.published_s}, {"preset_s", c.preset_s}, {"preset_error_pct", c.preset_error_pct},
                     {"loso_s", c.loso_s}, {"loso_error_pct", c.loso_error_pct}});
  j["cases"] = cases;
  return j;
}

json error_bands_json(const CrossValidation& cv, const std::string& cases_files) {
  json bands = json::object();
  for (const auto& [k, b] : cv.bands) bands[k] = {{"within_pct", std::round(b.first * 10) / 10}, {"cases", b.second}};
  return {{"description",
           "Step-time error bands: for each cluster preset, 68% of the published runs on it were predicted within "
           "this many percent by moesim's leave-one-source-out cross-validation (each source predicted with "
           "device parameters fitted on the other sources). 'all' is used for presets with fewer than 5 runs."},
          {"cases", cases_files},
          {"leave_one_source_out_mean_abs_error_pct", std::round(cv.all.mean_abs_pct * 10) / 10},
          {"runs", cv.all.n},
          {"bands", bands}};
}

}  // namespace moesim::tools
