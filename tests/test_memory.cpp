// The memory model (issue 15): data-parallel sharding (ZeRO-1/2/3, FSDP) in memory and on the
// timeline, the FP8 saved-input and cross-entropy terms.
#include <catch2/catch.hpp>

#include "moesim/strategies/lower/memory.hpp"
#include "moesim/strategies/output/simulate.hpp"

using namespace moesim;
using namespace moesim::strategies;

namespace {

nlohmann::json llama(const char* sharding) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
              "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000},
    "cluster": {"preset": "dgx-h100", "devices": 16},
    "training": {"seq_length": 2048, "global_batch_size": 64},
    "parallelism": {"tp": 1, "pp": 1, "mbs": 1}})");
  j["parallelism"]["data_parallel_sharding_strategy"] = sharding;
  return j;
}

}  // namespace

TEST_CASE("memory: ZeRO stages shard optimizer, then gradients, then weights (hand-derived)", "[memory][sharding]") {
  Plan p;
  p.dp = 8;
  p.cp = 1;
  StageMemoryInput in;
  in.params_dense = 8e9;
  in.largest_item_params = 0.2e9;
  const double shard = 1e9;  // 8e9 over dp 8
  p.dp_sharding = DpSharding::None;
  MemoryBreakdown m = stage_memory(p, 1, models::Precision::BF16, 0, in);
  CHECK(m.weights_bytes == 2 * 8e9);
  CHECK(m.gradients_bytes == 4 * 8e9);
  CHECK(m.optimizer_bytes == 12 * 8e9);
  p.dp_sharding = DpSharding::Optimizer;
  p.distributed_optimizer = true;
  m = stage_memory(p, 1, models::Precision::BF16, 0, in);
  CHECK(m.optimizer_bytes == 12 * shard);
  CHECK(m.gradients_bytes == 4 * 8e9);
  p.dp_sharding = DpSharding::OptimizerGradients;  // the shard and one 40M-parameter bucket
  m = stage_memory(p, 1, models::Precision::BF16, 0, in);
  CHECK(m.gradients_bytes == Approx(4 * (shard + 40e6)));
  CHECK(m.weights_bytes == 2 * 8e9);
  p.dp_sharding = DpSharding::Full;  // the shard, two gathered layers, one layer's gradients
  m = stage_memory(p, 1, models::Precision::BF16, 0, in);
  CHECK(m.weights_bytes == Approx(2 * (shard + 2 * 0.2e9)));
  CHECK(m.gradients_bytes == Approx(4 * (shard + 0.2e9)));
  CHECK(m.optimizer_bytes == 12 * shard);
  p.reshard_after_forward = false;  // every layer stays gathered from forward to backward
  m = stage_memory(p, 1, models::Precision::BF16, 0, in);
  CHECK(m.weights_bytes == Approx(2 * 8e9));
  // Gradients synchronised at the last micro-batch (FSDP2 under torch.distributed.pipelining):
  // every gradient unsharded in FP32, every weight gathered, whatever the reshard setting.
  p.reshard_after_forward = true;
  p.grad_sync_every_microbatch = false;
  m = stage_memory(p, 1, models::Precision::BF16, 0, in);
  CHECK(m.weights_bytes == Approx(2 * 8e9));
  CHECK(m.gradients_bytes == Approx(4 * 8e9));
  CHECK(m.optimizer_bytes == 12 * shard);
}

