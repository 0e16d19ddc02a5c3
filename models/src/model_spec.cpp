#include "moesim/models/model_spec.hpp"

#include <algorithm>
#include <string_view>

namespace moesim::models {

int ModelSpec::num_moe_layers() const {
  return static_cast<int>(std::count(is_moe_layer.begin(), is_moe_layer.end(), true));
}

namespace {

// Keys found in the supported families' config.json files that do not change the training
// FLOPs, bytes or parameters (numerics, initialisation, token ids, inference settings).
constexpr std::string_view kIgnorable[] = {
    "architectures", "model_type", "torch_dtype", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "rope_theta", "rope_scaling", "max_position_embeddings", "initializer_range",
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "use_cache", "attention_dropout", "hidden_dropout",
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout", "attention_bias", "mlp_bias", "pretraining_tp",
    "auto_map", "quantization_config", "routed_scaling_factor", "norm_topk_prob", "topk_method", "n_group",
    "topk_group", "scoring_func", "aux_loss_alpha", "seq_aux", "ep_size", "router_aux_loss_coef",
    "router_jitter_noise", "output_router_logits", "name_or_path", "max_window_layers", "use_sliding_window",
    "bos_token", "eos_token", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "task_specific_params", "n_ctx", "use_return_dict", "output_hidden_states", "output_attentions",
    "is_encoder_decoder", "keys_to_ignore_at_inference", "rope_interleave", "rope_type", "partial_rotary_factor",
    "first_k_dense_replace_dense_act", "generation_config", "tokenizer_class", "vision_config",
    "use_flash_attn", "attn_implementation", "residual_dropout", "use_qk_norm", "sandwich_norm_eps",
    "norm_eps",
};

bool family_is(std::string_view arch, std::string_view model_type, std::initializer_list<std::string_view> archs,
               std::string_view mtype) {
  for (auto a : archs)
    if (arch == a) return true;
  return !mtype.empty() && model_type == mtype;
}

}  // namespace

ModelSpec parse_model_config(const nlohmann::json& j, const std::string& pointer, Diagnostics& diag) {
  ModelSpec m;
  ObjectReader r(j, pointer, diag);
  if (!r.valid()) return m;

  for (auto k : kIgnorable) r.ignore({k});
  // Keys starting with '_' are comments and metadata ("_name_or_path", "_source").
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!it.key().empty() && it.key()[0] == '_') r.ignore({it.key()});
  if (const auto* extra = r.get({"moesim_ignore_keys"})) {
    if (!extra->is_array()) {
      diag.error(r.child_pointer("moesim_ignore_keys"), json_brief(*extra), "must be a list of key names");
    } else {
      for (const auto& k : *extra)
        if (k.is_string()) r.ignore({k.get<std::string>()});
    }
  }

  std::string arch;
  if (const auto* a = r.get({"architectures"})) {
    if (a->is_array() && !a->empty() && (*a)[0].is_string()) arch = (*a)[0].get<std::string>();
    else diag.error(r.child_pointer("architectures"), json_brief(*a), "must be a list with one architecture name");
  }
  const std::string model_type = r.string({"model_type"}, "");
  m.name = r.string({"name"}, "");
  m.architecture = arch.empty() ? model_type : arch;

