// Progress of long computations (sim/progress.hpp, tools/cli/progress_line.hpp): what the
// library reports, the arithmetic of the ETA and the text of the CLI's line.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "moesim/sim/cancel.hpp"
#include "moesim/sim/engine.hpp"
#include "moesim/sim/progress.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/search/search.hpp"
#include "progress_line.hpp"

using namespace moesim;

namespace {

const std::string kRoot = MOESIM_SOURCE_DIR;

sim::TaskGraph chain(int n) {
  sim::TaskGraphBuilder b({"x"});
  const auto s = b.add_resource("s", 0, sim::ResourceKind::Stream);
  sim::TaskId prev = sim::kNoTask;
  for (int i = 0; i < n; ++i) {
    const sim::TaskId t = b.add_task(1, 0, b.label("op"), 0, {s});
    if (prev != sim::kNoTask) b.depend(prev, t);
    prev = t;
  }
  return std::move(b).build();
}

sim::Progress::Snapshot snap(std::string phase, std::uint64_t done, std::uint64_t total, double phase_s, double total_s) {
  sim::Progress::Snapshot s;
  s.phase = std::move(phase);
  s.done = done;
  s.total = total;
  s.phase_seconds = phase_s;
  s.total_seconds = total_s;
  return s;
}

}  // namespace

TEST_CASE("progress: the engine reports the events done through the flag's progress", "[progress]") {
  const sim::TaskGraph g = chain(10000);
  sim::Progress p;
  CancelFlag flag;
  flag.attach(&p);
  p.begin("run", g.num_tasks());
  const sim::RunResult r = sim::Engine(g, &flag).run();
  REQUIRE(r.completed);
  const auto s = p.snapshot();
  CHECK(s.phase == "run");
  CHECK(s.total == 10000);
  CHECK(s.done == 10000);  // the last state is reported when the run ends
  CHECK(s.generation == 1);
}

TEST_CASE("progress: a follower flag is raised with its leader and reports nothing", "[progress]") {
  sim::Progress p;
  CancelFlag leader;
  leader.attach(&p);
  CancelFlag follower(&leader);
  CHECK(follower.progress() == nullptr);
  CHECK_FALSE(follower.requested());
  leader.request();
  CHECK(follower.requested());
  CancelFlag own(&leader);
  leader.reset();
  own.request();
  CHECK_FALSE(leader.requested());  // raising a follower does not raise its leader
}

TEST_CASE("progress: the ETA is the time left at the phase's rate so far", "[progress]") {
  // 25 of 100 units in 3 s: 75 units at 25 per 3 s take 9 s more.
  CHECK(sim::Progress::eta_seconds(snap("x", 25, 100, 3.0, 5.0)) == Approx(9.0));
  CHECK(sim::Progress::eta_seconds(snap("x", 100, 100, 3.0, 5.0)) == 0.0);
  CHECK(sim::Progress::eta_seconds(snap("x", 0, 100, 3.0, 5.0)) < 0);  // nothing done: cannot tell
  CHECK(sim::Progress::eta_seconds(snap("x", 5, 0, 3.0, 5.0)) < 0);    // total unknown
}

TEST_CASE("progress: the CLI line shows phase, bar, percentage, elapsed time and ETA in one line", "[progress]") {
  CHECK(tools::format_progress(snap("simulating 400 tasks", 100, 400, 2.0, 7.4), 80) ==
        "simulating 400 tasks [#####...............]  25%  7 s, ETA 6 s");
  CHECK(tools::format_progress(snap("building the task graph", 0, 0, 0.2, 1.2), 80) == "building the task graph  1 s");
  // No ETA in a phase's first half second: a rate from a few samples would jump around.
  CHECK(tools::format_progress(snap("refining", 1, 4, 0.3, 2.0), 80) == "refining [#####...............]  25%  2 s");
  CHECK(tools::format_progress(snap("x", 1, 2, 100.0, 4000.0), 80) == "x [##########..........]  50%  1 h 06 min, ETA 1 min 40 s");
  // Never wider than the terminal (one column spare so the cursor does not wrap).
  const std::string line = tools::format_progress(snap(std::string(200, 'p'), 1, 2, 1.0, 1.0), 40);
  CHECK(line.size() == 39);
}

TEST_CASE("progress: a phase context prefixes the phases that follow", "[progress]") {
  sim::Progress p;
  p.set_context("step 2 of 8");
  p.begin("simulating 10 tasks", 10);
  CHECK(p.snapshot().phase == "step 2 of 8: simulating 10 tasks");
  p.set_context("");
  CHECK(p.snapshot().phase == "simulating 10 tasks");
}

TEST_CASE("progress: a simulation names its phases, a search reports its own and not its simulations'", "[progress]") {
  const strategies::Scenario s =
      strategies::load_scenario_file(kRoot + "/tests/scenarios/search_small_moe.json", {});
  {
    sim::Progress p;
    CancelFlag flag;
    flag.attach(&p);
    (void)strategies::simulate(s, &flag);
    const auto last = p.snapshot();
    CHECK_FALSE(last.phase.empty());  // the last engine run (a re-run for port sharing, ...)
    CHECK(last.total > 0);
    CHECK(last.done == last.total);
    CHECK(last.generation >= 2);  // the task graph, then at least one engine run
  }
  {
    sim::Progress p;
    CancelFlag flag;
    flag.attach(&p);
    strategies::SearchOptions opt;
    opt.threads = 2;
    opt.cancel = &flag;
    std::set<std::string> phases;
    opt.progress = [&](const char* phase, std::size_t, std::size_t) { phases.insert(phase); };
    (void)strategies::search(s, strategies::parse_search_space(s), opt);
    CHECK(p.snapshot().generation == 0);  // the plans' simulations ran on a quiet follower
    CHECK(phases.count("screening") == 1);
    CHECK(phases.count("simulating") == 1);
  }
}
