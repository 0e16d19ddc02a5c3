// strategies/: collective algorithms, pipeline schedules, plan validation and the memory model.
#include <catch2/catch.hpp>

#include <set>
#include <tuple>

#include "shapes.hpp"
#include "moesim/sim/engine.hpp"
#include "moesim/topologies/collectives.hpp"
#include "moesim/strategies/lower/lower.hpp"
#include "moesim/strategies/plan/schedule.hpp"
#include "moesim/strategies/search/screen.hpp"
#include "moesim/strategies/search/search.hpp"
#include "moesim/strategies/output/simulate.hpp"

using namespace moesim;
using namespace moesim::strategies;
using topologies::Collective;
using topologies::Algorithm;
using topologies::CollectiveCost;
using topologies::GroupShape;
using topologies::collective_cost;

TEST_CASE("collectives: ring all-reduce is 2(p-1)/p n/B + 2(p-1) alpha", "[strategies][collectives]") {
  GroupShape g;
  g.size = 16;
  g.nodes = 16;  // one rank per server: a single level over the NICs
  g.per_node = 1;
  g.inter_bytes_per_s = 25e9;
  g.inter_latency_s = 5e-6;
  const double n = 1e9;
  const double expect = 2.0 * 15 / 16 * n / 25e9 + 2 * 15 * 5e-6;
  const CollectiveCost c = collective_cost(Collective::AllReduce, n, g, Algorithm::Ring);
  CHECK(c.time.value() == Approx(expect).epsilon(1e-12));
  CHECK(c.inter_bytes == Approx(2.0 * 15 / 16 * n));
  // Auto never does worse than ring.
  CHECK(collective_cost(Collective::AllReduce, n, g).time.value() <= c.time.value());
}

TEST_CASE("collectives: full-mesh reduce-scatter uses every link at once", "[strategies][collectives]") {
  GroupShape g;
  g.size = 8;
  g.nodes = 1;
  g.per_node = 8;
  g.mesh = true;
  g.intra_bytes_per_s = 44.8e9;  // per link
  g.intra_latency_s = 2e-6;
  const double n = 256e6;
  // HCCL mesh: alpha + (1/p) n beta.
  const CollectiveCost c = collective_cost(Collective::ReduceScatter, n, g, Algorithm::Mesh);
  CHECK(c.time.value() == Approx(2e-6 + n / 8 / 44.8e9));
  CHECK(collective_cost(Collective::ReduceScatter, n, g).algorithm == Algorithm::Mesh);
}

TEST_CASE("collectives: hierarchical all-reduce = intra RS + inter AR on 1/k + intra AG", "[strategies][collectives]") {
  GroupShape g = test::four_mesh_servers();
  const double n = 1e9;
  const double intra = 2e-6 + n / 8 / 40e9;                               // mesh RS (= AG)
  const double inter_ring = 3 * 5e-6 + 0.75 * (n / 8) / 20e9;            // ring RS on n/8 over 4 servers
  const double inter_hd = 2 * 5e-6 + 0.75 * (n / 8) / 20e9;              // halving-doubling, p = 4
  const double expect = 2 * intra + 2 * std::min(inter_ring, inter_hd);
  const CollectiveCost c = collective_cost(Collective::AllReduce, n, g);
  CHECK(c.algorithm == Algorithm::Hierarchical);
  CHECK(c.time.value() == Approx(expect));
}

TEST_CASE("collectives: hierarchical all-to-all sends fewer bytes across servers", "[strategies][collectives]") {
  // 256 experts over 4 servers, top-8: a server holds none of a token's experts with
  // probability prod_{i<8} (192 - i) / (256 - i) = 0.09645, so a token reaches 3.614 servers
  // on average instead of sending 8 copies: 0.4518 of the cross-server bytes remain.
  CHECK(alltoall_dedup_ratio(256, 8, 4) == Approx(0.4518).epsilon(1e-3));
  CHECK(alltoall_dedup_ratio(256, 8, 1) == 1.0);
  GroupShape g;
  g.size = 32;
  g.nodes = 4;
  g.per_node = 8;
  g.mesh = true;
  g.intra_bytes_per_s = 44.8e9;
  g.inter_bytes_per_s = 22.5e9;
  const double n = 126e6;
  const auto flat = collective_cost(Collective::AllToAll, n, g, Algorithm::Pairwise);
  const auto hier = collective_cost(Collective::AllToAll, n, g, Algorithm::HierarchicalAllToAll, 0.4518);
  CHECK(flat.inter_bytes == Approx(n * 24 / 32));
  CHECK(hier.inter_bytes == Approx(n * 24 / 32 * 0.4518));
  CHECK(hier.time.value() < flat.time.value());
  // Pangu reports the hierarchical scheme about twice as fast across servers.
  CHECK(flat.time.value() / hier.time.value() == Approx(2.0).epsilon(0.35));
}

TEST_CASE("schedules: every stage runs each forward and backward once, forward first", "[strategies][schedule]") {
  for (auto [kind, v] : {std::pair{ScheduleKind::OneFOneB, 1}, std::pair{ScheduleKind::Interleaved, 2},
                         std::pair{ScheduleKind::Interleaved, 3}}) {
    const int p = 4, m = 8;
    const auto orders = make_schedule(kind, p, v, m);
    REQUIRE(orders.size() == static_cast<std::size_t>(p));
    for (const auto& o : orders) {
      CHECK(o.size() == static_cast<std::size_t>(2 * m * v));
      std::set<std::tuple<int, int, int>> seen;
      for (const auto& op : o) {
        if (op.phase == Phase::Backward) CHECK(seen.count({0, op.microbatch, op.chunk}) == 1);
        CHECK(seen.insert({op.phase == Phase::Forward ? 0 : 1, op.microbatch, op.chunk}).second);
      }
    }
  }
}

TEST_CASE("schedules: 1F1B keeps at most p - s micro-batches in flight on stage s", "[strategies][schedule]") {
  const int p = 8, m = 32;
  const auto orders = make_schedule(ScheduleKind::OneFOneB, p, 1, m);
  for (int s = 0; s < p; ++s) {
    int alive = 0, peak = 0;
    for (const auto& op : orders[s]) {
      alive += op.phase == Phase::Forward ? 1 : -1;
      peak = std::max(peak, alive);
    }
    CHECK(peak == p - s);
  }
}