TEST_CASE("sharding: names, conflicts and Megatron arguments", "[memory][sharding]") {
  nlohmann::json j = llama("optim_grads_params");
  CHECK(load_scenario(j, "t.json", "").plan.dp_sharding == DpSharding::Full);
  j["parallelism"].erase("data_parallel_sharding_strategy");
  j["parallelism"]["zero_stage"] = 2;
  CHECK(load_scenario(j, "t.json", "").plan.dp_sharding == DpSharding::OptimizerGradients);
  j["parallelism"]["data_parallel_sharding_strategy"] = "optim";
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""), Catch::Contains("zero_stage") && Catch::Contains("disagrees"));
  j["parallelism"].erase("zero_stage");
  j["parallelism"]["data_parallel_sharding_strategy"] = "zero3";
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""), Catch::Contains("optim_grads_params"));
  j["parallelism"].erase("data_parallel_sharding_strategy");
  j["parallelism"]["use_distributed_optimizer"] = true;
  CHECK(load_scenario(j, "t.json", "").plan.dp_sharding == DpSharding::Optimizer);
  j["parallelism"]["megatron_args"] = "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params";
  CHECK(load_scenario(j, "t.json", "").plan.dp_sharding == DpSharding::Full);
}

TEST_CASE("FSDP: per-layer gathers and reduce-scatters on the timeline, memory below ZeRO-1", "[memory][sharding]") {
  const Simulation zero1 = simulate(load_scenario(llama("optim"), "t.json", ""));
  const Simulation fsdp = simulate(load_scenario(llama("optim_grads_params"), "t.json", ""));
  CHECK(fsdp.result.peak_memory_bytes < zero1.result.peak_memory_bytes);
  CHECK(fsdp.result.stages[0].memory.weights_bytes < 0.5 * zero1.result.stages[0].memory.weights_bytes);
  CHECK(fsdp.result.stages[0].memory.gradients_bytes < 0.5 * zero1.result.stages[0].memory.gradients_bytes);
  // 16 devices, global batch 64, micro-batch 1: 4 micro-batches. Every micro-batch gathers each
  // of the 10 items (embedding, 8 layers, head) twice (forward, and backward after the reshard)
  // and reduce-scatters each once, one collective per item (the FSDP unit).
  int gathers = 0, reduces = 0;
  for (const CollectiveUse& u : fsdp.result.collectives) {
    if (u.group != "dp") continue;
    if (u.operation == "all-gather") gathers += u.count_per_step;
    if (u.operation == "reduce-scatter") reduces += u.count_per_step;
  }
  CHECK(gathers == 4 * 10 * 2);
  CHECK(reduces == 4 * 10);
  CHECK(fsdp.result.breakdown.total() == Approx(fsdp.result.step_time_s).epsilon(1e-9));
  // The traffic is three times ZeRO-1's per micro-batch, but prefetched and reduced on its own
  // stream, layer by layer, it hides behind compute.
  CHECK(fsdp.result.breakdown.dp_comm_s < 0.5 * fsdp.result.step_time_s);

  // Synchronised at the last micro-batch: one gather and one reduce-scatter per item a step.
  nlohmann::json j = llama("optim_grads_params");
  j["parallelism"]["fsdp_gradient_sync"] = "last_microbatch";
  const Simulation once = simulate(load_scenario(j, "t.json", ""));
  gathers = reduces = 0;
  for (const CollectiveUse& u : once.result.collectives) {
    if (u.group != "dp") continue;
    if (u.operation == "all-gather") gathers += u.count_per_step;
    if (u.operation == "reduce-scatter") reduces += u.count_per_step;
  }
  CHECK(gathers == 10);
  CHECK(reduces == 10);
  CHECK(once.result.stages[0].memory.gradients_bytes > fsdp.result.stages[0].memory.gradients_bytes);
  CHECK(once.result.breakdown.total() == Approx(once.result.step_time_s).epsilon(1e-9));
  // Only with sharded gradients.
  j["parallelism"]["data_parallel_sharding_strategy"] = "optim";
  CHECK_THROWS_WITH(load_scenario(j, "t.json", ""), Catch::Contains("fsdp_gradient_sync") && Catch::Contains("optim_grads"));
}

