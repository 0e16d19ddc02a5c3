#include "moesim/sim/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

namespace moesim {

std::string Diagnostic::to_string() const {
  // A command-line option ("--trace-ranks") has no JSON path.
  std::string s = pointer.empty() && file.starts_with("--") ? file + ": "
                                                             : file + ":" + (pointer.empty() ? std::string("/") : pointer) + ": ";
  if (!value.empty()) s += value + " ";
  s += constraint;
  return s;
}

namespace {
std::string join_diagnostics(const std::vector<Diagnostic>& d) {
  std::string s;
  for (const auto& x : d) {
    if (!s.empty()) s += '\n';
    s += x.to_string();
  }
  return s;
}


std::size_t levenshtein(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

ConfigError::ConfigError(std::vector<Diagnostic> diagnostics)
    : std::runtime_error(join_diagnostics(diagnostics)), diagnostics_(std::move(diagnostics)) {}

void Diagnostics::error(std::string pointer, std::string value, std::string constraint) {
  error_in(file_, std::move(pointer), std::move(value), std::move(constraint));
}

void Diagnostics::error_in(std::string file, std::string pointer, std::string value, std::string constraint) {
  // A value the reader refused (e.g. 4096.5 "must be an integer") is read as its default
  // afterwards; checks on that default would report things the user never wrote
  // ("seq_length: 1 must be divisible by 8").
  for (const auto& [f, p] : refused_)
    if (p == pointer && f == file) return;
  list_.push_back(Diagnostic{std::move(file), std::move(pointer), std::move(value), std::move(constraint)});
}

void Diagnostics::value_error(std::string pointer, std::string value, std::string constraint) {
  error(pointer, std::move(value), std::move(constraint));
  refused_.emplace_back(file_, std::move(pointer));
}

void Diagnostics::throw_if_any() const {
  if (!list_.empty()) throw ConfigError(list_);
}

std::string escape_pointer_token(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string json_brief(const nlohmann::json& j) {
  // Invalid UTF-8 in an input string is shown replaced (U+FFFD), not thrown on.
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(3, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    const std::size_t d = levenshtein(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

ObjectReader::ObjectReader(const nlohmann::json& j, std::string pointer, Diagnostics& diag)
    : pointer_(std::move(pointer)), diag_(&diag) {
  if (j.is_object()) obj_ = &j;
  else diag.error(pointer_, json_brief(j), "must be a JSON object");
}

std::string ObjectReader::child_pointer(std::string_view key) const {
  return pointer_ + "/" + escape_pointer_token(key);
}

std::string ObjectReader::found_key(Keys names) const {
  if (obj_ == nullptr) return std::string(*names.begin());
  for (auto n : names)
    if (obj_->contains(n)) return std::string(n);
  return std::string(*names.begin());
}

bool ObjectReader::has(Keys names) {
  for (auto n : names) known_.emplace_back(n);
  if (obj_ == nullptr) return false;
  for (auto n : names)
    if (obj_->contains(n)) return true;
  return false;
}

const nlohmann::json* ObjectReader::get(Keys names) {
  for (auto n : names) known_.emplace_back(n);
  if (obj_ == nullptr) return nullptr;
  const nlohmann::json* found = nullptr;
  std::string_view found_name;
  for (auto n : names) {
    auto it = obj_->find(n);
    if (it == obj_->end()) continue;
    if (found != nullptr) {
      diag_->value_error(child_pointer(n), json_brief(*it),
                   "is given twice: also as \"" + std::string(found_name) + "\"; keep one");
      continue;
    }
    found = &*it;
    found_name = n;
  }
  return found;
}

std::optional<std::int64_t> ObjectReader::opt_integer(Keys names, std::int64_t min, std::int64_t max) {
  const nlohmann::json* v = get(names);
  if (v == nullptr || v->is_null()) return std::nullopt;
  const std::string p = child_pointer(found_key(names));
  std::int64_t x = 0;
  if (v->is_number_integer()) {
    x = v->get<std::int64_t>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
             std::abs(v->get<double>()) < 9e15) {
    x = static_cast<std::int64_t>(v->get<double>());
  } else {
    diag_->value_error(p, json_brief(*v), "must be an integer");
    return std::nullopt;
  }
  if (x < min || x > max) {
    diag_->value_error(p, json_brief(*v),
                 max == INT64_MAX ? "must be >= " + std::to_string(min)
                                  : "must be between " + std::to_string(min) + " and " + std::to_string(max));
    return std::nullopt;
  }
  return x;
}

std::int64_t ObjectReader::integer(Keys names, std::int64_t def, std::int64_t min, std::int64_t max) {
  return opt_integer(names, min, max).value_or(def);
}

std::int64_t ObjectReader::required_integer(Keys names, std::int64_t min, std::int64_t max) {
  if (valid() && !has(names)) {
    diag_->value_error(child_pointer(*names.begin()), "", "is required (an integer)");
    return min;
  }
  return opt_integer(names, min, max).value_or(min);
}

std::optional<double> ObjectReader::opt_number(Keys names, double min, double max) {
  const nlohmann::json* v = get(names);
  if (v == nullptr || v->is_null()) return std::nullopt;
  const std::string p = child_pointer(found_key(names));
  if (!v->is_number()) {
    diag_->value_error(p, json_brief(*v), "must be a number");
    return std::nullopt;
  }
  const double x = v->get<double>();
  if (!(x >= min && x <= max)) {
    std::ostringstream os;
    os << "must be between " << min << " and " << max;
    diag_->value_error(p, json_brief(*v), os.str());
    return std::nullopt;
  }
  return x;
}

double ObjectReader::number(Keys names, double def, double min, double max) {
  return opt_number(names, min, max).value_or(def);
}

std::optional<bool> ObjectReader::opt_boolean(Keys names) {
  const nlohmann::json* v = get(names);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_boolean()) {
    diag_->value_error(child_pointer(found_key(names)), json_brief(*v), "must be true or false");
    return std::nullopt;
  }
  return v->get<bool>();
}

bool ObjectReader::boolean(Keys names, bool def) { return opt_boolean(names).value_or(def); }

std::optional<std::string> ObjectReader::opt_string(Keys names, std::initializer_list<std::string_view> allowed) {
  return opt_string(names, std::span<const std::string_view>(allowed.begin(), allowed.size()));
}

std::optional<std::string> ObjectReader::opt_string(Keys names, std::span<const std::string_view> allowed) {
  const nlohmann::json* v = get(names);
  if (v == nullptr || v->is_null()) return std::nullopt;
  const std::string p = child_pointer(found_key(names));
  if (!v->is_string()) {
    diag_->value_error(p, json_brief(*v), "must be a string");
    return std::nullopt;
  }
  std::string s = v->get<std::string>();
  if (allowed.size() > 0 && std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
    std::string list;
    for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    diag_->value_error(p, json_brief(*v), "must be one of: " + list);
    return std::nullopt;
  }
  return s;
}

std::string ObjectReader::string(Keys names, std::string def, std::initializer_list<std::string_view> allowed) {
  return opt_string(names, allowed).value_or(std::move(def));
}

std::optional<double> ObjectReader::opt_quantity(Keys names, Dimension dim, double min) {
  const nlohmann::json* v = get(names);
  if (v == nullptr || v->is_null()) return std::nullopt;
  const std::string p = child_pointer(found_key(names));
  double x = 0.0;
  if (v->is_number()) {
    x = v->get<double>();
  } else if (v->is_string()) {
    auto q = parse_quantity(v->get<std::string>());
    if (!q) {
      diag_->value_error(p, json_brief(*v), std::string("is not a quantity with a unit; expected ") + dimension_name(dim));
      return std::nullopt;
    }
    if (q->dimension != dim && q->dimension != Dimension::Dimensionless) {
      diag_->value_error(p, json_brief(*v),
                   std::string("has the wrong unit: it is ") + dimension_name(q->dimension) + ", expected " +
                       dimension_name(dim));
      return std::nullopt;
    }
    x = q->value;
  } else {
    diag_->value_error(p, json_brief(*v), std::string("must be ") + dimension_name(dim));
    return std::nullopt;
  }
  if (!(x >= min) || !std::isfinite(x)) {
    std::ostringstream os;
    os << "must be >= " << min;
    diag_->value_error(p, json_brief(*v), os.str());
    return std::nullopt;
  }
  return x;
}

double ObjectReader::required_quantity(Keys names, Dimension dim, double min) {
  if (valid() && !has(names)) {
    diag_->value_error(child_pointer(*names.begin()), "", std::string("is required (") + dimension_name(dim) + ")");
    return min;
  }
  return opt_quantity(names, dim, min).value_or(min);
}

void ObjectReader::ignore(Keys names) {
  for (auto n : names) known_.emplace_back(n);
}

void ObjectReader::finish(std::string_view why) {
  if (obj_ == nullptr) return;
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
    // The pointer names the key; its value follows the message (before it, it would read as
    // if the value were the unknown key: "launch_overhead: 0.0 is not a known key").
    std::string msg = (why.empty() ? std::string("is not a known key here") : std::string(why)) + " (its value: " +
                      json_brief(it.value()) + ")";
    const std::string near = closest_match(it.key(), known_);
    if (!near.empty()) msg += "; did you mean \"" + near + "\"?";
    diag_->error(child_pointer(it.key()), "", msg);
  }
}

void apply_override(nlohmann::json& doc, std::string_view assignment, Diagnostics& diag) {
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    diag.error_in("--set", "", std::string(assignment), "must have the form KEY.PATH=VALUE");
    return;
  }
  const std::string key(assignment.substr(0, eq));
  const std::string text(assignment.substr(eq + 1));
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (value.is_discarded()) value = text;
  nlohmann::json* cur = &doc;
  std::string pointer;
  std::size_t start = 0;
  while (true) {
    const auto dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) {
      diag.error_in("--set", "", std::string(assignment), "has an empty path component");
      return;
    }
    if (!cur->is_object()) {
      if (cur->is_string() && pointer == "/model") {
        diag.error_in("--set", pointer, json_brief(*cur),
                      "is a preset name; give the model inline to override its fields");
      } else {
        diag.error_in("--set", pointer, json_brief(*cur), "is not an object, so it has no field \"" + part + "\"");
      }
      return;
    }
    pointer += "/" + escape_pointer_token(part);
    if (dot == std::string::npos) {
      (*cur)[part] = std::move(value);
      return;
    }
    cur = &(*cur)[part];
    if (cur->is_null()) *cur = nlohmann::json::object();
    start = dot + 1;
  }
}

ConfigError blame_overrides(const ConfigError& e, const std::string& file, std::span<const std::string> overrides,
                            std::string_view label) {
  std::vector<Diagnostic> out = e.diagnostics();
  for (Diagnostic& d : out) {
    if (d.file != file) continue;
    // The last override of a path wins, as in apply_override.
    for (auto it = overrides.rbegin(); it != overrides.rend(); ++it) {
      const auto eq = it->find('=');
      if (eq == std::string::npos) continue;
      std::string pointer;
      for (std::size_t start = 0;;) {
        const auto dot = it->find('.', start);
        const auto end = std::min(dot, eq);
        pointer += "/" + escape_pointer_token(std::string_view(*it).substr(start, end - start));
        if (dot == std::string::npos || dot > eq) break;
        start = dot + 1;
      }
      if (d.pointer == pointer || d.pointer.starts_with(pointer + "/")) {
        d.file = std::string(label) + " " + *it;
        break;
      }
    }
  }
  return ConfigError(std::move(out));
}

namespace {
void strip_sources_rec(nlohmann::json& j, const std::string& pointer, Diagnostics& diag,
                       std::vector<std::pair<std::string, std::string>>& out) {
  if (j.is_object()) {
    if (j.contains("value") && (j.contains("source") || j.size() == 1)) {
      auto src = j.find("source");
      if (src == j.end() || !src->is_string() || src->get<std::string>().empty()) {
        diag.error(pointer + "/source", src == j.end() ? "" : json_brief(*src),
                   "must be a non-empty string saying where the value comes from");
      } else {
        out.emplace_back(pointer, src->get<std::string>());
      }
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it.key() != "value" && it.key() != "source")
          diag.error(pointer + "/" + escape_pointer_token(it.key()), json_brief(it.value()),
                     "is not a known key here (a sourced value has only \"value\" and \"source\")");
      nlohmann::json v = j["value"];
      j = std::move(v);
      return;
    }
    for (auto it = j.begin(); it != j.end(); ++it)
      strip_sources_rec(it.value(), pointer + "/" + escape_pointer_token(it.key()), diag, out);
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) strip_sources_rec(j[i], pointer + "/" + std::to_string(i), diag, out);
  }
}
}  // namespace

std::vector<std::pair<std::string, std::string>> strip_sources(nlohmann::json& j, const std::string& pointer,
                                                               Diagnostics& diag) {
  std::vector<std::pair<std::string, std::string>> out;
  strip_sources_rec(j, pointer, diag, out);
  return out;
}

namespace {

/// Line and column (1-based) of byte `at` in `text`.
std::pair<std::size_t, std::size_t> line_col(std::string_view text, std::size_t at) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < at && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

/// What the JSON parser would accept but moesim refuses before parsing: nesting deeper than
/// kMaxJsonDepth (a deep document would exhaust the stack of any recursive walk over it) and
/// numbers beyond the range of a double (2e308). Reported with the JSON path of the place.
/// Malformed text is left to the parser (the scan stops at the first thing it does not
/// understand), so a syntax error keeps its own message.
bool check_json_limits(std::string_view text, Diagnostics& diag) {
  struct Frame {
    bool object;
    std::string key;
    std::size_t index = 0;
  };
  std::vector<Frame> stack;
  bool expect_key = false;
  auto pointer = [&stack] {
    std::string p;
    for (const Frame& f : stack) p += "/" + (f.object ? escape_pointer_token(f.key) : std::to_string(f.index));
    return p;
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ':') {
      ++i;
    } else if (c == '{' || c == '[') {
      if (stack.size() >= kMaxJsonDepth) {
        const auto [line, col] = line_col(text, i);
        std::string where = pointer();
        if (where.size() > 120) where = where.substr(0, 120) + "/...";
        diag.error(where, "",
                   "is nested more than " + std::to_string(kMaxJsonDepth) + " levels deep (line " + std::to_string(line) +
                       ", column " + std::to_string(col) + "); moesim's inputs are at most a few levels deep");
        return false;
      }
      stack.push_back({c == '{', "", 0});
      expect_key = c == '{';
      ++i;
    } else if (c == '}' || c == ']') {
      if (stack.empty()) return true;
      stack.pop_back();
      expect_key = false;
      ++i;
    } else if (c == ',') {
      if (stack.empty()) return true;
      if (stack.back().object) expect_key = true;
      else ++stack.back().index;
      ++i;
    } else if (c == '"') {
      const std::size_t start = ++i;
      while (i < text.size() && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
      if (i >= text.size()) return true;
      if (expect_key && !stack.empty()) {
        // Keys with escapes are rare in moesim's inputs; the raw text names them well enough.
        stack.back().key.assign(text.substr(start, i - start));
        expect_key = false;
      }
      ++i;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      const std::size_t start = i;
      while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '-' || text[i] == '+' ||
                                 text[i] == '.' || text[i] == 'e' || text[i] == 'E'))
        ++i;
      const std::string token(text.substr(start, i - start));
      const double v = std::strtod(token.c_str(), nullptr);
      if (!std::isfinite(v)) {
        diag.error(pointer(), token.size() > 40 ? token.substr(0, 40) + "..." : token,
                   "is out of range for a number (at most 1.8e308 in magnitude)");
        return false;
      }
    } else if (std::isalpha(static_cast<unsigned char>(c))) {
      while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    } else {
      return true;  // not JSON: the parser says where
    }
  }
  return true;
}

}  // namespace

