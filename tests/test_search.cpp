// strategies/search: screening + event simulation of the best plans.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <set>

#include "moesim/strategies/search.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {
const std::string kRoot = MOESIM_SOURCE_DIR;

Scenario small(const std::vector<std::string>& sets = {}) {
  return load_scenario_file(kRoot + "/tests/scenarios/search_small_moe.json", sets);
}

std::vector<std::string> keys(const SearchReport& r, std::size_t n) {
  std::vector<std::string> k;
  for (std::size_t i = 0; i < r.ranked.size() && i < n; ++i) k.push_back(r.ranked[i].key);
  return k;
}
}  // namespace

TEST_CASE("search: top-1 and top-5 match an exhaustive event simulation of every plan", "[search]") {
  const Scenario s = small();
  const SearchSpace space = parse_search_space(s);
  SearchOptions opt;
  opt.threads = 2;
  const SearchReport screened = search(s, space, opt);  // the default top_k (32) simulated
  opt.top_k = 100000;                                    // every plan that fits
  const SearchReport exhaustive = search(s, space, opt);
  REQUIRE(exhaustive.ranked.size() > 20);
  CHECK(exhaustive.simulated == exhaustive.ranked.size() + exhaustive.infeasible.size());
  REQUIRE(screened.ranked.size() >= 5);
  CHECK(screened.ranked.front().key == exhaustive.ranked.front().key);
  const auto a = keys(screened, 5), b = keys(exhaustive, 5);
  CHECK(std::set<std::string>(a.begin(), a.end()) == std::set<std::string>(b.begin(), b.end()));
}

TEST_CASE("search: one and two threads give the same ranking", "[search]") {
  const Scenario s = small();
  const SearchSpace space = parse_search_space(s);
  SearchOptions one, two;
  one.threads = 1;
  two.threads = 2;
  const std::string a = to_json(search(s, space, one), 100).dump();
  const std::string b = to_json(search(s, space, two), 100).dump();
  CHECK(a == b);
}

TEST_CASE("search: plans over memory never appear in the ranking", "[search]") {
  // Llama3-70B on 16 H100s: most plans do not fit.
  const Scenario s = load_scenario(nlohmann::json::parse(R"({
    "model": "llama3-70b", "cluster": {"preset": "dgx-h100", "devices": 16},
    "training": {"seq_length": 4096, "global_batch_size": 64},
    "search": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "vpp": [1], "mbs": [1, 2, 4], "recompute": ["none", "full"],
               "tp_comm_overlap": [false], "top_k": 12}})"),
                                   "t.json", "");
  SearchOptions opt;
  opt.threads = 2;
  const SearchReport r = search(s, parse_search_space(s), opt);
  CHECK(r.screened_fit < r.valid);  // the estimate pruned plans
  REQUIRE_FALSE(r.ranked.empty());
  for (const auto& p : r.ranked) {
    CHECK(p.feasible);
    CHECK(p.peak_memory_bytes <= s.cluster.device.hbm_capacity.value());
  }
}

TEST_CASE("search: --resume continues from the last written line", "[search]") {
  const Scenario s = small();
  const SearchSpace space = parse_search_space(s);
  const std::string file = kRoot + "/build/search_resume_test.jsonl";
  SearchOptions opt;
  opt.threads = 2;
  opt.out_file = file;
  const SearchReport full = search(s, space, opt);
  // Simulate an interruption: keep the header and 3 results, and a line cut in half.
  std::vector<std::string> lines;
  {
    std::ifstream in(file);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  REQUIRE(lines.size() == 1 + full.simulated);
  {
    std::ofstream out(file, std::ios::trunc);
    for (int i = 0; i < 4; ++i) out << lines[i] << "\n";
    out << lines[4].substr(0, lines[4].size() / 2);  // no newline: cut mid-write
  }
  opt.resume = true;
  const SearchReport resumed = search(s, space, opt);
  CHECK(resumed.resumed == 3);
  CHECK(resumed.simulated == full.simulated - 3);
  CHECK(to_json(resumed, 100)["ranked"] == to_json(full, 100)["ranked"]);
  std::remove(file.c_str());
}

TEST_CASE("search: an axis that leaves nothing, or a space too large, is bad input", "[search]") {
  try {
    const Scenario s = small({"search.expert_model_parallel_size=[3,5]"});
    parse_search_space(s);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    REQUIRE(e.diagnostics().size() == 1);
    CHECK(e.diagnostics()[0].pointer == "/search/expert_model_parallel_size");
    CHECK(std::string(e.what()).find("num_experts=16") != std::string::npos);
  }
  try {
    const Scenario s = small({"search.max_plans=10"});
    parse_search_space(s);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("more than max_plans") != std::string::npos);
    CHECK(std::string(e.what()).find("narrow") != std::string::npos);
  }
}

TEST_CASE("search: a pipeline_schedule axis pairs each schedule with its chunk counts and finds the better schedule",
          "[search][schedule]") {
  // 32 micro-batches on 4 stages: every schedule runs.
  const std::vector<std::string> narrow{"search.tp=[1]", "search.pp=[4]", "search.ep=[8]", "search.mbs=[1]",
                                        "search.recompute=[\"none\"]", "search.moe_alltoall=[\"flat\"]",
                                        "training.global_batch_size=256"};
  std::vector<std::string> sets = narrow;
  sets.push_back(R"(search.pipeline_schedule=["auto","zb_h1","zb_v","dualpipev","dualpipe"])");
  const Scenario s = small(sets);
  const SearchSpace space = parse_search_space(s);
  CHECK(space.schedule.size() == 5);
  SearchOptions opt;
  opt.threads = 2;
  opt.top_k = 100;  // simulate all of them
  const SearchReport r = search(s, space, opt);
  std::set<std::string> suffixes;
  for (const auto& rp : r.ranked) {
    const std::string sched = rp.plan_json.value("pipeline_schedule", std::string("auto"));
    suffixes.insert(sched + (rp.plan.vpp > 1 && !bidirectional(rp.plan.schedule) ? "/vpp2" : "/vpp1"));
    // The plan as JSON pastes back into a scenario and simulates to the same step time.
    nlohmann::json doc = s.document;
    doc["parallelism"] = rp.plan_json;
    doc.erase("search");
    CHECK(simulate(load_scenario(doc, "t.json", "")).result.step_time_s == Approx(rp.step_time_s).epsilon(1e-9));
  }
  // auto = 1f1b (vpp 1) and interleaved (vpp 2); zb_h1 and dualpipe on vpp 1; zb_v, dualpipev on vpp 2.
  CHECK(suffixes == std::set<std::string>{"auto/vpp1", "auto/vpp2", "zb_h1/vpp1", "zb_v/vpp2", "dualpipev/vpp2",
                                          "dualpipe/vpp1"});
  // With a long steady state the bidirectional and V schedules beat 1F1B.
  REQUIRE_FALSE(r.ranked.empty());
  CHECK(r.ranked.front().plan.schedule != ScheduleKind::OneFOneB);
  CHECK(r.ranked.front().plan.schedule != ScheduleKind::Interleaved);
  // A name that is not a schedule is bad input, with its path.
  try {
    parse_search_space(small({R"(search.pipeline_schedule=["auto","dualpip"])"}));
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.diagnostics()[0].pointer == "/search/pipeline_schedule/1");
  }
}
