#pragma once
// Model architecture: a normalised description read from a Hugging Face `config.json` (or a
// preset in that form), with the dimensions that change FLOPs, bytes and parameters.
//
//   Diagnostics diag{"scenario.json"};
//   ModelSpec m = parse_model_config(json, "/model", diag);   // Llama, Qwen, DeepSeek-V3, ...
//   m.is_moe_layer[3];   // true for DeepSeek-V3 (first_k_dense_replace = 3)
//
// Understood: architectures LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM,
// NemotronForCausalLM, GPT2LMHeadModel
// and model_type pangu_ultra_moe. Metadata keys (rope_theta, token ids, ...) are accepted and
// ignored; any other unknown key is an error, because it might change the FLOPs or the bytes.
// List keys that do not matter in "moesim_ignore_keys" to accept them.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/sim/config.hpp"

namespace moesim::models {

enum class AttentionKind : std::uint8_t { GQA, MLA };  ///< GQA covers MHA (kv_heads == heads)
enum class MlpKind : std::uint8_t { SwiGLU, GELU };  ///< gated (3 matrices) / plain (2 matrices: GELU, ReLU^2)
enum class NormKind : std::uint8_t { RMSNorm, LayerNorm };

struct ModelSpec {
  std::string name;
  std::string architecture;
  std::string source_file;  ///< the config.json it was read from (empty: preset or inline)
  int num_layers = 0;
  std::int64_t hidden = 0;
  std::int64_t vocab = 0;
  bool tie_embeddings = false;
  std::int64_t learned_positions = 0;  ///< GPT-2 style position-embedding rows (0: rotary)

  AttentionKind attention = AttentionKind::GQA;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;    ///< query/key head dimension (MLA: nope + rope)
  int v_head_dim = 0;  ///< value head dimension
  // MLA only
  int q_lora_rank = 0;  ///< 0: queries are not compressed
  int kv_lora_rank = 0;
  int qk_nope_dim = 0;
  int qk_rope_dim = 0;
  std::int64_t sliding_window = 0;  ///< 0: full attention
  bool qk_norm = false;

  MlpKind mlp = MlpKind::SwiGLU;
  NormKind norm = NormKind::RMSNorm;
  bool sandwich_norm = false;  ///< two extra norms per layer (Pangu's depth-scaled sandwich norm)
  std::int64_t ffn_hidden = 0;  ///< dense MLP width

  // Mixture of experts (num_experts == 0: dense model)
  int num_experts = 0;
  int top_k = 0;
  std::int64_t expert_ffn_hidden = 0;
  int num_shared_experts = 0;
  std::int64_t shared_expert_ffn_hidden = 0;  ///< total width of the shared experts
  std::vector<bool> is_moe_layer;             ///< per decoder layer

  int mtp_layers = 0;  ///< multi-token-prediction modules (DeepSeek-V3, Pangu)

  [[nodiscard]] bool is_moe() const { return num_experts > 0; }
  [[nodiscard]] int num_moe_layers() const;
  [[nodiscard]] int num_dense_layers() const { return num_layers - num_moe_layers(); }
};

ModelSpec parse_model_config(const nlohmann::json& j, const std::string& pointer, Diagnostics& diag);

}  // namespace moesim::models
