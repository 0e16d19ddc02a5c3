// Model-architecture search: candidates from the "model_search" section, an optional refit of
// one config key to a total-parameter budget, and each candidate's best parallel plan.
#include "moesim/strategies/search/model_search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "moesim/models/presets.hpp"
#include "moesim/models/workload.hpp"
#include "moesim/strategies/search/capacity.hpp"

namespace moesim::strategies {

namespace {

/// A parameter count: a number or "718B" / "39B" / "1.2T".
std::optional<double> param_count(const nlohmann::json& v) {
  if (v.is_number() && v.get<double>() > 0) return v.get<double>();
  if (v.is_string()) return parse_token_count(v.get<std::string>());
  return std::nullopt;
}

/// A [low, high] range of parameter counts.
void read_range(ObjectReader& r, const char* key, std::pair<double, double>& out, Diagnostics& diag) {
  const nlohmann::json* v = r.get({key});
  if (v == nullptr) return;
  const std::string ptr = r.child_pointer(key);
  std::optional<double> lo, hi;
  if (v->is_array() && v->size() == 2) {
    lo = param_count((*v)[0]);
    hi = param_count((*v)[1]);
  }
  if (!lo || !hi || *lo > *hi) {
    diag.error(ptr, json_brief(*v), "must be [low, high] parameter counts (numbers or \"30B\"-style), low <= high");
    return;
  }
  out = {*lo, *hi};
}

std::string base_dir_of(const Scenario& s) {
  if (s.file.empty() || s.file == "<inline>" || s.file == "<stdin>") return "";
  return std::filesystem::path(s.file).parent_path().string();
}

struct Params {
  double total = 0, active = 0;
  std::string error;  ///< the model is not valid
};

Params params_of(const nlohmann::json& config, const Scenario& s) {
  Diagnostics d("model_search");
  const models::ModelSpec m = models::load_model(config, "/model", d, base_dir_of(s));
  Params p;
  if (!d.ok()) {
    p.error = d.list().front().to_string();
    return p;
  }
  const models::Workload w = models::build_workload(m, s.training.seq_length, s.training.workload);
  p.total = w.params_total;
  p.active = w.params_active_per_token;
  return p;
}

/// The value of `key` (a multiple of `multiple`) whose total parameters come closest to the
/// target: params are affine in any one width or count, so two evaluations give the line, and
/// the multiples next to its root are compared.
std::optional<std::int64_t> refit(nlohmann::json& config, const ModelSearchSpec& spec, const Scenario& s) {
  const std::int64_t m = spec.fit_multiple;
  const std::int64_t v0 = std::max<std::int64_t>(m, config[spec.fit_key].get<std::int64_t>() / m * m);
  const std::int64_t v1 = v0 + 8 * m;
  auto total_at = [&](std::int64_t v) {
    config[spec.fit_key] = v;
    return params_of(config, s).total;
  };
  const double p0 = total_at(v0), p1 = total_at(v1);
  if (p0 <= 0 || p1 <= p0) return std::nullopt;  // the key does not move the parameters
  const double root = static_cast<double>(v0) + (spec.fit_total - p0) * static_cast<double>(v1 - v0) / (p1 - p0);
  const std::int64_t mid = std::max<std::int64_t>(m, static_cast<std::int64_t>(std::llround(root / static_cast<double>(m))) * m);
  std::int64_t best = mid;
  double err = 1e300;
  for (std::int64_t v : {mid - m, mid, mid + m}) {
    if (v < m) continue;
    const double e = std::abs(total_at(v) - spec.fit_total);
    if (e < err) {
      err = e;
      best = v;
    }
  }
  config[spec.fit_key] = best;
  return best;
}

bool in_range(double x, const std::pair<double, double>& r) {
  return (r.first <= 0 && r.second <= 0) || (x >= r.first && x <= r.second);
}

std::string billions(double p) { return fmt::format("{:.1f}B", p / 1e9); }

}  // namespace

std::optional<ModelSearchSpec> parse_model_search(const Scenario& s) {
  if (!s.document.is_object() || !s.document.contains("model_search")) return std::nullopt;
  Diagnostics diag(s.file);
  ModelSearchSpec spec;
  ObjectReader r(s.document["model_search"], "/model_search", diag);
  if (!r.valid()) {
    diag.throw_if_any();
    return std::nullopt;
  }
  Diagnostics cfg_diag(s.file);
  const auto base = models::model_config(s.document["model"], "/model", cfg_diag, base_dir_of(s));
  if (const nlohmann::json* axes = r.get({"axes"})) {
    if (!axes->is_object() || axes->empty()) {
      diag.error(r.child_pointer("axes"), json_brief(*axes), "must be an object of config keys and lists of values");
    } else {
      for (const auto& [key, vals] : axes->items()) {
        const std::string ptr = r.child_pointer("axes") + "/" + key;
        if (!vals.is_array() || vals.empty()) {
          diag.error(ptr, json_brief(vals), "must be a non-empty list of values for the model's config key");
          continue;
        }
        if (base && !base->contains(key))
          diag.error(ptr, "", "is not a key of the scenario's model config (a Hugging Face config key, e.g. "
                              "num_hidden_layers, hidden_size, num_routed_experts, num_experts_per_tok)");
        spec.axes.emplace_back(key, vals.get<std::vector<nlohmann::json>>());
      }
    }
  } else {
    diag.error(r.child_pointer("axes"), "", "is required: {config key: [values], ...}");
  }
  if (const nlohmann::json* fit = r.get({"fit"})) {
    ObjectReader f(*fit, r.child_pointer("fit"), diag);
    if (f.valid()) {
      spec.fit_key = f.string({"key"}, "");
      const nlohmann::json* tot = f.get({"total_params"});
      const auto t = tot != nullptr ? param_count(*tot) : std::nullopt;
      if (!t)
        diag.error(f.child_pointer("total_params"), tot ? json_brief(*tot) : "",
                   tot ? "must be a parameter count (a number, or \"718B\"-style)" : "is required: a parameter count (\"718B\")");
      else spec.fit_total = *t;
      spec.fit_multiple = static_cast<int>(f.integer({"multiple"}, 64, 1, 1 << 20));
      f.finish();
      if (spec.fit_key.empty()) diag.error(f.child_pointer("key"), "", "is required: the config key to refit");
      else if (base && (!base->contains(spec.fit_key) || !(*base)[spec.fit_key].is_number_integer()))
        diag.error(f.child_pointer("key"), "\"" + spec.fit_key + "\"",
                   "must be an integer key of the model's config (a width or a count)");
      for (const auto& [key, vals] : spec.axes)
        if (key == spec.fit_key)
          diag.error(f.child_pointer("key"), "\"" + key + "\"", "is also an axis: the refit would overwrite its values");
    }
  }
  read_range(r, "total_params", spec.total_range, diag);
  read_range(r, "active_params", spec.active_range, diag);
  spec.top_k = static_cast<int>(r.integer({"top_k"}, 4, 1, 1000));
  spec.refine_k = static_cast<int>(r.integer({"refine_k"}, 32, 0, 100000));
  r.ignore({"_comment", "description"});
  r.finish();
  for (const auto& x : cfg_diag.list()) diag.error_in(x.file, x.pointer, x.value, x.constraint);
  diag.throw_if_any();
  return spec;
}

ModelSearchReport model_search(const Scenario& base, const ModelSearchSpec& spec, const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  ModelSearchReport rep;
  Diagnostics cfg_diag(base.file);
  const auto base_cfg = models::model_config(base.document["model"], "/model", cfg_diag, base_dir_of(base));
  cfg_diag.throw_if_any();
  // The cartesian product of the axes, first axis slowest.
  std::size_t n = 1;
  for (const auto& a : spec.axes) n *= a.second.size();
  for (std::size_t idx = 0; idx < n; ++idx) {
    ModelCandidate c;
    c.config = *base_cfg;
    std::size_t rest = idx;
    std::vector<std::size_t> pick(spec.axes.size());
    for (std::size_t a = spec.axes.size(); a-- > 0;) {
      pick[a] = rest % spec.axes[a].second.size();
      rest /= spec.axes[a].second.size();
    }
    for (std::size_t a = 0; a < spec.axes.size(); ++a) {
      c.overrides[spec.axes[a].first] = spec.axes[a].second[pick[a]];
      c.config[spec.axes[a].first] = spec.axes[a].second[pick[a]];
    }
    if (!spec.fit_key.empty()) {
      if (const auto v = refit(c.config, spec, base)) c.overrides[spec.fit_key] = *v;
      else c.skipped = spec.fit_key + " does not change the parameter count of this candidate";
    }
    const Params p = params_of(c.config, base);
    c.total_params = p.total;
    c.active_params = p.active;
    if (!p.error.empty()) c.skipped = "invalid model: " + p.error;
    else if (c.skipped.empty() && !in_range(p.total, spec.total_range))
      c.skipped = fmt::format("{} total parameters, outside [{}, {}]", billions(p.total), billions(spec.total_range.first),
                              billions(spec.total_range.second));
    else if (c.skipped.empty() && !in_range(p.active, spec.active_range))
      c.skipped = fmt::format("{} active parameters, outside [{}, {}]", billions(p.active),
                              billions(spec.active_range.first), billions(spec.active_range.second));
    if (c.skipped.empty()) {
      const auto tc = std::chrono::steady_clock::now();
      try {
        nlohmann::json doc = base.document;
        doc["model"] = c.config;
        doc.erase("model_search");
        const Scenario sc = load_scenario(doc, base.file, base_dir_of(base));
        SearchSpace space = parse_search_space(sc);
        space.top_k = spec.top_k;
        space.refine_k = spec.refine_k;
        SearchOptions o = opt;
        o.top_k = spec.top_k;
        o.out_file.clear();
        o.resume = false;
        if (opt.progress) {
          const std::string label = fmt::format("model {} of {}: ", idx + 1, n);
          o.progress = [&opt, label](const char* phase, std::size_t done, std::size_t total) {
            opt.progress((label + phase).c_str(), done, total);
          };
        }
        const SearchReport r = search(sc, space, o);
        rep.objective = r.objective;
        c.plans = r.valid;
        c.searched = true;
        if (r.ranked.empty()) c.skipped = "no plan of its space fits in memory";
        else c.best = r.ranked.front();
      } catch (const ConfigError& e) {
        c.skipped = e.diagnostics().empty() ? std::string(e.what()) : e.diagnostics().front().to_string();
      }
      c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc).count();
    }
    rep.candidates.push_back(std::move(c));
  }
  // Best first (by the plan search's objective), then those without a plan, in axis order.
  std::stable_sort(rep.candidates.begin(), rep.candidates.end(), [](const ModelCandidate& a, const ModelCandidate& b) {
    if (a.best.has_value() != b.best.has_value()) return a.best.has_value();
    return a.best && b.best && a.best->objective > b.best->objective;
  });
  rep.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

nlohmann::json to_json(const ModelSearchReport& r) {
  nlohmann::json j;
  j["objective"] = objective_name(r.objective);
  nlohmann::json cands = nlohmann::json::array();
  for (const auto& c : r.candidates) {
    nlohmann::json e;
    e["model"] = c.overrides;
    e["total_params"] = c.total_params;
    e["active_params"] = c.active_params;
    if (!c.skipped.empty()) e["skipped"] = c.skipped;
    if (c.best) {
      e["plans"] = c.plans;
      e["best_plan"] = c.best->plan_json;
      e["step_time_s"] = c.best->step_time_s;
      e["tokens_per_s"] = c.best->tokens_per_s;
      e["mfu"] = c.best->mfu;
      e["peak_memory_bytes"] = c.best->peak_memory_bytes;
    }
    cands.push_back(e);
  }
  j["candidates"] = cands;
  return j;
}

}  // namespace moesim::strategies
