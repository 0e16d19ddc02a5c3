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

TEST_CASE("memory: operator-level checkpointing and the loss implementation", "[memory]") {
  nlohmann::json j = llama("optim");
  const Simulation none = simulate(load_scenario(j, "t.json", ""));
  j["parallelism"]["recompute_granularity"] = "selective_op";
  const Simulation op = simulate(load_scenario(j, "t.json", ""));
  // Per token and layer (h 2048, kv 512, f 5632): the input h, the outputs of the 1st and 3rd
  // matmuls (qkv 3072, mlp_up 2 x 5632) and attention's output (h) with its statistics
  // (16 heads x 4 bytes): 2 x (2048 + 3072 + 11264 + 2048) + 64 bytes.
  const double per_token_layer = 2.0 * (2048 + 3072 + 11264 + 2048) + 64;
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
