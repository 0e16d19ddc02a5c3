// sim/: units, strict configuration reading, the task graph and the discrete-event engine.
#include <catch2/catch.hpp>

#include <thread>
#include <numeric>
#include <limits>
#include <algorithm>

#include "moesim/sim/config.hpp"
#include "moesim/sim/engine.hpp"
#include "moesim/sim/flow.hpp"
#include "moesim/sim/cancel.hpp"
#include "moesim/sim/units.hpp"

using namespace moesim;
using namespace moesim::sim;

TEST_CASE("units: unit strings parse to SI values with their dimension", "[sim][units]") {
  auto q = parse_quantity("200Gbps");
  REQUIRE(q);
  CHECK(q->dimension == Dimension::BytesPerSecond);
  CHECK(q->value == Approx(25e9));  // 200 Gb/s = 25 GB/s
  q = parse_quantity("56GB/s");
  REQUIRE(q);
  CHECK(q->value == Approx(56e9));
  q = parse_quantity("1.5us");
  REQUIRE(q);
  CHECK(q->dimension == Dimension::Seconds);
  CHECK(q->value == Approx(1.5e-6));
  q = parse_quantity("64GiB");
  REQUIRE(q);
  CHECK(q->dimension == Dimension::Bytes);
  CHECK(q->value == Approx(64.0 * 1024 * 1024 * 1024));
  q = parse_quantity("353.8TFLOPS");
  REQUIRE(q);
  CHECK(q->dimension == Dimension::FlopsPerSecond);
  CHECK(q->value == Approx(353.8e12));
  CHECK_FALSE(parse_quantity("fast"));
  CHECK_FALSE(parse_quantity("12 parsecs"));
  CHECK_FALSE(parse_quantity("8GiB/s"));  // binary prefixes only for sizes
}

TEST_CASE("units: ticks are integer picoseconds", "[sim][units]") {
  CHECK(to_ticks(Seconds{1e-6}) == 1'000'000);
  CHECK(to_ticks(Seconds{2.5}) == 2'500'000'000'000);
  CHECK(to_seconds(1'000'000'000'000).value() == 1.0);
  const Seconds t = Bytes{25e9} / BytesPerSecond{25e9};
  CHECK(t.value() == 1.0);
}

TEST_CASE("config: every problem is reported with file, JSON path, value and constraint", "[sim][config]") {
  const auto j = nlohmann::json::parse(R"({"tp": 0, "bw": "56GB", "name": 3, "mode": "x", "extra": 1})");
  Diagnostics diag("s.json");
  ObjectReader r(j, "/parallelism", diag);
  CHECK(r.integer({"tensor_model_parallel_size", "tp"}, 1, 1, 64) == 1);
  CHECK_FALSE(r.opt_quantity({"bw"}, Dimension::BytesPerSecond));
  r.string({"name"}, "");
  r.string({"mode"}, "a", {"a", "b"});
  r.finish();
  REQUIRE(diag.list().size() == 5);
  CHECK(diag.list()[0].to_string() == "s.json:/parallelism/tp: 0 must be between 1 and 64");
  CHECK(diag.list()[1].to_string().find("wrong unit") != std::string::npos);
  CHECK(diag.list()[2].to_string() == "s.json:/parallelism/name: 3 must be a string");
  CHECK(diag.list()[3].to_string() == "s.json:/parallelism/mode: \"x\" must be one of: a, b");
  CHECK(diag.list()[4].pointer == "/parallelism/extra");
  CHECK_THROWS_AS(diag.throw_if_any(), ConfigError);
}

TEST_CASE("config: unknown keys suggest the closest known key", "[sim][config]") {
  const auto j = nlohmann::json::parse(R"({"precison": "bf16"})");
  Diagnostics diag("s.json");
  ObjectReader r(j, "/training", diag);
  r.string({"precision"}, "bf16");
  r.finish();
  REQUIRE(diag.list().size() == 1);
  CHECK(diag.list()[0].constraint.find("did you mean \"precision\"") != std::string::npos);
}