namespace {
// Pipeline of p stages with equal chunks and no communication: forward tf, backward tb per
// stage (split evenly over v chunks). Returns the bubble fraction of stage 0.
double pipeline_bubble(ScheduleKind kind, int p, int v, int m, Tick tf, Tick tb) {
  const auto orders = make_schedule(kind, p, v, m);
  sim::TaskGraphBuilder b({"compute"});
  std::vector<sim::ResourceId> streams;
  for (int s = 0; s < p; ++s) streams.push_back(b.add_resource("s" + std::to_string(s), s, sim::ResourceKind::Stream));
  const int V = p * v;
  std::vector<sim::TaskId> fwd(static_cast<std::size_t>(V) * m), bwd(static_cast<std::size_t>(V) * m);
  for (int s = 0; s < p; ++s)
    for (const auto& op : orders[s]) {
      const int vs = op.chunk * p + s;
      const bool f = op.phase == Phase::Forward;
      const sim::TaskId t = b.add_task(f ? tf / v : tb / v, 0, b.label("x"), op.microbatch, {streams[s]});
      (f ? fwd : bwd)[static_cast<std::size_t>(vs) * m + op.microbatch] = t;
    }
  for (int vs = 0; vs < V; ++vs)
    for (int mb = 0; mb < m; ++mb) {
      const auto i = static_cast<std::size_t>(vs) * m + mb;
      if (vs > 0) b.depend(fwd[i - m], fwd[i]);
      if (vs + 1 < V) b.depend(bwd[i + m], bwd[i]);
      b.depend(fwd[i], bwd[i]);
    }
  const sim::TaskGraph g = std::move(b).build();
  const sim::RunResult r = sim::Engine(g).run();
  REQUIRE(r.completed);
  const double busy = static_cast<double>(m) * (tf + tb);
  return 1.0 - busy / static_cast<double>(r.makespan);
}
}  // namespace

TEST_CASE("schedules: plain 1F1B bubble is (p-1)/(m+p-1)", "[strategies][schedule]") {
  for (auto [p, m] : {std::pair{4, 8}, std::pair{8, 32}, std::pair{16, 64}}) {
    INFO("p=" << p << " m=" << m);
    const double expect = (p - 1.0) / (m + p - 1.0);
    CHECK(pipeline_bubble(ScheduleKind::OneFOneB, p, 1, m, 1000, 2000) == Approx(expect).epsilon(0.001));
  }
}

TEST_CASE("schedules: interleaved 1F1B bubble is (p-1)/(v m + p - 1)", "[strategies][schedule]") {
  for (auto [p, v, m] : {std::tuple{4, 2, 8}, std::tuple{8, 2, 32}, std::tuple{4, 4, 16}}) {
    INFO("p=" << p << " v=" << v << " m=" << m);
    const double expect = (p - 1.0) / (v * m + p - 1.0);
    CHECK(pipeline_bubble(ScheduleKind::Interleaved, p, v, m, 1200, 1200) == Approx(expect).epsilon(0.001));
  }
}

namespace {
Scenario scenario_from(const std::string& text) {
  return load_scenario(nlohmann::json::parse(text), "test.json", "");
}
}  // namespace

TEST_CASE("memory: a dense model with the distributed optimizer needs (6 + 12/d) bytes per parameter",
          "[strategies][memory]") {
  // h 1024, 4 layers, 16 heads (MHA), FFN 4096, vocab 32000, untied:
  //   per layer 4h^2 + 3hf + 2h = 4,194,304 + 12,582,912 + 2,048 = 16,779,264
  //   4 layers 67,117,056 + embedding 32,768,000 + LM head 32,768,000 + final norm 1,024
  //   P = 132,654,080; with d = 8: weights 2P, FP32 gradients 4P, optimizer 12P/8.
  const Scenario s = scenario_from(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 4096,
              "num_hidden_layers": 4, "num_attention_heads": 16, "vocab_size": 32000},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "training": {"seq_length": 1024, "global_batch_size": 8},
    "parallelism": {"tp": 1, "pp": 1, "use_distributed_optimizer": true}})");
  const Simulation sim = simulate(s);
  const double P = 132'654'080.0;
  const auto& m = sim.lowered.stages[0].memory;
  CHECK(sim.lowered.stages[0].params_dense == Approx(P));
  CHECK(m.weights_bytes == Approx(2 * P));
  CHECK(m.gradients_bytes == Approx(4 * P));
  CHECK(m.optimizer_bytes == Approx(12 * P / 8));
  CHECK(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes == Approx((6 + 12.0 / 8) * P));
  // Without the distributed optimizer every rank keeps all 12 bytes: 18 bytes per parameter.
  const Scenario s2 = scenario_from(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 4096,
              "num_hidden_layers": 4, "num_attention_heads": 16, "vocab_size": 32000},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "training": {"seq_length": 1024, "global_batch_size": 8}})");
  const Simulation sim2 = simulate(s2);  // keep the simulation alive: m2 refers into it
  const auto& m2 = sim2.lowered.stages[0].memory;
  CHECK(m2.weights_bytes + m2.gradients_bytes + m2.optimizer_bytes == Approx(18 * P));
}

TEST_CASE("plan: divisibility problems are reported together with their paths", "[strategies][plan]") {
  try {
    scenario_from(R"({
      "model": "pangu-ultra-moe-718b",
      "cluster": {"preset": "atlas-800t-a2", "devices": 6144},
      "training": {"seq_length": 4096, "global_batch_size": 1000},
      "parallelism": {"tp": 8, "pp": 16, "ep": 48, "sequence_parallel": true}})");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    std::set<std::string> pointers;
    for (const auto& d : e.diagnostics()) pointers.insert(d.pointer);
    CHECK(pointers.count("/parallelism/expert_model_parallel_size") == 1);
    CHECK(pointers.count("/training/global_batch_size") == 1);
    CHECK(std::string(e.what()).find("must divide num_experts=256") != std::string::npos);
  }
}

