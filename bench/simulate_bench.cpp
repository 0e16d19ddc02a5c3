// Benchmark of `moesim simulate` itself: wall time and engine throughput on a scenario at each
// fidelity. Not a test: it reports numbers (see bench/README.md).
//
//   build/bin/moesim_bench_simulate [SCENARIO] [--repeat N] [--full]
//
// Prints one row per fidelity: tasks, events, lowering + engine wall time (median of N runs),
// events per second of the engine alone, and the predicted step time (which must not change
// between runs).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moesim/models/workload.hpp"
#include "moesim/sim/engine.hpp"
#include "moesim/strategies/lower/lower.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "moesim/topologies/topology.hpp"

using namespace moesim;
using namespace moesim::strategies;
using Clock = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

int main(int argc, char** argv) {
  std::string path = std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-ultra-moe-718b.json";
  int repeat = 5;
  bool full = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--full")) full = true;
    else path = argv[i];
  }
  std::printf("scenario: %s\n", path.c_str());
  std::printf("%-9s %7s %11s %11s %10s %10s %10s %12s %12s\n", "fidelity", "ranks", "tasks", "events", "lower_s",
              "engine_s", "total_s", "events/s", "step_s");
  std::vector<Fidelity> fids{Fidelity::Fast, Fidelity::Balanced};
  if (full) fids.push_back(Fidelity::Full);
  try {
    for (Fidelity f : fids) {
      Scenario s = load_scenario_file(path, {});
      s.simulation.fidelity = f;
      const int reps = f == Fidelity::Full ? 1 : repeat;
      std::vector<double> lower_t, engine_t, total_t;
      std::size_t tasks = 0, ranks = 0;
      std::uint64_t events = 0;
      double step = 0;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        const models::Workload w = models::build_workload(s.model, s.training.seq_length, s.training.workload);
        const topologies::Topology topo = topologies::build_topology(s.cluster);
        const Lowered low = lower(s, topo, w);
        const double tl = seconds_since(t0);
        const auto t1 = Clock::now();
        const sim::RunResult run = sim::Engine(low.graph).run();
        const double te = seconds_since(t1);
        lower_t.push_back(tl);
        engine_t.push_back(te);
        total_t.push_back(tl + te);
        tasks = low.graph.num_tasks();
        ranks = low.ranks.size();
        events = run.events;
        const double st = to_seconds(run.makespan).value();
        if (r > 0 && st != step) {
          std::fprintf(stderr, "non-deterministic step time: %.9f vs %.9f\n", st, step);
          return 1;
        }
        step = st;
      }
      const double te = median(engine_t);
      std::printf("%-9s %7zu %11zu %11llu %10.4f %10.4f %10.4f %12.3e %12.4f\n", fidelity_name(f), ranks, tasks,
                  static_cast<unsigned long long>(events), median(lower_t), te, median(total_t),
                  static_cast<double>(events) / te, step);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moesim_bench_simulate: %s\n", e.what());
    return 2;
  }
  return 0;
}