TEST_CASE("memory: cross-entropy and FP8 saved inputs", "[memory]") {
  nlohmann::json j = llama("optim");
  const Simulation bf16 = simulate(load_scenario(j, "t.json", ""));
  // Transient: the larger of a GEMM's output and gradient (2 x 2 bytes per logit) and the
  // cross-entropy's 16-bit logits beside its FP32 copy (2 x 2): 4 bytes x seq x vocab.
  CHECK(bf16.result.stages[0].memory.transient_bytes == Approx(4.0 * 2048 * 32000));
  j["training"]["precision"] = "fp8";
  const Simulation fp8 = simulate(load_scenario(j, "t.json", ""));
  const double a16 = bf16.result.stages[0].memory.activations_bytes;
  const double a8 = fp8.result.stages[0].memory.activations_bytes;
  // Per token and layer: qkv and mlp_up inputs h, mlp_down input f drop to 1 byte; o_proj adds
  // its FP8 copy (h) beside the 16-bit attention output: -(h + h + f) + h = -(h + f) bytes.
  const double per_token = 2048.0 + 5632.0;
  CHECK(a16 - a8 == Approx(8 * 2048 * per_token).epsilon(1e-9));
}

TEST_CASE("memory: recomputing core attention keeps Q, K, V and the output O", "[memory]") {
  // Megatron-core checkpoints the attention kernel only: its inputs Q, K, V stay, and O stays
  // as the output projection's saved input. With flash attention in BF16 nothing is freed (the
  // log-sum-exp is counted as kept); in FP8 flash's 16-bit reference to O goes and o_proj's FP8
  // copy stays: 2 B x a d = 2 x 2048 bytes per token and layer less (h 2048 = a d).
  nlohmann::json j = llama("optim");
  const double none16 = simulate(load_scenario(j, "t.json", "")).result.stages[0].memory.activations_bytes;
  j["parallelism"]["recompute_granularity"] = "selective";
  j["parallelism"]["recompute_modules"] = nlohmann::json::array({"core_attn"});
  const double ca16 = simulate(load_scenario(j, "t.json", "")).result.stages[0].memory.activations_bytes;
  CHECK(ca16 == Approx(none16).epsilon(1e-12));
  j["training"]["precision"] = "fp8";
  const double ca8 = simulate(load_scenario(j, "t.json", "")).result.stages[0].memory.activations_bytes;
  j["parallelism"].erase("recompute_granularity");
  j["parallelism"].erase("recompute_modules");
  const double none8 = simulate(load_scenario(j, "t.json", "")).result.stages[0].memory.activations_bytes;
  CHECK(none8 - ca8 == Approx(8 * 2048 * 2.0 * 2048).epsilon(1e-9));
}

TEST_CASE("memory: operator-level checkpointing and the loss implementation", "[memory]") {
  nlohmann::json j = llama("optim");
  const Simulation none = simulate(load_scenario(j, "t.json", ""));
  j["parallelism"]["recompute_granularity"] = "selective_op";
  const Simulation op = simulate(load_scenario(j, "t.json", ""));
  // Per token and layer (h 2048, kv 512, f 5632), torchtitan's policy over the block's seven
  // matmuls wq wk wv wo w1 w3 w2 keeps the odd ones' outputs (wq 2048, wv 512, w1 5632, w2
  // 2048), the input h and attention's output (h) with its statistics (16 heads x 4 bytes):
  // 2 x (2048 + 2048 + 512 + 5632 + 2048 + 2048) + 64 bytes.
  const double per_token_layer = 2.0 * (2048 + 2048 + 512 + 5632 + 2048 + 2048) + 64;
  const double layers = none.result.stages[0].memory.activations_bytes - op.result.stages[0].memory.activations_bytes;
  CHECK(op.result.stages[0].memory.activations_bytes < none.result.stages[0].memory.activations_bytes);
  CHECK(layers > 0);
  // The layers' share of the kept activations is exactly the kept tensors.
  const double none_layer = 2.0 * (2048 + 2048 + 2048 + 3072 + 2048 + 2048 + 2 * 5632 + 5632) + 64;  // per token
  CHECK(layers == Approx(8 * 2048 * (none_layer - per_token_layer)).epsilon(1e-9));
  // Recomputing every other matmul and the element-wise operators costs time.
  CHECK(op.result.breakdown.recompute_s > 0);
  // Plain PyTorch cross-entropy: 8 bytes per logit of buffers beside the saved softmax.
  j["parallelism"]["recompute_granularity"] = "none";
  j["training"]["cross_entropy"] = "pytorch";
  const Simulation pt = simulate(load_scenario(j, "t.json", ""));
  CHECK(pt.result.stages[0].memory.transient_bytes == Approx(8.0 * 2048 * 32000));
  // Compiled: the 16-bit logits are kept instead of the FP32 softmax (2 bytes per logit less)
  // and the gradient is the only buffer (2 bytes per logit).
  j["training"]["cross_entropy"] = "compiled";
  const Simulation cc = simulate(load_scenario(j, "t.json", ""));
  CHECK(cc.result.stages[0].memory.transient_bytes < pt.result.stages[0].memory.transient_bytes);
  CHECK(pt.result.stages[0].memory.activations_bytes - cc.result.stages[0].memory.activations_bytes ==
        Approx(2.0 * 2048 * 32000));
}

