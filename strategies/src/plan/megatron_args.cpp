// A Megatron / MindSpeed command line as parallelism and training keys of a scenario.
//
// MindSpeed's flags (reference/pangu.md G) mean what MindSpeed means; a flag whose effect moesim
// does not model is refused with what it would take, never silently dropped. A key given both
// on the command line and in the scenario must agree, and the model's shape flags must match
// the model: a launch script copied next to a different model or batch is an error, not a
// silent mixture of the two.
#include <algorithm>
#include <sstream>

#include "moesim/strategies/plan/plan.hpp"

namespace moesim::strategies {

namespace {

// Arguments that do not change performance (optimiser hyper-parameters, data, logging), and
// `--moe-permute-fusion`: moesim's permutation already costs what the fused kernel moves (one
// read of each token, one write per routed copy), so the flag changes nothing here.
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

// Flags moesim refuses, with the reason (what MindSpeed does that is not modelled, and what to
// give instead).
constexpr std::pair<const char*, const char*> kRefused[] = {
    {"adaptive-recompute-device-size",
     "is MindSpeed's adaptive selective recompute, which picks modules per layer at run time from the device memory "
     "size it is given; moesim does not replay that policy: give recompute_granularity / recompute_modules, or let "
     "`moesim search` choose recomputation against the device's memory"},
    {"adaptive-memory-optimization",
     "lets MindSpeed choose recompute or swap per module at run time from profiling; moesim does not replay that "
     "policy: give recompute_modules and swap_activations, or let `moesim search` choose"},
    {"recompute-in-bubble",
     "moves MindSpeed's recomputation into pipeline bubbles; moesim recomputes right before each backward and does "
     "not model the move (the step time would be an upper bound): drop the flag"},
    {"recompute-in-advance",
     "moves MindSpeed's recomputation earlier into pipeline bubbles; moesim recomputes right before each backward "
     "and does not model the move: drop the flag"},
    {"swap-attention",
     "swaps only the attention block's activations (MindSpeed --swap-modules); moesim swaps a share of each chunk's "
     "saved activations: give parallelism.swap_activations (the attention block holds about a third of a layer's "
     "saved activations with MLA and selective recompute; `moesim simulate --memory-detail` lists each term)"},
    {"moe-zero-memory-num-layers",
     "limits --moe-zero-memory to some layers of each stage; moesim applies it to every decoder layer: drop the "
     "flag or the zero-memory level"},
};

const char* refused(const std::string& name) {
  for (const auto& [flag, why] : kRefused)
    if (name == flag) return why;
  return nullptr;
}

// Flags that name the model's shape: checked against the model, never applied to it.
constexpr std::pair<const char*, const char*> kShapeFlags[] = {
    {"num_layers", "decoder layers"},
    {"hidden_size", "hidden size"},
    {"num_attention_heads", "attention heads"},
    {"num_query_groups", "key/value heads"},
    {"ffn_hidden_size", "dense FFN width"},
    {"moe_ffn_hidden_size", "expert FFN width"},
    {"num_experts", "routed experts"},
    {"moe_router_topk", "experts per token"},
    {"mtp_num_layers", "multi-token-prediction layers"},
};

bool is_shape_flag(const std::string& key) {
  return std::any_of(std::begin(kShapeFlags), std::end(kShapeFlags), [&](const auto& f) { return key == f.first; });
}

std::string brief(const nlohmann::json& v) { return v.is_string() ? "\"" + v.get<std::string>() + "\"" : v.dump(); }

}  // namespace

MegatronArgs parse_megatron_args(const std::string& args, const std::string& pointer, Diagnostics& diag) {
  MegatronArgs out;
  nlohmann::json& par = out.parallelism;
  nlohmann::json& training = out.training;
  // The values become JSON strings, which must be valid UTF-8 (a JSON file's always are; text
  // from a script may not be).
  try {
    (void)nlohmann::json(args).dump();
  } catch (const nlohmann::json::exception&) {
    diag.error(pointer, "", "is not valid UTF-8 text");
    return out;
  }
  std::istringstream in(args);
  std::vector<std::string> tokens;
  for (std::string t; in >> t;) tokens.push_back(t);
  bool mc2 = false, sequence_parallel = false;
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
    const std::string written = has_value ? "--" + name + " " + value : "--" + name;
    std::string key = name;
    std::replace(key.begin(), key.end(), '-', '_');
    auto as_json = [&](const std::string& v) {
      nlohmann::json x = nlohmann::json::parse(v, nullptr, false);
      return x.is_discarded() ? nlohmann::json(v) : x;
    };
    auto set = [&](nlohmann::json& section, const std::string& k, nlohmann::json v) {
      section[k] = std::move(v);
      out.flag[k] = written;
    };
    auto needs_value = [&] {
      if (!has_value) diag.error(pointer, "\"" + tok + "\"", "needs a value");
      return has_value;
    };
    if (const char* why = refused(name)) {
      diag.error(pointer, "\"" + written + "\"", why);
    } else if (key == "bf16" || key == "fp16") {
      set(training, "precision", key);
    } else if (key == "fp8_format" || key == "fp8") {
      set(training, "precision", "fp8");
    } else if (key == "seq_length" || key == "global_batch_size") {
      if (needs_value()) set(training, key, as_json(value));
    } else if (is_shape_flag(key)) {
      if (needs_value()) set(out.model, key, as_json(value));
    } else if (key == "group_query_attention") {
      continue;  // --num-query-groups carries the number
    } else if (key == "recompute_activations") {
      set(par, "recompute_granularity", "selective");
    } else if (key == "recompute_activation_function") {
      // MindSpeed: the MLP / experts' activation function re-run in the backward (its output
      // not kept), without selective recompute's core attention.
      set(par, "recompute_activation_function", true);
    } else if (key == "use_mc2") {
      // MindSpeed MC2: the TP all-gather / reduce-scatter fused with the matmul it feeds or
      // drains (needs sequence parallelism, as in MindSpeed).
      mc2 = true;
      set(par, "tp_comm_overlap", true);
    } else if (key == "moe_zero_memory") {
      if (needs_value()) {
        if (value != "disable" && value != "level0" && value != "level1")
          diag.error(pointer, "\"" + written + "\"", "must be disable, level0 or level1 (as in MindSpeed)");
        else
          set(par, "moe_zero_memory", value);
      }
    } else if (key == "schedules_method") {  // MindSpeed: --schedules-method dualpipev
      if (needs_value()) {
        if (value != "dualpipev") diag.error(pointer, "\"" + written + "\"", "must be dualpipev (MindSpeed's only value)");
        else set(par, "pipeline_schedule", "dualpipev");
      }
    } else if (key == "noop_layers") {
      int n = 1;
      for (char c : value) n += c == ',';
      set(par, "noop_layers", n);
    } else if (ignored(name) || (name.rfind("no-", 0) == 0 && ignored(name.substr(3)))) {
      continue;
    } else if (key == "tensor_model_parallel_size" || key == "pipeline_model_parallel_size" ||
               key == "virtual_pipeline_model_parallel_size" || key == "num_layers_per_virtual_pipeline_stage" ||
               key == "expert_model_parallel_size" || key == "expert_tensor_parallel_size" ||
               key == "context_parallel_size" || key == "micro_batch_size" || key == "recompute_granularity" ||
               key == "recompute_method" || key == "recompute_num_layers" || key == "decoder_first_pipeline_num_layers" ||
               key == "decoder_last_pipeline_num_layers" || key == "cp_comm_type") {
      if (needs_value()) set(par, key, as_json(value));
    } else if (key == "sequence_parallel" || key == "use_distributed_optimizer" || key == "overlap_grad_reduce" ||
               key == "overlap_param_gather" || key == "moe_tp_extend_ep" || key == "tp_comm_overlap" ||
               key == "moe_fb_overlap" || key == "moe_shared_expert_overlap" || key == "moe_alltoall_overlap_comm" ||
               key == "swap_optimizer" || key == "use_megatron_fsdp" || key == "grad_reduce_in_bf16" ||
               key == "fp8_param_gather") {
      set(par, key, has_value ? as_json(value) : nlohmann::json(true));
      if (key == "sequence_parallel") sequence_parallel = true;
    } else if (key == "use_precision_aware_optimizer" || key == "reuse_grad_buf_for_mxfp8_param_ag") {
      // The dtypes below say what the precision-aware optimizer keeps; the MXFP8 parameter
      // all-gather reusing the gradient buffer needs no memory of its own, as moesim counts it.
      continue;
    } else if (key == "exp_avg_dtype" || key == "exp_avg_sq_dtype" || key == "main_params_dtype" ||
               key == "data_parallel_sharding_strategy") {
      if (needs_value()) set(par, key, value);
    } else if (key == "main_grads_dtype") {  // the gradient buffer's dtype
      if (!needs_value()) continue;
      if (value == "bf16") set(par, "grad_reduce_in_bf16", true);
      else if (value != "fp32") diag.error(pointer, "\"" + value + "\"", "--main-grads-dtype must be fp32 or bf16");
    } else if (key == "recompute_modules") {
      nlohmann::json mods = nlohmann::json::array();
      mods.push_back(value);
      while (i + 1 < tokens.size() && tokens[i + 1].rfind("--", 0) != 0) mods.push_back(tokens[++i]);
      set(par, key, mods);
    } else if (key == "moe_hierarchical_alltoallv") {  // MindSpeed: EP all-gather + TP all-to-all(v)
      set(par, "moe_alltoall", "allgather");
    } else {
      diag.error(pointer, "\"" + tok + "\"",
                 "is not a Megatron/MindSpeed argument moesim understands; give it as a parallelism key or drop it");
    }
  }
  if (mc2 && !sequence_parallel)
    diag.error(pointer, "\"--use-mc2\"", "needs --sequence-parallel (MindSpeed's MC2 fuses the sequence-parallel "
                                         "all-gather and reduce-scatter with their matmuls)");
  return out;
}