TEST_CASE("plan: a Megatron command line sets the plan", "[strategies][plan]") {
  const Scenario s = scenario_from(R"({
    "model": "llama3-70b",
    "cluster": {"preset": "dgx-h100", "devices": 64},
    "training": {"seq_length": 8192, "global_batch_size": 128},
    "parallelism": {"megatron_args": "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer --micro-batch-size 1 --recompute-granularity selective --lr 3e-4 --bf16"}})");
  CHECK(s.plan.tp == 4);
  CHECK(s.plan.pp == 4);
  CHECK(s.plan.dp == 4);
  CHECK(s.plan.sequence_parallel);
  CHECK(s.plan.distributed_optimizer);
  CHECK(s.plan.recompute == Recompute::Selective);
  CHECK(s.plan.num_microbatches == 32);
}

TEST_CASE("schedules: zero-bubble H1 runs every F, B and W once and fills the drain with Ws", "[strategies][schedule]") {
  const int p = 4, m = 8;
  const auto orders = make_schedule(ScheduleKind::ZeroBubbleH1, p, 1, m);
  for (int s = 0; s < p; ++s) {
    std::set<std::pair<int, int>> seen;
    for (const auto& op : orders[s]) {
      CHECK(seen.insert({static_cast<int>(op.phase), op.microbatch}).second);
      if (op.phase == Phase::WeightGrad) CHECK(seen.count({static_cast<int>(Phase::Backward), op.microbatch}) == 1);
      if (op.phase == Phase::Backward) CHECK(seen.count({static_cast<int>(Phase::Forward), op.microbatch}) == 1);
    }
    CHECK(seen.size() == 3u * m);
    // No more micro-batches between F and B than 1F1B keeps (p - s).
    int open = 0, most = 0;
    for (const auto& op : orders[s]) {
      open += op.phase == Phase::Forward ? 1 : op.phase == Phase::Backward ? -1 : 0;
      most = std::max(most, open);
    }
    CHECK(most <= p - s);
  }
  // The first stage's last passes are deferred Ws filling its drain.
  CHECK(orders[0].back().phase == Phase::WeightGrad);

  // Timing: F = B = W = 1 unit, no communication. 1F1B runs B+W as one backward.
  auto bubble = [&](ScheduleKind kind) {
    const auto ord = make_schedule(kind, p, 1, m);
    sim::TaskGraphBuilder b({"compute"});
    std::vector<sim::ResourceId> st;
    for (int s = 0; s < p; ++s) st.push_back(b.add_resource("s" + std::to_string(s), s, sim::ResourceKind::Stream));
    std::vector<std::vector<sim::TaskId>> F(p, std::vector<sim::TaskId>(m)), B = F, W = F;
    for (int s = 0; s < p; ++s)
      for (const auto& op : ord[s]) {
        const Tick d = op.phase == Phase::Backward && kind == ScheduleKind::OneFOneB ? 2000 : 1000;
        const sim::TaskId t = b.add_task(d, 0, b.label("x"), op.microbatch, {st[s]});
        (op.phase == Phase::Forward ? F : op.phase == Phase::Backward ? B : W)[s][op.microbatch] = t;
      }
    for (int s = 0; s < p; ++s)
      for (int mb = 0; mb < m; ++mb) {
        if (s > 0) b.depend(F[s - 1][mb], F[s][mb]);
        if (s + 1 < p) b.depend(B[s + 1][mb], B[s][mb]);
        b.depend(F[s][mb], B[s][mb]);
        if (kind == ScheduleKind::ZeroBubbleH1) b.depend(B[s][mb], W[s][mb]);
      }
    const sim::TaskGraph g = std::move(b).build();
    const sim::RunResult r = sim::Engine(g).run();
    REQUIRE(r.completed);
    return 1.0 - 3000.0 * m / static_cast<double>(r.makespan);
  };
  const double b1 = bubble(ScheduleKind::OneFOneB), bz = bubble(ScheduleKind::ZeroBubbleH1);
  CHECK(b1 == Approx((p - 1.0) / (m + p - 1.0)).epsilon(0.001));
  // Qi et al.'s ZB-H1 reaches (p-1)(F+B-W) of idle time, a third of 1F1B's here; the list
  // schedule, which keeps at most p - s Ws waiting, gets (p-1)(F+B-W) + 2 units: 5/29.
  CHECK(bz < 0.7 * b1);
  CHECK(bz == Approx(5.0 / 29.0).epsilon(0.001));
}

TEST_CASE("schedules: ZB-V places chunks as a V, keeps 1F1B's memory and beats interleaved 1F1B", "[strategies][schedule]") {
  const int p = 4, m = 8, V = 2 * p;
  // The V: stage s holds virtual stages s and 2p - 1 - s; the loss is back on stage 0.
  CHECK(stage_of_virtual(ScheduleKind::ZeroBubbleV, p, V - 1) == 0);
  CHECK(stage_of_virtual(ScheduleKind::ZeroBubbleV, p, p) == p - 1);
  CHECK(stage_of_virtual(ScheduleKind::Interleaved, p, V - 1) == p - 1);
  for (int v = 0; v < V; ++v) {
    const ScheduleKind k = ScheduleKind::ZeroBubbleV;
    CHECK(virtual_stage(k, p, stage_of_virtual(k, p, v), chunk_of_virtual(k, p, v)) == v);
  }
  const auto orders = make_schedule(ScheduleKind::ZeroBubbleV, p, 2, m);
  for (int s = 0; s < p; ++s) {
    std::set<std::tuple<int, int, int>> seen;
    int open = 0, most = 0;
    for (const auto& op : orders[s]) {
      const int ph = static_cast<int>(op.phase);
      CHECK(seen.insert({ph, op.microbatch, op.chunk}).second);
      if (op.phase == Phase::WeightGrad) CHECK(seen.count({static_cast<int>(Phase::Backward), op.microbatch, op.chunk}) == 1);
      if (op.phase == Phase::Backward) CHECK(seen.count({static_cast<int>(Phase::Forward), op.microbatch, op.chunk}) == 1);
      open += op.phase == Phase::Forward ? 1 : op.phase == Phase::Backward ? -1 : 0;
      most = std::max(most, open);
    }
    CHECK(seen.size() == 3u * 2 * m);
    CHECK(most <= 2 * p);  // half-size chunks: 1F1B's p whole micro-batches on the first stage
  }

  // Timing on chunk passes of F = B = W = 1 unit (a whole stage is 2 units of each); the
  // interleaved schedule runs B+W as one 2-unit backward per chunk.
  auto makespan = [&](ScheduleKind kind) {
    const auto ord = make_schedule(kind, p, 2, m);
    sim::TaskGraphBuilder b({"compute"});
    std::vector<sim::ResourceId> st;
    for (int s = 0; s < p; ++s) st.push_back(b.add_resource("s" + std::to_string(s), s, sim::ResourceKind::Stream));
    std::vector<std::vector<sim::TaskId>> F(V, std::vector<sim::TaskId>(m)), B = F, W = F;
    const bool split = splits_weight_gradients(kind);
    for (int s = 0; s < p; ++s)
      for (const auto& op : ord[s]) {
        const Tick d = op.phase == Phase::Backward && !split ? 2000 : 1000;
        const sim::TaskId t = b.add_task(d, 0, b.label("x"), op.microbatch, {st[s]});
        const int v = virtual_stage(kind, p, s, op.chunk);
        (op.phase == Phase::Forward ? F : op.phase == Phase::Backward ? B : W)[v][op.microbatch] = t;
      }
    for (int v = 0; v < V; ++v)
      for (int mb = 0; mb < m; ++mb) {
        if (v > 0) b.depend(F[v - 1][mb], F[v][mb]);
        if (v + 1 < V) b.depend(B[v + 1][mb], B[v][mb]);
        b.depend(F[v][mb], B[v][mb]);
        if (split) b.depend(B[v][mb], W[v][mb]);
      }
    const sim::TaskGraph g = std::move(b).build();
    const sim::RunResult r = sim::Engine(g).run();
    REQUIRE(r.completed);
    return 1.0 - 3000.0 * 2 * m / static_cast<double>(r.makespan);
  };
  const double bi = makespan(ScheduleKind::Interleaved), bv = makespan(ScheduleKind::ZeroBubbleV);
  // Interleaved 1F1B: (p - 1) / (v m + p - 1) of the step idle = 3/19.
  CHECK(bi == Approx(3.0 / 19.0).epsilon(0.001));
  CHECK(bv < 0.5 * bi);
}

