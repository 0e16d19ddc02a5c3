// MoE reality: routing skew, all-to-all(v) with incast, stragglers and their metrics.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "moesim/models/routing.hpp"
#include "moesim/sim/random.hpp"
#include "moesim/topologies/collectives.hpp"
#include "moesim/topologies/netflow.hpp"
#include "moesim/topologies/topology.hpp"
#include "moesim/strategies/output/simulate.hpp"

using namespace moesim;
using namespace moesim::strategies;
using topologies::Collective;
using topologies::Algorithm;
using topologies::GroupShape;
using topologies::analyze_group;
using topologies::collective_cost;
using topologies::alltoallv_cost;
using topologies::FlowCollectives;

namespace {

const char* kSmallMoe = R"({
  "model": {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 1024, "intermediate_size": 4096,
            "moe_intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 16,
            "num_key_value_heads": 4, "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4,
            "vocab_size": 32000},
  "cluster": {"preset": "atlas-800t-a2", "devices": 32},
  "training": {"seq_length": 2048, "global_batch_size": 32},
  "parallelism": {"tp": 1, "pp": 2, "ep": 8, "etp": 1, "mbs": 1,
                  "use_distributed_optimizer": true, "overlap_grad_reduce": true},
  "simulation": {"host_dispatch": {"launch_overhead": "0us"}}})";
// Device-bound on purpose: at the 910B's host time per operator this small model would be
// host-bound, which hides the routing, schedule and overlap effects these tests isolate.

Scenario small_moe(const nlohmann::json& moe, std::uint64_t seed = 1) {
  nlohmann::json j = nlohmann::json::parse(kSmallMoe);
  if (!moe.is_null()) j["moe"] = moe;
  j["seed"] = seed;
  return load_scenario(j, "test.json", "");
}

GroupShape two_level(int nodes, int per_node) {
  GroupShape g;
  g.size = nodes * per_node;
  g.nodes = nodes;
  g.per_node = per_node;
  g.mesh = true;
  g.intra_bytes_per_s = 28e9;
  g.intra_latency_s = 2e-6;
  g.inter_bytes_per_s = 25e9;
  g.inter_latency_s = 5e-6;
  return g;
}