TEST_CASE("config: --set overrides create nested keys and parse JSON values", "[sim][config]") {
  nlohmann::json doc = nlohmann::json::parse(R"({"parallelism": {"tp": 8}})");
  Diagnostics diag("s.json");
  apply_override(doc, "parallelism.tp=4", diag);
  apply_override(doc, "cluster.preset=dgx-h100", diag);
  apply_override(doc, "parallelism.sequence_parallel=true", diag);
  CHECK(diag.ok());
  CHECK(doc["parallelism"]["tp"] == 4);
  CHECK(doc["cluster"]["preset"] == "dgx-h100");
  CHECK(doc["parallelism"]["sequence_parallel"] == true);
  apply_override(doc, "parallelism.tp.x=1", diag);
  apply_override(doc, "no_equals_sign", diag);
  CHECK(diag.list().size() == 2);
}

TEST_CASE("config: sourced values are unwrapped and sources kept", "[sim][config]") {
  nlohmann::json j = nlohmann::json::parse(R"({"a": {"value": 3, "source": "[S] datasheet"}, "b": {"value": 4}})");
  Diagnostics diag("p.json");
  const auto sources = strip_sources(j, "", diag);
  CHECK(j["a"] == 3);
  CHECK(j["b"] == 4);
  REQUIRE(sources.size() == 1);
  CHECK(sources[0].first == "/a");
  REQUIRE(diag.list().size() == 1);  // "b" has no source
  CHECK(diag.list()[0].pointer == "/b/source");
}

namespace {
TaskGraph chain_graph(const std::vector<Tick>& durations) {
  TaskGraphBuilder b({"c"});
  const auto s = b.add_resource("r0/compute", 0, ResourceKind::Stream);
  TaskId prev = kNoTask;
  for (Tick d : durations) {
    const TaskId t = b.add_task(d, 0, b.label("op"), 0, {s});
    if (prev != kNoTask) b.depend(prev, t);
    prev = t;
  }
  return std::move(b).build();
}
}  // namespace

TEST_CASE("engine: a chain of tasks sums exactly", "[sim][engine]") {
  // 3 + 5 + 7 + 11 ps = 26 ps, no rounding anywhere.
  const TaskGraph g = chain_graph({3, 5, 7, 11});
  const RunResult r = Engine(g).run();
  REQUIRE(r.completed);
  CHECK(r.makespan == 26);
  CHECK(r.start[2] == 8);
  CHECK(r.end[3] == 26);
  CHECK(r.events == 4);
}

TEST_CASE("engine: two streams overlap, one stream serialises", "[sim][engine]") {
  TaskGraphBuilder b({"compute", "comm"});
  const auto compute = b.add_resource("r0/compute", 0, ResourceKind::Stream);
  const auto comm = b.add_resource("r0/comm", 0, ResourceKind::Stream);
  const TaskId a = b.add_task(100, 0, b.label("gemm"), 0, {compute});
  const TaskId c = b.add_task(60, 1, b.label("allreduce"), 0, {comm});
  const TaskId d = b.add_task(50, 0, b.label("gemm2"), 0, {compute});
  b.depend(c, d);  // d needs the collective's result
  const TaskGraph g = std::move(b).build();
  const RunResult r = Engine(g).run();
  CHECK(r.start[a] == 0);
  CHECK(r.start[c] == 0);  // overlaps with a
  CHECK(r.start[d] == 100);  // waits for a (stream order) and c (dependency)
  CHECK(r.makespan == 150);
}

TEST_CASE("engine: ties resolve deterministically in insertion order", "[sim][engine]") {
  // Four equal tasks on a first-come-first-served link, all ready at t=0: they run in the
  // order they were added, every time.
  for (int rep = 0; rep < 3; ++rep) {
    TaskGraphBuilder b({"x"});
    const auto link = b.add_resource("nic", 0, ResourceKind::Link);
    std::vector<ResourceId> streams;
    for (int i = 0; i < 4; ++i) streams.push_back(b.add_resource("s" + std::to_string(i), 0, ResourceKind::Stream));
    for (int i = 0; i < 4; ++i) b.add_task(10, 0, b.label("t"), i, {streams[i], link});
    const TaskGraph g = std::move(b).build();
    const RunResult r = Engine(g).run();
    for (int i = 0; i < 4; ++i) CHECK(r.start[i] == 10 * i);
    CHECK(r.makespan == 40);
  }
}

