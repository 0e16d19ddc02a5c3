#pragma once
// The lowering's vocabulary: where a stage's ranks sit (Layout), how many tokens each region
// of a layer holds (Tokens), and operator programs — a layer's forward or backward as a small
// dependency list of steps (Step, Program), built with ProgramBuilder and later instantiated
// as tasks for every simulated rank (emit.cpp) or timed alone (the search screen).

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "moesim/models/workload.hpp"
#include "moesim/sim/task_graph.hpp"
#include "moesim/sim/units.hpp"
#include "moesim/strategies/lower/lower.hpp"

namespace moesim::strategies::lowering {

enum class GroupKind : std::uint8_t { None, Tp, Cp, Ep, Etp, Dp, Edp };
inline constexpr int kNumGroupKinds = 7;
const char* group_name(GroupKind g);

/// Rank layout inside one pipeline stage: local = tp_i + tp * (cp_i + cp * dp_i); the expert
/// layout reuses the same block as etp_i + etp * (ep_i + ep * edp_i) (Megatron's orders
/// tp-cp-dp and etp-ep-edp).
struct Layout {
  int tp = 1, cp = 1, dp = 1, ep = 1, etp = 1, edp = 1, block = 1;
  static Layout of(const Plan& p, bool moe);
  [[nodiscard]] std::vector<int> members(GroupKind g, int local) const;
  /// Index of the group of kind g that `local` belongs to (groups of a kind are disjoint).
  [[nodiscard]] int group_index(GroupKind g, int local) const {
    const auto m = members(g, local);
    return *std::min_element(m.begin(), m.end());
  }
};

struct Tokens {
  double T = 0;     ///< tokens of one micro-batch (mbs x seq)
  double Tc = 0;    ///< per CP rank
  double Tseq = 0;  ///< per rank in the sequence region
  double Texp = 0;  ///< source tokens whose copies reach one rank's experts (Tseq x etp)
  static Tokens of(const Plan& p, long long seq_length, int etp);
};

/// Steps whose duration follows the routing (per rank, micro-batch and layer).
enum class Role : std::uint8_t {
  None,
  ExpertFwd,     ///< routed-expert GEMM / activation forward (also when recomputed)
  ExpertDgrad,   ///< data gradient (activation: its backward)
  ExpertWgrad,   ///< weight gradient
  ToExperts,     ///< all-to-all carrying token copies to the experts' ranks
  FromExperts,   ///< all-to-all carrying expert outputs back
  Attention,     ///< attention core: scales with the documents packed in the micro-batch
};

struct Step {
  Tick duration = 0;
  sim::Category cat = kCompute;
  Stream stream = Stream::Compute;
  GroupKind group = GroupKind::None;
  sim::LabelId label = 0;
  int dep0 = -1;  ///< earlier step of the same program, or -1: the program's input
  int dep1 = -1;
  double flops = 0;
  Role role = Role::None;
  std::int16_t moe_layer = -1;      ///< MoE layer ordinal for routing-dependent steps
  const models::Op* op = nullptr;   ///< the expert operator, for routing-dependent steps
  bool wgrad = false;               ///< a weight-gradient GEMM (a W pass of its own in zero-bubble schedules)
  /// The host waits for this step's inputs before issuing it: an all-to-all carrying tokens to
  /// the experts in a dropless MoE, whose sizes come from the router's token counts on the GPU
  /// (Megatron copies them to the CPU before the forward dispatch). moesim also charges the
  /// backward's (the combine's gradient), which Megatron issues with the forward's sizes: see
  /// docs/NOTES.md, "Dropless MoE", for why it stays.
  bool host_sync = false;
  /// A routing-dependent step that is one piece of a collective (a chunk's phase under Adaptive
  /// Pipe Overlap): its share of the whole collective's duration, applied to the routed one.
  float part = 1.0f;
};

struct Program {
  std::vector<Step> steps;
  int chain_end = -1;           ///< step producing the program's output
  std::vector<int> item_end;    ///< per item: its last step (for gradient-bucket hooks)
};

/// Builds a program as a chain (the current tensor) with side branches that rejoin it.
struct ProgramBuilder {
  Program& p;
  int chain = -1;         ///< step producing the current tensor
  int prev_chain = -1;    ///< chain before the last chained step
  int pending = -1;       ///< extra dependency of the next chained step
  int overlap_next = -1;  ///< communication overlapped with the next GEMM (joins after it)
  int add(Step s, int d0, int d1) {
    s.dep0 = d0;
    s.dep1 = d1;
    p.steps.push_back(s);
    return static_cast<int>(p.steps.size()) - 1;
  }
  int chained(Step s) {
    if (s.duration == 0 && s.stream != Stream::Compute) return chain;  // nothing to wait for
    const int i = add(s, chain, pending);
    pending = -1;
    prev_chain = chain;
    chain = i;
    return i;
  }
  /// The next chained step also waits for `step` (a zero-length join when two are pending).
  void join(int step);
  /// An overlapped collective not consumed by a GEMM is simply waited for.
  void flush_overlap() {
    join(overlap_next);
    overlap_next = -1;
  }
  /// Ends the program: a last pending step (a weight gradient) is joined with a zero-length
  /// step labelled `end_label`; the chain's end becomes the program's output.
  void finish(sim::TaskGraphBuilder& labels, const std::string& end_label);
};

/// Appends `src` to `dst`; src's entry steps wait for dst's output.
void append_program(Program& dst, const Program& src);
/// Gives the program a single entry step (a zero-length marker labelled `begin_label` when
/// several steps would otherwise wait only for the program's input).
void finalize_program(Program& p, sim::TaskGraphBuilder& labels);
/// Moves the weight-gradient steps of a backward program into a W program of their own,
/// leaving zero-length markers (the data-gradient chain no longer waits for them).
void split_weight_gradients(Program& B, Program& W);
/// Two programs run together on one stage's streams, as forward-backward overlap issues them
/// (MindSpeed --moe-fb-overlap, DualPipe's pairs): durations only, inputs ready; the next step
/// of either program goes first if it can start first; of two that can start at once a
/// communication step goes first (so that it runs under the other's compute), then, with
/// `balance` (DualPipeV, whose pairs send both outputs on at once), the program with more
/// compute left, so the two end together, otherwise `a` (the backward, whose gradient the
/// previous stage waits for). `visit(from_a, k)` is called for each step in issue order; returns
/// when the last step ends.
template <class Visit>
Tick co_schedule(const Program& a, const Program& b, bool balance, Visit&& visit) {
  std::array<Tick, kNumStreams> stream_free{};
  std::vector<Tick> end_a(a.steps.size(), 0), end_b(b.steps.size(), 0);
  auto start_of = [&](const Step& st, const std::vector<Tick>& end) {
    Tick t = stream_free[static_cast<int>(st.stream)];
    if (st.dep0 >= 0) t = std::max(t, end[st.dep0]);
    if (st.dep1 >= 0) t = std::max(t, end[st.dep1]);
    return t;
  };
  auto remaining = [](const Program& p) {
    std::vector<Tick> r(p.steps.size() + 1, 0);
    for (std::size_t k = p.steps.size(); k-- > 0;)
      r[k] = add_ticks(r[k + 1], p.steps[k].stream == Stream::Compute ? p.steps[k].duration : 0);
    return r;
  };
  const std::vector<Tick> rem_a = remaining(a), rem_b = remaining(b);
  Tick last = 0;
  std::size_t i = 0, j = 0;
  while (i < a.steps.size() || j < b.steps.size()) {
    bool take_a = j >= b.steps.size();
    if (!take_a && i < a.steps.size()) {
      const Tick sa = start_of(a.steps[i], end_a), sb = start_of(b.steps[j], end_b);
      const bool ca = a.steps[i].stream != Stream::Compute, cb = b.steps[j].stream != Stream::Compute;
      take_a = sa < sb || (sa == sb && (ca != cb ? ca : !balance || rem_a[i] >= rem_b[j]));
    }
    const Program& prog = take_a ? a : b;
    std::vector<Tick>& end = take_a ? end_a : end_b;
    const std::size_t k = take_a ? i++ : j++;
    const Step& st = prog.steps[k];
    end[k] = add_ticks(start_of(st, end), st.duration);
    stream_free[static_cast<int>(st.stream)] = end[k];
    last = std::max(last, end[k]);
    visit(take_a, k);
  }
  return last;
}

/// The longest dependency path through the program (streams ignored).
[[nodiscard]] Tick program_span(const Program& prog);

/// Host time to issue a step (0: the host does not issue it). Compute kernels cost the host
/// dispatch time each (fused vector operators are issued with their neighbours); a grouped
/// expert GEMM is issued once per local expert (Transformer Engine's GroupedLinear runs one
/// GEMM per expert on Hopper), so its host time grows with the local experts.
[[nodiscard]] Tick host_ticks(const Step& st, Tick launch, bool fused_vector_ops, int ep);

/// A program timed alone (seconds): streams run their steps in order, dependencies are
/// respected; with host dispatch (`launch` > 0) the host thread issues the kernels in order as
/// the engine does (a kernel starts after its launch; the host waits for the inputs of a
/// `host_sync` step). Adds compute and communication durations to `compute` and `comm`.
double time_alone(const Program& prog, Tick launch, bool fused_vector_ops, int ep, double& compute,
                  std::array<double, kNumCats>& comm);

}  // namespace moesim::strategies::lowering
