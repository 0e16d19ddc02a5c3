#include "moesim/strategies/plan/plan.hpp"
#include "moesim/strategies/plan/schedule.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "moesim/models/presets.hpp"
#include "moesim/models/workload.hpp"
#include "reliability.hpp"

namespace moesim::strategies {

const char* mfu_definition_name(MfuDefinition d) {
  switch (d) {
    case MfuDefinition::Moesim: return "moesim";
    case MfuDefinition::Megatron: return "megatron";
    case MfuDefinition::Huawei: return "huawei";
  }
  return "?";
}

const char* alltoall_name(AllToAllAlgo a) {
  switch (a) {
    case AllToAllAlgo::Flat: return "flat";
    case AllToAllAlgo::Hierarchical: return "hierarchical";
    case AllToAllAlgo::AllGather: return "allgather";
  }
  return "?";
}

const char* fidelity_name(Fidelity f) {
  switch (f) {
    case Fidelity::Fast: return "fast";
    case Fidelity::Balanced: return "balanced";
    case Fidelity::Full: return "full";
  }
  return "?";
}

std::optional<Fidelity> parse_fidelity(std::string_view s) {
  if (s == "fast") return Fidelity::Fast;
  if (s == "balanced") return Fidelity::Balanced;
  if (s == "full") return Fidelity::Full;
  return std::nullopt;
}

namespace {

std::string dstr(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

std::uint32_t parse_recompute_modules(const nlohmann::json& v, const std::string& pointer, Diagnostics& diag) {
  namespace rc = models::recompute;
  std::uint32_t bits = 0;
  if (!v.is_array()) {
    diag.error(pointer, json_brief(v), "must be a list of module names");
    return rc::kCoreAttn;
  }
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto& x = v[i];
    const std::uint32_t bit = x.is_string() ? rc::module_bit(x.get<std::string>()) : 0;
    if (bit != 0) bits |= bit;
    else diag.error(pointer + "/" + std::to_string(i), json_brief(x), "must be one of: " + rc::all_module_names());
  }
  return bits;
}

/// Largest parallel size, layer count or micro-batch size the parallelism section takes.
constexpr std::int64_t kMax = 1 << 20;

/// Parallel sizes.
void parse_sizes(ObjectReader& r, Plan& p) {
  p.tp = static_cast<int>(r.integer({"tensor_model_parallel_size", "tp"}, 1, 1, kMax));
  p.pp = static_cast<int>(r.integer({"pipeline_model_parallel_size", "pp"}, 1, 1, kMax));
  p.vpp = static_cast<int>(r.integer({"virtual_pipeline_model_parallel_size", "vpp"}, 1, 1, kMax));
  if (auto lps = r.opt_integer({"num_layers_per_virtual_pipeline_stage"}, 1, kMax)) {
    // Megatron derives vpp = layers / (pp x layers_per_vstage); resolved in validate_plan.
    p.vpp = -static_cast<int>(*lps);
  }
  p.ep = static_cast<int>(r.integer({"expert_model_parallel_size", "ep"}, 1, 1, kMax));
  p.etp = static_cast<int>(r.integer({"expert_tensor_parallel_size", "etp"}, 0, 1, kMax));
  p.cp = static_cast<int>(r.integer({"context_parallel_size", "cp"}, 1, 1, kMax));
  p.dp = static_cast<int>(r.integer({"data_parallel_size", "dp"}, 0, 1, kMax));
  p.mbs = static_cast<int>(r.integer({"micro_batch_size", "mbs"}, 1, 1, kMax));
}

/// Data-parallel sharding, under any of its names: Megatron's use_distributed_optimizer (ZeRO-1),
/// Megatron-FSDP's use_megatron_fsdp + data_parallel_sharding_strategy, DeepSpeed's zero_stage,
/// PyTorch's fsdp / fully_shard (ZeRO-3). Names that disagree are an error.
void parse_dp_sharding(ObjectReader& r, Plan& p, Diagnostics& diag) {
  static constexpr std::string_view kStrategies[] = {"no_shard", "optim", "optim_grads", "optim_grads_params"};
  std::optional<DpSharding> by_strategy, by_stage;
  if (auto st = r.opt_string({"data_parallel_sharding_strategy"}, std::span<const std::string_view>(kStrategies)))
    for (int i = 0; i < 4; ++i)
      if (*st == kStrategies[i]) by_strategy = static_cast<DpSharding>(i);
  if (auto z = r.opt_integer({"zero_stage"}, 0, 3)) by_stage = static_cast<DpSharding>(*z);
  const bool fsdp = r.boolean({"use_megatron_fsdp", "fsdp", "fully_shard"}, false);
  const bool distopt = r.boolean({"use_distributed_optimizer"}, false);
  if (by_strategy && by_stage && *by_strategy != *by_stage)
    diag.error(r.child_pointer("zero_stage"), std::to_string(static_cast<int>(*by_stage)),
               std::string("disagrees with data_parallel_sharding_strategy \"") + dp_sharding_name(*by_strategy) + "\"");
  DpSharding s = by_strategy ? *by_strategy : by_stage ? *by_stage : DpSharding::None;
  if (fsdp && !by_strategy && !by_stage) s = DpSharding::Full;  // Megatron-FSDP's and FSDP's default
  if (distopt && s == DpSharding::None && !by_strategy && !by_stage) s = DpSharding::Optimizer;
  p.dp_sharding = s;
  p.distributed_optimizer = s != DpSharding::None;
  p.reshard_after_forward = r.boolean({"fsdp_reshard_after_forward", "reshard_after_forward"}, true);
  const std::string sync = r.string({"fsdp_gradient_sync"}, "every_microbatch", {"every_microbatch", "last_microbatch"});
  p.grad_sync_every_microbatch = sync == "every_microbatch";
  if (!p.grad_sync_every_microbatch && s != DpSharding::OptimizerGradients && s != DpSharding::Full)
    diag.error(r.child_pointer("fsdp_gradient_sync"), "\"last_microbatch\"",
               "needs sharded gradients (data_parallel_sharding_strategy optim_grads or optim_grads_params)");
}

/// Optimizer, overlap and swap switches.
void parse_switches(ObjectReader& r, Plan& p, Diagnostics& diag) {
  p.sequence_parallel = r.boolean({"sequence_parallel"}, false);
  parse_dp_sharding(r, p, diag);
  p.moe_tp_extend_ep = r.boolean({"moe_tp_extend_ep"}, false);
  p.allow_cross_node_tp = r.boolean({"allow_cross_node_tp"}, false);
  p.overlap_grad_reduce = r.boolean({"overlap_grad_reduce"}, false);
  p.overlap_param_gather = r.boolean({"overlap_param_gather"}, false);
  p.tp_comm_overlap = r.boolean({"tp_comm_overlap"}, false);
  p.cp_all_gather = r.string({"cp_comm_type"}, "p2p", {"p2p", "all_gather"}) == "all_gather";
  p.fb_overlap = r.boolean({"moe_fb_overlap", "fb_overlap"}, false);
  p.shared_expert_overlap = r.boolean({"moe_shared_expert_overlap", "moe_alltoall_overlap_comm"}, false);
  p.swap_activations = r.number({"swap_activations"}, 0.0, 0.0, 1.0);
  p.swap_optimizer = r.boolean({"swap_optimizer"}, false);
  p.offload_weights = r.boolean({"offload_weights"}, false);
  p.grad_reduce_in_bf16 = r.boolean({"grad_reduce_in_bf16"}, false);
  // Megatron's precision-aware optimizer: the Adam moments' and master weights' dtypes.
  auto dtype_bytes = [&](const char* key, const char* def, std::initializer_list<std::string_view> allowed) {
    const std::string d = r.string({key}, def, allowed);
    return d == "fp32" ? 4.0 : d == "fp8" ? 1.0 : 2.0;
  };
  p.exp_avg_bytes = dtype_bytes("exp_avg_dtype", "fp32", {"fp32", "bf16", "fp16", "fp8"});
  p.exp_avg_sq_bytes = dtype_bytes("exp_avg_sq_dtype", "fp32", {"fp32", "bf16", "fp16", "fp8"});
  p.main_params_bytes = dtype_bytes("main_params_dtype", "fp32", {"fp32", "fp16"});
  p.fp8_param_gather = r.boolean({"fp8_param_gather", "fp8_params"}, false);
  if (p.overlap_param_gather && !p.distributed_optimizer)
    diag.error(r.child_pointer("overlap_param_gather"), "true", "requires use_distributed_optimizer=true");
  if (p.tp_comm_overlap && !p.sequence_parallel)
    diag.error(r.child_pointer("tp_comm_overlap"), "true", "requires sequence_parallel=true (as in Megatron-core)");
}

/// Recomputation: granularity, method, layers, modules.
void parse_recompute(ObjectReader& r, Plan& p, Diagnostics& diag) {
  {
    const nlohmann::json* g = r.get({"recompute_granularity"});
    if (g != nullptr && !g->is_null()) {
      const std::string s = g->is_string() ? g->get<std::string>() : "";
      if (s == "full") p.recompute = Recompute::Full;
      else if (s == "selective") p.recompute = Recompute::Selective;
      else if (s == "selective_op") p.recompute = Recompute::SelectiveOp;
      else if (s == "none") p.recompute = Recompute::None;
      else diag.error(r.child_pointer("recompute_granularity"), json_brief(*g), "must be one of: none, selective, selective_op, full (or null)");
    }
  }
  const std::string method = r.string({"recompute_method"}, "uniform", {"uniform", "block"});
  p.recompute_method = method == "block" ? RecomputeMethod::Block : RecomputeMethod::Uniform;
  p.recompute_num_layers = static_cast<int>(r.integer({"recompute_num_layers"}, 0, 0, kMax));
  if (const auto* mods = r.get({"recompute_modules"}); mods != nullptr && !mods->is_null()) {
    p.recompute_modules = parse_recompute_modules(*mods, r.child_pointer("recompute_modules"), diag);
    if (p.recompute != Recompute::Selective)
      diag.error(r.child_pointer("recompute_modules"), json_brief(*mods), "needs recompute_granularity=\"selective\"");
  } else {
    p.recompute_modules = models::recompute::kCoreAttn;  // Megatron's default selective module
  }
  // MindSpeed's savers riding on selective recomputation: --recompute-activation-function and
  // --moe-zero-memory add their modules (alone, without core_attn, when nothing else is
  // recomputed); full recomputation has nothing left for them to drop.
  namespace rc = models::recompute;
  std::uint32_t extra = r.boolean({"recompute_activation_function"}, false) ? rc::kActivation : 0u;
  const std::string zero = r.string({"moe_zero_memory"}, "disable", {"disable", "level0", "level1"});
  if (zero == "level0") extra |= rc::kZeroMemoryLevel0;
  if (zero == "level1") extra |= rc::kZeroMemoryLevel1;
  if (extra != 0 && (p.recompute == Recompute::None || p.recompute == Recompute::Selective)) {
    p.recompute_modules = p.recompute == Recompute::Selective ? p.recompute_modules | extra : extra;
    p.recompute = Recompute::Selective;
  }
}

/// Pipeline layer partition: "auto", "even" (with first/last stage counts), or explicit.
void parse_layer_partition(ObjectReader& r, Plan& p, Diagnostics& diag) {
  if (const auto* part = r.get({"pipeline_layer_partition"})) {
    if (part->is_string()) {
      const std::string s = part->get<std::string>();
      if (s == "auto" || s == "even") p.partition = s;
      else diag.error(r.child_pointer("pipeline_layer_partition"), json_brief(*part), "must be \"auto\", \"even\" or a list of layer counts per virtual stage");
    } else if (part->is_array()) {
      p.partition = "explicit";
      for (std::size_t i = 0; i < part->size(); ++i) {
        const auto& x = (*part)[i];
        if (!x.is_number_integer() || x.get<int>() < 0) {
          diag.error(r.child_pointer("pipeline_layer_partition") + "/" + std::to_string(i), json_brief(x),
                     "must be a non-negative integer (decoder layers in this virtual stage)");
          continue;
        }
        p.layers_per_stage.push_back(x.get<int>());
      }
    } else {
      diag.error(r.child_pointer("pipeline_layer_partition"), json_brief(*part), "must be \"auto\", \"even\" or a list of integers");
    }
  }
  p.first_stage_layers = static_cast<int>(r.integer({"decoder_first_pipeline_num_layers"}, -1, 0, kMax));
  p.last_stage_layers = static_cast<int>(r.integer({"decoder_last_pipeline_num_layers"}, -1, 0, kMax));
  p.noop_layers = static_cast<int>(r.integer({"noop_layers"}, 0, 0, kMax));
  if ((p.first_stage_layers >= 0 || p.last_stage_layers >= 0) && p.partition == "auto") p.partition = "even";
}

/// A pipeline schedule given by name, against the plan's vpp.
void apply_schedule(ObjectReader& r, const std::string& sched, Plan& p, Diagnostics& diag) {
  const ScheduleTraits* t = find_schedule(sched);
  if (t == nullptr) return;  // refused by name already
  if (const std::string why = t->vpp_problem(p.vpp); !why.empty())
    diag.error(r.child_pointer("pipeline_schedule"), "\"" + sched + "\"", why);
  p.schedule = t->kind;
  // DualPipe: the device's two chunks are its stage for each direction.
  if (t->chunks == 1 && t->plan_vpp > 1) p.vpp = t->plan_vpp;
}

void parse_parallelism(const nlohmann::json& j, const std::string& ptr, Plan& p, TrainingSpec& t, Diagnostics& diag) {
  ObjectReader r(j, ptr, diag);
  if (!r.valid()) return;
  parse_sizes(r, p);
  parse_switches(r, p, diag);
  parse_recompute(r, p, diag);
  // Adaptive Pipe Overlap is a hierarchical all-to-all with forward-backward overlap: it sets
  // both unless the scenario says otherwise, which is a contradiction.
  p.adaptive_pipe_overlap = r.boolean({"adaptive_pipe_overlap"}, false);
  const bool a2a_given = r.has({"moe_alltoall"});
  const std::string a2a = r.string({"moe_alltoall"}, p.adaptive_pipe_overlap ? "hierarchical" : "flat",
                                   {"flat", "hierarchical", "allgather"});
  p.alltoall = a2a == "hierarchical" ? AllToAllAlgo::Hierarchical
               : a2a == "allgather"  ? AllToAllAlgo::AllGather
                                     : AllToAllAlgo::Flat;
  if (p.adaptive_pipe_overlap) {
    if (a2a_given && p.alltoall != AllToAllAlgo::Hierarchical)
      diag.error(r.child_pointer("moe_alltoall"), "\"" + a2a + "\"",
                 "contradicts adaptive_pipe_overlap, which overlaps the two phases of the hierarchical all-to-all");
    if (r.has({"moe_fb_overlap", "fb_overlap"}) && !p.fb_overlap)
      diag.error(r.child_pointer(r.found_key({"moe_fb_overlap", "fb_overlap"})), "false",
                 "contradicts adaptive_pipe_overlap, which overlaps each micro-batch's all-to-all with the compute of "
                 "the next (forward-backward overlap)");
    p.fb_overlap = true;
  }
  const auto sched = r.opt_string({"pipeline_schedule"}, schedule_names());
  parse_layer_partition(r, p, diag);
  // A micro-batch size given in the training section is the same Megatron argument.
  (void)t;
  if (sched) apply_schedule(r, *sched, p, diag);
  r.ignore({"megatron_args"});
  r.finish();
}

void parse_training(const nlohmann::json& j, const std::string& ptr, TrainingSpec& t, Diagnostics& diag) {
  ObjectReader r(j, ptr, diag);
  if (!r.valid()) return;
  t.seq_length = r.required_integer({"seq_length", "seq_len"}, 1, 1LL << 30);
  t.global_batch_size = r.required_integer({"global_batch_size", "gbs"}, 1, 1LL << 40);
  const std::string prec = r.string({"precision"}, "bf16", {"bf16", "fp16", "fp8"});
  t.precision = prec == "fp8" ? models::Precision::FP8 : prec == "fp16" ? models::Precision::FP16 : models::Precision::BF16;
  const std::string kernel = r.string({"attention_kernel"}, "flash", {"flash", "flash2", "unfused"});
  t.workload.attention = kernel == "unfused" ? models::AttentionKernel::Unfused : models::AttentionKernel::Flash;
  t.flash2 = kernel == "flash2";
  t.workload.dropout = r.number({"dropout"}, 0.0, 0.0, 0.99);
  const std::string ce = r.string({"cross_entropy"}, "fused", {"fused", "pytorch", "compiled"});
  t.workload.cross_entropy = ce == "pytorch"    ? models::CrossEntropy::PyTorch
                             : ce == "compiled" ? models::CrossEntropy::Compiled
                                                : models::CrossEntropy::Fused;
  const std::string probs = r.string({"moe_router_probs"}, "activation", {"activation", "output"});
  t.workload.moe_probs = probs == "output" ? models::MoeProbs::Output : models::MoeProbs::Activation;
  // "eager": norms, RoPE and SwiGLU as chains of plain PyTorch kernels (no torch.compile).
  t.workload.eager_elementwise = r.string({"elementwise"}, "fused", {"fused", "eager"}) == "eager";
  if (const auto* d = r.get({"documents"})) {
    ObjectReader q(*d, r.child_pointer("documents"), diag);
    t.documents.packed = true;
    const auto mean = q.opt_number({"mean_tokens"}, 1.0, 1e9);
    if (!mean) diag.error(q.child_pointer("mean_tokens"), "", "is required (mean document length in tokens)");
    t.documents.mean_tokens = mean.value_or(1.0);
    t.documents.sigma = q.number({"sigma"}, 1.0, 0.0, 5.0);
    t.documents.reorder = q.boolean({"reorder"}, false);
    q.finish();
  }
  r.finish();
}

}  // namespace

namespace {

struct Problem {
  std::string pointer, value, constraint;
};

/// The problems of a plan: any makes it invalid. Messages are built only when there is
/// somewhere to put them: a search checks many plans.
class PlanChecker {
 public:
  explicit PlanChecker(Diagnostics* diag) : diag_(diag) {}

