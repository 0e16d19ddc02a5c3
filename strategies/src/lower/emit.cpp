#include "emit.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>

#include "layer.hpp"
#include "moesim/sim/progress.hpp"
#include "moesim/strategies/lower/memory.hpp"

namespace moesim::strategies::lowering {

using topologies::Collective;

void StagePrograms::resize(int pp, int vpp) {
  fwd.assign(pp, std::vector<Program>(vpp));
  bwd.assign(pp, std::vector<Program>(vpp));
  wgt.assign(pp, std::vector<Program>(vpp));
  bwd_full.assign(pp, std::vector<Program>(vpp));
  act.assign(pp, std::vector<double>(vpp, 0.0));
  item_params.assign(pp, std::vector<std::vector<std::pair<double, double>>>(vpp));
}

namespace {

class Emitter {
 public:
  Emitter(const EmitInputs& in, StagePrograms& programs, sim::TaskGraphBuilder& builder);
  EmitResult run();

 private:
  using TaskLists = std::vector<std::vector<sim::TaskId>>;  ///< per simulated position of a stage
  /// Bookkeeping of one stage while its passes are emitted.
  struct StageState {
    int stage = 0;
    std::vector<std::vector<TaskLists>> item_gather;  ///< [chunk][item]: parameter gathers per position
    std::vector<int> last_bwd_mb;                     ///< per chunk: micro-batch of the last gradient pass
    std::vector<bool> first_fwd_seen;                 ///< per chunk
    std::vector<int> first_fwd_mb;                    ///< per chunk: micro-batch of the first forward
  };

  /// A pass merged for fast fidelity: its detailed program and where its parts went.
  struct FastPass {
    Program detail;
    Tick compute = 0;                        ///< compute-stream ticks
    std::array<Tick, kNumCats> comm{};       ///< communication ticks by category
    std::array<int, kNumCats> hidden{}, exposed{};  ///< merged step of each part
  };
  void merge_fast_programs();
  void merge_fast(Program& prog, const char* pass, int chunk);
  static void set_exposure(Program& merged, const FastPass& info, Tick exposed);
  const std::pair<Program, Program>& fast_pair(const Program& a, const Program& b, bool balance);
  [[nodiscard]] int rank_index(int stage, int pos) const { return stage * per_stage_ + pos; }
  [[nodiscard]] std::size_t slot(int stage, int pos, int mb, int chunk, Phase ph) const {
    return ((((static_cast<std::size_t>(stage) * per_stage_ + pos) * m_ + mb) * vpp_ + chunk) * 3) +
           static_cast<std::size_t>(ph);
  }
  [[nodiscard]] bool group_simulated(GroupKind g, int local) const;
  [[nodiscard]] bool shared_group(GroupKind g, int local) const;
  void resources_for(const Step& st, int stage, int pos, bool shared, std::vector<sim::ResourceId>& out) const;
  [[nodiscard]] sim::ResourceId stream_of(int stage, int pos, Stream s) const {
    return in_.ranks[rank_index(stage, pos)].streams[static_cast<int>(s)];
  }
  Tick step_duration(const Step& st, int stage, int mb, int q);
  Tick straggled(Tick d, const Step& st, int stage, int q);
  double group_nic(int stage, GroupKind g, int local);
  std::unordered_map<long long, double> group_nic_;  ///< (stage, kind, group) -> weakest NIC share
  void instantiate_step(const Program& prog, std::size_t i, int stage, int mb, std::vector<sim::TaskId>& tasks_out);
  void instantiate(const Program& prog, int stage, int mb, std::vector<sim::TaskId>& tasks_out);
  void instantiate_pair(const Program& a, int mb_a, std::vector<sim::TaskId>& out_a, const Program& b, int mb_b,
                        std::vector<sim::TaskId>& out_b, int stage, bool balance);
  /// `whole`: one collective for all the parameters (an FSDP unit), not 40M-parameter buckets.
  TaskLists emit_dp(int stage, double params_dense, double params_expert, bool gather, const std::string& label,
                    Stream stream = Stream::Dp, bool whole = false);
  const Program& program_of(int stage, const PipeOp& op) const;
  void emit_stage(int stage);
  void finish_op(StageState& ss, const PipeOp& op, const Program& prog, const std::vector<sim::TaskId>& tasks,
                 bool fused = false);
  void link_pass(int stage, int pos, const PipeOp& op, bool fused);
  void swap_activations(int stage, int pos, const PipeOp& op);
  void reduce_item_gradients(StageState& ss, const PipeOp& op, const Program& prog, const std::vector<sim::TaskId>& tasks);
  void sharded_parameters(const StageState& ss, const PipeOp& op, const Program& prog,
                          const std::vector<sim::TaskId>& tasks);
  void offloaded_weights(const StageState& ss, const PipeOp& op, const Program& prog,
                         const std::vector<sim::TaskId>& tasks);
  template <class Make>
  void feed_items(const PipeOp& op, const Program& prog, const std::vector<sim::TaskId>& tasks, int n, Make&& make);
  void emit_sends();
  void emit_step_end(int stage);
  std::vector<sim::TaskId> emit_optimizer(int stage, double shard);

