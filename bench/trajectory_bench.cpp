// The Pangu trajectory: the 718B scenarios of bench/pangu_trajectory/, one technique added per
// step, simulated in order; prints predicted MFU, tokens/s, peak and activation memory and where
// the time goes after each step, next to Huawei's published effect of the technique
// (bench/pangu_trajectory/published.json). Not a test: bench/pangu_trajectory/report.md
// records a run.
//
//   build/bin/moesim_bench_trajectory [DIR]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "moesim/strategies/output/simulate.hpp"

using namespace moesim;
using namespace moesim::strategies;

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : std::string(MOESIM_SOURCE_DIR) + "/bench/pangu_trajectory";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json" && e.path().filename() != "published.json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  nlohmann::json published = nlohmann::json::object();
  if (std::ifstream f(dir / "published.json"); f) published = nlohmann::json::parse(f);
  std::printf("| step | MFU moesim / Megatron / Huawei-style | tokens/s | vs previous | peak GiB | act GiB | act saved | exposed a2a s | bubble s | imbalance s | swap s | step s | Huawei |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  double prev = 0;
  std::map<std::string, Result> results;
  try {
    for (const auto& file : files) {
      const Scenario s = load_scenario_file(file.string(), {});
      const auto t0 = std::chrono::steady_clock::now();
      const Result r = simulate(s).result;
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // The stage with the most activations, and what recomputation and swapping save there
      // against the same schedule without them.
      double act = 0, act_full = 0;
      for (const auto& st : r.stages)
        if (st.memory.activations_bytes > act) {
          act = st.memory.activations_bytes;
          act_full = st.memory.activations_unoptimised_bytes;
        }
      const std::string name = file.stem().string();
      const std::string pub = published.contains(name) ? published[name].value("published", "") : "";
      char gain[32] = "";
      if (prev > 0) std::snprintf(gain, sizeof gain, "%+.1f%%", 100.0 * (r.tokens_per_s / prev - 1.0));
      const Breakdown& b = r.breakdown;
      std::printf("| %s | %.1f%% / %.1f%% / %.1f%% | %.2fM | %s | %.1f%s | %.1f | %.0f%% | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n",
                  name.c_str(), 100 * r.mfu, 100 * r.mfu_megatron, 100 * r.mfu_huawei, r.tokens_per_s / 1e6, gain, r.peak_memory_bytes / (1 << 30) / 1.0,
                  r.memory_fits ? "" : " (does not fit)", act / (1 << 30),
                  act_full > 0 ? 100.0 * (1.0 - act / act_full) : 0.0, b.ep_comm_s, b.bubble_s, b.imbalance_wait_s,
                  b.swap_s, r.step_time_s, pub.c_str());
      std::fflush(stdout);
      std::fprintf(stderr, "%s: %.1f s\n", name.c_str(), wall);
      prev = r.tokens_per_s;
      results.emplace(name, r);
    }
    // Each published gain against moesim's over the same span, and the published level.
    std::printf("\n| step | span | Huawei | moesim | difference (points) |\n|---|---|---|---|---|\n");
    for (const auto& [name, pub] : published.items()) {
      if (!pub.is_object() || !pub.contains("gain_pct") || results.count(name) == 0) continue;
      const std::string since = pub.value("since", "");
      if (results.count(since) == 0) continue;
      const double g = 100.0 * (results.at(name).tokens_per_s / results.at(since).tokens_per_s - 1.0);
      const double h = pub["gain_pct"].get<double>();
      std::printf("| %s | from %s | %+.1f%% | %+.1f%% | %+.1f |\n", name.c_str(), since.c_str(), h, g, g - h);
    }
    for (const auto& [name, pub] : published.items())
      if (pub.is_object() && pub.contains("tokens_per_npu") && results.count(name) > 0) {
        const double t = results.at(name).tokens_per_s_per_device, h = pub["tokens_per_npu"].get<double>();
        std::printf("\nPublished throughput for %s's configuration: %.0f tokens/s per NPU; moesim %.0f (%+.1f%%)\n",
                    name.c_str(), h, t, 100.0 * (t / h - 1.0));
      }
    for (const auto& [name, pub] : published.items())
      if (pub.is_object() && pub.contains("mfu_pct") && results.count(name) > 0) {
        const Result& r = results.at(name);
        std::printf("\nPublished level at %s: %.0f%% MFU; moesim %.1f%% (model FLOPs, %.0f GFLOP/token), %.1f%% "
                    "(Megatron's formula, %.0f), %.1f%% (Huawei-style: model FLOPs with full-mask attention, %.0f)\n",
                    name.c_str(), pub["mfu_pct"].get<double>(), 100 * r.mfu, r.model_flops_per_token / 1e9,
                    100 * r.mfu_megatron, r.megatron_flops_per_token / 1e9, 100 * r.mfu_huawei,
                    r.huawei_flops_per_token / 1e9);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moesim_bench_trajectory: %s\n", e.what());
    return 1;
  }
  return 0;
}
