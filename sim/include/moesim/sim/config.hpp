#pragma once
// Strict JSON configuration reading with diagnostics that name the file, the JSON path, the
// value and the constraint — and that are all collected before anything is reported.
//
//   Diagnostics diag{"scenario.json"};
//   ObjectReader par{json["parallelism"], "/parallelism", diag};
//   int tp = par.integer({"tensor_model_parallel_size", "tp"}, 1, 1, 4096);
//   par.finish();                      // unknown keys become errors ("did you mean ...?")
//   diag.throw_if_any();               // ConfigError listing every problem at once
//
// Library code never exits: bad input is a `ConfigError` (exit status 2 in the CLI).

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/sim/units.hpp"

namespace moesim {

struct Diagnostic {
  std::string file;        ///< file the value came from ("<stdin>", "<inline>", a path)
  std::string pointer;     ///< JSON pointer, e.g. "/parallelism/expert_model_parallel_size"
  std::string value;       ///< the offending value as JSON text ("48"); empty when missing
  std::string constraint;  ///< what was expected, e.g. "must divide num_routed_experts=256"
  [[nodiscard]] std::string to_string() const;
};

class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(std::vector<Diagnostic> diagnostics);
  [[nodiscard]] const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::vector<Diagnostic> diagnostics_;
};

/// A bug in moesim, caught before it could print a wrong answer: a run that deadlocked, a
/// result that breaks an invariant (negative or non-finite times, parts that do not add up to
/// the step). The CLI reports it as "this is a bug" with exit status 1; it is never a result.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

/// Collects problems; several readers (scenario, model file, presets) can share one.
class Diagnostics {
 public:
  explicit Diagnostics(std::string file = "<inline>") : file_(std::move(file)) {}
  void error(std::string pointer, std::string value, std::string constraint);
  void error_in(std::string file, std::string pointer, std::string value, std::string constraint);
  /// A value refused as read (wrong type, out of range, not one of the choices): reported, and
  /// later problems at the same path are dropped (they would be about the default used instead).
  void value_error(std::string pointer, std::string value, std::string constraint);
  [[nodiscard]] bool ok() const { return list_.empty(); }
  [[nodiscard]] const std::vector<Diagnostic>& list() const { return list_; }
  [[nodiscard]] const std::string& file() const { return file_; }
  void set_file(std::string f) { file_ = std::move(f); }
  void throw_if_any() const;

 private:
  std::string file_;
  std::vector<Diagnostic> list_;
  std::vector<std::pair<std::string, std::string>> refused_;  ///< (file, pointer) of value_error()s
};

/// Short JSON text of a value for messages (long values are truncated).
std::string json_brief(const nlohmann::json& j);

/// A key as one JSON-pointer token (RFC 6901: "~" -> "~0", "/" -> "~1").
std::string escape_pointer_token(std::string_view key);

/// Levenshtein-based suggestion among candidates, or empty when nothing is close.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

/// Reads one JSON object. Every accessor marks its key (and aliases) as known; `finish()`
/// reports the keys nobody asked for. Accessors never throw: they record a diagnostic and
/// return the default so that reading can go on and report every problem at once.
class ObjectReader {
 public:
  using Keys = std::initializer_list<std::string_view>;

  ObjectReader(const nlohmann::json& j, std::string pointer, Diagnostics& diag);
  ~ObjectReader() = default;
  ObjectReader(const ObjectReader&) = delete;
  ObjectReader& operator=(const ObjectReader&) = delete;

  [[nodiscard]] bool valid() const { return obj_ != nullptr; }
  [[nodiscard]] const std::string& pointer() const { return pointer_; }
  [[nodiscard]] Diagnostics& diagnostics() const { return *diag_; }
  /// True when any of the names is present (marks them known).
  bool has(Keys names);
  /// The raw value, or nullptr (marks the key known). Reports two aliases given at once.
  const nlohmann::json* get(Keys names);
  /// Pointer of a child, for messages.
  [[nodiscard]] std::string child_pointer(std::string_view key) const;
  [[nodiscard]] std::string found_key(Keys names) const;

  std::int64_t integer(Keys names, std::int64_t def, std::int64_t min, std::int64_t max);
  std::optional<std::int64_t> opt_integer(Keys names, std::int64_t min, std::int64_t max);
  std::int64_t required_integer(Keys names, std::int64_t min, std::int64_t max);
  double number(Keys names, double def, double min, double max);
  std::optional<double> opt_number(Keys names, double min, double max);
  bool boolean(Keys names, bool def);
  std::optional<bool> opt_boolean(Keys names);
  std::string string(Keys names, std::string def, std::initializer_list<std::string_view> allowed = {});
  std::optional<std::string> opt_string(Keys names, std::initializer_list<std::string_view> allowed = {});
  /// The same with the allowed values from a table (e.g. a registry's names).
  std::optional<std::string> opt_string(Keys names, std::span<const std::string_view> allowed);
  /// A quantity with a unit string ("56GB/s"); a bare number is accepted in SI base units.
  std::optional<double> opt_quantity(Keys names, Dimension dim, double min = 0.0);
  double required_quantity(Keys names, Dimension dim, double min = 0.0);

  /// Marks keys as known without reading them (documentation-only keys like "source").
  void ignore(Keys names);
  /// Reports unknown keys; `why` replaces the default explanation when given.
  void finish(std::string_view why = {});

 private:
  const nlohmann::json* obj_ = nullptr;
  std::string pointer_;
  Diagnostics* diag_;
  std::vector<std::string> known_;
};

/// Applies `--set a.b.c=VALUE` to a JSON document: VALUE is parsed as JSON when it parses,
/// otherwise taken as a string. Intermediate objects are created. Errors go to `diag`.
void apply_override(nlohmann::json& doc, std::string_view assignment, Diagnostics& diag);

/// The diagnostics of `e` about a value an override set (at its path or below) name the override
/// ("<label> a.b.c=VALUE") as their source instead of `file`: an error in `--set` or in a Python
/// override is not the scenario file's.
ConfigError blame_overrides(const ConfigError& e, const std::string& file, std::span<const std::string> overrides,
                            std::string_view label);

/// Presets write every number as {"value": v, "source": "where it comes from"}. This replaces
/// each such object by its value, in place, and returns the sources by JSON pointer. A
/// {"value"} without a non-empty string "source" (or with other keys) is reported.
std::vector<std::pair<std::string, std::string>> strip_sources(nlohmann::json& j, const std::string& pointer,
                                                               Diagnostics& diag);

/// Limits on what an input may be, checked before anything is parsed: an input file (or stdin)
/// is at most kMaxInputBytes (the largest file moesim ships, the calibration cases, is under
/// 1 MiB) and JSON nests at most kMaxJsonDepth levels (scenarios nest about 5).
inline constexpr std::size_t kMaxInputBytes = std::size_t{64} << 20;
inline constexpr std::size_t kMaxJsonDepth = 64;

/// Parses JSON text; syntax errors become diagnostics with line and column, and so do nesting
/// deeper than kMaxJsonDepth and numbers beyond a double's range (with their JSON path).
std::optional<nlohmann::json> parse_json_text(std::string_view text, Diagnostics& diag);
/// Reads and parses a file ("-" is standard input).
std::optional<nlohmann::json> read_json_file(const std::string& path, Diagnostics& diag);

}  // namespace moesim
