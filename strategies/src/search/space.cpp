// The search space: the scenario's "search" section, axis by axis (absent axes take automatic
// values derived from the model and cluster), its checks, and the plans it enumerates.
#include "space.hpp"

#include <algorithm>
#include <sstream>

#include "moesim/strategies/plan/schedule.hpp"

namespace moesim::strategies {

double SearchSpace::size() const {
  double n = 1;
  for (std::size_t k : {tp.size(), pp.size(), vpp.size(), ep.size(), etp.size(), cp.size(), mbs.size(),
                        tp_extend_ep.size(), distributed_optimizer.size(), tp_comm_overlap.size(), overlap_dp.size(),
                        alltoall.size(), recompute.size(), schedule.size(), fb_overlap.size(),
                        shared_expert_overlap.size(), swap_activations.size(), swap_optimizer.size(),
                        adaptive_pipe_overlap.size()})
    n *= static_cast<double>(k);
  return n;
}

nlohmann::json SearchSpace::to_json() const {
  nlohmann::json j;
  j["tensor_model_parallel_size"] = tp;
  j["pipeline_model_parallel_size"] = pp;
  j["virtual_pipeline_model_parallel_size"] = vpp;
  j["expert_model_parallel_size"] = ep;
  j["expert_tensor_parallel_size"] = etp;
  j["context_parallel_size"] = cp;
  j["micro_batch_size"] = mbs;
  j["moe_tp_extend_ep"] = tp_extend_ep;
  j["use_distributed_optimizer"] = distributed_optimizer;
  j["tp_comm_overlap"] = tp_comm_overlap;
  j["overlap_dp"] = overlap_dp;
  j["moe_fb_overlap"] = fb_overlap;
  j["moe_shared_expert_overlap"] = shared_expert_overlap;
  j["adaptive_pipe_overlap"] = adaptive_pipe_overlap;
  if (swap_auto) {
    j["swap_activations"] = "auto";
    j["swap_optimizer"] = "auto";
  } else {
    j["swap_activations"] = swap_activations;
    j["swap_optimizer"] = swap_optimizer;
  }
  std::vector<std::string> a2a, rc;
  for (auto a : alltoall) a2a.push_back(alltoall_name(a));
  for (const auto& r : recompute) rc.push_back(r.name);
  j["moe_alltoall"] = a2a;
  j["recompute"] = rc;
  std::vector<std::string> sched;
  for (int k : schedule) sched.push_back(k < 0 ? "auto" : schedule_name(static_cast<ScheduleKind>(k)));
  j["pipeline_schedule"] = sched;
  j["objective"] = objective_name(objective);
  j["top_k"] = top_k;
  j["replay_k"] = replay_k;
  j["refine_k"] = refine_k;
  j["fidelity"] = fidelity_name(fidelity);
  return j;
}

namespace search_detail {

std::string module_names(std::uint32_t bits) { return models::recompute::module_names(bits); }

}  // namespace search_detail

namespace {

using search_detail::module_names;

std::vector<int> divisors_up_to(long long n, long long limit) {
  std::vector<int> d;
  for (long long i = 1; i <= std::min(n, limit); ++i)
    if (n % i == 0) d.push_back(static_cast<int>(i));
  return d;
}

std::optional<std::uint32_t> module_bit(const std::string& n) {
  const std::uint32_t b = models::recompute::module_bit(n);
  return b != 0 ? std::optional<std::uint32_t>(b) : std::nullopt;
}

/// The search section's reader: its axes are "auto" (or absent) for the automatic values, a
/// value, or a list of values.
struct SearchSection {
  ObjectReader& r;
  Diagnostics& diag;

