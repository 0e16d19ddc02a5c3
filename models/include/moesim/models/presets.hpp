#pragma once
// Presets compiled into the library: devices (models/presets/devices/*.json) and model
// configurations in Hugging Face form (models/presets/models/*.json), and the loaders that
// accept a preset name, a path to a config.json, or an inline object.
//
//   Diagnostics diag{"scenario.json"};
//   ModelSpec m = load_model(json["model"], "/model", diag, "/path/of/scenario/dir");
//   DeviceSpec d = load_device("ascend-910b2", "/cluster/device", diag);

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/models/device.hpp"
#include "moesim/models/model_spec.hpp"
#include "moesim/sim/embedded.hpp"

namespace moesim::models {

std::span<const EmbeddedFile> embedded_presets();

/// Names of the presets of a kind ("device", "model"), sorted.
std::vector<std::string> preset_names(std::string_view kind);
/// The text of a preset, or nullopt.
std::optional<std::string_view> preset_text(std::string_view kind, std::string_view name);
/// The parsed JSON of a preset (sources kept), or nullopt.
std::optional<nlohmann::json> preset_json(std::string_view kind, std::string_view name);

/// `spec` is a preset name or an inline device object (an object may name a "preset" and
/// override some of its fields).
DeviceSpec load_device(const nlohmann::json& spec, const std::string& pointer, Diagnostics& diag);
/// `spec` is a preset name, a path to a config.json (relative to `base_dir`), an inline
/// Hugging Face config object, or {"preset": name, key: value, ...} (a preset with some of its
/// config keys overridden, e.g. {"preset": "pangu-ultra-moe-718b", "num_hidden_layers": 66}).
ModelSpec load_model(const nlohmann::json& spec, const std::string& pointer, Diagnostics& diag,
                     const std::string& base_dir);
/// The Hugging Face config `spec` stands for (any form load_model takes), sources stripped; the
/// problems go to `diag`. For changing a model key by key (architecture search).
std::optional<nlohmann::json> model_config(const nlohmann::json& spec, const std::string& pointer, Diagnostics& diag,
                                           const std::string& base_dir);

}  // namespace moesim::models
