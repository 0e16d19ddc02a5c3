#include "moesim/strategies/search/search.hpp"
#include "moesim/strategies/plan/schedule.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "moesim/sim/parallel.hpp"
#include "moesim/strategies/search/journal.hpp"
#include "moesim/topologies/topology.hpp"

namespace moesim::strategies {

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::TokensPerSecond: return "tokens_per_s";
    case Objective::Mfu: return "mfu";
    case Objective::TimeToTrain: return "time_to_train";
    case Objective::Cost: return "cost";
  }
  return "?";
}

double SearchSpace::size() const {
  double n = 1;
  for (std::size_t k : {tp.size(), pp.size(), vpp.size(), ep.size(), etp.size(), cp.size(), mbs.size(),
                        tp_extend_ep.size(), distributed_optimizer.size(), tp_comm_overlap.size(), overlap_dp.size(),
                        alltoall.size(), recompute.size(), schedule.size()})
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
  j["fidelity"] = fidelity_name(fidelity);
  return j;
}

namespace {

std::vector<int> divisors_up_to(long long n, long long limit) {
  std::vector<int> d;
  for (long long i = 1; i <= std::min(n, limit); ++i)
    if (n % i == 0) d.push_back(static_cast<int>(i));
  return d;
}

std::string module_names(std::uint32_t bits) {
  namespace rc = models::recompute;
  std::string s;
  auto add = [&](std::uint32_t b, const char* n) {
    if (bits & b) s += (s.empty() ? "" : "+") + std::string(n);
  };
  add(rc::kCoreAttn, "core_attn");
  add(rc::kNorm, "layernorm");
  add(rc::kMlaUp, "mla_up_proj");
  add(rc::kActivation, "moe_act");
  add(rc::kMlp, "mlp");
  add(rc::kMoe, "moe");
  add(rc::kShared, "shared_experts");
  return s;
}

std::optional<std::uint32_t> module_bit(const std::string& n) {
  namespace rc = models::recompute;
  if (n == "core_attn") return rc::kCoreAttn;
  if (n == "layernorm") return rc::kNorm;
  if (n == "mla_up_proj") return rc::kMlaUp;
  if (n == "moe_act" || n == "activation") return rc::kActivation;
  if (n == "mlp") return rc::kMlp;
  if (n == "moe") return rc::kMoe;
  if (n == "shared_experts") return rc::kShared;
  return std::nullopt;
}

}  // namespace

