// The search screen. A plan's layers are built by the lowering's LayerBuilder and timed alone
// (streams in order), stages are summed, the pipeline is the slowest stage times the
// micro-batches plus the schedule's fill and drain (schedule registry), the data-parallel
// traffic is exposed beyond the backward (or forward) it overlaps, and memory comes from the
// one stage memory model with the registry's closed-form in-flight count.

#include "moesim/strategies/search/screen.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <compare>
#include <map>

#include "lower/layer.hpp"
#include "lower/network.hpp"
#include "lower/partition.hpp"
#include "lower/program.hpp"
#include "moesim/strategies/lower/memory.hpp"
#include "replay.hpp"

namespace moesim::strategies {

using lowering::GroupKind;
using lowering::ItemProgram;
using lowering::LayerBuilder;
using lowering::LayerSpec;
using lowering::Layout;
using lowering::StageNetwork;
using lowering::Step;
using topologies::Collective;

namespace {

/// Everything a pipeline item's programs depend on: the plan's LayerSpec (all a LayerBuilder
/// may read of the plan) and the item's own program and recomputation. Derived, not listed.
struct ItemKey {
  LayerSpec spec;
  int program = 0;
  models::ItemKind kind = models::ItemKind::Decoder;
  bool moe = false;
  bool full_recompute = false;
  int uniform_group = 1;
  auto operator<=>(const ItemKey&) const = default;
};

/// One item's programs timed alone.
struct ItemCost {
  double fwd_s = 0, bwd_s = 0;            ///< the layer's programs timed alone
  double fwd_compute_s = 0, bwd_compute_s = 0;
  double wgrad_s = 0;                     ///< weight-gradient GEMMs of the backward
  /// The backward and the forward issued together as one forward-backward pair (co_schedule,
  /// as the emitter issues them), with and without DualPipeV's balancing.
  double pair_s = 0, pair_balanced_s = 0;
  std::array<double, kNumCats> comm_s{};  ///< communication durations by category (fwd + bwd)
  double act_bytes = 0, transient = 0, params_dense = 0, params_expert = 0;
};

/// Per stage, one micro-batch through all its chunks.
struct StageSums {
  /// Per (stage * vpp + chunk): forward, whole backward, its weight gradients, F&B pair,
  /// dense and expert parameters, items, saved activations (one micro-batch), weights copied in
  /// from host memory for one pass (offload_weights).
  std::vector<double> cf, cb, cw, cpair, cpd, cpe, citems, cact, ccopy;
  std::vector<double> F, B, pair, compute, wgrad, act_chunk_max, act_sum, transient, params_dense, params_expert, item_params_max;
  double compute_total = 0, comm_total = 0;  ///< stage 0, per micro-batch
  std::array<double, kNumCats> comm_cat{};   ///< stage 0, per micro-batch
  StageSums(int pp, int vpp)
      : cf(static_cast<std::size_t>(pp) * vpp, 0.0),
        cb(cf),
        cw(cf),
        cpair(cf),
        cpd(cf),
        cpe(cf),
        citems(cf),
        cact(cf),
        ccopy(cf),
        F(pp, 0.0), B(pp, 0.0), pair(pp, 0.0), compute(pp, 0.0), wgrad(pp, 0.0), act_chunk_max(pp, 0.0), act_sum(pp, 0.0),
        transient(pp, 0.0), params_dense(pp, 0.0), params_expert(pp, 0.0), item_params_max(pp, 0.0) {}
};

}  // namespace

struct EstimatorCache {
  explicit EstimatorCache(const Scenario& s, const models::Workload& w)
      : cm(s.cluster.device),
        ctx{s.model, w, cm, s.training.precision, s.training.seq_length, s.training.documents.packed,
            s.routing.dispatch_syncs_host()},
        labels(category_names()) {}
  models::ComputeModel cm;
  lowering::LayerContext ctx;
  sim::TaskGraphBuilder labels;  ///< step labels (unused by the screen, interned by the builder)
  topologies::AnalyticalCollectives network;
  ShapeCache shapes;
  std::map<ItemKey, ItemCost> items;
};

namespace {

/// One plan's estimate: the stages of the screen in order.
class Screen {
 public:
  Screen(const Scenario& s, const Plan& p, const topologies::Topology& topo, const models::Workload& w,
         EstimatorCache& cache)
      : s_(s),
        p_(p),
        topo_(topo),
        w_(w),
        cache_(cache),
        lay_(Layout::of(p, s.model.is_moe())),
        spec_(LayerSpec::of(p, lay_)),
        net_(topo, lay_, cache.network, &cache.shapes, p.alltoall, s.model.top_k),
        layers_(cache.ctx, spec_, net_, cache.labels) {
    net_.set_stage(0);
    group_ = p.recompute_method == RecomputeMethod::Uniform ? std::max(1, p.recompute_num_layers) : 1;
  }
  PlanEstimate run(bool replay, bool least_swap);
  search_detail::ReplayResult replayed(const StageSums& ss, double p2p, const std::vector<double>& forward_ready) const;