  const bool gpt2 = family_is(arch, model_type, {"GPT2LMHeadModel"}, "gpt2");
  const bool dsv3 = family_is(arch, model_type, {"DeepseekV3ForCausalLM"}, "deepseek_v3");
  const bool pangu = family_is(arch, model_type, {"PanguUltraMoEForCausalLM"}, "pangu_ultra_moe");
  const bool mixtral = family_is(arch, model_type, {"MixtralForCausalLM"}, "mixtral");
  const bool qwen3moe = family_is(arch, model_type, {"Qwen3MoeForCausalLM"}, "qwen3_moe");
  const bool nemotron = family_is(arch, model_type, {"NemotronForCausalLM"}, "nemotron");
  const bool llama_like =
      family_is(arch, model_type, {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"},
                "") ||
      model_type == "llama" || model_type == "mistral" || model_type == "qwen2" || model_type == "qwen3";
  if (!(gpt2 || dsv3 || pangu || mixtral || qwen3moe || llama_like || nemotron)) {
    diag.error(r.child_pointer(arch.empty() ? "model_type" : "architectures"),
               arch.empty() ? "\"" + model_type + "\"" : "[\"" + arch + "\"]",
               "is not a supported architecture; supported: LlamaForCausalLM, MistralForCausalLM, "
               "MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
               "DeepseekV3ForCausalLM, NemotronForCausalLM, GPT2LMHeadModel, model_type pangu_ultra_moe");
    r.finish();
    return m;
  }
  // Upper bounds on every dimension: several times the largest published model's, so that a
  // typo or a generated config (n_inner = 2^32) is an input error rather than hours of
  // arithmetic. Largest published values: 128 layers, hidden 25,600 and 160 heads (Megatron-LM's
  // 1T GPT, Narayanan et al. 2021, Table 1), dense FFN 4 x 25,600 = 102,400, vocabulary 262,144
  // (Gemma 3), 384 routed experts (Kimi K2), head dimension 256, context 10M tokens (Llama 4 Scout).
  constexpr std::int64_t kMaxLayers = 1024, kMaxHidden = 1 << 17, kMaxFfn = 1 << 20, kMaxVocab = 1 << 21;
  constexpr std::int64_t kMaxHeads = 4096, kMaxHeadDim = 4096, kMaxRank = 1 << 16, kMaxExperts = 1 << 16;
  constexpr std::int64_t kMaxPositions = 1 << 26;

  if (gpt2) {
    m.num_layers = static_cast<int>(r.required_integer({"n_layer", "num_hidden_layers"}, 1, kMaxLayers));
    m.hidden = r.required_integer({"n_embd", "hidden_size"}, 1, kMaxHidden);
    m.heads = static_cast<int>(r.required_integer({"n_head", "num_attention_heads"}, 1, kMaxHeads));
    m.kv_heads = m.heads;
    const auto inner = r.opt_integer({"n_inner", "intermediate_size"}, 1, kMaxFfn);
    m.ffn_hidden = inner.value_or(4 * m.hidden);
    m.vocab = r.required_integer({"vocab_size"}, 1, kMaxVocab);
    m.learned_positions = r.integer({"n_positions"}, 1024, 0, kMaxPositions);
    m.tie_embeddings = r.boolean({"tie_word_embeddings"}, true);
    const std::string act = r.string({"activation_function"}, "gelu_new",
                                     {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu", "quick_gelu"});
    (void)act;  // all are pointwise with the same cost class
    m.mlp = MlpKind::GELU;
    m.norm = NormKind::LayerNorm;
    if (m.heads > 0) m.head_dim = m.v_head_dim = static_cast<int>(m.hidden / m.heads);
    if (m.heads > 0 && m.hidden % m.heads != 0)
      diag.error(r.child_pointer("n_head"), std::to_string(m.heads),
                 "must divide n_embd=" + std::to_string(m.hidden));
  } else {
    m.num_layers = static_cast<int>(r.required_integer({"num_hidden_layers"}, 1, kMaxLayers));
    m.hidden = r.required_integer({"hidden_size"}, 1, kMaxHidden);
    m.vocab = r.required_integer({"vocab_size"}, 1, kMaxVocab);
    m.heads = static_cast<int>(r.required_integer({"num_attention_heads"}, 1, kMaxHeads));
    m.kv_heads = static_cast<int>(r.integer({"num_key_value_heads"}, m.heads, 1, kMaxHeads));
    m.tie_embeddings = r.boolean({"tie_word_embeddings"}, false);
    // Llama-family decoders always use a gated MLP (gate, up, down); the activation only
    // names the gate. Nemotron's MLP is not gated (up, squared ReLU, down) and uses LayerNorm.
    r.string({"hidden_act"}, nemotron ? "relu2" : "silu",
             {"silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "relu2"});
    m.mlp = nemotron ? MlpKind::GELU : MlpKind::SwiGLU;
    if (nemotron) m.norm = NormKind::LayerNorm;
    if (!nemotron) m.norm = NormKind::RMSNorm;
    m.sandwich_norm = r.boolean({"sandwich_norm"}, pangu);
    if (m.heads > 0 && m.kv_heads > 0 && m.heads % m.kv_heads != 0)
      diag.error(r.child_pointer("num_key_value_heads"), std::to_string(m.kv_heads),
                 "must divide num_attention_heads=" + std::to_string(m.heads));
    const auto window = r.opt_integer({"sliding_window"}, 0, kMaxPositions);
    // Qwen configs carry sliding_window with use_sliding_window=false; honour the switch.
    const bool window_on = j.contains("use_sliding_window") ? j["use_sliding_window"].is_boolean() &&
                                                                  j["use_sliding_window"].get<bool>()
                                                            : true;
    if (window && window_on) m.sliding_window = *window;
    if (m.heads > 0) m.head_dim = static_cast<int>(r.integer({"head_dim"}, m.hidden / m.heads, 1, kMaxHeadDim));
    m.v_head_dim = m.head_dim;
    m.qk_norm = family_is(arch, model_type, {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"}, "qwen3") || qwen3moe;

    if (dsv3 || pangu) {
      m.attention = AttentionKind::MLA;
      m.q_lora_rank = static_cast<int>(r.integer({dsv3 ? "q_lora_rank" : "attention_q_lora_dim"}, 0, 0, kMaxRank));
      m.kv_lora_rank = static_cast<int>(r.required_integer({dsv3 ? "kv_lora_rank" : "attention_kv_lora_dim"}, 1, kMaxRank));
      m.qk_nope_dim = static_cast<int>(r.required_integer({dsv3 ? "qk_nope_head_dim" : "attention_qk_dim"}, 1, kMaxHeadDim));
      m.qk_rope_dim = static_cast<int>(r.required_integer({dsv3 ? "qk_rope_head_dim" : "attention_qk_rope_dim"}, 0, kMaxHeadDim));
      m.v_head_dim = static_cast<int>(r.required_integer({dsv3 ? "v_head_dim" : "attention_v_dim"}, 1, kMaxHeadDim));
      m.head_dim = m.qk_nope_dim + m.qk_rope_dim;
      m.ffn_hidden = r.required_integer({"intermediate_size"}, 1, kMaxFfn);
      m.num_experts = static_cast<int>(r.required_integer({dsv3 ? "n_routed_experts" : "num_routed_experts"}, 0, kMaxExperts));
      m.num_shared_experts = static_cast<int>(r.integer({dsv3 ? "n_shared_experts" : "num_shared_experts"}, 0, 0, 1024));
      m.top_k = static_cast<int>(r.required_integer({"num_experts_per_tok"}, 1, kMaxExperts));
      m.expert_ffn_hidden = r.required_integer({"moe_intermediate_size"}, 1, kMaxFfn);
      m.shared_expert_ffn_hidden = m.expert_ffn_hidden * m.num_shared_experts;
      m.mtp_layers = static_cast<int>(r.integer({dsv3 ? "num_nextn_predict_layers" : "num_mtp_layers"}, 0, 0, 64));
      const int dense = static_cast<int>(r.integer({dsv3 ? "first_k_dense_replace" : "num_dense_layers"}, 0, 0, m.num_layers));
      const int freq = dsv3 ? static_cast<int>(r.integer({"moe_layer_freq"}, 1, 1, 1 << 20)) : 1;
      m.is_moe_layer.assign(m.num_layers, false);
      for (int i = dense; i < m.num_layers; ++i) m.is_moe_layer[i] = ((i - dense) % freq) == 0;
    } else if (mixtral) {
      m.ffn_hidden = r.required_integer({"intermediate_size"}, 1, kMaxFfn);
      m.num_experts = static_cast<int>(r.required_integer({"num_local_experts"}, 1, kMaxExperts));
      m.top_k = static_cast<int>(r.required_integer({"num_experts_per_tok"}, 1, kMaxExperts));
      m.expert_ffn_hidden = m.ffn_hidden;
      m.is_moe_layer.assign(m.num_layers, true);
    } else if (qwen3moe) {
      m.ffn_hidden = r.integer({"intermediate_size"}, 0, 0, kMaxFfn);
      m.num_experts = static_cast<int>(r.required_integer({"num_experts"}, 1, kMaxExperts));
      m.top_k = static_cast<int>(r.required_integer({"num_experts_per_tok"}, 1, kMaxExperts));
      m.expert_ffn_hidden = r.required_integer({"moe_intermediate_size"}, 1, kMaxFfn);
      const int step = static_cast<int>(r.integer({"decoder_sparse_step"}, 1, 1, 1 << 20));
      std::vector<int> mlp_only;
      if (const auto* mo = r.get({"mlp_only_layers"})) {
        if (!mo->is_array()) diag.error(r.child_pointer("mlp_only_layers"), json_brief(*mo), "must be a list of layer indices");
        else
          for (const auto& x : *mo)
            if (x.is_number_integer()) mlp_only.push_back(x.get<int>());
      }
      m.is_moe_layer.assign(m.num_layers, false);
      for (int i = 0; i < m.num_layers; ++i)
        m.is_moe_layer[i] = std::find(mlp_only.begin(), mlp_only.end(), i) == mlp_only.end() && (i + 1) % step == 0;
      if (m.num_moe_layers() < m.num_layers && m.ffn_hidden == 0)
        diag.error(r.child_pointer("intermediate_size"), "", "is required when some layers are dense (mlp_only_layers)");
    } else {
      m.ffn_hidden = r.required_integer({"intermediate_size"}, 1, kMaxFfn);
    }
    if (m.is_moe_layer.empty()) m.is_moe_layer.assign(m.num_layers, false);
    if (m.is_moe() && m.top_k > m.num_experts)
      diag.error(r.child_pointer("num_experts_per_tok"), std::to_string(m.top_k),
                 "must not exceed the number of experts (" + std::to_string(m.num_experts) + ")");
  }
  if (m.is_moe_layer.empty()) m.is_moe_layer.assign(std::max(0, m.num_layers), false);
  if (m.name.empty()) m.name = m.architecture;
  r.finish(
      "is not understood by moesim and might change the FLOPs or the bytes; if it does not, list it in "
      "\"moesim_ignore_keys\"");
  return m;
}

}  // namespace moesim::models