  const EmitInputs& in_;
  const Plan& p_;
  const Layout& lay_;
  StagePrograms& pr_;
  sim::TaskGraphBuilder& builder_;
  int pp_, vpp_, m_, per_stage_;
  std::size_t ops_emitted_ = 0;  ///< schedule passes emitted so far (progress)
  Tick launch_ticks_;
  /// Per program: what its launches add to it timed alone (see host_extra()).
  std::unordered_map<const Program*, Tick> host_extra_;
  std::unordered_map<const Program*, FastPass> fast_;  ///< fast fidelity: merged pass -> its parts
  std::map<std::tuple<const Program*, const Program*, bool>, std::pair<Program, Program>> fast_pairs_;
  Tick host_extra(const Program& prog);              ///< cached by program
  Tick host_extra_alone(const Program& prog) const;  ///< computed
  double swap_seconds_ = 0;  ///< seconds per byte of a chunk's activations swapped one way (0: none)
  double host_bw_ = 0;
  Phase grads_done_ = Phase::Backward;
  sim::LabelId launch_label_ = 0, sync_label_ = 0;
  std::vector<sim::TaskId> first_, last_;  ///< first/last task of each (stage, position, mb, chunk, phase)
  std::vector<sim::ResourceId> res_;
  std::vector<sim::TaskId> group_task_;    ///< group-shared tasks of the current step, per group
  std::vector<std::vector<sim::TaskId>> dp_tasks_;  ///< per rank: what the optimizer waits for
  std::vector<sim::TaskId> tasks_, tasks2_;
  EmitResult out_;
};

Emitter::Emitter(const EmitInputs& in, StagePrograms& programs, sim::TaskGraphBuilder& builder)
    : in_(in), p_(in.plan), lay_(in.layout), pr_(programs), builder_(builder) {
  pp_ = p_.pp;
  vpp_ = p_.vpp;
  m_ = p_.num_microbatches;
  per_stage_ = static_cast<int>(in.simulated.locals.size());
  launch_ticks_ = to_ticks(Seconds{in.scenario.simulation.launch_overhead});
  host_bw_ = in.scenario.cluster.device.host_bandwidth.value();
  swap_seconds_ = p_.swap_activations > 0 && host_bw_ > 0 ? p_.swap_activations / host_bw_ : 0.0;
  // With separate weight-gradient passes, a micro-batch's gradients are complete after its W.
  grads_done_ = splits_weight_gradients(p_.schedule) ? Phase::WeightGrad : Phase::Backward;
}

// Fast fidelity: each pass becomes a handful of tasks that reproduce the pass timed alone
// (time_alone, the screen's number): its compute as one task per category, and its
// communication split into the part the pass's own compute hides (run beside it) and the part
// it exposes (after it), in proportion to each category's share. Forward-backward pairs are
// re-timed from their detailed programs (fast_pair). With host dispatch, what the host thread
// adds to the pass timed alone is the pass's first task (breakdown: host-bound).
void Emitter::merge_fast_programs() {
  for (int stage = 0; stage < pp_; ++stage)
    for (int c = 0; c < vpp_; ++c) {
      merge_fast(pr_.fwd[stage][c], "F", c);
      merge_fast(pr_.bwd[stage][c], "B", c);
      merge_fast(pr_.wgt[stage][c], "W", c);
      merge_fast(pr_.bwd_full[stage][c], "W", c);
    }
}

void Emitter::merge_fast(Program& prog, const char* pass, int c) {
  if (prog.steps.empty()) return;
  // The merged program replaces `prog`: measure it uncached (the cache is keyed by address).
  const Tick host_added = host_extra_alone(prog);
  double compute_s = 0;
  std::array<double, kNumCats> comm_s{};
  const Tick alone = to_ticks(Seconds{time_alone(prog, 0, in_.scenario.simulation.fused_vector_ops, lay_.ep, compute_s, comm_s)});
  std::array<Tick, kNumCats> on_compute{}, on_comm{};
  std::array<GroupKind, kNumCats> grp{};
  std::array<Stream, kNumCats> stream{};
  double flops = 0;
  for (const Step& st : prog.steps) {
    (st.stream == Stream::Compute ? on_compute : on_comm)[st.cat] =
        add_ticks((st.stream == Stream::Compute ? on_compute : on_comm)[st.cat], st.duration);
    if (st.stream != Stream::Compute) {
      grp[st.cat] = st.group;
      stream[st.cat] = st.stream;
    }
    flops += st.flops;
  }
  Tick compute = 0, comm = 0;
  for (int k = 0; k < kNumCats; ++k) {
    compute = add_ticks(compute, on_compute[k]);
    comm = add_ticks(comm, on_comm[k]);
  }
  FastPass info;
  info.detail = std::move(prog);
  info.compute = compute;
  info.comm = on_comm;
  Program merged;
  auto add = [&](Tick d, int cat, Stream s, GroupKind g, const char* what, int dep0, int dep1) {
    Step st;
    st.duration = d;
    st.cat = static_cast<sim::Category>(cat);
    st.stream = s;
    st.group = g;
    st.label = builder_.label(std::string(pass) + ".chunk" + std::to_string(c) + "." + what);
    st.dep0 = dep0;
    st.dep1 = dep1;
    merged.steps.push_back(st);
    return static_cast<int>(merged.steps.size()) - 1;
  };
  // Entry: the host's share (or nothing), which everything else waits for.
  const int entry = add(host_added, host_added > 0 ? kLaunch : kCompute, Stream::Compute, GroupKind::None,
                        host_added > 0 ? "host_bound" : "begin", -1, -1);
  // The hidden parts come first in program order, so that a pair issues them at its start.
  int hidden = entry;
  for (int k = 0; k < kNumCats; ++k)
    if (on_comm[k] > 0) {
      info.hidden[k] = add(0, k, stream[k], grp[k], (category_names()[k] + ".hidden").c_str(), hidden, -1);
      hidden = info.hidden[k];
    }
  // Compute: the recomputation first (a backward recomputes before it differentiates), then
  // one task per item in the order the pass runs them (an item's gradients are ready for their
  // reduction, or its parameters needed from their gather, at its own task), then what else
  // runs on the compute stream.
  int chain = entry;
  if (on_compute[kRecompute] > 0)
    chain = add(on_compute[kRecompute], kRecompute, Stream::Compute, GroupKind::None, "recompute", chain, -1);
  const std::vector<int>& ends = info.detail.item_end;
  std::vector<int> run_order;  // items with steps, by their last step
  for (int k = 0; k < static_cast<int>(ends.size()); ++k)
    if (ends[k] >= 0) run_order.push_back(k);
  std::sort(run_order.begin(), run_order.end(), [&](int x, int y) { return ends[x] < ends[y]; });
  std::vector<Tick> item_compute(run_order.size(), 0);
  std::vector<double> item_flops(run_order.size(), 0.0);
  for (std::size_t i = 0, r = 0; i < info.detail.steps.size(); ++i) {
    while (r + 1 < run_order.size() && static_cast<int>(i) > ends[run_order[r]]) ++r;
    const Step& st = info.detail.steps[i];
    if (run_order.empty() || st.stream != Stream::Compute || st.cat != kCompute) continue;
    item_compute[r] = add_ticks(item_compute[r], st.duration);
    item_flops[r] += st.flops;
  }
  merged.item_end.assign(ends.size(), -1);
  for (std::size_t r = 0; r < run_order.size(); ++r) {
    chain = add(item_compute[r], kCompute, Stream::Compute, GroupKind::None, "compute", chain, -1);
    merged.steps[chain].flops = item_flops[r];
    merged.item_end[run_order[r]] = chain;
  }
  if (run_order.empty() && on_compute[kCompute] > 0) {
    chain = add(on_compute[kCompute], kCompute, Stream::Compute, GroupKind::None, "compute", chain, -1);
    merged.steps[chain].flops = flops;
  }
  for (int k = 0; k < kNumCats; ++k)
    if (k != kCompute && k != kRecompute && on_compute[k] > 0)
      chain = add(on_compute[k], k, Stream::Compute, GroupKind::None, category_names()[k].c_str(), chain, -1);
  for (int k = 0; k < kNumCats; ++k)
    if (on_comm[k] > 0) {
      info.exposed[k] = add(0, k, stream[k], grp[k], category_names()[k].c_str(), chain, -1);
      chain = info.exposed[k];
    }
  merged.chain_end = add(0, kCompute, Stream::Compute, GroupKind::None, "end", chain, hidden);
  // The pass alone: what its compute does not cover of `alone` is exposed.
  set_exposure(merged, info, std::clamp<Tick>(alone - compute, 0, comm));
  prog = std::move(merged);
  fast_.emplace(&prog, std::move(info));
}

// Splits each communication category of a merged pass into exposed (x of the pass's total, in
// proportion) and hidden parts.
void Emitter::set_exposure(Program& merged, const FastPass& info, Tick x) {
  Tick total = 0;
  for (Tick t : info.comm) total = add_ticks(total, t);
  const Tick want = std::clamp<Tick>(x, 0, total);
  Tick left = want;
  int last = -1;
  for (int k = 0; k < kNumCats; ++k)
    if (info.comm[k] > 0) last = k;
  for (int k = 0; k < kNumCats; ++k) {
    if (info.comm[k] <= 0) continue;
    const double share = static_cast<double>(want) * static_cast<double>(info.comm[k]) / static_cast<double>(total);
    const Tick e = std::min(info.comm[k], k == last ? left : std::min<Tick>(left, static_cast<Tick>(std::llround(share))));
    left -= e;
    merged.steps[info.exposed[k]].duration = e;
    merged.steps[info.hidden[k]].duration = info.comm[k] - e;
  }
}

// A forward-backward pair at fast fidelity: the pair's detailed programs co-scheduled (as the
// screen and the detailed fidelities issue them) give its length; the merged backward hides all
// its communication and the forward exposes what the two computes do not cover.
const std::pair<Program, Program>& Emitter::fast_pair(const Program& a, const Program& b, bool balance) {
  const auto key = std::make_tuple(&a, &b, balance);
  auto it = fast_pairs_.find(key);
  if (it != fast_pairs_.end()) return it->second;
  const FastPass& ia = fast_.at(&a);
  const FastPass& ib = fast_.at(&b);
  const Tick pair = co_schedule(ia.detail, ib.detail, balance, [](bool, std::size_t) {});
  Program pa = a, pb = b;
  set_exposure(pa, ia, 0);
  set_exposure(pb, ib, std::max<Tick>(0, pair - ia.compute - ib.compute));
  return fast_pairs_.emplace(key, std::make_pair(std::move(pa), std::move(pb))).first->second;
}

bool Emitter::group_simulated(GroupKind g, int local) const {
  for (int l : lay_.members(g, local))
    if (in_.simulated.pos_of_local[l] < 0) return false;
  return true;
}

// A task runs on its stream; a collective at full fidelity holds the streams of all its
// members, so it starts when the last member reaches it. Collectives do not hold link
// resources: exclusive first-come-first-served links would serialise what the network
// shares, and would break the symmetry of identical ranks. Bandwidth sharing between
// concurrent collectives is the flow-level network model's job.
// A collective is one task for all its members when they are all simulated (it starts when
// the last one reaches it); otherwise each simulated member runs its own copy.
// With stragglers, the simulated members of a group stand for it all (the unsimulated ones are
// like its clean simulated member): a group with two or more of them shares its collectives.
bool Emitter::shared_group(GroupKind g, int local) const {
  if (g == GroupKind::None || lay_.members(g, local).size() <= 1) return false;
  if (in_.stragglers == nullptr) return group_simulated(g, local);
  int simulated = 0;
  for (int l : lay_.members(g, local)) simulated += in_.simulated.pos_of_local[l] >= 0;
  return simulated >= 2;
}

// The share of the bandwidth left to a stage's group whose weakest NIC is slow (1: none).
double Emitter::group_nic(int stage, GroupKind g, int local) {
  if (in_.stragglers == nullptr || in_.stragglers->slow_nics == 0 || g == GroupKind::None) return 1.0;
  const long long key = (static_cast<long long>(stage) * kNumGroupKinds + static_cast<int>(g)) * lay_.block +
                        lay_.group_index(g, local);
  auto it = group_nic_.find(key);
  if (it != group_nic_.end()) return it->second;
  double f = 1.0;
  for (int l : lay_.members(g, local))
    f = std::min(f, in_.stragglers->nic[static_cast<std::size_t>(stage) * lay_.block + l]);
  return group_nic_.emplace(key, f).first->second;
}

void Emitter::resources_for(const Step& st, int stage, int q, bool shared, std::vector<sim::ResourceId>& out) const {
  out.clear();
  if (!shared) {
    out.push_back(stream_of(stage, q, st.stream));
    return;
  }
  for (int l : lay_.members(st.group, in_.simulated.locals[q]))
    if (const int pos = in_.simulated.pos_of_local[l]; pos >= 0) out.push_back(stream_of(stage, pos, st.stream));
}

Tick Emitter::step_duration(const Step& st, int stage, int mb, int q) {
  const int local = in_.simulated.locals[q];
  Tick d = st.duration;
  if (st.role == Role::Attention) {
    const int dp_i = local / (p_.tp * p_.cp);
    d = scale_ticks(st.duration, in_.documents->factor[dp_i][mb]);
  } else if (in_.simulated.skewed && st.role != Role::None) {
    d = in_.routing->routed_duration(st, mb, local);
  }
  return straggled(d, st, stage, q);
}

// A slow device's kernels take longer; a collective leaving the server runs at the bandwidth
// its group's weakest NIC has left (the ring or all-to-all waits for its slowest link).
Tick Emitter::straggled(Tick d, const Step& st, int stage, int q) {
  if (in_.stragglers == nullptr) return d;
  const int local = in_.simulated.locals[q];
  if (st.stream == Stream::Compute)
    return scale_ticks(d, in_.stragglers->compute[static_cast<std::size_t>(stage) * lay_.block + local]);
  if ((in_.ranks[rank_index(stage, q)].scale_out_streams >> static_cast<int>(st.stream) & 1) == 0) return d;
  const double f = group_nic(stage, st.group, local);
  return f < 1.0 ? scale_ticks(d, 1.0 / f) : d;
}

// What host dispatch adds to a pass timed alone (0 without host dispatch). Fast fidelity adds it
// as one task; the detailed fidelities simulate host dispatch (a launch task gating every kernel,
// a sync before each dispatch) only for passes where it is positive: a pass whose kernels outlast
// their launches keeps the host ahead, and its launch tasks would only double the graph (the
// 718B's: 337k -> 625k tasks for the same step).
Tick Emitter::host_extra(const Program& prog) {
  if (launch_ticks_ <= 0) return 0;
  auto it = host_extra_.find(&prog);
  if (it != host_extra_.end()) return it->second;
  return host_extra_.emplace(&prog, host_extra_alone(prog)).first->second;
}

Tick Emitter::host_extra_alone(const Program& prog) const {
  if (launch_ticks_ <= 0) return 0;
  const bool fused = in_.scenario.simulation.fused_vector_ops;
  double unused = 0;
  std::array<double, kNumCats> unused_comm{};
  const double with_host = time_alone(prog, launch_ticks_, fused, lay_.ep, unused, unused_comm);
  const double alone = time_alone(prog, 0, fused, lay_.ep, unused, unused_comm);
  return std::max<Tick>(0, to_ticks(Seconds{with_host}) - to_ticks(Seconds{alone}));
}

// One step of a program for every simulated rank of the stage (tasks_out[step][rank]).
void Emitter::instantiate_step(const Program& prog, std::size_t i, int stage, int mb,
                               std::vector<sim::TaskId>& tasks_out) {
  const Step& st = prog.steps[i];
  // Whether the group is shared is the same for every rank of a stage, except with stragglers
  // (then it depends on how many of the rank's group are simulated).
  bool any_shared = false;
  for (int q = 0; q < (in_.stragglers != nullptr ? per_stage_ : 1); ++q)
    any_shared = any_shared || shared_group(st.group, in_.simulated.locals[q]);
  if (any_shared) std::fill(group_task_.begin(), group_task_.end(), sim::kNoTask);
  // The same for every rank of the stage.
  const bool dispatch = host_extra(prog) > 0;
  const Tick host = dispatch ? host_ticks(st, launch_ticks_, in_.scenario.simulation.fused_vector_ops, lay_.ep) : 0;
  for (int q = 0; q < per_stage_; ++q) {
    const int local = in_.simulated.locals[q];
    const Tick dur = step_duration(st, stage, mb, q);
    const bool shared = any_shared && (in_.stragglers == nullptr || shared_group(st.group, local));
    sim::TaskId t;
    if (shared) {
      const int g = lay_.group_index(st.group, local);
      if (group_task_[g] == sim::kNoTask) {
        resources_for(st, stage, q, true, res_);
        group_task_[g] = builder_.add_task(dur, st.cat, st.label, mb, res_);
      }
      t = group_task_[g];
    } else {
      resources_for(st, stage, q, false, res_);
      t = builder_.add_task(dur, st.cat, st.label, mb, res_);
    }
    tasks_out[i * per_stage_ + q] = t;
    // Host dispatch: the host thread issues every kernel in program order; a kernel cannot
    // start before its launch.
    if (host > 0) {
      const sim::TaskId ln = builder_.add_task(host, kLaunch, launch_label_, mb, {stream_of(stage, q, Stream::Launch)});
      builder_.depend(ln, t);
    }
    // A dropless dispatch all-to-all(v) needs the tokens per expert on the host (Megatron's
    // alltoall dispatcher copies them to the CPU): the host thread waits for the router's
    // result before it can issue anything further, so it cannot run ahead past it.
    if (dispatch && st.host_sync && (st.dep0 >= 0 || st.dep1 >= 0)) {
      const sim::TaskId sync =
          builder_.add_task(launch_ticks_, kLaunch, sync_label_, mb, {stream_of(stage, q, Stream::Launch)});
      if (st.dep0 >= 0) builder_.depend(tasks_out[st.dep0 * per_stage_ + q], sync);
      if (st.dep1 >= 0) builder_.depend(tasks_out[st.dep1 * per_stage_ + q], sync);
      builder_.depend(sync, t);
    }
    if (st.dep0 >= 0) builder_.depend(tasks_out[st.dep0 * per_stage_ + q], t);
    if (st.dep1 >= 0) builder_.depend(tasks_out[st.dep1 * per_stage_ + q], t);
  }
}

// Instantiate one program for every simulated rank of a stage; fills tasks_out[step][rank].
void Emitter::instantiate(const Program& prog, int stage, int mb, std::vector<sim::TaskId>& tasks_out) {
  tasks_out.assign(prog.steps.size() * per_stage_, sim::kNoTask);
  for (std::size_t i = 0; i < prog.steps.size(); ++i) instantiate_step(prog, i, stage, mb, tasks_out);
}

// Forward-backward overlap (MindSpeed --moe-fb-overlap, DualPipe's core): a backward and a
// forward of different micro-batches are issued as one interleaved stream of work, in the order
// co_schedule gives (program.hpp) — the forward fills the compute stream while the backward
// waits for its all-to-all, and the other way round. Tasks of a stream run in issue order.
void Emitter::instantiate_pair(const Program& a, int mb_a, std::vector<sim::TaskId>& out_a, const Program& b, int mb_b,
                               std::vector<sim::TaskId>& out_b, int stage, bool balance) {
  out_a.assign(a.steps.size() * per_stage_, sim::kNoTask);
  out_b.assign(b.steps.size() * per_stage_, sim::kNoTask);
  if (!fast_.empty()) {  // fast fidelity: the same steps, re-timed for the pair
    const auto& programs = fast_pair(a, b, balance);
    const auto& fa = std::get<0>(programs);  // (clang 14 cannot capture a structured binding)
    const auto& fb = std::get<1>(programs);
    (void)co_schedule(fa, fb, balance, [&](bool from_a, std::size_t k) {
      instantiate_step(from_a ? fa : fb, k, stage, from_a ? mb_a : mb_b, from_a ? out_a : out_b);
    });
    return;
  }
  // Balancing (`balance`) measured: it makes DualPipeV's 718B step 11.00 -> 10.66 s but the
  // small two-stage fb-overlap test 0.055 -> 0.068 s, so moe_fb_overlap in 1F1B does not.
  (void)co_schedule(a, b, balance, [&](bool from_a, std::size_t k) {
    instantiate_step(from_a ? a : b, k, stage, from_a ? mb_a : mb_b, from_a ? out_a : out_b);
  });
}

// Emits the data-parallel collectives for `params_dense` / `params_expert` parameters of a
// stage, split into buckets (Megatron's default bucket size); returns the tasks created for
// each rank of the stage.
Emitter::TaskLists Emitter::emit_dp(int stage, double params_dense, double params_expert, bool gather,
                                    const std::string& label, Stream stream, bool whole) {
  TaskLists created(per_stage_);
  // BF16 (or FP8) parameters; FP32 gradients (Megatron's default for BF16) unless grad_reduce_in_bf16.
  const double bytes_per_param = gather ? param_gather_bytes_per_param(p_) : grad_bytes_per_param(p_);
  const Collective op =
      gather ? Collective::AllGather : (p_.distributed_optimizer ? Collective::ReduceScatter : Collective::AllReduce);
  for (auto [params, g] : {std::pair{params_dense, GroupKind::Dp}, std::pair{params_expert, GroupKind::Edp}}) {
    if (params <= 0 || in_.net.shape(g).size <= 1) continue;
    const int group = in_.net.shape(g).size;
    const int buckets = whole ? 1 : std::max(1, static_cast<int>(std::ceil(params / gradient_bucket_params(group))));
    const Step st = in_.net.step(g, op, params / buckets * bytes_per_param, kDpComm, stream,
                                 builder_.label(label + (g == GroupKind::Edp ? ".expert" : "")), buckets);
    if (st.duration == 0) continue;
    bool any_shared = false;
    for (int q = 0; q < (in_.stragglers != nullptr ? per_stage_ : 1); ++q)
      any_shared = any_shared || shared_group(g, in_.simulated.locals[q]);
    for (int bk = 0; bk < buckets; ++bk) {
      if (any_shared) std::fill(group_task_.begin(), group_task_.end(), sim::kNoTask);
      for (int q = 0; q < per_stage_; ++q) {
        sim::TaskId t = sim::kNoTask;
        const bool shared = any_shared && (in_.stragglers == nullptr || shared_group(g, in_.simulated.locals[q]));
        const int gi = shared ? lay_.group_index(g, in_.simulated.locals[q]) : 0;
        if (!shared || group_task_[gi] == sim::kNoTask) {
          resources_for(st, stage, q, shared, res_);
          t = builder_.add_task(straggled(st.duration, st, stage, q), st.cat, st.label, -1, res_);
          if (shared) group_task_[gi] = t;
        } else {
          t = group_task_[gi];
        }
        created[q].push_back(t);
      }
    }
  }
  return created;
}

const Program& Emitter::program_of(int stage, const PipeOp& op) const {
  return op.phase == Phase::Forward    ? pr_.fwd[stage][op.chunk]
         : op.phase == Phase::Backward ? pr_.bwd[stage][op.chunk]
                                       : pr_.wgt[stage][op.chunk];
}

// A pass's order constraints inside the stage: backward after the chunk's own forward (the loss
// on the last stage), W after the output gradients B received.
void Emitter::link_pass(int stage, int l, const PipeOp& op, bool fused) {
  const std::size_t sl = slot(stage, l, op.microbatch, op.chunk, op.phase);
  if (op.phase == Phase::Backward) builder_.depend(last_[slot(stage, l, op.microbatch, op.chunk, Phase::Forward)], first_[sl]);
  if (op.phase == Phase::WeightGrad && !fused) {
    const sim::TaskId b = last_[slot(stage, l, op.microbatch, op.chunk, Phase::Backward)];
    builder_.depend(b != sim::kNoTask ? b : last_[slot(stage, l, op.microbatch, op.chunk, Phase::Forward)], first_[sl]);
  }
}

// Activation swapping: after the forward a share of the chunk's saved activations goes to host
// memory; the backward waits for it to come back. Copies out and in queue on two host streams
// (the link is full duplex), each in issue order.
void Emitter::swap_activations(int stage, int l, const PipeOp& op) {
  if (swap_seconds_ <= 0 || op.phase == Phase::WeightGrad) return;
  const std::size_t sl = slot(stage, l, op.microbatch, op.chunk, op.phase);
  const double secs = swap_seconds_ * pr_.act[stage][op.chunk];
  const bool out = op.phase == Phase::Forward;
  const sim::TaskId copy = builder_.add_task(to_ticks(Seconds{secs}), kSwap, builder_.label(out ? "swap_out" : "swap_in"),
                                             op.microbatch, {stream_of(stage, l, out ? Stream::Host : Stream::HostIn)});
  if (out) {
    builder_.depend(last_[sl], copy);
  } else {
    builder_.depend(last_[slot(stage, l, op.microbatch, op.chunk, Phase::Forward)], copy);
    builder_.depend(copy, first_[sl]);
  }
}

// Overlapped gradient reduction: each item's buckets start once the chunk's last backward has
// produced that item's gradients.
void Emitter::reduce_item_gradients(StageState& ss, const PipeOp& op, const Program& prog,
                                    const std::vector<sim::TaskId>& tasks) {
  const int stage = ss.stage;
  const auto& items = in_.stages[stage].chunk_items[op.chunk];
  for (int k = static_cast<int>(items.size()) - 1; k >= 0; --k) {
    const auto [pd, pe] = pr_.item_params[stage][op.chunk][k];
    auto rs = emit_dp(stage, pd, pe, false, "grad_reduce." + item_prefix(in_.workload.items[items[k]]));
    const int end_step = std::max(0, prog.item_end[k]);
    for (int l = 0; l < per_stage_; ++l)
      for (sim::TaskId t : rs[l]) {
        builder_.depend(tasks[static_cast<std::size_t>(end_step) * per_stage_ + l], t);
        dp_tasks_[rank_index(stage, l)].push_back(t);
      }
  }
}

// Bookkeeping of one instantiated pass: its first and last tasks, its inputs inside the stage,
// parameter gathers before the first forward, gradient reduction after the last. `fused`: the W
// of a backward instantiated whole (B and W in one program, DualPipeV's pairs).
void Emitter::finish_op(StageState& ss, const PipeOp& op, const Program& prog, const std::vector<sim::TaskId>& tasks,
                        bool fused) {
  const int stage = ss.stage;
  int entry = 0;
  while (prog.steps[entry].dep0 >= 0 || prog.steps[entry].dep1 >= 0) ++entry;
  for (int l = 0; l < per_stage_; ++l) {
    const std::size_t sl = slot(stage, l, op.microbatch, op.chunk, op.phase);
    first_[sl] = tasks[static_cast<std::size_t>(entry) * per_stage_ + l];
    last_[sl] = tasks[static_cast<std::size_t>(std::max(0, prog.chain_end)) * per_stage_ + l];
    link_pass(stage, l, op, fused);
    swap_activations(stage, l, op);
    if (op.phase == Phase::Forward && !ss.first_fwd_seen[op.chunk]) {
      const auto& gathers = ss.item_gather[op.chunk];
      for (std::size_t k = 0; k < gathers.size(); ++k) {
        const int begin = k == 0 ? entry : prog.item_end[k - 1] + 1;
        if (begin >= static_cast<int>(prog.steps.size())) continue;
        for (sim::TaskId g : gathers[k][l]) builder_.depend(g, tasks[static_cast<std::size_t>(begin) * per_stage_ + l]);
      }
    }
  }
  if (op.phase == Phase::Forward) ss.first_fwd_seen[op.chunk] = true;
  if (p_.offload_weights && op.phase != Phase::WeightGrad) offloaded_weights(ss, op, prog, tasks);
  if (p_.dp_sharding == DpSharding::Full) {
    sharded_parameters(ss, op, prog, tasks);
  } else if (op.phase == grads_done_ && p_.overlap_grad_reduce && op.microbatch == ss.last_bwd_mb[op.chunk]) {
    reduce_item_gradients(ss, op, prog, tasks);
  }
}

// Weights in host memory: before a forward or backward runs an item, its weights come over the
// host link (the stage's host-to-device stream, behind any swap-ins queued there) into one of
// two buffers — the copy for item k waits until item k - 2 of the same pass has finished with
// its buffer, and item k waits for its copy. The weight gradient pass needs no weights.
void Emitter::offloaded_weights(const StageState& ss, const PipeOp& op, const Program& prog,
                                const std::vector<sim::TaskId>& tasks) {
  const int stage = ss.stage;
  const auto& items = in_.stages[stage].chunk_items[op.chunk];
  const double wb = weight_bytes_per_param(in_.scenario.training.precision, p_);
  feed_items(op, prog, tasks, static_cast<int>(items.size()), [&](int k) {
    TaskLists copies(per_stage_);
    const auto [pd, pe] = pr_.item_params[stage][op.chunk][k];
    const Tick copy_ticks = to_ticks(Seconds{(pd + pe) * wb / host_bw_});
    if (copy_ticks <= 0) return copies;
    const sim::LabelId label = builder_.label("weights_in." + item_prefix(in_.workload.items[items[k]]));
    for (int l = 0; l < per_stage_; ++l)
      copies[l].push_back(builder_.add_task(copy_ticks, kSwap, label, op.microbatch, {stream_of(stage, l, Stream::HostIn)}));
    return copies;
  });
}

// Something an item needs from outside before it runs (its gathered or copied-in weights),
// one item ahead at most: for the items of a pass in the order it runs them (forward 0..n-1,
// backward n-1..0), `make(k)` makes item k's transfers (per simulated position); the item's
// first step waits for them, and they wait for the item two before to finish (two buffers).
template <class Make>
void Emitter::feed_items(const PipeOp& op, const Program& prog, const std::vector<sim::TaskId>& tasks, int n, Make&& make) {
  int entry = 0;
  while (prog.steps[entry].dep0 >= 0 || prog.steps[entry].dep1 >= 0) ++entry;
  const bool forward = op.phase == Phase::Forward;
  for (int j = 0; j < n; ++j) {
    const int k = forward ? j : n - 1 - j;
    const int before = forward ? k - 1 : k + 1;  // the item that runs just before
    const int begin = j == 0 ? entry : prog.item_end[before] + 1;
    if (begin < 0 || begin >= static_cast<int>(prog.steps.size())) continue;
    const TaskLists in = make(k);
    const int two_before = forward ? k - 2 : k + 2;
    for (int l = 0; l < per_stage_; ++l)
      for (sim::TaskId t : in[l]) {
        builder_.depend(t, tasks[static_cast<std::size_t>(begin) * per_stage_ + l]);
        if (j >= 2 && prog.item_end[two_before] >= 0)
          builder_.depend(tasks[static_cast<std::size_t>(prog.item_end[two_before]) * per_stage_ + l], t);
      }
  }
}

// Fully sharded parameters (ZeRO-3, FSDP): every pass gathers each item's weights before the
// item runs — the forward, and the backward again after a reshard — one item ahead of the
// compute at most (the gather of item k waits for item k - 2 to finish: FSDP's prefetch of the
// next layer), and every pass that completes gradients reduce-scatters each item's gradients
// as soon as they are done (each micro-batch: unsharded gradients are not kept). Synchronised
// at the last micro-batch only, each item is gathered once and reduce-scattered once a step.
void Emitter::sharded_parameters(const StageState& ss, const PipeOp& op, const Program& prog,
                                 const std::vector<sim::TaskId>& tasks) {
  const int stage = ss.stage;
  const auto& items = in_.stages[stage].chunk_items[op.chunk];
  const int n = static_cast<int>(items.size());
  const bool forward = op.phase == Phase::Forward;
  // Gradients synchronised at the last micro-batch only: the weights are gathered once, before
  // the first forward, and stay; the gradients are reduce-scattered once, after the last pass.
  const bool every = p_.grad_sync_every_microbatch;
  const bool gather = every ? forward || (op.phase == Phase::Backward && p_.reshard_after_forward)
                            : forward && op.microbatch == ss.first_fwd_mb[op.chunk];
  if (gather)
    feed_items(op, prog, tasks, n, [&](int k) {
      const auto [pd, pe] = pr_.item_params[stage][op.chunk][k];
      return emit_dp(stage, pd, pe, true, "fsdp_gather." + item_prefix(in_.workload.items[items[k]]), Stream::Dp, true);
    });
  if (op.phase != grads_done_ || (!every && op.microbatch != ss.last_bwd_mb[op.chunk])) return;
  for (int k = n - 1; k >= 0; --k) {
    if (prog.item_end[k] < 0) continue;
    const auto [pd, pe] = pr_.item_params[stage][op.chunk][k];
    auto rs = emit_dp(stage, pd, pe, false, "fsdp_reduce." + item_prefix(in_.workload.items[items[k]]),
                      Stream::DpReduce, true);
    for (int l = 0; l < per_stage_; ++l)
      for (sim::TaskId t : rs[l]) {
        builder_.depend(tasks[static_cast<std::size_t>(prog.item_end[k]) * per_stage_ + l], t);
        dp_tasks_[rank_index(stage, l)].push_back(t);
      }
  }
}

void Emitter::emit_stage(int stage) {
  in_.net.set_stage(stage);
  const StageInfo& si = in_.stages[stage];
  StageState ss;
  ss.stage = stage;
  // Distributed optimizer with overlapped parameter gather: the previous step's all-gather of
  // each item's buckets runs ahead, and the first forward of the item waits for its own
  // buckets only (Megatron waits per bucket in a forward pre-hook) — steady state of a
  // periodic step.
  ss.item_gather.resize(vpp_);
  if (p_.distributed_optimizer && p_.overlap_param_gather && p_.dp_sharding != DpSharding::Full) {
    for (int c = 0; c < vpp_; ++c) {
      const auto& items = si.chunk_items[c];
      for (std::size_t k = 0; k < items.size(); ++k) {
        const auto [pd, pe] = pr_.item_params[stage][c][k];
        ss.item_gather[c].push_back(
            emit_dp(stage, pd, pe, true, "param_gather." + item_prefix(in_.workload.items[items[k]])));
      }
    }
  }
  ss.last_bwd_mb.assign(vpp_, -1);
  for (const PipeOp& op : in_.schedule[stage])
    if (op.phase == grads_done_) ss.last_bwd_mb[op.chunk] = op.microbatch;
  ss.first_fwd_seen.assign(vpp_, false);
  ss.first_fwd_mb.assign(vpp_, -1);
  for (const PipeOp& op : in_.schedule[stage])
    if (op.phase == Phase::Forward && ss.first_fwd_mb[op.chunk] < 0) ss.first_fwd_mb[op.chunk] = op.microbatch;

  const auto& order = in_.schedule[stage];
  const bool pairs = pairs_forward_backward(p_.schedule);
  sim::Progress* progress = progress_of(in_.cancel);
  for (std::size_t oi = 0; oi < order.size(); ++oi) {
    throw_if_cancelled(in_.cancel);
    if (progress != nullptr) progress->advance(++ops_emitted_);
    const PipeOp& op = order[oi];
    const Program& prog = program_of(stage, op);
    if (prog.steps.empty()) continue;
    const bool next_is_other_forward = op.phase == Phase::Backward && oi + 1 < order.size() &&
                                       order[oi + 1].phase == Phase::Forward &&
                                       order[oi + 1].microbatch != op.microbatch;
    // DualPipeV: a pair issued as B, F, W of the B's micro-batch and chunk overlaps the
    // forward with the whole backward (B and W), as DeepSeek's overlapped chunk does.
    if (pairs && next_is_other_forward && oi + 2 < order.size() && order[oi + 2].phase == Phase::WeightGrad &&
        order[oi + 2].microbatch == op.microbatch && order[oi + 2].chunk == op.chunk &&
        !program_of(stage, order[oi + 1]).steps.empty()) {
      const PipeOp& next = order[oi + 1];
      const Program& whole = pr_.bwd_full[stage][op.chunk];
      instantiate_pair(whole, op.microbatch, tasks_, program_of(stage, next), next.microbatch, tasks2_, stage, true);
      finish_op(ss, op, whole, tasks_);
      finish_op(ss, next, program_of(stage, next), tasks2_);
      finish_op(ss, order[oi + 2], whole, tasks_, true);
      oi += 2;
      continue;
    }
    // Forward-backward overlap: a backward followed by the forward of another micro-batch
    // (1F1B's steady state) are issued together. The backward's gradient is what the stage
    // waits for; the next forward's input has usually arrived already, so pairing in this
    // order does not hold the forward back.
    if (p_.fb_overlap && next_is_other_forward && !program_of(stage, order[oi + 1]).steps.empty()) {
      const PipeOp& next = order[oi + 1];
      instantiate_pair(prog, op.microbatch, tasks_, program_of(stage, next), next.microbatch, tasks2_, stage, pairs);
      finish_op(ss, op, prog, tasks_);
      finish_op(ss, next, program_of(stage, next), tasks2_);
      ++oi;
      continue;
    }
    instantiate(prog, stage, op.microbatch, tasks_);
    finish_op(ss, op, prog, tasks_);
  }
}

// Cross-stage sends: activations forward, gradients backward.
void Emitter::emit_sends() {
  const int V = pp_ * vpp_;
  std::vector<sim::ResourceId> pres;
  for (int stage = 0; stage < pp_; ++stage) {
    for (const PipeOp& op : in_.schedule[stage]) {
      if (op.phase == Phase::WeightGrad) continue;  // nothing to send
      const int v = virtual_stage(p_.schedule, pp_, stage, op.chunk);
      const bool fwd = op.phase == Phase::Forward;
      const int v_next = fwd ? v + 1 : v - 1;
      if (v_next < 0 || v_next >= V) continue;
      if (bidirectional(p_.schedule) && std::min(v, v_next) == pp_ - 1) continue;  // the two directions do not meet
      const int s_next = stage_of_virtual(p_.schedule, pp_, v_next), c_next = chunk_of_virtual(p_.schedule, pp_, v_next);
      const double secs = fwd ? in_.p2p_seconds[v] : in_.p2p_seconds[v_next];
      for (int l = 0; l < per_stage_; ++l) {
        const sim::TaskId src = last_[slot(stage, l, op.microbatch, op.chunk, op.phase)];
        const sim::TaskId dst = first_[slot(s_next, l, op.microbatch, c_next, op.phase)];
        if (src == sim::kNoTask || dst == sim::kNoTask) continue;
        if (secs <= 0) {
          builder_.depend(src, dst);
          continue;
        }
        const SimRank& a = in_.ranks[rank_index(stage, l)];
        const SimRank& b = in_.ranks[rank_index(s_next, l)];
        pres.clear();
        pres.push_back(a.streams[static_cast<int>(Stream::Pp)]);
        const bool same_node = in_.topo.node_of(a.global_rank) == in_.topo.node_of(b.global_rank);
        pres.push_back(same_node ? a.scaleup_port : a.nic);
        pres.push_back(same_node ? b.scaleup_port : b.nic);
        const sim::TaskId t = builder_.add_task(to_ticks(Seconds{secs}), kPpComm,
                                                builder_.label(fwd ? "send_activation" : "send_gradient"), op.microbatch,
                                                pres);
        builder_.depend(src, t);
        builder_.depend(t, dst);
      }
    }
  }
}

// Adam on the local shard (kOptimizerStepBytesPerParam of memory traffic per parameter), after
// every pass and gradient reduction of the stage; with swapped optimizer states (MindSpeed
// --swap-optimizer) they are fetched before the step, once the stage's last forward has run
// (the fetch overlaps the cooldown backwards); writing them back overlaps the next step's
// forwards and is not charged.
std::vector<sim::TaskId> Emitter::emit_optimizer(int stage, double shard) {
  const Seconds opt_t = in_.cm.memory_bound(Bytes{optimizer_step_bytes_per_param(p_) * shard});
  out_.optimizer_seconds = std::max(out_.optimizer_seconds, opt_t.value());
  std::vector<sim::TaskId> opt(per_stage_);
  for (int l = 0; l < per_stage_; ++l) {
    Step compute_step;  // on the compute stream: a slow device's optimizer is slow too
    opt[l] = builder_.add_task(straggled(to_ticks(opt_t), compute_step, stage, l), kOptimizer,
                               builder_.label("optimizer_step"), -1, {stream_of(stage, l, Stream::Compute)});
    for (int mb = 0; mb < m_; ++mb)
      for (int c = 0; c < vpp_; ++c)
        for (Phase ph : {Phase::Backward, Phase::WeightGrad}) {
          const sim::TaskId t = last_[slot(stage, l, mb, c, ph)];
          if (t != sim::kNoTask) builder_.depend(t, opt[l]);
        }
    for (sim::TaskId t : dp_tasks_[rank_index(stage, l)]) builder_.depend(t, opt[l]);
    if (p_.swap_optimizer && host_bw_ > 0) {
      const Seconds fetch{adam_state_bytes_per_param(p_) * shard / host_bw_};
      const sim::TaskId fetch_task = builder_.add_task(to_ticks(fetch), kSwap, builder_.label("swap_in.optimizer_states"),
                                                       -1, {stream_of(stage, l, Stream::HostIn)});
      // Each chunk's last forward in the stage's order (DualPipe's chunk 0 ends at m/2 - 1).
      std::vector<int> last_fwd_mb(vpp_, -1);
      for (const PipeOp& op : in_.schedule[stage])
        if (op.phase == Phase::Forward) last_fwd_mb[op.chunk] = op.microbatch;
      for (int c = 0; c < vpp_; ++c) {
        if (last_fwd_mb[c] < 0) continue;
        const sim::TaskId f = last_[slot(stage, l, last_fwd_mb[c], c, Phase::Forward)];
        if (f != sim::kNoTask) builder_.depend(f, fetch_task);
      }
      builder_.depend(fetch_task, opt[l]);
    }
  }
  return opt;
}

// End of step: gradient reduction (unless overlapped), optimizer, expert migration, parameter
// all-gather.
void Emitter::emit_step_end(int stage) {
  in_.net.set_stage(stage);
  const StageInfo& si = in_.stages[stage];
  const bool full = p_.dp_sharding == DpSharding::Full;  // reduced and gathered per item and micro-batch
  if (!p_.overlap_grad_reduce && !full) {
    auto rs = emit_dp(stage, si.params_dense, si.params_expert, false, "grad_reduce");
    for (int l = 0; l < per_stage_; ++l)
      for (sim::TaskId t : rs[l]) {
        for (int c = 0; c < vpp_; ++c)
          for (int mb = 0; mb < m_; ++mb)
            for (Phase ph : {Phase::Backward, Phase::WeightGrad}) {
              const sim::TaskId b = last_[slot(stage, l, mb, c, ph)];
              if (b != sim::kNoTask) builder_.depend(b, t);
            }
        dp_tasks_[rank_index(stage, l)].push_back(t);
      }
  }
  const double shard = optimizer_shard_params(p_, lay_.edp, si.params_dense, si.params_expert);
  const std::vector<sim::TaskId> opt = emit_optimizer(stage, shard);
  // Load-aware expert placement: the moved experts' weights and optimizer shards are fetched
  // after the optimizer step (every interval_steps, amortised per step).
  const double mig = in_.simulated.skewed && in_.scenario.placement.rebalance
                         ? in_.routing->migration_seconds(si.chunk_items, in_.workload.items)
                         : 0.0;
  if (mig > 0) {
    out_.migration_seconds = std::max(out_.migration_seconds, mig);
    for (int l = 0; l < per_stage_; ++l) {
      const sim::TaskId t = builder_.add_task(to_ticks(Seconds{mig}), kEpComm, builder_.label("expert_migration"), -1,
                                              {stream_of(stage, l, Stream::Ep)});
      builder_.depend(opt[l], t);
    }
  }
  if (p_.distributed_optimizer && !p_.overlap_param_gather && !full) {
    auto ag = emit_dp(stage, si.params_dense, si.params_expert, true, "param_gather");
    for (int l = 0; l < per_stage_; ++l)
      for (sim::TaskId t : ag[l]) builder_.depend(opt[l], t);
  }
}

EmitResult Emitter::run() {
  if (in_.scenario.simulation.fidelity == Fidelity::Fast) merge_fast_programs();
  const std::size_t slots = static_cast<std::size_t>(pp_) * per_stage_ * m_ * vpp_ * 3;
  first_.assign(slots, sim::kNoTask);
  last_.assign(slots, sim::kNoTask);
  group_task_.assign(static_cast<std::size_t>(lay_.block), sim::kNoTask);
  dp_tasks_.assign(in_.ranks.size(), {});
  launch_label_ = builder_.label("launch");
  sync_label_ = builder_.label("host_sync.tokens_per_expert");
  std::size_t ops = 0;  // progress: the passes of every stage's schedule
  for (const auto& order : in_.schedule) ops += order.size();
  sim::begin_phase(progress_of(in_.cancel), "building the task graph", ops);
  for (int stage = 0; stage < pp_; ++stage) emit_stage(stage);
  emit_sends();
  for (int stage = 0; stage < pp_; ++stage) emit_step_end(stage);
  return out_;
}

}  // namespace

EmitResult emit_step(const EmitInputs& in, StagePrograms& programs, sim::TaskGraphBuilder& builder) {
  return Emitter(in, programs, builder).run();
}

}  // namespace moesim::strategies::lowering