  /// A problem; `make()` gives its message.
  template <class Make>
  void fail(Make&& make) {
    ok_ = false;
    if (diag_ != nullptr) {
      Problem pr = make();
      diag_->error(std::move(pr.pointer), std::move(pr.value), std::move(pr.constraint));
    }
  }
  /// A problem with a parallelism key and its value.
  [[nodiscard]] Problem keyed(const std::string& key, double v, std::string constraint) const {
    return Problem{P + "/" + key, dstr(v), std::move(constraint)};
  }
  [[nodiscard]] bool ok() const { return ok_; }

  const std::string P = "/parallelism";

 private:
  Diagnostics* diag_;
  bool ok_ = true;
};

/// The virtual pipeline size (from layers per virtual stage) and the schedule it implies.
void resolve_vpp(Plan& p, const models::ModelSpec& m, PlanChecker& ck) {
  // Virtual pipeline size from layers per virtual stage.
  if (p.vpp < 0) {
    const int lps = -p.vpp;
    const int total = m.num_layers + p.noop_layers;
    if (total % (p.pp * lps) != 0) {
      ck.fail([&] { return ck.keyed("num_layers_per_virtual_pipeline_stage", lps,
          "must divide num_layers/pp = " + std::to_string(total) + "/" + std::to_string(p.pp)); });
      p.vpp = 1;
    } else {
      p.vpp = total / (p.pp * lps);
    }
  }
  // With chunks, the automatic schedule is the interleaved one.
  if (p.vpp > 1 && schedule_traits(p.schedule).automatic) p.schedule = automatic_schedule(p.vpp);
}

/// The data-parallel size from the devices; returns whether it is known (tp x pp x cp divides).
bool resolve_dp(Plan& p, const topologies::ClusterSpec& c, PlanChecker& ck) {
  const std::string& P = ck.P;
  const long long model_par = 1LL * p.tp * p.pp * p.cp;
  const bool dp_known = c.devices % model_par == 0;
  if (!dp_known) {
    ck.fail([&] { return Problem{P, "", "tp x pp x cp = " + std::to_string(p.tp) + " x " + std::to_string(p.pp) +
                          " x " + std::to_string(p.cp) + " = " + std::to_string(model_par) + " must divide the " +
                          std::to_string(c.devices) + " devices (/cluster/devices)"}; });
  } else {
    const int dp = static_cast<int>(c.devices / model_par);
    if (p.dp != 0 && p.dp != dp)
      ck.fail([&] { return ck.keyed("data_parallel_size", p.dp,
          "must equal devices / (tp x pp x cp) = " + std::to_string(c.devices) + " / " + std::to_string(model_par) + " = " +
              std::to_string(dp)); });
    p.dp = dp;
  }
  if (p.dp <= 0) p.dp = 1;
  return dp_known;
}

/// Tensor parallelism against the heads and FFN, sequence parallelism, the sequence length.
void check_tensor_parallel(const Plan& p, const TrainingSpec& t, const models::ModelSpec& m, PlanChecker& ck) {
  const std::string& P = ck.P;
  if (m.heads % p.tp != 0) ck.fail([&] { return ck.keyed("tensor_model_parallel_size", p.tp, "must divide num_attention_heads=" + std::to_string(m.heads)); });
  if (m.attention == models::AttentionKind::GQA && m.kv_heads % p.tp != 0 && p.tp % m.kv_heads != 0)
    ck.fail([&] { return ck.keyed("tensor_model_parallel_size", p.tp,
        "must divide num_key_value_heads=" + std::to_string(m.kv_heads) + " (or be a multiple of it)"); });
  if (m.num_dense_layers() > 0 && m.ffn_hidden % p.tp != 0)
    ck.fail([&] { return ck.keyed("tensor_model_parallel_size", p.tp, "must divide intermediate_size=" + std::to_string(m.ffn_hidden)); });
  if (p.tp > 1 && !p.sequence_parallel && m.is_moe())
    ck.fail([&] { return Problem{P + "/sequence_parallel", "false", "must be true for MoE models with tp > 1 (Megatron requires it)"}; });
  const long long seq_div = 1LL * (p.sequence_parallel ? p.tp : 1) * p.cp * (p.cp > 1 ? 2 : 1);
  if (t.seq_length % seq_div != 0)
    ck.fail([&] { return Problem{"/training/seq_length", std::to_string(t.seq_length),
               "must be divisible by " + std::string(p.sequence_parallel ? "tp x " : "") + "cp" +
                   (p.cp > 1 ? " x 2 (load-balanced context parallelism)" : "") + " = " + std::to_string(seq_div)}; });
}

/// Tensor-parallel groups inside one scale-up domain: Megatron places TP ranks on consecutive
/// devices, so a group crosses servers when tp exceeds the server or does not divide it, and
/// its per-layer collectives then go over the NICs (a few GB/s instead of hundreds).
void check_tensor_placement(const Plan& p, const topologies::ClusterSpec& c, PlanChecker& ck) {
  if (p.allow_cross_node_tp || p.tp <= 1 || c.devices <= c.devices_per_node) return;
  if (p.tp > c.devices_per_node || c.devices_per_node % p.tp != 0)
    ck.fail([&] { return ck.keyed("tensor_model_parallel_size", p.tp,
        "places tensor-parallel groups across servers of " + std::to_string(c.devices_per_node) +
            " devices: their per-layer collectives would leave the scale-up domain. Set "
            "parallelism.allow_cross_node_tp: true if this is intended"); });
}

/// Expert parallelism against the experts and the devices (a dense model has none).
void check_expert_parallel(const Plan& p, const models::ModelSpec& m, bool dp_known, PlanChecker& ck) {
  if (m.is_moe()) {
    const int ep = p.ep_size();
    const int etp = p.etp_size();
    if (m.num_experts % ep != 0)
      ck.fail([&] { return ck.keyed("expert_model_parallel_size", p.ep,
          "gives " + std::to_string(ep) + " expert-parallel ranks" + (p.moe_tp_extend_ep ? " (ep x tp with moe_tp_extend_ep)" : "") +
              ", which must divide num_experts=" + std::to_string(m.num_experts)); });
    if (m.expert_ffn_hidden % etp != 0) {
      if (p.etp == 0)
        ck.fail([&] { return ck.keyed("tensor_model_parallel_size", p.tp,
            "is also the expert tensor-parallel size by default (Megatron), and must divide the expert FFN width " +
                std::to_string(m.expert_ffn_hidden) + "; set expert_tensor_parallel_size or moe_tp_extend_ep"); });
      else
        ck.fail([&] { return ck.keyed("expert_tensor_parallel_size", etp, "must divide the expert FFN width " + std::to_string(m.expert_ffn_hidden)); });
    }
    const long long block = 1LL * p.tp * p.cp * p.dp;
    if (dp_known && block % (1LL * ep * etp) != 0)
      ck.fail([&] { return ck.keyed("expert_model_parallel_size", p.ep,
          "ep x etp = " + std::to_string(1LL * ep * etp) + " must divide tp x cp x dp = " + std::to_string(block)); });
    if (p.moe_tp_extend_ep && p.etp != 0 && p.etp != 1)
      ck.fail([&] {
        return ck.keyed("expert_tensor_parallel_size", p.etp, "must be 1 (or absent) with moe_tp_extend_ep");
      });
  } else if (p.ep != 1) {
    ck.fail([&] { return ck.keyed("expert_model_parallel_size", p.ep, "must be 1 for a dense model"); });
  }
}

/// The number of micro-batches per pipeline from the global batch.
void resolve_microbatches(Plan& p, const TrainingSpec& t, bool dp_known, PlanChecker& ck) {
  const long long per_step = 1LL * p.mbs * p.dp;
  if (!dp_known) {
    p.num_microbatches = 1;
  } else if (t.global_batch_size % per_step != 0) {
    ck.fail([&] { return Problem{"/training/global_batch_size", std::to_string(t.global_batch_size),
               "must be a multiple of micro_batch_size x dp = " + std::to_string(p.mbs) + " x " + std::to_string(p.dp) +
                   " = " + std::to_string(per_step)}; });
  } else {
    p.num_microbatches = static_cast<int>(t.global_batch_size / per_step);
  }
  if (p.num_microbatches <= 0) p.num_microbatches = 1;
}

/// The schedule's needs: a pipeline for vpp > 1, micro-batch counts for dualpipe(v) and interleaving.
void check_schedule(const Plan& p, const TrainingSpec& t, PlanChecker& ck) {
  if (p.vpp > 1 && p.pp == 1) ck.fail([&] { return ck.keyed("virtual_pipeline_model_parallel_size", p.vpp, "needs pipeline_model_parallel_size > 1"); });
  // The schedule's own constraints (schedule.cpp's registry).
  for (const ScheduleProblem& sp : schedule_traits(p.schedule).check(p.pp, p.vpp, p.num_microbatches)) {
    if (sp.field == "pp") {
      ck.fail([&] { return ck.keyed("pipeline_model_parallel_size", p.pp, sp.message); });
    } else {
      ck.fail([&] { return Problem{"/training/global_batch_size", std::to_string(t.global_batch_size),
                 "gives " + std::to_string(p.num_microbatches) + " micro-batches per pipeline; " + sp.message}; });
    }
  }
}

/// Layer partition over virtual stages.
void check_partition(const Plan& p, const models::ModelSpec& m, PlanChecker& ck) {
  const std::string& P = ck.P;
  const int vs = bidirectional(p.schedule) ? p.pp : p.pp * p.vpp;  // DualPipe: stages, each held twice
  const int slots = m.num_layers + p.noop_layers;
  if (p.partition == "explicit") {
    if (static_cast<int>(p.layers_per_stage.size()) != vs) {
      ck.fail([&] { return Problem{P + "/pipeline_layer_partition",
                 std::to_string(p.layers_per_stage.size()) + " entries",
                 std::string(bidirectional(p.schedule) ? "must have pp = " : "must have pp x vpp = ") + std::to_string(vs) +
                     " entries"}; });
    } else {
      int sum = 0;
      for (int x : p.layers_per_stage) sum += x;
      if (sum != m.num_layers)
        ck.fail([&] { return Problem{P + "/pipeline_layer_partition", "sum " + std::to_string(sum),
                   "must add up to num_hidden_layers=" + std::to_string(m.num_layers)}; });
    }
  } else if (p.partition == "even") {
    int rest = slots;
    int stages = vs;
    if (p.first_stage_layers >= 0) {
      rest -= p.first_stage_layers;
      --stages;
    }
    if (p.last_stage_layers >= 0) {
      rest -= p.last_stage_layers;
      --stages;
    }
    if (stages <= 0 || rest < 0 || rest % stages != 0)
      ck.fail([&] { return Problem{P, "", "an even split of " + std::to_string(slots) + " layers (" + std::to_string(m.num_layers) +
                            " + " + std::to_string(p.noop_layers) + " noop) over pp x vpp = " + std::to_string(vs) +
                            " virtual stages does not divide" +
                            (p.first_stage_layers >= 0 || p.last_stage_layers >= 0 ? " after the first/last stage counts" : "") +
                            "; use pipeline_layer_partition \"auto\" or give decoder_first/last_pipeline_num_layers"}; });
  } else if (slots + 2 < vs) {
    // The automatic partition may leave the first and last virtual stages with only the
    // embedding or the loss (Megatron's account_for_embedding/loss_in_pipeline_split).
    ck.fail([&] { return Problem{P + "/pipeline_model_parallel_size", std::to_string(p.pp),
               "x vpp=" + std::to_string(p.vpp) + " gives " + std::to_string(vs) + " virtual stages, more than the " +
                   std::to_string(m.num_layers) + " layers plus the embedding and loss stages"}; });
  }
}

}  // namespace

bool check_plan(Plan& p, const TrainingSpec& t, const models::ModelSpec& m, const topologies::ClusterSpec& c,
                Diagnostics* diag) {
  PlanChecker ck(diag);
  if (m.num_layers <= 0 || c.devices <= 0) return false;  // already reported
  resolve_vpp(p, m, ck);
  const bool dp_known = resolve_dp(p, c, ck);
  check_tensor_parallel(p, t, m, ck);
  check_tensor_placement(p, c, ck);
  check_expert_parallel(p, m, dp_known, ck);
  resolve_microbatches(p, t, dp_known, ck);
  check_schedule(p, t, ck);
  check_partition(p, m, ck);
  return ck.ok();
}

void validate_plan(Plan& p, const TrainingSpec& t, const models::ModelSpec& m, const topologies::ClusterSpec& c,
                   Diagnostics& diag) {
  check_plan(p, t, m, c, &diag);
}

bool plan_is_valid(Plan& p, const TrainingSpec& t, const models::ModelSpec& m, const topologies::ClusterSpec& c) {
  return check_plan(p, t, m, c, nullptr);
}

namespace {

/// The model and the cluster.
void load_model_and_cluster(ObjectReader& root, const std::string& base_dir, Scenario& s, Diagnostics& diag) {
  // Model.
  if (const auto* m = root.get({"model"})) {
    s.model = models::load_model(*m, "/model", diag, base_dir);
    s.model_name = m->is_string() ? m->get<std::string>() : s.model.name;
  } else {
    diag.error("/model", "", "is required (a preset name, a path to config.json, or a config object)");
  }
  // Cluster.
  if (const auto* c = root.get({"cluster"})) s.cluster = topologies::load_cluster(*c, "/cluster", diag);
  else diag.error("/cluster", "", "is required ({\"preset\": \"atlas-800t-a2\", \"devices\": 6144})");
}

/// moe.expert_map: the expert-parallel rank(s) of each expert.
void parse_expert_map(const nlohmann::json& map, Scenario& s, Diagnostics& diag) {
  const std::string ptr = "/moe/expert_map";
  const int ep = s.plan.ep_size(), E = s.model.num_experts;
  if (!s.model.is_moe()) {
    diag.error(ptr, json_brief(map), "needs a mixture-of-experts model");
  } else if (!map.is_array() || static_cast<int>(map.size()) != E) {
    diag.error(ptr, map.is_array() ? std::to_string(map.size()) + " experts" : json_brief(map),
               "must list the expert-parallel rank(s) of each of the model's " + std::to_string(E) + " experts");
  } else {
    for (int e = 0; e < E; ++e) {
      const auto& x = map[static_cast<std::size_t>(e)];
      const std::string ep_ptr = ptr + "/" + std::to_string(e);
      std::vector<nlohmann::json> ranks = x.is_array() ? x.get<std::vector<nlohmann::json>>() : std::vector<nlohmann::json>{x};
      std::vector<int> where;
      if (ranks.empty()) diag.error(ep_ptr, "[]", "leaves expert " + std::to_string(e) + " on no rank; give at least one");
      for (const auto& v : ranks) {
        if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= ep) {
          diag.error(ep_ptr, json_brief(v), "must be an expert-parallel rank in 0.." + std::to_string(ep - 1) +
                                                " (the plan's expert-parallel size is " + std::to_string(ep) + ")");
          continue;
        }
        const int rank = static_cast<int>(v.get<long long>());
        if (std::find(where.begin(), where.end(), rank) != where.end())
          diag.error(ep_ptr, json_brief(v), "lists the same rank twice");
        else
          where.push_back(rank);
      }
      s.placement.expert_map.push_back(std::move(where));
    }
  }
}

/// The moe section: routing, placement and rebalancing, the expert map.
void parse_moe(const nlohmann::json& moe, const std::string& base_dir, Scenario& s, Diagnostics& diag) {
  ObjectReader r(moe, "/moe", diag);
  models::parse_routing(r, s.routing, base_dir, s.model);
  const std::string placement = r.string({"placement"}, "static", {"static", "rebalanced"});
  s.placement.rebalance = placement == "rebalanced";
  if (const auto* rb = r.get({"rebalance"})) {
    ObjectReader q(*rb, "/moe/rebalance", diag);
    s.placement.ema = q.number({"ema"}, 0.9, 0.0, 0.999);
    s.placement.threshold = q.number({"threshold"}, 0.08, 0.0, 10.0);
    s.placement.interval_steps = static_cast<int>(q.integer({"interval_steps"}, 50, 1, 1 << 20));
    s.placement.redundant_experts = static_cast<int>(q.integer({"redundant_experts"}, 0, 0, 1 << 16));
    q.finish();
  }
  if (const auto* map = r.get({"expert_map"})) parse_expert_map(*map, s, diag);
  r.finish();
}

/// The simulation section.
void parse_simulation(ObjectReader& root, Scenario& s, Diagnostics& diag) {
  // Host dispatch follows the device's calibrated host time per operator unless the scenario
  // sets it (e.g. "0us" for a run captured in CUDA graphs).
  s.simulation.launch_overhead = s.cluster.device.host_op_time.value();
  if (const auto* sim = root.get({"simulation"})) {
    ObjectReader r(*sim, "/simulation", diag);
    const std::string f = r.string({"fidelity"}, "balanced", {"fast", "balanced", "full"});
    s.simulation.fidelity = *parse_fidelity(f);
    s.simulation.network =
        r.string({"network"}, "flow", {"flow", "analytical"}) == "analytical" ? NetworkModel::Analytical : NetworkModel::Flow;
    s.simulation.comm_compute_slowdown = r.number({"comm_compute_slowdown"}, 0.0, 0.0, 10.0);
    s.simulation.port_sharing = r.boolean({"port_sharing"}, true);
    const std::string mfu = r.string({"mfu_definition"}, "moesim", {"moesim", "megatron", "huawei"});
    s.simulation.mfu_definition = mfu == "megatron" ? MfuDefinition::Megatron
                                  : mfu == "huawei" ? MfuDefinition::Huawei
                                                    : MfuDefinition::Moesim;
    s.simulation.max_memory_bytes = r.opt_quantity({"max_memory"}, Dimension::Bytes, 1.0).value_or(0.0);
    if (const auto* st = r.get({"stragglers"})) parse_stragglers(*st, s, diag);
    if (const auto* hd = r.get({"host_dispatch"})) {
      ObjectReader q(*hd, "/simulation/host_dispatch", diag);
      s.simulation.launch_overhead = q.opt_quantity({"launch_overhead"}, Dimension::Seconds).value_or(s.simulation.launch_overhead);
      if (!q.has({"launch_overhead"}) && s.simulation.launch_overhead <= 0)
        diag.error("/simulation/host_dispatch/launch_overhead", "",
                   "is required: device " + s.cluster.device.name +
                       " has no calibrated host_op_time (host time per kernel launch, e.g. \"20us\")");
      s.simulation.fused_vector_ops = q.boolean({"fused_vector_ops"}, false);
      q.finish();
    }
    r.finish();
  }
}

/// Swapping needs the device-host bandwidth, fp8 the device's FP8 peak (and FP8 weights an FP8 recipe).
void check_device_support(const Scenario& s, Diagnostics& diag) {
  if (s.plan.offload_weights && s.plan.dp_sharding != DpSharding::OptimizerGradients && s.plan.dp_sharding != DpSharding::Full)
    diag.error("/parallelism/offload_weights", "true",
               "needs the gradients sharded as they are produced (data_parallel_sharding_strategy \"optim_grads\" or "
               "\"optim_grads_params\"): unsharded gradients of weights kept in host memory would not fit either");
  if (s.plan.offload_weights && (s.plan.fb_overlap || pairs_forward_backward(s.plan.schedule)))
    diag.error("/parallelism/offload_weights", "true",
               "cannot run with forward-backward pairs (moe_fb_overlap, DualPipe, DualPipeV): the offloaded weights stream "
               "through a double buffer one pass at a time, and a pair runs two passes' layers at once");
  if (s.plan.offload_weights && s.cluster.device.host_bandwidth.value() <= 0 && diag.ok())
    diag.error("/parallelism/offload_weights", "true",
               "needs the device-host bandwidth (\"host_bandwidth\"), which device " + s.cluster.device.name + " does not have");
  if ((s.plan.swap_activations > 0 || s.plan.swap_optimizer) && s.cluster.device.host_bandwidth.value() <= 0 && diag.ok())
    diag.error(s.plan.swap_activations > 0 ? "/parallelism/swap_activations" : "/parallelism/swap_optimizer",
               s.plan.swap_activations > 0 ? std::to_string(s.plan.swap_activations) : "true",
               "needs the device-host bandwidth (\"host_bandwidth\"), which device " + s.cluster.device.name +
                   " does not give");
  if (s.plan.fp8_param_gather && s.training.precision != models::Precision::FP8)
    diag.error("/parallelism/fp8_param_gather", "true", "needs training.precision \"fp8\" (the weights are FP8 tensors)");
  if (s.training.precision == models::Precision::FP8 && s.cluster.device.peak_fp8.value() <= 0 && diag.ok())
    diag.error("/training/precision", "\"fp8\"", "is not supported by device " + s.cluster.device.name + " (no FP8 peak in its preset)");
}

}  // namespace