std::string error_text(const nlohmann::json& moe) {
  try {
    (void)small_moe(moe);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("all-to-all(v): equal volumes cost what the uniform all-to-all costs", "[moe][collectives]") {
  const GroupShape g = two_level(4, 8);
  const double n = 64e6;  // bytes each member holds; n/p to every member
  std::vector<std::vector<double>> m(32, std::vector<double>(32, n / 32));
  std::vector<int> node(32);
  for (int i = 0; i < 32; ++i) node[i] = i / 8;
  for (Algorithm a : {Algorithm::Pairwise, Algorithm::HierarchicalAllToAll}) {
    const double dedup = a == Algorithm::Pairwise ? 1.0 : 0.45;
    const auto v = alltoallv_cost(m, node, g, a, dedup);
    const auto u = collective_cost(Collective::AllToAll, n, g, a, dedup);
    CHECK(v.time.value() == Approx(u.time.value()).epsilon(1e-9));
    CHECK(v.inter_bytes == Approx(u.inter_bytes).epsilon(1e-9));
  }
}

TEST_CASE("all-to-all(v): N senders into one port take N times one sender", "[moe][collectives]") {
  // One member per server: every byte crosses the receiver's NIC.
  const GroupShape g = two_level(9, 1);
  std::vector<int> node(9);
  std::iota(node.begin(), node.end(), 0);
  const double b = 100e6;
  auto incast = [&](int senders) {
    std::vector<std::vector<double>> m(9, std::vector<double>(9, 0.0));
    for (int i = 1; i <= senders; ++i) m[i][0] = b;
    return alltoallv_cost(m, node, g, Algorithm::Pairwise).time.value();
  };
  const double latency = 8 * g.inter_latency_s;
  const double one = incast(1) - latency;
  CHECK(one == Approx(b / g.inter_bytes_per_s));
  for (int n : {2, 4, 8}) CHECK(incast(n) - latency == Approx(n * one));
}

TEST_CASE("routing: sampled loads conserve copies and uniform max/mean tends to 1", "[moe][routing]") {
  models::RoutingSpec r;
  r.kind = models::RoutingKind::Uniform;
  const auto p = models::expert_probabilities(r, 0, 256, 8, 7);
  double prev = 1e9;
  for (std::uint64_t copies : {1000ull, 100000ull, 10000000ull, 1000000000ull}) {
    Rng rng = Rng::stream(7, "test");
    const auto load = models::sample_expert_load(p, copies, rng);
    REQUIRE(std::accumulate(load.begin(), load.end(), std::uint64_t{0}) == copies);
    const double mom = static_cast<double>(*std::max_element(load.begin(), load.end())) / (copies / 256.0);
    CHECK(mom < prev);
    prev = mom;
  }
  CHECK(prev < 1.01);
  // Zipf(1) over 256 experts: the hottest expert takes 1 / H(256) of the copies.
  r.kind = models::RoutingKind::Zipf;
  const auto z = models::expert_probabilities(r, 0, 256, 1, 7);
  double h = 0;
  for (int i = 1; i <= 256; ++i) h += 1.0 / i;
  CHECK(*std::max_element(z.begin(), z.end()) == Approx(1.0 / h));
  CHECK(std::accumulate(z.begin(), z.end(), 0.0) == Approx(1.0));
  // Top-8 routing picks 8 distinct experts: no expert can take more than 1/8 of the copies
  // (1/H(256) = 0.163 would), the excess goes to the others in proportion.
  const auto z8 = models::expert_probabilities(r, 0, 256, 8, 7);
  CHECK(*std::max_element(z8.begin(), z8.end()) == Approx(0.125));
  CHECK(std::accumulate(z8.begin(), z8.end(), 0.0) == Approx(1.0));
  const auto hot = std::max_element(z.begin(), z.end()) - z.begin();
  for (std::size_t e = 0; e < z.size(); ++e)
    if (static_cast<long>(e) != hot) CHECK(z8[e] >= z[e]);
}

TEST_CASE("routing skew: stragglers slow the step, wait is reported, bytes are conserved", "[moe][e2e]") {
  const Simulation bal = simulate(small_moe(nullptr));
  const Simulation uni = simulate(small_moe({{"routing", "uniform"}}));
  const Simulation zipf = simulate(small_moe({{"routing", "zipf"}, {"zipf_s", 1.2}}));
  const Result& b = bal.result;
  const Result& z = zipf.result;
  // Balanced routing simulates one rank per stage; skew simulates the whole EP group.
  CHECK(b.ranks_simulated == 2);
  CHECK(z.ranks_simulated == 16);
  CHECK(b.expert_load.max_over_mean == 1.0);
  CHECK(b.breakdown.imbalance_wait_s == 0.0);
  CHECK(uni.result.expert_load.max_over_mean < 1.1);
  CHECK(z.expert_load.max_over_mean > 1.5);
  CHECK(z.expert_load.imbalance_score > uni.result.expert_load.imbalance_score);
  CHECK(z.step_time_s > 1.1 * b.step_time_s);
  CHECK(z.breakdown.imbalance_wait_s > 0.05 * z.step_time_s);
  CHECK(z.breakdown.total() == Approx(z.step_time_s).epsilon(1e-6));
  // The same token copies are computed, only unevenly: mean compute per device is unchanged.
  CHECK(z.breakdown.compute_s == Approx(b.breakdown.compute_s).epsilon(0.02));
  // Every copy sent is received: the all-to-all bytes summed over the group do not depend on
  // how skewed the routing is (dispatch + combine, forward + backward).
  auto sum = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); };
  REQUIRE(b.expert_load.a2a_bytes_per_rank.size() == 8);
  // Hand-derived: 2048 tokens x top-4 copies per rank per micro-batch; each rank keeps 1/8 of
  // what it sends; 4 layers x 32 micro-batches / 1 DP... x (dispatch + combine) x 2 (fwd + bwd).
  const double per_rank = 2048.0 * 4 * 7 / 8 * 1024 * 2 /*bytes*/ * 2 /*out+in*/ * 2 /*fwd+bwd*/ * 4 /*layers*/ *
                          b.num_microbatches;
  CHECK(b.expert_load.a2a_bytes_per_rank[3] == Approx(per_rank));
  CHECK(sum(z.expert_load.a2a_bytes_per_rank) == Approx(sum(b.expert_load.a2a_bytes_per_rank)).epsilon(1e-3));
  // Same seed, same result; another seed, another draw.
  CHECK(to_json(simulate(small_moe({{"routing", "zipf"}, {"zipf_s", 1.2}})).result, small_moe(nullptr), false) ==
        to_json(z, small_moe(nullptr), false));
  CHECK(simulate(small_moe({{"routing", "zipf"}, {"zipf_s", 1.2}}, 2)).result.step_time_s != z.step_time_s);
}

