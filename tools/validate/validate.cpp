#include "validate.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <optional>
#include <regex>

#include <fmt/format.h>

#include "moesim/strategies/output/simulate.hpp"

namespace moesim::tools {
namespace {

using nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool has(const std::string& text, const char* word) { return lower(text).find(lower(word)) != std::string::npos; }

std::string text_of(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

std::optional<double> number_of(const json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::optional<int> int_of(const json& j, const char* key) {
  auto v = number_of(j, key);
  if (!v || *v != std::floor(*v)) return std::nullopt;
  return static_cast<int>(*v);
}

/// "name 123" or "name=123" in free text.
std::optional<int> find_int_after(const std::string& text, const std::string& name) {
  const std::regex re(name + R"([ =:]*(\d+))", std::regex::icase);
  std::smatch m;
  if (std::regex_search(text, m, re)) return std::stoi(m[1]);
  return std::nullopt;
}

// ---- published step time ------------------------------------------------------------------

struct CaseDims {
  double B = 0, s = 0, l = 0, h = 0, V = 0, ffn = 0, heads = 0, kv = 0;
};

CaseDims dims(const json& c) {
  const json& m = c["model"];
  CaseDims d;
  d.s = number_of(m, "seq_len").value_or(0);
  d.l = number_of(m, "layers").value_or(0);
  d.h = number_of(m, "hidden").value_or(0);
  d.V = number_of(m, "vocab").value_or(0);
  d.ffn = number_of(m, "ffn_hidden").value_or(4 * d.h);
  d.heads = number_of(m, "heads").value_or(1);
  d.kv = number_of(m, "kv_heads").value_or(d.heads);
  const json& b = c["batch"];
  d.B = number_of(b, "global_batch").value_or(0);
  if (d.B == 0 && d.s > 0) d.B = number_of(b, "tokens_per_batch").value_or(0) / d.s;
  return d;
}

/// FLOPs per iteration by the formula the case's `flops_definition` names, or nullopt.
std::optional<std::pair<double, std::string>> formula_flops(const json& c) {
  const std::string def = text_of(c, "flops_definition");
  const CaseDims d = dims(c);
  if (d.B <= 0 || d.s <= 0 || d.h <= 0 || d.l <= 0) return std::nullopt;
  if (has(def, "96*B*s*l*h^2")) {  // Narayanan et al. 2021, Eq. 3 (counts the recompute forward)
    return std::pair{96 * d.B * d.s * d.l * d.h * d.h * (1 + d.s / (6 * d.h) + d.V / (16 * d.l * d.h)),
                     "96Bslh^2(1+s/6h+V/16lh)"};
  }
  if (has(def, "72*B*s*l*h^2")) {  // Korthikanti et al. 2022 model FLOPs
    return std::pair{72 * d.B * d.s * d.l * d.h * d.h * (1 + d.s / (6 * d.h) + d.V / (12 * d.l * d.h)),
                     "72Bslh^2(1+s/6h+V/12lh)"};
  }
  if (has(def, "nemo") && has(text_of(c["model"], "mlp"), "swiglu")) {
    // NeMo's llama2/llama3 formula (nemo/utils/flops_formulas.py), attention non-causal:
    // gbs s l h^2 (12 + 12 kv/heads + 18 ffn/h + 12 s/h + 6 V/(l h)).
    return std::pair{d.B * d.s * d.l * d.h * d.h *
                         (12 + 12 * d.kv / d.heads + 18 * d.ffn / d.h + 12 * d.s / d.h + 6 * d.V / (d.l * d.h)),
                     "NeMo llama formula"};
  }
  return std::nullopt;
}

std::optional<double> stated_peak(const json& c) {
  const std::string def = text_of(c, "flops_definition");
  std::smatch m;
  if (std::regex_search(def, m, std::regex(R"((?:vs|against)\s*(\d+(?:\.\d+)?)\s*TFLOP)", std::regex::icase)))
    return std::stod(m[1]) * 1e12;
  return std::nullopt;
}

}  // namespace

PublishedTime published_step_time(const json& c, int devices) {
  PublishedTime p;
  const json& meas = c.contains("measured") ? c["measured"] : json::object();
  const json& der = c.contains("derived") ? c["derived"] : json::object();
  const json& hw = c.contains("hardware") ? c["hardware"] : json::object();
  const auto count = devices > 0 ? std::optional<double>(devices) : number_of(hw, "count");
  const CaseDims d = c.contains("model") && c.contains("batch") ? dims(c) : CaseDims{};
  double tokens = 0;
  if (c.contains("batch")) tokens = number_of(c["batch"], "tokens_per_batch").value_or(d.B * d.s);
  if (auto v = number_of(meas, "step_time_s")) {
    p.step_s = *v;
    p.basis = "step time (measured)";
    return p;
  }
  if (auto v = number_of(der, "iteration_time_s")) {
    p.step_s = *v;
    p.basis = "iteration time (derived in the case file)";
    return p;
  }
  if (!count) {
    p.skip_reason = "device count is not a number (" + text_of(hw, "count") + ")";
    return p;
  }
  for (const char* key : {"tokens_per_sec_per_gpu", "tokens_per_sec_per_npu"}) {
    if (auto v = number_of(meas, key); v && tokens > 0) {
      p.step_s = tokens / (*v * *count);
      p.basis = std::string("tokens/s per device (measured)");
      return p;
    }
  }
  if (auto v = number_of(meas, "tokens_per_sec_total"); v && tokens > 0) {
    p.step_s = tokens / *v;
    p.basis = "tokens/s (measured)";
    return p;
  }
  const auto f = formula_flops(c);
  for (const char* key : {"model_tflops_per_gpu_with_cp", "model_tflops_per_gpu", "tflops_per_gpu"}) {
    if (auto v = number_of(meas, key); v && f) {
      p.step_s = f->first / (*v * 1e12 * *count);
      p.basis = std::string("TFLOP/s per device (measured) with ") + f->second;
      return p;
    }
  }
  if (auto v = number_of(meas, "mfu_pct"); v && f) {
    if (auto peak = stated_peak(c)) {
      p.step_s = f->first / (*v / 100.0 * *peak * *count);
      p.basis = "MFU (measured) with " + f->second + fmt::format(" at {:.0f} TFLOP/s peak", *peak / 1e12);
      return p;
    }
  }
  if (auto v = number_of(der, "tokens_per_sec_per_gpu"); v && tokens > 0) {
    p.step_s = tokens / (*v * *count);
    p.basis = "tokens/s per device (derived in the case file, approximate)";
    return p;
  }
  if (number_of(meas, "mfu_pct"))
    p.skip_reason = "only an MFU is published, and its FLOP formula or peak is not stated (" +
                    text_of(c, "flops_definition") + ")";
  else
    p.skip_reason = "no step time, throughput or convertible FLOP rate is published";
  return p;
}

namespace {

// ---- case -> scenario ---------------------------------------------------------------------

json model_config(const json& c, std::vector<std::string>& notes, std::string& skip) {
  const json& m = c["model"];
  const std::string arch_notes = text_of(m, "arch_notes");
  const std::string mlp = lower(text_of(m, "mlp"));
  const std::string name = text_of(m, "name");
  auto need = [&](const char* key) -> double {
    auto v = number_of(m, key);
    if (!v) skip = std::string("model.") + key + " is missing";
    return v.value_or(1);
  };
  const double layers = need("layers"), hidden = need("hidden"), heads = need("heads"), vocab = need("vocab");
  const double kv = number_of(m, "kv_heads").value_or(heads);
  json cfg;
  cfg["name"] = name;
  // Keys every Hugging Face decoder config here shares.
  auto decoder_keys = [&](json& c) {
    c["hidden_size"] = hidden;
    c["num_hidden_layers"] = layers;
    c["num_attention_heads"] = heads;
    c["num_key_value_heads"] = kv;
    c["vocab_size"] = vocab;
  };
  if (text_of(m, "type") == "moe") {
    const json& moe = m.contains("moe") ? m["moe"] : json::object();
    const double experts = number_of(moe, "num_experts").value_or(0);
    const double top_k = number_of(moe, "top_k").value_or(0);
    const double expert_ffn = number_of(moe, "expert_ffn_hidden").value_or(0);
    const double shared = number_of(moe, "shared_experts").value_or(0);
    const double dense_layers = number_of(moe, "dense_layers").value_or(0);
    const double dense_ffn = number_of(moe, "dense_ffn_hidden").value_or(expert_ffn);
    if (experts <= 0 || top_k <= 0 || expert_ffn <= 0) {
      skip = "MoE dimensions (num_experts, top_k, expert_ffn_hidden) are incomplete";
      return cfg;
    }
    if (has(arch_notes, "MLA") || has(arch_notes, "kv_lora")) {
      cfg["architectures"] = {"DeepseekV3ForCausalLM"};
      for (const char* k : {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}) {
        auto v = find_int_after(arch_notes, k);
        if (!v) {
          skip = std::string("MLA dimension ") + k + " not found in model.arch_notes";
          return cfg;
        }
        cfg[k] = *v;
      }
      cfg["n_routed_experts"] = experts;
      cfg["n_shared_experts"] = shared;
      cfg["moe_intermediate_size"] = expert_ffn;
      cfg["first_k_dense_replace"] = dense_layers;
      cfg["intermediate_size"] = dense_ffn;
      int mtp = find_int_after(arch_notes, "MTP depth").value_or(0);
      if (has(text_of(c, "notes"), "no MTP")) mtp = 0;
      cfg["num_nextn_predict_layers"] = mtp;
    } else if (shared > 0) {
      skip = "MoE with shared experts and without MLA is not mapped to a supported architecture";
      return cfg;
    } else if (has(name, "mixtral")) {
      cfg["architectures"] = {"MixtralForCausalLM"};
      cfg["num_local_experts"] = experts;
      cfg["intermediate_size"] = expert_ffn;
    } else {
      cfg["architectures"] = {"Qwen3MoeForCausalLM"};
      cfg["num_experts"] = experts;
      cfg["moe_intermediate_size"] = expert_ffn;
      cfg["intermediate_size"] = dense_ffn;
      json only = json::array();
      for (int i = 0; i < static_cast<int>(dense_layers); ++i) only.push_back(i);
      cfg["mlp_only_layers"] = only;
      if (auto hd = find_int_after(arch_notes, "head_dim")) cfg["head_dim"] = *hd;
    }
    cfg["num_experts_per_tok"] = top_k;
    decoder_keys(cfg);
    return cfg;
  }
  const double ffn = number_of(m, "ffn_hidden").value_or(4 * hidden);
  if (!number_of(m, "ffn_hidden")) notes.push_back("FFN width not given: 4 x hidden");
  if (has(mlp, "swiglu")) {
    cfg["architectures"] = {"LlamaForCausalLM"};
    cfg["sandwich_norm"] = has(arch_notes, "sandwich");
  } else if (has(mlp, "squared_relu") || has(mlp, "relu2")) {
    cfg["architectures"] = {"NemotronForCausalLM"};
  } else {
    if (mlp.empty()) notes.push_back("MLP type not given: GPT-style GELU");
    cfg["architectures"] = {"GPT2LMHeadModel"};
    cfg["n_layer"] = layers;
    cfg["n_embd"] = hidden;
    cfg["n_head"] = heads;
    cfg["n_inner"] = ffn;
    cfg["vocab_size"] = vocab;
    cfg["n_positions"] = number_of(m, "seq_len").value_or(2048);
    cfg["tie_word_embeddings"] = true;
    if (kv != heads) {
      skip = "GPT-style model with grouped-query attention is not mapped";
    }
    return cfg;
  }
  cfg["intermediate_size"] = ffn;
  decoder_keys(cfg);
  return cfg;
}

/// Megatron's pipeline layout string ("Et|(tt|)*30L"): decoder layers per virtual stage.
std::optional<std::vector<int>> parse_pp_layout(const std::string& layout_text) {
  std::string layout = layout_text.substr(0, layout_text.find(' '));
  // Expand "(...)*N" repetitions.
  const std::regex rep(R"(\(([^()]*)\)\*(\d+))");
  std::smatch m;
  while (std::regex_search(layout, m, rep)) {
    std::string body;
    for (int i = 0; i < std::stoi(m[2]); ++i) body += m[1].str();
    layout = m.prefix().str() + body + m.suffix().str();
  }
  std::vector<int> counts{0};
  for (char ch : layout) {
    if (ch == '|') counts.push_back(0);
    else if (ch == 't') ++counts.back();
    else if (ch != 'E' && ch != 'L' && ch != 'm') return std::nullopt;
  }
  if (!counts.empty() && counts.back() == 0 && layout.back() == '|') counts.pop_back();
  return counts;
}

}  // namespace

ConvertedCase case_to_scenario(const json& c) {
  ConvertedCase out;
  auto& notes = out.assumptions;
  if (c.contains("scenario")) {  // a ready scenario (the form for one's own runs)
    out.scenario = c["scenario"];
    if (out.scenario.contains("cluster") && out.scenario["cluster"].is_object())
      out.devices = int_of(out.scenario["cluster"], "devices").value_or(0);
    return out;
  }
  for (const char* key : {"model", "hardware", "parallelism", "batch"})
    if (!c.contains(key) || !c[key].is_object()) {
      out.skip_reason = std::string("the case has no \"") + key + "\" object";
      return out;
    }
  const json& hw = c["hardware"];
  const json& par = c["parallelism"];
  const json& batch = c["batch"];
  const std::string category = text_of(c, "category");
  json s;
  s["model"] = model_config(c, notes, out.skip_reason);
  if (!out.skip_reason.empty()) return out;

  // Hardware.
  const std::string dev = text_of(hw, "device");
  std::string cluster;
  if (has(dev, "GB200")) cluster = "gb200-nvl72";
  else if (has(dev, "B200")) cluster = "dgx-b200";
  else if (has(dev, "H100")) cluster = "dgx-h100";
  else if (has(dev, "H800")) cluster = "dgx-h800";
  else if (has(dev, "A100") && has(dev, "Jean Zay")) cluster = "jean-zay-a100";  // BLOOM's machine
  else if (has(dev, "A100")) cluster = "dgx-a100";
  else if (has(dev, "Ascend") || has(dev, "Atlas") || has(dev, "910B")) cluster = "atlas-800t-a2";
  else {
    out.skip_reason = "no cluster preset for device \"" + dev + "\"";
    return out;
  }
  if (cluster == "atlas-800t-a2") notes.push_back("910B variant not stated: Ascend 910B2 (353.8 TFLOP/s)");
  auto count = int_of(hw, "count");
  if (!count) {
    out.skip_reason = "device count is not a number (" + text_of(hw, "count") + ")";
    return out;
  }
  {
    // When the published layout does not multiply to the device count, one of the columns is
    // wrong; the layout is kept when the global batch only divides with its DP (the per-device
    // rate that is compared does not depend on which column is wrong).
    const int tp = int_of(par, "tp").value_or(1), pp = int_of(par, "pp").value_or(1), cp = int_of(par, "cp").value_or(1);
    const auto dp = int_of(par, "dp");
    const int gbs = int_of(batch, "global_batch").value_or(0);
    const int mbs = int_of(batch, "micro_batch").value_or(1);
    const long long product = dp ? 1LL * tp * pp * cp * *dp : *count;
    if (product != *count) {
      const long long dp_from_count = *count / std::max(1, tp * pp * cp);
      const bool count_fits = gbs > 0 && dp_from_count > 0 && gbs % (mbs * dp_from_count) == 0;
      if (!count_fits && gbs > 0 && gbs % (mbs * *dp) == 0) {
        notes.push_back(fmt::format("published TP x PP x CP x DP = {} differs from the {} devices; the global batch "
                                    "only divides with the published DP, so {} devices are simulated",
                                    product, *count, product));
        count = static_cast<int>(product);
      } else {
        notes.push_back(fmt::format("published TP x PP x CP x DP = {} differs from the {} devices: DP derived from the count",
                                    product, *count));
      }
    }
  }
  out.devices = *count;
  s["cluster"] = {{"preset", cluster}, {"devices", *count}};

  // Training.
  const std::string prec = lower(text_of(hw, "precision"));
  std::string precision = "bf16";
  if (has(prec, "fp8")) precision = "fp8";
  else if (has(prec, "fp16") && !has(prec, "bf16")) precision = "fp16";
  const double seq = number_of(c["model"], "seq_len").value_or(0);
  double gbs = number_of(batch, "global_batch").value_or(0);
  if (gbs <= 0 && seq > 0) gbs = number_of(batch, "tokens_per_batch").value_or(0) / seq;
  if (seq <= 0 || gbs <= 0) {
    out.skip_reason = seq <= 0 ? "sequence length not published" : "global batch size not published";
    return out;
  }
  json training = {{"seq_length", seq}, {"global_batch_size", gbs}, {"precision", precision}};
  // The software stack, from the source: framework facts become a named preset
  // (models/presets/software) instead of rules here, so that a 2021 stack and a 2025 one are
  // inputs of the scenario.
  std::string stack;
  const int year = c.contains("software") && c["software"].is_object() ? int_of(c["software"], "year").value_or(0) : 0;
  if (category == "megatron_sc21_weak_scaling" || category == "megatron_selective_recompute")
    stack = "megatron-lm-2021";  // unfused attention, dropout 0.1
  else if (category.rfind("megatron_deepspeed", 0) == 0)
    stack = "megatron-deepspeed-2022";  // unfused attention
  else if (category.rfind("nemo_perf_summary", 0) == 0)
    stack = "nemo-2-perf";  // distributed optimizer, DP and TP overlap, BF16 gradients
  else if (category.rfind("nemo", 0) == 0)
    stack = "nemo-2";
  else if (category.rfind("torchtitan", 0) == 0)
    stack = "torchtitan-2024";  // FlashAttention-2 through SDPA, PyTorch cross-entropy
  else if (category.rfind("ascend_mindspeed", 0) == 0 && (year == 0 || year <= 2024))
    stack = "mindspeed-llm-2024";  // routing weights applied to the expert outputs
  if (!stack.empty()) {
    s["software"] = stack;
    notes.push_back("software stack " + stack + " (from the source)");
  }
  s["training"] = training;

  // Parallelism.
  json p;
  const int tp = int_of(par, "tp").value_or(1), pp = int_of(par, "pp").value_or(1);
  const int cp = int_of(par, "cp").value_or(1);
  p["tp"] = tp;
  p["pp"] = pp;
  p["cp"] = cp;
  if (auto vpp = int_of(par, "vpp"); vpp && *vpp > 1) p["vpp"] = *vpp;
  // Weights and optimizer states as the precision text names them (Megatron's DeepSeek-V3
  // GB200 guide: "--fp8-param-gather", "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16").
  if (precision == "fp8" && (has(prec, "fp8 param gather") || has(prec, "fp8-param-gather") || has(prec, "fp8 params"))) {
    p["fp8_param_gather"] = true;
    notes.push_back("FP8 weights (fp8 param gather): no BF16 copy, FP8 parameter all-gather");
  }
  if (has(prec, "bf16 adam moments") || has(prec, "bf16 optimizer states")) {
    p["exp_avg_dtype"] = "bf16";
    p["exp_avg_sq_dtype"] = "bf16";
    notes.push_back("precision-aware optimizer: BF16 Adam moments");
  }
  const bool moe = text_of(c["model"], "type") == "moe";
  if (moe) {
    p["ep"] = int_of(par, "ep").value_or(1);
    p["etp"] = int_of(par, "etp").value_or(1);
  }
  if (auto mbs = int_of(batch, "micro_batch")) p["mbs"] = *mbs;
  else notes.push_back("micro-batch size not published: 1");
  const std::string overlap = text_of(par, "comm_overlap");
  const bool nemo = category.rfind("nemo", 0) == 0;
  bool sp = par.contains("sequence_parallel") && par["sequence_parallel"].is_boolean() && par["sequence_parallel"].get<bool>();
  // NeMo's stack overlaps TP communication itself (with sequence parallelism); stated flags and
  // MindSpeed's MC2 are the case's own.
  const bool tp_overlap = tp > 1 && (has(overlap, "tp-comm-overlap") || has(text_of(c, "notes"), "mc2"));
  if (tp > 1 && (tp_overlap || moe || nemo) && !sp) {
    sp = true;
    notes.push_back("sequence parallelism assumed (required by TP communication overlap / MoE)");
  }
  p["sequence_parallel"] = sp && tp > 1;
  if (tp_overlap && tp > 1) {
    p["tp_comm_overlap"] = true;
    if (!has(overlap, "tp-comm-overlap")) notes.push_back("MC2 (fused matmul + TP comm)");
  }
  const std::string zero = lower(text_of(par, "zero_or_fsdp"));
  // "FSDP" named as off ("FSDP=0", "no FSDP", "without FSDP", "FSDP off") is not FSDP.
  const bool fsdp = has(zero, "fsdp") &&
                    !std::regex_search(zero, std::regex(R"(fsdp\s*[=:]\s*(0|false|off|no)\b|(no|without|not)\s+(megatron-)?fsdp|fsdp\s+(off|disabled))"));
  bool distopt = has(zero, "distributed") || has(zero, "zero") || fsdp;
  if (!distopt && has(overlap, "overlap-param-gather")) {
    distopt = true;  // Megatron's --overlap-param-gather requires the distributed optimizer
    notes.push_back("distributed optimizer implied by --overlap-param-gather");
  }
  // An unstated optimizer on NeMo is the stack's (the distributed optimizer).
  if (!(nemo && zero.empty() && !distopt)) p["use_distributed_optimizer"] = distopt;
  if (fsdp) {
    // Megatron-FSDP's default strategy shards parameters, gradients and optimizer states.
    p["data_parallel_sharding_strategy"] = "optim_grads_params";
    notes.push_back("Megatron-FSDP: parameters, gradients and optimizer states sharded (optim_grads_params)");
  }
  // The Megatron-MoE-ModelZoo benchmarking configs (model_configs/benchmarking/*.yaml) pass
  // --overlap-grad-reduce and --overlap-param-gather with the distributed optimizer, and
  // Megatron-FSDP overlaps its parameter gathers and gradient reduce-scatters with compute by
  // design (Megatron Core developer guide, "Megatron FSDP": communication/computation overlap).
  const bool zoo = category == "megatron_moe_modelzoo";
  const bool dp_overlap = (zoo || fsdp) && distopt;  // NeMo's stack overlaps DP itself
  if (has(overlap, "overlap-grad-reduce") || dp_overlap) p["overlap_grad_reduce"] = true;
  if (distopt && (has(overlap, "overlap-param-gather") || dp_overlap)) p["overlap_param_gather"] = true;
  if (dp_overlap && overlap.empty())
    notes.push_back(zoo ? "Megatron-MoE-ModelZoo config: --overlap-grad-reduce --overlap-param-gather"
                        : "Megatron-FSDP: gradient and parameter communication overlapped");

  // Recomputation.
  const std::string rec = lower(text_of(c, "recompute"));
  if (rec.rfind("full", 0) == 0 || has(rec, "full activation recomputation")) {
    p["recompute_granularity"] = "full";
    // "block" as Megatron's method ("full, block, N" or "--recompute-method block"), not as
    // in "every TransformerBlock".
    const bool block = has(rec, "block,") || has(rec, "method block");
    p["recompute_method"] = block ? "block" : "uniform";
    p["recompute_num_layers"] = find_int_after(rec, "block,").value_or(1);
    if (has(rec, "activation-function")) notes.push_back("activation-function recomputation beside full recompute ignored");
  } else if (has(rec, "selective")) {
    p["recompute_granularity"] = "selective";
    json mods = json::array();
    if (has(rec, "layernorm")) mods.push_back("layernorm");
    if (has(rec, "moe_act")) mods.push_back("moe_act");
    if (has(rec, "up_proj")) mods.push_back("mla_up_proj");
    if (has(rec, "mlp")) mods.push_back("mlp");
    if (has(rec, "softmax") || has(rec, "core_attn") || has(rec, "qk^t")) mods.push_back("core_attn");
    if (mods.empty()) mods.push_back("core_attn");
    p["recompute_modules"] = mods;
  } else if (!(rec.rfind("none", 0) == 0)) {
    notes.push_back("recomputation not stated: none");
  }

  // Pipeline layout and token dispatcher.
  const int num_layers = int_of(c["model"], "layers").value_or(0);
  const int vstages = pp * std::max(1, int_of(par, "vpp").value_or(1));
  if (const std::string layout = text_of(par, "pp_layout"); !layout.empty()) {
    if (auto counts = parse_pp_layout(layout)) p["pipeline_layer_partition"] = *counts;
    else notes.push_back("pipeline layout \"" + layout + "\" not understood: automatic partition");
  } else if (category == "megatron_moe_modelzoo" && pp > 1 && num_layers > 0 && (num_layers + 2) % vstages == 0) {
    // The model zoo's benchmarking configs (model_configs/benchmarking/*.yaml) pass
    // --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split:
    // Megatron splits layers + 2 evenly over the virtual stages, the embedding taking one
    // layer's slot on the first and the loss one on the last (which leaves the heavy output
    // layer on a stage that is not lighter by its real cost).
    const int per = (num_layers + 2) / vstages;
    json counts = json::array();
    for (int v = 0; v < vstages; ++v) counts.push_back(per - (v == 0 ? 1 : 0) - (v == vstages - 1 ? 1 : 0));
    p["pipeline_layer_partition"] = counts;
    notes.push_back(fmt::format("Megatron-MoE-ModelZoo: even split of {} layers + embedding + loss, {} per virtual stage",
                                num_layers, per));
  } else if (pp > 1 && num_layers > 0 && num_layers % vstages == 0 &&
             (category.rfind("megatron", 0) == 0 || category.rfind("nemo", 0) == 0 ||
              category.rfind("ascend_mindspeed", 0) == 0)) {
    // Megatron-core (and NeMo and MindSpeed on it) split the layers evenly over the virtual
    // stages unless told otherwise (transformer_block.py get_num_layers_to_build).
    p["pipeline_layer_partition"] = "even";
    notes.push_back(fmt::format("Megatron's default: an even split, {} layers per virtual stage", num_layers / vstages));
  } else {
    p["pipeline_layer_partition"] = "auto";
  }
  const std::string dispatcher = lower(text_of(par, "token_dispatcher"));
  if (moe && (has(dispatcher, "deepep") || has(dispatcher, "hybridep"))) p["moe_alltoall"] = "hierarchical";
  s["parallelism"] = p;
  s["seed"] = 1;
  out.scenario = s;
  return out;
}

namespace {

std::string plan_text(const json& scenario) {
  const json& p = scenario.contains("parallelism") ? scenario["parallelism"] : json::object();
  std::string t;
  auto add = [&](const char* label, const char* key, bool always) {
    // The scenario's short keys or Megatron's long names.
    static const std::map<std::string, std::string> long_name{{"tp", "tensor_model_parallel_size"},
                                                               {"pp", "pipeline_model_parallel_size"},
                                                               {"vpp", "virtual_pipeline_model_parallel_size"},
                                                               {"cp", "context_parallel_size"},
                                                               {"ep", "expert_model_parallel_size"}};
    auto v = int_of(p, key);
    if (!v) v = int_of(p, long_name.at(key).c_str());
    if (v && (always || *v > 1)) t += fmt::format("{}{}{}", t.empty() ? "" : " ", label, *v);
  };
  add("TP", "tp", true);
  add("PP", "pp", true);
  add("VPP", "vpp", false);
  add("CP", "cp", false);
  add("EP", "ep", false);
  return t;
}

ErrorStats stats_of(const std::vector<const CaseOutcome*>& v, double CaseOutcome::*error = &CaseOutcome::error_pct) {
  ErrorStats s;
  for (const CaseOutcome* c : v) {
    const double e = std::abs(c->*error);
    s.mean_abs_pct += e;
    if (e >= s.max_abs_pct) {
      s.max_abs_pct = e;
      s.worst = c->id;
    }
    ++s.n;
  }
  if (s.n > 0) s.mean_abs_pct /= s.n;
  return s;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// The case's measured peak memory per device in GiB, or nullopt when it has none: either
/// measured.peak_memory_gib, or measured.peak_memory with measured.unit "GiB" or "GB" (1e9
/// bytes; sources print both, and they differ by 7%). Problems go to
/// `diag` at the case's JSON pointer `at`.
std::optional<double> measured_peak_gib(const json& c, const std::string& at, Diagnostics& diag) {
  if (!c.contains("measured") || !c["measured"].is_object()) return std::nullopt;
  const json& m = c["measured"];
  const bool in_gib = m.contains("peak_memory_gib"), with_unit = m.contains("peak_memory");
  if (!in_gib && !with_unit) return std::nullopt;
  if (in_gib && with_unit) {
    diag.error(at + "/measured/peak_memory", json_brief(m["peak_memory"]),
               "must not be given together with measured.peak_memory_gib");
    return std::nullopt;
  }
  const char* key = in_gib ? "peak_memory_gib" : "peak_memory";
  const json& v = m[key];
  if (!v.is_number() || v.get<double>() <= 0) {
    diag.error(at + "/measured/" + key, json_brief(v), "must be a positive number (peak memory per device)");
    return std::nullopt;
  }
  const double peak = v.get<double>();
  if (in_gib) return peak;
  const auto unit = m.find("unit");
  if (unit != m.end() && *unit == "GiB") return peak;
  if (unit != m.end() && *unit == "GB") return peak * 1e9 / kGiB;
  diag.error(at + "/measured/unit", unit == m.end() ? "" : json_brief(*unit),
             unit == m.end() ? "is required with measured.peak_memory: \"GiB\" or \"GB\" (1e9 bytes)"
                             : "must be \"GiB\" or \"GB\" (1e9 bytes), the unit of measured.peak_memory");
  return std::nullopt;
}

/// The pipeline stage whose rank logged the measured peak: measured.peak_memory_stage "worst"
/// (the default: the maximum over ranks, or unknown), "first", "last" or a stage index. Runs
/// often log memory from one rank only (Megatron-LM's last rank, torchtitan's rank 0), and
/// pipeline stages differ by tens of percent.
constexpr int kWorstStage = -1;
constexpr int kLastStage = -2;
int measured_stage(const json& c, const std::string& at, Diagnostics& diag) {
  if (!c.contains("measured") || !c["measured"].is_object() || !c["measured"].contains("peak_memory_stage"))
    return kWorstStage;
  const json& v = c["measured"]["peak_memory_stage"];
  if (v.is_string() && v == "worst") return kWorstStage;
  if (v.is_string() && v == "first") return 0;
  if (v.is_string() && v == "last") return kLastStage;
  if (v.is_number_integer() && v.get<long long>() >= 0 && v.get<long long>() <= std::numeric_limits<int>::max())
    return static_cast<int>(v.get<long long>());
  diag.error(at + "/measured/peak_memory_stage", json_brief(v),
             "must be \"worst\", \"first\", \"last\" or a pipeline stage index (the rank that logged the peak)");
  return kWorstStage;
}

/// "80" for 80.0 GiB, "167.6" otherwise: device capacities are mostly whole GiB.
std::string gib_brief(double gib) {
  std::string t = fmt::format("{:.1f}", gib);
  if (t.ends_with(".0")) t.resize(t.size() - 2);
  return t;
}

/// Held out: the id's last digit is odd (case_001, asc_013; an id without digits is in the
/// fitting half). Only the parity matters, so ids of any length are fine.
bool odd_id(const std::string& id) {
  for (auto it = id.rbegin(); it != id.rend(); ++it)
    if (std::isdigit(static_cast<unsigned char>(*it))) return (*it - '0') % 2 == 1;
  return false;
}

}  // namespace

ValidationReport validate(const json& cases, const std::string& file, const ValidateOptions& opt) {
  return validate(std::vector<CaseFile>{CaseFile{file, cases}}, opt);
}

std::string source_of(const json& c) {
  if (c.contains("source_group") && c["source_group"].is_string()) return c["source_group"].get<std::string>();
  return text_of(c, "category");
}

ValidationReport validate(const std::vector<CaseFile>& files, const ValidateOptions& opt) {
  ValidationReport rep;
  {
    std::vector<Diagnostic> bad;
    for (const CaseFile& f : files) {
      rep.file += (rep.file.empty() ? "" : ", ") + f.path;
      const json* list = &f.cases;
      if (f.cases.is_object() && f.cases.contains("cases")) list = &f.cases["cases"];
      if (!list->is_array()) bad.push_back(Diagnostic{f.path, "", json_brief(f.cases), "must be a list of cases"});
    }
    if (!bad.empty()) throw ConfigError(bad);
  }
  std::set<std::string> seen_ids;
  for (const CaseFile& f : files) {
  const std::string& file = f.path;
  const json* list = &f.cases;
  if (f.cases.is_object() && f.cases.contains("cases")) list = &f.cases["cases"];
  const std::string list_pointer = list == &f.cases ? "" : "/cases";
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& c = (*list)[i];
    const std::string at = fmt::format("{}/{}", list_pointer, i);
    CaseOutcome o;
    o.id = c.is_object() && c.contains("id") ? text_of(c, "id") : fmt::format("#{}", i);
    if (!opt.only.empty() && std::find(opt.only.begin(), opt.only.end(), o.id) == opt.only.end()) continue;
    o.held_out = odd_id(o.id);
    o.file = file;
    if (!c.is_object()) {
      o.status = "error";
      o.reason = fmt::format("{}:{}: must be an object", file, at);
      rep.cases.push_back(o);
      continue;
    }
    if (!seen_ids.insert(o.id).second) {
      o.status = "error";
      o.reason = fmt::format("{}:{}/id: \"{}\" is already the id of an earlier case (ids must be unique across files)",
                             file, at, o.id);
      rep.cases.push_back(o);
      continue;
    }
    o.category = text_of(c, "category");
    o.source = source_of(c);
    if (c.contains("model")) o.model = text_of(c["model"], "name");
    else if (c.contains("scenario") && c["scenario"].is_object() && c["scenario"].contains("model")) {
      const json& m = c["scenario"]["model"];  // a preset name or an inline config
      o.model = m.is_string() ? m.get<std::string>() : text_of(m, "name");
    }
    if (c.contains("hardware")) o.device = text_of(c["hardware"], "device");
    ConvertedCase conv = case_to_scenario(c);
    const PublishedTime pub = published_step_time(c, conv.devices);
    o.assumptions = conv.assumptions;
    o.scenario = conv.scenario;
    o.devices = conv.devices;
    o.plan = plan_text(conv.scenario);
    o.basis = pub.basis;
    o.published_s = pub.step_s;
    Diagnostics memory_diag(file);
    o.measured_peak_gib = measured_peak_gib(c, at, memory_diag);
    const int stage_of_peak = measured_stage(c, at, memory_diag);
    if (!memory_diag.ok()) {
      o.status = "error";
      o.reason = ConfigError(memory_diag.list()).what();
      rep.cases.push_back(o);
      continue;
    }
    if (!pub.skip_reason.empty() && conv.skip_reason.empty() && o.measured_peak_gib) {
      // A measured peak alone is worth a run (memory tables seldom come with step times): the
      // case is compared on memory only.
      o.timed = false;
      o.basis.clear();
      o.published_s = 0;
      o.assumptions.push_back("step time not compared: " + pub.skip_reason);
    } else if (!pub.skip_reason.empty() || !conv.skip_reason.empty()) {
      o.status = "skipped";
      o.reason = !pub.skip_reason.empty() ? pub.skip_reason : conv.skip_reason;
      rep.cases.push_back(o);
      continue;
    }
    try {
      json doc = conv.scenario;
      Diagnostics set_diag(file);
      for (const auto& ov : opt.overrides) apply_override(doc, ov, set_diag);
      set_diag.throw_if_any();
      strategies::Scenario sc = strategies::load_scenario(doc, file + " case " + o.id, "");
      strategies::set_fidelity(sc, opt.fidelity);
      if (!sc.software.applied.empty()) {
        std::string applied;
        for (const auto& a : sc.software.applied) applied += (applied.empty() ? "" : ", ") + a;
        o.assumptions.push_back(sc.software.name + " sets " + applied);
      }
      const strategies::Simulation sim = strategies::simulate(sc, opt.cancel);
      o.predicted_s = sim.result.step_time_s;
      if (o.timed) o.error_pct = 100.0 * (o.predicted_s - o.published_s) / o.published_s;
      o.feasible = sim.result.feasible;
      o.mfu = sim.result.mfu;
      o.bubble_fraction = sim.result.breakdown.bubble_s / sim.result.step_time_s;
      // Memory: the peak is the worst stage's (the first with the largest total); the measured
      // peak is compared with the stage that logged it (the worst unless the case names one).
      // PyTorch's allocator statistics (what runs log) do not see the CUDA context, NCCL's
      // buffers or fragmentation, which moesim's runtime reserve stands for: the comparison is
      // with the stage's total without that reserve.
      const strategies::StageResult* worst = nullptr;
      for (const auto& st : sim.result.stages)
        if (worst == nullptr || st.memory.total() > worst->memory.total()) worst = &st;
      o.predicted_peak_gib = sim.result.peak_memory_bytes / kGiB;
      o.capacity_gib = sim.result.capacity_bytes / kGiB;
      const strategies::StageResult* measured_at = worst;
      if (stage_of_peak != kWorstStage && !sim.result.stages.empty()) {
        const int n = static_cast<int>(sim.result.stages.size());
        const int idx = stage_of_peak == kLastStage ? n - 1 : std::min(stage_of_peak, n - 1);
        measured_at = &sim.result.stages[static_cast<std::size_t>(idx)];
        if (stage_of_peak >= n)
          o.assumptions.push_back(fmt::format("measured stage {} beyond the plan's {} stages: the last", stage_of_peak, n));
      }
      if (measured_at != nullptr)
        o.predicted_allocated_gib = (measured_at->memory.total() - measured_at->memory.reserved_bytes) / kGiB;
      o.memory_stage = measured_at == nullptr ? 0 : static_cast<int>(measured_at - sim.result.stages.data());
      if (o.measured_peak_gib)
        o.memory_error_pct = 100.0 * (o.predicted_allocated_gib - *o.measured_peak_gib) / *o.measured_peak_gib;
      o.status = "ok";
      if (!o.feasible) o.assumptions.push_back("moesim predicts it does not fit: " + sim.result.infeasible_reason);
    } catch (const ConfigError& e) {
      o.status = "error";
      o.reason = e.what();
    } catch (const Cancelled&) {
      throw;
    } catch (const std::exception& e) {
      o.status = "error";
      o.reason = std::string("internal error: ") + e.what();
    }
    if (opt.progress) {
      std::string what = o.reason;
      if (o.status == "ok") {
        what = o.timed ? fmt::format("{:+.1f}%", o.error_pct) : "memory only";
        if (o.measured_peak_gib) what += fmt::format(", memory {:+.1f}%", o.memory_error_pct);
      }
      std::cerr << fmt::format("{:<10} {:<8} {}\n", o.id, o.status, what);
    }
    rep.cases.push_back(std::move(o));
  }
  }
  std::vector<const CaseOutcome*> all, fit, held, memory;
  std::map<std::string, std::vector<const CaseOutcome*>> cat, dev;
  for (const auto& c : rep.cases) {
    if (c.status == "skipped") ++rep.skipped;
    if (c.status == "error") ++rep.errors;
    if (c.status != "ok") continue;
    ++rep.ran;
    if (!c.feasible) rep.predicted_not_to_fit.push_back(c.id);
    if (c.measured_peak_gib) memory.push_back(&c);
    if (!c.timed) continue;
    all.push_back(&c);
    (c.held_out ? held : fit).push_back(&c);
    cat[c.category].push_back(&c);
    const std::string preset = c.scenario["cluster"]["preset"].get<std::string>();
    dev[preset].push_back(&c);
  }
  rep.all = stats_of(all);
  rep.fit = stats_of(fit);
  rep.held_out = stats_of(held);
  for (auto& [k, v] : cat) rep.by_category.emplace_back(k, stats_of(v));
  for (auto& [k, v] : dev) rep.by_device.emplace_back(k, stats_of(v));
  rep.memory = stats_of(memory, &CaseOutcome::memory_error_pct);
  return rep;
}

std::string to_markdown(const ValidationReport& r) {
  std::string o;
  o += fmt::format("# moesim validation: {}\n\n", r.file);
  o += "| split | cases | mean abs error | max abs error | worst |\n|---|---|---|---|---|\n";
  auto row = [&](const std::string& name, const ErrorStats& s) {
    o += fmt::format("| {} | {} | {:.1f}% | {:.1f}% | {} |\n", name, s.n, s.mean_abs_pct, s.max_abs_pct, s.worst);
  };
  row("all", r.all);
  row("fit half (even ids)", r.fit);
  row("held-out half (odd ids)", r.held_out);
  if (r.memory.n > 0)
    o += fmt::format("\nmemory (measured peaks): {} cases, mean |error| {:.1f}%, max {:.1f}% ({})\n", r.memory.n,
                     r.memory.mean_abs_pct, r.memory.max_abs_pct, r.memory.worst);
  else
    o += "\nmemory (measured peaks): none in this file\n";
  std::string ids;
  for (const auto& id : r.predicted_not_to_fit) ids += (ids.empty() ? "" : ", ") + id;
  o += fmt::format("\npredicted not to fit: {} of {} runs that ran{}\n", r.predicted_not_to_fit.size(), r.ran,
                   ids.empty() ? "" : " (" + ids + ")");
  o += fmt::format("\n{} skipped, {} errors.\n\n", r.skipped, r.errors);
  if (!r.by_category.empty()) {  // empty when only memory was measured
    o += "| category | cases | mean abs error | max abs error |\n|---|---|---|---|\n";
    for (const auto& [k, s] : r.by_category) o += fmt::format("| {} | {} | {:.1f}% | {:.1f}% |\n", k, s.n, s.mean_abs_pct, s.max_abs_pct);
    o += "\n| cluster | cases | mean abs error | max abs error |\n|---|---|---|---|\n";
    for (const auto& [k, s] : r.by_device) o += fmt::format("| {} | {} | {:.1f}% | {:.1f}% |\n", k, s.n, s.mean_abs_pct, s.max_abs_pct);
  }
  o += "\n| case | model | devices | plan | published s | predicted s | error | peak GiB | memory error | basis |\n";
  o += "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& c : r.cases) {
    if (c.status != "ok") continue;
    const std::string dash = "—";
    o += fmt::format("| {}{} | {} | {} x {} | {} | {} | {} | {} | {:.1f}/{} | {} | {} |\n", c.id, c.held_out ? "" : "*",
                     c.model, c.devices, c.scenario["cluster"]["preset"].get<std::string>(), c.plan,
                     c.timed ? fmt::format("{:.3f}", c.published_s) : dash,
                     c.timed ? fmt::format("{:.3f}", c.predicted_s) : dash,
                     c.timed ? fmt::format("{:+.1f}%", c.error_pct) : dash, c.predicted_peak_gib,
                     gib_brief(c.capacity_gib),
                     c.measured_peak_gib ? fmt::format("{:+.1f}%", c.memory_error_pct) : dash,
                     c.timed ? c.basis : dash);
  }
  o += "\n`*` marks the fitting half. Peak GiB: the worst stage per device (runtime reserve included) / the "
       "capacity; the memory error compares a measured peak with the stage that logged it (measured.peak_memory_stage, else the worst) without the reserve.\n";
  bool any = false;
  for (const auto& c : r.cases) {
    if (c.status == "ok") continue;
    if (!any) o += "\n| case | status | reason |\n|---|---|---|\n";
    any = true;
    std::string reason = c.reason;
    std::replace(reason.begin(), reason.end(), '\n', ' ');
    std::replace(reason.begin(), reason.end(), '|', '/');
    o += fmt::format("| {} | {} | {} |\n", c.id, c.status, reason);
  }
  return o;
}

json to_json(const ValidationReport& r) {
  auto st = [](const ErrorStats& s) {
    return json{{"cases", s.n}, {"mean_abs_error_pct", s.mean_abs_pct}, {"max_abs_error_pct", s.max_abs_pct}, {"worst", s.worst}};
  };
  json j;
  j["file"] = r.file;
  j["summary"] = {{"all", st(r.all)}, {"fit", st(r.fit)}, {"held_out", st(r.held_out)}, {"skipped", r.skipped}, {"errors", r.errors}};
  json cats = json::object(), devs = json::object();
  for (const auto& [k, s] : r.by_category) cats[k] = st(s);
  for (const auto& [k, s] : r.by_device) devs[k] = st(s);
  j["summary"]["by_category"] = cats;
  j["summary"]["by_cluster"] = devs;
  j["summary"]["memory"] = st(r.memory);
  j["summary"]["predicted_not_to_fit"] = r.predicted_not_to_fit;
  json cases = json::array();
  for (const auto& c : r.cases) {
    json x = {{"id", c.id}, {"status", c.status}, {"category", c.category}, {"model", c.model}, {"devices", c.devices},
              {"split", c.held_out ? "held_out" : "fit"}};
    if (c.status == "ok") {
      x["plan"] = c.plan;
      if (c.timed) {  // a memory-only case has no step time to compare
        x["published_s"] = c.published_s;
        x["predicted_s"] = c.predicted_s;
        x["error_pct"] = c.error_pct;
        x["basis"] = c.basis;
        x["mfu"] = c.mfu;
        x["bubble_fraction"] = c.bubble_fraction;
      }
      x["feasible"] = c.feasible;
      x["predicted_peak_gib"] = c.predicted_peak_gib;
      x["predicted_allocated_gib"] = c.predicted_allocated_gib;
      x["capacity_gib"] = c.capacity_gib;
      if (c.measured_peak_gib) {
        x["measured_peak_gib"] = *c.measured_peak_gib;
        x["memory_error_pct"] = c.memory_error_pct;
        x["memory_stage"] = c.memory_stage;
      }
    } else {
      x["reason"] = c.reason;
    }
    x["assumptions"] = c.assumptions;
    if (!c.scenario.is_null()) x["scenario"] = c.scenario;
    cases.push_back(x);
  }
  j["cases"] = cases;
  return j;
}

}  // namespace moesim::tools
