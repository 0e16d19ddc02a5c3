#pragma once
// The fuzzed readers, one function per harness: the libFuzzer entry points (fuzz_*.cpp) call
// them, and so does the test suite on the regression inputs in tests/fuzz/<harness>/ (every
// input a campaign found is kept there). Every input must end in a result or a ConfigError:
// any other exception escapes (libFuzzer reports it as a crash; the test fails), and so do
// sanitizer findings in the fuzzing build.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "moesim/models/model_spec.hpp"
#include "moesim/models/workload.hpp"
#include "moesim/sim/config.hpp"
#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/search/journal.hpp"
#include "validate.hpp"

namespace moesim::fuzz {

/// The input as JSON the way moesim reads files (limits included), or nothing when refused.
inline std::optional<nlohmann::json> parse(std::string_view text) {
  Diagnostics diag("fuzz.json");
  return parse_json_text(text, diag);
}

/// Runs `f`; a ConfigError is an answer (each of its problems must say something), anything
/// else propagates.
template <class F>
void expect_answer(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    for (const auto& d : e.diagnostics())
      if (d.constraint.empty()) throw std::logic_error("a diagnostic without a message at " + d.pointer);
  }
}

/// The scenario loader: a whole scenario document, as `moesim check` reads it.
inline void scenario(std::string_view text) {
  const auto doc = parse(text);
  if (!doc) return;
  expect_answer([&] { (void)strategies::load_scenario(*doc, "fuzz.json", ""); });
}

/// The Hugging Face config.json reader, and the workload built from a model it accepts.
inline void hf_config(std::string_view text) {
  const auto doc = parse(text);
  if (!doc) return;
  expect_answer([&] {
    Diagnostics diag("config.json");
    const models::ModelSpec m = models::parse_model_config(*doc, "", diag);
    diag.throw_if_any();
    (void)models::build_workload(m, 4096, {});
  });
}

/// Megatron / MindSpeed command lines: the text itself, then a scenario whose parallelism and
/// training sections come from it.
inline void megatron_args(std::string_view text) {
  const std::string args(text);
  expect_answer([&] {
    Diagnostics diag("fuzz.json");
    (void)strategies::parse_megatron_args(args, "/parallelism/megatron_args", diag);
    diag.throw_if_any();
    const nlohmann::json doc = {{"model", "pangu-ultra-moe-718b"},
                                {"cluster", {{"preset", "atlas-800t-a2"}, {"devices", 6144}}},
                                {"training", {{"seq_length", 4096}, {"global_batch_size", 6144}}},
                                {"parallelism", {{"megatron_args", args}}}};
    (void)strategies::load_scenario(doc, "fuzz.json", "");
  });
}

/// The cases reader of `moesim validate`: one published case converted to a scenario, its
/// published step time, and the scenario loaded (not simulated).
inline void cases(std::string_view text) {
  const auto doc = parse(text);
  if (!doc) return;
  const nlohmann::json& c = doc->is_array() && !doc->empty() ? (*doc)[0] : *doc;
  expect_answer([&] {
    const auto conv = tools::case_to_scenario(c);
    (void)tools::published_step_time(c, conv.devices);
    if (conv.skip_reason.empty()) (void)strategies::load_scenario(conv.scenario, "fuzz.json case", "");
  });
}

/// The search journal read back by `moesim search --resume`.
inline void resume(std::string_view text) {
  static const std::string path = "/tmp/moesim_fuzz_journal_" + std::to_string(getpid()) + ".json";
  {
    std::ofstream out(path + ".partial", std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  expect_answer([&] {
    strategies::SearchJournal j(strategies::SearchJournal::ReadOnly{}, path, true, "fingerprint", {});
    (void)j.size();
  });
}

}  // namespace moesim::fuzz