namespace {
// A 1.4B-parameter Llama on two Atlas 800T A2 servers, four pipeline stages of four layers.
nlohmann::json llama_pp4() {
  return nlohmann::json::parse(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
              "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000},
    "cluster": {"preset": "atlas-800t-a2", "devices": 16,
                "device": {"preset": "ascend-910b2", "gemm_peak_efficiency": 0.636}},
    "training": {"seq_length": 2048, "global_batch_size": 32},
    "parallelism": {"tp": 1, "pp": 4, "mbs": 1},
    "simulation": {"host_dispatch": {"launch_overhead": "0us"}}})");
  // The schedule alone, on a device pinned to the values these tests were written against
  // (device-bound, GEMMs at 0.636): re-calibrating the preset must not move them.
}
}  // namespace

TEST_CASE("schedules: zb_h1 end to end is faster than 1F1B and refuses virtual stages", "[strategies][schedule]") {
  nlohmann::json j = llama_pp4();
  const Result one = simulate(load_scenario(j, "t.json", "")).result;
  j["parallelism"]["pipeline_schedule"] = "zb_h1";
  const Result zb = simulate(load_scenario(j, "t.json", "")).result;
  CHECK(zb.step_time_s < 0.92 * one.step_time_s);
  CHECK(zb.breakdown.bubble_s < 0.7 * one.breakdown.bubble_s);
  CHECK(zb.breakdown.total() == Approx(zb.step_time_s).epsilon(1e-6));
  CHECK(zb.mfu > one.mfu);
  CHECK(zb.hfu / zb.mfu == Approx(one.hfu / one.mfu));  // the same work, only reordered
  // The inputs of deferred weight GEMMs stay until W (counted as the whole micro-batch's
  // activations: an upper bound).
  CHECK(zb.peak_memory_bytes >= one.peak_memory_bytes);
  j["parallelism"]["virtual_pipeline_model_parallel_size"] = 2;
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""),
                    Catch::Contains("/parallelism/pipeline_schedule") && Catch::Contains("virtual_pipeline_model_parallel_size 1"));
}

TEST_CASE("schedules: zb_v end to end is faster than interleaved 1F1B and needs two chunks per stage", "[strategies][schedule]") {
  nlohmann::json j = llama_pp4();
  j["parallelism"]["virtual_pipeline_model_parallel_size"] = 2;
  const Result il = simulate(load_scenario(j, "t.json", "")).result;
  j["parallelism"]["pipeline_schedule"] = "zb_v";
  const Result zv = simulate(load_scenario(j, "t.json", "")).result;
  CHECK(zv.step_time_s < il.step_time_s);
  CHECK(zv.breakdown.bubble_s < il.breakdown.bubble_s);
  // 1F1B's memory in chunks, plus the second-chunk forward that may exceed it in the warm-up.
  for (const StageResult& st : zv.stages) CHECK(st.memory.peak_inflight <= 2 * 4 + 1);
  CHECK(zv.breakdown.total() == Approx(zv.step_time_s).epsilon(1e-6));
  CHECK(zv.hfu / zv.mfu == Approx(il.hfu / il.mfu));
  j["parallelism"]["virtual_pipeline_model_parallel_size"] = 1;
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""),
                    Catch::Contains("/parallelism/pipeline_schedule") && Catch::Contains("virtual_pipeline_model_parallel_size 2"));
}

TEST_CASE("schedules: DualPipe feeds half the micro-batches from each end, two copies, PP + 1 activations",
          "[strategies][schedule]") {
  const int p = 4, m = 8;
  const auto orders = make_schedule(ScheduleKind::DualPipe, p, 2, m);
  REQUIRE(orders.size() == static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    std::set<std::tuple<int, int, int>> seen;
    int open = 0, most = 0;
    for (const auto& op : orders[s]) {
      CHECK(op.chunk == direction_of(ScheduleKind::DualPipe, m, op.microbatch));  // one direction per micro-batch
      CHECK(seen.insert({static_cast<int>(op.phase), op.microbatch, op.chunk}).second);
      if (op.phase == Phase::Backward) CHECK(seen.count({static_cast<int>(Phase::Forward), op.microbatch, op.chunk}) == 1);
      if (op.phase == Phase::WeightGrad) CHECK(seen.count({static_cast<int>(Phase::Backward), op.microbatch, op.chunk}) == 1);
      open += op.phase == Phase::Forward ? 1 : op.phase == Phase::WeightGrad ? -1 : 0;
      most = std::max(most, open);
    }
    CHECK(seen.size() == 3u * m);  // m/2 micro-batches x F, B, W in each of two chunks
    CHECK(most <= p + 1);          // DeepSeek's table: PP + 1 micro-batches of activations
  }
  // Device 0 starts direction 0 and device p - 1 direction 1 with their first forwards.
  CHECK(orders[0].front() == PipeOp{Phase::Forward, 0, 0});
  CHECK(orders[p - 1].front() == PipeOp{Phase::Forward, m / 2, 1});
}

