// Lowering, the orchestration: a scenario's plan becomes per-stage operator programs (layer.cpp),
// a layer partition (partition.cpp), a schedule (plan/schedule.cpp), stage memory (memory.cpp),
// routing draws (moe.cpp) and finally the task graph (emit.cpp). Each stage takes and returns
// explicit values; this file only passes them along.

#include "moesim/strategies/lower/lower.hpp"

#include <algorithm>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "documents.hpp"
#include "emit.hpp"
#include "layer.hpp"
#include "moe.hpp"
#include "moesim/strategies/lower/memory.hpp"
#include "network.hpp"
#include "partition.hpp"
#include "program.hpp"

namespace moesim::strategies {

const std::vector<std::string>& category_names() {
  static const std::vector<std::string> names{"compute", "recompute", "tp_comm", "cp_comm",
                                              "ep_comm", "pp_comm",   "dp_comm", "optimizer", "swap", "launch"};
  return names;
}

const char* stream_name(Stream s) {
  switch (s) {
    case Stream::Compute: return "compute";
    case Stream::Tp: return "tp";
    case Stream::Cp: return "cp";
    case Stream::Ep: return "ep";
    case Stream::Pp: return "pp";
    case Stream::Dp: return "dp";
    case Stream::Host: return "host";
    case Stream::Launch: return "launch";
    case Stream::HostIn: return "host_in";
    case Stream::DpReduce: return "dp_reduce";
    case Stream::EpIntra: return "ep_intra";
  }
  return "?";
}

double alltoall_dedup_ratio(int experts, int top_k, int servers) {
  if (servers <= 1 || experts <= 0 || top_k <= 0) return 1.0;
  // P(a given server holds none of the k experts) = C(E - E/m, k) / C(E, k).
  const double per = static_cast<double>(experts) / servers;
  double miss = 1.0;
  for (int i = 0; i < top_k; ++i) miss *= (experts - per - i) / (experts - i);
  miss = std::max(0.0, miss);
  const double distinct = servers * (1.0 - miss);  // servers a token reaches
  return std::clamp(distinct / top_k, 0.0, 1.0);
}

namespace lowering {
namespace {

/// How the plan's recomputation applies to one pipeline item.
struct ItemRecompute {
  bool full = false;  ///< full recomputation (decoder and MTP layers; ignored by the others)
  int group = 1;      ///< layers sharing one kept input (uniform method)
};

class Lowering {
 public:
  Lowering(const Scenario& s, const topologies::Topology& topo, const models::Workload& w, const CancelFlag* cancel,
           bool memory_detail);
  Lowered run();

 private:
  std::vector<int> partition_items();
  /// `layer_pos`: decoder layers of the chunk before this item (advanced past a decoder layer).
  [[nodiscard]] ItemRecompute item_recompute(const models::PipelineItem& item, int& layer_pos) const;
  void build_ranks(Fidelity f);
  void build_stage_programs(const std::vector<std::vector<int>>& vs_items);
  void adapt_schedule();
  void stage_memories();
  void memory_detail();
  void p2p_times();

