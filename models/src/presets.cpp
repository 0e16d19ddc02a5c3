#include "moesim/models/presets.hpp"

#include <algorithm>
#include <filesystem>

namespace moesim::models {

std::vector<std::string> preset_names(std::string_view kind) {
  std::vector<std::string> out;
  for (const EmbeddedFile& f : embedded_presets())
    if (f.kind == kind) out.emplace_back(f.name);
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string_view> preset_text(std::string_view kind, std::string_view name) {
  for (const EmbeddedFile& f : embedded_presets())
    if (f.kind == kind && f.name == name) return f.text;
  return std::nullopt;
}

std::optional<nlohmann::json> preset_json(std::string_view kind, std::string_view name) {
  auto t = preset_text(kind, name);
  if (!t) return std::nullopt;
  return nlohmann::json::parse(*t);
}

namespace {
std::string list_names(std::string_view kind) {
  std::string s;
  for (const auto& n : preset_names(kind)) s += (s.empty() ? "" : ", ") + n;
  return s;
}

void unknown_preset(Diagnostics& diag, const std::string& pointer, const std::string& name, std::string_view kind) {
  std::string msg = "is not a " + std::string(kind) + " preset";
  const auto near = closest_match(name, preset_names(kind));
  if (!near.empty()) msg += "; did you mean \"" + near + "\"?";
  msg += ". Known: " + list_names(kind);
  diag.error(pointer, "\"" + name + "\"", msg);
}

/// A model given as a path: relative to the scenario's directory; a Hugging Face model
/// directory stands for its config.json.
std::filesystem::path model_file(const std::string& name, const std::string& base_dir) {
  std::filesystem::path path(name);
  if (path.is_relative() && !base_dir.empty()) path = std::filesystem::path(base_dir) / path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) && std::filesystem::is_regular_file(path / "config.json", ec))
    path /= "config.json";
  return path;
}
}  // namespace

DeviceSpec load_device(const nlohmann::json& spec, const std::string& pointer, Diagnostics& diag) {
  if (spec.is_string()) {
    const std::string name = spec.get<std::string>();
    auto j = preset_json("device", name);
    if (!j) {
      unknown_preset(diag, pointer, name, "device");
      return DeviceSpec{};
    }
    Diagnostics local("models/presets/devices/" + name + ".json");
    DeviceSpec d = parse_device(*j, "", local);
    for (const auto& x : local.list()) diag.error_in(x.file, x.pointer, x.value, x.constraint);
    return d;
  }
  if (spec.is_object() && spec.contains("preset")) {
    // A preset with some fields overridden.
    const auto& p = spec["preset"];
    if (!p.is_string()) {
      diag.error(pointer + "/preset", json_brief(p), "must be a device preset name");
      return DeviceSpec{};
    }
    auto base = preset_json("device", p.get<std::string>());
    if (!base) {
      unknown_preset(diag, pointer + "/preset", p.get<std::string>(), "device");
      return DeviceSpec{};
    }
    nlohmann::json merged = *base;
    Diagnostics strip_diag;
    strip_sources(merged, "", strip_diag);
    nlohmann::json patch = spec;
    patch.erase("preset");
    merged.merge_patch(patch);
    return parse_device(merged, pointer, diag);
  }
  if (!spec.is_object()) {
    diag.error(pointer, json_brief(spec), "must be a device preset name or a device object");
    return DeviceSpec{};
  }
  return parse_device(spec, pointer, diag);
}

ModelSpec load_model(const nlohmann::json& spec, const std::string& pointer, Diagnostics& diag,
                     const std::string& base_dir) {
  if (spec.is_string()) {
    const std::string name = spec.get<std::string>();
    if (auto j = preset_json("model", name)) {
      Diagnostics local("models/presets/models/" + name + ".json");
      ModelSpec m = parse_model_config(*j, "", local);
      for (const auto& x : local.list()) diag.error_in(x.file, x.pointer, x.value, x.constraint);
      if (m.name.empty() || m.name == m.architecture) m.name = name;
      return m;
    }
    std::error_code ec;
    const bool looks_like_path = name.find('/') != std::string::npos ||
                                 (name.size() > 5 && name.substr(name.size() - 5) == ".json") ||
                                 std::filesystem::is_regular_file(model_file(name, base_dir), ec);
    if (!looks_like_path) {
      unknown_preset(diag, pointer, name, "model");
      return ModelSpec{};
    }
    const std::filesystem::path path = model_file(name, base_dir);
    Diagnostics local(path.string());
    auto j = read_json_file(path.string(), local);
    ModelSpec m;
    if (j) m = parse_model_config(*j, "", local);
    for (const auto& x : local.list()) diag.error_in(x.file, x.pointer, x.value, x.constraint);
    if (m.name.empty() || m.name == m.architecture) m.name = path.stem().string();
    m.source_file = path.string();
    return m;
  }
  if (!spec.is_object()) {
    diag.error(pointer, json_brief(spec), "must be a model preset name, a path to a config.json, or a config object");
    return ModelSpec{};
  }
  if (spec.contains("preset")) {
    const auto cfg = model_config(spec, pointer, diag, base_dir);
    if (!cfg) return ModelSpec{};
    ModelSpec m = parse_model_config(*cfg, pointer, diag);
    if (m.name.empty() || m.name == m.architecture) m.name = spec["preset"].get<std::string>();
    return m;
  }
  return parse_model_config(spec, pointer, diag);
}

std::optional<nlohmann::json> model_config(const nlohmann::json& spec, const std::string& pointer, Diagnostics& diag,
                                           const std::string& base_dir) {
  auto stripped = [](nlohmann::json j) {
    Diagnostics ignore;
    strip_sources(j, "", ignore);
    return j;
  };
  if (spec.is_object() && spec.contains("preset")) {
    const auto& p = spec["preset"];
    if (!p.is_string()) {
      diag.error(pointer + "/preset", json_brief(p), "must be a model preset name");
      return std::nullopt;
    }
    auto base = preset_json("model", p.get<std::string>());
    if (!base) {
      unknown_preset(diag, pointer + "/preset", p.get<std::string>(), "model");
      return std::nullopt;
    }
    nlohmann::json merged = stripped(*base);
    nlohmann::json patch = spec;
    patch.erase("preset");
    merged.merge_patch(patch);
    return merged;
  }
  if (spec.is_object()) return stripped(spec);
  if (!spec.is_string()) {
    diag.error(pointer, json_brief(spec), "must be a model preset name, a path to a config.json, or a config object");
    return std::nullopt;
  }
  const std::string name = spec.get<std::string>();
  if (auto j = preset_json("model", name)) return stripped(*j);
  const std::filesystem::path path = model_file(name, base_dir);
  Diagnostics local(path.string());
  auto j = read_json_file(path.string(), local);
  for (const auto& x : local.list()) diag.error_in(x.file, x.pointer, x.value, x.constraint);
  if (!j) return std::nullopt;
  return stripped(*j);
}

}  // namespace moesim::models
