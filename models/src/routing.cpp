#include "moesim/models/routing.hpp"

#include <cmath>
#include <filesystem>

namespace moesim::models {

const char* routing_name(RoutingKind k) {
  switch (k) {
    case RoutingKind::Balanced: return "balanced";
    case RoutingKind::Uniform: return "uniform";
    case RoutingKind::Zipf: return "zipf";
    case RoutingKind::Dirichlet: return "dirichlet";
    case RoutingKind::Histogram: return "histogram";
  }
  return "?";
}

namespace {

void read_histogram(const nlohmann::json& j, const std::string& file, const std::string& pointer, RoutingSpec& out,
                    const ModelSpec& m, Diagnostics& diag) {
  const nlohmann::json* layers = &j;
  std::string ptr = pointer;
  if (j.is_object()) {
    if (!j.contains("layers")) {
      diag.error_in(file, pointer, json_brief(j), "must be a list of per-expert loads or {\"layers\": [[...], ...]}");
      return;
    }
    layers = &j["layers"];
    ptr += "/layers";
  }
  if (!layers->is_array() || layers->empty()) {
    diag.error_in(file, ptr, json_brief(*layers), "must be a non-empty list");
    return;
  }
  // One row (a list of numbers) or a list of rows.
  std::vector<const nlohmann::json*> rows;
  if ((*layers)[0].is_number()) rows.push_back(layers);
  else
    for (const auto& r : *layers) rows.push_back(&r);
  const int moe_layers = m.num_moe_layers() + (m.mtp_layers > 0 && m.is_moe() ? m.mtp_layers : 0);
  if (rows.size() != 1 && static_cast<int>(rows.size()) < m.num_moe_layers())
    diag.error_in(file, ptr, std::to_string(rows.size()) + " rows",
                  "must have one row for every layer or one per MoE layer (" + std::to_string(moe_layers) + ")");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const nlohmann::json& row = *rows[i];
    const std::string rp = rows.size() == 1 && (*layers)[0].is_number() ? ptr : ptr + "/" + std::to_string(i);
    if (!row.is_array()) {
      diag.error_in(file, rp, json_brief(row), "must be a list of per-expert loads");
      continue;
    }
    if (static_cast<int>(row.size()) != m.num_experts) {
      diag.error_in(file, rp, std::to_string(row.size()) + " experts",
                    "must list one load per expert: the model has " + std::to_string(m.num_experts));
      continue;
    }
    std::vector<double> v;
    double sum = 0;
    for (std::size_t e = 0; e < row.size(); ++e) {
      const auto& x = row[e];
      if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0) {
        diag.error_in(file, rp + "/" + std::to_string(e), json_brief(x), "must be a finite, non-negative load");
        v.push_back(0);
        continue;
      }
      v.push_back(x.get<double>());
      sum += x.get<double>();
    }
    if (sum <= 0) diag.error_in(file, rp, "all zero", "must have some load");
    out.histogram.push_back(std::move(v));
  }
}

}  // namespace

void parse_routing(ObjectReader& r, RoutingSpec& out, const std::string& base_dir, const ModelSpec& m) {
  Diagnostics& diag = r.diagnostics();
  const std::string kind = r.string({"routing"}, "balanced", {"balanced", "uniform", "zipf", "dirichlet", "histogram"});
  out.kind = kind == "uniform" ? RoutingKind::Uniform
             : kind == "zipf" ? RoutingKind::Zipf
             : kind == "dirichlet" ? RoutingKind::Dirichlet
             : kind == "histogram" ? RoutingKind::Histogram
                                   : RoutingKind::Balanced;
  out.zipf_s = r.number({"zipf_s"}, 1.0, 0.0, 10.0);
  out.dirichlet_alpha = r.number({"dirichlet_alpha"}, 1.0, 1e-3, 1e6);
  out.capacity_factor = r.number({"capacity_factor"}, 0.0, 0.0, 1e6);
  if (out.capacity_factor > 0 && out.capacity_factor < 1)
    diag.error(r.child_pointer("capacity_factor"), std::to_string(out.capacity_factor),
               "must be at least 1 (or absent for dropless routing)");
  // Megatron's --moe-pad-expert-input-to-capacity: every expert's input is padded to the
  // capacity, so the token counts are known before routing and the host never waits for them.
  out.pad_to_capacity = r.boolean({"pad_to_capacity"}, false);
  if (out.pad_to_capacity && out.capacity_factor <= 0)
    diag.error(r.child_pointer("pad_to_capacity"), "true",
               "needs a capacity_factor (padding to the capacity of a dropless expert is not defined)");
  if (const auto* h = r.get({"histogram"})) {
    if (h->is_string()) {
      std::filesystem::path p(h->get<std::string>());
      if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
      out.histogram_file = p.string();
      Diagnostics local(out.histogram_file);
      auto j = read_json_file(out.histogram_file, local);
      for (const auto& d : local.list()) diag.error_in(d.file, d.pointer, d.value, d.constraint);
      if (j) read_histogram(*j, out.histogram_file, "", out, m, diag);
    } else {
      read_histogram(*h, diag.file(), r.child_pointer("histogram"), out, m, diag);
    }
  }
  if (out.kind == RoutingKind::Histogram && out.histogram.empty() && !r.has({"histogram"}))
    diag.error(r.child_pointer("histogram"), "", "is required with routing \"histogram\" (a file or a list)");
  if (out.kind != RoutingKind::Balanced && !m.is_moe())
    diag.error(r.child_pointer("routing"), "\"" + kind + "\"", "needs a mixture-of-experts model");
}