TEST_CASE("routing skew: a capacity factor drops copies and reports the drop rate", "[moe][routing]") {
  const Result dropless = simulate(small_moe({{"routing", "zipf"}, {"zipf_s", 1.2}})).result;
  const Result capped = simulate(small_moe({{"routing", "zipf"}, {"zipf_s", 1.2}, {"capacity_factor", 1.25}})).result;
  CHECK(dropless.expert_load.drop_rate == 0.0);
  CHECK(capped.expert_load.drop_rate > 0.05);
  CHECK(capped.expert_load.drop_rate < 0.9);
  CHECK(capped.step_time_s < dropless.step_time_s);
  CHECK(capped.expert_load.max_over_mean <= 1.25 * 1.0001 * 16 / 8);  // at most 2 experts x cap per rank
}

TEST_CASE("routing: bad histograms name the file, the path and the constraint", "[moe][routing][bad-input]") {
  std::vector<double> ok(16, 1.0);
  std::vector<double> short_row(15, 1.0);
  CHECK_THAT(error_text({{"routing", "histogram"}, {"histogram", short_row}}),
             Catch::Contains("/moe/histogram") && Catch::Contains("15 experts") && Catch::Contains("the model has 16"));
  auto neg = ok;
  neg[3] = -1;
  CHECK_THAT(error_text({{"routing", "histogram"}, {"histogram", neg}}),
             Catch::Contains("/moe/histogram/3") && Catch::Contains("finite, non-negative"));
  nlohmann::json bad = ok;
  bad[5] = "lots";
  CHECK_THAT(error_text({{"routing", "histogram"}, {"histogram", bad}}), Catch::Contains("/moe/histogram/5"));
  CHECK_THAT(error_text({{"routing", "histogram"}}), Catch::Contains("/moe/histogram") && Catch::Contains("required"));
  CHECK_THAT(error_text({{"routing", "zipfian"}}), Catch::Contains("/moe/routing"));
  // In a file: the file's own name and the path inside it.
  const auto dir = std::filesystem::temp_directory_path() / "moesim_test_hist";
  std::filesystem::create_directories(dir);
  const auto file = dir / "loads.json";
  {
    std::ofstream f(file);
    f << nlohmann::json{{"layers", {ok, short_row}}}.dump();
  }
  CHECK_THAT(error_text({{"routing", "histogram"}, {"histogram", file.string()}}),
             Catch::Contains("loads.json") && Catch::Contains("/layers/1") && Catch::Contains("15 experts"));
  CHECK_THAT(error_text({{"routing", "histogram"}, {"histogram", (dir / "none.json").string()}}),
             Catch::Contains("none.json"));
  // A valid histogram routes by it. All load on experts 0 and 1 (EP rank 0): top-4 routing
  // caps each at 1/4 of the copies and spreads the other half over the 14 idle experts, so
  // rank 0 receives 1/2 (4x the mean) and the others 1/14 each.
  std::vector<double> hot(16, 0.0);
  hot[0] = hot[1] = 1;
  const Result r = simulate(small_moe({{"routing", "histogram"}, {"histogram", hot}})).result;
  CHECK(r.expert_load.max_over_mean == Approx(4.0).epsilon(0.02));
  CHECK(r.expert_load.imbalance_score == Approx(0.5 - 1.0 / 14).epsilon(0.03));
}