TEST_CASE("engine: a link serialises tasks of different streams, a task needs all its resources", "[sim][engine]") {
  TaskGraphBuilder b({"x"});
  const auto s0 = b.add_resource("a", 0, ResourceKind::Stream);
  const auto s1 = b.add_resource("b", 1, ResourceKind::Stream);
  const auto nic0 = b.add_resource("nic0", 0, ResourceKind::Link);
  const auto nic1 = b.add_resource("nic1", 1, ResourceKind::Link);
  const TaskId x = b.add_task(30, 0, b.label("x"), 0, {s0, nic0});
  const TaskId y = b.add_task(20, 0, b.label("y"), 0, {s1, nic1});
  const TaskId z = b.add_task(5, 0, b.label("z"), 0, {s0, nic0, nic1});  // needs both NICs
  const TaskGraph g = std::move(b).build();
  const RunResult r = Engine(g).run();
  CHECK(r.start[x] == 0);
  CHECK(r.start[y] == 0);
  CHECK(r.start[z] == 30);  // after x frees s0 and nic0; nic1 free since 20
  CHECK(r.makespan == 35);
}

TEST_CASE("engine: contradictory stream order and dependencies are reported, not hung", "[sim][engine]") {
  TaskGraphBuilder b({"x"});
  const auto s = b.add_resource("s", 0, ResourceKind::Stream);
  const TaskId first = b.add_task(1, 0, b.label("first"), 0, {s});
  const TaskId second = b.add_task(1, 0, b.label("second"), 0, {s});
  b.depend(second, first);  // first must wait for second, which is behind it on the stream
  const TaskGraph g = std::move(b).build();
  const RunResult r = Engine(g).run();
  CHECK_FALSE(r.completed);
  CHECK(r.error.find("never ran") != std::string::npos);
}

TEST_CASE("engine: two engines in one process are independent", "[sim][engine]") {
  const TaskGraph g1 = chain_graph({1, 2, 3});
  const TaskGraph g2 = chain_graph({10, 20});
  RunResult r1, r2;
  std::thread t1([&] { r1 = Engine(g1).run(); });
  std::thread t2([&] { r2 = Engine(g2).run(); });
  t1.join();
  t2.join();
  CHECK(r1.makespan == 6);
  CHECK(r2.makespan == 30);
}

TEST_CASE("engine: the critical path covers the makespan", "[sim][engine]") {
  TaskGraphBuilder b({"x"});
  const auto s0 = b.add_resource("a", 0, ResourceKind::Stream);
  const auto s1 = b.add_resource("b", 0, ResourceKind::Stream);
  const TaskId a = b.add_task(10, 0, b.label("a"), 0, {s0});
  const TaskId c = b.add_task(4, 0, b.label("c"), 0, {s1});
  const TaskId d = b.add_task(7, 0, b.label("d"), 0, {s1});
  b.depend(a, d);
  const TaskGraph g = std::move(b).build();
  const RunResult r = Engine(g).run();
  const auto path = critical_path(g, r);
  REQUIRE(path.size() == 2);
  CHECK(path[0] == a);
  CHECK(path[1] == d);
  (void)c;
  Tick sum = 0;
  for (TaskId t : path) sum += g.duration(t);
  CHECK(sum == r.makespan);
}

TEST_CASE("flows: max-min sharing on a hand-worked three-flow example", "[sim][flow]") {
  // Link A 10 GB/s, link B 4 GB/s. Flow 1 uses A, flow 2 uses A and B, flow 3 uses B.
  // Progressive filling: B saturates first (2 flows x 2 GB/s), freezing flows 2 and 3 at 2;
  // flow 1 takes the rest of A: 8 GB/s.
  FlowNetwork net({10e9, 4e9});
  net.add(100e9, {0});
  net.add(20e9, {0, 1});
  net.add(40e9, {1});
  std::vector<double> rate;
  const std::vector<std::uint32_t> all{0, 1, 2};
  net.max_min_rates(all, rate);
  CHECK(rate[0] == Approx(8e9));
  CHECK(rate[1] == Approx(2e9));
  CHECK(rate[2] == Approx(2e9));
  // At 10 s flow 2 is done (20 GB at 2) and flow 1 has 20 GB left, flow 3 20 GB. Rates are
  // recomputed: flow 1 alone on A (10 GB/s) ends at 12 s, flow 3 alone on B (4 GB/s) at 15 s.
  const FlowRun r = net.run();
  CHECK(to_seconds(r.finish[1]).value() == Approx(10.0));
  CHECK(to_seconds(r.finish[0]).value() == Approx(12.0));
  CHECK(to_seconds(r.finish[2]).value() == Approx(15.0));
  CHECK(to_seconds(r.makespan).value() == Approx(15.0));
  CHECK(r.recomputations == 3);  // start; flow 2 ends; flow 1 ends
}

