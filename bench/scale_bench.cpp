// Speed at cluster scale (issue 19): the rows of the issue's table, measured in one process on
// this machine, so that a change is judged before and after in the same run.
//
//   moesim_bench_scale [--full] [--repeat N] [--only ROW]
//
// Rows: the 718B at its default fidelity; (with --full) every rank of it, with peak memory;
// simulating at 131,072 devices; the search's screening rate at 6K, 65K and 131K devices (one
// thread, screening only); a 1,024-rank 64 MiB all-to-all at flow level on a 4:1
// oversubscribed fat tree, uniform and skewed (CPU seconds).

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "moesim/strategies/output/simulate.hpp"
#include "moesim/strategies/search/search.hpp"
#include "moesim/topologies/collectives.hpp"
#include "moesim/topologies/netflow.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {

const std::string kRoot = MOESIM_SOURCE_DIR;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double cpu_s() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }
double peak_rss_gb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0 / 1e9;  // Linux: kilobytes
}

nlohmann::json pangu() {
  std::ifstream in(kRoot + "/scenarios/pangu-ultra-moe-718b.json");
  return nlohmann::json::parse(in);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Wall times of `repeat` simulations of `s`: the first (cold: the process builds the
/// cluster's fabric) and the median of the others (warm: as in a search, which simulates many
/// plans on one cluster); `sim` keeps the last.
std::pair<double, double> timed_simulate(const Scenario& s, int repeat, Simulation& sim) {
  std::vector<double> wall;
  for (int i = 0; i < repeat + 1; ++i) {
    const double t0 = now_s();
    sim = simulate(s);
    wall.push_back(now_s() - t0);
  }
  const double cold = wall.front();
  wall.erase(wall.begin());
  return {cold, median(wall)};
}

void row_default(int repeat) {
  const Scenario s = load_scenario(pangu(), "718b.json", kRoot + "/scenarios");
  Simulation sim;
  const auto [cold, warm] = timed_simulate(s, repeat, sim);
  std::printf("| 718B on 6,144 NPUs, default fidelity, in process | %.3f s warm, %.3f s cold (%d ranks, %llu tasks, step %.3f s) |\n",
              warm, cold, sim.result.ranks_simulated, static_cast<unsigned long long>(sim.result.tasks),
              sim.result.step_time_s);
}

void row_full() {
  nlohmann::json j = pangu();
  j["simulation"]["fidelity"] = "full";
  const Scenario s = load_scenario(j, "718b.json", kRoot + "/scenarios");
  const double t0 = now_s();
  const Simulation sim = simulate(s);
  std::printf("| 718B, every rank (full fidelity) | %.1f s wall, %.1f GB peak, %llu tasks (step %.3f s) |\n", now_s() - t0,
              peak_rss_gb(), static_cast<unsigned long long>(sim.result.tasks), sim.result.step_time_s);
}

void row_131k(int repeat) {
  nlohmann::json j = pangu();
  j["cluster"]["devices"] = 131072;
  j["training"]["global_batch_size"] = 32768;  // 16 micro-batches of 2 per pipeline at DP1024
  const Scenario s = load_scenario(j, "718b.json", kRoot + "/scenarios");
  Simulation sim;
  const auto [cold, warm] = timed_simulate(s, repeat, sim);
  std::printf("| simulate at 131,072 devices (%d ranks simulated) | %.3f s warm, %.3f s cold |\n", sim.result.ranks_simulated,
              warm, cold);
}

void row_screening(int devices) {
  nlohmann::json j = pangu();
  j["cluster"]["devices"] = devices;
  j["training"]["global_batch_size"] = std::max(6144, devices);  // the plan as given stays valid
  j["search"] = {{"top_k", 1}, {"refine_k", 0}, {"replay_k", 0}};
  const Scenario s = load_scenario(j, "718b.json", kRoot + "/scenarios");
  const SearchSpace space = parse_search_space(s);
  SearchOptions opt;
  opt.threads = 1;
  const SearchReport r = search(s, space, opt);
  std::printf("| search screening at %d devices, one core | %.0f plans/s (%zu valid plans in %.2f s) |\n", devices,
              static_cast<double>(r.valid) / std::max(1e-9, r.screening_s), r.valid, r.screening_s);
}

void row_alltoall(bool skewed) {
  nlohmann::json j = nlohmann::json::parse(R"({"preset": "dgx-h100", "devices": 1024})");
  j["scale_out"] = {{"oversubscription", 4.0}};
  nlohmann::json doc = pangu();
  doc["cluster"] = j;
  doc["parallelism"] = {{"tp", 1}, {"pp", 1}, {"ep", 1}};
  doc["training"]["global_batch_size"] = 1024;
  Scenario s;
  try {
    s = load_scenario(doc, "a2a.json", kRoot + "/scenarios");
  } catch (const ConfigError&) {
    // The plan does not matter here, only the cluster.
  }
  const topologies::Topology topo = topologies::build_topology(s.cluster);
  std::vector<int> devs(1024);
  std::iota(devs.begin(), devs.end(), 0);
  const topologies::GroupShape shape = topologies::analyze_group(topo, devs);
  topologies::FlowCollectives net(topo);
  const double bytes = 64.0 * (1 << 20);
  const double c0 = cpu_s();
  topologies::CollectiveCost cost;
  if (!skewed) {
    cost = net.alltoall(bytes, devs, shape, topologies::Algorithm::Pairwise);
  } else {
    // Zipf(1.0) over destinations: rank d receives in proportion to 1 / (1 + d mod 64).
    std::vector<std::vector<double>> m(1024, std::vector<double>(1024, 0.0));
    double norm = 0;
    for (int d = 0; d < 1024; ++d) norm += 1.0 / (1 + d % 64);
    for (int a = 0; a < 1024; ++a)
      for (int d = 0; d < 1024; ++d) m[a][d] = bytes * (1.0 / (1 + d % 64)) / norm;
    cost = net.alltoallv(m, devs, shape, topologies::Algorithm::Pairwise);
  }
  std::printf("| 1,024-rank 64 MiB all-to-all, flow level, 4:1 oversubscribed, %s | %.2f s CPU (collective %.3f s, %llu flows, "
              "%llu recomputations) |\n",
              skewed ? "skewed" : "uniform", cpu_s() - c0, cost.time.value(), static_cast<unsigned long long>(net.flows()),
              static_cast<unsigned long long>(net.recomputations()));
}

}  // namespace

int main(int argc, char** argv) {
  bool full = false;
  int repeat = 3;
  std::string only;  // one row: default, full, 131k, screening, uniform, skewed (for profiling)
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--full") == 0) full = true;
    else if (std::strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "usage: moesim_bench_scale [--full] [--repeat N] [--only default|full|131k|screening|uniform|skewed]\n");
      return 2;
    }
  }
  const auto want = [&](const char* row) { return only.empty() || only == row; };
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("| work | measured |\n|---|---|\n");
  if (want("default")) row_default(repeat);
  if ((full && only.empty()) || only == "full") row_full();
  if (want("131k")) row_131k(repeat);
  if (want("screening"))
    for (int d : {6144, 65536, 131072}) row_screening(d);
  if (want("uniform")) row_alltoall(false);
  if (want("skewed")) row_alltoall(true);
  return 0;
}