namespace {

/// The scenario's own spelling of a parallelism key (the key or its short alias), or "".
std::string spelled_in(const nlohmann::json& section, const std::string& key) {
  if (section.contains(key)) return key;
  for (auto [alias, full] : kParallelismAliases)
    if (key == full && section.contains(std::string(alias))) return std::string(alias);
  return "";
}

/// The model's value of a shape flag, or null when the model does not have that part.
nlohmann::json model_value(const models::ModelSpec& m, const std::string& key) {
  if (key == "num_layers") return m.num_layers;
  if (key == "hidden_size") return m.hidden;
  if (key == "num_attention_heads") return m.heads;
  if (key == "num_query_groups") return m.kv_heads;
  if (key == "ffn_hidden_size") return m.ffn_hidden > 0 ? nlohmann::json(m.ffn_hidden) : nlohmann::json();
  if (key == "moe_ffn_hidden_size") return m.is_moe() ? nlohmann::json(m.expert_ffn_hidden) : nlohmann::json();
  if (key == "num_experts") return m.num_experts;
  if (key == "moe_router_topk") return m.is_moe() ? nlohmann::json(m.top_k) : nlohmann::json();
  if (key == "mtp_num_layers") return m.mtp_layers;
  return {};
}

}  // namespace

void merge_megatron_args(nlohmann::json& par, nlohmann::json& training, const models::ModelSpec* model,
                         Diagnostics& diag) {
  if (!par.is_object() || !par.contains("megatron_args")) return;
  const std::string pointer = "/parallelism/megatron_args";
  if (!par["megatron_args"].is_string()) {
    diag.error(pointer, json_brief(par["megatron_args"]), "must be a string of command-line arguments");
    return;
  }
  const MegatronArgs a = parse_megatron_args(par["megatron_args"].get<std::string>(), pointer, diag);
  auto merge = [&](nlohmann::json& section, const nlohmann::json& from, const std::string& name) {
    if (!section.is_object()) return;
    for (auto it = from.begin(); it != from.end(); ++it) {
      const std::string spelled = name == "parallelism" ? spelled_in(section, it.key())
                                                        : (section.contains(it.key()) ? it.key() : "");
      if (spelled.empty()) {
        section[it.key()] = it.value();
      } else if (section[spelled] != it.value()) {
        diag.error("/" + name + "/" + spelled, brief(section[spelled]),
                   "contradicts \"" + a.flag.at(it.key()) + "\" in " + pointer + "; give the value once");
      }
    }
  };
  merge(par, a.parallelism, "parallelism");
  merge(training, a.training, "training");
  if (model == nullptr) return;
  // MindSpeed's --num-layers counts its no-op padding layers (--noop-layers) too.
  const int noop = a.parallelism.contains("noop_layers") ? a.parallelism["noop_layers"].get<int>() : 0;
  for (auto it = a.model.begin(); it != a.model.end(); ++it) {
    nlohmann::json want = model_value(*model, it.key());
    const char* what = "";
    for (const auto& [k, w] : kShapeFlags)
      if (it.key() == k) what = w;
    if (want.is_null()) {
      diag.error(pointer, "\"" + a.flag.at(it.key()) + "\"",
                 std::string("gives ") + what + " the model (/model) does not have");
      continue;
    }
    const bool agrees = it.key() == "num_layers"
                            ? it.value() == want || it.value() == nlohmann::json(model->num_layers + noop)
                            : it.value() == want;
    if (!agrees)
      diag.error(pointer, "\"" + a.flag.at(it.key()) + "\"",
                 "contradicts the model's " + brief(want) + " " + what + " (/model" +
                     (noop > 0 && it.key() == "num_layers" ? ", plus " + std::to_string(noop) + " no-op layers" : "") +
                     "); the command line does not change the model: fix the flag or the model");
  }
}

}  // namespace moesim::strategies