TEST_CASE("placement: load-aware rebalancing and redundant experts even out a skewed routing", "[moe][placement]") {
  const nlohmann::json zipf{{"routing", "zipf"}, {"zipf_s", 1.0}};
  auto with = [&](nlohmann::json extra) {
    nlohmann::json m = zipf;
    if (extra.is_object()) m.update(extra);
    return simulate(small_moe(m)).result;
  };
  const Result st = with({});
  const Result rb = with({{"placement", "rebalanced"}});
  const Result rd = with({{"placement", "rebalanced"}, {"rebalance", {{"redundant_experts", 8}}}});
  const Result never = with({{"placement", "rebalanced"}, {"rebalance", {{"threshold", 5.0}}}});
  CHECK(st.expert_load.placement == "static");
  CHECK(st.expert_load.experts_moved == 0);
  CHECK(rb.expert_load.experts_moved > 0);
  CHECK(rb.expert_load.max_over_mean < st.expert_load.max_over_mean);
  CHECK(rb.step_time_s < st.step_time_s);
  CHECK(rb.breakdown.imbalance_wait_s < st.breakdown.imbalance_wait_s);
  // Moving experts costs their weights and optimizer shards, amortised over interval_steps.
  CHECK(rb.expert_load.migration_seconds > 0);
  CHECK(with({{"placement", "rebalanced"}, {"rebalance", {{"interval_steps", 5}}}}).expert_load.migration_seconds ==
        Approx(10 * rb.expert_load.migration_seconds));
  // Replicas of the hottest experts split their load further.
  CHECK(rd.expert_load.max_over_mean < rb.expert_load.max_over_mean);
  // A threshold no re-placement can meet keeps the static placement exactly.
  CHECK(never.expert_load.experts_moved == 0);
  CHECK(never.step_time_s == st.step_time_s);
}

TEST_CASE("packed documents: attention follows the documents, reordering balances the data-parallel ranks",
          "[moe][documents]") {
  auto with_docs = [](nlohmann::json docs) {
    nlohmann::json j = nlohmann::json::parse(kSmallMoe);
    j["training"]["global_batch_size"] = 256;  // 16 sequences per data-parallel rank
    if (!docs.is_null()) j["training"]["documents"] = docs;
    return simulate(load_scenario(j, "test.json", "")).result;
  };
  const Result plain = with_docs(nullptr);
  const Result packed = with_docs({{"mean_tokens", 512}, {"sigma", 1.0}});
  const Result reordered = with_docs({{"mean_tokens", 512}, {"sigma", 1.0}, {"reorder", true}});
  const Result long_docs = with_docs({{"mean_tokens", 1e8}, {"sigma", 0.0}});
  // Documents far longer than a sequence: every sequence is one causal document, as unpacked.
  CHECK(long_docs.attention_work_mean == Approx(1.0));
  CHECK(long_docs.step_time_s == Approx(plain.step_time_s).epsilon(1e-6));
  // Short documents: attention inside documents is a fraction of whole-sequence attention.
  CHECK(packed.attention_work_mean < 0.5);
  CHECK(packed.step_time_s < plain.step_time_s);
  // Without reordering the slowest data-parallel rank (the one simulated) has more attention
  // work than the mean; balancing the sequences over ranks brings it to the mean.
  CHECK(packed.attention_work_max_over_mean > 1.05);
  CHECK(reordered.attention_work_max_over_mean < packed.attention_work_max_over_mean);
  CHECK(reordered.attention_work_max_over_mean < 1.03);
  CHECK(reordered.step_time_s < packed.step_time_s);
  CHECK(reordered.attention_work_mean == Approx(packed.attention_work_mean));
  // mean_tokens is required.
  nlohmann::json j = nlohmann::json::parse(kSmallMoe);
  j["training"]["documents"] = {{"sigma", 1.0}};
  CHECK_THROWS_WITH(load_scenario(j, "test.json", ""), Catch::Contains("/training/documents/mean_tokens"));
}

