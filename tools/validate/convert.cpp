// Published cases to moesim: the step time by each source's own definition, and the case as a
// scenario (model config, cluster preset, plan, software stack), with every assumption listed.
#include <cmath>
#include <regex>

#include <fmt/format.h>

#include "case_fields.hpp"
#include "validate.hpp"

namespace moesim::tools {
using namespace fields;

namespace {

// ---- published step time ------------------------------------------------------------------

struct CaseDims {
  double B = 0, s = 0, l = 0, h = 0, V = 0, ffn = 0, heads = 0, kv = 0;
};

CaseDims dims(const json& c) {
  const json& m = field(c, "model");
  CaseDims d;
  d.s = number_of(m, "seq_len").value_or(0);
  d.l = number_of(m, "layers").value_or(0);
  d.h = number_of(m, "hidden").value_or(0);
  d.V = number_of(m, "vocab").value_or(0);
  d.ffn = number_of(m, "ffn_hidden").value_or(4 * d.h);
  d.heads = number_of(m, "heads").value_or(1);
  d.kv = number_of(m, "kv_heads").value_or(d.heads);
  const json& b = field(c, "batch");
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
  if (has(def, "nemo") && has(text_of(field(c, "model"), "mlp"), "swiglu")) {
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
  // A sliding window the framework really applies ("sliding window 4096" in the notes, e.g.
  // MindSpeed-LLM's --sliding-window, a banded flash-attention mask) bounds the keys per query.
  if (auto w = find_int_after(arch_notes, "sliding window")) {
    cfg["sliding_window"] = *w;
    notes.push_back("attention limited to a sliding window of " + std::to_string(*w) + " tokens");
  }
  return cfg;
}

/// Megatron's pipeline layout string ("Et|(tt|)*30L"): decoder layers per virtual stage.
std::optional<std::vector<int>> parse_pp_layout(const std::string& layout_text) {
  std::string layout = layout_text.substr(0, layout_text.find(' '));
  // Expand "(...)*N" repetitions.
  const std::regex rep(R"(\(([^()]*)\)\*(\d+))");
  std::smatch m;
  while (std::regex_search(layout, m, rep)) {
    // A layout describes at most a few hundred stages: a repetition count past that (or one
    // that does not fit an int) is not a layout.
    const std::string count = m[2].str();
    if (count.size() > 4) return std::nullopt;
    const int times = std::stoi(count);
    if (layout.size() + static_cast<std::size_t>(times) * m[1].length() > 100000) return std::nullopt;
    std::string body;
    for (int i = 0; i < times; ++i) body += m[1].str();
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
  // Meta's Grand Teton servers: torchtitan's benchmarks ran them at the 500 W default limit
  // with 96 GB HBM2e; the Llama 3 runs at 700 W with HBM3, on RoCE pods.
  else if (has(dev, "H100") && has(dev, "Grand Teton") && has(dev, "500 W")) cluster = "grand-teton-h100-500w";
  else if (has(dev, "H100") && has(dev, "Grand Teton")) cluster = "grand-teton-h100";
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
    // Sizes below 1 are not sizes (the scenario reports them); products in 64 bits.
    auto size = [](std::optional<int> v) { return std::max<long long>(1, v.value_or(1)); };
    const long long tp = size(int_of(par, "tp")), pp = size(int_of(par, "pp")), cp = size(int_of(par, "cp"));
    auto dp = int_of(par, "dp");
    if (dp && *dp < 1) dp.reset();
    const long long gbs = int_of(batch, "global_batch").value_or(0);
    const long long mbs = size(int_of(batch, "micro_batch"));
    const long long product = dp ? tp * pp * cp * *dp : *count;
    if (product != *count && product > 0 && product <= (1LL << 24)) {
      const long long dp_from_count = *count / (tp * pp * cp);
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
  // What the case itself states about its software, beyond the stack.
  const json no_statement = json::object();
  const json& stated = c.contains("software") && c["software"].is_object() ? c["software"] : no_statement;
  // Layers captured in CUDA graphs, where the run's configuration says so (Megatron-Bridge's
  // perf_matrix cuda_graphs): kernels replayed without a host launch each.
  if (stated.contains("cuda_graphs") && stated["cuda_graphs"] == true) {
    json sw = {{"host_dispatch", "graphs"}};
    if (!stack.empty()) sw["preset"] = stack;
    s["software"] = sw;
    notes.push_back("layers in CUDA graphs (the run's configuration): no host launch per operator");
  }
  // An attention kernel the case states against its stack's default (a script without
  // --use-flash-attn runs Megatron's unfused CoreAttention).
  if (lower(text_of(stated, "attention_kernel")).starts_with("unfused")) {
    training["attention_kernel"] = "unfused";
    notes.push_back("unfused attention (batched GEMMs around a softmax), as the case states");
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
  // How the CP ranks exchange keys and values, where the case states it: Megatron's names.
  if (const std::string t = text_of(par, "cp_comm_type"); cp > 1 && !t.empty()) {
    p["cp_comm_type"] = t;
    notes.push_back("context parallelism by " + std::string(t == "all_gather" ? "all-gather" : "ring") + " (stated)");
  }
  // An interleaved schedule whose virtual stages are not published (Llama 3: "a tunable
  // interleaved schedule"): two per device, the smallest interleaving, as NeMo's Llama 3.1
  // 405B recipe uses (PP 9, VPP 2).
  const bool vpp_assumed = pp > 1 && !int_of(par, "vpp") && has(text_of(par, "pipeline_schedule"), "interleaved");
  if (vpp_assumed) {
    p["vpp"] = 2;
    notes.push_back("interleaved schedule, virtual stages not published: 2 per device (as NeMo's Llama 3.1 405B "
                    "recipe, PP 9 VPP 2)");
  }
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
  // A stated ZeRO stage 2 ("ZeRO-2-like: optimizer states and gradients sharded", the Llama 3
  // paper's FSDP) keeps the parameters whole; otherwise FSDP is Megatron-FSDP's default.
  const bool zero2 = std::regex_search(zero, std::regex(R"(zero[- ]?(stage[- ]?)?2\b)"));
  if (fsdp && zero2) {
    p["data_parallel_sharding_strategy"] = "optim_grads";
    notes.push_back("ZeRO-2 as stated: gradients and optimizer states sharded, parameters whole (optim_grads)");
  } else if (fsdp) {
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
  } else if (has(rec, "'op' sac") || has(rec, "op sac policy")) {
    // torchtitan's per-operator selective checkpointing (selective_ac_option = "op": keeps the
    // outputs of every second matmul and of SDPA, recomputes the rest).
    p["recompute_granularity"] = "selective_op";
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
  const int vstages = pp * std::max(1, int_of(par, "vpp").value_or(vpp_assumed ? 2 : 1));
  if (const std::string layout = text_of(par, "pp_layout"); !layout.empty()) {
    auto counts = parse_pp_layout(layout);
    if (counts && vpp_assumed && static_cast<int>(counts->size()) == pp) {
      // The published per-device layout split over the two chunks, in virtual-stage order
      // (chunk 0 on every device, then chunk 1).
      std::vector<int> v(static_cast<std::size_t>(2 * pp));
      for (int st = 0; st < pp; ++st) {
        v[static_cast<std::size_t>(st)] = (*counts)[static_cast<std::size_t>(st)] / 2;
        v[static_cast<std::size_t>(pp + st)] = (*counts)[static_cast<std::size_t>(st)] - v[static_cast<std::size_t>(st)];
      }
      counts = v;
    }
    if (counts) p["pipeline_layer_partition"] = *counts;
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
  // Token dropping as the case states it (NeMo's apply_moe_token_drop: capacity factor 1.0,
  // each expert's input padded to its capacity).
  if (const json& td = c.contains("moe_token_drop") ? c["moe_token_drop"] : json(); moe && td.is_object()) {
    if (auto cf = number_of(td, "capacity_factor")) s["moe"]["capacity_factor"] = *cf;
    if (td.contains("pad_to_capacity") && td["pad_to_capacity"].is_boolean())
      s["moe"]["pad_to_capacity"] = td["pad_to_capacity"].get<bool>();
    notes.push_back(fmt::format("token drop: capacity factor {:g}{}", number_of(td, "capacity_factor").value_or(0.0),
                                td.value("pad_to_capacity", false) ? ", padded to capacity (no host sync at dispatch)" : ""));
  }
  const std::string dispatcher = lower(text_of(par, "token_dispatcher"));
  if (moe && (has(dispatcher, "deepep") || has(dispatcher, "hybridep"))) p["moe_alltoall"] = "hierarchical";
  s["parallelism"] = p;
  s["seed"] = 1;
  out.scenario = s;
  return out;
}


}  // namespace moesim::tools