namespace {

/// The software stack (framework and version, models/presets/software/*.json): the defaults it
/// gives the training and parallelism sections where the scenario says nothing. Each default
/// applied is recorded in s.software.applied.
void apply_software(const nlohmann::json& spec, nlohmann::json& par, nlohmann::json& training, Scenario& s,
                    Diagnostics& diag) {
  nlohmann::json merged;
  const std::string at = "/software";
  std::string preset;
  if (spec.is_string()) preset = spec.get<std::string>();
  else if (spec.is_object() && spec.contains("preset") && spec["preset"].is_string()) preset = spec["preset"].get<std::string>();
  if (!preset.empty()) {
    auto base = models::preset_json("software", preset);
    if (!base) {
      std::string msg = "is not a software stack preset";
      const auto names = models::preset_names("software");
      const auto near = closest_match(preset, names);
      if (!near.empty()) msg += "; did you mean \"" + near + "\"?";
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
      diag.error(spec.is_string() ? at : at + "/preset", "\"" + preset + "\"", msg + " Known: " + known);
      return;
    }
    Diagnostics pd("models/presets/software/" + preset + ".json");
    strip_sources(*base, "", pd);
    for (const auto& x : pd.list()) diag.error_in(x.file, x.pointer, x.value, x.constraint);
    merged = std::move(*base);
    if (spec.is_object()) {
      nlohmann::json patch = spec;
      patch.erase("preset");
      merged.merge_patch(patch);
    }
  } else if (spec.is_object()) {
    merged = spec;
  } else {
    diag.error(at, json_brief(spec), "must be a software stack preset name or an object");
    return;
  }
  ObjectReader r(merged, at, diag);
  auto& sw = s.software;
  sw.name = r.string({"name"}, preset.empty() ? "custom" : preset);
  sw.framework = r.string({"framework"}, "");
  sw.version = r.string({"version"}, "");
  sw.year = static_cast<int>(r.integer({"year"}, 0, 0, 3000));
  r.ignore({"description", "source", "_source"});
  auto set_default = [&](nlohmann::json& section, const char* key, const nlohmann::json& value) {
    if (!section.is_object() || section.contains(key)) return;
    section[key] = value;
    sw.applied.push_back(std::string(key) + "=" + value.dump());
  };
  if (auto v = r.opt_string({"attention_kernel"}, std::initializer_list<std::string_view>{"flash", "flash2", "unfused"}))
    set_default(training, "attention_kernel", *v);
  if (r.has({"dropout"})) set_default(training, "dropout", r.number({"dropout"}, 0.0, 0.0, 0.99));
  if (auto v = r.opt_string({"cross_entropy"}, std::initializer_list<std::string_view>{"fused", "pytorch", "compiled"}))
    set_default(training, "cross_entropy", *v);
  if (auto v = r.opt_string({"moe_router_probs"}, std::initializer_list<std::string_view>{"activation", "output"}))
    set_default(training, "moe_router_probs", *v);
  const bool sharding_given = par.is_object() && (par.contains("data_parallel_sharding_strategy") ||
                                                  par.contains("zero_stage") || par.contains("use_megatron_fsdp") ||
                                                  par.contains("fsdp") || par.contains("fully_shard"));
  if (r.boolean({"distributed_optimizer"}, false) && !sharding_given)
    set_default(par, "use_distributed_optimizer", true);
  auto flag = [&](const char* key) { return par.is_object() && par.contains(key) && par[key].is_boolean() && par[key].get<bool>(); };
  const bool sharded = flag("use_distributed_optimizer") || sharding_given;
  if (r.boolean({"overlap_dp"}, false) && sharded) {
    set_default(par, "overlap_grad_reduce", true);
    set_default(par, "overlap_param_gather", true);
  }
  if (r.boolean({"tp_comm_overlap"}, false) && par.is_object()) {
    long long tp = 1;
    for (const char* k : {"tp", "tensor_model_parallel_size"})
      if (par.contains(k) && par[k].is_number_integer()) tp = par[k].get<long long>();
    const bool sp_off = par.contains("sequence_parallel") && par["sequence_parallel"].is_boolean() &&
                        !par["sequence_parallel"].get<bool>();
    if (tp > 1 && !sp_off) {
      set_default(par, "sequence_parallel", true);
      set_default(par, "tp_comm_overlap", true);
    }
  }
  if (r.boolean({"grad_reduce_in_bf16"}, false)) set_default(par, "grad_reduce_in_bf16", true);
  sw.host_graphs = r.string({"host_dispatch"}, "eager", {"eager", "graphs"}) == "graphs";
  r.finish();
}

}  // namespace