std::optional<nlohmann::json> parse_json_text(std::string_view text, Diagnostics& diag) {
  if (!check_json_limits(text, diag)) return std::nullopt;
  try {
    return nlohmann::json::parse(text.begin(), text.end(), nullptr, true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::parse_error& e) {
    const auto [line, col] = line_col(text, e.byte > 0 ? e.byte - 1 : 0);
    std::string what = e.what();
    const auto pos = what.find("syntax error");
    if (pos != std::string::npos) what = what.substr(pos);
    diag.error("", "", "is not valid JSON (line " + std::to_string(line) + ", column " + std::to_string(col) +
                           "): " + what);
    return std::nullopt;
  } catch (const nlohmann::json::exception& e) {  // anything the scan above did not foresee
    diag.error("", "", std::string("cannot be read as JSON: ") + e.what());
    return std::nullopt;
  }
}

std::optional<nlohmann::json> read_json_file(const std::string& path, Diagnostics& diag) {
  std::string text;
  const std::string limit = std::to_string(kMaxInputBytes >> 20) + " MiB";
  if (path == "-") {
    // At most the limit and one byte more: an endless stream is refused, not read forever.
    text.resize(kMaxInputBytes + 1);
    std::cin.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<std::size_t>(std::cin.gcount()));
    if (text.size() > kMaxInputBytes) {
      diag.error_in("<stdin>", "", "", "is larger than " + limit + ", the limit for an input file");
      return std::nullopt;
    }
  } else {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(st)) {
      diag.error_in(path, "", "", "cannot be opened (no such file or not readable)");
      return std::nullopt;
    }
    if (std::filesystem::is_directory(st)) {
      const bool hf = std::filesystem::exists(std::filesystem::path(path) / "config.json", ec);
      diag.error_in(path, "", "",
                    std::string("is a directory, not a JSON file") +
                        (hf ? " (a model directory: give its config.json)" : ""));
      return std::nullopt;
    }
    if (!std::filesystem::is_regular_file(st)) {
      diag.error_in(path, "", "", "is not a regular file (a device, pipe or socket); moesim reads JSON files");
      return std::nullopt;
    }
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size > kMaxInputBytes) {
      diag.error_in(path, "", "",
                    "is " + std::to_string(size >> 20) + " MiB, larger than " + limit + ", the limit for an input file");
      return std::nullopt;
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      diag.error_in(path, "", "", "cannot be opened (no such file or not readable)");
      return std::nullopt;
    }
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  Diagnostics local(path == "-" ? "<stdin>" : path);
  auto j = parse_json_text(text, local);
  for (const auto& d : local.list()) diag.error_in(d.file, d.pointer, d.value, d.constraint);
  return j;
}

}  // namespace moesim