TEST_CASE("schedules: dualpipe end to end: two parameter copies, smaller bubble, constraints", "[strategies][schedule]") {
  nlohmann::json j = llama_pp4();
  const Result one = simulate(load_scenario(j, "t.json", "")).result;
  j["parallelism"]["pipeline_schedule"] = "dualpipe";
  const Scenario sd = load_scenario(j, "t.json", "");
  const Result dp = simulate(sd).result;
  CHECK(dp.breakdown.bubble_s < 0.5 * one.breakdown.bubble_s);
  CHECK(dp.breakdown.total() == Approx(dp.step_time_s).epsilon(1e-6));
  CHECK(dp.hfu / dp.mfu == Approx(one.hfu / one.mfu));  // the same work per micro-batch
  CHECK(dp.breakdown.compute_s == Approx(one.breakdown.compute_s).epsilon(1e-3));
  for (std::size_t st = 0; st < dp.stages.size(); ++st) {
    // Stage s holds stages s and p - 1 - s of the 1F1B split: twice the weights of the pair's mean.
    const std::size_t mirror = dp.stages.size() - 1 - st;
    CHECK(dp.stages[st].memory.weights_bytes ==
          Approx(one.stages[st].memory.weights_bytes + one.stages[mirror].memory.weights_bytes).epsilon(1e-9));
  }
  // The plan as JSON pastes back: no virtual pipeline size.
  CHECK_FALSE(plan_to_json(sd.plan, sd.model).contains("virtual_pipeline_model_parallel_size"));
  CHECK(plan_to_json(sd.plan, sd.model)["pipeline_schedule"] == "dualpipe");
  // DeepSeek's constraints: even pp, an even number of micro-batches, at least 2 x pp.
  auto error_of = [&](nlohmann::json k) {
    try {
      (void)load_scenario(k, "t.json", "");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  nlohmann::json odd = j;
  odd["cluster"]["devices"] = 12;
  odd["parallelism"]["pp"] = 3;
  odd["model"]["num_hidden_layers"] = 15;
  odd["training"]["global_batch_size"] = 24;
  CHECK_THAT(error_of(odd), Catch::Contains("/parallelism/pipeline_model_parallel_size") && Catch::Contains("must be even"));
  nlohmann::json few = j;
  few["training"]["global_batch_size"] = 28;  // 7 micro-batches
  CHECK_THAT(error_of(few), Catch::Contains("/training/global_batch_size") && Catch::Contains("dualpipe needs an even number"));
  nlohmann::json v2 = j;
  v2["parallelism"]["virtual_pipeline_model_parallel_size"] = 2;
  CHECK_THAT(error_of(v2), Catch::Contains("/parallelism/pipeline_schedule") && Catch::Contains("virtual_pipeline_model_parallel_size 1"));
}

TEST_CASE("swap: activations in host memory lower peak memory by the swapped bytes and cost the unhidden copies",
          "[strategies][memory][swap]") {
  nlohmann::json j = llama_pp4();
  const Simulation plain = simulate(load_scenario(j, "t.json", ""));
  j["parallelism"]["swap_activations"] = 0.5;
  const Scenario ss = load_scenario(j, "t.json", "");
  const Simulation sw = simulate(ss);
  for (std::size_t st = 0; st < plain.result.stages.size(); ++st) {
    const MemoryBreakdown& a = plain.result.stages[st].memory;
    const MemoryBreakdown& b = sw.result.stages[st].memory;
    // Stage 0 keeps p micro-batches in flight: all but the one being prefetched give up half
    // their activations; the last stage keeps one, which it needs back at once.
    if (st == 0) CHECK(b.swapped_bytes == Approx(0.5 * a.activations_bytes * (4 - 1) / 4).epsilon(0.02));
    if (st == 3) CHECK(b.swapped_bytes == 0.0);
    // Every byte not on the device is in host memory: the device total drops by exactly that.
    CHECK(b.total() == Approx(a.total() - b.swapped_bytes));
    CHECK(b.activations_bytes + b.swapped_bytes == Approx(a.activations_bytes));
    // No recomputation here: without swapping nothing is saved; with it, the swapped bytes.
    CHECK(a.activations_bytes == Approx(a.activations_unoptimised_bytes));
    CHECK(b.activations_unoptimised_bytes == Approx(a.activations_unoptimised_bytes));
  }
  CHECK(sw.result.peak_memory_bytes < plain.result.peak_memory_bytes);
  // Copies on the host link: each chunk's swapped bytes out and back at host_bandwidth; the
  // step grows by at most their total (hidden where compute runs), never shrinks.
  const double host = ss.cluster.device.host_bandwidth.value();
  double copy_s = 0;
  for (const StageInfo& si : sw.lowered.stages)
    copy_s = std::max(copy_s, 2.0 * 0.5 * si.activation_bytes_per_microbatch / host * ss.plan.num_microbatches);
  CHECK(sw.result.step_time_s >= plain.result.step_time_s);
  CHECK(sw.result.step_time_s <= plain.result.step_time_s + copy_s * 1.0001);
  CHECK(sw.result.breakdown.swap_s <= copy_s);
  CHECK(sw.result.breakdown.total() == Approx(sw.result.step_time_s).epsilon(1e-6));
  // More than everything cannot be swapped.
  j["parallelism"]["swap_activations"] = 1.5;
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""), Catch::Contains("/parallelism/swap_activations"));
}