Scenario load_scenario(const nlohmann::json& doc, const std::string& file, const std::string& base_dir) {
  Scenario s;
  s.file = file;
  s.document = doc;
  Diagnostics diag(file);
  ObjectReader root(doc, "", diag);
  if (!root.valid()) diag.throw_if_any();

  load_model_and_cluster(root, base_dir, s, diag);

  nlohmann::json par = doc.contains("parallelism") ? doc["parallelism"] : nlohmann::json::object();
  nlohmann::json training = doc.contains("training") ? doc["training"] : nlohmann::json::object();
  merge_megatron_args(par, training, s.model.num_layers > 0 ? &s.model : nullptr, diag);
  if (const auto* sw = root.get({"software"})) apply_software(*sw, par, training, s, diag);
  root.has({"parallelism"});
  if (root.has({"training"})) parse_training(training, "/training", s.training, diag);
  else diag.error("/training", "", "is required ({\"seq_length\", \"global_batch_size\", \"precision\"})");
  parse_parallelism(par, "/parallelism", s.plan, s.training, diag);

  if (const auto* moe = root.get({"moe"})) parse_moe(*moe, base_dir, s, diag);
  parse_simulation(root, s, diag);
  // A stack that replays captured graphs issues no kernel from the host, unless the scenario
  // sets host dispatch itself.
  if (s.software.host_graphs && !(doc.contains("simulation") && doc["simulation"].is_object() &&
                                  doc["simulation"].contains("host_dispatch"))) {
    s.simulation.launch_overhead = 0;
    s.software.applied.push_back("host dispatch: graphs (no host time per operator)");
  }
  s.seed = static_cast<std::uint64_t>(root.integer({"seed"}, 1, 0, INT64_MAX));
  parse_reliability(root.get({"reliability"}), s, diag);
  root.has({"search"});        // read by parse_search_space when searching
  root.has({"model_search"});  // read by parse_model_search (architecture search)
  for (const char* text : {"description", "name"})  // shown in reports: text, not any JSON
    if (doc.contains(text) && !doc[text].is_string())
      diag.error(std::string("/") + text, json_brief(doc[text]), "must be a string");
  root.ignore({"description", "name", "_comment", "_source"});
  root.finish();
  check_device_support(s, diag);
  if (s.plan.adaptive_pipe_overlap && (!s.model.is_moe() || s.plan.ep_size() <= 1))
    diag.error("/parallelism/adaptive_pipe_overlap", "true",
               "needs an MoE model with expert parallelism above 1: it overlaps the expert all-to-all");
  // FlashAttention-2: the device's measured FA2 efficiencies replace its best kernel's.
  if (s.training.flash2) {
    auto& d = s.cluster.device;
    if (d.attention_fa2_fwd_efficiency <= 0)
      diag.error("/training/attention_kernel", "\"flash2\"",
                 "needs the device's FlashAttention-2 efficiencies (attention_efficiency_fa2), which " + d.name +
                     " does not have");
    else {
      d.attention_fwd_efficiency = d.attention_fa2_fwd_efficiency;
      d.attention_bwd_efficiency = d.attention_fa2_bwd_efficiency;
      d.attention_flash2 = true;  // and FA2's measured shape fall-off, where the preset has it
    }
  }
  // Divisibility is checked whenever model and cluster were readable, so that every problem
  // is reported in one go.
  if (s.model.num_layers > 0 && s.cluster.devices > 0 && s.model.heads > 0)
    validate_plan(s.plan, s.training, s.model, s.cluster, diag);
  diag.throw_if_any();
  return s;
}

