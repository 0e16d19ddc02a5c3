#include "reliability.hpp"

#include <algorithm>

#include "moesim/models/presets.hpp"

namespace moesim::strategies {

namespace {

/// A list of device ids, each below the device count.
std::vector<long long> device_list(ObjectReader& r, const char* key, long long devices, Diagnostics& diag) {
  std::vector<long long> out;
  const nlohmann::json* v = r.get({key});
  if (v == nullptr) return out;
  const std::string ptr = r.child_pointer(key);
  if (!v->is_array()) {
    diag.error(ptr, json_brief(*v), "must be a list of device ids");
    return out;
  }
  for (std::size_t i = 0; i < v->size(); ++i) {
    const nlohmann::json& x = (*v)[i];
    if (!x.is_number_integer() || x.get<long long>() < 0 || x.get<long long>() >= devices)
      diag.error(ptr + "/" + std::to_string(i), json_brief(x),
                 "must be a device id from 0 to " + std::to_string(devices - 1) + " (the cluster's devices)");
    else out.push_back(x.get<long long>());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

void parse_stragglers(const nlohmann::json& j, Scenario& s, Diagnostics& diag) {
  ObjectReader r(j, "/simulation/stragglers", diag);
  Stragglers& g = s.simulation.stragglers;
  const long long devices = s.cluster.devices;
  if (const auto* d = r.get({"devices"})) {
    ObjectReader q(*d, "/simulation/stragglers/devices", diag);
    g.device_fraction = q.number({"fraction"}, 0.0, 0.0, 1.0);
    g.devices = device_list(q, "list", devices, diag);
    g.slowdown = q.number({"slowdown"}, 1.0, 1.0, 100.0);
    if (q.has({"fraction"}) && q.has({"list"}))  // by key: a rejected list is still a second choice
      diag.error("/simulation/stragglers/devices", "", "give \"fraction\" or \"list\", not both");
    if (!q.has({"slowdown"})) diag.error("/simulation/stragglers/devices/slowdown", "", "is required (e.g. 1.2: 20% slower)");
    q.finish();
  }
  if (const auto* n = r.get({"nics"})) {
    ObjectReader q(*n, "/simulation/stragglers/nics", diag);
    g.nic_fraction = q.number({"fraction"}, 0.0, 0.0, 1.0);
    g.nics = device_list(q, "list", devices, diag);
    g.nic_bandwidth = q.number({"bandwidth"}, 1.0, 1e-3, 1.0);
    g.nic_flapping = q.number({"flapping"}, 1.0, 0.0, 1.0);
    if (q.has({"fraction"}) && q.has({"list"}))
      diag.error("/simulation/stragglers/nics", "", "give \"fraction\" or \"list\", not both");
    if (!q.has({"bandwidth"}))
      diag.error("/simulation/stragglers/nics/bandwidth", "", "is required (the share of the NIC's bandwidth left, e.g. 0.5)");
    q.finish();
  }
  g.host_jitter = r.number({"host_jitter"}, 0.0, 0.0, 1.0);
  const bool random = g.host_jitter > 0 || (g.nic_flapping > 0 && g.nic_flapping < 1);
  g.steps = static_cast<int>(r.integer({"steps"}, random ? 16 : 1, 1, 1000));
  r.finish();
}

void parse_reliability(const nlohmann::json* spec, Scenario& s, Diagnostics& diag) {
  const std::string at = "/reliability";
  constexpr const char* kDefault = "llama3-405b-h100";
  Reliability& rel = s.reliability;
  if (spec != nullptr && spec->is_string() && spec->get<std::string>() == "none") {
    rel = Reliability{};
    rel.enabled = false;
    rel.name = "none";
    return;
  }
  std::string preset = kDefault;
  if (spec != nullptr && spec->is_string()) preset = spec->get<std::string>();
  else if (spec != nullptr && spec->is_object()) preset = spec->value("preset", std::string(kDefault));
  else if (spec != nullptr) {
    diag.error(at, json_brief(*spec), "must be a reliability preset name, an object or \"none\"");
    return;
  }
  auto base = models::preset_json("reliability", preset);
  if (!base) {
    std::string known;
    for (const auto& n : models::preset_names("reliability")) known += (known.empty() ? "" : ", ") + n;
    diag.error(spec != nullptr && spec->is_object() ? at + "/preset" : at, "\"" + preset + "\"",
               "is not a reliability preset. Known: " + known + " (or \"none\")");
    return;
  }
  Diagnostics pd("models/presets/reliability/" + preset + ".json");
  const auto sources = strip_sources(*base, "", pd);
  for (const auto& x : pd.list()) diag.error_in(x.file, x.pointer, x.value, x.constraint);
  nlohmann::json merged = std::move(*base);
  std::vector<std::string> given;
  if (spec != nullptr && spec->is_object()) {
    for (const auto& [k, v] : spec->items())
      if (k != "preset") given.push_back(k);
    nlohmann::json patch = *spec;
    patch.erase("preset");
    merged.merge_patch(patch);
  }
  ObjectReader r(merged, at, diag);
  rel.enabled = true;
  rel.name = given.empty() ? preset : preset + " (with the scenario's values)";
  r.ignore({"name", "description"});
  auto secs = [&](const char* key) { return r.opt_quantity({key}, Dimension::Seconds).value_or(0.0); };
  rel.device_mtbf_s = secs("device_mtbf");
  rel.node_mtbf_s = secs("node_mtbf");
  rel.restart_s = secs("restart_time");
  rel.checkpoint_interval_s = secs("checkpoint_interval");
  rel.checkpoint_async = r.boolean({"checkpoint_async"}, true);
  rel.storage_write_bandwidth = r.opt_quantity({"storage_write_bandwidth"}, Dimension::BytesPerSecond, 1.0).value_or(0.0);
  rel.storage_read_bandwidth =
      r.opt_quantity({"storage_read_bandwidth"}, Dimension::BytesPerSecond, 1.0).value_or(rel.storage_write_bandwidth);
  if (rel.storage_write_bandwidth <= 0)
    diag.error(at + "/storage_write_bandwidth", "", "is required (aggregate bandwidth of the checkpoint store, e.g. \"1TB/s\")");
  r.finish();
  for (const char* key : {"device_mtbf", "node_mtbf", "checkpoint_async", "storage_write_bandwidth",
                          "storage_read_bandwidth", "restart_time", "checkpoint_interval"}) {
    if (std::find(given.begin(), given.end(), key) != given.end()) {
      rel.sources.emplace_back(key, "given in the scenario");
      continue;
    }
    for (const auto& [ptr, src] : sources)
      if (ptr == std::string("/") + key) rel.sources.emplace_back(key, src);
  }
}

}  // namespace moesim::strategies
