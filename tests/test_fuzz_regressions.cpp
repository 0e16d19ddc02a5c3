// Replays the fuzzing regression inputs (tests/fuzz/<harness>/, every finding of tools/fuzz.sh
// kept there) through the same harness functions the fuzzers run, in the normal build: each
// must end in a result or a ConfigError. Plus the inputs of issue 20's table, built here.

#include <catch2/catch.hpp>

#include "case_fields.hpp"
#include "moesim/strategies/plan/plan.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "harnesses.hpp"

namespace {

const std::filesystem::path kFuzzDir = std::filesystem::path(MOESIM_SOURCE_DIR) / "tests" / "fuzz";

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

template <class F>
int replay(const std::string& harness, F&& f) {
  int n = 0;
  const auto dir = kFuzzDir / harness;
  if (!std::filesystem::is_directory(dir)) return 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    INFO(e.path().string());
    const std::string text = slurp(e.path());
    REQUIRE_NOTHROW(f(text));
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("fuzz regressions: every kept input ends in a result or a clear error", "[fuzz][integrity]") {
  int n = 0;
  n += replay("scenario", moesim::fuzz::scenario);
  n += replay("hf_config", moesim::fuzz::hf_config);
  n += replay("megatron_args", moesim::fuzz::megatron_args);
  n += replay("cases", moesim::fuzz::cases);
  n += replay("resume", moesim::fuzz::resume);
  CHECK(n >= 5);
}

TEST_CASE("fuzz harnesses: inputs of the issue's table are answered, not crashed on", "[fuzz][integrity]") {
  // 100,000 levels of nesting (a segmentation fault before the depth limit).
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"cluster\": ";
  deep += "1";
  deep += std::string(100000, '}');
  for (auto f : {moesim::fuzz::scenario, moesim::fuzz::hf_config, moesim::fuzz::cases, moesim::fuzz::resume})
    REQUIRE_NOTHROW(f(deep));
  moesim::Diagnostics diag("deep.json");
  CHECK_FALSE(moesim::parse_json_text(deep, diag));
  REQUIRE(diag.list().size() == 1);
  CHECK(diag.list()[0].constraint.find("nested more than 64 levels") != std::string::npos);
  // A number beyond a double, with its path.
  moesim::Diagnostics d2("n.json");
  CHECK_FALSE(moesim::parse_json_text(R"({"training": {"list": [1, 2, -2e308]}})", d2));
  REQUIRE(d2.list().size() == 1);
  CHECK(d2.list()[0].pointer == "/training/list/2");
  CHECK(d2.list()[0].value == "-2e308");
  // Syntax errors keep the parser's message; strings with brackets and escapes do not confuse
  // the depth scan.
  moesim::Diagnostics d3("s.json");
  CHECK(moesim::parse_json_text(R"({"a": "[[[{{{\"", "b": [1e308, -0.5e-400]})", d3));
  CHECK(d3.list().empty());
  moesim::Diagnostics d4("bad.json");
  CHECK_FALSE(moesim::parse_json_text("{\"a\": [1, 2}", d4));
  REQUIRE(d4.list().size() == 1);
  CHECK(d4.list()[0].constraint.find("is not valid JSON (line 1") != std::string::npos);
  // Megatron arguments with absurd repetitions and values.
  REQUIRE_NOTHROW(moesim::fuzz::megatron_args("--tensor-model-parallel-size 99999999999999999999 --num-layers -1"));
  REQUIRE_NOTHROW(moesim::fuzz::megatron_args("--pipeline-model-parallel-layout (tt|)*999999999999"));
  // Text the report shows must be text: a numeric description is an input error, not an internal one.
  nlohmann::json doc = nlohmann::json::parse(R"({"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "devices": 8},
      "training": {"seq_length": 4096, "global_batch_size": 8}, "description": 5})");
  try {
    (void)moesim::strategies::load_scenario(doc, "d.json", "");
    FAIL("a numeric description loaded");
  } catch (const moesim::ConfigError& e) {
    CHECK(std::string(e.what()).find("d.json:/description: 5 must be a string") != std::string::npos);
  }
  // A validated case whose scenario describes its cluster in full has no preset to group by.
  CHECK(moesim::tools::fields::cluster_preset(nlohmann::json{{"cluster", {{"devices", 8}}}}) == "custom");
  CHECK(moesim::tools::fields::cluster_preset(nlohmann::json{{"cluster", "dgx-h100"}}) == "custom");
  CHECK(moesim::tools::fields::cluster_preset(nlohmann::json{{"cluster", {{"preset", "dgx-h100"}}}}) == "dgx-h100");
  // A search journal whose header gives its moesim version as a number (found by fuzzing).
  REQUIRE_NOTHROW(moesim::fuzz::resume("{\"moesim_search\":2,\"version\":2,\"fingerprint\":\"x\"}\n"));
}