// --- The memory detail (`moesim simulate --memory-detail`): every activation term per operator,
// with what recomputation drops and the static parts, reconciled with the stage's sums.

namespace {

/// A small dense Llama-like model on one device per stage: h 1024, 16 heads of 64, 4 KV heads,
/// SwiGLU width 2816, 4 layers, sequence 1024, micro-batch 1, TP 1, BF16, flash attention.
nlohmann::json small_llama() {
  return nlohmann::json::parse(R"({
    "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 2816,
              "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "training": {"seq_length": 1024, "global_batch_size": 32, "precision": "bf16"},
    "parallelism": {"tp": 1, "pp": 1, "mbs": 1}})");
}

Simulation detailed(const nlohmann::json& j) { return simulate(load_scenario(j, "t.json", ""), nullptr, true); }

const MemoryItem* item_of(const MemoryDetail& d, const std::string& kind) {
  for (const MemoryItem& it : d.items)
    if (it.kind == kind) return &it;
  return nullptr;
}

const MemoryTerm* term_of(const MemoryItem& it, const std::string& op) {
  for (const MemoryTerm& t : it.terms)
    if (t.op == op) return &t;
  return nullptr;
}

/// The detail's own sums: terms add up to their item, items x counts to the stage's chunks,
/// the static parts to the stage's total.
void check_sums(const Simulation& sim) {
  REQUIRE(sim.result.memory_detail.has_value());
  const MemoryDetail& d = *sim.result.memory_detail;
  double per_mb = 0;
  for (const MemoryItem& it : d.items) {
    double full = 0, kept = 0;
    for (const MemoryTerm& t : it.terms) {
      full += t.full_bytes;
      kept += t.kept_bytes;
      if (t.full_bytes > 0) CHECK(t.kept_bytes <= t.full_bytes);  // 0: a tensor only the checkpoint keeps
      if (t.kept_bytes < t.full_bytes) CHECK(std::string(t.dropped_by) != "");
      CHECK(std::string(t.note) != "");
    }
    CHECK(full == Approx(it.full_bytes).epsilon(1e-12));
    CHECK(kept == Approx(it.kept_bytes).epsilon(1e-12));
    per_mb += it.kept_bytes * it.count;
  }
  double chunks = 0;
  for (double c : d.chunk_bytes) chunks += c;
  CHECK(per_mb == Approx(chunks).epsilon(1e-12));
  CHECK(per_mb == Approx(d.per_microbatch_bytes).epsilon(1e-12));
  const MemoryBreakdown& m = sim.result.stages[static_cast<std::size_t>(d.stage)].memory;
  CHECK(d.activations_bytes == m.activations_bytes);
  CHECK(d.total_bytes == m.total());
  CHECK(d.total_bytes == sim.result.peak_memory_bytes);  // the stage that decides "fits"
  double statics = 0;
  for (const MemoryStaticTerm& t : d.statics) statics += t.bytes;
  CHECK(statics == Approx(m.total()).epsilon(1e-12));
}

}  // namespace