TEST_CASE("flow-level all-to-all: bytes conserved, incast, hierarchical and all-gather cross-server volumes",
          "[moe][flow]") {
  Diagnostics diag("test");
  const auto spec = topologies::load_cluster({{"preset", "atlas-800t-a2"}, {"devices", 64}}, "/cluster", diag);
  REQUIRE(diag.ok());
  const topologies::Topology topo = topologies::build_topology(spec);
  std::vector<int> devs(32);
  std::iota(devs.begin(), devs.end(), 0);  // 4 servers x 8
  const GroupShape g = analyze_group(topo, devs);
  REQUIRE(g.nodes == 4);
  const double n = 64e6;
  FlowCollectives net(topo);
  // Every byte a member sends to another member enters the network once.
  const auto flat = net.alltoall(n, devs, g, Algorithm::Pairwise);
  CHECK(net.bytes_injected() == Approx(32.0 * n * 31 / 32));
  CHECK(flat.inter_bytes == Approx(n * 24 / 32));
  // Hierarchical: the cross-server phase carries dedup of the copies; all-gather: every token
  // once per other server (n / top_k each); the second phase redistributes inside the server.
  const double dedup = alltoall_dedup_ratio(256, 8, 4);
  const auto hier = net.alltoall(n, devs, g, Algorithm::HierarchicalAllToAll, dedup);
  const auto gather = net.alltoall(n, devs, g, Algorithm::AllGatherAllToAll, 1.0 / 8);
  CHECK(hier.inter_bytes == Approx(flat.inter_bytes * dedup));
  CHECK(gather.inter_bytes == Approx(3 * n / 8));
  CHECK(hier.time.value() < flat.time.value());
  CHECK(gather.time.value() < flat.time.value());
  // The analytical formulas carry the same volumes.
  const auto a_hier = collective_cost(Collective::AllToAll, n, g, Algorithm::HierarchicalAllToAll, dedup);
  const auto a_gather = collective_cost(Collective::AllToAll, n, g, Algorithm::AllGatherAllToAll, 1.0 / 8);
  CHECK(a_hier.inter_bytes == Approx(hier.inter_bytes));
  CHECK(a_gather.inter_bytes == Approx(gather.inter_bytes));
  // Uniform pairwise: NIC-bound in both models; the flow model also charges the rail-aligned
  // first hop on the scale-up link, so it is never faster.
  const auto a_flat = collective_cost(Collective::AllToAll, n, g, Algorithm::Pairwise);
  CHECK(flat.time.value() >= 0.999 * a_flat.time.value());
  CHECK(flat.time.value() < 1.5 * a_flat.time.value());
  // Incast: 1, 2, 3 servers' members (same rail) sending to member 0 share its NIC.
  auto incast = [&](int senders) {
    std::vector<std::vector<double>> m(32, std::vector<double>(32, 0.0));
    for (int s = 1; s <= senders; ++s) m[8 * s][0] = 100e6;
    FlowCollectives one(topo);
    return one.alltoallv(m, devs, g, Algorithm::Pairwise).time.value();
  };
  const double lat = 7 * g.intra_latency_s + 24 * g.inter_latency_s;
  const double t1 = incast(1) - lat;
  CHECK(incast(2) - lat == Approx(2 * t1).epsilon(0.01));
  CHECK(incast(3) - lat == Approx(3 * t1).epsilon(0.01));
}