TEST_CASE("host dispatch: short kernels leave the device waiting for the host, fusing vector ops cuts launches",
          "[strategies][host]") {
  const char* base = R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024},
    "cluster": {"preset": "atlas-800t-a2", "devices": 8},
    "training": {"seq_length": 256, "global_batch_size": 8},
    "parallelism": {"tp": 1, "pp": 1, "mbs": 1}})";
  nlohmann::json j = nlohmann::json::parse(base);
  // The 910B2 preset carries a calibrated host time per operator: a host that keeps up is
  // asked for explicitly.
  j["simulation"] = {{"host_dispatch", {{"launch_overhead", "0us"}}}};
  const Simulation fast_host = simulate(load_scenario(j, "t.json", ""));
  j["simulation"] = {{"host_dispatch", {{"launch_overhead", "200us"}}}};
  const Simulation slow_host = simulate(load_scenario(j, "t.json", ""));
  j["simulation"]["host_dispatch"]["fused_vector_ops"] = true;
  const Simulation fused = simulate(load_scenario(j, "t.json", ""));
  auto launches = [](const Simulation& s) {
    std::size_t n = 0;
    for (const SimRank& r : s.lowered.ranks) n += s.lowered.graph.stream_order(r.streams[static_cast<int>(Stream::Launch)]).size();
    return n;
  };
  const std::size_t n = launches(slow_host);
  REQUIRE(n > 50);
  CHECK(launches(fast_host) == 0);
  // Every kernel here is far shorter than 200 us: the host issues them one after another and
  // the step is the launches end to end (plus what follows the last one).
  CHECK(slow_host.result.step_time_s >= n * 200e-6);
  CHECK(slow_host.result.step_time_s < n * 200e-6 * 1.1 + fast_host.result.step_time_s);
  CHECK(slow_host.result.breakdown.host_bound_s > 0.5 * slow_host.result.step_time_s);
  CHECK(slow_host.result.breakdown.total() == Approx(slow_host.result.step_time_s).epsilon(1e-6));
  CHECK(fast_host.result.breakdown.host_bound_s == 0.0);
  // Fused vector operators: fewer launches, a shorter step.
  CHECK(launches(fused) < n);
  CHECK(fused.result.step_time_s < slow_host.result.step_time_s);
  // Without a calibrated host time (the A100 preset has none) host dispatch needs one.
  j["cluster"] = {{"preset", "dgx-a100"}, {"devices", 8}};
  j["simulation"]["host_dispatch"] = {{"fused_vector_ops", true}};
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""), Catch::Contains("/simulation/host_dispatch/launch_overhead"));
}

TEST_CASE("host dispatch: the device's host time per operator is the default, grouped expert GEMMs launch per local expert",
          "[strategies][host][moe]") {
  // A small Qwen3-MoE on one DGX H100 node, one micro-batch per rank (8 ranks, global batch 8).
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
              "moe_intermediate_size": 128, "num_experts": 16, "num_experts_per_tok": 2,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
              "vocab_size": 1024},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "training": {"seq_length": 256, "global_batch_size": 8},
    "parallelism": {"tp": 1, "pp": 1, "mbs": 1, "ep": 2}})");
  const Scenario sc = load_scenario(j, "t.json", "");
  const double host_op = sc.cluster.device.host_op_time.value();
  REQUIRE(host_op > 0);  // the H100 preset carries a fitted value
  CHECK(sc.simulation.launch_overhead == host_op);
  auto host_ticks = [](const Simulation& s) {  // host time of the first simulated rank
    Tick t = 0;
    for (sim::TaskId id : s.lowered.graph.stream_order(s.lowered.ranks[0].streams[static_cast<int>(Stream::Launch)]))
      t += s.lowered.graph.duration(id);
    return t;
  };
  const Simulation ep2 = simulate(sc);  // 8 local experts per rank
  j["parallelism"]["ep"] = 8;           // 2 local experts per rank
  const Simulation ep8 = simulate(load_scenario(j, "t.json", ""));
  // Per layer and micro-batch the experts run 6 GEMMs (fc1, fc2 forward; their data and weight
  // gradients), each issued once per local expert: 2 layers x 6 x (8 - 2) more launches with EP 2.
  const Tick per_op = to_ticks(Seconds{host_op});
  CHECK(host_ticks(ep2) - host_ticks(ep8) == 2 * 6 * (8 - 2) * per_op);
  CHECK(ep2.result.breakdown.total() == Approx(ep2.result.step_time_s).epsilon(1e-6));
  // A scenario that says so (a run captured in CUDA graphs) turns host dispatch off.
  j["simulation"] = {{"host_dispatch", {{"launch_overhead", "0us"}}}};
  const Simulation graphs = simulate(load_scenario(j, "t.json", ""));
  CHECK(host_ticks(graphs) == 0);
  CHECK(graphs.result.breakdown.host_bound_s == 0.0);
  CHECK(graphs.result.step_time_s <= ep8.result.step_time_s);
  // The search's screen times the host thread the same way: with a slow host (1 ms per
  // operator) the plan is host-bound and the estimate follows the simulation.
  j["simulation"] = {{"host_dispatch", {{"launch_overhead", "1ms"}}}};
  const Scenario slow = load_scenario(j, "t.json", "");
  const Simulation slow_sim = simulate(slow);
  CHECK(slow_sim.result.breakdown.host_bound_s > 0.5 * slow_sim.result.step_time_s);
  const models::Workload w = models::build_workload(slow.model, slow.training.seq_length, slow.training.workload);
  const topologies::Topology topo = topologies::build_topology(slow.cluster);
  Estimator est(slow, topo, w);
  const double est_slow = est.estimate(slow.plan).step_s;
  CHECK(est_slow == Approx(slow_sim.result.step_time_s).epsilon(0.15));
  // Fast fidelity (one task per pass) keeps the host's share of each pass as a task of its own.
  j["simulation"]["fidelity"] = "fast";
  const Simulation slow_fast = simulate(load_scenario(j, "t.json", ""));
  CHECK(slow_fast.result.step_time_s == Approx(slow_sim.result.step_time_s).epsilon(0.15));
  CHECK(slow_fast.result.breakdown.host_bound_s > 0.5 * slow_fast.result.step_time_s);
  CHECK(slow_fast.result.breakdown.total() == Approx(slow_fast.result.step_time_s).epsilon(1e-6));
  j["simulation"] = {{"host_dispatch", {{"launch_overhead", "0us"}}}};
  const Scenario no_host = load_scenario(j, "t.json", "");
  Estimator est0(no_host, topo, w);
  CHECK(est_slow > 3 * est0.estimate(no_host.plan).step_s);
  // A negative host time in a device description is refused with its path.
  nlohmann::json bad = nlohmann::json::parse(R"({"preset": "dgx-h100", "devices": 8})");
  bad["device"] = {{"preset", "h100-sxm-80gb"}, {"host_op_time", -1.0}};
  j["cluster"] = bad;
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""), Catch::Contains("host_op_time"));
}