TEST_CASE("memory detail: a dense layer's terms add up to the hand-derived bytes (flash, no recompute)",
          "[memory][detail]") {
  const Simulation sim = detailed(small_llama());
  check_sums(sim);
  const MemoryDetail& d = *sim.result.memory_detail;
  const MemoryItem* layer = item_of(d, "dense_layer");
  REQUIRE(layer != nullptr);
  CHECK(layer->count == 4);
  // Per token (b = 1, TP 1) and layer, from Korthikanti et al. 2022's 34sbh + 5as^2b (MHA, a 4h
  // GeLU MLP, dropout): no dropout drops the two 1-byte masks (-2h); flash attention drops
  // 5as^2b and keeps a 4-byte log-sum-exp per head (+4a); GQA keeps Q, K, V as 2(a + 2kv)d
  // instead of 6h; the SwiGLU MLP of width f keeps 2 x 2f before and 2f after the activation
  // instead of 8h + 8h. What is left of the 34h: two norm inputs, the QKV and up GEMM inputs and
  // the attention output, 2h each = 10h.
  //   h 1024, a 16, kv 4, d 64, f 2816:
  //   10h + 2(a + 2kv)d + 4a + 6f = 10240 + 3072 + 64 + 16896 = 30272 bytes per token.
  const double tokens = 1024;
  CHECK(layer->full_bytes == 30272 * tokens);
  CHECK(layer->kept_bytes == 30272 * tokens);
  const MemoryTerm* core = term_of(*layer, "core_attn");
  REQUIRE(core != nullptr);
  CHECK(core->full_bytes == (3072 + 64) * tokens);
  CHECK(std::string(core->note).find("flash") != std::string::npos);
  const MemoryTerm* act = term_of(*layer, "mlp_act");
  REQUIRE(act != nullptr);
  CHECK(act->kept_bytes == 4 * 2816 * tokens);
  CHECK(std::string(act->note).find("SwiGLU") != std::string::npos);
  for (const MemoryTerm& t : layer->terms) CHECK(std::string(t.dropped_by).empty());
  // Head: final_norm and lm_head inputs (2h each) and the FP32 softmax over the vocabulary.
  const MemoryItem* head = item_of(d, "head");
  REQUIRE(head != nullptr);
  CHECK(head->kept_bytes == (2 * 1024 + 2 * 1024 + 4 * 32000) * tokens);
  // Transient: the output layer's logits and their gradient.
  CHECK(d.transient_bytes == sim.result.stages[0].memory.transient_bytes);
  CHECK(d.transient_source.find("lm_head") != std::string::npos);
}

TEST_CASE("memory detail: full recompute keeps only the layer input, 2sbh", "[memory][detail]") {
  nlohmann::json j = small_llama();
  j["parallelism"]["recompute_granularity"] = "full";
  const Simulation sim = detailed(j);
  check_sums(sim);
  const MemoryDetail& d = *sim.result.memory_detail;
  const MemoryItem* layer = item_of(d, "dense_layer (full recompute)");
  REQUIRE(layer != nullptr);
  CHECK(layer->count == 4);
  CHECK(layer->full_bytes == 30272 * 1024.0);
  CHECK(layer->kept_bytes == 2.0 * 1024 * 1024);  // s b h x 2 bytes
  for (const MemoryTerm& t : layer->terms) {
    if (t.op == "layer input") {
      CHECK(t.kept_bytes == 2.0 * 1024 * 1024);
      CHECK(t.full_bytes == 0);  // without recomputation it is attn_norm's saved input
    } else {
      CHECK(t.kept_bytes == 0);
      CHECK(std::string(t.dropped_by) == "full recompute");
    }
  }
  // The head is no decoder layer: full recompute keeps its terms.
  const MemoryItem* head = item_of(d, "head");
  REQUIRE(head != nullptr);
  CHECK(head->kept_bytes == head->full_bytes);
}

