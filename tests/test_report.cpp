// Capacity planning (strategies/capacity) and the HTML report (tools/cli/html_report).
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "html_report.hpp"
#include "report.hpp"
#include "moesim/strategies/search/capacity.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {
const std::string kRoot = MOESIM_SOURCE_DIR;

Scenario small(const std::vector<std::string>& sets = {}) {
  return load_scenario_file(kRoot + "/tests/scenarios/search_small_moe.json", sets);
}

/// A point with a given best throughput (what a search would have found).
CapacityPoint point(int devices, double tokens_per_s) {
  CapacityPoint p;
  p.devices = devices;
  p.global_batch_size = 1024;
  p.feasible = tokens_per_s > 0;
  if (!p.feasible) p.reason = "no plan fits";
  p.best.tokens_per_s = tokens_per_s;
  p.best.mfu = 0.3;
  return p;
}

CapacityReport three_sizes(double deadline_days) {
  CapacityReport r;
  r.train_tokens = 1e13;  // 10T
  r.deadline_s = deadline_days * 86400;
  // Given out of order: evaluate_capacity sorts by devices.
  r.points = {point(4096, 3.5e6), point(1024, 1.0e6), point(512, 0), point(2048, 1.9e6)};
  evaluate_capacity(r);
  return r;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

/// Tag balance of an HTML fragment: every element opened is closed in order, except the void
/// elements and self-closed (`<x/>`) ones; `<!...>` is skipped. Returns the first problem.
std::string unbalanced(const std::string& html) {
  std::vector<std::string> stack;
  const std::vector<std::string> voids{"meta", "link", "br", "img", "hr", "input"};
  for (std::size_t i = html.find('<'); i != std::string::npos; i = html.find('<', i + 1)) {
    const std::size_t end = html.find('>', i);
    if (end == std::string::npos) return "unterminated tag at " + std::to_string(i);
    const std::string tag = html.substr(i + 1, end - i - 1);
    if (tag.empty()) return "empty tag at " + std::to_string(i);
    if (tag[0] == '!') continue;
    if (tag.back() == '/') continue;
    const bool closing = tag[0] == '/';
    std::string name = tag.substr(closing ? 1 : 0, tag.find_first_of(" \n\t", closing ? 1 : 0) - (closing ? 1 : 0));
    if (!closing && std::find(voids.begin(), voids.end(), name) != voids.end()) continue;
    if (!closing) {
      stack.push_back(name);
    } else {
      if (stack.empty() || stack.back() != name)
        return "</" + name + "> closes <" + (stack.empty() ? std::string("nothing") : stack.back()) + "> at " +
               std::to_string(i);
      stack.pop_back();
    }
  }
  return stack.empty() ? "" : "<" + stack.back() + "> never closed";
}

}  // namespace

TEST_CASE("capacity: token counts, durations and device ranges parse with units", "[capacity]") {
  CHECK(*parse_token_count("10T") == 1e13);
  CHECK(*parse_token_count("500B") == 5e11);
  CHECK(*parse_token_count("1.5e12") == 1.5e12);
  CHECK(*parse_token_count("2.5M") == 2.5e6);
  CHECK(*parse_token_count(" 8000000 ") == 8e6);
  CHECK_FALSE(parse_token_count("10X"));
  CHECK_FALSE(parse_token_count("T"));
  CHECK_FALSE(parse_token_count("-5T"));
  CHECK_FALSE(parse_token_count("0"));
  CHECK_FALSE(parse_token_count(""));

  CHECK(*parse_duration_s("30d") == 30 * 86400.0);
  CHECK(*parse_duration_s("720h") == 30 * 86400.0);
  CHECK(*parse_duration_s("2w") == 14 * 86400.0);
  CHECK(*parse_duration_s("90min") == 5400.0);
  CHECK_FALSE(parse_duration_s("30"));  // days or hours? a unit is required
  CHECK_FALSE(parse_duration_s("30y"));
  CHECK_FALSE(parse_duration_s("0d"));
  CHECK_FALSE(parse_duration_s("d"));

  CHECK(parse_device_counts("2048:16384") == std::vector<int>{2048, 4096, 8192, 16384});
  CHECK(parse_device_counts("2048:8192:2048") == std::vector<int>{2048, 4096, 6144, 8192});
  CHECK(parse_device_counts("6144,2048,2048") == std::vector<int>{2048, 6144});
  CHECK(parse_device_counts("512") == std::vector<int>{512});
  CHECK_THROWS_AS(parse_device_counts("16384:2048"), ConfigError);
  CHECK_THROWS_AS(parse_device_counts("0"), ConfigError);
  CHECK_THROWS_AS(parse_device_counts("a,b"), ConfigError);
  CHECK_THROWS_AS(parse_device_counts("1:100000:1"), ConfigError);  // more than 64 sizes
  CHECK_THROWS_AS(parse_device_counts("1000000"), ConfigError);
  try {
    parse_device_counts("16384:2048");
  } catch (const ConfigError& e) {
    CHECK(e.diagnostics().front().value == "\"16384:2048\"");
    CHECK(e.diagnostics().front().constraint == "START must not exceed END");
  }
}

