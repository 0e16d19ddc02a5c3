// The MoE report: what routing skew, expert placement and the all-to-all algorithm do to the
// 718B default plan, what the flow-level network model costs in wall time against the
// analytical one, and the CloudMatrix 384 all-to-all next to DeepEP-Ascend's measurements.
// Not a test: it prints Markdown tables (bench/README.md records a run).
//
//   build/bin/moesim_bench_moe [SCENARIO] [--no-cm384] [--no-718b]

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moesim/topologies/collectives.hpp"
#include "moesim/topologies/netflow.hpp"
#include "moesim/strategies/output/simulate.hpp"
#include "moesim/topologies/topology.hpp"

using namespace moesim;
using namespace moesim::strategies;
using topologies::Collective;
using topologies::Algorithm;
using topologies::GroupShape;
using topologies::analyze_group;
using topologies::collective_cost;
using topologies::FlowCollectives;
using Clock = std::chrono::steady_clock;

namespace {

struct Variant {
  const char* name;
  std::vector<std::string> sets;
};

void report_718b(const std::string& path) {
  std::printf("## 718B default plan (%s)\n\n", path.c_str());
  std::printf("| variant | step s | tokens/s | MFU | compute | ep_comm | bubble | imbalance_wait | max/mean | moved | wall s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  const std::vector<Variant> variants{
      {"balanced routing (ideal), hierarchical a2a", {}},
      {"uniform routing, hierarchical", {"moe.routing=\"uniform\""}},
      {"uniform routing, flat a2a", {"moe.routing=\"uniform\"", "parallelism.moe_alltoall=\"flat\""}},
      {"uniform routing, all-gather + intra a2a (MindSpeed)",
       {"moe.routing=\"uniform\"", "parallelism.moe_alltoall=\"allgather\""}},
      {"Zipf(1.0), static, hierarchical", {"moe.routing=\"zipf\"", "moe.zipf_s=1.0"}},
      {"Zipf(1.0), static, all-gather + intra a2a",
       {"moe.routing=\"zipf\"", "moe.zipf_s=1.0", "parallelism.moe_alltoall=\"allgather\""}},
      {"Zipf(1.0), static, flat", {"moe.routing=\"zipf\"", "moe.zipf_s=1.0", "parallelism.moe_alltoall=\"flat\""}},
      {"Zipf(1.0), rebalanced, hierarchical", {"moe.routing=\"zipf\"", "moe.zipf_s=1.0", "moe.placement=\"rebalanced\""}},
      {"Zipf(1.0), rebalanced + 32 redundant, hierarchical",
       {"moe.routing=\"zipf\"", "moe.zipf_s=1.0", "moe.placement=\"rebalanced\"", "moe.rebalance.redundant_experts=32"}},
      {"Zipf(0.5), static, hierarchical", {"moe.routing=\"zipf\"", "moe.zipf_s=0.5"}},
      {"Zipf(0.5), rebalanced, hierarchical", {"moe.routing=\"zipf\"", "moe.zipf_s=0.5", "moe.placement=\"rebalanced\""}},
      {"uniform routing, hierarchical, analytical network",
       {"moe.routing=\"uniform\"", "simulation.network=\"analytical\""}},
      {"Zipf(1.0), static, hierarchical, analytical network",
       {"moe.routing=\"zipf\"", "moe.zipf_s=1.0", "simulation.network=\"analytical\""}},
  };
  for (const Variant& v : variants) {
    const Scenario s = load_scenario_file(path, v.sets);
    const auto t0 = Clock::now();
    const Result r = simulate(s).result;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const Breakdown& b = r.breakdown;
    std::printf("| %s | %.2f | %.2fM | %.1f%% | %.2f | %.2f | %.2f | %.2f | %.2f | %d | %.2f |\n", v.name,
                r.step_time_s, r.tokens_per_s / 1e6, 100 * r.mfu, b.compute_s, b.ep_comm_s, b.bubble_s,
                b.imbalance_wait_s, r.expert_load.max_over_mean, r.expert_load.experts_moved, wall);
    std::fflush(stdout);
  }
  std::printf("\n");
}

/// DeepEP-Ascend normal mode on CloudMatrix 384: 4096 tokens per rank, hidden 7168, top-8 of
/// 256 experts; dispatch in INT8 (1 byte per element), combine in BF16 (2 bytes). The measured
/// GB/s (hardware.md [S]) are bytes a rank moves / time.
void report_cm384() {
  std::printf("## CloudMatrix 384 all-to-all vs DeepEP-Ascend (4096 tokens, hidden 7168, top-8)\n\n");
  Diagnostics diag("cm384");
  const topologies::ClusterSpec spec =
      topologies::load_cluster(nlohmann::json{{"preset", "cloudmatrix-384"}, {"devices", 768}}, "/cluster", diag);
  if (!diag.ok()) {
    std::printf("cloudmatrix-384 preset unavailable\n\n");
    return;
  }
  const topologies::Topology topo = topologies::build_topology(spec);
  FlowCollectives net(topo);
  struct Measured {
    int ep;
    double dispatch, combine;
  };
  const std::vector<Measured> measured{{8, 146, 125}, {16, 107, 103}, {32, 102, 95}, {64, 81, 91}, {128, 57, 81}};
  std::printf("| EP | dispatch GB/s (measured) | flow model | analytical | combine GB/s (measured) | flow model | analytical |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  const double tokens = 4096, hidden = 7168, top_k = 8;
  for (const Measured& m : measured) {
    std::vector<int> devs;
    for (int i = 0; i < m.ep; ++i) devs.push_back(i);
    const GroupShape g = analyze_group(topo, devs);
    double bw[2][2];
    for (int phase = 0; phase < 2; ++phase) {
      const double bytes = tokens * top_k * hidden * (phase == 0 ? 1.0 : 2.0);  // per rank
      const auto f = net.alltoall(bytes, devs, g, Algorithm::Pairwise);
      const auto a = collective_cost(Collective::AllToAll, bytes, g, Algorithm::Pairwise);
      bw[phase][0] = bytes / f.time.value() / 1e9;
      bw[phase][1] = bytes / a.time.value() / 1e9;
    }
    std::printf("| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", m.ep, m.dispatch, bw[0][0], bw[0][1], m.combine,
                bw[1][0], bw[1][1]);
  }
  std::printf("\n");
}

/// One expert all-to-all of the 718B default plan (dispatch, forward) by algorithm and network
/// model: the time of one operation, and its cross-server bytes per rank.
void report_a2a_ops(const std::string& path) {
  std::printf("## 718B: one dispatch all-to-all (EP32 over 4 servers, mbs 2 x 4K tokens / TP8)\n\n");
  std::printf("| algorithm | network | ms per all-to-all | MB per rank |\n|---|---|---|---|\n");
  for (const char* algo : {"flat", "hierarchical", "allgather"})
    for (const char* net : {"flow", "analytical"}) {
      const Scenario s = load_scenario_file(
          path, {std::string("parallelism.moe_alltoall=\"") + algo + "\"", std::string("simulation.network=\"") + net + "\""});
      const Result r = simulate(s).result;
      for (const auto& c : r.collectives)
        if (c.group == "ep" && c.operation == "all-to-all") {
          std::printf("| %s | %s | %.2f | %.1f |\n", algo, net, 1e3 * c.seconds, c.bytes / 1e6);
          break;
        }
    }
  std::printf("\n(MB: what each rank holds for the all-to-all; flat sends 3/4 of it across servers, hierarchical\n"
              "0.45 of that (a token's copies for one server travel once), all-gather 1/top_k x 3 of it)\n\n");
}

/// nccl-tests reference points (hardware.md [S]): H100 ring all-reduce bus bandwidth about
/// 370 GB/s inside a DGX; NDR 400G about 46-48 GB/s per NIC across servers.
void report_nccl() {
  std::printf("## H100 against nccl-tests\n\n| measurement | measured | moesim |\n|---|---|---|\n");
  Diagnostics diag("h100");
  const auto spec = topologies::load_cluster(nlohmann::json{{"preset", "dgx-h100"}, {"devices", 16}}, "/cluster", diag);
  const topologies::Topology topo = topologies::build_topology(spec);
  std::vector<int> eight{0, 1, 2, 3, 4, 5, 6, 7};
  const GroupShape g8 = analyze_group(topo, eight);
  const double n = 8.0 * (1 << 30);  // 8 GiB, bandwidth-bound
  const auto ar = collective_cost(Collective::AllReduce, n, g8, Algorithm::Ring);
  std::printf("| ring all-reduce bus bandwidth, 8 x H100 (NVLink4) | ~370 GB/s | %.0f GB/s |\n",
              n / ar.time.value() * 2 * 7 / 8 / 1e9);
  // Across two servers, one GPU per server per rail: an all-to-all whose bytes all cross NICs.
  std::vector<int> rail{0, 8};
  const GroupShape g2 = analyze_group(topo, rail);
  FlowCollectives net(topo);
  const double b = 1.0 * (1 << 30);
  const auto a2 = net.alltoall(b, rail, g2, Algorithm::Pairwise);
  std::printf("| per-NIC bandwidth across servers, NDR 400G | 46-48 GB/s | %.1f GB/s |\n",
              b / 2 / (a2.time.value() - g2.inter_latency_s) / 1e9);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-ultra-moe-718b.json";
  bool cm = true, big = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-cm384")) cm = false;
    else if (!std::strcmp(argv[i], "--no-718b")) big = false;
    else path = argv[i];
  }
  try {
    if (cm) report_cm384();
    if (cm) report_nccl();
    if (big) report_a2a_ops(path);
    if (big) report_718b(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moesim_bench_moe: %s\n", e.what());
    return 1;
  }
  return 0;
}