  const Scenario& s_;
  const Plan& p_;
  const models::ModelSpec& m_;
  const topologies::Topology& topo_;
  const models::Workload& w_;
  const CancelFlag* cancel_;
  bool memory_detail_ = false;
  std::vector<InflightPeak> peaks_;  ///< per stage, kept for the memory detail only
  models::ComputeModel cm_;
  Layout lay_;
  Tokens tok_;
  sim::TaskGraphBuilder builder_;
  std::unique_ptr<topologies::CollectiveModel> network_model_;
  StageNetwork net_;
  LayerContext layer_ctx_;
  LayerBuilder layers_;
  MoeRouting routing_;
  SimulatedRanks simulated_;
  StragglerMap stragglers_;
  StagePrograms programs_;
  std::vector<std::vector<double>> chunk_act_full_;  ///< [stage][chunk] without recomputation
  std::vector<double> stage_flops_;
  std::vector<double> p2p_seconds_;  ///< per virtual stage boundary
  Lowered out_;
};

/// The flow-level network model times the all-to-alls of event simulations; fast fidelity
/// keeps the analytical model.
topologies::NetworkKind network_kind(const Scenario& s) {
  return s.simulation.network == NetworkModel::Flow && s.simulation.fidelity != Fidelity::Fast
             ? topologies::NetworkKind::Flow
             : topologies::NetworkKind::Analytical;
}

Lowering::Lowering(const Scenario& s, const topologies::Topology& topo, const models::Workload& w,
                   const CancelFlag* cancel, bool memory_detail)
    : s_(s),
      p_(s.plan),
      m_(s.model),
      topo_(topo),
      w_(w),
      cancel_(cancel),
      memory_detail_(memory_detail),
      cm_(s.cluster.device),
      lay_(Layout::of(s.plan, s.model.is_moe())),
      tok_(Tokens::of(s.plan, s.training.seq_length, lay_.etp)),
      builder_(category_names()),
      network_model_(topologies::make_collective_model(network_kind(s), topo)),
      net_(topo, lay_, *network_model_, nullptr, s.plan.alltoall, s.model.top_k),
      layer_ctx_{s.model, w, cm_, s.training.precision, s.training.seq_length, s.training.documents.packed,
                 s.routing.dispatch_syncs_host()},
      layers_(layer_ctx_, LayerSpec::of(s.plan, lay_), net_, builder_),
      routing_(MoeInputs{s.model, s.routing, s.placement, s.seed, s.plan.num_microbatches,
                         s.plan.distributed_optimizer, adam_state_bytes_per_param(s.plan), s.training.precision},
               lay_, tok_, cm_, net_) {}

/// Layers per virtual stage, from item costs with stage 0's group shapes.
std::vector<int> Lowering::partition_items() {
  net_.set_stage(0);
  std::vector<double> layer_cost;
  double first_extra = 0, last_extra = 0;
  for (const auto& item : w_.items) {
    ItemProgram ip = layers_.build(item, p_.recompute == Recompute::Full, std::max(1, p_.recompute_num_layers), 0);
    const double c = ip.fwd_seconds + ip.bwd_seconds;
    if (item.kind == models::ItemKind::Decoder) layer_cost.push_back(c);
    else if (item.kind == models::ItemKind::Embedding) first_extra += c;
    else last_extra += c;
  }
  return partition_layers(p_, layer_cost, first_extra, last_extra);
}

ItemRecompute Lowering::item_recompute(const models::PipelineItem& item, int& layer_pos) const {
  ItemRecompute r;
  r.full = p_.recompute == Recompute::Full;
  if (item.kind == models::ItemKind::Decoder) {
    if (r.full && p_.recompute_method == RecomputeMethod::Block) r.full = layer_pos < p_.recompute_num_layers;
    ++layer_pos;
  }
  r.group = p_.recompute_method == RecomputeMethod::Uniform ? std::max(1, p_.recompute_num_layers) : 1;
  return r;
}

void Lowering::build_ranks(Fidelity f) {
  // Which ranks of a stage are simulated: one representative when all ranks of a stage are
  // alike; every member of an expert-parallel group when the routing makes them differ; every
  // rank at full fidelity.
  std::vector<int>& locals = simulated_.locals;
  locals.clear();
  // A user's expert map can load the ranks unevenly even under balanced routing.
  simulated_.skewed = (s_.routing.skewed() || !s_.placement.expert_map.empty()) && m_.is_moe() && lay_.ep > 1 &&
                      f != Fidelity::Fast;
  // Stragglers: the column they slow most is followed (stragglers.hpp); with skewed routing,
  // the column of the expert-parallel group simulated.
  stragglers_ = realise_stragglers(s_, lay_, p_.pp, s_.simulation.step_index, simulated_.skewed ? 0 : -1);
  if (f == Fidelity::Full) {
    for (int l = 0; l < lay_.block; ++l) locals.push_back(l);
  } else if (simulated_.skewed) {
    locals = lay_.members(GroupKind::Ep, 0);
    if (stragglers_.active) locals.insert(locals.end(), stragglers_.locals.begin(), stragglers_.locals.end());
    std::sort(locals.begin(), locals.end());
    locals.erase(std::unique(locals.begin(), locals.end()), locals.end());
  } else if (stragglers_.active) {
    locals = stragglers_.locals;
  } else {
    locals.push_back(0);
  }
  simulated_.pos_of_local.assign(static_cast<std::size_t>(lay_.block), -1);
  for (std::size_t q = 0; q < locals.size(); ++q) simulated_.pos_of_local[locals[q]] = static_cast<int>(q);
  const double weight = static_cast<double>(lay_.block) / static_cast<double>(locals.size());
  const bool straggler_weights = stragglers_.active && f != Fidelity::Full && !simulated_.skewed;
  for (int stage = 0; stage < p_.pp; ++stage) {
    for (std::size_t q = 0; q < locals.size(); ++q) {
      const int l = locals[q];
      SimRank r;
      r.stage = stage;
      r.local = l;
      r.global_rank = stage * lay_.block + l;
      r.weight = straggler_weights ? stragglers_.weight[stage][q] : weight;
      const auto idx = static_cast<std::uint32_t>(out_.ranks.size());
      const std::string name = "rank" + std::to_string(r.global_rank);
      for (int st = 0; st < kNumStreams; ++st)
        r.streams[st] = builder_.add_resource(name + "/" + stream_name(static_cast<Stream>(st)), idx,
                                              sim::ResourceKind::Stream);
      r.scaleup_port = builder_.add_resource(name + "/scale-up", idx, sim::ResourceKind::Link);
      r.nic = builder_.add_resource(name + "/nic", idx, sim::ResourceKind::Link);
      out_.ranks.push_back(r);
    }
  }
}

void Lowering::build_stage_programs(const std::vector<std::vector<int>>& vs_items) {
  const int m = p_.num_microbatches;
  out_.stages.resize(p_.pp);
  programs_.resize(p_.pp, p_.vpp);
  chunk_act_full_.assign(p_.pp, std::vector<double>(p_.vpp, 0.0));
  stage_flops_.assign(p_.pp, 0.0);
  for (int stage = 0; stage < p_.pp; ++stage) {
    net_.set_stage(stage);
    {
      auto spans = [&](GroupKind g) { return net_.shape(g).spans_nodes(); };
      std::uint16_t bits = 0;
      auto set = [&](Stream st, bool on) { if (on) bits |= static_cast<std::uint16_t>(1u << static_cast<int>(st)); };
      set(Stream::Tp, spans(GroupKind::Tp) || spans(GroupKind::Etp));
      set(Stream::Cp, spans(GroupKind::Cp));
      set(Stream::Ep, spans(GroupKind::Ep));
      set(Stream::Dp, spans(GroupKind::Dp) || spans(GroupKind::Edp));
      set(Stream::DpReduce, spans(GroupKind::Dp) || spans(GroupKind::Edp));
      for (SimRank& r : out_.ranks)
        if (r.stage == stage) r.scale_out_streams = bits;
    }
    StageInfo& si = out_.stages[stage];
    si.stage = stage;
    si.chunk_items.resize(p_.vpp);
    for (int c = 0; c < p_.vpp; ++c) {
      const int v = virtual_stage(p_.schedule, p_.pp, stage, c);
      si.chunk_items[c] = vs_items[v];
      std::vector<ItemProgram> items;
      int layer_pos = 0;
      for (int item_idx : vs_items[v]) {
        const auto& item = w_.items[item_idx];
        const ItemRecompute rc = item_recompute(item, layer_pos);
        if (item.kind == models::ItemKind::Decoder) ++si.decoder_layers;
        items.push_back(layers_.build(item, rc.full, rc.group, m));
      }
      // Forward runs the items in order, backward in reverse; each item's input is the
      // previous item's output.
      Program& F = programs_.fwd[stage][c];
      Program& Bw = programs_.bwd[stage][c];
      for (const ItemProgram& ip : items) append_program(F, ip.fwd);
      for (auto it = items.rbegin(); it != items.rend(); ++it) append_program(Bw, it->bwd);
      std::reverse(Bw.item_end.begin(), Bw.item_end.end());  // indexed in forward item order
      finalize_program(F, builder_);
      finalize_program(Bw, builder_);
      if (pairs_forward_backward(p_.schedule)) programs_.bwd_full[stage][c] = Bw;
      if (splits_weight_gradients(p_.schedule)) split_weight_gradients(Bw, programs_.wgt[stage][c]);
      for (const ItemProgram& ip : items) {
        programs_.item_params[stage][c].push_back({ip.params_dense, ip.params_expert});
        si.params_dense += ip.params_dense;
        si.params_expert += ip.params_expert;
        programs_.act[stage][c] += ip.act_bytes;
        chunk_act_full_[stage][c] += ip.act_bytes_full;
        si.memory.transient_bytes = std::max(si.memory.transient_bytes, ip.transient);
        si.forward_seconds += ip.fwd_seconds;
        si.backward_seconds += ip.bwd_seconds;
        double recompute_flops = 0;
        for (const Step& st : ip.bwd.steps)
          if (st.cat == kRecompute) recompute_flops += st.flops;
        stage_flops_[stage] += (ip.fwd_flops + ip.bwd_flops + recompute_flops) * (bidirectional(p_.schedule) ? m / 2 : m);
      }
    }
    for (int c = 0; c < p_.vpp; ++c) si.activation_bytes_per_microbatch += programs_.act[stage][c];
  }
  // Collective counts were recorded once per emitted op program; scale to per-step counts.
  for (auto& u : net_.uses()) u.count_per_step = std::max(1, u.count_per_step);
}

/// The zero-bubble list schedule follows the passes' real durations (each program's longest
/// dependency path, streams ignored).
void Lowering::adapt_schedule() {
  if (!splits_weight_gradients(p_.schedule)) return;
  StageCosts costs(static_cast<std::size_t>(p_.pp), std::vector<PassCosts>(static_cast<std::size_t>(p_.vpp)));
  for (int stage = 0; stage < p_.pp; ++stage)
    for (int c = 0; c < p_.vpp; ++c)
      costs[stage][c] = PassCosts{program_span(programs_.fwd[stage][c]), program_span(programs_.bwd[stage][c]),
                                  program_span(programs_.wgt[stage][c])};
  out_.schedule = make_schedule(p_.schedule, p_.pp, p_.vpp, p_.num_microbatches, costs);
}

/// Memory per stage: the in-flight activations walked along the stage's schedule (with
/// separate W passes the inputs the weight gradients need stay until W).
void Lowering::stage_memories() {
  const Phase frees = splits_weight_gradients(p_.schedule) ? Phase::WeightGrad : Phase::Backward;
  for (int stage = 0; stage < p_.pp; ++stage) {
    StageInfo& si = out_.stages[stage];
    const InflightPeak peak = walk_inflight(out_.schedule[stage], programs_.act[stage], chunk_act_full_[stage], frees);
    StageMemoryInput in;
    in.params_dense = si.params_dense;
    in.params_expert = si.params_expert;
    in.peak_activations = peak.activations;
    in.peak_activations_unoptimised = peak.activations_unoptimised;
    in.peak_inflight = peak.chunks;
    in.largest_chunk_activations = 0;
    for (double a : programs_.act[stage]) in.largest_chunk_activations = std::max(in.largest_chunk_activations, a);
    in.transient_bytes = si.memory.transient_bytes;
    for (const auto& chunk : programs_.item_params[stage])
      for (const auto& [pd, pe] : chunk) in.largest_item_params = std::max(in.largest_item_params, pd + pe);
    si.memory = stage_memory(p_, lay_.edp, s_.training.precision, s_.cluster.device.memory_reserved.value(), in);
    if (memory_detail_) peaks_.push_back(peak);
  }
}

/// Every term of the memory of the stage with the largest total (the first of equals, as the
/// result's peak): the activations per distinct item from the accounting that made the sums
/// (LayerBuilder::memory), and the static parts with their bytes per parameter.
void Lowering::memory_detail() {
  int worst = 0;
  double largest = 0;
  for (const StageInfo& si : out_.stages)
    if (si.memory.total() > largest) {
      largest = si.memory.total();
      worst = si.stage;
    }
  const StageInfo& si = out_.stages[worst];
  const MemoryBreakdown& mem = si.memory;
  MemoryDetail d;
  d.stage = worst;
  d.chunks = p_.vpp;
  d.inflight_chunks = mem.peak_inflight;
  d.chunk_bytes = programs_.act[worst];
  struct Key {
    int program;
    ItemRecompute rc;
  };
  std::vector<Key> keys;
  double largest_transient = -1;
  for (int c = 0; c < p_.vpp; ++c) {
    int layer_pos = 0;
    for (int idx : si.chunk_items[c]) {
      const models::PipelineItem& item = w_.items[idx];
      const ItemRecompute rc = item_recompute(item, layer_pos);
      const bool decoder = item.kind == models::ItemKind::Decoder || item.kind == models::ItemKind::Mtp;
      std::size_t k = 0;
      while (k < keys.size() && !(keys[k].program == item.program && keys[k].rc.full == rc.full &&
                                  keys[k].rc.group == rc.group))
        ++k;
      if (k < keys.size()) {
        ++d.items[k].count;
        continue;
      }
      keys.push_back({item.program, rc});
      ItemMemoryDetail det;
      const ItemProgram ip = layers_.memory(item, rc.full, rc.group, &det);
      MemoryItem mi;
      mi.kind = w_.programs[item.program].name;
      if (decoder && rc.full) mi.kind += rc.group > 1 ? fmt::format(" (full recompute, 1 input per {})", rc.group)
                                                      : std::string(" (full recompute)");
      mi.count = 1;
      mi.full_bytes = ip.act_bytes_full;
      mi.kept_bytes = ip.act_bytes;
      mi.terms = std::move(det.terms);
      if (ip.transient > largest_transient) {
        largest_transient = ip.transient;
        d.transient_source = det.transient_op.empty() ? std::string("none")
                                                      : mi.kind + " " + det.transient_op + ": " + det.transient_why;
      }
      d.items.push_back(std::move(mi));
    }
  }
  for (const MemoryItem& mi : d.items) d.per_microbatch_bytes += mi.kept_bytes * mi.count;
  d.estimate_bytes = d.per_microbatch_bytes / p_.vpp * d.inflight_chunks;
  d.walked_peak_bytes = peaks_[static_cast<std::size_t>(worst)].activations;
  d.swapped_activation_bytes = d.walked_peak_bytes - mem.activations_bytes;
  d.activations_bytes = mem.activations_bytes;
  d.transient_bytes = mem.transient_bytes;

  // The static parts, as stage_memory (memory.cpp) counts them.
  const double params = si.params_dense + si.params_expert;
  const double shard = optimizer_shard_params(p_, lay_.edp, si.params_dense, si.params_expert);
  const models::Precision prec = s_.training.precision;
  const double wb = weight_bytes_per_param(prec, p_);
  const std::string held = fmt::format("{:.4g} dense (TP {}) + {:.4g} expert (EP {}, ETP {}) parameters on the rank",
                                       si.params_dense, p_.tp, si.params_expert, lay_.ep, lay_.etp);
  const std::string wkind = prec != models::Precision::FP8 ? "16-bit weights (mixed precision)"
                            : wb >= 3.0                     ? "BF16 weights and their FP8 copy (Transformer Engine)"
                                                            : "FP8 weights in two layouts (--fp8-param-gather)";
  if (p_.dp_sharding == DpSharding::Full) {
    double largest_item = 0;
    for (const auto& chunk : programs_.item_params[worst])
      for (const auto& [pd, pe] : chunk) largest_item = std::max(largest_item, pd + pe);
    const double local = std::min(mem.weights_bytes, shard * wb);
    const double gathered = mem.weights_bytes - local;
    d.statics.push_back({"weights (local shard)", local, local / wb, wb,
                         wkind + ", the FSDP shard of the " + held});
    d.statics.push_back(
        {"gathered FSDP weights", gathered, gathered / wb, wb,
         p_.reshard_after_forward && p_.grad_sync_every_microbatch
             ? fmt::format("the item being computed and the prefetched one: 2 x {:.4g} parameters (the stage's "
                           "largest item), at most the stage's parameters",
                           largest_item)
             : std::string("every layer of the stage, gathered from forward to backward (no reshard after forward, "
                           "or gradients synchronised at the last micro-batch)")});
  } else {
    d.statics.push_back({"weights", mem.weights_bytes, params, wb, wkind + ": " + held});
  }
  const double gb = grad_bytes_per_param(p_);
  std::string gnote = gb >= 4.0 ? "FP32 main gradients (Megatron DDP's gradient buffer)"
                                : "BF16 gradients (--grad-reduce-in-bf16)";
  if (p_.dp_sharding == DpSharding::OptimizerGradients && p_.grad_sync_every_microbatch)
    gnote += fmt::format("; ZeRO-2: the local shard and one {:.0f}M-parameter bucket being reduce-scattered",
                         kGradientBucketParams / 1e6);
  else if (p_.dp_sharding == DpSharding::Full && p_.grad_sync_every_microbatch)
    gnote += "; FSDP: the local shard and one item's unsharded gradients before their reduce-scatter";
  else if (!p_.grad_sync_every_microbatch)
    gnote += "; every gradient unsharded until the last micro-batch's synchronisation";
  else
    gnote += "; every parameter held by the rank";
  d.statics.push_back({"gradients", mem.gradients_bytes, mem.gradients_bytes / gb, gb, gnote});
  const double ob = adam_state_bytes_per_param(p_);
  std::string onote = fmt::format(
      "Adam: master weight {:g} + exp_avg {:g} + exp_avg_sq {:g} B/param (Rajbhandari et al. 2020: 12 B with FP32 "
      "states); ",
      p_.main_params_bytes, p_.exp_avg_bytes, p_.exp_avg_sq_bytes);
  onote += p_.distributed_optimizer
               ? fmt::format("distributed optimizer: dense parameters / (DP x CP = {}), experts / EDP = {}",
                             p_.dp * p_.cp, lay_.edp)
               : std::string("not sharded (no distributed optimizer)");
  if (p_.swap_optimizer)
    onote += fmt::format("; swapped to host memory but one {:.0f}M-parameter bucket", kGradientBucketParams / 1e6);
  d.statics.push_back({"optimizer states", mem.optimizer_bytes, mem.optimizer_bytes / ob, ob, onote});
  d.statics.push_back(
      {"activations", mem.activations_bytes, 0, 0,
       fmt::format("the items above: {} micro-batch chunks in flight at the peak walked along the schedule{}",
                   mem.peak_inflight, d.swapped_activation_bytes > 0 ? ", less what is swapped to host" : "")});
  d.statics.push_back({"transient", mem.transient_bytes, 0, 0, "the largest working buffer of one operator: " + d.transient_source});
  d.statics.push_back({"runtime reserve", mem.reserved_bytes, 0, 0,
                       "the device preset's memory_reserved: runtime context, communication buffers, allocator "
                       "fragmentation"});
  d.total_bytes = mem.total();
  out_.memory_detail = std::move(d);
}

/// p2p transfer time between consecutive virtual stages.
void Lowering::p2p_times() {
  const int V = p_.virtual_stages();
  const double bytes = static_cast<double>(m_.hidden) * models::kActivationBytes * tok_.Tseq;
  p2p_seconds_.assign(V, 0.0);
  for (int v = 0; v + 1 < V; ++v) {
    const int s0 = stage_of_virtual(p_.schedule, p_.pp, v), s1 = stage_of_virtual(p_.schedule, p_.pp, v + 1);
    if (s0 == s1 || (bidirectional(p_.schedule) && v == p_.pp - 1)) continue;  // DualPipe: two pipelines
    const auto r = topo_.route(s0 * lay_.block, s1 * lay_.block);
    p2p_seconds_[v] = topologies::p2p_time(bytes, r).value();
  }
}

Lowered Lowering::run() {
  out_.schedule = make_schedule(p_.schedule, p_.pp, p_.vpp, p_.num_microbatches);
  out_.layers_per_virtual_stage = partition_items();
  net_.clear_uses();
  const std::vector<std::vector<int>> vs_items = virtual_stage_items(p_, out_.layers_per_virtual_stage, w_.items.size());
  build_ranks(s_.simulation.fidelity);
  build_stage_programs(vs_items);
  adapt_schedule();
  stage_memories();
  if (memory_detail_) memory_detail();
  p2p_times();

  std::optional<DocumentWork> docs;
  if (s_.training.documents.packed) {
    docs = sample_documents(s_.training.documents, p_.dp, p_.num_microbatches, p_.mbs, s_.training.seq_length, s_.seed);
    out_.attention_work_max_over_mean = docs->max_over_mean;
    out_.attention_work_mean = docs->mean;
  }
  const EmitInputs in{s_,         p_,           lay_,         topo_,     w_,
                      cm_,        simulated_,   out_.ranks,   out_.stages, out_.schedule,
                      p2p_seconds_, docs ? &*docs : nullptr, &routing_, net_, cancel_,
                      stragglers_.active || (stragglers_.slow_devices + stragglers_.slow_nics > 0 &&
                                             s_.simulation.fidelity == Fidelity::Full)
                          ? &stragglers_
                          : nullptr};
  out_.stragglers = static_cast<const StragglerInfo&>(stragglers_);
  const EmitResult emitted = emit_step(in, programs_, builder_);
  out_.optimizer_seconds = emitted.optimizer_seconds;
  if (m_.is_moe()) out_.expert_load = routing_.expert_load(w_.items, simulated_.skewed);
  out_.expert_load.migration_seconds = emitted.migration_seconds;

  // Executed FLOPs per simulated rank.
  out_.executed_flops.resize(out_.ranks.size());
  for (std::size_t i = 0; i < out_.ranks.size(); ++i) out_.executed_flops[i] = stage_flops_[out_.ranks[i].stage];
  out_.collectives = std::move(net_.uses());
  out_.graph = std::move(builder_).build();
  return std::move(out_);
}

}  // namespace
}  // namespace lowering

Lowered lower(const Scenario& s, const topologies::Topology& topo, const models::Workload& w,
              const CancelFlag* cancel, bool memory_detail) {
  return lowering::Lowering(s, topo, w, cancel, memory_detail).run();
}

}  // namespace moesim::strategies