SearchSpace parse_search_space(const Scenario& s) {
  SearchSpace sp;
  Diagnostics diag(s.file);
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& sec = s.document.contains("search") ? s.document["search"] : empty;
  ObjectReader r(sec, "/search", diag);
  const auto& m = s.model;
  const auto& c = s.cluster;
  const bool moe = m.is_moe();

  // An integer axis: "auto" (or absent) -> automatic values, an integer, or a list.
  auto int_axis = [&](ObjectReader::Keys keys, std::vector<int> automatic, int lo, int hi) {
    const nlohmann::json* v = r.get(keys);
    if (v == nullptr || (v->is_string() && v->get<std::string>() == "auto")) return automatic;
    const std::string ptr = r.child_pointer(r.found_key(keys));
    std::vector<int> out;
    auto take = [&](const nlohmann::json& x, const std::string& p) {
      if (!x.is_number_integer() || x.get<long long>() < lo || x.get<long long>() > hi) {
        diag.error(p, json_brief(x), "must be an integer between " + std::to_string(lo) + " and " + std::to_string(hi));
        return;
      }
      out.push_back(x.get<int>());
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
  };
  auto bool_axis = [&](ObjectReader::Keys keys, std::vector<bool> automatic) {
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
  };

  // Automatic values: powers of two up to a server for TP; divisors of the device count for
  // PP (at most 64 and the layers); experts' divisors for EP.
  std::vector<int> tp_auto;
  for (int t = 1; t <= c.devices_per_node && t <= c.devices; t *= 2) tp_auto.push_back(t);
  const std::vector<int> pp_auto = divisors_up_to(c.devices, std::min(64, m.num_layers + 2));
  std::vector<int> ep_auto{1};
  if (moe)
    for (int e = 2; e <= std::min(m.num_experts, 64); e *= 2)
      if (m.num_experts % e == 0) ep_auto.push_back(e);
  std::vector<int> cp_auto{1};
  if (s.training.seq_length >= 16384) cp_auto = {1, 2, 4};

  sp.tp = int_axis({"tensor_model_parallel_size", "tp"}, tp_auto, 1, 1 << 16);
  sp.pp = int_axis({"pipeline_model_parallel_size", "pp"}, pp_auto, 1, 1 << 16);
  sp.vpp = int_axis({"virtual_pipeline_model_parallel_size", "vpp"}, {1, 2, 4}, 1, 1 << 10);
  sp.ep = int_axis({"expert_model_parallel_size", "ep"}, ep_auto, 1, 1 << 16);
  sp.etp = int_axis({"expert_tensor_parallel_size", "etp"}, {1}, 1, 1 << 10);
  sp.cp = int_axis({"context_parallel_size", "cp"}, cp_auto, 1, 1 << 16);
  sp.mbs = int_axis({"micro_batch_size", "mbs"}, {1, 2, 4}, 1, 1 << 16);
  sp.tp_extend_ep = bool_axis({"moe_tp_extend_ep"}, moe ? std::vector<bool>{false, true} : std::vector<bool>{false});
  sp.distributed_optimizer = bool_axis({"use_distributed_optimizer"}, {true});
  sp.tp_comm_overlap = bool_axis({"tp_comm_overlap"}, {false, true});
  sp.overlap_dp = bool_axis({"overlap_dp"}, {true});
  // All-to-all algorithm.
  if (const auto* v = r.get({"moe_alltoall"}); v != nullptr && !(v->is_string() && v->get<std::string>() == "auto")) {
    const std::string ptr = r.child_pointer("moe_alltoall");
    std::vector<nlohmann::json> vals = v->is_array() ? v->get<std::vector<nlohmann::json>>() : std::vector<nlohmann::json>{*v};
    for (std::size_t i = 0; i < vals.size(); ++i) {
      const auto& x = vals[i];
      if (x == "flat") sp.alltoall.push_back(AllToAllAlgo::Flat);
      else if (x == "hierarchical") sp.alltoall.push_back(AllToAllAlgo::Hierarchical);
      else if (x == "allgather") sp.alltoall.push_back(AllToAllAlgo::AllGather);
      else
        diag.error(v->is_array() ? ptr + "/" + std::to_string(i) : ptr, json_brief(x),
                   "must be \"flat\", \"hierarchical\" or \"allgather\"");
    }
  } else {
    sp.alltoall = moe ? std::vector<AllToAllAlgo>{AllToAllAlgo::Flat, AllToAllAlgo::Hierarchical}
                      : std::vector<AllToAllAlgo>{AllToAllAlgo::Flat};
  }
  // Pipeline schedules: "auto" (absent) or a name or a list of names.
  if (const auto* v = r.get({"pipeline_schedule"}); v != nullptr && !(v->is_string() && v->get<std::string>() == "auto")) {
    const std::string ptr = r.child_pointer("pipeline_schedule");
    const std::vector<nlohmann::json> vals = v->is_array() ? v->get<std::vector<nlohmann::json>>() : std::vector<nlohmann::json>{*v};
    if (vals.empty()) diag.error(ptr, "[]", "must list at least one schedule (or be \"auto\")");
    sp.schedule.clear();
    for (std::size_t i = 0; i < vals.size(); ++i) {
      int kind = -2;
      if (vals[i] == "auto") kind = -1;
      for (int k = 0; k <= static_cast<int>(ScheduleKind::DualPipe); ++k)
        if (vals[i] == schedule_name(static_cast<ScheduleKind>(k))) kind = k;
      if (kind == -2)
        diag.error(v->is_array() ? ptr + "/" + std::to_string(i) : ptr, json_brief(vals[i]),
                   "must be \"auto\", \"1f1b\", \"interleaved_1f1b\", \"zb_h1\", \"zb_v\", \"dualpipev\" or \"dualpipe\"");
      else if (std::find(sp.schedule.begin(), sp.schedule.end(), kind) == sp.schedule.end())
        sp.schedule.push_back(kind);
    }
  }
  // Recomputation: "none", "selective" (the scenario's modules, else Megatron's core_attn),
  // "full", or a list of module names.
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
  sp.top_k = static_cast<int>(r.integer({"top_k"}, 32, 1, 100000));
  sp.fidelity = *parse_fidelity(r.string({"fidelity"}, "balanced", {"fast", "balanced", "full"}));
  sp.max_plans = r.number({"max_plans"}, 20e6, 1, 1e12);
  r.finish();
  diag.throw_if_any();

  // Axes that leave nothing on their own.
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
  if (moe) {
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
  diag.throw_if_any();
  if (sp.size() > sp.max_plans) {
    std::ostringstream os;
    os << "has " << sp.size() << " plans (tp " << sp.tp.size() << " x pp " << sp.pp.size() << " x vpp " << sp.vpp.size()
       << " x ep " << sp.ep.size() << " x etp " << sp.etp.size() << " x cp " << sp.cp.size() << " x mbs " << sp.mbs.size()
       << " x recompute " << sp.recompute.size() << " x schedules " << sp.schedule.size() << " x flags " << sp.tp_extend_ep.size() * sp.tp_comm_overlap.size() *
                                                                        sp.alltoall.size() * sp.distributed_optimizer.size() *
                                                                        sp.overlap_dp.size()
       << "), more than max_plans=" << sp.max_plans
       << "; narrow the largest axes in the scenario's \"search\" section or with --set search.<axis>=[...]";
    diag.error("/search", "", os.str());
    diag.throw_if_any();
  }
  return sp;
}

std::string plan_key(const Plan& p, const std::string& recompute_name) {
  std::ostringstream os;
  os << "tp" << p.tp << "-pp" << p.pp << "-vpp" << p.vpp << "-ep" << p.ep << (p.moe_tp_extend_ep ? "x" : "") << "-etp"
     << (p.etp > 0 ? p.etp : 0) << "-cp" << p.cp << "-mbs" << p.mbs << "-" << recompute_name
     << (p.distributed_optimizer ? "-dopt" : "") << (p.alltoall == AllToAllAlgo::Hierarchical ? "-ha2a" : p.alltoall == AllToAllAlgo::AllGather ? "-aga2a" : "")
     << (p.tp_comm_overlap ? "-tpov" : "") << (p.overlap_grad_reduce ? "-dpov" : "");
  if (p.schedule != ScheduleKind::OneFOneB && p.schedule != ScheduleKind::Interleaved) os << "-" << schedule_name(p.schedule);
  return os.str();
}

nlohmann::json plan_to_json(const Plan& p, const models::ModelSpec& m) {
  nlohmann::json j;
  j["tensor_model_parallel_size"] = p.tp;
  j["pipeline_model_parallel_size"] = p.pp;
  if (p.vpp > 1 && !bidirectional(p.schedule)) j["virtual_pipeline_model_parallel_size"] = p.vpp;
  if (p.schedule != ScheduleKind::OneFOneB && p.schedule != ScheduleKind::Interleaved)
    j["pipeline_schedule"] = schedule_name(p.schedule);
  if (m.is_moe()) {
    j["expert_model_parallel_size"] = p.ep;
    if (p.moe_tp_extend_ep) j["moe_tp_extend_ep"] = true;
    else j["expert_tensor_parallel_size"] = p.etp > 0 ? p.etp : p.tp;
    if (p.alltoall != AllToAllAlgo::Flat) j["moe_alltoall"] = alltoall_name(p.alltoall);
  }
  if (p.cp > 1) j["context_parallel_size"] = p.cp;
  j["micro_batch_size"] = p.mbs;
  j["sequence_parallel"] = p.sequence_parallel;
  j["use_distributed_optimizer"] = p.distributed_optimizer;
  if (p.overlap_grad_reduce) j["overlap_grad_reduce"] = true;
  if (p.overlap_param_gather) j["overlap_param_gather"] = true;
  if (p.tp_comm_overlap) j["tp_comm_overlap"] = true;
  switch (p.recompute) {
    case Recompute::None: break;
    case Recompute::Full:
      j["recompute_granularity"] = "full";
      j["recompute_method"] = "uniform";
      j["recompute_num_layers"] = 1;
      break;
    case Recompute::Selective: {
      j["recompute_granularity"] = "selective";
      nlohmann::json mods = nlohmann::json::array();
      std::istringstream in(module_names(p.recompute_modules));
      for (std::string n; std::getline(in, n, '+');) mods.push_back(n);
      j["recompute_modules"] = mods;
      break;
    }
  }
  return j;
}

namespace {

constexpr double kSecondsPerHour = 3600.0;

double objective_value(Objective o, double tokens_per_s, double mfu, double devices, double train_tokens) {
  switch (o) {
    case Objective::TokensPerSecond: return tokens_per_s;
    case Objective::Mfu: return mfu;
    case Objective::TimeToTrain: return -(train_tokens / tokens_per_s);                  // seconds, negated
    case Objective::Cost: return -(devices * train_tokens / tokens_per_s / kSecondsPerHour);  // device-hours, negated
  }
  return tokens_per_s;
}

struct Candidate {
  std::size_t index = 0;
  Plan plan;
  std::string recompute_name;
  PlanEstimate est;
  double score = 0;
  std::string key;
};

bool better(double a, const std::string& ka, double b, const std::string& kb) {
  if (a != b) return a > b;
  return ka < kb;
}

std::string bottleneck_of(const Breakdown& b) {
  std::pair<double, const char*> parts[] = {{b.tp_comm, "tp_comm"},   {b.cp_comm, "cp_comm"}, {b.ep_comm, "ep_comm"},
                                            {b.pp_comm, "pp_comm"},   {b.dp_comm, "dp_comm"}, {b.bubble, "bubble"},
                                            {b.imbalance_wait, "imbalance"}, {b.swap, "swap"},
                                            {b.host_bound, "host_bound"}};
  const char* name = "compute";
  double worst = 0.15 * b.total();  // anything below 15% of the step is not "the" bottleneck
  for (auto [v, n] : parts)
    if (v > worst) {
      worst = v;
      name = n;
    }
  return name;
}

nlohmann::json result_json(const RankedPlan& r) {
  return {{"feasible", r.feasible},
          {"infeasible_reason", r.infeasible_reason},
          {"step_time_s", r.step_time_s},
          {"tokens_per_s", r.tokens_per_s},
          {"mfu", r.mfu},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"headroom_bytes", r.headroom_bytes},
          {"bottleneck", r.bottleneck},
          {"breakdown_s", to_json(r.breakdown)}};
}

}  // namespace

SearchReport search(const Scenario& base, const SearchSpace& space, const SearchOptions& opt) {
  SearchReport rep;
  rep.objective = space.objective;
  rep.space_size = space.size();
  const int threads = opt.threads > 0 ? opt.threads : hardware_threads();
  rep.threads = threads;
  const int top_k = opt.top_k > 0 ? opt.top_k : space.top_k;
  const models::Workload w = models::build_workload(base.model, base.training.seq_length, base.training.workload);
  const topologies::Topology topo = topologies::build_topology(base.cluster);
  const double devices = base.cluster.devices;
  const auto t0 = std::chrono::steady_clock::now();

  // ---- enumerate and screen (mixed-radix index over the axes) --------------------------------
  const std::size_t total = static_cast<std::size_t>(space.size());
  const std::vector<std::size_t> radices{space.tp.size(),  space.pp.size(),           space.vpp.size(),
                                         space.ep.size(),  space.tp_extend_ep.size(), space.etp.size(),
                                         space.cp.size(),  space.mbs.size(),          space.recompute.size(),
                                         space.distributed_optimizer.size(), space.alltoall.size(),
                                         space.tp_comm_overlap.size(), space.overlap_dp.size(),
                                         space.schedule.size()};
  const bool plain_etp1 = std::find(space.etp.begin(), space.etp.end(), 1) != space.etp.end() &&
                          std::find(space.tp_extend_ep.begin(), space.tp_extend_ep.end(), false) != space.tp_extend_ep.end();
  auto has_plain_twin = [&](int ep_size) {
    return plain_etp1 && std::find(space.ep.begin(), space.ep.end(), ep_size) != space.ep.end();
  };
  auto make_plan = [&](std::size_t index, Plan& p, std::string& rc_name) {
    std::array<std::size_t, 14> d{};
    for (std::size_t k = radices.size(); k-- > 0;) {
      d[k] = index % radices[k];
      index /= radices[k];
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
    // A schedule runs on its own chunk counts: zb_h1 and dualpipe on vpp 1 (dualpipe then holds
    // two stages per device), zb_v and dualpipev on vpp 2; 1f1b on 1, interleaved on more.
    const int sk = space.schedule[d[13]];
    if (sk < 0) {
      p.schedule = p.vpp > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
    } else {
      p.schedule = static_cast<ScheduleKind>(sk);
      switch (p.schedule) {
        case ScheduleKind::OneFOneB:
        case ScheduleKind::ZeroBubbleH1:
          if (p.vpp != 1) return false;
          break;
        case ScheduleKind::Interleaved:
          if (p.vpp < 2) return false;
          break;
        case ScheduleKind::ZeroBubbleV:
        case ScheduleKind::DualPipeV:
          if (p.vpp != 2) return false;
          break;
        case ScheduleKind::DualPipe:
          if (p.vpp != 1) return false;
          p.vpp = 2;
          break;
      }
      // "auto" already covers 1f1b and interleaved.
      if (std::find(space.schedule.begin(), space.schedule.end(), -1) != space.schedule.end() &&
          (p.schedule == ScheduleKind::OneFOneB || p.schedule == ScheduleKind::Interleaved))
        return false;
    }
    return plan_is_valid(p, base.training, base.model, base.cluster);
  };

  // Screening: every worker keeps its own estimator (caches) and candidate list; the list is
  // sorted afterwards, so the hand-out order does not matter.
  std::vector<std::vector<Candidate>> per_worker(threads);
  std::vector<std::size_t> valid_count(threads, 0);
  std::vector<std::unique_ptr<Estimator>> estimators(threads);
  ParallelOptions screen_opt{.threads = threads, .grain = 256, .cancel = opt.cancel, .tick = {}, .tick_ms = 100};
  if (opt.progress) screen_opt.tick = [&](std::size_t done) { opt.progress("screening", done, total); };
  parallel_for(total, screen_opt, [&](int worker, std::size_t i) {
    Candidate c;
    if (!make_plan(i, c.plan, c.recompute_name)) return;
    ++valid_count[worker];
    if (!estimators[worker]) estimators[worker] = std::make_unique<Estimator>(base, topo, w);
    c.index = i;
    c.est = estimators[worker]->estimate(c.plan);
    if (c.est.fits && c.est.step_s > 0) {
      c.score = objective_value(space.objective, c.est.tokens_per_s, c.est.mfu, devices, space.train_tokens);
      per_worker[worker].push_back(std::move(c));
    }
  });
  std::vector<Candidate> cands;
  for (int t = 0; t < threads; ++t) {
    rep.valid += valid_count[t];
    for (auto& c : per_worker[t]) cands.push_back(std::move(c));
  }
  // Plans the estimate deems over memory were dropped; count the fits for the report.
  rep.screened = rep.valid;
  rep.screened_fit = cands.size();
  for (auto& c : cands) c.key = plan_key(c.plan, c.recompute_name);
  std::sort(cands.begin(), cands.end(),
            [](const Candidate& a, const Candidate& b) { return better(a.score, a.key, b.score, b.key); });
  rep.screening_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // ---- the results file: earlier results (--resume), new ones as they arrive -----------------
  JournalChecks checks;
  checks.tokens_per_step = base.training.tokens_per_step();
  checks.model_flops_per_token = w.model_flops_per_token;
  checks.devices = devices;
  checks.peak_flops_per_device = base.cluster.device.mfu_peak(base.training.precision).value();
  SearchJournal journal(opt.out_file, opt.resume, search_fingerprint(base, space.fidelity), checks, base.input_files());

  // ---- event-simulate the best candidates until K feasible ----------------------------------
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<RankedPlan> results;
  std::size_t next = 0;
  int feasible = 0;
  while (feasible < top_k && next < cands.size()) {
    // The next wave: as many candidates as feasible results are still missing (not the
    // thread count), so the simulated set does not depend on the threads.
    const std::size_t wave = std::min<std::size_t>(static_cast<std::size_t>(top_k - feasible), cands.size() - next);
    std::vector<RankedPlan> batch(wave);
    ParallelOptions sim_opt{.threads = threads, .grain = 1, .cancel = opt.cancel, .tick = {}, .tick_ms = 100};
    parallel_for(wave, sim_opt, [&](int, std::size_t i) {
      const Candidate& c = cands[next + i];
      RankedPlan& r = batch[i];
      r.key = c.key;
      r.plan = c.plan;
      r.plan_json = plan_to_json(c.plan, base.model);
      r.estimate = c.est;
      if (const JournalEntry* prev = journal.find(c.key)) {
        // The key names the plan; a line whose plan is not the one its key names in this
        // search was not written by it.
        if (prev->plan != r.plan_json)
          throw ConfigError({Diagnostic{journal.source() + ":" + std::to_string(prev->line), "/plan", json_brief(prev->plan),
                                        "is not the plan its key " + c.key + " names in this search (expected " +
                                            json_brief(r.plan_json) + "); remove the line (or the file) and resume"}});
        const auto& res = prev->result;
        r.feasible = res["feasible"].get<bool>();
        r.infeasible_reason = res["infeasible_reason"].get<std::string>();
        r.step_time_s = res["step_time_s"].get<double>();
        r.tokens_per_s = res["tokens_per_s"].get<double>();
        r.mfu = res["mfu"].get<double>();
        r.peak_memory_bytes = res["peak_memory_bytes"].get<double>();
        r.headroom_bytes = res["headroom_bytes"].get<double>();
        r.bottleneck = res["bottleneck"].get<std::string>();
        r.breakdown = breakdown_from_json(res["breakdown_s"]);
        r.simulated = true;
        r.resumed = true;
      } else {
        Scenario sc = base;
        sc.plan = c.plan;
        sc.simulation.fidelity = space.fidelity;
        sc.document["parallelism"] = r.plan_json;
        const Simulation sim = simulate(sc, opt.cancel);
        const Result& res = sim.result;
        r.feasible = res.feasible;
        r.infeasible_reason = res.infeasible_reason;
        r.step_time_s = res.step_time_s;
        r.tokens_per_s = res.tokens_per_s;
        r.mfu = res.mfu;
        r.peak_memory_bytes = res.peak_memory_bytes;
        r.headroom_bytes = res.capacity_bytes - res.peak_memory_bytes;
        r.breakdown = res.breakdown;
        r.bottleneck = bottleneck_of(res.breakdown);
        r.simulated = true;
        journal.append(r.key, r.plan_json, result_json(r));
      }
      r.objective = objective_value(space.objective, r.tokens_per_s, r.mfu, devices, space.train_tokens);
    });
    for (auto& r : batch) {
      if (r.resumed) ++rep.resumed;
      else ++rep.simulated;
      if (r.feasible) ++feasible;
      results.push_back(std::move(r));
    }
    next += wave;
    if (opt.progress) opt.progress("simulating", std::min<std::size_t>(feasible, top_k), top_k);
  }
  journal.finish();
  rep.simulation_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();

  for (auto& r : results) (r.feasible ? rep.ranked : rep.infeasible).push_back(r);
  std::sort(rep.ranked.begin(), rep.ranked.end(),
            [](const RankedPlan& a, const RankedPlan& b) { return better(a.objective, a.key, b.objective, b.key); });
  // Pareto set: no other plan is at least as fast with at least as much headroom.
  for (const auto& r : rep.ranked) {
    bool dominated = false;
    for (const auto& o : rep.ranked)
      if (&o != &r && o.tokens_per_s >= r.tokens_per_s && o.headroom_bytes >= r.headroom_bytes &&
          (o.tokens_per_s > r.tokens_per_s || o.headroom_bytes > r.headroom_bytes)) {
        dominated = true;
        break;
      }
    if (!dominated) rep.pareto.push_back(r);
  }
  return rep;
}

nlohmann::json to_json(const SearchReport& r, int top) {
  nlohmann::json j;
  j["space_size"] = r.space_size;
  j["valid_plans"] = r.valid;
  j["fit_in_memory_estimate"] = r.screened_fit;
  j["simulated"] = r.simulated;
  j["resumed"] = r.resumed;
  j["objective"] = objective_name(r.objective);
  auto entry = [](const RankedPlan& p, int rank) {
    nlohmann::json e = result_json(p);
    e["rank"] = rank;
    e["key"] = p.key;
    e["plan"] = p.plan_json;
    e["estimate"] = {{"step_time_s", p.estimate.step_s},
                     {"tokens_per_s", p.estimate.tokens_per_s},
                     {"peak_memory_bytes", p.estimate.peak_memory_bytes},
                     {"bottleneck", p.estimate.bottleneck}};
    return e;
  };
  nlohmann::json ranked = nlohmann::json::array(), pareto = nlohmann::json::array();
  for (std::size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i) ranked.push_back(entry(r.ranked[i], static_cast<int>(i) + 1));
  for (const auto& p : r.pareto) pareto.push_back(entry(p, 0));
  j["ranked"] = ranked;
  j["pareto"] = pareto;
  nlohmann::json inf = nlohmann::json::array();
  for (const auto& p : r.infeasible) inf.push_back({{"key", p.key}, {"reason", p.infeasible_reason}});
  j["simulated_infeasible"] = inf;
  return j;
}

std::string to_csv(const SearchReport& r, int top) {
  std::ostringstream os;
  os << "rank,key,tokens_per_s,mfu,step_time_s,peak_memory_gib,headroom_gib,bottleneck,estimated_step_time_s\n";
  for (std::size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i) {
    const auto& p = r.ranked[i];
    os << i + 1 << "," << p.key << "," << p.tokens_per_s << "," << p.mfu << "," << p.step_time_s << ","
       << p.peak_memory_bytes / (1 << 30) << "," << p.headroom_bytes / (1 << 30) << "," << p.bottleneck << ","
       << p.estimate.step_s << "\n";
  }
  return os.str();
}

}  // namespace moesim::strategies
