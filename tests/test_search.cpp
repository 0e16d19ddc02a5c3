// strategies/search: screening + event simulation of the best plans.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "moesim/strategies/search/search.hpp"
#include "moesim/strategies/search/journal.hpp"
#include "moesim/strategies/search/model_search.hpp"
#include "moesim/models/presets.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/search/screen.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {
const std::string kRoot = MOESIM_SOURCE_DIR;

Scenario small(const std::vector<std::string>& sets = {}) {
  return load_scenario_file(kRoot + "/tests/scenarios/search_small_moe.json", sets);
}

/// The scenario with a ranked plan pasted back as its "parallelism" section (no search).
Scenario pasted_back(const nlohmann::json& doc, const RankedPlan& rp) {
  nlohmann::json back = doc;
  back["parallelism"] = rp.plan_json;
  back.erase("search");
  return load_scenario(back, "t.json", "");
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
  const SearchReport screened = search(s, space, opt);  // the default top_k (16) simulated
  opt.top_k = 100000;                                    // every plan that fits
  const SearchReport exhaustive = search(s, space, opt);
  REQUIRE(exhaustive.ranked.size() > 20);
  CHECK(exhaustive.simulated == exhaustive.ranked.size() + exhaustive.infeasible.size());
  REQUIRE(screened.ranked.size() >= 5);
  CHECK(screened.ranked.front().key == exhaustive.ranked.front().key);
  // The screened top 5 are the exhaustive top 5, or nearly as fast (measured: 4 of 5 shared,
  // the fifth 3.0% slower than the exhaustive fifth).
  for (std::size_t i = 0; i < 5; ++i) {
    INFO(screened.ranked[i].key << " vs " << exhaustive.ranked[i].key);
    CHECK(screened.ranked[i].step_time_s <= 1.05 * exhaustive.ranked[i].step_time_s);
  }
  const auto a = keys(screened, 5), b = keys(exhaustive, 5);
  int common = 0;
  for (const auto& k : a) common += std::find(b.begin(), b.end(), k) != b.end();
  CHECK(common >= 4);
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

namespace {
/// A fresh folder under the build tree for one test's files (never the source tree).
std::string test_dir(const std::string& name) {
  const std::filesystem::path d = std::filesystem::path(MOESIM_TEST_OUTPUT_DIR) / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

std::vector<std::string> read_lines(const std::string& file) {
  std::vector<std::string> lines;
  std::ifstream in(file);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

void write_text(const std::string& file, const std::string& text) {
  std::ofstream out(file, std::ios::trunc | std::ios::binary);
  out << text;
}

/// The ConfigError message of a resumed search, or "" when it succeeds.
std::string resume_error(const Scenario& s, const std::string& file) {
  SearchOptions opt;
  opt.threads = 2;
  opt.out_file = file;
  opt.resume = true;
  try {
    search(s, parse_search_space(s), opt);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("search: --resume continues an interrupted journal, its cut last line is removed, not glued to", "[search]") {
  const Scenario s = small();
  const SearchSpace space = parse_search_space(s);
  const std::string dir = test_dir("resume_partial");
  const std::string file = dir + "/results.jsonl";
  SearchOptions opt;
  opt.threads = 2;
  opt.out_file = file;
  const SearchReport full = search(s, space, opt);
  const std::vector<std::string> lines = read_lines(file);
  REQUIRE(lines.size() == 1 + full.simulated);
  CHECK_FALSE(std::filesystem::exists(file + ".partial"));  // a finished search leaves only FILE
  // An interrupted run: FILE still holds an older version, the journal the header, 3 results
  // and a line cut by the kill.
  write_text(file, "an older results file\n");
  std::string partial;
  for (int i = 0; i < 4; ++i) partial += lines[i] + "\n";
  partial += lines[4].substr(0, lines[4].size() / 2);  // no newline: cut mid-write
  write_text(file + ".partial", partial);
  opt.resume = true;
  const SearchReport resumed = search(s, space, opt);
  CHECK(resumed.resumed == 3);
  CHECK(resumed.simulated == full.simulated - 3);
  CHECK(to_json(resumed, 100)["ranked"] == to_json(full, 100)["ranked"]);
  // The finished journal replaced FILE: every line whole and sound, none glued to the cut one.
  CHECK_FALSE(std::filesystem::exists(file + ".partial"));
  const std::vector<std::string> after = read_lines(file);
  CHECK(after.size() == lines.size());
  for (const auto& l : after) CHECK_FALSE(nlohmann::json::parse(l, nullptr, false).is_discarded());
  CHECK(resume_error(s, file).empty());  // and it resumes again, reusing everything
}

TEST_CASE("search: a finished results file is resumed with other axes or top_k, its result lines are reused",
          "[search]") {
  const std::string file = test_dir("resume_axes") + "/results.jsonl";
  const Scenario s = small();
  SearchOptions opt;
  opt.threads = 2;
  opt.out_file = file;
  const SearchReport first = search(s, parse_search_space(s), opt);
  // Another top_k: the results do not depend on the axes, so the file is not thrown away.
  const Scenario s2 = small({"search.top_k=4"});
  opt.resume = true;
  const SearchReport second = search(s2, parse_search_space(s2), opt);
  CHECK(second.simulated == 0);
  CHECK(second.resumed >= 4);
  CHECK(read_lines(file).size() == 1 + first.simulated);
}

TEST_CASE("search: a forged, wrong-typed or foreign results file is refused with its file and line", "[search]") {
  const Scenario s = small();
  const std::string dir = test_dir("resume_refused");
  const std::string file = dir + "/results.jsonl";
  SearchOptions opt;
  opt.threads = 2;
  opt.out_file = file;
  search(s, parse_search_space(s), opt);
  const std::vector<std::string> good = read_lines(file);
  REQUIRE(good.size() > 3);
  auto with_line = [&](std::size_t i, const std::string& line) {
    std::string text;
    for (std::size_t k = 0; k < good.size(); ++k) text += (k == i ? line : good[k]) + "\n";
    write_text(file, text);
    std::filesystem::remove(file + ".partial");
  };
  nlohmann::json j = nlohmann::json::parse(good[2]);
  SECTION("a forged throughput that disagrees with the step time") {
    j["result"]["tokens_per_s"] = 1e30;
    with_line(2, j.dump());
    const std::string e = resume_error(s, file);
    CHECK(e.find(file + ":3") != std::string::npos);
    CHECK(e.find("tokens_per_s") != std::string::npos);
  }
  SECTION("a consistent forgery: every part scaled, caught by the checksum") {
    for (const char* k : {"step_time_s"}) j["result"][k] = j["result"][k].get<double>() / 2;
    j["result"]["tokens_per_s"] = j["result"]["tokens_per_s"].get<double>() * 2;
    j["result"]["mfu"] = j["result"]["mfu"].get<double>() * 2;
    for (auto& [k, v] : j["result"]["breakdown_s"].items()) v = v.get<double>() / 2;
    with_line(2, j.dump());
    const std::string e = resume_error(s, file);
    CHECK(e.find(file + ":3") != std::string::npos);
  }
  SECTION("a field of the wrong type") {
    j["result"]["mfu"] = "high";
    with_line(2, j.dump());
    const std::string e = resume_error(s, file);
    CHECK(e.find(file + ":3") != std::string::npos);
    CHECK(e.find("result.mfu must be a number") != std::string::npos);
  }
  SECTION("a line that is not JSON in the middle") {
    with_line(2, "{\"key\": ");
    CHECK(resume_error(s, file).find(file + ":3") != std::string::npos);
  }
  SECTION("no header") {
    with_line(0, good[1]);
    CHECK(resume_error(s, file).find("no \"moesim_search\" header") != std::string::npos);
  }
  SECTION("another moesim version") {
    nlohmann::json h = nlohmann::json::parse(good[0]);
    h["version"] = "0.0.9";
    with_line(0, h.dump());
    CHECK(resume_error(s, file).find("moesim 0.0.9") != std::string::npos);
  }
  SECTION("another scenario") {
    const Scenario other = small({"training.global_batch_size=128"});
    SearchOptions o2;
    o2.threads = 2;
    o2.out_file = file;
    o2.resume = true;
    CHECK_THROWS_WITH(search(other, parse_search_space(other), o2), Catch::Contains("different scenario"));
  }
  SECTION("a line whose plan is not the one its key names") {
    nlohmann::json k = nlohmann::json::parse(good[3]);
    j["plan"] = k["plan"];
    j["check"] = SearchJournal::checksum(nlohmann::json::parse(good[0])["fingerprint"], j["key"], j["plan"], j["result"]);
    with_line(2, j.dump());
    CHECK(resume_error(s, file).find("is not the plan its key") != std::string::npos);
  }
}

TEST_CASE("search: the results file may not be the scenario, and an unwritable one is an error", "[search]") {
  const std::string dir = test_dir("out_over_input");
  const std::string scen = dir + "/scenario.json";
  std::filesystem::copy_file(kRoot + "/tests/scenarios/search_small_moe.json", scen);
  const std::string before = [&] {
    std::ifstream in(scen);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const Scenario s = load_scenario_file(scen, {});
  SearchOptions opt;
  opt.threads = 2;
  opt.out_file = scen;
  CHECK_THROWS_WITH(search(s, parse_search_space(s), opt), Catch::Contains("names a file this command reads"));
  std::ifstream in(scen);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == before);
  opt.out_file = "/dev/full";
  CHECK_THROWS_WITH(search(s, parse_search_space(s), opt), Catch::Contains("No space left on device"));
}

TEST_CASE("search: a raised cancel flag stops the search with Cancelled", "[search]") {
  const Scenario s = small();
  CancelFlag cancel;
  cancel.request();
  SearchOptions opt;
  opt.threads = 2;
  opt.cancel = &cancel;
  CHECK_THROWS_AS(search(s, parse_search_space(s), opt), Cancelled);
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
    CHECK(simulate(pasted_back(s.document, rp)).result.step_time_s == Approx(rp.step_time_s).epsilon(1e-9));
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

TEST_CASE("search: every ranked plan, pasted back as the parallelism section, reproduces its result exactly",
          "[search][roundtrip]") {
  // The scenario's own switches (forward-backward and shared-expert overlap, activation swap,
  // BF16 gradient reduction, BF16 Adam moments) must come back with each plan.
  nlohmann::json doc = nlohmann::json::parse(R"({
    "model": {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 4096,
              "moe_intermediate_size": 512, "num_hidden_layers": 8, "first_k_dense_replace": 1,
              "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": 384, "kv_lora_rank": 256,
              "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "n_routed_experts": 32,
              "n_shared_experts": 1, "num_experts_per_tok": 4, "vocab_size": 32000},
    "cluster": {"preset": "atlas-800t-a2", "devices": 32},
    "training": {"seq_length": 2048, "global_batch_size": 128},
    "parallelism": {"tp": 2, "pp": 2, "ep": 4, "etp": 1, "sequence_parallel": true, "use_distributed_optimizer": true,
                    "moe_fb_overlap": true, "moe_shared_expert_overlap": true, "swap_activations": 0.25,
                    "grad_reduce_in_bf16": true, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"},
    "search": {"tensor_model_parallel_size": [1, 2], "pipeline_model_parallel_size": [2, 4],
               "virtual_pipeline_model_parallel_size": [1, 2], "expert_model_parallel_size": [4, 8],
               "micro_batch_size": [1], "recompute": ["none", "selective", "full"],
               "pipeline_schedule": ["auto", "zb_v", "dualpipev"]}})");
  const Scenario s = load_scenario(doc, "t.json", "");
  const SearchSpace space = parse_search_space(s);
  SearchOptions opt;
  opt.threads = 2;
  opt.top_k = 24;
  const SearchReport r = search(s, space, opt);
  REQUIRE(r.ranked.size() >= 10);
  std::set<std::string> schedules;
  int fb = 0, se = 0;
  for (const auto& rp : r.ranked) {
    const Scenario b = pasted_back(doc, rp);
    INFO(rp.key << " " << rp.plan_json.dump());
    CHECK(b.plan.fb_overlap == rp.plan.fb_overlap);  // search axes now, both values by default
    CHECK(b.plan.shared_expert_overlap == rp.plan.shared_expert_overlap);
    fb += rp.plan.fb_overlap;
    se += rp.plan.shared_expert_overlap;
    CHECK(b.plan.swap_activations == 0.25);
    CHECK(b.plan.grad_reduce_in_bf16);
    CHECK(b.plan.exp_avg_bytes == 2);
    CHECK(plan_to_json(b.plan, b.model) == rp.plan_json);  // a fixed point
    const Result again = simulate(b).result;
    CHECK(again.step_time_s == rp.step_time_s);  // exactly: the same plan, the same simulation
    CHECK(again.peak_memory_bytes == rp.peak_memory_bytes);
    schedules.insert(rp.plan_json.value("pipeline_schedule", std::string("auto")));
  }
  CHECK(schedules.size() >= 2);
  CHECK(fb > 0);
  CHECK(se > 0);
}

TEST_CASE("search: a results file is never replaced without --resume, nor mixed with another scenario's",
          "[search]") {
  const std::string file = test_dir("no_clobber") + "/results.jsonl";
  const Scenario s = small();
  SearchOptions opt;
  opt.threads = 2;
  opt.out_file = file;
  (void)search(s, parse_search_space(s), opt);
  const auto before = read_lines(file);
  REQUIRE(before.size() > 1);
  // The same command again, without --resume: refused, the file untouched.
  try {
    (void)search(s, parse_search_space(s), opt);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains(file) && Catch::Contains("already exists") && Catch::Contains("--resume"));
  }
  CHECK(read_lines(file) == before);
  // --resume with another model setting (top-k of the router): another scenario, refused.
  const Scenario other = small({"model.num_experts_per_tok=2"});
  CHECK_THAT(resume_error(other, file), Catch::Contains("different scenario"));
  CHECK(read_lines(file) == before);
  // An interrupted journal is not overwritten by a fresh start either.
  write_text(file + ".partial", before.front() + "\n");
  std::filesystem::remove(file);
  try {
    (void)search(s, parse_search_space(s), opt);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains(file + ".partial") && Catch::Contains("interrupted"));
  }
}

TEST_CASE("model search: candidates keep the parameter budget, each gets the best plan a search of it finds",
          "[search][model_search]") {
  nlohmann::json doc = small().document;
  doc["search"] = {{"tensor_model_parallel_size", {1, 2}}, {"pipeline_model_parallel_size", {1, 2}},
                   {"virtual_pipeline_model_parallel_size", {1}}, {"micro_batch_size", {1}},
                   {"recompute", {"none"}}, {"pipeline_schedule", {"auto"}}};
  const Scenario base = load_scenario(doc, "t.json", "");
  const double budget =
      models::build_workload(base.model, base.training.seq_length, base.training.workload).params_total;
  doc["model_search"] = {{"axes", {{"num_hidden_layers", {4, 8, 12}}}},
                         {"fit", {{"key", "moe_intermediate_size"}, {"total_params", budget}, {"multiple", 16}}},
                         {"active_params", {"0.01B", "100B"}},
                         {"top_k", 2},
                         {"refine_k", 0}};
  const Scenario s = load_scenario(doc, "t.json", "");
  const auto spec = parse_model_search(s);
  REQUIRE(spec);
  SearchOptions opt;
  opt.threads = 2;
  const ModelSearchReport r = model_search(s, *spec, opt);
  REQUIRE(r.candidates.size() == 3);
  double prev = 1e300;
  std::map<int, int> width;  // layers -> refitted expert FFN width
  for (const auto& c : r.candidates) {
    INFO(c.overrides.dump() << " " << c.skipped);
    REQUIRE(c.best);
    // The refit keeps the budget to within one step of the key: 16 more FFN columns of every
    // expert's three matrices in every MoE layer.
    const double step = 16.0 * 3 * 1024 * 16 * c.overrides["num_hidden_layers"].get<double>();
    CHECK(std::abs(c.total_params - budget) <= step);
    CHECK(c.best->tokens_per_s <= prev);  // ranked best first
    prev = c.best->tokens_per_s;
    width[c.overrides["num_hidden_layers"].get<int>()] = c.overrides["moe_intermediate_size"].get<int>();
    // The same model searched on its own gives the same best plan.
    nlohmann::json one = doc;
    one.erase("model_search");
    one["model"] = c.config;
    const Scenario so = load_scenario(one, "t.json", "");
    SearchSpace space = parse_search_space(so);
    space.top_k = 2;
    space.refine_k = 0;
    const SearchReport direct = search(so, space, opt);
    REQUIRE_FALSE(direct.ranked.empty());
    CHECK(direct.ranked.front().key == c.best->key);
    CHECK(direct.ranked.front().step_time_s == c.best->step_time_s);
  }
  // More layers at the same budget: narrower experts (8 layers is the scenario's own 512).
  CHECK(width[4] > width[8]);
  CHECK(width[8] > width[12]);
  CHECK(std::abs(width[8] - 512) <= 16);
  // A range leaves a candidate out, with the reason.
  doc["model_search"]["active_params"] = {"1B", "2B"};
  const Scenario narrow = load_scenario(doc, "t.json", "");
  const ModelSearchReport rn = model_search(narrow, *parse_model_search(narrow), opt);
  for (const auto& c : rn.candidates) {
    CHECK_FALSE(c.best);
    CHECK_THAT(c.skipped, Catch::Contains("active parameters, outside"));
  }
  // Bad sections are named with their paths, all at once.
  doc["model_search"] = {{"axes", {{"num_hidden_layerz", {4}}, {"hidden_size", nlohmann::json::array()}}},
                         {"fit", {{"key", "hidden_act"}, {"total_params", "lots"}}}};
  try {
    (void)parse_model_search(load_scenario(doc, "t.json", ""));
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    std::set<std::string> paths;
    for (const auto& x : e.diagnostics()) paths.insert(x.pointer);
    CHECK(paths.count("/model_search/axes/num_hidden_layerz") == 1);
    CHECK(paths.count("/model_search/axes/hidden_size") == 1);
    CHECK(paths.count("/model_search/fit/key") == 1);
    CHECK(paths.count("/model_search/fit/total_params") == 1);
  }
  // A preset with some config keys overridden is a model too.
  nlohmann::json p = nlohmann::json::parse(R"({"preset": "pangu-ultra-moe-718b", "num_hidden_layers": 66})");
  Diagnostics pd("t");
  const models::ModelSpec m = models::load_model(p, "/model", pd, "");
  REQUIRE(pd.ok());
  CHECK(m.num_layers == 66);
}

namespace {
/// An allgather among threads standing in for MPI ranks.
class ThreadGather {
 public:
  explicit ThreadGather(int n) : n_(n), slots_(static_cast<std::size_t>(n)) {}
  std::vector<std::string> allgather(int rank, const std::string& mine) {
    std::unique_lock<std::mutex> lock(m_);
    slots_[static_cast<std::size_t>(rank)] = mine;
    const int gen = generation_;
    if (++arrived_ == n_) {
      result_ = slots_;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
    return result_;
  }

 private:
  int n_, arrived_ = 0, generation_ = 0;
  std::vector<std::string> slots_, result_;
  std::mutex m_;
  std::condition_variable cv_;
};
}  // namespace

/// `n` thread-"processes" sharing one search (`file`: their --out, "" for none): each one's
/// report, or its ConfigError's message.
std::pair<std::vector<SearchReport>, std::vector<std::string>> shared_search(const Scenario& s, const SearchSpace& space,
                                                                               int n, const std::string& file,
                                                                               bool resume) {
  ThreadGather g(n);
  std::vector<SearchReport> reps(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      SearchOptions o;
      o.threads = 1;
      o.out_file = file;
      o.resume = resume;
      o.peers.rank = r;
      o.peers.size = n;
      o.peers.allgather = [&g, r](const std::string& mine) { return g.allgather(r, mine); };
      try {
        reps[static_cast<std::size_t>(r)] = search(s, space, o);
      } catch (const ConfigError& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  return {reps, errors};
}

TEST_CASE("search: processes sharing a search rank exactly as one process does", "[search][peers]") {
  const Scenario s = small();
  const SearchSpace space = parse_search_space(s);
  SearchOptions one;
  one.threads = 1;
  const std::string expected = to_json(search(s, space, one), 100).dump();
  for (int n : {2, 3}) {
    const auto [reps, errors] = shared_search(s, space, n, "", false);
    for (int r = 0; r < n; ++r) {
      INFO(n << " processes, rank " << r << " " << errors[static_cast<std::size_t>(r)]);
      CHECK(to_json(reps[static_cast<std::size_t>(r)], 100).dump() == expected);
    }
  }
  // A results file: the first process writes it; resuming, every process reads it, so nothing
  // is simulated again; a file that may not be replaced stops every process (none waits).
  const std::string file = test_dir("peers_journal") + "/results.jsonl";
  const auto [first, first_errors] = shared_search(s, space, 2, file, false);
  CHECK(first_errors[0].empty());
  CHECK(read_lines(file).size() == 1 + first[0].simulated);
  const auto [again, again_errors] = shared_search(s, space, 2, file, true);
  for (int r = 0; r < 2; ++r) {
    CHECK(again[static_cast<std::size_t>(r)].simulated == 0);
    CHECK(to_json(again[static_cast<std::size_t>(r)], 100)["ranked"] == nlohmann::json::parse(expected)["ranked"]);
  }
  const auto [refused, refused_errors] = shared_search(s, space, 2, file, false);  // exists, no --resume
  CHECK_THAT(refused_errors[0], Catch::Contains("already exists"));
  CHECK_THAT(refused_errors[1], Catch::Contains("another process of the search failed"));
}

TEST_CASE("search: swapping to host memory is an axis when asked for, its plans paste back", "[search][swap]") {
  const Scenario s = small({"search.swap_activations=[0, 0.5]", "search.swap_optimizer=[false, true]",
                            "search.tp=[1]", "search.pp=[2]", "search.ep=[8]", "search.mbs=[1]"});
  const SearchSpace space = parse_search_space(s);
  CHECK(space.swap_activations == std::vector<double>{0, 0.5});
  SearchOptions opt;
  opt.threads = 2;
  opt.top_k = 200;  // every plan
  const SearchReport r = search(s, space, opt);
  int swapped = 0;
  for (const auto& rp : r.ranked) {
    if (rp.plan.swap_activations == 0.5 && rp.plan.swap_optimizer) ++swapped;
    const Scenario b = pasted_back(s.document, rp);
    CHECK(b.plan.swap_activations == rp.plan.swap_activations);
    CHECK(b.plan.swap_optimizer == rp.plan.swap_optimizer);
    CHECK(simulate(b).result.step_time_s == rp.step_time_s);
  }
  CHECK(swapped > 0);
  // Swapped plans hold no more on the device than their unswapped twins, and less where more
  // than one chunk's activations are in flight (the one in use stays).
  std::map<std::string, double> peak;
  for (const auto& rp : r.ranked) peak[rp.key] = rp.peak_memory_bytes;
  int compared = 0;
  for (const auto& [key, bytes] : peak)
    if (const auto pos = key.find("-swap0.5"); pos != std::string::npos) {
      std::string twin = key;
      twin.erase(pos, 8);
      if (const auto it = peak.find(twin); it != peak.end()) {
        CHECK(bytes <= it->second);
        compared += bytes < it->second;
      }
    }
  CHECK(compared > 0);
  try {
    parse_search_space(small({"search.swap_activations=[0, 1.5]"}));
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.diagnostics()[0].pointer == "/search/swap_activations/1");
  }
}

TEST_CASE("search: by default a plan over memory gets the least swapping that fits, charged and simulated",
          "[search][swap]") {
  // The 718B at TP8 PP2 VPP4 EP16x8 with two sequences per micro-batch is over the 910B's 64 GB
  // without swapping; a quarter of the activations in host memory is the least that fits.
  std::ifstream in(kRoot + "/scenarios/pangu-ultra-moe-718b.json");
  nlohmann::json doc = nlohmann::json::parse(in);
  nlohmann::json& par = doc["parallelism"];
  par.erase("recompute_modules");
  par["recompute_granularity"] = "none";
  par["pipeline_model_parallel_size"] = 2;
  par["virtual_pipeline_model_parallel_size"] = 4;
  par["expert_model_parallel_size"] = 16;
  par["micro_batch_size"] = 2;
  par["moe_fb_overlap"] = true;
  par["moe_shared_expert_overlap"] = true;
  const Scenario s = load_scenario(doc, "718b.json", "");
  CHECK(parse_search_space(s).swap_auto);  // the 910B has a host link, the axes are not listed
  const models::Workload w = models::build_workload(s.model, s.training.seq_length, s.training.workload);
  const topologies::Topology topo = topologies::build_topology(s.cluster);
  Estimator est(s, topo, w);
  const PlanEstimate plain = est.estimate(s.plan);
  REQUIRE_FALSE(plain.fits);
  const PlanEstimate least = est.estimate(s.plan, false, true);
  REQUIRE(least.fits);
  CHECK(least.swap_activations == 0.25);
  CHECK_FALSE(least.swap_optimizer);
  CHECK(least.step_s > plain.step_s);  // the copies back from host memory cost time
  // The simulation agrees: over memory without, within it with the quarter swapped, and the
  // copies show in its breakdown.
  Scenario swapped = s;
  swapped.plan.swap_activations = 0.25;
  const Simulation sim = simulate(swapped);
  CHECK(sim.result.feasible);
  CHECK(sim.result.breakdown.swap_s > 0);
  CHECK(least.step_s == Approx(sim.result.step_time_s).epsilon(0.10));
  CHECK_FALSE(simulate(s).result.feasible);
  // A plan that fits swaps nothing; a device without a host link, or listed axes, turn it off.
  const Scenario fits = load_scenario_file(kRoot + "/scenarios/pangu-ultra-moe-718b.json", {});
  const PlanEstimate none = est.estimate(fits.plan, false, true);
  CHECK(none.swap_activations == 0);
  CHECK_FALSE(parse_search_space(small({"search.swap_activations=[0, 0.5]"})).swap_auto);
}