TEST_CASE("capacity: days, device-hours and the answer from hand-derived numbers", "[capacity]") {
  // 10T tokens. 1024 devices at 1.0M tokens/s: 1e7 s = 115.74 days, 1024 x 1e7 / 3600 =
  // 2,844,444 device-hours. 2048 at 1.9M: 5.263e6 s = 60.91 days, 2,994,152 device-hours.
  // 4096 at 3.5M: 2.857e6 s = 33.07 days, 3,250,794 device-hours. 512: no plan.
  const CapacityReport r = three_sizes(60);
  REQUIRE(r.points.size() == 4);
  CHECK(r.points[0].devices == 512);
  CHECK_FALSE(r.points[0].feasible);
  CHECK(r.points[1].days == Approx(115.7407).epsilon(1e-6));
  CHECK(r.points[1].device_hours == Approx(2844444.44).epsilon(1e-6));
  CHECK(r.points[1].tokens_per_s_per_device == Approx(1e6 / 1024));
  CHECK(r.points[2].days == Approx(1e13 / 1.9e6 / 86400).epsilon(1e-9));
  CHECK(r.points[2].days == Approx(60.9161).epsilon(1e-5));
  CHECK(r.points[3].days == Approx(33.0688).epsilon(1e-5));
  CHECK(r.points[3].device_hours == Approx(4096 * (1e13 / 3.5e6) / 3600).epsilon(1e-12));
  // 60 days: 2048 misses by 0.9 days, 4096 meets.
  REQUIRE(r.answer);
  CHECK(r.points[*r.answer].devices == 4096);
  CHECK_FALSE(r.points[2].meets_deadline);
  CHECK(r.points[3].meets_deadline);
  CHECK(r.points[*r.fastest].devices == 4096);
  CHECK(r.points[*r.cheapest].devices == 1024);
  CHECK_FALSE(r.deadline_unreachable());
  // 61 days: 2048 now meets.
  CHECK(three_sizes(61).points[*three_sizes(61).answer].devices == 2048);
  // Unreachable: 30 days is below the fastest 33.07; the fastest is still reported.
  const CapacityReport none = three_sizes(30);
  CHECK(none.deadline_unreachable());
  CHECK_FALSE(none.answer);
  REQUIRE(none.fastest);
  CHECK(none.points[*none.fastest].devices == 4096);
  // No deadline: no answer, not "unreachable".
  const CapacityReport open = three_sizes(0);
  CHECK_FALSE(open.answer);
  CHECK_FALSE(open.deadline_unreachable());
  CHECK(to_json(open)["deadline_met"].is_null());
  CHECK(to_json(r)["answer_devices"] == 4096);
}

TEST_CASE("capacity: the smallest cluster meeting a deadline never grows when the deadline is longer", "[capacity]") {
  int previous = 1 << 30;
  for (double days = 20; days <= 200; days += 0.5) {
    const CapacityReport r = three_sizes(days);
    const int devices = r.answer ? r.points[*r.answer].devices : 1 << 30;
    CHECK(devices <= previous);
    previous = devices;
  }
  CHECK(previous == 1024);  // 200 days: the smallest feasible size
}

TEST_CASE("capacity: default sizes double around the scenario's cluster and stay whole servers", "[capacity]") {
  const Scenario big = load_scenario_file(kRoot + "/scenarios/pangu-ultra-moe-718b.json", {});
  CHECK(default_capacity_sizes(big) == std::vector<int>{1536, 3072, 6144, 12288, 24576, 49152});
  // 32 devices on 8-device servers: 8 ... 256.
  CHECK(default_capacity_sizes(small()) == std::vector<int>{8, 16, 32, 64, 128, 256});
  // Proportional batch: 6144 sequences on 6144 devices -> 3072 on 3072.
  const Scenario half = scenario_at_size(big, 3072, BatchScaling::Proportional);
  CHECK(half.cluster.devices == 3072);
  CHECK(half.training.global_batch_size == 3072);
  CHECK(half.document["cluster"]["devices"] == 3072);
  CHECK(scenario_at_size(big, 3072, BatchScaling::Fixed).training.global_batch_size == 6144);
}

