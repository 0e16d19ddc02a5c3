// Loading an RL scenario: the rl section, the policy's (and critic's) training scenario on the
// training pool, and the checks of the inference layout, its memory and the training batch.
#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "moesim/models/presets.hpp"
#include "moesim/strategies/rl/rl.hpp"
#include "rl_internal.hpp"

namespace moesim::strategies {

namespace {

using rl_detail::draw_step;
using rl_detail::forward_plan;
using rl_detail::StepDraw;

LengthDistribution parse_length(ObjectReader& parent, std::string_view key, Diagnostics& diag) {
  LengthDistribution d;
  const std::string ptr = parent.child_pointer(key);
  const nlohmann::json* j = parent.get({key});
  if (!j) {
    diag.error(ptr, "", "is required: a token count or {\"distribution\": \"fixed|uniform|lognormal\", ...}");
    return d;
  }
  if (j->is_number_integer()) {
    const auto v = j->get<std::int64_t>();
    if (v < 1) diag.error(ptr, json_brief(*j), "must be at least 1 token");
    d.mean = static_cast<double>(std::max<std::int64_t>(1, v));
    d.min = d.max = std::max<std::int64_t>(1, v);
    return d;
  }
  ObjectReader r(*j, ptr, diag);
  if (!r.valid()) return d;
  const std::string kind = r.string({"distribution"}, "lognormal", {"fixed", "uniform", "lognormal"});
  if (kind == "fixed") {
    d.kind = LengthDistribution::Kind::Fixed;
    d.min = d.max = r.required_integer({"value"}, 1, 1LL << 30);
    d.mean = static_cast<double>(d.min);
  } else if (kind == "uniform") {
    d.kind = LengthDistribution::Kind::Uniform;
    d.min = r.required_integer({"min"}, 1, 1LL << 30);
    d.max = r.required_integer({"max"}, 1, 1LL << 30);
    if (d.max < d.min) diag.error(r.child_pointer("max"), std::to_string(d.max), "must be at least min=" + std::to_string(d.min));
    d.mean = 0.5 * static_cast<double>(d.min + d.max);
  } else {
    d.kind = LengthDistribution::Kind::Lognormal;
    d.mean = r.number({"mean"}, 0, 1, 1e9);
    if (!r.has({"mean"})) diag.error(r.child_pointer("mean"), "", "is required (mean tokens of the untruncated lognormal)");
    d.sigma = r.number({"sigma"}, 1.0, 0.0, 5.0);
    d.min = r.integer({"min"}, 1, 1, 1LL << 30);
    d.max = r.required_integer({"max"}, 1, 1LL << 30);
    if (d.max < d.min) diag.error(r.child_pointer("max"), std::to_string(d.max), "must be at least min=" + std::to_string(d.min));
  }
  r.finish();
  return d;
}

/// Reads a model reference of the rl section: a keyword (returned as such) or a model.
std::optional<models::ModelSpec> parse_model_ref(const nlohmann::json& j, const std::string& ptr, Diagnostics& diag,
                                                 const std::string& base_dir, std::initializer_list<const char*> keywords,
                                                 std::string& name) {
  if (j.is_string()) {
    for (const char* k : keywords)
      if (j.get<std::string>() == k) {
        name = k;
        return std::nullopt;
      }
  }
  if (j.is_null()) {
    name = "none";
    return std::nullopt;
  }
  models::ModelSpec m = models::load_model(j, ptr, diag, base_dir);
  name = j.is_string() ? j.get<std::string>() : m.name;
  return m;
}

void check_inference_plan(const InferencePlan& p, const models::ModelSpec& m, int pool, const std::string& ptr,
                          const std::string& what, Diagnostics& diag) {
  if (m.heads > 0 && m.heads % p.tp != 0)
    diag.error(ptr + "/tensor_parallel_size", std::to_string(p.tp),
               "must divide the " + what + "'s num_attention_heads=" + std::to_string(m.heads));
  if (m.is_moe() && m.num_experts % p.ep != 0)
    diag.error(ptr + "/expert_parallel_size", std::to_string(p.ep),
               "must divide the " + what + "'s num_experts=" + std::to_string(m.num_experts));
  if (!m.is_moe() && p.ep != 1 && what == "policy")
    diag.error(ptr + "/expert_parallel_size", std::to_string(p.ep), "must be 1 for a dense model");
  const int hi = std::max(p.tp, p.ep), lo = std::min(p.tp, p.ep);
  if (hi % lo != 0)
    diag.error(ptr, fmt::format("tp={} ep={}", p.tp, p.ep),
               "the larger of tensor_parallel_size and expert_parallel_size must be a multiple of the other (a stage has "
               "max(tp, ep) devices)");
  if (p.pp > m.num_layers)
    diag.error(ptr + "/pipeline_parallel_size", std::to_string(p.pp),
               "must not exceed the " + what + "'s " + std::to_string(m.num_layers) + " layers");
  if (pool > 0 && pool % p.devices() != 0)
    diag.error(ptr, fmt::format("pp x max(tp, ep) = {} x {} = {} devices per instance", p.pp, p.stage_devices(), p.devices()),
               fmt::format("must divide the {} pool's {} devices", what == "policy" ? "inference" : what + " model's", pool));
}

/// The models of the rl section's roles: a keyword ("policy", "rule", "none") or a model's
/// name, and the model when one is given.
struct RlRoles {
  std::string reference = "policy", reward = "rule", critic = "none";
  std::optional<models::ModelSpec> reference_model, reward_model, critic_model;
  bool recompute_logprobs = false;
};

/// training.seq_length when the document gives it as an integer (rl.max_context's default), else 0.
std::int64_t training_seq_length(const nlohmann::json& doc) {
  std::int64_t train_seq = 0;
  if (doc.contains("training") && doc["training"].is_object() && doc["training"].contains("seq_length") &&
      doc["training"]["seq_length"].is_number_integer())
    train_seq = doc["training"]["seq_length"].get<std::int64_t>();
  return train_seq;
}

/// rl.inference: one inference instance's plan, the inference pool, the batch, MTP.
void parse_inference(ObjectReader& r, RlSpec& rl, Diagnostics& diag) {
  if (const auto* inf = r.get({"inference"})) {
    ObjectReader q(*inf, "/rl/inference", diag);
    rl.inference.tp = static_cast<int>(q.integer({"tensor_parallel_size", "tp"}, 1, 1, 4096));
    rl.inference.pp = static_cast<int>(q.integer({"pipeline_parallel_size", "pp"}, 1, 1, 4096));
    rl.inference.ep = static_cast<int>(q.integer({"expert_parallel_size", "ep"}, 1, 1, 1 << 20));
    rl.inference_devices = static_cast<int>(q.integer({"devices"}, 0, 0, 1 << 24));
    rl.max_batch_size = q.integer({"max_batch_size"}, 0, 0, 1LL << 30);
    rl.refill = q.boolean({"refill"}, true);
    if (const auto* mtp = q.get({"mtp"})) {
      ObjectReader t(*mtp, "/rl/inference/mtp", diag);
      rl.inference.draft_tokens = static_cast<int>(t.integer({"draft_tokens"}, 1, 0, 8));
      rl.inference.acceptance_length = t.number({"acceptance_length"}, 1.0, 1.0, 9.0);
      if (rl.inference.acceptance_length > 1.0 + rl.inference.draft_tokens)
        diag.error("/rl/inference/mtp/acceptance_length", fmt::format("{}", rl.inference.acceptance_length),
                   fmt::format("must not exceed 1 + draft_tokens = {} (tokens a decode step can accept)",
                               1 + rl.inference.draft_tokens));
      t.finish();
    }
    q.finish();
  } else {
    diag.error("/rl/inference", "", "is required ({\"tp\", \"pp\", \"ep\"} of one inference instance; \"devices\" "
                                    "of the inference pool when disaggregated)");
  }
}

/// The rl section into `rl`; returns its roles (reference, reward, critic).
RlRoles parse_rl_section(const nlohmann::json& doc, std::int64_t train_seq, const std::string& base_dir, RlSpec& rl,
                         Diagnostics& diag) {
  RlRoles roles;
  if (!doc.contains("rl")) {
    diag.error("/rl", "", "is required by moesim rl (prompts_per_step, rollouts_per_prompt, prompt_length, response_length, "
                          "mode, inference)");
    return roles;
  }
  ObjectReader r(doc["rl"], "/rl", diag);
  if (!r.valid()) return roles;
  rl.prompts_per_step = r.required_integer({"prompts_per_step"}, 1, 1LL << 24);
  rl.rollouts_per_prompt = static_cast<int>(r.integer({"rollouts_per_prompt"}, 1, 1, 1 << 16));
  rl.prompt_length = parse_length(r, "prompt_length", diag);
  rl.response_length = parse_length(r, "response_length", diag);
  rl.max_context = r.integer({"max_context"}, train_seq, 1, 1LL << 30);
  rl.mode = r.string({"mode"}, "colocated", {"colocated", "disaggregated"}) == "disaggregated" ? RlMode::Disaggregated
                                                                                               : RlMode::Colocated;
  rl.staleness = static_cast<int>(r.integer({"staleness"}, 0, 0, 16));
  rl.optimizer_steps = static_cast<int>(r.integer({"optimizer_steps"}, 1, 1, 4096));
  rl.steps_simulated = static_cast<int>(r.integer({"steps_simulated"}, 8, 1, 1000));
  rl.switch_free = r.string({"switch_cost"}, "charged", {"charged", "free"}) == "free";
  roles.recompute_logprobs = r.boolean({"recompute_logprobs"}, false);
  if (const auto* j = r.get({"reference"}))
    roles.reference_model = parse_model_ref(*j, "/rl/reference", diag, base_dir, {"policy", "none"}, roles.reference);
  if (const auto* j = r.get({"reward"}))
    roles.reward_model = parse_model_ref(*j, "/rl/reward", diag, base_dir, {"rule", "policy", "none"}, roles.reward);
  if (const auto* j = r.get({"critic"}))
    roles.critic_model = parse_model_ref(*j, "/rl/critic", diag, base_dir, {"none", "policy"}, roles.critic);
  if (roles.reward == "none") roles.reward = "rule";
  parse_inference(r, rl, diag);
  r.ignore({"description", "_comment", "_source"});
  r.finish();
  return roles;
}

/// The inference pool against the cluster's `total` devices (all of them when co-located), and
/// the longest rollout against the context.
void check_pools_and_context(RlSpec& rl, int total, std::int64_t train_seq, Diagnostics& diag) {
  if (rl.mode == RlMode::Disaggregated) {
    if (rl.inference_devices <= 0 || rl.inference_devices >= total)
      diag.error("/rl/inference/devices", std::to_string(rl.inference_devices),
                 fmt::format("must give the inference pool, between 1 and cluster.devices - 1 = {} (the rest train)",
                             total - 1));
  } else {
    if (rl.inference_devices != 0 && rl.inference_devices != total)
      diag.error("/rl/inference/devices", std::to_string(rl.inference_devices),
                 fmt::format("must be all {} devices (or absent) when co-located", total));
    rl.inference_devices = total;
  }
  if (rl.max_context <= 0)
    diag.error("/rl/max_context", "", "is required when training.seq_length is not given");
  const std::int64_t longest = rl.prompt_length.max + rl.response_length.max;
  if (rl.max_context > 0 && longest > rl.max_context)
    diag.error("/rl/response_length/max", std::to_string(rl.response_length.max),
               fmt::format("plus the longest prompt ({}) is {} tokens, longer than the context of {} tokens (rl.max_context, "
                           "default training.seq_length)",
                           rl.prompt_length.max, longest, rl.max_context));
  if (train_seq > 0 && rl.max_context > train_seq)
    diag.error("/rl/max_context", std::to_string(rl.max_context),
               fmt::format("must not exceed training.seq_length = {}: a rollout longer than a training sequence cannot be "
                           "trained on",
                           train_seq));
}

/// Adds the problems of a nested load to `diag`, with `note` appended, except those already there.
void merge_problems(const ConfigError& e, const std::string& note, Diagnostics& diag) {
  for (const auto& d : e.diagnostics()) {
    bool dup = false;
    for (const auto& x : diag.list()) dup = dup || (x.pointer == d.pointer && x.constraint == d.constraint);
    if (!dup) diag.error_in(d.file, d.pointer, d.value, d.constraint + note);
  }
}

/// The policy's (and the critic's) training scenario on the training pool, and the seed.
/// Returns whether the policy's training scenario loaded.
bool load_training(const nlohmann::json& doc, const std::string& file, const std::string& base_dir,
                   const RlRoles& roles, RlScenario& s, Diagnostics& diag) {
  RlSpec& rl = s.rl;
  const int total = s.cluster.devices;
  // The policy's training scenario on the training pool.
  nlohmann::json train_doc = doc;
  train_doc.erase("rl");
  const int train_devices = rl.mode == RlMode::Disaggregated ? total - rl.inference_devices : total;
  if (train_doc.contains("cluster") && train_doc["cluster"].is_object() && train_devices > 0)
    train_doc["cluster"]["devices"] = train_devices;
  const std::string pool_note =
      rl.mode == RlMode::Disaggregated ? fmt::format(" (training pool: {} devices)", train_devices) : std::string();
  bool trained = false;
  try {
    s.training = load_scenario(train_doc, file, base_dir);
    trained = true;
  } catch (const ConfigError& e) {
    merge_problems(e, pool_note, diag);
  }
  s.seed = trained ? s.training.seed : 1;
  if (trained && roles.critic != "none") {
    nlohmann::json critic_doc = train_doc;
    if (roles.critic_model) critic_doc["model"] = doc["rl"]["critic"];
    try {
      s.critic = load_scenario(critic_doc, file, base_dir);
    } catch (const ConfigError& e) {
      merge_problems(e, " (the critic's training with the policy's plan)", diag);
    }
    rl.critic = roles.critic;
  }
  return trained;
}

/// The policy's inference plan, then the forward-only models (rl.forwards) with theirs.
void check_inference_plans(const RlRoles& roles, RlScenario& s, Diagnostics& diag) {
  RlSpec& rl = s.rl;
  const int total = s.cluster.devices;
  const models::ModelSpec& policy = s.training.model;
  check_inference_plan(rl.inference, policy, rl.inference_devices, "/rl/inference", "policy", diag);
  if (rl.inference.draft_tokens > 0 && policy.mtp_layers <= 0)
    diag.error("/rl/inference/mtp/draft_tokens", std::to_string(rl.inference.draft_tokens),
               "needs a model with MTP modules (num_nextn_predict_layers > 0)");
  // Forward-only passes, in the order they run.
  auto add_forward = [&](const std::string& role, const std::string& name, const std::optional<models::ModelSpec>& m) {
    rl.forwards.push_back(RlForwardModel{role, name == "policy" ? s.training.model_name : name, m ? *m : policy});
  };
  if (roles.reference != "none") add_forward("reference", roles.reference, roles.reference_model);
  if (roles.reward != "rule") add_forward("reward", roles.reward, roles.reward_model);
  if (roles.critic != "none") add_forward("critic_values", roles.critic, roles.critic_model);
  if (roles.recompute_logprobs) add_forward("old_logprobs", "policy", std::nullopt);
  const int fpool = rl.mode == RlMode::Colocated ? total : total - rl.inference_devices;
  for (const auto& f : rl.forwards)
    check_inference_plan(forward_plan(rl, f.model), f.model, fpool, "/rl/inference", f.role + " model", diag);
}

/// Memory of the inference layout: weights, then the KV cache of at least one rollout.
void check_inference_memory(const RlScenario& s, Diagnostics& diag) {
  const RlSpec& rl = s.rl;
  const models::ModelSpec& policy = s.training.model;
  const std::int64_t longest = rl.prompt_length.max + rl.response_length.max;
  const topologies::Topology topo = topologies::build_topology(s.cluster);
  const InferenceModel im(policy, s.cluster, topo, rl.inference, s.training.training.precision);
  const double free_bytes = im.kv_budget_per_device();
  if (free_bytes <= 0) {
    diag.error("/rl/inference", fmt::format("tp={} pp={} ep={}", rl.inference.tp, rl.inference.pp, rl.inference.ep),
               fmt::format("puts {} of weights on a device with {} of HBM ({} runtime reserve): raise tp, ep or pp",
                           format_bytes(im.weight_bytes_per_device()), format_bytes(s.cluster.device.hbm_capacity.value()),
                           format_bytes(s.cluster.device.memory_reserved.value())));
  } else {
    const std::int64_t fit = im.max_sequences(static_cast<double>(longest));
    if (fit <= 0)
      diag.error("/rl/response_length/max", std::to_string(rl.response_length.max),
                 fmt::format("gives rollouts of up to {} tokens; one needs {} of KV cache per device ({} per token) but "
                             "only {} is left after the weights: the rollouts do not fit KV memory (shorten them or "
                             "raise pp / attention data parallelism)",
                             longest, format_bytes(static_cast<double>(longest) * im.kv_bytes_per_token_per_device()),
                             format_bytes(im.kv_bytes_per_token_per_device()), format_bytes(free_bytes)));
    else if (rl.max_batch_size > fit)
      diag.error("/rl/inference/max_batch_size", std::to_string(rl.max_batch_size),
                 fmt::format("sequences per instance do not fit KV memory: at most {} rollouts of up to {} tokens fit "
                             "({} of KV cache free per device)",
                             fit, longest, format_bytes(free_bytes)));
  }
  for (const auto& f : rl.forwards) {
    const InferenceModel fm(f.model, s.cluster, topo, forward_plan(rl, f.model), s.training.training.precision);
    if (fm.kv_budget_per_device() <= 0)
      diag.error("/rl/" + f.role, f.name,
                 fmt::format("puts {} of weights per device under the inference layout: does not fit",
                             format_bytes(fm.weight_bytes_per_device())));
  }
}

/// The training batch must hold an RL step's tokens (mean over the simulated steps).
void check_training_batch(const RlScenario& s, Diagnostics& diag) {
  const RlSpec& rl = s.rl;
  double tokens = 0;
  for (int i = 0; i < rl.steps_simulated; ++i) {
    const StepDraw d = draw_step(rl, s.seed, i);
    tokens += d.prompt_tokens + d.response_tokens;
  }
  tokens /= rl.steps_simulated;
  const double capacity = static_cast<double>(rl.optimizer_steps) * s.training.training.tokens_per_step();
  if (capacity < tokens)
    diag.error("/training/global_batch_size", std::to_string(s.training.training.global_batch_size),
               fmt::format("x seq_length {} x rl.optimizer_steps {} = {:.0f} tokens cannot hold an RL step's {:.0f} "
                           "prompt + response tokens (mean of the simulated steps)",
                           s.training.training.seq_length, rl.optimizer_steps, capacity, tokens));
}

}  // namespace

// ---- Loading -------------------------------------------------------------------------------

RlScenario load_rl_scenario(const nlohmann::json& doc, const std::string& file, const std::string& base_dir) {
  RlScenario s;
  s.file = file;
  s.document = doc;
  Diagnostics diag(file);
  if (!doc.is_object()) {
    diag.error("", json_brief(doc), "must be a JSON object (a scenario with an \"rl\" section)");
    diag.throw_if_any();
  }
  if (doc.contains("cluster")) s.cluster = topologies::load_cluster(doc["cluster"], "/cluster", diag);
  const std::int64_t train_seq = training_seq_length(doc);
  const RlRoles roles = parse_rl_section(doc, train_seq, base_dir, s.rl, diag);
  check_pools_and_context(s.rl, s.cluster.devices, train_seq, diag);
  if (load_training(doc, file, base_dir, roles, s, diag)) {
    check_inference_plans(roles, s, diag);
    if (diag.ok()) check_inference_memory(s, diag);
    if (diag.ok()) check_training_batch(s, diag);
  }
  diag.throw_if_any();
  return s;
}

RlScenario load_rl_scenario_file(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string file = path == "-" ? "<stdin>" : path;
  Diagnostics diag(file);
  auto doc = read_json_file(path, diag);
  diag.throw_if_any();
  for (const auto& o : overrides) apply_override(*doc, o, diag);
  diag.throw_if_any();
  std::string base_dir;
  if (path != "-") base_dir = std::filesystem::path(path).parent_path().string();
  return load_rl_scenario(*doc, file, base_dir);
}

}  // namespace moesim::strategies