TEST_CASE("memory detail: recompute module moe_act drops the experts' activation output", "[memory][detail]") {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 1024, "intermediate_size": 4096,
              "moe_intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 16,
              "num_key_value_heads": 4, "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4,
              "vocab_size": 32000},
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "training": {"seq_length": 1024, "global_batch_size": 32, "precision": "bf16"},
    "parallelism": {"tp": 1, "pp": 1, "ep": 4, "mbs": 1}})");
  const Simulation none = detailed(j);
  j["parallelism"]["recompute_granularity"] = "selective";
  j["parallelism"]["recompute_modules"] = {"moe_act"};
  const Simulation sel = detailed(j);
  check_sums(none);
  check_sums(sel);
  const MemoryItem* a = item_of(*none.result.memory_detail, "moe_layer");
  const MemoryItem* b = item_of(*sel.result.memory_detail, "moe_layer");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  // Per routed copy (k = 4 per token): the activation's output, 2 B x f (512).
  const MemoryTerm* down_none = term_of(*a, "expert_down");
  const MemoryTerm* down = term_of(*b, "expert_down");
  REQUIRE(down_none != nullptr);
  REQUIRE(down != nullptr);
  CHECK(down_none->kept_bytes == 2.0 * 512 * 4 * 1024);
  CHECK(std::string(down_none->dropped_by).empty());
  CHECK(down->full_bytes == 2.0 * 512 * 4 * 1024);
  CHECK(down->kept_bytes == 0);
  CHECK(std::string(down->dropped_by) == "recompute module moe_act");
  // The activation's input (gate and up outputs) stays: moe_act re-runs only the activation.
  const MemoryTerm* act = term_of(*b, "expert_act");
  REQUIRE(act != nullptr);
  CHECK(act->kept_bytes == 2.0 * 2 * 512 * 4 * 1024);
  CHECK(a->kept_bytes - b->kept_bytes == 2.0 * 512 * 4 * 1024);
}