TEST_CASE("capacity: plan_capacity searches every size and reports the ones without a plan", "[capacity]") {
  const Scenario s = small();
  CapacityOptions opt;
  opt.train_tokens = 1e12;
  opt.devices = {32, 3, 8};  // 3 devices: DP 3 cannot split the global batch of 64
  opt.threads = 2;
  opt.simulate_top = 4;
  CapacityReport r = plan_capacity(s, opt);
  REQUIRE(r.points.size() == 3);
  CHECK(r.points[0].devices == 3);
  CHECK_FALSE(r.points[0].feasible);
  CHECK_THAT(r.points[0].reason, Catch::Contains("divides 3 devices"));
  for (std::size_t i = 1; i < 3; ++i) {
    const auto& p = r.points[i];
    REQUIRE(p.feasible);
    CHECK(p.best.simulated);
    CHECK(p.tokens_per_s == p.best.tokens_per_s);
    CHECK(p.days_failure_free == Approx(1e12 / p.tokens_per_s / 86400));
    // The days count the expected failures (the default reliability preset): goodput below 1.
    REQUIRE(p.reliability);
    CHECK(p.goodput.goodput < 1.0);
    CHECK(p.days == Approx(p.days_failure_free / p.goodput.goodput));
    CHECK(p.device_hours == Approx(p.devices * p.days * 24));
    // Every plan ranked at a size divides that size.
    const Plan& plan = p.best.plan;
    CHECK(plan.tp * plan.pp * plan.cp * plan.dp == p.devices);
  }
  CHECK(r.points[2].tokens_per_s > r.points[1].tokens_per_s);  // 32 devices beat 8
  // A deadline between the two sizes' times picks 32; one below both is unreachable.
  opt.deadline_s = 0.5 * (r.points[1].train_s + r.points[2].train_s);
  r = plan_capacity(s, opt);
  REQUIRE(r.answer);
  CHECK(r.points[*r.answer].devices == 32);
  opt.deadline_s = 0.5 * r.points[2].train_s;
  r = plan_capacity(s, opt);
  CHECK(r.deadline_unreachable());
  CHECK(r.points[*r.fastest].devices == 32);

  CapacityOptions bad;
  bad.train_tokens = 0;
  bad.deadline_s = -1;
  try {
    plan_capacity(s, bad);
    FAIL("no error for a missing token budget");
  } catch (const ConfigError& e) {
    CHECK(e.diagnostics().size() == 2);
  }
}

TEST_CASE("report: HTML escaping", "[report]") {
  CHECK(tools::html_escape("<a href=\"x\">Tom & 'Jerry'</a>") ==
        "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;");
  CHECK(tools::html_escape("plain TP8 PP16") == "plain TP8 PP16");
}