const char* dp_sharding_name(DpSharding s) {
  switch (s) {
    case DpSharding::None: return "no_shard";
    case DpSharding::Optimizer: return "optim";
    case DpSharding::OptimizerGradients: return "optim_grads";
    case DpSharding::Full: return "optim_grads_params";
  }
  return "no_shard";
}

void set_plan(Scenario& s, const Plan& p, const nlohmann::json& parallelism) {
  s.plan = p;
  s.document["parallelism"] = parallelism;
}

void set_fidelity(Scenario& s, Fidelity f) {
  s.simulation.fidelity = f;
  if (!s.document.contains("simulation")) s.document["simulation"] = nlohmann::json::object();
  if (s.document["simulation"].is_object()) s.document["simulation"]["fidelity"] = fidelity_name(f);
}

void set_devices(Scenario& s, int devices) {
  s.cluster.devices = devices;
  if (s.document.contains("cluster") && s.document["cluster"].is_object()) s.document["cluster"]["devices"] = devices;
}

void set_global_batch_size(Scenario& s, std::int64_t global_batch_size) {
  s.training.global_batch_size = global_batch_size;
  if (s.document.contains("training") && s.document["training"].is_object())
    s.document["training"]["global_batch_size"] = global_batch_size;
}

std::string canonical_override(const nlohmann::json& doc, const std::string& assignment) {
  for (const std::string section : {"parallelism", "search"}) {
    const std::string prefix = section + ".";
    if (assignment.rfind(prefix, 0) != 0 || !doc.contains(section) || !doc[section].is_object()) continue;
    const auto eq = assignment.find('=');
    if (eq == std::string::npos) return assignment;
    const std::string key = assignment.substr(prefix.size(), eq - prefix.size());
    const auto& sec = doc[section];
    for (auto [alias, full] : kParallelismAliases) {
      if (key == alias && !sec.contains(key) && sec.contains(full))
        return prefix + std::string(full) + assignment.substr(eq);
      if (key == full && !sec.contains(key) && sec.contains(alias))
        return prefix + std::string(alias) + assignment.substr(eq);
    }
  }
  return assignment;
}

Scenario load_scenario_file(const std::string& path, const std::vector<std::string>& overrides,
                            std::string_view override_label) {
  const std::string file = path == "-" ? "<stdin>" : path;
  Diagnostics diag(file);
  auto doc = read_json_file(path, diag);
  diag.throw_if_any();
  Diagnostics set_diag(file);
  std::vector<std::string> applied;
  for (const auto& o : overrides) {
    applied.push_back(canonical_override(*doc, o));
    apply_override(*doc, applied.back(), set_diag);
  }
  set_diag.throw_if_any();
  std::string base_dir;
  if (path != "-") base_dir = std::filesystem::path(path).parent_path().string();
  try {
    return load_scenario(*doc, file, base_dir);
  } catch (const ConfigError& e) {
    if (applied.empty()) throw;
    throw blame_overrides(e, file, applied, override_label);
  }
}

}  // namespace moesim::strategies
