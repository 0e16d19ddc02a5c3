#include "moesim/strategies/rl/rl.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <ostream>

#include <fmt/format.h>

#include "moesim/models/presets.hpp"
#include "moesim/sim/random.hpp"

namespace moesim::strategies {

// ---- Lengths -------------------------------------------------------------------------------

std::int64_t LengthDistribution::draw(Rng& rng) const {
  double x = mean;
  switch (kind) {
    case Kind::Fixed: x = mean; break;
    case Kind::Uniform: x = static_cast<double>(min) + rng.uniform() * static_cast<double>(max - min + 1); break;
    case Kind::Lognormal: {
      const double mu = std::log(mean) - 0.5 * sigma * sigma;  // mean of the untruncated distribution
      x = std::exp(mu + sigma * rng.normal());
      break;
    }
  }
  const auto v = static_cast<std::int64_t>(std::floor(x));
  return std::clamp(v, min, max);
}

namespace {

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

/// The rollouts of one RL step: per prompt its length and its responses' lengths.
struct StepDraw {
  std::vector<std::int64_t> prompt;                  ///< per prompt
  std::vector<std::vector<std::int64_t>> responses;  ///< per prompt, per rollout
  double prompt_tokens = 0, response_tokens = 0;
};

StepDraw draw_step(const RlSpec& rl, std::uint64_t seed, int step) {
  StepDraw d;
  d.prompt.resize(static_cast<std::size_t>(rl.prompts_per_step));
  d.responses.resize(d.prompt.size());
  for (std::size_t p = 0; p < d.prompt.size(); ++p) {
    Rng rng = Rng::stream(seed, fmt::format("rl/step{}/prompt{}", step, p));
    d.prompt[p] = rl.prompt_length.draw(rng);
    for (int r = 0; r < rl.rollouts_per_prompt; ++r) {
      d.responses[p].push_back(rl.response_length.draw(rng));
      d.prompt_tokens += static_cast<double>(d.prompt[p]);
      d.response_tokens += static_cast<double>(d.responses[p].back());
    }
  }
  return d;
}

InferencePlan forward_plan(const RlSpec& rl, const models::ModelSpec& m) {
  InferencePlan p = rl.inference;
  p.draft_tokens = 0;
  p.acceptance_length = 1;
  if (!m.is_moe()) p.ep = 1;
  return p;
}

int forward_pool(const RlScenario& s) {
  return s.rl.mode == RlMode::Colocated ? s.cluster.devices : s.cluster.devices - s.rl.inference_devices;
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

std::string plan_text(const Plan& p) {
  std::string s = fmt::format("TP{} PP{}", p.tp, p.pp);
  if (p.vpp > 1) s += fmt::format(" VPP{}", p.vpp);
  if (p.ep_size() > 1) s += fmt::format(" EP{}", p.ep_size());
  if (p.cp > 1) s += fmt::format(" CP{}", p.cp);
  s += fmt::format(" DP{} mbs{} x {} micro-batches", p.dp, p.mbs, p.num_microbatches);
  return s;
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
  std::int64_t train_seq = 0;
  if (doc.contains("training") && doc["training"].is_object() && doc["training"].contains("seq_length") &&
      doc["training"]["seq_length"].is_number_integer())
    train_seq = doc["training"]["seq_length"].get<std::int64_t>();

  RlSpec& rl = s.rl;
  std::string reference = "policy", reward = "rule", critic = "none";
  std::optional<models::ModelSpec> reference_model, reward_model, critic_model;
  bool recompute_logprobs = false;
  if (!doc.contains("rl")) {
    diag.error("/rl", "", "is required by moesim rl (prompts_per_step, rollouts_per_prompt, prompt_length, response_length, "
                          "mode, inference)");
  } else {
    ObjectReader r(doc["rl"], "/rl", diag);
    if (r.valid()) {
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
      recompute_logprobs = r.boolean({"recompute_logprobs"}, false);
      if (const auto* j = r.get({"reference"}))
        reference_model = parse_model_ref(*j, "/rl/reference", diag, base_dir, {"policy", "none"}, reference);
      if (const auto* j = r.get({"reward"}))
        reward_model = parse_model_ref(*j, "/rl/reward", diag, base_dir, {"rule", "policy", "none"}, reward);
      if (const auto* j = r.get({"critic"}))
        critic_model = parse_model_ref(*j, "/rl/critic", diag, base_dir, {"none", "policy"}, critic);
      if (reward == "none") reward = "rule";
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
      r.ignore({"description", "_comment", "_source"});
      r.finish();
    }
  }
  const int total = s.cluster.devices;
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

  // The policy's training scenario on the training pool.
  nlohmann::json train_doc = doc;
  train_doc.erase("rl");
  const int train_devices = rl.mode == RlMode::Disaggregated ? total - rl.inference_devices : total;
  if (train_doc.contains("cluster") && train_doc["cluster"].is_object() && train_devices > 0)
    train_doc["cluster"]["devices"] = train_devices;
  auto merge = [&](const ConfigError& e, const std::string& note) {
    for (const auto& d : e.diagnostics()) {
      bool dup = false;
      for (const auto& x : diag.list()) dup = dup || (x.pointer == d.pointer && x.constraint == d.constraint);
      if (!dup) diag.error_in(d.file, d.pointer, d.value, d.constraint + note);
    }
  };
  const std::string pool_note =
      rl.mode == RlMode::Disaggregated ? fmt::format(" (training pool: {} devices)", train_devices) : std::string();
  bool trained = false;
  try {
    s.training = load_scenario(train_doc, file, base_dir);
    trained = true;
  } catch (const ConfigError& e) {
    merge(e, pool_note);
  }
  s.seed = trained ? s.training.seed : 1;
  if (trained && critic != "none") {
    nlohmann::json critic_doc = train_doc;
    if (critic_model) critic_doc["model"] = doc["rl"]["critic"];
    try {
      s.critic = load_scenario(critic_doc, file, base_dir);
    } catch (const ConfigError& e) {
      merge(e, " (the critic's training with the policy's plan)");
    }
    rl.critic = critic;
  }

  if (trained) {
    const models::ModelSpec& policy = s.training.model;
    check_inference_plan(rl.inference, policy, rl.inference_devices, "/rl/inference", "policy", diag);
    if (rl.inference.draft_tokens > 0 && policy.mtp_layers <= 0)
      diag.error("/rl/inference/mtp/draft_tokens", std::to_string(rl.inference.draft_tokens),
                 "needs a model with MTP modules (num_nextn_predict_layers > 0)");
    // Forward-only passes, in the order they run.
    auto add_forward = [&](const std::string& role, const std::string& name, const std::optional<models::ModelSpec>& m) {
      rl.forwards.push_back(RlForwardModel{role, name == "policy" ? s.training.model_name : name, m ? *m : policy});
    };
    if (reference != "none") add_forward("reference", reference, reference_model);
    if (reward != "rule") add_forward("reward", reward, reward_model);
    if (critic != "none") add_forward("critic_values", critic, critic_model);
    if (recompute_logprobs) add_forward("old_logprobs", "policy", std::nullopt);
    const int fpool = rl.mode == RlMode::Colocated ? total : total - rl.inference_devices;
    for (const auto& f : rl.forwards)
      check_inference_plan(forward_plan(rl, f.model), f.model, fpool, "/rl/inference", f.role + " model", diag);
    // Memory of the inference layout: weights, then the KV cache of at least one rollout.
    if (diag.ok()) {
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
    // The training batch must hold an RL step's tokens (mean over the simulated steps).
    if (diag.ok()) {
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

// ---- Rollout generation --------------------------------------------------------------------

namespace {

struct Pending {
  std::int64_t prompt = 0, response = 0;
  int step = 0;
};

struct Running {
  std::int64_t finish_at = 0;  ///< decode-step counter at which the sequence is done
  std::int64_t admit_at = 0;
  std::int64_t prompt = 0;
  int step = 0;
  bool operator>(const Running& o) const {
    return finish_at != o.finish_at ? finish_at > o.finish_at : admit_at > o.admit_at;
  }
};

/// Per-phase counters of one instance.
struct PhaseStats {
  double busy = 0, slot_time = 0, flops = 0, bytes = 0;
  std::vector<double> completions;  ///< phase-relative times
};

/// One inference instance generating continuously: sequences arrive per RL step, are admitted
/// into batch slots (all at once when the batch is empty, or into each freed slot with refill),
/// prefilled, and decoded until their response length.
class Instance {
 public:
  Instance(const InferenceModel& im, std::int64_t slots, bool refill) : im_(&im), slots_(slots), refill_(refill) {}

  void add(const Pending& p) {
    pending_.push_back(p);
    if (static_cast<std::size_t>(p.step) >= remaining_.size()) remaining_.resize(static_cast<std::size_t>(p.step) + 1, 0);
    ++remaining_[static_cast<std::size_t>(p.step)];
  }
  [[nodiscard]] std::int64_t completions() const { return completions_; }
  [[nodiscard]] bool steps_done_through(int step) const {
    for (int s = 0; s <= step && s < static_cast<int>(remaining_.size()); ++s)
      if (remaining_[static_cast<std::size_t>(s)] > 0) return false;
    return true;
  }
  [[nodiscard]] std::int64_t slots() const { return slots_; }

  /// Recomputes the KV cache of the sequences in flight (co-located: it was dropped for training).
  double reprefill(PhaseStats& st) {
    if (running_.empty()) return 0;
    double tokens = 0, sq = 0;
    for (const auto& r : running_) {
      const double c = static_cast<double>(r.prompt) + alpha() * static_cast<double>(step_ - r.admit_at);
      tokens += c;
      sq += c * c;
    }
    const StepCost c = im_->prefill(tokens, sq, static_cast<double>(running_.size()));
    st.busy += c.seconds;
    st.flops += c.flops;
    st.bytes += c.hbm_bytes_per_device;
    return c.seconds;
  }

  /// Runs until `done()` (budget < 0) or for at most `budget` seconds, admitting sequences of
  /// RL steps up to `limit`. Returns the time used; completions are stamped with t0 + time.
  template <class Done>
  double run(int limit, double budget, double t0, PhaseStats& st, Done done) {
    const bool until = budget < 0;
    double t = 0;
    for (;;) {
      if (until && done()) return t;
      // Admission.
      const auto n = static_cast<std::int64_t>(running_.size());
      if (refill_ ? n < slots_ : n == 0) {
        std::vector<Pending> batch;
        while (n + static_cast<std::int64_t>(batch.size()) < slots_ && !pending_.empty() && pending_.front().step <= limit) {
          batch.push_back(pending_.front());
          pending_.pop_front();
        }
        if (!batch.empty()) {
          double tokens = 0, sq = 0;
          for (const auto& b : batch) {
            tokens += static_cast<double>(b.prompt);
            sq += static_cast<double>(b.prompt) * static_cast<double>(b.prompt);
          }
          const StepCost c = im_->prefill(tokens, sq, static_cast<double>(batch.size()));
          if (!until && t + c.seconds > budget) {
            for (auto it = batch.rbegin(); it != batch.rend(); ++it) pending_.push_front(*it);
            return t;
          }
          t += c.seconds;
          st.busy += c.seconds;
          st.flops += c.flops;
          st.bytes += c.hbm_bytes_per_device;
          for (const auto& b : batch) {
            const auto steps = static_cast<std::int64_t>(std::ceil(static_cast<double>(b.response) / alpha() - 1e-9));
            running_.push_back(Running{step_ + std::max<std::int64_t>(1, steps), step_, b.prompt, b.step});
            std::push_heap(running_.begin(), running_.end(), std::greater<>());
            prompt_sum_ += static_cast<double>(b.prompt);
            admit_sum_ += static_cast<double>(step_);
          }
        }
      }
      if (running_.empty()) return t;  // nothing admissible: idle
      const auto active = static_cast<double>(running_.size());
      const double ctx = prompt_sum_ + alpha() * (active * static_cast<double>(step_) - admit_sum_);
      const StepCost c = im_->decode_step(static_cast<std::int64_t>(running_.size()), ctx);
      if (!until && t + c.seconds > budget) return t;
      t += c.seconds;
      st.busy += c.seconds;
      st.slot_time += active * c.seconds;
      st.flops += c.flops;
      st.bytes += c.hbm_bytes_per_device;
      ++step_;
      while (!running_.empty() && running_.front().finish_at <= step_) {
        std::pop_heap(running_.begin(), running_.end(), std::greater<>());
        const Running r = running_.back();
        running_.pop_back();
        prompt_sum_ -= static_cast<double>(r.prompt);
        admit_sum_ -= static_cast<double>(r.admit_at);
        --remaining_[static_cast<std::size_t>(r.step)];
        ++completions_;
        st.completions.push_back(t0 + t);
      }
    }
  }

 private:
  [[nodiscard]] double alpha() const { return im_->plan().acceptance_length; }
  const InferenceModel* im_;
  std::int64_t slots_;
  bool refill_;
  std::deque<Pending> pending_;
  std::vector<Running> running_;  ///< min-heap on finish_at
  std::vector<std::int64_t> remaining_;
  std::int64_t step_ = 0, completions_ = 0;
  double prompt_sum_ = 0, admit_sum_ = 0;
};

struct RolloutPhase {
  double seconds = 0;
  double slot_time = 0, slot_capacity = 0, flops = 0, bytes_per_device = 0, idle_device_s = 0, tail_s = 0;
};

}  // namespace

// ---- The RL step on the engine -------------------------------------------------------------

RlSimulation simulate_rl(const RlScenario& s) {
  const auto wall0 = std::chrono::steady_clock::now();
  RlSimulation out;
  RlResult& r = out.result;
  const RlSpec& rl = s.rl;
  const int N = rl.steps_simulated;
  const int k = rl.staleness;
  const bool colocated = rl.mode == RlMode::Colocated;
  r.mode = colocated ? "colocated" : "disaggregated";
  r.staleness = k;
  r.devices = s.cluster.devices;
  r.inference_devices = rl.inference_devices;
  r.training_devices = colocated ? s.cluster.devices : s.cluster.devices - rl.inference_devices;
  r.seed = s.seed;
  r.steps_simulated = N;
  const models::DeviceSpec& dev = s.cluster.device;
  const models::Precision prec = s.training.training.precision;
  const double peak = dev.peak(prec).value();

  // Training: the policy's (and critic's) step on the training plan.
  const Simulation train = simulate(s.training);
  r.training_step_time_s = train.result.step_time_s;
  r.training_mfu = train.result.mfu;
  r.training_plan = plan_text(s.training.plan);
  if (!train.result.feasible) {
    r.feasible = false;
    r.infeasible_reason = "policy training: " + train.result.infeasible_reason;
  }
  double critic_step = 0;
  std::optional<Simulation> critic;
  if (s.critic) {
    critic = simulate(*s.critic);
    critic_step = critic->result.step_time_s;
    if (!critic->result.feasible && r.feasible) {
      r.feasible = false;
      r.infeasible_reason = "critic training: " + critic->result.infeasible_reason;
    }
  }
  r.critic_step_time_s = critic_step;
  for (const auto& st : train.result.stages)
    r.training_state_bytes_per_device =
        std::max(r.training_state_bytes_per_device, st.memory.weights + st.memory.gradients + st.memory.optimizer);
  const double train_seconds = (r.training_step_time_s + critic_step) * rl.optimizer_steps;

  // Inference.
  const topologies::Topology topo = topologies::build_topology(s.cluster);
  const InferenceModel im(s.training.model, s.cluster, topo, rl.inference, prec);
  const int per_instance = rl.inference.devices();
  const int instances = rl.inference_devices / per_instance;
  const double longest = static_cast<double>(rl.prompt_length.max + rl.response_length.max);
  const std::int64_t fit = im.max_sequences(longest);
  const std::int64_t slots = rl.max_batch_size > 0 ? rl.max_batch_size : fit;
  r.instances = instances;
  r.devices_per_instance = per_instance;
  r.max_sequences_per_instance = slots;
  r.weight_bytes_per_device = im.weight_bytes_per_device();
  r.kv_bytes_per_token_per_device = im.kv_bytes_per_token_per_device();
  r.kv_budget_per_device = im.kv_budget_per_device();
  r.acceptance_length = rl.inference.acceptance_length;

  std::vector<StepDraw> draws;
  for (int i = 0; i < N; ++i) draws.push_back(draw_step(rl, s.seed, i));

  // Rollout generation, phase by phase (see NOTES.md "RL post-training"): each phase ends when
  // every instance has finished its share of the step's responses; with staleness k >= 1 the
  // instances keep generating later steps' rollouts meanwhile and carry them over.
  std::vector<Instance> inst;
  for (int j = 0; j < instances; ++j) inst.emplace_back(im, slots, rl.refill);
  std::vector<std::vector<std::int64_t>> quota(static_cast<std::size_t>(instances));  // cumulative per step
  for (int i = 0; i < N + k; ++i) {
    const StepDraw d = i < N ? draws[static_cast<std::size_t>(i)] : draw_step(rl, s.seed, i);
    std::vector<std::int64_t> count(static_cast<std::size_t>(instances), 0);
    for (std::size_t p = 0; p < d.prompt.size(); ++p) {
      const std::size_t j = p % static_cast<std::size_t>(instances);
      for (auto len : d.responses[p]) {
        inst[j].add(Pending{d.prompt[p], len, i});
        ++count[j];
      }
    }
    for (int j = 0; j < instances; ++j) {
      auto& q = quota[static_cast<std::size_t>(j)];
      q.push_back((q.empty() ? 0 : q.back()) + count[static_cast<std::size_t>(j)]);
    }
  }
  std::vector<RolloutPhase> phases(static_cast<std::size_t>(N));
  for (int i = 0; i < N; ++i) {
    std::vector<PhaseStats> st(static_cast<std::size_t>(instances));
    std::vector<double> t(static_cast<std::size_t>(instances), 0);
    for (int j = 0; j < instances; ++j) {
      auto& in = inst[static_cast<std::size_t>(j)];
      auto& sj = st[static_cast<std::size_t>(j)];
      double tj = 0;
      if (colocated && i > 0) tj += in.reprefill(sj);
      const std::int64_t target = quota[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)];
      tj += in.run(i + k, -1, tj, sj, [&] { return in.completions() >= target && in.steps_done_through(i - k); });
      t[static_cast<std::size_t>(j)] = tj;
    }
    RolloutPhase& ph = phases[static_cast<std::size_t>(i)];
    ph.seconds = *std::max_element(t.begin(), t.end());
    std::vector<double> times;
    for (int j = 0; j < instances; ++j) {
      auto& in = inst[static_cast<std::size_t>(j)];
      auto& sj = st[static_cast<std::size_t>(j)];
      const double tj = t[static_cast<std::size_t>(j)];
      // Done early: keep generating what staleness allows until the slowest instance is done.
      const double extra = ph.seconds - tj;
      if (extra > 0 && k > 0) in.run(i + k, extra, tj, sj, [] { return false; });
      ph.idle_device_s += (ph.seconds - sj.busy) * per_instance;
      ph.slot_time += sj.slot_time;
      ph.slot_capacity += static_cast<double>(in.slots()) * ph.seconds;
      ph.flops += sj.flops;
      ph.bytes_per_device += sj.bytes / instances;
      times.insert(times.end(), sj.completions.begin(), sj.completions.end());
    }
    std::sort(times.begin(), times.end());
    if (!times.empty()) {
      const auto idx = static_cast<std::size_t>(std::ceil(0.9 * static_cast<double>(times.size()))) - 1;
      ph.tail_s = ph.seconds - times[std::min(idx, times.size() - 1)];
    }
  }

  // Forward-only passes (reference, reward, critic values) on the forward pool.
  const int fpool = forward_pool(s);
  struct Fwd {
    std::string role;
    std::vector<double> seconds, flops;
  };
  std::vector<Fwd> fwds;
  for (const auto& f : rl.forwards) {
    const InferenceModel fm(f.model, s.cluster, topo, forward_plan(rl, f.model), prec);
    const double n_inst = static_cast<double>(fpool / fm.plan().devices());
    Fwd fw{f.role, {}, {}};
    for (const auto& d : draws) {
      double tokens = 0, sq = 0, seqs = 0;
      for (std::size_t p = 0; p < d.prompt.size(); ++p)
        for (auto len : d.responses[p]) {
          const double L = static_cast<double>(d.prompt[p] + len);
          tokens += L;
          sq += L * L;
          seqs += 1;
        }
      const StepCost c = fm.prefill(tokens / n_inst, sq / n_inst, seqs / n_inst);
      fw.seconds.push_back(c.seconds);
      fw.flops.push_back(c.flops * n_inst);
    }
    fwds.push_back(std::move(fw));
  }

  // Role switches (co-located) and the weight sync.
  const double host_bw = dev.host_bandwidth.value();
  double switch_train = 0, switch_infer = 0, sync = 0, sync_bytes = 0, switch_bytes = 0;
  double critic_state = 0;
  if (critic)
    for (const auto& st : critic->result.stages)
      critic_state = std::max(critic_state, st.memory.weights + st.memory.gradients + st.memory.optimizer);
  const double params_bytes = train.result.params_total * (prec == models::Precision::FP8 ? 1.0 : 2.0);
  if (colocated) {
    // Training state (weights, gradients, optimizer states) leaves for host memory while the
    // devices generate, and comes back for training; the KV cache and the inference weights are
    // dropped (nothing to copy). The inference weights are resharded from the training layout
    // over the scale-up links (each device receives its whole inference shard: an upper bound).
    switch_bytes = r.training_state_bytes_per_device + critic_state;
    if (!rl.switch_free) {
      switch_train = host_bw > 0 ? switch_bytes / host_bw : 0;
      switch_infer = switch_train;
      const auto route = topo.route(0, std::min(1, s.cluster.devices - 1));
      sync = route.latency + im.weight_bytes_per_device() / std::max(1.0, route.bottleneck_bandwidth);
    }
    sync_bytes = im.weight_bytes_per_device();
  } else {
    // Every inference instance needs a whole copy: the training pool sends instances x the
    // parameter bytes, each inference device receives its shard; the slower side sets the time.
    const int nt = r.training_devices;
    const auto route = topo.route(0, nt);
    const double send = params_bytes * instances / nt;
    const double recv = im.weight_bytes_per_device();
    sync = route.latency + std::max(send, recv) / std::max(1.0, route.bottleneck_bandwidth);
    sync_bytes = std::max(send, recv);
  }

  // The task graph: one stream per pool (co-located: one), one task per phase and step.
  sim::TaskGraphBuilder b({"rollout", "forward", "training", "switch", "weight_sync"});
  enum Cat : sim::Category { kRollout, kForward, kTraining, kSwitch, kSync };
  const sim::ResourceId inf_stream = b.add_resource(colocated ? "devices" : "inference pool", 0, sim::ResourceKind::Stream);
  const sim::ResourceId trn_stream = colocated ? inf_stream : b.add_resource("training pool", 1, sim::ResourceKind::Stream);
  std::vector<int>& task_step = out.task_step;
  auto add = [&](double seconds, Cat cat, const std::string& name, int step, std::initializer_list<sim::ResourceId> res) {
    const sim::TaskId id = b.add_task(to_ticks(Seconds{seconds}), cat, b.label(name), step, res);
    task_step.push_back(step);
    return id;
  };
  std::vector<sim::TaskId> rollout_task(static_cast<std::size_t>(N)), last_task(static_cast<std::size_t>(N)),
      train_task(static_cast<std::size_t>(N));
  auto add_rollout = [&](int i) {
    rollout_task[static_cast<std::size_t>(i)] = add(phases[static_cast<std::size_t>(i)].seconds, kRollout, "rollout", i, {inf_stream});
  };
  auto add_training_side = [&](int i) {
    sim::TaskId prev = rollout_task[static_cast<std::size_t>(i)];
    if (colocated) prev = add(switch_train, kSwitch, "switch to training", i, {trn_stream});
    for (const auto& f : fwds) {
      const sim::TaskId t = add(f.seconds[static_cast<std::size_t>(i)], kForward, f.role, i, {trn_stream});
      b.depend(prev, t);
      prev = t;
    }
    const sim::TaskId t = add(train_seconds, kTraining, "training", i, {trn_stream});
    train_task[static_cast<std::size_t>(i)] = t;
    b.depend(prev, t);
    b.depend(rollout_task[static_cast<std::size_t>(i)], t);
    if (colocated) {
      const sim::TaskId w = add(sync, kSync, "weight sync", i, {inf_stream});
      b.depend(t, w);
      last_task[static_cast<std::size_t>(i)] = add(switch_infer, kSwitch, "switch to inference", i, {inf_stream});
    } else {
      last_task[static_cast<std::size_t>(i)] = add(sync, kSync, "weight sync", i, {trn_stream, inf_stream});
      b.depend(t, last_task[static_cast<std::size_t>(i)]);
    }
  };
  if (colocated) {
    for (int i = 0; i < N; ++i) {
      add_rollout(i);
      add_training_side(i);
    }
  } else {
    // Stream orders: inference R0..Rk, S0, R(k+1), S1, ...; training F0 T0 S0 F1 T1 S1 ...
    for (int i = 0; i <= k && i < N; ++i) add_rollout(i);
    for (int i = 0; i < N; ++i) {
      add_training_side(i);
      if (i + k + 1 < N) add_rollout(i + k + 1);
    }
  }
  out.graph = std::move(b).build();
  out.run = sim::Engine(out.graph).run();
  if (out.run.out_of_range) {
    const sim::TaskId t = out.run.failed_task;
    throw ConfigError({Diagnostic{s.file, "/rl", "",
                                  "makes the RL run last longer than the simulator's horizon of 26.7 days ('" +
                                      out.graph.label_text(out.graph.label(t)) + "' of step " +
                                      std::to_string(out.graph.ordinal(t)) +
                                      " would end past it): check the rollout, batch and response-length settings"}});
  }
  if (!out.run.completed) throw InternalError("the RL task graph did not complete (a bug in moesim): " + out.run.error);
  r.tasks = out.graph.num_tasks();
  r.events = out.run.events;

  // Steady state: steps w..N-1 (the first k fill the pipeline). Synchronous: the whole run over
  // N steps. With staleness, steps are counted between the ends of consecutive trainings (each
  // consumes one step's rollouts; the weight syncs at the end run ahead of rollouts not simulated).
  const int w = std::min(k, N - 1);
  const auto& boundary = k == 0 ? last_task : train_task;
  const double t0 = w == 0 ? 0.0 : to_seconds(out.run.end[boundary[static_cast<std::size_t>(w - 1)]]).value();
  const double t1 = to_seconds(out.run.end[boundary[static_cast<std::size_t>(N - 1)]]).value();
  const double steps = N - w;
  r.step_time_s = (t1 - t0) / steps;

  auto mean_over = [&](auto f) {
    double x = 0;
    for (int i = w; i < N; ++i) x += f(i);
    return x / steps;
  };
  r.response_tokens_per_step = mean_over([&](int i) { return draws[static_cast<std::size_t>(i)].response_tokens; });
  r.prompt_tokens_per_step = mean_over([&](int i) { return draws[static_cast<std::size_t>(i)].prompt_tokens; });
  const double seqs = static_cast<double>(rl.sequences_per_step());
  r.mean_response = r.response_tokens_per_step / seqs;
  r.mean_prompt = r.prompt_tokens_per_step / seqs;
  for (int i = w; i < N; ++i)
    for (const auto& rs : draws[static_cast<std::size_t>(i)].responses)
      for (auto len : rs) r.max_response = std::max(r.max_response, static_cast<double>(len));
  if (r.step_time_s > 0) {
    r.response_tokens_per_s = r.response_tokens_per_step / r.step_time_s;
    r.total_tokens_per_s = (r.response_tokens_per_step + r.prompt_tokens_per_step) / r.step_time_s;
    r.response_tokens_per_s_per_device = r.response_tokens_per_s / r.devices;
  }

  // Phases.
  const double roll_s = mean_over([&](int i) { return phases[static_cast<std::size_t>(i)].seconds; });
  {
    RlPhase p{"rollout", roll_s, rl.inference_devices, 0, 0, 0};
    const double flops = mean_over([&](int i) { return phases[static_cast<std::size_t>(i)].flops; });
    const double bytes = mean_over([&](int i) { return phases[static_cast<std::size_t>(i)].bytes_per_device; });
    if (roll_s > 0) {
      p.flops_utilisation = flops / (rl.inference_devices * peak * roll_s);
      p.hbm_utilisation = bytes / (dev.hbm_bandwidth.value() * roll_s);
    }
    r.phases.push_back(p);
    const double slot_time = mean_over([&](int i) { return phases[static_cast<std::size_t>(i)].slot_time; });
    const double slot_cap = mean_over([&](int i) { return phases[static_cast<std::size_t>(i)].slot_capacity; });
    r.long_tail_share = slot_cap > 0 ? 1.0 - slot_time / slot_cap : 0;
    r.tail_s = mean_over([&](int i) { return phases[static_cast<std::size_t>(i)].tail_s; });
  }
  if (colocated) r.phases.push_back(RlPhase{"switch_to_training", switch_train, r.devices, 0, 0, switch_bytes});
  for (const auto& f : fwds) {
    RlPhase p{f.role, mean_over([&](int i) { return f.seconds[static_cast<std::size_t>(i)]; }), fpool, 0, 0, 0};
    const double flops = mean_over([&](int i) { return f.flops[static_cast<std::size_t>(i)]; });
    if (p.seconds > 0) p.flops_utilisation = flops / (fpool * peak * p.seconds);
    r.phases.push_back(p);
  }
  {
    RlPhase p{"training", train_seconds, r.training_devices, 0, 0, 0};
    const double tf = r.training_step_time_s * r.training_mfu + (critic ? critic_step * critic->result.mfu : 0.0);
    p.flops_utilisation = (r.training_step_time_s + critic_step) > 0 ? tf / (r.training_step_time_s + critic_step) : 0;
    r.phases.push_back(p);
  }
  r.phases.push_back(RlPhase{"weight_sync", sync, colocated ? r.devices : r.devices, 0, 0, sync_bytes});
  if (colocated) r.phases.push_back(RlPhase{"switch_to_inference", switch_infer, r.devices, 0, 0, switch_bytes});

  // Idle device-time per step: streams with nothing scheduled, and instances done early.
  auto pool_idle = [&](sim::ResourceId res) {
    double busy = 0;
    for (sim::TaskId t : out.graph.stream_order(res)) {
      const double a = std::max(t0, to_seconds(out.run.start[t]).value());
      const double e = std::min(t1, to_seconds(out.run.end[t]).value());
      if (e > a) busy += e - a;
    }
    return ((t1 - t0) - busy) / steps;
  };
  const double rollout_idle = mean_over([&](int i) { return phases[static_cast<std::size_t>(i)].idle_device_s; });
  if (colocated) {
    r.inference_pool_idle_s = r.training_pool_idle_s = pool_idle(inf_stream);
  } else {
    r.inference_pool_idle_s = pool_idle(inf_stream);
    r.training_pool_idle_s = pool_idle(trn_stream);
  }
  const double idle_dev = rollout_idle + (colocated ? r.inference_pool_idle_s * r.devices
                                                    : r.inference_pool_idle_s * r.inference_devices +
                                                          r.training_pool_idle_s * r.training_devices);
  r.idle_share = r.step_time_s > 0 ? idle_dev / (r.devices * r.step_time_s) : 0;
  r.training_token_coverage = (r.response_tokens_per_step + r.prompt_tokens_per_step) /
                              (rl.optimizer_steps * s.training.training.tokens_per_step());

  // A full-batch decode step at the mean context: what bounds generation.
  const double mean_ctx = r.mean_prompt + 0.5 * r.mean_response;
  const std::int64_t full = std::max<std::int64_t>(1, std::min<std::int64_t>(slots, static_cast<std::int64_t>(std::ceil(
                                                                                     seqs / std::max(1, instances)))));
  r.decode_step_full_s = im.decode_step(full, static_cast<double>(full) * mean_ctx).seconds;
  r.decode_full = im.decode_breakdown(full, static_cast<double>(full) * mean_ctx);
  if (r.decode_step_full_s > 0)
    r.tokens_per_s_per_instance_full = static_cast<double>(full) * r.acceptance_length / r.decode_step_full_s;

  // What limits the step.
  {
    const RlPhase* top = &r.phases.front();
    for (const auto& p : r.phases)
      if (p.seconds > top->seconds) top = &p;
    const double busy_inf = roll_s + (colocated ? 0 : sync);
    const double busy_trn = r.step_time_s - r.training_pool_idle_s;
    std::string lim;
    if (!colocated && k > 0)
      lim = fmt::format("{} pool (busy {:.1f} s of the {:.1f} s step; the other {:.1f} s): ",
                        busy_inf >= busy_trn ? "the inference" : "the training", std::max(busy_inf, busy_trn),
                        r.step_time_s, std::min(busy_inf, busy_trn));
    if (top->name == "rollout") {
      const auto& d = r.decode_full;
      const double tot = std::max(1e-30, d.total());
      lim += fmt::format(
          "rollout {:.0f}% of the step; a full decode step ({} sequences) takes {:.1f} ms: weight-reading GEMMs {:.0f}%, "
          "KV-cache attention {:.0f}%, expert all-to-all {:.0f}%, TP all-reduce {:.0f}%, other {:.0f}%; {:.0f}% of the "
          "rollout's slot-time lost to the long tail (last 10% of responses: {:.0f} s)",
          100 * roll_s / std::max(1e-30, r.step_time_s), full, 1e3 * r.decode_step_full_s, 100 * d.gemm / tot,
          100 * d.attention / tot, 100 * d.ep_comm / tot, 100 * d.tp_comm / tot, 100 * (d.vector + d.pp_comm) / tot,
          100 * r.long_tail_share, r.tail_s);
    } else {
      lim += fmt::format("{} {:.0f}% of the step", top->name, 100 * top->seconds / std::max(1e-30, r.step_time_s));
      if (top->name == "training") lim += fmt::format(" (MFU {:.1f}%, {})", 100 * r.training_mfu, r.training_plan);
    }
    r.limit = lim;
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  // Never an unsound answer (simulate.hpp's check_result_invariants for the RL step).
  std::string bad;
  auto check = [&](const std::string& name, double v) {
    if (!std::isfinite(v) || v < 0) bad += (bad.empty() ? "" : "; ") + name + " = " + std::to_string(v);
  };
  check("step_time_s", r.step_time_s);
  check("response_tokens_per_s", r.response_tokens_per_s);
  check("total_tokens_per_s", r.total_tokens_per_s);
  for (const RlPhase& ph : r.phases) check("phase " + ph.name, ph.seconds);
  if (!bad.empty()) throw InternalError("the RL result breaks its invariants (this is a bug in moesim): " + bad);
  return out;
}

// ---- Output --------------------------------------------------------------------------------

nlohmann::json to_json(const RlResult& r, const RlScenario& s, bool include_wall_time) {
  using nlohmann::json;
  json j;
  j["feasible"] = r.feasible;
  j["infeasible_reason"] = r.feasible ? json(nullptr) : json(r.infeasible_reason);
  j["model"] = s.training.model_name;
  j["cluster"] = s.cluster.name;
  j["device"] = s.cluster.device.name;
  j["mode"] = r.mode;
  j["staleness"] = r.staleness;
  j["devices"] = {{"total", r.devices}, {"training", r.training_devices}, {"inference", r.inference_devices}};
  j["step_time_s"] = r.step_time_s;
  j["tokens_per_step"] = {{"response", r.response_tokens_per_step},
                          {"prompt", r.prompt_tokens_per_step},
                          {"total", r.response_tokens_per_step + r.prompt_tokens_per_step}};
  j["tokens_per_s"] = {{"response", r.response_tokens_per_s},
                       {"total", r.total_tokens_per_s},
                       {"response_per_device", r.response_tokens_per_s_per_device},
                       {"definition",
                        "response: generated response tokens of one RL step / steady-state RL step time; total: prompt + "
                        "response tokens of the step / step time"}};
  json phases = json::array();
  for (const auto& p : r.phases) {
    json q = {{"name", p.name}, {"seconds", p.seconds}, {"devices", p.devices},
              {"share", r.step_time_s > 0 ? p.seconds / r.step_time_s : 0.0},
              {"flops_utilisation", p.flops_utilisation}};
    if (p.name == "rollout") q["hbm_bandwidth_utilisation"] = p.hbm_utilisation;
    if (p.bytes_per_device > 0) q["bytes_per_device"] = p.bytes_per_device;
    phases.push_back(q);
  }
  j["phases"] = phases;
  j["rollout"] = {{"instances", r.instances},
                  {"devices_per_instance", r.devices_per_instance},
                  {"inference_plan", {{"tp", s.rl.inference.tp}, {"pp", s.rl.inference.pp}, {"ep", s.rl.inference.ep}}},
                  {"max_sequences_per_instance", r.max_sequences_per_instance},
                  {"refill", s.rl.refill},
                  {"acceptance_length", r.acceptance_length},
                  {"draft_tokens", s.rl.inference.draft_tokens},
                  {"weight_bytes_per_device", r.weight_bytes_per_device},
                  {"kv_bytes_per_token_per_device", r.kv_bytes_per_token_per_device},
                  {"kv_budget_bytes_per_device", r.kv_budget_per_device},
                  {"mean_prompt_tokens", r.mean_prompt},
                  {"mean_response_tokens", r.mean_response},
                  {"max_response_tokens", r.max_response},
                  {"decode_step_full_batch_s", r.decode_step_full_s},
                  {"decode_step_breakdown_s",
                   {{"gemm", r.decode_full.gemm}, {"attention", r.decode_full.attention}, {"vector", r.decode_full.vector},
                    {"tp_comm", r.decode_full.tp_comm}, {"ep_comm", r.decode_full.ep_comm}, {"pp_comm", r.decode_full.pp_comm}}},
                  {"tokens_per_s_per_instance_full_batch", r.tokens_per_s_per_instance_full},
                  {"long_tail_share", r.long_tail_share},
                  {"tail_s", r.tail_s}};
  j["idle"] = {{"share", r.idle_share},
               {"training_pool_s", r.training_pool_idle_s},
               {"inference_pool_s", r.inference_pool_idle_s}};
  j["training"] = {{"plan", r.training_plan},
                   {"step_time_s", r.training_step_time_s},
                   {"optimizer_steps", s.rl.optimizer_steps},
                   {"mfu", r.training_mfu},
                   {"critic_step_time_s", r.critic_step_time_s},
                   {"token_coverage", r.training_token_coverage},
                   {"state_bytes_per_device", r.training_state_bytes_per_device}};
  j["limit"] = r.limit;
  json simj = {{"version", kVersion}, {"seed", r.seed}, {"steps_simulated", r.steps_simulated},
               {"tasks", r.tasks}, {"events", r.events}};
  if (include_wall_time) simj["wall_s"] = r.wall_s;
  j["simulator"] = simj;
  return j;
}

std::string format_rl_table(const RlResult& r, const RlScenario& s, bool include_wall_time) {
  std::string o;
  o += fmt::format("moesim {} rl: {} on {} x {} ({}), {}{}\n", kVersion, s.training.model_name, r.devices,
                   s.cluster.device.name, s.cluster.name, r.mode,
                   r.staleness > 0 ? fmt::format(", staleness {}", r.staleness) : std::string(", synchronous"));
  o += fmt::format("step: {} prompts x {} rollouts; prompt {:.0f}, response {:.0f} tokens on average (max {:.0f})\n",
                   s.rl.prompts_per_step, s.rl.rollouts_per_prompt, r.mean_prompt, r.mean_response, r.max_response);
  o += fmt::format("inference: {} instance(s) of {} devices (TP{} PP{} EP{}), up to {} sequences each{}{}\n", r.instances,
                   r.devices_per_instance, s.rl.inference.tp, s.rl.inference.pp, s.rl.inference.ep,
                   r.max_sequences_per_instance, s.rl.refill ? ", refill" : ", no refill",
                   s.rl.inference.draft_tokens > 0
                       ? fmt::format(", MTP {} draft, acceptance {:.2f}", s.rl.inference.draft_tokens, r.acceptance_length)
                       : std::string());
  o += fmt::format("training: {} on {} devices, {} optimizer step(s) of {:.3f} s (MFU {:.1f}%)\n\n", r.training_plan,
                   r.training_devices, s.rl.optimizer_steps, r.training_step_time_s, 100 * r.training_mfu);
  if (!r.feasible) o += fmt::format("  INFEASIBLE: {}\n\n", r.infeasible_reason);
  o += fmt::format("  RL step time          {:.3f} s\n", r.step_time_s);
  o += fmt::format("  response tokens/s     {:.0f} ({:.1f} per device)\n", r.response_tokens_per_s,
                   r.response_tokens_per_s_per_device);
  o += fmt::format("  prompt+response /s    {:.0f}\n", r.total_tokens_per_s);
  o += fmt::format("  idle device-time      {:.1f}%  (long tail: {:.1f}% of rollout slot-time; last 10% of responses {:.1f} s)\n\n",
                   100 * r.idle_share, 100 * r.long_tail_share, r.tail_s);
  o += "  phase                  seconds   share  devices  FLOP util  HBM util\n";
  for (const auto& p : r.phases)
    o += fmt::format("    {:<20} {:>8.3f}  {:>5.1f}%  {:>7}  {:>8.1f}%  {}\n", p.name, p.seconds,
                     r.step_time_s > 0 ? 100 * p.seconds / r.step_time_s : 0.0, p.devices, 100 * p.flops_utilisation,
                     p.name == "rollout" ? fmt::format("{:>7.1f}%", 100 * p.hbm_utilisation) : std::string("       -"));
  o += "  (phases overlap when staleness > 0 or the pools are disaggregated; shares are of the step time)\n\n";
  o += fmt::format("  limit: {}\n", r.limit);
  o += fmt::format("  simulated {} RL steps, {} tasks{}\n", r.steps_simulated, r.tasks,
                   include_wall_time ? fmt::format(" in {:.3f} s", r.wall_s) : std::string());
  return o;
}

void write_rl_trace(std::ostream& out, const RlSimulation& sim) {
  const auto& g = sim.graph;
  out << "{\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out << ",\n";
    first = false;
  };
  for (sim::ResourceId res = 0; res < g.num_resources(); ++res) {
    const auto& info = g.resource(res);
    sep();
    out << fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"{}"}}}})", res, info.name);
    sep();
    out << fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":0,"args":{{"name":"{}"}}}})", res, info.name);
  }
  for (sim::TaskId t = 0; t < g.num_tasks(); ++t) {
    for (sim::ResourceId res : g.resources_of(t)) {
      sep();
      const double ts = static_cast<double>(sim.run.start[t]) / 1e6;  // ps -> us
      const double dur = static_cast<double>(sim.run.end[t] - sim.run.start[t]) / 1e6;
      out << fmt::format(R"({{"name":"{} {}","cat":"{}","ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":0}})",
                         g.label_text(g.label(t)), sim.task_step[t], g.category_names()[g.category(t)], ts, dur, res);
    }
  }
  out << "\n]}\n";
}

}  // namespace moesim::strategies