  // A numeric axis: absent or "auto" -> automatic values, a value, or a list of values, each
  // kept when `ok` and otherwise reported as `what`; sorted, without repeats.
  template <class T, class Ok>
  [[nodiscard]] std::vector<T> number_axis(ObjectReader::Keys keys, std::vector<T> automatic, Ok&& ok,
                                           const std::string& what) const {
    const nlohmann::json* v = r.get(keys);
    if (v == nullptr || (v->is_string() && v->get<std::string>() == "auto")) return automatic;
    const std::string ptr = r.child_pointer(r.found_key(keys));
    std::vector<T> out;
    auto take = [&](const nlohmann::json& x, const std::string& p) {
      if (!ok(x)) diag.error(p, json_brief(x), what);
      else out.push_back(x.get<T>());
    };
    if (v->is_array()) {
      for (std::size_t i = 0; i < v->size(); ++i) take((*v)[i], ptr + "/" + std::to_string(i));
      if (v->empty()) diag.error(ptr, "[]", "must list at least one value (or be \"auto\")");
    } else {
      take(*v, ptr);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  [[nodiscard]] std::vector<int> int_axis(ObjectReader::Keys keys, std::vector<int> automatic, int lo, int hi) const {
    return number_axis<int>(
        keys, std::move(automatic),
        [&](const nlohmann::json& x) { return x.is_number_integer() && x.get<long long>() >= lo && x.get<long long>() <= hi; },
        "must be an integer between " + std::to_string(lo) + " and " + std::to_string(hi));
  }

  [[nodiscard]] std::vector<double> fraction_axis(ObjectReader::Keys keys, std::vector<double> automatic) const {
    return number_axis<double>(
        keys, std::move(automatic),
        [](const nlohmann::json& x) { return x.is_number() && x.get<double>() >= 0 && x.get<double>() <= 1; },
        "must be a fraction between 0 and 1");
  }

  [[nodiscard]] std::vector<bool> bool_axis(ObjectReader::Keys keys, std::vector<bool> automatic) const {
    const nlohmann::json* v = r.get(keys);
    if (v == nullptr || (v->is_string() && v->get<std::string>() == "auto")) return automatic;
    const std::string ptr = r.child_pointer(r.found_key(keys));
    std::vector<bool> out;
    auto take = [&](const nlohmann::json& x, const std::string& p) {
      if (!x.is_boolean()) {
        diag.error(p, json_brief(x), "must be true or false");
        return;
      }
      if (std::find(out.begin(), out.end(), x.get<bool>()) == out.end()) out.push_back(x.get<bool>());
    };
    if (v->is_array()) {
      for (std::size_t i = 0; i < v->size(); ++i) take((*v)[i], ptr + "/" + std::to_string(i));
      if (v->empty()) diag.error(ptr, "[]", "must list at least one value");
    } else {
      take(*v, ptr);
    }
    return out;
  }
};

/// The automatic values of the parallel axes.
struct AutoAxes {
  std::vector<int> tp, pp, ep, cp;
};

// Automatic values: powers of two up to a server for TP; divisors of the device count for
// PP (at most 64 and the layers); experts' divisors for EP.
AutoAxes automatic_axes(const Scenario& s) {
  const auto& m = s.model;
  const auto& c = s.cluster;
  AutoAxes a;
  for (int t = 1; t <= c.devices_per_node && t <= c.devices; t *= 2) a.tp.push_back(t);
  a.pp = divisors_up_to(c.devices, std::min(64, m.num_layers + 2));
  a.ep = {1};
  if (m.is_moe())
    for (int e = 2; e <= std::min(m.num_experts, 64); e *= 2)
      if (m.num_experts % e == 0) a.ep.push_back(e);
  a.cp = {1};
  if (s.training.seq_length >= 16384) a.cp = {1, 2, 4};
  return a;
}

/// The parallel sizes and the on/off axes.
void parse_parallel_axes(const SearchSection& sec, const Scenario& s, SearchSpace& sp) {
  const bool moe = s.model.is_moe();
  const AutoAxes a = automatic_axes(s);
  sp.tp = sec.int_axis({"tensor_model_parallel_size", "tp"}, a.tp, 1, 1 << 16);
  sp.pp = sec.int_axis({"pipeline_model_parallel_size", "pp"}, a.pp, 1, 1 << 16);
  sp.vpp = sec.int_axis({"virtual_pipeline_model_parallel_size", "vpp"}, {1, 2, 4}, 1, 1 << 10);
  sp.ep = sec.int_axis({"expert_model_parallel_size", "ep"}, a.ep, 1, 1 << 16);
  sp.etp = sec.int_axis({"expert_tensor_parallel_size", "etp"}, {1}, 1, 1 << 10);
  sp.cp = sec.int_axis({"context_parallel_size", "cp"}, a.cp, 1, 1 << 16);
  sp.mbs = sec.int_axis({"micro_batch_size", "mbs"}, {1, 2, 4}, 1, 1 << 16);
  sp.tp_extend_ep =
      sec.bool_axis({"moe_tp_extend_ep"}, moe ? std::vector<bool>{false, true} : std::vector<bool>{false});
  sp.distributed_optimizer = sec.bool_axis({"use_distributed_optimizer"}, {true});
  sp.tp_comm_overlap = sec.bool_axis({"tp_comm_overlap"}, {false, true});
  sp.overlap_dp = sec.bool_axis({"overlap_dp"}, {true});
  // Overlap of the expert all-to-all: both values where the model has something to overlap.
  sp.fb_overlap = sec.bool_axis({"moe_fb_overlap"}, moe ? std::vector<bool>{false, true} : std::vector<bool>{false});
  sp.shared_expert_overlap =
      sec.bool_axis({"moe_shared_expert_overlap"},
                    moe && s.model.num_shared_experts > 0 ? std::vector<bool>{false, true} : std::vector<bool>{false});
  sp.adaptive_pipe_overlap =
      sec.bool_axis({"adaptive_pipe_overlap"}, moe ? std::vector<bool>{false, true} : std::vector<bool>{false});
  // Swapping to host memory (MindSpeed's --swap-attention and --swap-optimizer): by default, on a
  // device with a host link, "auto" — a plan over memory gets the least swapping that fits
  // (activations in quarters, then the optimizer states), its host copies charged by the
  // screen and simulated; a plan that fits swaps nothing (swapping only costs time). Listed
  // values are enumerated instead (the other axis then keeps the scenario's setting), and a
  // scenario that swaps itself keeps its own setting.
  auto is_auto = [&](const char* key) {
    const nlohmann::json* v = sec.r.get({key});
    return v == nullptr || (v->is_string() && v->get<std::string>() == "auto");
  };
  sp.swap_auto = s.cluster.device.host_bandwidth.value() > 0 && is_auto("swap_activations") && is_auto("swap_optimizer") &&
                 s.plan.swap_activations == 0 && !s.plan.swap_optimizer;
  sp.swap_activations = sec.fraction_axis({"swap_activations"}, {sp.swap_auto ? 0.0 : s.plan.swap_activations});
  sp.swap_optimizer = sec.bool_axis({"swap_optimizer"}, {sp.swap_auto ? false : s.plan.swap_optimizer});
}

// All-to-all algorithm.
void parse_alltoall_axis(const SearchSection& sec, bool moe, SearchSpace& sp) {
  ObjectReader& r = sec.r;
  if (const auto* v = r.get({"moe_alltoall"}); v != nullptr && !(v->is_string() && v->get<std::string>() == "auto")) {
    const std::string ptr = r.child_pointer("moe_alltoall");
    std::vector<nlohmann::json> vals = v->is_array() ? v->get<std::vector<nlohmann::json>>() : std::vector<nlohmann::json>{*v};
    for (std::size_t i = 0; i < vals.size(); ++i) {
      const auto& x = vals[i];
      if (x == "flat") sp.alltoall.push_back(AllToAllAlgo::Flat);
      else if (x == "hierarchical") sp.alltoall.push_back(AllToAllAlgo::Hierarchical);
      else if (x == "allgather") sp.alltoall.push_back(AllToAllAlgo::AllGather);
      else
        sec.diag.error(v->is_array() ? ptr + "/" + std::to_string(i) : ptr, json_brief(x),
                       "must be \"flat\", \"hierarchical\" or \"allgather\"");
    }
  } else {
    sp.alltoall = moe ? std::vector<AllToAllAlgo>{AllToAllAlgo::Flat, AllToAllAlgo::Hierarchical}
                      : std::vector<AllToAllAlgo>{AllToAllAlgo::Flat};
  }
}

// Pipeline schedules: "auto" (absent) or a name or a list of names.
/// `must be "auto", "1f1b", ... or "dualpipe"`, from the registry.
std::string schedule_choices() {
  std::string out = "must be \"auto\"";
  const auto names = schedule_names();
  for (std::size_t i = 0; i < names.size(); ++i)
    out += std::string(i + 1 == names.size() ? " or " : ", ") + "\"" + std::string(names[i]) + "\"";
  return out;
}

void parse_schedule_axis(const SearchSection& sec, SearchSpace& sp) {
  ObjectReader& r = sec.r;
  // Absent: every schedule, each on the virtual-stage counts it runs on (torch's interleaved
  // order is Megatron's since 2024-11, so "auto" covers it).
  sp.schedule = {-1};
  for (ScheduleKind k : {ScheduleKind::ZeroBubbleH1, ScheduleKind::ZeroBubbleV, ScheduleKind::DualPipeV,
                         ScheduleKind::DualPipe})
    sp.schedule.push_back(static_cast<int>(k));
  if (const auto* v = r.get({"pipeline_schedule"}); v != nullptr && !(v->is_string() && v->get<std::string>() == "auto")) {
    const std::string ptr = r.child_pointer("pipeline_schedule");
    const std::vector<nlohmann::json> vals = v->is_array() ? v->get<std::vector<nlohmann::json>>() : std::vector<nlohmann::json>{*v};
    if (vals.empty()) sec.diag.error(ptr, "[]", "must list at least one schedule (or be \"auto\")");
    sp.schedule.clear();
    for (std::size_t i = 0; i < vals.size(); ++i) {
      int kind = -2;
      if (vals[i] == "auto") kind = -1;
      if (vals[i].is_string())
        if (const ScheduleTraits* t = find_schedule(vals[i].get<std::string>())) kind = static_cast<int>(t->kind);
      if (kind == -2)
        sec.diag.error(v->is_array() ? ptr + "/" + std::to_string(i) : ptr, json_brief(vals[i]), schedule_choices());
      else if (std::find(sp.schedule.begin(), sp.schedule.end(), kind) == sp.schedule.end())
        sp.schedule.push_back(kind);
    }
  }
}

// Recomputation: "none", "selective" (the scenario's modules, else Megatron's core_attn),
// "full", or a list of module names.
void parse_recompute_axis(const SearchSection& sec, const Scenario& s, SearchSpace& sp) {
  ObjectReader& r = sec.r;
  Diagnostics& diag = sec.diag;
  const std::uint32_t scenario_modules =
      s.plan.recompute == Recompute::Selective ? s.plan.recompute_modules : models::recompute::kCoreAttn;
  auto selective = [&](std::uint32_t bits) {
    return RecomputeChoice{Recompute::Selective, bits, "selective:" + module_names(bits)};
  };
  if (const auto* v = r.get({"recompute"}); v != nullptr && !(v->is_string() && v->get<std::string>() == "auto")) {
    const std::string ptr = r.child_pointer("recompute");
    std::vector<nlohmann::json> vals = v->is_array() ? v->get<std::vector<nlohmann::json>>() : std::vector<nlohmann::json>{*v};
    for (std::size_t i = 0; i < vals.size(); ++i) {
      const auto& x = vals[i];
      const std::string p = v->is_array() ? ptr + "/" + std::to_string(i) : ptr;
      if (x == "none") sp.recompute.push_back({Recompute::None, 0, "none"});
      else if (x == "full") sp.recompute.push_back({Recompute::Full, 0, "full"});
      else if (x == "selective") sp.recompute.push_back(selective(scenario_modules));
      else if (x.is_array()) {
        std::uint32_t bits = 0;
        for (const auto& n : x) {
          auto b = n.is_string() ? module_bit(n.get<std::string>()) : std::nullopt;
          if (!b) diag.error(p, json_brief(n), "is not a recompute module (core_attn, layernorm, mla_up_proj, moe_act, mlp, moe, shared_experts)");
          else bits |= *b;
        }
        if (bits != 0) sp.recompute.push_back(selective(bits));
      } else {
        diag.error(p, json_brief(x), "must be \"none\", \"selective\", \"full\" or a list of recompute modules");
      }
    }
  } else {
    sp.recompute = {{Recompute::None, 0, "none"}, selective(scenario_modules), {Recompute::Full, 0, "full"}};
  }
}

/// The objective (and the tokens to train for it), top_k, the fidelity and max_plans.
void parse_objective(const SearchSection& sec, SearchSpace& sp) {
  ObjectReader& r = sec.r;
  Diagnostics& diag = sec.diag;
  const std::string obj = r.string({"objective"}, "tokens_per_s", {"tokens_per_s", "mfu", "time_to_train", "cost"});
  sp.objective = obj == "mfu" ? Objective::Mfu
                 : obj == "time_to_train" ? Objective::TimeToTrain
                 : obj == "cost" ? Objective::Cost
                                 : Objective::TokensPerSecond;
  if (auto tokens = r.opt_number({"train_tokens"}, 1, 1e18)) sp.train_tokens = *tokens;
  if (const auto* t = r.get({"train_tokens"}); t != nullptr && t->is_string()) {
    // "10T", "1.5T", "500B" tokens.
    const std::string v = t->get<std::string>();
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    const std::string unit = end ? std::string(end) : "";
    const double mult = unit == "T" ? 1e12 : unit == "B" || unit == "G" ? 1e9 : unit == "M" ? 1e6 : unit.empty() ? 1.0 : 0.0;
    if (mult == 0 || !(x > 0)) diag.error(r.child_pointer("train_tokens"), json_brief(*t), "must be a token count like \"10T\" or \"500B\"");
    else sp.train_tokens = x * mult;
  }
  if ((sp.objective == Objective::TimeToTrain || sp.objective == Objective::Cost) && sp.train_tokens <= 0)
    diag.error(r.child_pointer("train_tokens"), "", std::string("is required for the ") + obj + " objective (e.g. \"10T\")");
  sp.top_k = static_cast<int>(r.integer({"top_k"}, 16, 1, 100000));
  sp.replay_k = static_cast<int>(r.integer({"replay_k"}, 4096, 0, 100000000));
  sp.refine_k = static_cast<int>(r.integer({"refine_k"}, 96, 0, 1000000));
  sp.fidelity = *parse_fidelity(r.string({"fidelity"}, "balanced", {"fast", "balanced", "full"}));
  sp.max_plans = r.number({"max_plans"}, 20e6, 1, 1e12);
}

// Axes that leave nothing on their own.
void check_axes_leave_plans(const Scenario& s, const SearchSpace& sp, Diagnostics& diag) {
  const auto& m = s.model;
  const auto& c = s.cluster;
  auto none_left = [&](const char* key, const std::vector<int>& vals, auto&& ok, const std::string& why) {
    for (int x : vals)
      if (ok(x)) return;
    std::string list;
    for (int x : vals) list += (list.empty() ? "" : ", ") + std::to_string(x);
    diag.error(std::string("/search/") + key, "[" + list + "]", "leaves no valid plan: " + why);
  };
  none_left("tensor_model_parallel_size", sp.tp,
            [&](int t) { return m.heads % t == 0 && c.devices % t == 0 && (m.num_dense_layers() == 0 || m.ffn_hidden % t == 0); },
            "each must divide num_attention_heads=" + std::to_string(m.heads) + " and the devices");
  none_left("pipeline_model_parallel_size", sp.pp, [&](int p) { return c.devices % p == 0 && p <= m.num_layers + 2; },
            "each must divide the " + std::to_string(c.devices) + " devices and not exceed the layers");
  if (m.is_moe()) {
    none_left("expert_model_parallel_size", sp.ep,
              [&](int e) {
                for (int t : sp.tp)
                  for (bool x : sp.tp_extend_ep)
                    if (m.num_experts % (x ? e * t : e) == 0) return true;
                return false;
              },
              "none gives an expert-parallel size that divides num_experts=" + std::to_string(m.num_experts));
  }
  none_left("micro_batch_size", sp.mbs, [&](int b) { return s.training.global_batch_size % b == 0; },
            "each must divide the global batch of " + std::to_string(s.training.global_batch_size));
  none_left("context_parallel_size", sp.cp, [&](int p) { return s.training.seq_length % (p > 1 ? 2 * p : 1) == 0; },
            "each must divide the sequence length (twice, for load-balanced context parallelism)");
}

/// A space of more than max_plans plans is refused, with the sizes of its axes.
void check_space_size(const SearchSpace& sp, Diagnostics& diag) {
  if (sp.size() > sp.max_plans) {
    std::ostringstream os;
    os << "has " << sp.size() << " plans (tp " << sp.tp.size() << " x pp " << sp.pp.size() << " x vpp " << sp.vpp.size()
       << " x ep " << sp.ep.size() << " x etp " << sp.etp.size() << " x cp " << sp.cp.size() << " x mbs " << sp.mbs.size()
       << " x recompute " << sp.recompute.size() << " x schedules " << sp.schedule.size() << " x flags " << sp.tp_extend_ep.size() * sp.tp_comm_overlap.size() *
                                                                        sp.alltoall.size() * sp.distributed_optimizer.size() *
                                                                        sp.overlap_dp.size() * sp.fb_overlap.size() *
                                                                        sp.shared_expert_overlap.size() *
                                                                        sp.adaptive_pipe_overlap.size() *
                                                                        sp.swap_activations.size() * sp.swap_optimizer.size()
       << "), more than max_plans=" << sp.max_plans
       << "; narrow the largest axes in the scenario's \"search\" section or with --set search.<axis>=[...]";
    diag.error("/search", "", os.str());
    diag.throw_if_any();
  }
}

}  // namespace

SearchSpace parse_search_space(const Scenario& s) {
  SearchSpace sp;
  Diagnostics diag(s.file);
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& sec = s.document.contains("search") ? s.document["search"] : empty;
  ObjectReader r(sec, "/search", diag);
  const SearchSection section{r, diag};
  parse_parallel_axes(section, s, sp);
  parse_alltoall_axis(section, s.model.is_moe(), sp);
  parse_schedule_axis(section, sp);
  parse_recompute_axis(section, s, sp);
  parse_objective(section, sp);
  r.finish();
  diag.throw_if_any();
  check_axes_leave_plans(s, sp, diag);
  diag.throw_if_any();
  check_space_size(sp, diag);
  return sp;
}

// ---- The plans of a space (a mixed-radix index over the axes) -----------------------------

namespace search_detail {

PlanEnumerator::PlanEnumerator(const Scenario& base, const SearchSpace& space)
    : base_(&base),
      space_(&space),
      radices_{space.tp.size(),  space.pp.size(),           space.vpp.size(),
               space.ep.size(),  space.tp_extend_ep.size(), space.etp.size(),
               space.cp.size(),  space.mbs.size(),          space.recompute.size(),
               space.distributed_optimizer.size(), space.alltoall.size(),
               space.tp_comm_overlap.size(), space.overlap_dp.size(),
               space.schedule.size(), space.fb_overlap.size(), space.shared_expert_overlap.size(),
               space.swap_activations.size(), space.swap_optimizer.size(), space.adaptive_pipe_overlap.size()},
      plain_etp1_(std::find(space.etp.begin(), space.etp.end(), 1) != space.etp.end() &&
                  std::find(space.tp_extend_ep.begin(), space.tp_extend_ep.end(), false) != space.tp_extend_ep.end()) {}

bool PlanEnumerator::has_plain_twin(int ep_size) const {
  return plain_etp1_ && std::find(space_->ep.begin(), space_->ep.end(), ep_size) != space_->ep.end();
}

bool PlanEnumerator::make_plan(std::size_t index, Plan& p, std::string& rc_name) const {
  const Scenario& base = *base_;
  const SearchSpace& space = *space_;
  std::array<std::size_t, 19> d{};
  for (std::size_t k = radices_.size(); k-- > 0;) {
    d[k] = index % radices_[k];
    index /= radices_[k];
  }
  p = base.plan;
  p.tp = space.tp[d[0]];
  p.pp = space.pp[d[1]];
  p.vpp = space.vpp[d[2]];
  p.ep = space.ep[d[3]];
  p.moe_tp_extend_ep = space.tp_extend_ep[d[4]];
  p.etp = p.moe_tp_extend_ep ? 0 : space.etp[d[5]];
  if (p.moe_tp_extend_ep && d[5] != 0) return false;  // ETP has no meaning with TP-extend-EP
  // TP-extend-EP with ep e is the layout of plain EP e x tp with ETP 1: keep one of the two.
  if (p.moe_tp_extend_ep && has_plain_twin(p.ep * p.tp)) return false;
  p.cp = space.cp[d[6]];
  p.mbs = space.mbs[d[7]];
  const RecomputeChoice& rc = space.recompute[d[8]];
  p.recompute = rc.granularity;
  p.recompute_modules = rc.modules;
  p.recompute_method = RecomputeMethod::Uniform;
  p.recompute_num_layers = 1;
  rc_name = rc.name;
  p.distributed_optimizer = space.distributed_optimizer[d[9]];
  // The sharding follows the axis: without the distributed optimizer nothing is sharded; with
  // it, the scenario's sharding (ZeRO-2/3, FSDP) or at least the optimizer states.
  if (!p.distributed_optimizer) p.dp_sharding = DpSharding::None;
  else if (p.dp_sharding == DpSharding::None) p.dp_sharding = DpSharding::Optimizer;
  if (p.dp_sharding != DpSharding::OptimizerGradients && p.dp_sharding != DpSharding::Full)
    p.grad_sync_every_microbatch = true;
  p.alltoall = space.alltoall[d[10]];
  p.tp_comm_overlap = space.tp_comm_overlap[d[11]];
  const bool ovl = space.overlap_dp[d[12]];
  p.overlap_grad_reduce = ovl;
  p.overlap_param_gather = ovl && p.distributed_optimizer;
  p.sequence_parallel = p.tp > 1;
  if (p.tp_comm_overlap && p.tp == 1) return false;  // nothing to overlap: same plan as without
  // The all-to-all algorithm only matters when the expert group spans servers.
  if (p.alltoall != AllToAllAlgo::Flat &&
      (!base.model.is_moe() || 1LL * p.ep_size() * p.etp_size() <= base.cluster.devices_per_node))
    return false;
  if (!base.model.is_moe() && (p.ep != 1 || p.moe_tp_extend_ep || p.alltoall != AllToAllAlgo::Flat)) return false;
  p.dp = 0;
  p.partition = "auto";
  p.layers_per_stage.clear();
  p.first_stage_layers = p.last_stage_layers = -1;
  if (!set_schedule(space.schedule[d[13]], p)) return false;
  p.fb_overlap = space.fb_overlap[d[14]];
  p.shared_expert_overlap = space.shared_expert_overlap[d[15]];
  p.swap_activations = space.swap_activations[d[16]];
  p.swap_optimizer = space.swap_optimizer[d[17]];
  // Adaptive Pipe Overlap is a hierarchical all-to-all with forward-backward overlap: "true"
  // only on plans that have both (the others would repeat a plan of the other axes).
  p.adaptive_pipe_overlap = space.adaptive_pipe_overlap[d[18]];
  if (p.adaptive_pipe_overlap && (p.alltoall != AllToAllAlgo::Hierarchical || !p.fb_overlap)) return false;
  // Nothing to overlap on one expert-parallel rank. Forward-backward overlap pairs a backward
  // with the next forward of another micro-batch, as 1F1B's steady state issues them:
  // DualPipe(V) already pairs them (the same plan), and the zero-bubble orders put a weight
  // pass after each backward, so they would hardly pair (the same plan in all but name).
  if ((p.fb_overlap || p.shared_expert_overlap) && p.ep_size() == 1) return false;
  if (p.fb_overlap && !schedule_traits(p.schedule).automatic) return false;
  // On one stage every schedule is 1F1B.
  if (p.pp == 1 && !schedule_traits(p.schedule).automatic) return false;
  return plan_is_valid(p, base.training, base.model, base.cluster);
}

bool PlanEnumerator::set_schedule(int sk, Plan& p) const {
  // A schedule runs on its own chunk counts: zb_h1 and dualpipe on vpp 1 (dualpipe then holds
  // two stages per device), zb_v and dualpipev on vpp 2; 1f1b on 1, interleaved on more.
  if (sk < 0) {
    p.schedule = automatic_schedule(p.vpp);
  } else {
    const ScheduleTraits& t = schedule_traits(static_cast<ScheduleKind>(sk));
    p.schedule = t.kind;
    if (t.chunks == 0 ? p.vpp < 2 : p.vpp != t.chunks) return false;
    if (t.plan_vpp > 0) p.vpp = t.plan_vpp;
    // "auto" already covers 1f1b and interleaved.
    if (t.automatic && std::find(space_->schedule.begin(), space_->schedule.end(), -1) != space_->schedule.end())
      return false;
  }
  return true;
}

}  // namespace search_detail

}  // namespace moesim::strategies