TEST_CASE("flows: N flows into one port take N times one flow, late flows share from their release",
          "[sim][flow]") {
  // Links 0..7: senders' uplinks (25 GB/s); link 8: the receiver's port (25 GB/s).
  auto incast = [](int n) {
    FlowNetwork net(std::vector<double>(9, 25e9));
    for (std::uint32_t i = 0; i < static_cast<std::uint32_t>(n); ++i) net.add(1e9, {i, 8});
    return to_seconds(net.run().makespan).value();
  };
  const double one = incast(1);
  CHECK(one == Approx(1e9 / 25e9));
  for (int n : {2, 4, 8}) CHECK(incast(n) == Approx(n * one));
  // A second flow released half-way: alone for 0.02 s, then both at half rate.
  FlowNetwork net({25e9});
  net.add(1e9, {0});
  net.add(1e9, {0}, to_ticks(Seconds{0.02}));
  const FlowRun r = net.run();
  CHECK(to_seconds(r.finish[0]).value() == Approx(0.02 + 2 * 0.5e9 / 25e9));
  CHECK(to_seconds(r.finish[1]).value() == Approx(0.02 + 2 * 0.5e9 / 25e9 + 0.5e9 / 25e9));
  // Bytes are conserved: the port carried 2 GB in exactly 2 GB / 25 GB/s of busy time.
  CHECK(to_seconds(r.makespan).value() - 0.02 == Approx(1.5e9 / 25e9));
  // Zero bytes or an empty path finish at release.
  FlowNetwork z({1e9});
  z.add(0, {0}, 5);
  z.add(1e6, std::span<const std::uint32_t>{}, 7);
  const FlowRun rz = z.run();
  CHECK(rz.finish[0] == 5);
  CHECK(rz.finish[1] == 7);
}

namespace {

/// Progressive filling written the plain way (every link, every flow, nothing kept or pruned):
/// the reference the solver's shortcuts must agree with.
std::vector<double> reference_rates(const std::vector<double>& cap, const std::vector<std::vector<std::uint32_t>>& paths) {
  std::vector<double> rate(paths.size(), 0.0);
  std::vector<char> frozen(paths.size(), 0);
  std::vector<double> used(cap.size(), 0.0);
  double level = 0;
  for (std::size_t left = paths.size(); left > 0;) {
    double next = std::numeric_limits<double>::infinity();
    for (std::size_t l = 0; l < cap.size(); ++l) {
      int n = 0;
      for (std::size_t f = 0; f < paths.size(); ++f)
        if (!frozen[f] && std::find(paths[f].begin(), paths[f].end(), l) != paths[f].end()) ++n;
      if (n > 0) next = std::min(next, (cap[l] - used[l]) / n);
    }
    level = next;
    std::vector<std::size_t> freeze;
    for (std::size_t l = 0; l < cap.size(); ++l) {
      double load = used[l];
      int n = 0;
      for (std::size_t f = 0; f < paths.size(); ++f)
        if (!frozen[f] && std::find(paths[f].begin(), paths[f].end(), l) != paths[f].end()) ++n;
      load += n * level;
      if (n == 0 || load < cap[l] * (1 - 1e-9)) continue;
      for (std::size_t f = 0; f < paths.size(); ++f)
        if (!frozen[f] && std::find(paths[f].begin(), paths[f].end(), l) != paths[f].end()) freeze.push_back(f);
    }
    for (std::size_t f : freeze) {
      if (frozen[f]) continue;
      frozen[f] = 1;
      rate[f] = level;
      --left;
      for (std::uint32_t l : paths[f]) used[l] += level;
    }
  }
  return rate;
}

}  // namespace

