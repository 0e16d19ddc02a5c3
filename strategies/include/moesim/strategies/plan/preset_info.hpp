#pragma once
// The built-in presets as a user reads them: every value with its unit and source, and what
// moesim derives from them (a model's parameter counts and FLOPs per token; a cluster's achieved
// bandwidths). Shared by `moesim presets KIND NAME` and Python's moesim.presets(kind, name).
//
//   nlohmann::json d = describe_preset("devices", "ascend-910b2");
//   std::cout << format_preset(d);

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace moesim::strategies {

/// kind: "models", "devices" or "clusters". Returns {"kind", "name", "description", "values":
/// [{"key", "value", "unit", "source"}], "derived": {...}, "preset": the preset file's JSON}.
/// Throws ConfigError naming the kind or name (with the closest preset name) when unknown.
nlohmann::json describe_preset(std::string_view kind, std::string_view name);

/// The description as text: a heading, the derived figures, then one value per line with its
/// source indented below it.
std::string format_preset(const nlohmann::json& described);

}  // namespace moesim::strategies
