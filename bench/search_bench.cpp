// Benchmark of `moesim search`: screening rate (plans per second per core) and the wall time of
// the whole search, for 1 and 2 threads (or the given list). Reports numbers; not a test.
//
//   build/bin/moesim_bench_search [SCENARIO] [--threads 1,2]

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moesim/strategies/search/search.hpp"

using namespace moesim;
using namespace moesim::strategies;

int main(int argc, char** argv) {
  std::string path = std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-ultra-moe-718b.json";
  std::vector<int> threads{1, 2};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads.clear();
      for (char* t = std::strtok(argv[++i], ","); t; t = std::strtok(nullptr, ",")) threads.push_back(std::atoi(t));
    } else {
      path = argv[i];
    }
  }
  try {
    const Scenario s = load_scenario_file(path, {});
    const SearchSpace space = parse_search_space(s);
    std::printf("scenario: %s\nspace: %.0f plans\n", path.c_str(), space.size());
    std::printf("%8s %10s %10s %12s %16s %12s %10s %8s\n", "threads", "valid", "fit(est)", "screen_s", "plans/s/core",
                "simulate_s", "total_s", "sims");
    std::string first;
    for (int t : threads) {
      SearchOptions opt;
      opt.threads = t;
      const auto t0 = std::chrono::steady_clock::now();
      const SearchReport r = search(s, space, opt);
      const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%8d %10zu %10zu %12.3f %16.0f %12.3f %10.3f %8zu\n", t, r.valid, r.screened_fit, r.screening_s,
                  r.valid / r.screening_s / t, r.simulation_s, total, r.simulated);
      const std::string ranking = to_json(r, 10)["ranked"].dump();
      if (first.empty()) first = ranking;
      else if (ranking != first) {
        std::fprintf(stderr, "ranking differs with %d threads\n", t);
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moesim_bench_search: %s\n", e.what());
    return 2;
  }
  return 0;
}