TEST_CASE("host dispatch: a dropless dispatch waits for the token counts, drop-and-pad does not",
          "[strategies][host][moe]") {
  // The small Qwen3-MoE of the test above, 2 MoE layers, 2 micro-batches per rank.
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
              "moe_intermediate_size": 128, "num_experts": 16, "num_experts_per_tok": 2,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
              "vocab_size": 1024},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "training": {"seq_length": 256, "global_batch_size": 16},
    "parallelism": {"tp": 1, "pp": 1, "mbs": 1, "ep": 8},
    "simulation": {"host_dispatch": {"launch_overhead": "1ms"}}})");
  auto syncs = [](const Simulation& s) {  // host waits of the first simulated rank
    std::size_t n = 0;
    const auto& g = s.lowered.graph;
    for (sim::TaskId id : g.stream_order(s.lowered.ranks[0].streams[static_cast<int>(Stream::Launch)]))
      if (g.label_text(g.label(id)) == "host_sync.tokens_per_expert") ++n;
    return n;
  };
  const Simulation dropless = simulate(load_scenario(j, "t.json", ""));
  // One wait per MoE layer and micro-batch before the forward dispatch, and one before the
  // backward's all-to-all to the experts (docs/NOTES.md, "Dropless MoE"): 2 layers x 2
  // micro-batches x 2 passes.
  CHECK(syncs(dropless) == 2 * 2 * 2);
  // Megatron's drop-and-pad (capacity factor 1, inputs padded to capacity): static sizes, no
  // wait; with balanced routing every expert's capacity is its share, so the work is the same.
  j["moe"] = {{"capacity_factor", 1.0}, {"pad_to_capacity", true}};
  const Simulation padded = simulate(load_scenario(j, "t.json", ""));
  CHECK(syncs(padded) == 0);
  CHECK(padded.result.step_time_s <= dropless.result.step_time_s);
  CHECK(padded.result.breakdown.compute_s == Approx(dropless.result.breakdown.compute_s).epsilon(1e-9));
  // A capacity without padding still needs the counts (the kept tokens vary).
  j["moe"] = {{"capacity_factor", 1.0}};
  CHECK(syncs(simulate(load_scenario(j, "t.json", ""))) == 2 * 2 * 2);
  // Padding needs a capacity.
  j["moe"] = {{"pad_to_capacity", true}};
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""), Catch::Contains("/moe/pad_to_capacity"));
}

TEST_CASE("swap: optimizer states in host memory free their device bytes and cost at most their fetch",
          "[strategies][memory][swap]") {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
              "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000},
    "cluster": {"preset": "atlas-800t-a2", "devices": 8},
    "training": {"seq_length": 2048, "global_batch_size": 16},
    "parallelism": {"tp": 1, "pp": 2, "mbs": 1, "use_distributed_optimizer": false}})");
  const Result plain = simulate(load_scenario(j, "t.json", "")).result;
  j["parallelism"]["swap_optimizer"] = true;
  const Scenario s = load_scenario(j, "t.json", "");
  const Result sw = simulate(s).result;
  for (std::size_t st = 0; st < sw.stages.size(); ++st) {
    const MemoryBreakdown& a = plain.stages[st].memory;
    const MemoryBreakdown& b = sw.stages[st].memory;
    CHECK(b.optimizer_bytes == Approx(12.0 * 40e6));  // one bucket's states on the device
    CHECK(b.total() == Approx(a.total() - (a.optimizer_bytes - b.optimizer_bytes)));
    CHECK(b.swapped_bytes == Approx(a.optimizer_bytes - b.optimizer_bytes));
  }
  // The fetch (12 bytes per parameter over host_bandwidth) overlaps the cooldown backwards;
  // the step grows by at most the fetch.
  const double fetch = plain.stages[0].memory.optimizer_bytes / s.cluster.device.host_bandwidth.value();
  CHECK(sw.step_time_s >= plain.step_time_s);
  CHECK(sw.step_time_s <= plain.step_time_s + fetch * 1.0001);
  CHECK(sw.breakdown.total() == Approx(sw.step_time_s).epsilon(1e-6));
}

TEST_CASE("interference: compute overlapped by communication is slowed by the documented factor",
          "[strategies][overlap]") {
  nlohmann::json j = llama_pp4();
  j["parallelism"]["tp"] = 2;
  j["parallelism"]["sequence_parallel"] = true;
  j["parallelism"]["tp_comm_overlap"] = true;
  j["parallelism"]["use_distributed_optimizer"] = true;
  j["parallelism"]["overlap_grad_reduce"] = true;
  j["cluster"]["devices"] = 32;
  const Result base = simulate(load_scenario(j, "t.json", "")).result;
  j["simulation"]["comm_compute_slowdown"] = 0.2;
  const Result slow = simulate(load_scenario(j, "t.json", "")).result;
  REQUIRE(base.comm_overlap_fraction > 0.05);
  // Only the overlapped share of each kernel is stretched: compute grows, by less than 20%.
  CHECK(slow.breakdown.compute_s > base.breakdown.compute_s);
  CHECK(slow.breakdown.compute_s < 1.2 * base.breakdown.compute_s);
  CHECK(slow.step_time_s > base.step_time_s);
  CHECK(slow.breakdown.total() == Approx(slow.step_time_s).epsilon(1e-6));
  // No communication, no interference: one device.
  nlohmann::json one = llama_pp4();
  one["cluster"]["devices"] = 1;
  one["training"]["global_batch_size"] = 4;
  one["parallelism"]["pp"] = 1;
  const Result alone = simulate(load_scenario(one, "t.json", "")).result;
  one["simulation"]["comm_compute_slowdown"] = 0.5;
  CHECK(simulate(load_scenario(one, "t.json", "")).result.step_time_s == alone.step_time_s);
}

