// Presets as a user reads them (preset_info.hpp).
#include "moesim/strategies/plan/preset_info.hpp"

#include <fmt/format.h>

#include "moesim/models/presets.hpp"
#include "moesim/models/workload.hpp"
#include "moesim/sim/config.hpp"
#include "moesim/topologies/topology.hpp"

namespace moesim::strategies {

namespace {

/// The unit a bare number of a preset is in, from its key (quantities with units are strings
/// such as "353.8TFLOPS" and carry their own).
std::string unit_of(const std::string& key, const nlohmann::json& v) {
  if (!v.is_number()) return "";
  if (key.find("efficiency") != std::string::npos || key.find("fraction") != std::string::npos)
    return "fraction of nominal";
  if (key.find("oversubscription") != std::string::npos) return "ratio (1: non-blocking)";
  if (key.find("overhead") != std::string::npos && key.find("gemm_k") != std::string::npos) return "elements of K";
  if (key.find("tiles") != std::string::npos) return "rows x columns";
  for (const char* counted : {"per_node", "per_leaf", "units", "nics", "devices"})
    if (v.is_number_integer() && key.find(counted) != std::string::npos) return "count";
  return "";
}

/// Every leaf of a preset: {"value", "source"} objects and plain values, with dotted keys.
void walk(const nlohmann::json& j, const std::string& prefix, nlohmann::json& out) {
  for (const auto& [k, v] : j.items()) {
    if (prefix.empty() && (k == "name" || k == "description" || k == "_source")) continue;
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object() && v.contains("value")) {
      out.push_back({{"key", key},
                     {"value", v["value"]},
                     {"unit", unit_of(key, v["value"])},
                     {"source", v.contains("source") && v["source"].is_string() ? v["source"] : nlohmann::json("")}});
    } else if (v.is_object()) {
      walk(v, key, out);
    } else {
      out.push_back({{"key", key}, {"value", v}, {"unit", unit_of(key, v)}, {"source", ""}});
    }
  }
}

[[noreturn]] void unknown(std::string_view kind, std::string_view name, const std::vector<std::string>& names) {
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  std::string msg = "is not a " + std::string(kind.substr(0, kind.size() - 1)) + " preset";
  const std::string near = closest_match(name, names);
  if (!near.empty()) msg += "; did you mean \"" + near + "\"?";
  throw ConfigError({Diagnostic{"moesim presets", "/" + std::string(kind), "\"" + std::string(name) + "\"",
                                msg + ". Known: " + known}});
}

nlohmann::json derived_model(std::string_view name) {
  Diagnostics diag("moesim presets");
  const models::ModelSpec m = models::load_model(nlohmann::json(std::string(name)), "/models", diag, "");
  diag.throw_if_any();
  nlohmann::json d;
  d["layers"] = m.num_layers;
  d["moe_layers"] = m.num_moe_layers();
  d["mtp_layers"] = m.mtp_layers;
  if (m.is_moe()) {
    d["routed_experts"] = m.num_experts;
    d["shared_experts"] = m.num_shared_experts;
    d["experts_per_token"] = m.top_k;
  }
  for (const int seq : {4096, 8192}) {
    const models::Workload w = models::build_workload(m, seq);
    if (seq == 4096) {  // the same at any length
      d["parameters_total"] = w.params_total;
      d["parameters_active_per_token"] = w.params_active_per_token;
    }
    const std::string at = seq == 4096 ? "4k" : "8k";
    d["training_flops_per_token_" + at] = w.model_flops_per_token;
    d["megatron_flops_per_token_" + at] = models::megatron_flops_per_token(m, seq);
    d["full_mask_flops_per_token_" + at] = w.model_flops_per_token + w.masked_attention_flops_per_token;
  }
  return d;
}

nlohmann::json derived_cluster(const nlohmann::json& preset, std::string_view name) {
  Diagnostics diag("moesim presets");
  nlohmann::json spec = {{"preset", std::string(name)}};
  if (preset.contains("devices_per_node") && preset["devices_per_node"].is_object())
    spec["devices"] = preset["devices_per_node"].value("value", 8);
  const topologies::ClusterSpec c = topologies::load_cluster(spec, "/clusters", diag);
  diag.throw_if_any();
  return {{"device", c.device.name},
          {"devices_per_node", c.devices_per_node},
          {"scale_up_achieved_bytes_per_s", c.scale_up_achieved().value()},
          {"nic_achieved_bytes_per_s", c.nic_achieved().value()},
          {"nics_per_node", c.nics_per_node},
          {"oversubscription", c.oversubscription}};
}

std::string brief(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string giga(double x, const char* unit) {
  if (x >= 1e12) return fmt::format("{:.2f} T{}", x / 1e12, unit);
  return fmt::format("{:.1f} G{}", x / 1e9, unit);
}

}  // namespace

nlohmann::json describe_preset(std::string_view kind, std::string_view name) {
  nlohmann::json out;
  out["kind"] = std::string(kind);
  out["name"] = std::string(name);
  std::optional<nlohmann::json> preset;
  if (kind == "models" || kind == "devices") {
    const char* k = kind == "models" ? "model" : "device";
    preset = models::preset_json(k, name);
    if (!preset) unknown(kind, name, models::preset_names(k));
  } else if (kind == "clusters") {
    const auto names = topologies::cluster_preset_names();
    if (std::find(names.begin(), names.end(), name) == names.end()) unknown(kind, name, names);
    preset = topologies::cluster_preset_json(name);
  } else {
    throw ConfigError({Diagnostic{"moesim presets", "", "\"" + std::string(kind) + "\"",
                                  "is not a kind of preset: models, devices or clusters"}});
  }
  out["description"] = preset->value("description", preset->value("_source", std::string()));
  out["values"] = nlohmann::json::array();
  walk(*preset, "", out["values"]);
  if (kind == "models") out["derived"] = derived_model(name);
  else if (kind == "clusters") out["derived"] = derived_cluster(*preset, name);
  else out["derived"] = nlohmann::json::object();
  out["preset"] = *preset;
  return out;
}

std::string format_preset(const nlohmann::json& d) {
  const std::string kind = d.value("kind", "");
  std::string o = fmt::format("{} {}: {}\n", kind.substr(0, kind.size() - 1), d.value("name", ""),
                              d.value("description", ""));
  const nlohmann::json& x = d["derived"];
  if (kind == "models") {
    o += fmt::format("  parameters        {:.1f}B total, {:.1f}B active per token (embedding and head{} included)\n",
                     x["parameters_total"].get<double>() / 1e9, x["parameters_active_per_token"].get<double>() / 1e9,
                     x["mtp_layers"].get<int>() > 0 ? ", MTP" : "");
    o += fmt::format("  layers            {} ({} MoE){}\n", x["layers"].get<int>(), x["moe_layers"].get<int>(),
                     x["mtp_layers"].get<int>() > 0 ? fmt::format(", {} MTP", x["mtp_layers"].get<int>()) : "");
    if (x.contains("routed_experts"))
      o += fmt::format("  experts           {} routed + {} shared, {} per token\n", x["routed_experts"].get<int>(),
                       x["shared_experts"].get<int>(), x["experts_per_token"].get<int>());
    for (const char* at : {"4k", "8k"})
      o += fmt::format("  training FLOPs    {} per token at {} (moesim's count; Megatron's formula {}, full-mask attention {})\n",
                       giga(x[std::string("training_flops_per_token_") + at].get<double>(), "FLOP"), at == std::string("4k") ? "4K" : "8K",
                       giga(x[std::string("megatron_flops_per_token_") + at].get<double>(), "FLOP"),
                       giga(x[std::string("full_mask_flops_per_token_") + at].get<double>(), "FLOP"));
    o += "  config (Hugging Face keys)\n";
  } else if (kind == "clusters") {
    o += fmt::format("  {} x {} per server; achieved scale-up {:.1f} GB/s per link, NIC {:.1f} GB/s x {} per server, "
                     "oversubscription {:g}\n",
                     x["devices_per_node"].get<int>(), x["device"].get<std::string>(),
                     x["scale_up_achieved_bytes_per_s"].get<double>() / 1e9, x["nic_achieved_bytes_per_s"].get<double>() / 1e9,
                     x["nics_per_node"].get<int>(), x["oversubscription"].get<double>());
  }
  for (const auto& v : d["values"]) {
    const std::string unit = v.value("unit", "");
    o += fmt::format("  {:<32} {}{}\n", v.value("key", ""), brief(v["value"]), unit.empty() ? "" : " (" + unit + ")");
    const std::string src = v.value("source", "");
    if (!src.empty()) o += fmt::format("      {}\n", src);
  }
  return o;
}

}  // namespace moesim::strategies
