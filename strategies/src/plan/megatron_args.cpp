// A Megatron / MindSpeed command line as parallelism and training keys of a scenario.
#include <algorithm>
#include <sstream>

#include "moesim/strategies/plan/plan.hpp"

namespace moesim::strategies {

namespace {

// Arguments that do not change performance (optimiser hyper-parameters, data, logging).
constexpr const char* kIgnored[] = {
    "lr", "min-lr", "lr-decay-style", "lr-warmup-iters", "lr-warmup-fraction", "lr-decay-iters", "train-iters",
    "train-samples", "weight-decay", "clip-grad", "adam-beta1", "adam-beta2", "adam-eps", "init-method-std",
    "seed", "save", "load", "data-path", "split", "tokenizer-type", "tokenizer-model", "vocab-file", "merge-file",
    "log-interval", "save-interval", "eval-interval", "eval-iters", "tensorboard-dir", "distributed-backend",
    "num-workers", "no-load-optim", "no-load-rng", "attention-dropout", "hidden-dropout", "norm-epsilon",
    "rotary-base", "use-mcore-models", "transformer-impl", "use-flash-attn", "use-fused-rmsnorm",
    "use-fused-swiglu", "use-fused-rotary-pos-emb", "no-masked-softmax-fusion", "position-embedding-type",
    "normalization", "swiglu", "disable-bias-linear", "untie-embeddings-and-output-weights",
    "make-vocab-size-divisible-by", "max-position-embeddings", "moe-router-topk-scaling-factor",
    "moe-aux-loss-coeff", "moe-router-load-balancing-type", "moe-grouped-gemm", "moe-token-dispatcher-type",
    "moe-permute-fusion", "moe-router-dtype", "use-rotary-position-embeddings", "no-gradient-accumulation-fusion",
    "exit-interval", "log-throughput", "timing-log-level", "ckpt-format", "mock-data", "no-create-attention-mask-in-dataloader"};

bool ignored(const std::string& k) {
  for (const char* i : kIgnored)
    if (k == i) return true;
  return false;
}

}  // namespace

void apply_megatron_args(const std::string& args, nlohmann::json& par, nlohmann::json& training, const std::string& pointer,
                         Diagnostics& diag) {
  // The values become JSON strings, which must be valid UTF-8 (a JSON file's always are; text
  // from a script may not be).
  try {
    (void)nlohmann::json(args).dump();
  } catch (const nlohmann::json::exception&) {
    diag.error(pointer, "", "is not valid UTF-8 text");
    return;
  }
  std::istringstream in(args);
  std::vector<std::string> tokens;
  for (std::string t; in >> t;) tokens.push_back(t);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string& tok = tokens[i];
    if (tok.rfind("--", 0) != 0) {
      diag.error(pointer, "\"" + tok + "\"", "is not an argument (expected --name [value])");
      continue;
    }
    std::string name = tok.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    } else if (i + 1 < tokens.size() && tokens[i + 1].rfind("--", 0) != 0) {
      value = tokens[++i];
      has_value = true;
    }
    std::string key = name;
    std::replace(key.begin(), key.end(), '-', '_');
    auto as_json = [&](const std::string& v) {
      nlohmann::json x = nlohmann::json::parse(v, nullptr, false);
      return x.is_discarded() ? nlohmann::json(v) : x;
    };
    if (key == "bf16" || key == "fp16") {
      training["precision"] = key;
    } else if (key == "fp8_format" || key == "fp8") {
      training["precision"] = "fp8";
    } else if (key == "seq_length") {
      training["seq_length"] = as_json(value);
    } else if (key == "global_batch_size") {
      training["global_batch_size"] = as_json(value);
    } else if (key == "num_layers" || key == "hidden_size" || key == "num_attention_heads" || key == "ffn_hidden_size" ||
               key == "num_experts" || key == "moe_router_topk") {
      // Model shape belongs to the model section; accept it when it agrees, ignore otherwise.
      continue;
    } else if (key == "recompute_activations") {
      par["recompute_granularity"] = "selective";
    } else if (key == "noop_layers") {
      int n = 1;
      for (char c : value) n += c == ',';
      par["noop_layers"] = n;
    } else if (ignored(name) || (name.rfind("no-", 0) == 0 && ignored(name.substr(3)))) {
      continue;
    } else if (key == "tensor_model_parallel_size" || key == "pipeline_model_parallel_size" ||
               key == "virtual_pipeline_model_parallel_size" || key == "num_layers_per_virtual_pipeline_stage" ||
               key == "expert_model_parallel_size" || key == "expert_tensor_parallel_size" ||
               key == "context_parallel_size" || key == "micro_batch_size" || key == "recompute_granularity" ||
               key == "recompute_method" || key == "recompute_num_layers" || key == "decoder_first_pipeline_num_layers" ||
               key == "decoder_last_pipeline_num_layers" || key == "cp_comm_type") {
      if (!has_value) diag.error(pointer, "\"" + tok + "\"", "needs a value");
      else par[key] = as_json(value);
    } else if (key == "sequence_parallel" || key == "use_distributed_optimizer" || key == "overlap_grad_reduce" ||
               key == "overlap_param_gather" || key == "moe_tp_extend_ep" || key == "tp_comm_overlap" ||
               key == "moe_fb_overlap" || key == "moe_shared_expert_overlap" || key == "moe_alltoall_overlap_comm" ||
               key == "swap_optimizer" || key == "use_megatron_fsdp" ||
               key == "grad_reduce_in_bf16") {
      par[key] = has_value ? as_json(value) : nlohmann::json(true);
    } else if (key == "fp8_param_gather") {
      par[key] = has_value ? as_json(value) : nlohmann::json(true);
    } else if (key == "use_precision_aware_optimizer" || key == "reuse_grad_buf_for_mxfp8_param_ag") {
      // The dtypes below say what the precision-aware optimizer keeps; the MXFP8 parameter
      // all-gather reusing the gradient buffer needs no memory of its own, as moesim counts it.
      continue;
    } else if (key == "exp_avg_dtype" || key == "exp_avg_sq_dtype" || key == "main_params_dtype") {
      if (!has_value) diag.error(pointer, "\"" + tok + "\"", "needs a value");
      else par[key] = value;
    } else if (key == "main_grads_dtype") {  // the gradient buffer's dtype
      if (!has_value) diag.error(pointer, "\"" + tok + "\"", "needs a value");
      else if (value == "bf16") par["grad_reduce_in_bf16"] = true;
      else if (value != "fp32") diag.error(pointer, "\"" + value + "\"", "--main-grads-dtype must be fp32 or bf16");
    } else if (key == "data_parallel_sharding_strategy") {
      if (!has_value) diag.error(pointer, "\"" + tok + "\"", "needs a value");
      else par[key] = value;
    } else if (key == "recompute_modules") {
      nlohmann::json mods = nlohmann::json::array();
      mods.push_back(value);
      while (i + 1 < tokens.size() && tokens[i + 1].rfind("--", 0) != 0) mods.push_back(tokens[++i]);
      par[key] = mods;
    } else if (key == "moe_hierarchical_alltoallv") {  // MindSpeed: EP all-gather + TP all-to-all(v)
      par["moe_alltoall"] = "allgather";
    } else {
      diag.error(pointer, "\"" + tok + "\"",
                 "is not a Megatron/MindSpeed argument moesim understands; give it as a parallelism key or drop it");
    }
  }
}

}  // namespace moesim::strategies
