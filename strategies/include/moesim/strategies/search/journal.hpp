#pragma once
// The results file of a strategy search (`search --out FILE`): one JSON line per simulated plan,
// written as results arrive so that an interrupted search loses nothing, and read back by
// `--resume` with every line checked before anything in it is trusted.
//
//   SearchJournal j(opts.out_file, opts.resume, fingerprint, checks, scenario.input_files());
//   if (const JournalEntry* e = j.find(key)) { ... reuse e->result ... }
//   j.append(key, plan_json, result_json);   // thread-safe; one checked write per line
//   j.finish();                               // the finished file replaces FILE
//
// While the search runs, lines go to FILE.partial (FILE itself is replaced only when the search
// finishes, so a killed search never leaves FILE half-written); --resume continues from
// FILE.partial when an interrupted run left one, else from FILE. The header carries the moesim
// version and a fingerprint of everything a plan's result depends on (the scenario without its
// search section, the files it reads, the fidelity); a results file of another scenario or
// version is refused, not silently overwritten. A line cut by a kill (no final newline) is
// removed before appending. Any other bad line — not JSON, a field of the wrong type or out of
// range, a result whose parts disagree (tokens/s against step time, MFU, the breakdown's sum),
// a checksum that does not match — is a ConfigError naming the file and line.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/strategies/output/simulate.hpp"

namespace moesim::strategies {

/// What every result of this search must agree with (from the scenario and its workload).
struct JournalChecks {
  double tokens_per_step = 0;
  double model_flops_per_token = 0;
  double devices = 0;
  double peak_flops_per_device = 0;  ///< the MFU peak
};

/// One result line read back.
struct JournalEntry {
  int line = 0;
  std::string key;
  nlohmann::json plan;    ///< in the scenario's "parallelism" form
  nlohmann::json result;  ///< checked: feasible, step_time_s, tokens_per_s, mfu, memory, breakdown_s
};

class SearchJournal {
 public:
  /// An empty `out_file` keeps nothing (every call is then a no-op). Throws ConfigError when
  /// the file is one of `inputs`, cannot be written, or (with `resume`) holds a bad line or
  /// another search's results.
  SearchJournal(std::string out_file, bool resume, std::string fingerprint, JournalChecks checks,
                const std::vector<std::string>& inputs);
  /// A reader only (the other processes of a shared search): with `resume`, the earlier results
  /// of FILE.partial (or FILE) are read, nothing is ever written or cut.
  struct ReadOnly {};
  SearchJournal(ReadOnly, std::string out_file, bool resume, std::string fingerprint, JournalChecks checks);
  ~SearchJournal();
  SearchJournal(const SearchJournal&) = delete;
  SearchJournal& operator=(const SearchJournal&) = delete;

  /// The earlier result for a plan key, or null.
  [[nodiscard]] const JournalEntry* find(const std::string& key) const;
  [[nodiscard]] std::size_t size() const { return previous_.size(); }
  /// Where an earlier result came from ("FILE.partial" or "FILE"), for messages.
  [[nodiscard]] const std::string& source() const { return source_; }
  /// Appends one result line and flushes it to the file. Thread-safe. Throws ConfigError when
  /// the write fails (a full disk).
  void append(const std::string& key, const nlohmann::json& plan, const nlohmann::json& result);
  /// Syncs the journal and renames it over the target file. Throws ConfigError on failure.
  void finish();

  /// The line's checksum: ties the key, plan and result to this search's fingerprint.
  static std::string checksum(const std::string& fingerprint, const std::string& key, const nlohmann::json& plan,
                              const nlohmann::json& result);
  /// Checks one result object; returns the problems (empty: sound).
  static std::vector<std::string> check_result(const nlohmann::json& result, const JournalChecks& checks);

 private:
  void read(const std::string& path, bool is_partial, bool may_cut = true);
  void write_line(const std::string& text);

  std::string target_, partial_, fingerprint_, source_;
  JournalChecks checks_;
  std::map<std::string, JournalEntry> previous_;
  int fd_ = -1;
  bool special_ = false;  ///< the target is a device or a pipe: written in place, never renamed
  std::mutex mu_;
};

/// Fingerprint of everything a plan's simulated result depends on, for the journal header.
std::string search_fingerprint(const Scenario& base, Fidelity fidelity);

}  // namespace moesim::strategies