TEST_CASE("report: every chart is present, text is escaped, tags balance and output is deterministic", "[report]") {
  const std::string nasty = "<script>alert('x')</script> & \"quotes\"";
  const Scenario s = small({"description=\"" + std::string("<script>alert('x')</script> & \\\"quotes\\\"") + "\""});
  REQUIRE(s.document["description"] == nasty);
  auto render = [&] {
    const Simulation sim = simulate(s);
    const SearchSpace space = parse_search_space(s);
    SearchOptions so;
    so.threads = 2;
    so.top_k = 6;
    const SearchReport rep = search(s, space, so);
    CapacityOptions opt;
    opt.train_tokens = 1e12;
    opt.deadline_s = 30 * 86400.0;
    opt.devices = {16, 32};
    opt.threads = 2;
    opt.simulate_top = 6;
    opt.known_search = &rep;
    const CapacityReport cap = plan_capacity(s, opt);
    tools::HtmlReportInput in;
    in.scenario = &s;
    in.sim = &sim;
    in.search = &rep;
    in.capacity = &cap;
    const auto ids = tools::report_chart_ids(in);
    return std::pair{tools::render_html_report(in), ids};
  };
  const auto [html, ids] = render();
  // Balanced routing: no expert-load map (a uniform box), a sentence instead.
  CHECK(ids == std::vector<std::string>{"chart-breakdown", "chart-critical-path", "chart-timeline", "chart-schedule",
                                        "chart-memory", "chart-scaling", "chart-goodput"});  // the default reliability preset
  CHECK(html.find("Routing is balanced") != std::string::npos);
  CHECK(html.find("chart-expert-load") == std::string::npos);
  // Every chart has a caption saying what to see, and the scaling chart's axes say their scale.
  CHECK(count(html, "<figcaption>") == count(html, "<figure>"));
  CHECK(html.find("throughput (tokens/s, log scale)") != std::string::npos);
  CHECK(html.find("linear scaling from") != std::string::npos);
  CHECK(html.find("What gates the step") != std::string::npos);
  CHECK(html.find("Pipeline schedule") != std::string::npos);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  for (const auto& id : ids) {
    const auto at = html.find("<svg id=\"" + id + "\"");
    REQUIRE(at != std::string::npos);
    const auto end = html.find("</svg>", at);
    REQUIRE(end != std::string::npos);
    const std::string svg = html.substr(at, end - at);
    INFO(id);
    CHECK(count(svg, "<rect") + count(svg, "<circle") > 0);
    CHECK(unbalanced(svg + "</svg>").empty());
  }
  CHECK(unbalanced(html) == "");
  // The description is shown, escaped; no markup from the input reaches the page.
  CHECK(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;quotes&quot;") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  // Self-contained: the only URL is the SVG namespace (never fetched).
  CHECK(count(html, "http") == count(html, "http://www.w3.org/2000/svg"));
  CHECK(html.find("@media print") != std::string::npos);
  CHECK(html.find("<h2>Capacity planning</h2>") != std::string::npos);
  // Same scenario and seed: the same bytes.
  CHECK(render().first == html);
}

TEST_CASE("report: a dense model has no expert-load chart and a skipped sweep no scaling chart", "[report]") {
  const Scenario s = load_scenario_file(kRoot + "/tests/scenarios/case_010_gpt_1t.json", {});
  REQUIRE_FALSE(s.model.is_moe());
  const Simulation sim = simulate(s);
  tools::HtmlReportInput in;
  in.scenario = &s;
  in.sim = &sim;
  const auto ids = tools::report_chart_ids(in);
  CHECK(ids == std::vector<std::string>{"chart-breakdown", "chart-critical-path", "chart-timeline", "chart-schedule",
                                        "chart-memory"});
  const std::string html = tools::render_html_report(in);
  CHECK(html.find("chart-expert-load") == std::string::npos);
  CHECK(html.find("The scaling sweep was not run") != std::string::npos);
  CHECK(html.find("The strategy search was not run") != std::string::npos);
  CHECK(unbalanced(html).empty());
}

TEST_CASE("report: a model_search scenario gets an architecture table and chart", "[report][model_search]") {
  nlohmann::json doc = small().document;
  doc["search"] = {{"tp", {1}}, {"pp", {1, 2}}, {"vpp", {1}}, {"mbs", {1}}, {"recompute", {"none"}},
                   {"pipeline_schedule", {"auto"}}};
  doc["model_search"] = {{"axes", {{"num_hidden_layers", {4, 8}}}}, {"top_k", 2}, {"refine_k", 0},
                         {"active_params", {"0.05B", "0.09B"}}};  // 4 layers: 0.068B active, 8: 0.104B
  const Scenario s = load_scenario(doc, "t.json", "");
  SearchOptions opt;
  opt.threads = 2;
  const ModelSearchReport models = model_search(s, *parse_model_search(s), opt);
  const Simulation sim = simulate(s);
  tools::HtmlReportInput in;
  in.scenario = &s;
  in.sim = &sim;
  in.models = &models;
  const std::string html = tools::render_html_report(in);
  REQUIRE(models.candidates.size() == 2);
  CHECK(models.candidates[0].best.has_value());   // 4 layers, inside the range
  CHECK_FALSE(models.candidates[1].best.has_value());  // 8 layers, outside: listed with why
  CHECK_THAT(html, Catch::Contains("<section id=\"architecture\">"));
  CHECK_THAT(html, Catch::Contains("id=\"chart-architecture\""));
  CHECK_THAT(html, Catch::Contains("active parameters, outside"));
  CHECK(tools::report_chart_ids(in).back() == "chart-architecture");
}

TEST_CASE("report: stragglers and failures get their section, charts and table", "[report][stragglers]") {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(kRoot + "/tests/scenarios/search_small_moe.json"));
  j.erase("search");
  j["simulation"]["stragglers"] = {{"devices", {{"list", {3}}, {"slowdown", 1.3}}}, {"host_jitter", 0.02}, {"steps", 4}};
  const Scenario s = load_scenario(j, "t.json", "");
  const Simulation sim = simulate(s);
  CapacityOptions opt;
  opt.train_tokens = 1e12;
  opt.devices = {32};
  opt.threads = 2;
  opt.simulate_top = 2;
  Scenario plain = s;
  plain.simulation.stragglers = Stragglers{};
  const CapacityReport cap = plan_capacity(plain, opt);
  tools::HtmlReportInput in;
  in.scenario = &s;
  in.sim = &sim;
  in.capacity = &cap;
  const auto ids = tools::report_chart_ids(in);
  CHECK(std::find(ids.begin(), ids.end(), "chart-step-times") != ids.end());
  CHECK(std::find(ids.begin(), ids.end(), "chart-goodput") != ids.end());
  const std::string html = tools::render_html_report(in);
  for (const auto& id : ids) CHECK(html.find("<svg id=\"" + id + "\"") != std::string::npos);
  CHECK(html.find("<section id=\"reliability\">") != std::string::npos);
  CHECK(html.find("holds back") != std::string::npos);
  CHECK(html.find("Young") != std::string::npos);
  CHECK(unbalanced(html).empty());
}