TEST_CASE("flow-level all-to-all: concurrent groups share only the links they really use", "[moe][flow]") {
  // Four 2-server expert groups running the same all-to-all at once (data-parallel replicas).
  // One server per leaf on a non-blocking fabric: every group's cross-server traffic goes
  // leaf -> spine -> leaf on its own leaves' uplinks, which no other group uses, so the others
  // cost nothing; on a 4:1 oversubscribed spine with all servers under two leaves they share
  // the two leaf uplinks, and the cross-server phase takes the time of all four groups' bytes.
  auto run = [](int nodes_per_leaf, double oversub, bool others) {
    Diagnostics diag("test");
    nlohmann::json c = {{"preset", "atlas-800t-a2"},
                        {"devices", 64},
                        {"scale_out", {{"nodes_per_leaf", nodes_per_leaf}, {"oversubscription", oversub}}}};
    const auto spec = topologies::load_cluster(c, "/cluster", diag);
    REQUIRE(diag.ok());
    const topologies::Topology topo = topologies::build_topology(spec);
    // Group 0: servers 0 and 4; group k: servers k and 4 + k (leaf groups of 4 servers: the
    // two servers of a group are under different leaves when nodes_per_leaf = 4).
    auto group = [](int k) {
      std::vector<int> d;
      for (int s : {k, 4 + k})
        for (int i = 0; i < 8; ++i) d.push_back(8 * s + i);
      return d;
    };
    const std::vector<int> g0 = group(0);
    std::vector<int> rest;
    for (int k = 1; k < 4; ++k)
      for (int d : group(k)) rest.push_back(d);
    const GroupShape g = analyze_group(topo, g0);
    FlowCollectives net(topo);
    const auto cost = net.alltoall(64e6, g0, g, Algorithm::Pairwise, 1.0,
                                   others ? std::span<const int>(rest) : std::span<const int>{});
    return std::pair{cost.time.value(), net.shared_links()};
  };
  const auto [alone, s0] = run(1, 1.0, false);
  const auto [apart, s1] = run(1, 1.0, true);
  CHECK(s0 == 0);
  CHECK(s1 == 0);  // one server per leaf: no link carries two groups' bytes
  CHECK(apart == Approx(alone).epsilon(1e-9));
  const auto [thin_alone, s2] = run(4, 4.0, false);
  const auto [thin_shared, s3] = run(4, 4.0, true);
  CHECK(s3 > 0);
  // Each member sends 8 x 4 MB to the other server over its own rail's leaf uplink (4 NICs x
  // 22.5 GB/s achieved / 4 = 22.5 GB/s), as fast as its NIC: 32 MB / 22.5 GB/s alone. The three
  // other groups put the same 32 MB on that uplink (their member i is on rail i of the same leaf
  // group), so group 0 drains its bytes in four times that; latencies are the same in both.
  const double alone_transfer = 32e6 / 22.5e9;
  CHECK(thin_shared - thin_alone == Approx(3 * alone_transfer).epsilon(0.01));
}

TEST_CASE("placement: a user's expert map is used, and a map that leaves an expert nowhere is refused",
          "[moe][placement][bad-input]") {
  // 16 experts on 8 ranks: all experts on ranks 0-3 (4 each), ranks 4-7 idle.
  nlohmann::json lopsided = nlohmann::json::array();
  for (int e = 0; e < 16; ++e) lopsided.push_back(e / 4);
  const Result even = simulate(small_moe(nullptr)).result;
  const Result skew = simulate(small_moe({{"expert_map", lopsided}})).result;
  CHECK(skew.ranks_simulated == 16);
  CHECK(skew.expert_load.max_over_mean == Approx(2.0));  // balanced routing: exactly 2x on ranks 0-3
  CHECK(skew.step_time_s > even.step_time_s);
  // Replicating expert 0 on ranks 0 and 1 splits its copies.
  nlohmann::json rep = nlohmann::json::array();
  for (int e = 0; e < 16; ++e) rep.push_back(e / 2);
  rep[0] = {0, 1};
  CHECK(simulate(small_moe({{"expert_map", rep}})).result.expert_load.max_over_mean ==
        Approx(1.25));  // rank 1: half of expert 0 + experts 2, 3 = 5/32 of the copies, mean 4/32
  // Bad maps: every problem at once, with its path.
  nlohmann::json bad = lopsided;
  bad[2] = nlohmann::json::array();
  bad[5] = 8;
  bad[7] = {1, 1};
  const std::string msg = error_text({{"expert_map", bad}});
  CHECK_THAT(msg, Catch::Contains("/moe/expert_map/2") && Catch::Contains("on no rank"));
  CHECK_THAT(msg, Catch::Contains("/moe/expert_map/5") && Catch::Contains("0..7"));
  CHECK_THAT(msg, Catch::Contains("/moe/expert_map/7") && Catch::Contains("same rank twice"));
  CHECK_THAT(error_text({{"expert_map", {0, 1}}}), Catch::Contains("the model's 16 experts"));
}

