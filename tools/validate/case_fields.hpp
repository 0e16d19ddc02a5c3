#pragma once
// Reading the free-text fields of published cases (calibration_cases.json format): shared by
// the case converter (convert.cpp) and the validation harness (validate.cpp).

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

namespace moesim::tools::fields {

using nlohmann::json;

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

inline bool has(const std::string& text, const char* word) { return lower(text).find(lower(word)) != std::string::npos; }

inline std::string text_of(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

/// j[key] when j is an object holding it, else null (a const json's operator[] on a missing key
/// is undefined behaviour).
inline const json& field(const json& j, const char* key) {
  static const json null_value;
  if (!j.is_object()) return null_value;
  auto it = j.find(key);
  return it == j.end() ? null_value : *it;
}

/// The cluster preset a case's scenario names ("custom" for a cluster it describes in full).
inline std::string cluster_preset(const json& scenario) {
  const std::string p = text_of(field(scenario, "cluster"), "preset");
  return p.empty() ? "custom" : p;
}

inline std::optional<double> number_of(const json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

inline std::optional<int> int_of(const json& j, const char* key) {
  auto v = number_of(j, key);
  if (!v || *v != std::floor(*v) || std::abs(*v) > 2e9) return std::nullopt;  // not an int: as if absent
  return static_cast<int>(*v);
}

/// "name 123" or "name=123" in free text.
inline std::optional<int> find_int_after(const std::string& text, const std::string& name) {
  const std::regex re(name + R"([ =:]*(\d+))", std::regex::icase);
  std::smatch m;
  if (std::regex_search(text, m, re) && m[1].length() <= 9) return std::stoi(m[1]);  // at most 9 digits: fits an int
  return std::nullopt;
}

}  // namespace moesim::tools::fields