TEST_CASE("result text: a unit always has its space, and the plan line says only what the plan does", "[report][text]") {
  const std::string pangu = std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-ultra-moe-718b.json";
  const Scenario s = load_scenario_file(pangu, {});
  Result r = simulate(s).result;
  r.tokens_per_s = 441.9;
  CHECK_THAT(tools::format_result_table(r, s, false), Catch::Contains("441.9 tokens/s"));
  r.tokens_per_s = 1.54e6;
  CHECK_THAT(tools::format_result_table(r, s, false), Catch::Contains("1.54 Mtokens/s"));
  // The published plan: hierarchical all-to-all over 4 servers, TP8 with MC2.
  const std::string full = tools::format_plan_line(s);
  CHECK_THAT(full, Catch::Contains("hierarchical all-to-all") && Catch::Contains("TP comm overlapped"));
  // One expert rank and one tensor rank: nothing hierarchical, nothing of TP to overlap.
  const Scenario one = load_scenario_file(pangu, {"parallelism.tensor_model_parallel_size=1",
                                                  "parallelism.expert_model_parallel_size=1",
                                                  "parallelism.moe_tp_extend_ep=false",
                                                  "parallelism.tp_comm_overlap=false",
                                                  "parallelism.sequence_parallel=false",
                                                  "training.global_batch_size=12288",
                                                  "parallelism.moe_fb_overlap=true"});
  const std::string line = tools::format_plan_line(one);
  CHECK_THAT(line, !Catch::Contains("hierarchical") && !Catch::Contains("TP comm") &&
                       !Catch::Contains("forward-backward overlap") && Catch::Contains("EP1"));
}

TEST_CASE("report: skewed routing draws the expert-load map, and the schedule shows both passes of every stage", "[report]") {
  const Scenario s = small({"moe.routing=\"zipf\""});
  const Simulation sim = simulate(s);
  tools::HtmlReportInput in;
  in.scenario = &s;
  in.sim = &sim;
  const auto ids = tools::report_chart_ids(in);
  CHECK(std::find(ids.begin(), ids.end(), "chart-expert-load") != ids.end());
  const std::string html = tools::render_html_report(in);
  CHECK(html.find("<svg id=\"chart-expert-load\"") != std::string::npos);
  CHECK(html.find("Routing is balanced") == std::string::npos);
  // One lane per stage, forward and backward blocks in each, titled with their micro-batch.
  const auto at = html.find("<svg id=\"chart-schedule\"");
  REQUIRE(at != std::string::npos);
  const std::string svg = html.substr(at, html.find("</svg>", at) - at);
  for (int stage = 0; stage < s.plan.pp; ++stage) {
    INFO(stage);
    int fwd = 0, bwd = 0;
    const std::string key = fmt::format("<title>stage {}: micro-batch ", stage);
    for (auto p = svg.find(key); p != std::string::npos; p = svg.find(key, p + 1)) {
      const std::string rest = svg.substr(p + key.size(), 24);
      fwd += rest.find(" forward,") != std::string::npos;
      bwd += rest.find(" backward,") != std::string::npos;
    }
    CHECK(fwd > 0);
    CHECK(bwd > 0);
  }
  // Plans are named alike everywhere: the expert-parallel size, never "EP4x8".
  CHECK(html.find("x8 ") == std::string::npos);
}