 private:
  const ItemCost& cost_of(int item_idx, bool full);
  std::vector<int> partition();
  StageSums stage_sums(const std::vector<int>& counts);
  StageMemoryInput memory_input(const StageSums& ss, int st) const;
  double peak_memory(const StageSums& ss, const Plan& p) const;
  bool least_swap(const StageSums& ss, double capacity, Plan& p) const;
  double swap_in_s(const StageSums& ss, std::size_t chunk) const;
  double weight_copy_s(const ItemCost& c) const;
  double optimizer_fetch_s(const StageSums& ss, int st) const;
  double dp_exposed(const StageSums& ss) const;
  double dp_coll(GroupKind g, Collective c, double params, double bytes_per_param) const;
  /// The replayed pipeline's span and the data-parallel traffic it leaves exposed, or nothing.
  bool replay_step(const StageSums& ss, double p2p, double& pipe, double& dp, double& swap) const;
  void bottleneck(PlanEstimate& e, const StageSums& ss) const;

  const Scenario& s_;
  const Plan& p_;
  const topologies::Topology& topo_;
  const models::Workload& w_;
  EstimatorCache& cache_;
  Layout lay_;
  LayerSpec spec_;
  StageNetwork net_;
  LayerBuilder layers_;
  int group_ = 1;
  bool refine_ = false;  ///< the lowering's refined partition (the replay), not the water-filling start
  /// cost_of per item and recompute choice for this plan (the cache's key compares a whole
  /// LayerSpec, and a plan asks for each of its items several times).
  std::vector<const ItemCost*> memo_[2];
  /// The same per distinct (program, kind, MoE, recompute) of this plan: most decoder layers
  /// share one program, so the cache is searched a handful of times per plan.
  struct Seen {
    int program;
    models::ItemKind kind;
    bool moe, full;
    const ItemCost* cost;
  };
  std::vector<Seen> seen_;
};

const ItemCost& Screen::cost_of(int item_idx, bool full) {
  auto& memo = memo_[full ? 1 : 0];
  if (memo.empty()) memo.assign(w_.items.size(), nullptr);
  const auto idx = static_cast<std::size_t>(item_idx);
  if (memo[idx] != nullptr) return *memo[idx];
  const auto& item = w_.items[idx];
  const bool moe = lowering::is_moe_item(s_.model, item);
  for (const Seen& x : seen_)
    if (x.program == item.program && x.kind == item.kind && x.moe == moe && x.full == full) return *(memo[idx] = x.cost);
  const ItemKey key{spec_, item.program, item.kind, moe, full, group_};
  auto it = cache_.items.find(key);
  if (it != cache_.items.end()) {
    seen_.push_back({item.program, item.kind, moe, full, &it->second});
    return *(memo[idx] = &it->second);
  }
  const ItemProgram ip = layers_.build(item, full, group_, 0);
  const Tick launch = to_ticks(Seconds{s_.simulation.launch_overhead});
  const bool fused = s_.simulation.fused_vector_ops;
  ItemCost c;
  c.fwd_s = lowering::time_alone(ip.fwd, launch, fused, lay_.ep, c.fwd_compute_s, c.comm_s);
  c.bwd_s = lowering::time_alone(ip.bwd, launch, fused, lay_.ep, c.bwd_compute_s, c.comm_s);
  for (const Step& st : ip.bwd.steps)
    if (st.wgrad) c.wgrad_s += to_seconds(st.duration).value();
  // A pair's programs co-scheduled on the device, plus what host dispatch adds to each pass
  // alone (the host issues both passes' kernels; the simulation adds it the same way).
  double unused = 0;
  std::array<double, kNumCats> unused_comm{};
  const double host = launch > 0 ? (c.fwd_s - lowering::time_alone(ip.fwd, 0, fused, lay_.ep, unused, unused_comm)) +
                                       (c.bwd_s - lowering::time_alone(ip.bwd, 0, fused, lay_.ep, unused, unused_comm))
                                 : 0.0;
  auto none = [](bool, std::size_t) {};
  c.pair_s = to_seconds(lowering::co_schedule(ip.bwd, ip.fwd, false, none)).value() + host;
  c.pair_balanced_s = to_seconds(lowering::co_schedule(ip.bwd, ip.fwd, true, none)).value() + host;
  c.act_bytes = ip.act_bytes;
  c.transient = ip.transient;
  c.params_dense = ip.params_dense;
  c.params_expert = ip.params_expert;
  const ItemCost* stored = &cache_.items.emplace(key, c).first->second;
  seen_.push_back({item.program, item.kind, moe, full, stored});
  return *(memo[idx] = stored);
}

/// The water-filling start of the automatic partition, on layer costs.
std::vector<int> Screen::partition() {
  std::vector<double> layer_cost;
  double first_extra = 0, last_extra = 0;
  for (std::size_t i = 0; i < w_.items.size(); ++i) {
    const auto& item = w_.items[i];
    const ItemCost& c = cost_of(static_cast<int>(i), p_.recompute == Recompute::Full);
    if (item.kind == models::ItemKind::Decoder) layer_cost.push_back(c.fwd_s + c.bwd_s);
    else if (item.kind == models::ItemKind::Embedding) first_extra += c.fwd_s + c.bwd_s;
    else last_extra += c.fwd_s + c.bwd_s;
  }
  return lowering::partition_layers(p_, layer_cost, first_extra, last_extra, refine_);
}

StageSums Screen::stage_sums(const std::vector<int>& counts) {
  const int pp = p_.pp, V = p_.virtual_stages();
  const bool full_all = p_.recompute == Recompute::Full && p_.recompute_method == RecomputeMethod::Uniform;
  StageSums ss(pp, p_.vpp);
  const std::vector<std::vector<int>> vs_items = lowering::virtual_stage_items(p_, counts, w_.items.size());
  for (int v = 0; v < V; ++v) {
    const int st = stage_of_virtual(p_.schedule, pp, v);
    const std::size_t sc = static_cast<std::size_t>(st) * p_.vpp + chunk_of_virtual(p_.schedule, pp, v);
    double act = 0;
    int pos = 0;
    for (int idx : vs_items[v]) {
      bool full = p_.recompute == Recompute::Full;
      if (w_.items[idx].kind == models::ItemKind::Decoder && p_.recompute == Recompute::Full && !full_all)
        full = pos++ < p_.recompute_num_layers;
      const ItemCost& c = cost_of(idx, full);
      ss.F[st] += c.fwd_s;
      ss.B[st] += c.bwd_s;
      ss.pair[st] += pairs_forward_backward(p_.schedule) ? c.pair_balanced_s : c.pair_s;
      ss.cf[sc] += c.fwd_s;
      ss.cb[sc] += c.bwd_s;
      ss.ccopy[sc] += weight_copy_s(c);
      ss.cw[sc] += c.wgrad_s;
      ss.cpd[sc] += c.params_dense;
      ss.cpe[sc] += c.params_expert;
      ss.citems[sc] += 1;
      ss.cact[sc] += c.act_bytes;
      ss.cpair[sc] += pairs_forward_backward(p_.schedule) ? c.pair_balanced_s : c.pair_s;
      ss.compute[st] += c.fwd_compute_s + c.bwd_compute_s;
      ss.wgrad[st] += c.wgrad_s;
      act += c.act_bytes;
      ss.transient[st] = std::max(ss.transient[st], c.transient);
      ss.params_dense[st] += c.params_dense;
      ss.params_expert[st] += c.params_expert;
      ss.item_params_max[st] = std::max(ss.item_params_max[st], c.params_dense + c.params_expert);
      if (st == 0) {
        ss.compute_total += c.fwd_compute_s + c.bwd_compute_s;
        ss.comm_total += (c.fwd_s + c.bwd_s) - (c.fwd_compute_s + c.bwd_compute_s);
        for (int k = 0; k < kNumCats; ++k) ss.comm_cat[k] += c.comm_s[k];
      }
    }
    ss.act_chunk_max[st] = std::max(ss.act_chunk_max[st], act);
    ss.act_sum[st] += act;
    if (p_.offload_weights) {  // the copies the chunk's own pass does not cover
      const double xf = std::max(0.0, ss.ccopy[sc] - ss.cf[sc]), xb = std::max(0.0, ss.ccopy[sc] - ss.cb[sc]);
      ss.cf[sc] += xf;
      ss.cb[sc] += xb;
      ss.F[st] += xf;
      ss.B[st] += xb;
    }
  }
  return ss;
}

/// A stage's memory input with the schedule's closed-form in-flight count.
StageMemoryInput Screen::memory_input(const StageSums& ss, int st) const {
  const ScheduleTraits& sched = schedule_traits(p_.schedule);
  StageMemoryInput in;
  in.params_dense = ss.params_dense[st];
  in.params_expert = ss.params_expert[st];
  in.peak_inflight = sched.inflight(p_.pp, p_.vpp, p_.num_microbatches, st);
  in.peak_activations = in.peak_inflight * (ss.act_sum[st] / p_.vpp);
  in.largest_chunk_activations = ss.act_chunk_max[st];
  in.transient_bytes = ss.transient[st];
  in.largest_item_params = ss.item_params_max[st];
  return in;
}

/// The worst stage under the one memory model.
double Screen::peak_memory(const StageSums& ss, const Plan& p) const {
  double peak = 0;
  for (int st = 0; st < p_.pp; ++st)
    peak = std::max(peak, stage_memory(p, lay_.edp, s_.training.precision, s_.cluster.device.memory_reserved.value(),
                                       memory_input(ss, st))
                              .total());
  return peak;
}

/// The least swapping that makes the plan fit, as MindSpeed offers it: activations in quarters
/// (memory is linear in the fraction, so the needed one is solved for, then rounded up), the
/// optimizer states too only when all the activations are not enough, and the weights last
/// (with the gradients sharded). False: nothing fits.
bool Screen::least_swap(const StageSums& ss, double capacity, Plan& p) const {
  const DpSharding sharding = p.dp_sharding;
  // Weights stream through a double buffer one pass at a time: not under forward-backward
  // pairs, which run two passes' layers at once (validate_plan refuses it too).
  const bool pairs = p.fb_overlap || pairs_forward_backward(p.schedule);
  for (const int level : {0, 1, 2}) {
    if (level == 2 && pairs) break;
    // 0: activations; 1: and the optimizer states; 2: and the weights (ZeRO-Infinity style,
    // which needs the gradients sharded as they are produced).
    p.swap_optimizer = level >= 1;
    p.offload_weights = level >= 2;
    p.dp_sharding = level >= 2 && sharding != DpSharding::Full ? DpSharding::OptimizerGradients : sharding;
    p.swap_activations = 0;
    double need = 0;
    for (int st = 0; st < p_.pp; ++st) {
      const StageMemoryInput in = memory_input(ss, st);
      const double over = stage_memory(p, lay_.edp, s_.training.precision, s_.cluster.device.memory_reserved.value(), in)
                              .total() - capacity;
      const double movable = in.peak_activations - in.largest_chunk_activations;
      if (over <= 0) continue;
      need = std::max(need, movable > 0 ? over / movable : 2.0);
    }
    if (need <= 1.0) {
      p.swap_activations = need <= 0 ? 0.0 : std::ceil(need * 4.0 - 1e-9) / 4.0;
      return true;
    }
  }
  return false;
}

/// One data-parallel collective over `params` parameters in gradient buckets (seconds).
double Screen::dp_coll(GroupKind g, Collective c, double params, double bytes_per_param) const {
  const topologies::GroupShape& sh = net_.shape(g);
  const double bytes = params * bytes_per_param;
  if (sh.size <= 1 || bytes <= 0) return 0.0;
  const double buckets = std::max(1.0, std::ceil(params / gradient_bucket_params(sh.size)));
  const topologies::GroupPlacement where{&sh, {}, {}, {}};
  return buckets * cache_.network.collective(c, bytes / buckets, where, topologies::Algorithm::Auto, 1.0).time.value();
}

/// Data-parallel traffic and how much of it the last backward / first forward hides.
double Screen::dp_exposed(const StageSums& ss) const {
  const double gb = grad_bytes_per_param(p_);
  const double pgb = param_gather_bytes_per_param(p_);
  auto coll = [&](GroupKind g, Collective c, double params, double bytes_per_param) {
    return dp_coll(g, c, params, bytes_per_param);
  };
  const Collective red = p_.distributed_optimizer ? Collective::ReduceScatter : Collective::AllReduce;
  double exposed = 0;
  for (int st = 0; st < p_.pp; ++st) {
    const double pd = ss.params_dense[st], pe = ss.params_expert[st];
    const double rs = coll(GroupKind::Dp, red, pd, gb) + coll(GroupKind::Edp, red, pe, gb);
    const double ag = p_.distributed_optimizer ? coll(GroupKind::Dp, Collective::AllGather, pd, pgb) +
                                                     coll(GroupKind::Edp, Collective::AllGather, pe, pgb)
                                               : 0.0;
    if (p_.dp_sharding == DpSharding::Full) {
      // Per item and micro-batch: gathers before the forward (and the backward after a
      // reshard), a reduce-scatter after the backward, prefetched under the passes' compute.
      if (!p_.grad_sync_every_microbatch) {  // once a step: under the first forward and the last backward
        exposed = std::max(exposed, std::max(0.0, ag - ss.F[st]) + std::max(0.0, rs - ss.B[st]));
        continue;
      }
      const double per_mb = ag * (p_.reshard_after_forward ? 2.0 : 1.0) + rs;
      exposed = std::max(exposed, p_.num_microbatches * std::max(0.0, per_mb - (ss.F[st] + ss.B[st])));
      continue;
    }
    const double rs_exp = p_.overlap_grad_reduce ? std::max(0.0, rs - ss.B[st] / p_.vpp) : rs;
    const double ag_exp = p_.overlap_param_gather ? std::max(0.0, ag - ss.F[st] / p_.vpp) : ag;
    exposed = std::max(exposed, rs_exp + ag_exp);
  }
  return exposed;
}

/// Where the time goes, for the "main bottleneck" column: the largest non-compute part.
void Screen::bottleneck(PlanEstimate& e, const StageSums& ss) const {
  double worst = e.compute_s;
  e.bottleneck = "compute";
  auto consider = [&](double v, const char* name) {
    if (v > worst) {
      worst = v;
      e.bottleneck = name;
    }
  };
  if (e.exposed_comm_s > 0) {
    int best_cat = kTpComm;
    for (int k = kTpComm; k <= kDpComm; ++k)
      if (ss.comm_cat[k] > ss.comm_cat[best_cat]) best_cat = k;
    consider(e.exposed_comm_s, best_cat == kEpComm ? "ep_comm" : best_cat == kCpComm ? "cp_comm" : "tp_comm");
  }
  consider(e.bubble_s, "bubble");
  consider(e.dp_exposed_s, "dp_comm");
}

/// The pipeline replayed pass by pass (replay.hpp) with this plan's per-chunk costs; the
/// schedule's orders come from the generator the simulation uses.
search_detail::ReplayResult Screen::replayed(const StageSums& ss, double p2p,
                                             const std::vector<double>& forward_ready) const {
  search_detail::PipelineReplay r;
  r.kind = p_.schedule;
  r.pp = p_.pp;
  r.vpp = p_.vpp;
  r.m = p_.num_microbatches;
  r.fb_overlap = p_.fb_overlap;
  r.p2p = p2p;
  r.forward_ready = forward_ready;
  if (p_.swap_activations > 0) {
    r.swap_in.resize(ss.cact.size());
    for (std::size_t i = 0; i < ss.cact.size(); ++i) r.swap_in[i] = swap_in_s(ss, i);
  }
  const bool split = splits_weight_gradients(p_.schedule);
  const std::size_t n = ss.cf.size();
  r.f = ss.cf;
  r.b_whole = ss.cb;
  r.w = ss.cw;
  r.b.resize(n);
  r.pair_saving.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    r.b[i] = split ? std::max(0.0, ss.cb[i] - ss.cw[i]) : ss.cb[i];
    r.pair_saving[i] = std::max(0.0, ss.cf[i] + ss.cb[i] - ss.cpair[i]);
  }
  StageCosts costs;
  if (schedule_traits(p_.schedule).follows_costs) {
    costs.assign(static_cast<std::size_t>(p_.pp), std::vector<PassCosts>(static_cast<std::size_t>(p_.vpp)));
    auto ns = [](double s) { return static_cast<long long>(std::llround(s * 1e9)); };
    for (int st = 0; st < p_.pp; ++st)
      for (int c = 0; c < p_.vpp; ++c) {
        const std::size_t i = static_cast<std::size_t>(st) * p_.vpp + c;
        costs[st][c] = PassCosts{ns(r.f[i]), ns(r.b[i]), ns(r.w[i])};
      }
  }
  return search_detail::replay_pipeline(r, make_schedule(p_.schedule, p_.pp, p_.vpp, p_.num_microbatches, costs));
}

/// Copying an item's weights in from host memory for one pass (seconds; 0 without offload).
double Screen::weight_copy_s(const ItemCost& c) const {
  const double bw = s_.cluster.device.host_bandwidth.value();
  if (!p_.offload_weights || bw <= 0) return 0.0;
  return (c.params_dense + c.params_expert) * weight_bytes_per_param(s_.training.precision, p_) / bw;
}

/// Copying one micro-batch's swapped activations of a chunk back from host memory (seconds).
double Screen::swap_in_s(const StageSums& ss, std::size_t chunk) const {
  const double bw = s_.cluster.device.host_bandwidth.value();
  return p_.swap_activations > 0 && bw > 0 ? p_.swap_activations * ss.cact[chunk] / bw : 0.0;
}

/// Fetching a stage's swapped optimizer states before its optimizer step (seconds).
double Screen::optimizer_fetch_s(const StageSums& ss, int st) const {
  const double bw = s_.cluster.device.host_bandwidth.value();
  if (!p_.swap_optimizer || bw <= 0) return 0.0;
  return adam_state_bytes_per_param(p_) * optimizer_shard_params(p_, lay_.edp, ss.params_dense[st], ss.params_expert[st]) / bw;
}

/// With overlapped gradient reduction and parameter gathers (Megatron's distributed optimizer):
/// each chunk's gathers run in chunk order on the stage's data-parallel stream from the step's
/// start, and its first forward waits for them (less what its items before the last overlap);
/// each chunk's reduction starts when its gradients are complete, on the same stream, in the
/// order they complete. What outlasts the pipeline is exposed. Other data-parallel modes keep
/// the closed form.
bool Screen::replay_step(const StageSums& ss, double p2p, double& pipe, double& dp, double& swap) const {
  const bool overlapped = p_.dp_sharding != DpSharding::Full && p_.overlap_grad_reduce;
  const int pp = p_.pp, vpp = p_.vpp;
  const std::size_t n = static_cast<std::size_t>(pp) * vpp;
  const double gb = grad_bytes_per_param(p_), pgb = param_gather_bytes_per_param(p_);
  const Collective red = p_.distributed_optimizer ? Collective::ReduceScatter : Collective::AllReduce;
  std::vector<double> ready, gather_end(pp, 0.0);
  if (overlapped && p_.distributed_optimizer && p_.overlap_param_gather) {
    ready.assign(n, 0.0);
    for (int st = 0; st < pp; ++st)
      for (int c = 0; c < vpp; ++c) {
        const std::size_t i = static_cast<std::size_t>(st) * vpp + c;
        gather_end[st] += dp_coll(GroupKind::Dp, Collective::AllGather, ss.cpd[i], pgb) +
                          dp_coll(GroupKind::Edp, Collective::AllGather, ss.cpe[i], pgb);
        const double items = std::max(1.0, ss.citems[i]);
        ready[i] = std::max(0.0, gather_end[st] - ss.cf[i] * (1.0 - 1.0 / items));
      }
  }
  const search_detail::ReplayResult rr = replayed(ss, p2p, ready);
  if (rr.span <= 0) return false;
  pipe = rr.span;
  // Swapped optimizer states come back after the stage's last forward, behind its swap-ins;
  // the optimizer step waits for them.
  double fetched = 0;
  for (int st = 0; st < pp; ++st)
    if (const double f = optimizer_fetch_s(ss, st); f > 0)
      fetched = std::max(fetched, std::max(rr.host_in_free[st], rr.last_forward[st]) + f);
  if (!overlapped) {
    swap = std::max(0.0, fetched - rr.span - dp);
    return true;
  }
  double end = rr.span;
  std::vector<std::size_t> order(static_cast<std::size_t>(vpp));
  for (int st = 0; st < pp; ++st) {
    for (int c = 0; c < vpp; ++c) order[c] = static_cast<std::size_t>(st) * vpp + c;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return rr.grads_done[a] < rr.grads_done[b]; });
    double t = gather_end[st];
    for (std::size_t i : order)
      t = std::max(t, rr.grads_done[i]) + dp_coll(GroupKind::Dp, red, ss.cpd[i], gb) + dp_coll(GroupKind::Edp, red, ss.cpe[i], gb);
    end = std::max(end, std::max(rr.stage_end[st], t));
  }
  dp = end - rr.span;
  swap = std::max(0.0, fetched - end);
  if (p_.distributed_optimizer && !p_.overlap_param_gather) {  // gathered after the optimizer step
    double ag = 0;
    for (int st = 0; st < pp; ++st)
      ag = std::max(ag, dp_coll(GroupKind::Dp, Collective::AllGather, ss.params_dense[st], pgb) +
                            dp_coll(GroupKind::Edp, Collective::AllGather, ss.params_expert[st], pgb));
    dp += ag;
  }
  return true;
}