TEST_CASE("flows: the solver's pruning of links that cannot saturate and its kept link table agree with plain "
          "progressive filling",
          "[sim][flow]") {
  // Random networks: 12 links, of which some are far wider than any flow could use (a device's
  // internal link to its NIC) and are pruned; 40 flows over 1-4 distinct links each.
  std::uint64_t x = 12345;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> cap(12);
    for (double& c : cap) c = (next() % 4 == 0 ? 1e15 : 1e9 * static_cast<double>(1 + next() % 50));
    std::vector<std::vector<std::uint32_t>> paths(40);
    FlowNetwork net(cap);
    for (auto& p : paths) {
      const int len = 1 + static_cast<int>(next() % 4);
      while (static_cast<int>(p.size()) < len) {
        const auto l = static_cast<std::uint32_t>(next() % cap.size());
        if (std::find(p.begin(), p.end(), l) == p.end()) p.push_back(l);
      }
      net.add(1e9, p);
    }
    std::vector<std::uint32_t> all(paths.size());
    std::iota(all.begin(), all.end(), 0u);
    std::vector<double> rate;
    net.max_min_rates(all, rate);
    const std::vector<double> want = reference_rates(cap, paths);
    for (std::size_t f = 0; f < paths.size(); ++f) REQUIRE(rate[f] == Approx(want[f]).epsilon(1e-9));
    // A run where flows end one by one (different sizes) and some start late: every flow's
    // bytes / (finish - release) stays within its links' capacities, and the busiest link is
    // never over-full on average over the run.
    FlowNetwork timed(cap);
    for (std::size_t f = 0; f < paths.size(); ++f)
      timed.add(1e8 * static_cast<double>(1 + f % 7), paths[f], static_cast<Tick>(f % 3) * 1000000);
    const FlowRun r = timed.run();
    for (std::size_t f = 0; f < paths.size(); ++f) {
      const double secs = to_seconds(r.finish[f] - static_cast<Tick>(f % 3) * 1000000).value();
      double slowest = std::numeric_limits<double>::infinity();
      for (std::uint32_t l : paths[f]) slowest = std::min(slowest, cap[l]);
      REQUIRE(1e8 * static_cast<double>(1 + f % 7) / secs <= slowest * (1 + 1e-6));
    }
  }
}

TEST_CASE("units: tick arithmetic saturates at the horizon instead of wrapping", "[sim][units][integrity]") {
  CHECK(to_ticks(Seconds{1e300}) == kMaxTick);
  CHECK(to_ticks(Seconds{-1.0}) == 0);
  CHECK(add_ticks(kMaxTick - 5, 3) == kMaxTick - 2);
  CHECK(add_ticks(kMaxTick - 5, 5) == kMaxTick);
  CHECK(add_ticks(kMaxTick, kMaxTick) == kMaxTick);  // 2 x horizon would still fit int64; 4 x would not
  CHECK(scale_ticks(kMaxTick / 2, 3.0) == kMaxTick);
  CHECK(scale_ticks(1000, 1.5) == 1500);
  CHECK(ticks_out_of_range(kMaxTick));
  CHECK_FALSE(ticks_out_of_range(kMaxTick - 1));
  // The horizon is about 26.7 days: a step longer than that is an input error, not a result.
  CHECK(to_seconds(kMaxTick).value() / 86400 == Approx(26.69).epsilon(1e-3));
}

TEST_CASE("engine: a task that would end past the horizon stops the run and is named, no time wraps",
          "[sim][engine][integrity]") {
  TaskGraphBuilder b({"c"});
  const ResourceId s = b.add_resource("r0/compute", 0, ResourceKind::Stream);
  const TaskId a = b.add_task(kMaxTick / 2, 0, b.label("a"), 0, {s});
  const TaskId c = b.add_task(kMaxTick - kMaxTick / 2, 0, b.label("b"), 0, {s});  // ends exactly at the horizon
  const TaskId d = b.add_task(kMaxTick, 0, b.label("c"), 0, {s});  // a saturated duration
  b.depend(a, c);
  b.depend(c, d);
  const TaskGraph g = std::move(b).build();
  const RunResult r = Engine(g).run();
  CHECK_FALSE(r.completed);
  CHECK(r.out_of_range);
  CHECK(r.failed_task == c);
  CHECK(r.error.find("b#0 on r0/compute would end past the horizon") != std::string::npos);
  for (TaskId t = 0; t < g.num_tasks(); ++t) {
    CHECK(r.start[t] >= -1);
    CHECK(r.end[t] >= -1);
  }
  CHECK(r.makespan >= 0);
}

TEST_CASE("engine: a raised cancel flag stops a run", "[sim][engine][integrity]") {
  TaskGraphBuilder b({"c"});
  const ResourceId s = b.add_resource("r0/compute", 0, ResourceKind::Stream);
  for (int i = 0; i < 20000; ++i) b.add_task(10, 0, b.label("t"), i, {s});
  const TaskGraph g = std::move(b).build();
  CancelFlag cancel;
  CHECK(Engine(g, &cancel).run().completed);
  cancel.request();
  const RunResult r = Engine(g, &cancel).run();
  CHECK_FALSE(r.completed);
  CHECK(r.cancelled);
  CHECK(r.events < 20000);
}