namespace {

/// A token picks top_k distinct experts, so one expert gets at most 1/top_k of the copies:
/// cap the popularity there and hand the excess to the others in proportion to their own
/// popularity (evenly when they have none), until nothing exceeds the cap.
void cap_at_top_k(std::vector<double>& p, int top_k) {
  if (top_k <= 1) return;
  const double cap = 1.0 / top_k;
  std::vector<bool> capped(p.size(), false);
  for (int round = 0; round < static_cast<int>(p.size()); ++round) {
    double excess = 0, free_weight = 0;
    std::size_t free_count = 0;
    for (std::size_t e = 0; e < p.size(); ++e) {
      if (!capped[e] && p[e] > cap) {
        excess += p[e] - cap;
        p[e] = cap;
        capped[e] = true;
      }
    }
    if (excess <= 1e-15) return;
    for (std::size_t e = 0; e < p.size(); ++e)
      if (!capped[e]) {
        free_weight += p[e];
        ++free_count;
      }
    if (free_count == 0) return;
    for (std::size_t e = 0; e < p.size(); ++e)
      if (!capped[e]) p[e] += free_weight > 0 ? excess * p[e] / free_weight : excess / static_cast<double>(free_count);
  }
}

}  // namespace

std::vector<double> expert_probabilities(const RoutingSpec& r, int moe_layer, int num_experts, int top_k,
                                         std::uint64_t seed) {
  std::vector<double> p(static_cast<std::size_t>(num_experts), 1.0 / num_experts);
  switch (r.kind) {
    case RoutingKind::Balanced:
    case RoutingKind::Uniform: break;
    case RoutingKind::Zipf: {
      // Popularity 1 / rank^s over a random ranking of the experts (a different hot set per layer).
      Rng rng = Rng::stream(seed, "routing/zipf/layer" + std::to_string(moe_layer));
      const std::vector<int> order = rng.permutation(num_experts);
      double sum = 0;
      for (int i = 0; i < num_experts; ++i) sum += (p[order[i]] = 1.0 / std::pow(i + 1.0, r.zipf_s));
      for (auto& x : p) x /= sum;
      break;
    }
    case RoutingKind::Dirichlet: {
      Rng rng = Rng::stream(seed, "routing/dirichlet/layer" + std::to_string(moe_layer));
      p = rng.dirichlet(static_cast<std::size_t>(num_experts), r.dirichlet_alpha);
      break;
    }
    case RoutingKind::Histogram: {
      const auto& row = r.histogram[r.histogram.size() == 1 ? 0 : std::min<std::size_t>(moe_layer, r.histogram.size() - 1)];
      double sum = 0;
      for (double x : row) sum += x;
      for (int e = 0; e < num_experts; ++e) p[e] = row[e] / sum;
      break;
    }
  }
  cap_at_top_k(p, top_k);
  return p;
}

std::vector<std::uint64_t> sample_expert_load(const std::vector<double>& p, std::uint64_t copies, Rng& rng) {
  return rng.multinomial(copies, p);
}

}  // namespace moesim::models