PlanEstimate Screen::run(bool replay, bool least) {
  refine_ = replay;
  PlanEstimate e;
  const int m = p_.num_microbatches, pp = p_.pp;
  const StageSums ss = stage_sums(partition());
  e.capacity_bytes = s_.cluster.device.hbm_capacity.value();
  e.peak_memory_bytes = peak_memory(ss, p_);
  e.fits = e.peak_memory_bytes <= e.capacity_bytes;
  e.swap_activations = p_.swap_activations;
  e.swap_optimizer = p_.swap_optimizer;
  e.offload_weights = p_.offload_weights;
  if (least && !e.fits) {
    // The least swapping that fits, for the caller to estimate that plan; nothing timed here.
    Plan q = p_;
    if (least_swap(ss, e.capacity_bytes, q)) {
      e.swap_activations = q.swap_activations;
      e.swap_optimizer = q.swap_optimizer;
      e.offload_weights = q.offload_weights;
      e.peak_memory_bytes = peak_memory(ss, q);
      e.fits = e.peak_memory_bytes <= e.capacity_bytes;
    }
    return e;
  }

  // Pipeline: the slowest stage for every micro-batch, plus the schedule's fill and drain.
  const ScheduleTraits& sched = schedule_traits(p_.schedule);
  PipelineCosts pc;
  pc.pp = pp;
  pc.vpp = p_.vpp;
  int slow = 0;
  // Swapped activations come back on one host-to-device stream per stage, each from its
  // forward's end: a chunk on the pipeline's last position runs its backward right after its
  // forward and waits for the whole copy; otherwise only a stream busier than the stage is.
  std::vector<double> swap_wait(pp, 0.0);
  if (p_.swap_activations > 0)
    for (int st = 0; st < pp; ++st) {
      double in = 0, last = 0;
      for (int c = 0; c < p_.vpp; ++c) {
        const double d = swap_in_s(ss, static_cast<std::size_t>(st) * p_.vpp + c);
        in += d;
        const int v = virtual_stage(p_.schedule, pp, st, c);
        if (v == p_.virtual_stages() - 1 || (sched.bidirectional && v == pp - 1)) last += d;
      }
      swap_wait[st] = std::max(last, in - (ss.F[st] + ss.B[st]));
    }
  for (int st = 0; st < pp; ++st) {
    const double t = ss.F[st] + ss.B[st] + swap_wait[st];
    if (t > pc.t_max) {
      pc.t_max = t;
      slow = st;
    }
    pc.t_sum += t;
  }
  double p2p = 0;
  if (pp > 1) {
    const double tseq = lowering::Tokens::of(p_, s_.training.seq_length, lay_.etp).Tseq;
    const double bytes = static_cast<double>(s_.model.hidden) * models::kActivationBytes * tseq;
    p2p = topologies::p2p_time(bytes, topo_.route(0, lay_.block)).value();
  }
  double wsum = 0;
  for (int st = 0; st < pp; ++st) wsum += ss.wgrad[st];
  pc.w_share = pc.t_sum > 0 ? wsum / pc.t_sum : 0.0;
  // One forward-backward pair of the slowest stage, its layers' programs issued together as the
  // emitter does (co_schedule): the communication the other pass's compute does not cover stays.
  pc.pair = std::max(ss.compute[slow], ss.pair[slow]);
  pc.b_slow = ss.B[slow];
  pc.w_slow = ss.wgrad[slow];
  // DualPipe runs each micro-batch on one of a device's two stages; paired passes (DualPipe(V)'s
  // F&B pairs, moe_fb_overlap) cost their compute or their communication, whichever is longer.
  const double half = sched.bidirectional ? 0.5 : 1.0;
  // A backward pairs with the next forward of another micro-batch (moe_fb_overlap in 1F1B;
  // DualPipe(V) by construction) only in the steady state: the first stage's pp - 1 warm-up
  // forwards and the cooldown backwards run alone, so about m - pp pairs (none with one
  // micro-batch).
  const double pairs = sched.pairs_forward_backward || p_.fb_overlap ? std::max(0, m - pp) : 0;
  const double t_steady = half * (pairs * pc.pair + (m - pairs) * pc.t_max) / std::max(1, m);
  double pipe = m * t_steady + sched.fill(pc) + 2.0 * (pp - 1) * p2p;
  e.dp_exposed_s = dp_exposed(ss);
  // Swapped optimizer states come back after the last forward, under the backwards after it.
  for (int st = 0; st < pp; ++st) e.swap_exposed_s = std::max(e.swap_exposed_s, optimizer_fetch_s(ss, st) - ss.B[st]);
  e.replayed = replay && replay_step(ss, p2p, pipe, e.dp_exposed_s, e.swap_exposed_s);
  const double shard = optimizer_shard_params(p_, lay_.edp, ss.params_dense[slow], ss.params_expert[slow]);
  const double opt = cache_.cm.memory_bound(Bytes{optimizer_step_bytes_per_param(p_) * shard}).value();
  e.step_s = pipe + e.dp_exposed_s + e.swap_exposed_s + opt;
  e.tokens_per_s = s_.training.tokens_per_step() / e.step_s;
  e.mfu = w_.model_flops_per_token * e.tokens_per_s /
          (static_cast<double>(s_.cluster.devices) * s_.cluster.device.mfu_peak(s_.training.precision).value());
  const double per_mb = ss.F[0] + ss.B[0];
  const double frac_comm = per_mb > 0 ? ss.comm_total / per_mb : 0.0;
  e.compute_s = m * half * pc.t_max * (1.0 - frac_comm);
  e.exposed_comm_s = std::max(0.0, m * t_steady - e.compute_s);
  e.bubble_s = std::max(0.0, pipe - m * t_steady);
  bottleneck(e, ss);
  return e;
}

}  // namespace

Estimator::Estimator(const Scenario& base, const topologies::Topology& topo, const models::Workload& w)
    : base_(base), topo_(topo), w_(w), cache_(std::make_unique<EstimatorCache>(base, w)) {}

Estimator::~Estimator() = default;

void apply_offload(Plan& p, bool offload_weights) {
  p.offload_weights = offload_weights;
  if (offload_weights && p.dp_sharding != DpSharding::Full) p.dp_sharding = DpSharding::OptimizerGradients;
}

PlanEstimate Estimator::estimate(const Plan& plan, bool replay, bool least_swap) {
  PlanEstimate e = Screen(base_, plan, topo_, w_, *cache_).run(replay, least_swap);
  if (least_swap && e.fits &&
      (e.swap_activations != plan.swap_activations || e.swap_optimizer != plan.swap_optimizer ||
       e.offload_weights != plan.offload_weights)) {
    Plan swapped = plan;
    swapped.swap_activations = e.swap_activations;
    swapped.swap_optimizer = e.swap_optimizer;
    apply_offload(swapped, e.offload_weights);
    e = Screen(base_, swapped, topo_, w_, *cache_).run(replay, false);
  }
  return e;
}

}  // namespace moesim::strategies