TEST_CASE("context parallelism: the ring runs step by step, the last step waits for the last block",
          "[strategies][cp]") {
  // A small Llama at CP 4 (one server, DP 2): 4K tokens per micro-batch, 1K per rank.
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 2816,
              "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "training": {"seq_length": 4096, "global_batch_size": 4},
    "parallelism": {"tp": 1, "pp": 1, "cp": 4, "mbs": 1}})");
  const Scenario sc = load_scenario(j, "t.json", "");
  const Simulation s = simulate(sc);
  const auto& g = s.lowered.graph;
  const models::ComputeModel cm(sc.cluster.device);
  // Per ring step: 8 heads, 1K queries; step 0 the local 1K x 1K block under the mask, later
  // steps 1K x 512 without it (the same FLOPs). Forward: steps 0-2 in one task, step 3 alone.
  const Seconds first = cm.attention(8, 1024, 1024, 128, 128, true, 0, models::Precision::BF16);
  const Seconds later = cm.attention(8, 1024, 512, 128, 128, false, 0, models::Precision::BF16);
  CHECK(2.0 * 8 * 1024 * 1024 * 256 * 0.5 == Approx(2.0 * 8 * 1024 * 512 * 256));
  int lasts = 0, homes = 0, rings = 0;
  Tick last_ring_end = 0;  // the ring issued just before (tasks are added in program order)
  for (sim::TaskId id = 0; id < g.num_tasks(); ++id) {
    const std::string l = g.label_text(g.label(id));
    if (l.ends_with(".kv_ring")) {
      ++rings;
      last_ring_end = s.run.end[id];
    }
    if (l.ends_with("core_attn.ring_last")) {
      ++lasts;
      CHECK(g.duration(id) == to_ticks(later));
      CHECK(s.run.start[id] >= last_ring_end);  // waited for the ring of its layer
    }
    if (l.ends_with("core_attn")) CHECK(g.duration(id) == to_ticks(first + later * 2.0));
    if (l.ends_with(".dkv_home")) ++homes;
  }
  CHECK(rings > 0);
  CHECK(lasts > 0);
  CHECK(homes > 0);  // backward sends the key/value gradients home
  // The ring is communication: it appears in the CP part of the breakdown.
  CHECK(s.result.breakdown.cp_comm_s > 0);

  // All-gather CP (Megatron --cp-comm-type all_gather, Llama 3): the whole keys/values first,
  // one masked kernel over the full 4K keys, the gradients reduce-scattered after the backward.
  j["parallelism"]["cp_comm_type"] = "all_gather";
  const Scenario ag_sc = load_scenario(j, "t.json", "");
  CHECK(ag_sc.plan.cp_all_gather);
  const Simulation ag = simulate(ag_sc);
  const auto& ga = ag.lowered.graph;
  const Seconds whole = cm.attention(8, 1024, 4096, 128, 128, true, 0, models::Precision::BF16);
  int gathers = 0, scatters = 0, kernels = 0;
  Tick gather_end = 0;
  for (sim::TaskId id = 0; id < ga.num_tasks(); ++id) {
    const std::string l = ga.label_text(ga.label(id));
    CHECK(!l.ends_with(".ring_last"));
    if (l.ends_with(".kv_all_gather")) {
      ++gathers;
      gather_end = ag.run.end[id];
    }
    if (l.ends_with(".dkv_reduce_scatter")) ++scatters;
    if (l.ends_with("core_attn")) {
      ++kernels;
      CHECK(ga.duration(id) == to_ticks(whole));
      CHECK(ag.run.start[id] >= gather_end);  // nothing overlaps the gather
    }
  }
  CHECK(gathers > 0);
  CHECK(kernels > 0);
  CHECK(scatters > 0);
  // The plan printed by search keeps the choice; a Megatron command line sets it; a wrong name
  // is refused with its path.
  CHECK(plan_to_json(ag_sc.plan, ag_sc.model)["cp_comm_type"] == "all_gather");
  nlohmann::json k = j;
  k["parallelism"].erase("cp_comm_type");
  k["parallelism"]["megatron_args"] = "--cp-comm-type all_gather";
  CHECK(load_scenario(k, "t.json", "").plan.cp_all_gather);
  j["parallelism"]["cp_comm_type"] = "a2a";
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""), Catch::Contains("/parallelism/cp_comm_type"));
}

TEST_CASE("port sharing: overlapping collectives on one port slow each other, other tiers do not",
          "[strategies][network]") {
  // Data-parallel gradient reduction overlapped with the backward's tensor-parallel traffic.
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
              "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "training": {"seq_length": 4096, "global_batch_size": 16},
    "parallelism": {"tp": 2, "pp": 1, "mbs": 1, "sequence_parallel": true, "use_distributed_optimizer": true,
                    "overlap_grad_reduce": true}})");
  auto run = [&](bool sharing) {
    nlohmann::json k = j;
    k["simulation"] = {{"port_sharing", sharing}};
    return simulate(load_scenario(k, "t.json", ""));
  };
  auto comm_durations = [](const Simulation& s, Stream st) {
    std::vector<Tick> d;
    const auto& g = s.lowered.graph;
    for (sim::TaskId t : g.stream_order(s.lowered.ranks[0].streams[static_cast<int>(st)])) d.push_back(g.duration(t));
    return d;
  };
  {
    // TP and DP inside one server: both on the NVLink port.
    const Simulation alone = run(false), shared = run(true);
    CHECK(shared.result.step_time_s >= alone.result.step_time_s);
    int grown = 0;
    for (Stream st : {Stream::Tp, Stream::Dp, Stream::DpReduce}) {
      const auto a = comm_durations(alone, st), b = comm_durations(shared, st);
      REQUIRE(a.size() == b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        CHECK(b[i] >= a[i]);
        CHECK(b[i] <= 2 * a[i]);  // half the port at worst: at most twice as long
        grown += b[i] > a[i];
      }
    }
    CHECK(grown > 0);
    CHECK(shared.result.breakdown.total() == Approx(shared.result.step_time_s).epsilon(1e-6));
  }
  {
    // TP 8 inside each server, DP 2 across servers: NVLink and the NIC are different ports,
    // so the overlapped tensor-parallel traffic keeps its durations.
    j["cluster"]["devices"] = 16;
    j["parallelism"]["tp"] = 8;
    const Simulation alone = run(false), shared = run(true);
    CHECK(comm_durations(shared, Stream::Tp) == comm_durations(alone, Stream::Tp));
  }
  // Fast fidelity times each collective alone.
  j["simulation"] = {{"fidelity", "fast"}};
  CHECK(load_scenario(j, "t.json", "").simulation.port_sharing);
}