TEST_CASE("forward-backward overlap hides the expert all-to-all behind the other micro-batch's compute",
          "[moe][schedule]") {
  nlohmann::json j = nlohmann::json::parse(kSmallMoe);
  j["training"]["global_batch_size"] = 128;  // 32 micro-batches per pipeline: a long steady state
  const Result plain = simulate(load_scenario(j, "t.json", "")).result;
  j["parallelism"]["moe_fb_overlap"] = true;
  const Result fb = simulate(load_scenario(j, "t.json", "")).result;
  REQUIRE(plain.breakdown.ep_comm_s > 0.05 * plain.step_time_s);
  // The same work and communication, issued interleaved: more of it hidden, the step shorter.
  CHECK(fb.comm_seconds_per_device == Approx(plain.comm_seconds_per_device).epsilon(1e-9));
  CHECK(fb.breakdown.compute_s == Approx(plain.breakdown.compute_s).epsilon(1e-9));
  CHECK(fb.comm_overlap_fraction > plain.comm_overlap_fraction + 0.1);
  CHECK(fb.breakdown.ep_comm_s < 0.6 * plain.breakdown.ep_comm_s);
  // Two stages: what is hidden is about what the longer backward chain adds to the bubble.
  CHECK(fb.step_time_s < 1.01 * plain.step_time_s);
  CHECK(fb.breakdown.total() == Approx(fb.step_time_s).epsilon(1e-6));
  // The 718B default plan (16 stages, EP32 across 4 servers): a clear gain.
  const std::string scen = std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-ultra-moe-718b.json";
  const Result big = simulate(load_scenario_file(scen, {})).result;
  const Result big_fb = simulate(load_scenario_file(scen, {"parallelism.moe_fb_overlap=true"})).result;
  CHECK(big_fb.step_time_s < 0.95 * big.step_time_s);
  CHECK(big_fb.breakdown.ep_comm_s < 0.6 * big.breakdown.ep_comm_s);
  // MindSpeed's flag name works on a command line too.
  nlohmann::json m = nlohmann::json::parse(kSmallMoe);
  m["parallelism"] = {{"megatron_args", "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 "
                                        "--expert-model-parallel-size 8 --micro-batch-size 1 --moe-fb-overlap"}};
  CHECK(load_scenario(m, "t.json", "").plan.fb_overlap);
}

namespace {
// Exposed expert all-to-all on one simulated rank during the middle half of the step (the
// steady state): time the rank's EP stream is busy and its compute stream is not, and the
// EP stream's busy time there.
std::pair<double, double> steady_exposed_a2a(const Simulation& s, std::size_t rank) {
  const sim::TaskGraph& g = s.lowered.graph;
  const SimRank& r = s.lowered.ranks[rank];
  const Tick lo = s.run.makespan / 4, hi = 3 * s.run.makespan / 4;
  std::vector<std::pair<Tick, Tick>> comp;
  for (sim::TaskId t : g.stream_order(r.streams[static_cast<int>(Stream::Compute)]))
    comp.push_back({s.run.start[t], s.run.end[t]});
  std::sort(comp.begin(), comp.end());
  double busy = 0, exposed = 0;
  for (sim::TaskId t : g.stream_order(r.streams[static_cast<int>(Stream::Ep)])) {
    const Tick a = std::max(lo, s.run.start[t]), b = std::min(hi, s.run.end[t]);
    if (b <= a) continue;
    Tick covered = 0;
    for (const auto& [cs, ce] : comp)
      if (ce > a && cs < b) covered += std::min(b, ce) - std::max(a, cs);
    busy += static_cast<double>(b - a);
    exposed += static_cast<double>(b - a - covered);
  }
  return {exposed, busy};
}
}  // namespace