TEST_CASE("memory detail: reconciliation with the walked peak, op-level checkpointing, unfused scores",
          "[memory][detail]") {
  // An even pipeline (one chunk per stage): in-flight chunks x one micro-batch is the peak.
  nlohmann::json j = small_llama();
  j["parallelism"]["pp"] = 2;
  const Simulation pp2 = detailed(j);
  check_sums(pp2);
  const MemoryDetail& d = *pp2.result.memory_detail;
  CHECK(d.chunks == 1);
  CHECK(d.inflight_chunks == pp2.result.stages[static_cast<std::size_t>(d.stage)].memory.peak_inflight);
  CHECK(d.inflight_chunks >= 1);
  CHECK(std::abs(d.walked_peak_bytes - d.estimate_bytes) < 1e-6 * d.walked_peak_bytes);
  CHECK(d.estimate_bytes == Approx(d.per_microbatch_bytes * d.inflight_chunks).epsilon(1e-12));
  CHECK(d.swapped_activation_bytes == 0);
  CHECK(d.walked_peak_bytes == d.activations_bytes);
  // JSON: memory.detail only when asked; the result without it is unchanged.
  const Scenario s = load_scenario(j, "t.json", "");
  nlohmann::json with = to_json(pp2.result, s, false);
  REQUIRE(with["memory"].contains("detail"));
  CHECK(with["memory"]["detail"]["stage"] == d.stage);
  CHECK(with["memory"]["detail"]["items"][0].contains("terms"));
  CHECK(with["memory"]["detail"]["static"].size() == d.statics.size());
  const Simulation plain = simulate(s);
  CHECK_FALSE(plain.result.memory_detail.has_value());
  nlohmann::json without = to_json(plain.result, s, false);
  CHECK_FALSE(without["memory"].contains("detail"));
  with["memory"].erase("detail");
  CHECK(with == without);
  const std::string table = format_memory_detail(d, pp2.result.capacity_bytes);
  CHECK(table.find("check:") != std::string::npos);
  CHECK(table.find("core_attn") != std::string::npos);

  // Operator-level checkpointing: every operator's bytes dropped, the kept tensors listed.
  j = small_llama();
  j["parallelism"]["recompute_granularity"] = "selective_op";
  const Simulation op = detailed(j);
  check_sums(op);
  const MemoryItem* layer = item_of(*op.result.memory_detail, "dense_layer");
  REQUIRE(layer != nullptr);
  // As in "operator-level checkpointing and the loss implementation", at h 1024, kv 256, f 2816:
  // input, wq, wv, w1, w2 outputs and attention's: 2 x (1024 + 1024 + 256 + 2816 + 1024 + 1024)
  // + 64 bytes per token.
  CHECK(layer->kept_bytes == (2.0 * (1024 + 1024 + 256 + 2816 + 1024 + 1024) + 64) * 1024);
  REQUIRE(term_of(*layer, "mlp_down output") != nullptr);  // w2, the 7th matmul
  CHECK(term_of(*layer, "o_proj output") == nullptr);      // wo, the 4th
  REQUIRE(term_of(*layer, "qkv") != nullptr);
  CHECK(std::string(term_of(*layer, "qkv")->dropped_by) == "op-level checkpointing");
  REQUIRE(term_of(*layer, "qkv output") != nullptr);

  // Unfused attention with dropout: the s x s terms, 5 bytes per score of each head.
  j = small_llama();
  j["training"]["attention_kernel"] = "unfused";
  j["training"]["dropout"] = 0.1;
  const Simulation unf = detailed(j);
  check_sums(unf);
  const MemoryItem* ul = item_of(*unf.result.memory_detail, "dense_layer");
  REQUIRE(ul != nullptr);
  const MemoryTerm* scores = term_of(*ul, "core_attn s^2 scores");
  REQUIRE(scores != nullptr);
  CHECK(scores->kept_bytes == 5.0 * 16 * 1024 * 1024);
  // 34sbh - (6h - 2(a + 2kv)d) for GQA - (16h - 6f) for SwiGLU + 4a statistics, as above with
  // both dropout masks: 30272 + 2h.
  CHECK(ul->kept_bytes == (30272.0 + 2 * 1024) * 1024 + 5.0 * 16 * 1024 * 1024);
}

TEST_CASE("workload: every operator that keeps bytes for backward says what and from where", "[memory][detail]") {
  const Scenario pangu = load_scenario_file(std::string(MOESIM_SOURCE_DIR) + "/scenarios/pangu-ultra-moe-718b.json", {});
  const Scenario llama = load_scenario(small_llama(), "t.json", "");
  models::ModelSpec mla_no_q_lora = pangu.model;  // DeepSeek-V2-Lite's attention: q_proj, no q_down
  mla_no_q_lora.q_lora_rank = 0;
  models::ModelSpec gelu = llama.model;
  gelu.mlp = models::MlpKind::GELU;
  const std::vector<const models::ModelSpec*> specs{&pangu.model, &llama.model, &mla_no_q_lora, &gelu};
  for (const models::ModelSpec* m : specs) {
    for (auto kernel : {models::AttentionKernel::Flash, models::AttentionKernel::Unfused})
      for (auto ce : {models::CrossEntropy::Fused, models::CrossEntropy::PyTorch, models::CrossEntropy::Compiled})
        for (auto probs : {models::MoeProbs::Activation, models::MoeProbs::Output}) {
          models::WorkloadOptions opt;
          opt.attention = kernel;
          opt.cross_entropy = ce;
          opt.moe_probs = probs;
          opt.dropout = 0.1;
          const models::Workload w = models::build_workload(*m, 1024, opt);
          for (const models::Program& p : w.programs)
            for (const models::Op& op : p.ops)
              if (op.saved_bytes > 0) {
                INFO(p.name << " " << op.name);
                CHECK(std::string(op.saved_note) != "");
              }
        }
  }
}