TEST_CASE("DualPipeV hides the all-to-all of a paired pass behind the other pass's compute", "[moe][schedule]") {
  nlohmann::json j = nlohmann::json::parse(kSmallMoe);
  j["training"]["global_batch_size"] = 512;   // 32 micro-batches per pipeline
  j["model"]["num_hidden_layers"] = 8;         // an MoE layer in every chunk
  j["model"]["moe_intermediate_size"] = 4096;  // each all-to-all far shorter than the paired pass's compute
  j["parallelism"]["vpp"] = 2;
  j["parallelism"]["pipeline_schedule"] = "zb_v";
  const Simulation zv = simulate(load_scenario(j, "t.json", ""));
  j["parallelism"]["pipeline_schedule"] = "dualpipev";
  const Simulation dv = simulate(load_scenario(j, "t.json", ""));
  const Result& a = zv.result;
  const Result& b = dv.result;
  CHECK(b.comm_seconds_per_device == Approx(a.comm_seconds_per_device).epsilon(1e-9));
  CHECK(b.breakdown.compute_s == Approx(a.breakdown.compute_s).epsilon(1e-9));
  CHECK(b.breakdown.total() == Approx(b.step_time_s).epsilon(1e-6));
  // DeepSeek's order: after the warm-up nearly every forward is issued with a backward.
  int paired = 0, passes = 0;
  for (const StageOrder& order : dv.lowered.schedule)
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (order[i].phase == Phase::WeightGrad) continue;
      ++passes;
      if (order[i].phase == Phase::Backward && i + 1 < order.size() && order[i + 1].phase == Phase::Forward &&
          order[i + 1].microbatch != order[i].microbatch)
        ++paired;
    }
  CHECK(2 * paired > 0.85 * passes);
  // Steady state: without pairing (ZB-V) the all-to-alls sit on the critical path; paired,
  // they run under the other pass's compute, but for the pair's last one, which can outlast
  // the other pass (under a tenth of the all-to-all time).
  for (std::size_t rank = 0; rank < dv.lowered.ranks.size(); ++rank) {
    const auto [ze, zb] = steady_exposed_a2a(zv, rank);
    const auto [de, db] = steady_exposed_a2a(dv, rank);
    INFO("rank " << rank << ": ZB-V exposed " << ze / zb << ", DualPipeV exposed " << de / db);
    CHECK(ze > 0.5 * zb);
    CHECK(de < 0.1 * db);
  }
  CHECK(b.step_time_s < a.step_time_s);
  // DeepSeek's DualPipeV needs at least two micro-batches per device (num_chunks >= 2 x ranks).
  j["training"]["global_batch_size"] = 48;  // 3 micro-batches
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""),
                    Catch::Contains("/training/global_batch_size") && Catch::Contains("dualpipev needs at least 2 x pp = 4"));
  j["training"]["global_batch_size"] = 512;
  j["parallelism"]["vpp"] = 1;
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""),
                    Catch::Contains("/parallelism/pipeline_schedule") && Catch::Contains("virtual_pipeline_model_parallel_size 2"));
}

TEST_CASE("shared-expert overlap: the shared expert computes while the routed tokens travel", "[moe][schedule]") {
  const std::string scen = std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-ultra-moe-718b.json";
  // Port sharing off: transfers keep their own durations whatever overlaps them.
  const Result base = simulate(load_scenario_file(scen, {"simulation.port_sharing=false"})).result;
  const Result ov =
      simulate(load_scenario_file(scen, {"parallelism.moe_shared_expert_overlap=true", "simulation.port_sharing=false"}))
          .result;
  // The same operators and communication, another dependency structure.
  CHECK(ov.breakdown.compute_s == Approx(base.breakdown.compute_s).epsilon(1e-9));
  CHECK(ov.comm_seconds_per_device == Approx(base.comm_seconds_per_device).epsilon(1e-9));
  CHECK(ov.hfu / ov.mfu == Approx(base.hfu / base.mfu));
  // Each MoE layer's shared expert (3 GEMMs of 7680 x 2048 on 8K tokens / TP8) runs under the
  // dispatch forward and under the combine's gradient backward: less all-to-all exposed.
  CHECK(ov.breakdown.ep_comm_s < 0.8 * base.breakdown.ep_comm_s);
  CHECK(ov.step_time_s < 0.97 * base.step_time_s);
  CHECK(ov.breakdown.total() == Approx(ov.step_time_s).epsilon(1e-6));
  // MindSpeed's flag on a command line.
  nlohmann::json m = nlohmann::json::parse(kSmallMoe);
  m["parallelism"] = {{"megatron_args", "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 "
                                        "--expert-model-parallel-size 8 --micro-batch-size 1 --moe-alltoall-overlap-comm"}};
  CHECK(load_scenario(m, "t.json", "").plan.shared_expert_overlap);
}
