#include "moesim/strategies/lower/lower.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <tuple>

#include "moesim/models/device.hpp"
#include "moesim/models/routing.hpp"
#include "moesim/sim/random.hpp"
#include "moesim/topologies/netflow.hpp"

namespace moesim::strategies {

using topologies::Collective;
using topologies::Algorithm;
using topologies::CollectiveCost;
using topologies::GroupShape;
using topologies::collective_name;
using topologies::algorithm_name;
using topologies::analyze_group;
using topologies::collective_cost;
using topologies::alltoallv_cost;
using topologies::p2p_time;
using topologies::FlowCollectives;

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

namespace {

using models::Comm;
using models::Op;
using models::OpKind;
using models::Region;
using models::SavedLayout;
using models::Split;

enum class GroupKind : std::uint8_t { None, Tp, Cp, Ep, Etp, Dp, Edp };
constexpr int kNumGroupKinds = 7;
const char* group_name(GroupKind g) {
  switch (g) {
    case GroupKind::None: return "none";
    case GroupKind::Tp: return "tp";
    case GroupKind::Cp: return "cp";
    case GroupKind::Ep: return "ep";
    case GroupKind::Etp: return "etp";
    case GroupKind::Dp: return "dp";
    case GroupKind::Edp: return "edp";
  }
  return "?";
}

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
};

struct Program {
  std::vector<Step> steps;
  int chain_end = -1;           ///< step producing the program's output
  std::vector<int> item_end;    ///< per item: its last step (for gradient-bucket hooks)
};

/// Rank layout inside one pipeline stage: local = tp_i + tp * (cp_i + cp * dp_i); the expert
/// layout reuses the same block as etp_i + etp * (ep_i + ep * edp_i) (Megatron's orders
/// tp-cp-dp and etp-ep-edp).
struct Layout {
  int tp, cp, dp, ep, etp, edp, block;
  [[nodiscard]] std::vector<int> members(GroupKind g, int local) const {
    std::vector<int> out;
    const int tp_i = local % tp, cp_i = (local / tp) % cp, dp_i = local / (tp * cp);
    const int etp_i = local % etp, ep_i = (local / etp) % ep, edp_i = local / (etp * ep);
    switch (g) {
      case GroupKind::Tp:
        for (int t = 0; t < tp; ++t) out.push_back(t + tp * (cp_i + cp * dp_i));
        break;
      case GroupKind::Cp:
        for (int c = 0; c < cp; ++c) out.push_back(tp_i + tp * (c + cp * dp_i));
        break;
      case GroupKind::Dp:  // gradients of dense weights reduce over DP x CP
        for (int x = 0; x < cp * dp; ++x) out.push_back(tp_i + tp * x);
        break;
      case GroupKind::Ep:
        for (int e = 0; e < ep; ++e) out.push_back(etp_i + etp * (e + ep * edp_i));
        break;
      case GroupKind::Etp:
        for (int t = 0; t < etp; ++t) out.push_back(t + etp * (ep_i + ep * edp_i));
        break;
      case GroupKind::Edp:
        for (int d = 0; d < edp; ++d) out.push_back(etp_i + etp * (ep_i + ep * d));
        break;
      case GroupKind::None: out.push_back(local); break;
    }
    return out;
  }
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
};

}  // namespace

/// Group shapes keyed by (group kind, layout, position of the stage's block in the fabric):
/// shared by every plan a search evaluates (routes are the expensive part).
struct ShapeCache {
  std::map<std::array<int, 8>, GroupShape> shapes;
};

/// Per-layer costs of a plan family: everything that changes a layer's programs is in the key.
struct ItemCost {
  double fwd_s = 0, bwd_s = 0;            ///< the layer's programs timed alone
  double fwd_compute_s = 0, bwd_compute_s = 0;
  double wgrad_s = 0;                     ///< weight-gradient GEMMs of the backward
  std::array<double, kNumCats> comm_s{};  ///< communication durations by category (fwd + bwd)
  double act_bytes = 0, transient = 0, params_dense = 0, params_expert = 0;
};

struct EstimatorCache {
  ShapeCache shapes;
  std::map<std::array<int, 16>, ItemCost> items;
};

namespace {

class Lowering {
 public:
  Lowering(const Scenario& s, const Plan& plan, const topologies::Topology& topo, const models::Workload& w,
           ShapeCache* cache = nullptr)
      : s_(s), p_(plan), m_(s.model), topo_(topo), w_(w), cm_(s.cluster.device), shape_cache_(cache) {
    lay_.tp = p_.tp;
    lay_.cp = p_.cp;
    lay_.dp = p_.dp;
    lay_.ep = m_.is_moe() ? p_.ep_size() : 1;
    lay_.etp = m_.is_moe() ? p_.etp_size() : 1;
    lay_.block = p_.tp * p_.cp * p_.dp;
    lay_.edp = lay_.block / (lay_.ep * lay_.etp);
    tok_.T = static_cast<double>(p_.mbs) * static_cast<double>(s.training.seq_length);
    tok_.Tc = tok_.T / p_.cp;
    tok_.Tseq = (p_.sequence_parallel && p_.tp > 1) ? tok_.Tc / p_.tp : tok_.Tc;
    tok_.Texp = tok_.Tseq * lay_.etp;
    prec_ = s.training.precision;
    builder_ = sim::TaskGraphBuilder(category_names());
    // The flow-level network model times the all-to-alls of event simulations; screening (a
    // shape cache is given) and fast fidelity keep the analytical model.
    if (cache == nullptr && s.simulation.network == NetworkModel::Flow && s.simulation.fidelity != Fidelity::Fast)
      flow_ = std::make_unique<FlowCollectives>(topo);
  }

  Lowered run();
  PlanEstimate estimate(EstimatorCache& cache);
  void set_cancel(const CancelFlag* cancel) { cancel_ = cancel; }

 private:
  // ---- group shapes ------------------------------------------------------------------------
  void compute_shapes(int stage) {
    const auto& spec = topo_.spec();
    const long long span = 1LL * spec.devices_per_node * spec.nodes_per_leaf;
    const int offset = static_cast<int>((1LL * stage * lay_.block) % std::max(1LL, span));
    for (int g = 0; g < kNumGroupKinds; ++g) {
      const auto kind = static_cast<GroupKind>(g);
      const std::array<int, 8> key{g, lay_.tp, lay_.cp, lay_.dp, lay_.ep, lay_.etp, offset, 0};
      if (flow_) {
        group_devices_[g].clear();
        for (int l : lay_.members(kind, 0)) group_devices_[g].push_back(stage * lay_.block + l);
      }
      if (shape_cache_ != nullptr) {
        auto it = shape_cache_->shapes.find(key);
        if (it != shape_cache_->shapes.end()) {
          shape_[g] = it->second;
          continue;
        }
      }
      auto locals = lay_.members(kind, 0);
      std::vector<int> devs;
      for (int l : locals) devs.push_back(stage * lay_.block + l);
      shape_[g] = analyze_group(topo_, devs);

      if (shape_cache_ != nullptr) shape_cache_->shapes.emplace(key, shape_[g]);
    }
  }
  [[nodiscard]] const GroupShape& shape(GroupKind g) const { return shape_[static_cast<int>(g)]; }
  [[nodiscard]] Algorithm a2a_algorithm() const {
    switch (p_.alltoall) {
      case AllToAllAlgo::Hierarchical: return Algorithm::HierarchicalAllToAll;
      case AllToAllAlgo::AllGather: return Algorithm::AllGatherAllToAll;
      case AllToAllAlgo::Flat: break;
    }
    return Algorithm::Pairwise;
  }
  /// All-to-all on the current stage's group `g` through the flow-level model; uniform volumes
  /// are cached by (first device, bytes, dedup).
  CollectiveCost flow_alltoall(GroupKind g, double bytes, Algorithm algo, double dedup) {
    const auto& devs = group_devices_[static_cast<int>(g)];
    const std::tuple<int, double, double, int> key{devs.front(), bytes, dedup, static_cast<int>(algo)};
    auto it = flow_cache_.find(key);
    if (it != flow_cache_.end()) return it->second;
    const int concurrent = std::max(1, lay_.block / static_cast<int>(devs.size()));
    const CollectiveCost c = flow_->alltoall(bytes, devs, shape(g), algo, dedup, concurrent);
    return flow_cache_.emplace(key, c).first->second;
  }

  // ---- durations ---------------------------------------------------------------------------
  [[nodiscard]] double tokens_in(Region r) const {
    switch (r) {
      case Region::Sequence: return tok_.Tseq;
      case Region::Tensor: return tok_.Tc;
      case Region::Expert: return tok_.Texp;
    }
    return tok_.Tc;
  }

  /// Host time to issue a step (0: the host does not issue it). Compute kernels cost the host
  /// dispatch time each (fused vector operators are issued with their neighbours); a grouped
  /// expert GEMM is issued once per local expert (Transformer Engine's GroupedLinear runs one
  /// GEMM per expert on Hopper), so its host time grows with the local experts.
  [[nodiscard]] Tick host_ticks(const Step& st, Tick launch) const {
    if (launch <= 0 || st.stream != Stream::Compute || st.duration <= 0 || st.cat == kLaunch ||
        (s_.simulation.fused_vector_ops && st.flops == 0))
      return 0;
    const bool per_expert =
        st.op != nullptr && st.op->kind == models::OpKind::Gemm && st.op->region == models::Region::Expert;
    return per_expert ? scale_ticks(launch, std::max(1.0, std::round(st.op->matrices / lay_.ep))) : launch;
  }

  /// A program timed alone (seconds): streams run their steps in order, dependencies are
  /// respected; with host dispatch (`launch` > 0) the host thread issues the kernels in order as
  /// the engine does (a kernel starts after its launch; the host waits for the router before a
  /// dispatch). Adds compute and communication durations to `compute` and `comm`.
  double time_alone(const Program& prog, Tick launch, double& compute, std::array<double, kNumCats>& comm) const {
    const double launch_s = to_seconds(launch).value();
    std::array<double, kNumStreams> free{};
    std::vector<double> fin(prog.steps.size(), 0.0);
    double end = 0, host = 0;
    for (std::size_t i = 0; i < prog.steps.size(); ++i) {
      const Step& st = prog.steps[i];
      double start = free[static_cast<int>(st.stream)];
      if (st.dep0 >= 0) start = std::max(start, fin[st.dep0]);
      if (st.dep1 >= 0) start = std::max(start, fin[st.dep1]);
      if (launch > 0 && st.role == Role::ToExperts && (st.dep0 >= 0 || st.dep1 >= 0)) {
        host = std::max(host, std::max(st.dep0 >= 0 ? fin[st.dep0] : 0.0, st.dep1 >= 0 ? fin[st.dep1] : 0.0)) + launch_s;
        start = std::max(start, host);
      }
      if (const Tick h = host_ticks(st, launch); h > 0) {
        host += to_seconds(h).value();
        start = std::max(start, host);
      }
      const double d = to_seconds(st.duration).value();
      fin[i] = start + d;
      free[static_cast<int>(st.stream)] = fin[i];
      end = std::max(end, fin[i]);
      if (st.stream == Stream::Compute) compute += d;
      else comm[st.cat] += d;
    }
    return end;
  }

  struct GemmShape {
    double m, n, k, batch;
  };
  [[nodiscard]] GemmShape gemm_shape(const Op& op) const {
    if (op.region == Region::Expert) {
      const double local_experts = std::max(1.0, op.matrices / lay_.ep);
      const double copies = tok_.Texp * op.tokens_factor;
      double n = op.n, k = op.k;
      if (op.split == Split::Column) n /= lay_.etp;
      if (op.split == Split::Row) k /= lay_.etp;
      return {copies / local_experts, n, k, local_experts};
    }
    double n = op.n, k = op.k;
    if (op.region == Region::Tensor) {
      if (op.split == Split::Column) n /= p_.tp;
      if (op.split == Split::Row) k /= p_.tp;
    }
    return {tokens_in(op.region) * op.tokens_factor, n, k, 1.0};
  }

  [[nodiscard]] double vector_bytes(const Op& op) const {
    double b = op.bytes_per_token * tokens_in(op.region) * op.tokens_factor;
    if (op.split == Split::Column) b /= (op.region == Region::Expert ? lay_.etp : p_.tp);
    return b;
  }

  [[nodiscard]] double attention_bh() const { return static_cast<double>(p_.mbs) * 1.0; }

  Step compute(sim::Category cat, Seconds t, double flops, const std::string& label) {
    Step st;
    st.duration = to_ticks(t);
    st.cat = cat;
    st.stream = Stream::Compute;
    st.flops = flops;
    st.label = builder_.label(label);
    return st;
  }

  /// A collective on a group; zero-duration (group of one) yields duration 0.
  Step collective(GroupKind g, Collective kind, double bytes, sim::Category cat, Stream stream,
                  const std::string& label, int count, double dedup = 1.0) {
    const GroupShape& sh = shape(g);
    Step st;
    st.cat = cat;
    st.stream = stream;
    st.group = g;
    st.label = builder_.label(label);
    if (sh.size <= 1 || bytes <= 0) return st;
    Algorithm algo = Algorithm::Auto;
    if (kind == Collective::AllToAll) {
      algo = a2a_algorithm();
      if (algo == Algorithm::AllGatherAllToAll) dedup = 1.0 / std::max(1, m_.top_k);
    }
    const CollectiveCost c = flow_ && kind == Collective::AllToAll ? flow_alltoall(g, bytes, algo, dedup)
                                                                   : collective_cost(kind, bytes, sh, algo, dedup);
    st.duration = to_ticks(c.time);
    note_collective(g, kind, c, bytes, sh.size, count);
    return st;
  }

  void note_collective(GroupKind g, Collective kind, const CollectiveCost& c, double bytes, int size, int count) {
    if (count <= 0) return;
    const std::string key = std::string(group_name(g)) + "|" + collective_name(kind) + "|" + algorithm_name(c.algorithm) +
                            "|" + std::to_string(static_cast<long long>(bytes));
    auto it = coll_index_.find(key);
    if (it == coll_index_.end()) {
      coll_index_[key] = uses_.size();
      uses_.push_back(CollectiveUse{group_name(g), collective_name(kind), algorithm_name(c.algorithm), size, bytes,
                                    c.time.value(), count});
    } else {
      uses_[it->second].count_per_step += count;
    }
  }

  // ---- per-item programs -------------------------------------------------------------------
  struct ItemProgram {
    Program fwd, bwd;
    double act_bytes = 0;       ///< saved for backward, one micro-batch
    double act_bytes_full = 0;  ///< without any recomputation
    double transient = 0;
    double params_dense = 0, params_expert = 0;
    double fwd_seconds = 0, bwd_seconds = 0;
    double fwd_flops = 0, bwd_flops = 0;
  };

  struct Builder {
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
    void join(int step) {
      if (step < 0) return;
      if (pending < 0) {
        pending = step;
        return;
      }
      Step j;
      j.label = p.steps[step].label;
      pending = add(j, pending, step);
    }
    /// An overlapped collective not consumed by a GEMM is simply waited for.
    void flush_overlap() {
      join(overlap_next);
      overlap_next = -1;
    }
  };

  void emit_attention(const Op& op, const std::string& label, Builder& b, bool backward, sim::Category cat,
                      ItemProgram& ip, int count);
  /// Marks step `i` of a program as depending on the routing (expert work, all-to-all).
  void tag(Builder& b, int i, Role role, const Op* op) const {
    if (i < 0 || current_moe_layer_ < 0) return;
    Step& st = b.p.steps[static_cast<std::size_t>(i)];
    st.role = role;
    st.moe_layer = static_cast<std::int16_t>(current_moe_layer_);
    st.op = op;
  }
  /// A tensor-parallel collective; with `tp_comm_overlap` it runs beside the neighbouring GEMM.
  void emit_tp(Builder& b, Collective kind, double bytes, const std::string& label, int count, bool before_gemm);
  [[nodiscard]] Seconds fp8_cast(double elements) const {
    // Transformer Engine casts (and transposes) each FP8 GEMM operand: read BF16, write FP8
    // twice (row and column layouts): about 4 bytes per element.
    return prec_ == models::Precision::FP8 ? cm_.memory_bound(Bytes{4.0 * elements}) - cm_.kernel_overhead()
                                           : Seconds{0};
  }

  ItemProgram build_item(const models::PipelineItem& item, bool full_recompute, int uniform_group, int mb_count);
  void emit_forward_op(const Op& op, const std::string& pre, Builder& b, bool recompute, ItemProgram& ip, int count);
  void emit_backward_op(const Op& op, const std::string& pre, Builder& b, ItemProgram& ip, int count);
  [[nodiscard]] double saved_tokens(const Op& op) const;
  [[nodiscard]] std::string item_prefix(const models::PipelineItem& it) const;

  static void append_program(Program& dst, const Program& src) {
    const int off = static_cast<int>(dst.steps.size());
    const int link = dst.chain_end;
    for (Step st : src.steps) {
      st.dep0 = st.dep0 >= 0 ? st.dep0 + off : link;
      st.dep1 = st.dep1 >= 0 ? st.dep1 + off : -1;
      dst.steps.push_back(st);
    }
    if (src.chain_end >= 0) dst.chain_end = src.chain_end + off;
    dst.item_end.push_back(static_cast<int>(dst.steps.size()) - 1);
  }
  /// Gives the program a single entry step (a zero-length marker when several steps would
  /// otherwise wait only for the program's input), so external inputs attach to one task.
  void finalize_program(Program& p) {
    int entries = 0;
    for (const Step& st : p.steps) entries += (st.dep0 < 0 && st.dep1 < 0) ? 1 : 0;
    if (entries <= 1) return;
    Step marker;
    marker.label = builder_.label("begin");
    for (Step& st : p.steps) {
      const bool entry = st.dep0 < 0 && st.dep1 < 0;
      if (st.dep0 >= 0) ++st.dep0;
      if (st.dep1 >= 0) ++st.dep1;
      if (entry) st.dep0 = 0;
    }
    p.steps.insert(p.steps.begin(), marker);
    if (p.chain_end >= 0) ++p.chain_end;
    for (int& e : p.item_end) ++e;
  }

  // ---- partition, memory, emission ---------------------------------------------------------
  /// Decoder layers per virtual stage. `refine` runs the local search after the water-filling
  /// start (the search's screening skips it).
  std::vector<int> partition(const std::vector<double>& layer_cost, double first_extra, double last_extra,
                             bool refine = true);
  std::vector<std::vector<int>> virtual_stage_items(const std::vector<int>& counts) const;
  std::vector<int> partition_positions(const std::vector<double>& layer_cost, double first_extra, double last_extra,
                                       bool refine, int positions, int chunks);
  void build_ranks(Fidelity f);
  void emit(Fidelity f);

  const Scenario& s_;
  const Plan& p_;
  const models::ModelSpec& m_;
  const topologies::Topology& topo_;
  const models::Workload& w_;
  models::ComputeModel cm_;
  models::Precision prec_;
  Layout lay_{};
  Tokens tok_{};
  std::array<GroupShape, kNumGroupKinds> shape_{};
  sim::TaskGraphBuilder builder_;
  std::map<std::string, std::size_t> coll_index_;
  std::vector<CollectiveUse> uses_;
  Lowered out_;
  // per stage, per chunk: programs
  ShapeCache* shape_cache_ = nullptr;
  std::unique_ptr<FlowCollectives> flow_;  ///< the flow-level network model, when used
  const CancelFlag* cancel_ = nullptr;  ///< polled between pipeline operations (may be null)
  std::array<std::vector<int>, kNumGroupKinds> group_devices_;  ///< current stage, group of local 0
  std::map<std::tuple<int, double, double, int>, CollectiveCost> flow_cache_;
  int current_moe_layer_ = -1;  ///< MoE layer ordinal of the item being built (-1: none)
  [[nodiscard]] int moe_ordinal(const models::PipelineItem& item) const {
    if (!m_.is_moe()) return -1;
    if (item.kind == models::ItemKind::Decoder) {
      if (!m_.is_moe_layer[item.index]) return -1;
      int k = 0;
      for (int i = 0; i < item.index; ++i) k += m_.is_moe_layer[i] ? 1 : 0;
      return k;
    }
    if (item.kind == models::ItemKind::Mtp && !m_.is_moe_layer.empty() && m_.is_moe_layer.back())
      return m_.num_moe_layers() + item.index;
    return -1;
  }
  // ---- routing skew ---------------------------------------------------------------------------
  std::vector<int> sim_locals_;    ///< local indices simulated in every stage
  std::vector<int> pos_of_local_;  ///< local index -> position in sim_locals_ (-1: not simulated)
  bool skewed_ = false;
  struct MoeDraw {  // one MoE layer, one micro-batch, one expert-parallel group
    std::vector<std::vector<double>> copies;  ///< [ep rank][local expert] token copies (after drops)
    std::vector<double> recv;                 ///< [ep rank] copies
    Tick to_experts = 0, from_experts = 0;    ///< all-to-all durations
    double dropped = 0, total = 0, total_kept = 0;
  };
  std::map<std::array<int, 3>, MoeDraw> draws_;
  std::map<int, std::vector<double>> popularity_;  ///< per MoE layer
  /// Where each expert's copies are computed: per expert, (EP rank, share of its copies).
  struct Placement {
    std::vector<std::vector<std::pair<int, double>>> where;
    int moved = 0;  ///< experts (replicas) whose rank differs from the static placement
    std::vector<int> moved_in;  ///< per EP rank: replicas it has to fetch
  };
  /// Seconds per step one rank of `stage` spends fetching migrated experts (weights and its
  /// optimizer shard), the re-placement every interval_steps amortised over them.
  double migration_seconds(int stage);
  std::map<int, Placement> placement_;  ///< per MoE layer
  /// Packed documents: attention work of (simulated data-parallel index, micro-batch) relative
  /// to one causal sequence per sample; the simulated indices are the slowest ranks.
  std::vector<std::vector<double>> attention_factor_;
  void sample_documents();
  const Placement& placement(int moe_layer);
  void expert_load_stats();
  const MoeDraw& draw(int moe_layer, int mb, int group);
  Tick routed_duration(const Step& st, int mb, int local);
  [[nodiscard]] bool group_simulated(GroupKind g, int local) const {
    for (int l : lay_.members(g, local))
      if (pos_of_local_[l] < 0) return false;
    return true;
  }
  std::vector<std::vector<double>> chunk_act_;  ///< [stage][chunk] saved activations, one micro-batch
  std::vector<std::vector<Program>> fwd_, bwd_, wgt_;  // [stage][chunk]; wgt_: W passes (zero bubble)
  std::vector<std::vector<Program>> bwd_full_;  // unsplit backward (B and W), for DualPipeV's F&B pairs
  /// Moves the weight-gradient steps of a backward program into a W program of their own,
  /// leaving zero-length markers (the data-gradient chain no longer waits for them).
  static void split_weight_gradients(Program& B, Program& W) {
    W = Program{};
    W.item_end.assign(B.item_end.size(), -1);
    std::vector<int> w_of(B.steps.size(), -1);
    int last = -1;
    for (std::size_t i = 0; i < B.steps.size(); ++i) {
      Step& st = B.steps[i];
      if (!st.wgrad) continue;
      Step w = st;
      w.dep0 = last;
      w.dep1 = -1;
      W.steps.push_back(w);
      last = static_cast<int>(W.steps.size()) - 1;
      w_of[i] = last;
      st.duration = 0;
      st.flops = 0;
      st.role = Role::None;
      st.wgrad = false;
    }
    W.chain_end = last;
    // An item's gradients are complete when the last W step up to its backward end has run.
    for (std::size_t k = 0; k < B.item_end.size(); ++k) {
      int best = -1;
      for (int i = 0; i <= B.item_end[k] && i < static_cast<int>(w_of.size()); ++i) best = std::max(best, w_of[i]);
      W.item_end[k] = best;
    }
  }
  std::vector<std::vector<std::vector<std::pair<double, double>>>> chunk_item_params_;  // [stage][chunk][item]
  std::vector<double> p2p_seconds_;  // per virtual stage boundary
};

std::string Lowering::item_prefix(const models::PipelineItem& it) const {
  switch (it.kind) {
    case models::ItemKind::Embedding: return "emb.";
    case models::ItemKind::Decoder: return "L" + std::to_string(it.index) + ".";
    case models::ItemKind::Head: return "head.";
    case models::ItemKind::Mtp: return "mtp" + std::to_string(it.index) + ".";
  }
  return "";
}

double Lowering::saved_tokens(const Op& op) const {
  switch (op.saved_layout) {
    case SavedLayout::Sequence: return tok_.Tseq;
    case SavedLayout::Split: return tok_.Tc / p_.tp;
    case SavedLayout::Full: return tok_.Tc;
    case SavedLayout::Expert: return tok_.Tseq * op.tokens_factor;
  }
  return tok_.Tc;
}

void Lowering::emit_forward_op(const Op& op, const std::string& pre, Builder& b, bool recompute, ItemProgram& ip,
                               int count) {
  const sim::Category ccat = recompute ? kRecompute : kCompute;
  const std::string label = pre + op.name + (recompute ? ".recompute" : "");
  switch (op.kind) {
    case OpKind::Gemm: {
      const GemmShape g = gemm_shape(op);
      const Seconds t = cm_.gemm(g.m, g.n, g.k, prec_, g.batch) + fp8_cast(g.m * g.k * g.batch);
      const double fl = 2.0 * g.m * g.n * g.k * g.batch;
      b.chained(compute(ccat, t, fl, label));
      if (op.expert_part != 0) tag(b, b.chain, Role::ExpertFwd, &op);
      if (b.overlap_next >= 0) {  // the gather feeding this GEMM ran beside it
        b.join(b.overlap_next);
        b.overlap_next = -1;
      }
      ip.fwd_flops += recompute ? 0 : fl;
      break;
    }
    case OpKind::Attention: {
      b.flush_overlap();
      emit_attention(op, label, b, false, ccat, ip, recompute ? 0 : count);
      break;
    }
    case OpKind::Vector: {
      b.flush_overlap();
      const double bytes = vector_bytes(op);
      if (bytes <= 0) break;
      b.chained(compute(ccat, cm_.memory_bound(Bytes{bytes}), 0.0, label));
      if (op.expert_part != 0) tag(b, b.chain, Role::ExpertFwd, &op);
      break;
    }
    case OpKind::Comm: {
      const int cnt = count;
      if (op.comm != Comm::TpGather) b.flush_overlap();
      switch (op.comm) {
        case Comm::TpGather:
          if (p_.tp > 1 && p_.sequence_parallel)
            emit_tp(b, Collective::AllGather, op.bytes_per_token * tok_.Tc, label, cnt, true);
          break;
        case Comm::TpScatter:
          if (p_.tp > 1)
            emit_tp(b, p_.sequence_parallel ? Collective::ReduceScatter : Collective::AllReduce,
                    op.bytes_per_token * tok_.Tc, label, cnt, false);
          break;
        case Comm::TpReduceSmall:
          if (p_.tp > 1)
            b.chained(collective(GroupKind::Tp, Collective::AllReduce, op.bytes_per_token * tok_.Tc, kTpComm, Stream::Tp,
                                 label, cnt));
          break;
        case Comm::EpDispatch:
        case Comm::EpCombine: {
          const bool dispatch = op.comm == Comm::EpDispatch;
          const double bytes = op.bytes_per_token * tok_.Tseq;
          const double dedup = alltoall_dedup_ratio(m_.num_experts, m_.top_k, shape(GroupKind::Ep).nodes);
          if (lay_.etp > 1 && !dispatch)  // combine: reduce-scatter over ETP before the all-to-all
            b.chained(collective(GroupKind::Etp, Collective::ReduceScatter, bytes * lay_.etp, kEpComm, Stream::Ep,
                                 label + ".etp", cnt));
          b.chained(collective(GroupKind::Ep, Collective::AllToAll, bytes, kEpComm, Stream::Ep, label, cnt, dedup));
          tag(b, b.chain, dispatch ? Role::ToExperts : Role::FromExperts, &op);
          if (lay_.etp > 1 && dispatch)
            b.chained(collective(GroupKind::Etp, Collective::AllGather, bytes * lay_.etp, kEpComm, Stream::Ep,
                                 label + ".etp", cnt));
          break;
        }
        case Comm::None: break;
      }
      break;
    }
  }
}

void Lowering::emit_backward_op(const Op& op, const std::string& pre, Builder& b, ItemProgram& ip, int count) {
  const std::string label = pre + op.name;
  switch (op.kind) {
    case OpKind::Gemm: {
      const GemmShape g = gemm_shape(op);
      const int before = b.chain;
      int gathered = -1;
      // With SP, a column-parallel GEMM kept only its sequence shard: gather it again for the
      // weight gradient, overlapped with the data gradient (Megatron's SP backward).
      if (op.region == Region::Tensor && op.saved_layout == SavedLayout::Sequence && p_.sequence_parallel && p_.tp > 1) {
        Step ag = collective(GroupKind::Tp, Collective::AllGather, op.k * models::kActivationBytes * tok_.Tc, kTpComm,
                             Stream::Tp, label + ".regather", count);
        if (ag.duration > 0) gathered = b.add(ag, before, -1);
      }
      // With tp_comm_overlap the gather of the output gradient runs beside the data gradient.
      const int overlapped = b.overlap_next;
      b.overlap_next = -1;
      if (gathered < 0) gathered = overlapped;
      const double fl = 2.0 * g.m * g.n * g.k * g.batch;
      if (!op.is_embedding && op.bwd_data_factor > 0) {
        b.chained(compute(kCompute, cm_.gemm(g.m, g.k, g.n, prec_, g.batch) + fp8_cast(g.m * g.n * g.batch),
                          fl * op.bwd_data_factor, label + ".dgrad"));
        if (op.expert_part != 0) tag(b, b.chain, Role::ExpertDgrad, &op);
        ip.bwd_flops += fl * op.bwd_data_factor;
      }
      if (op.bwd_weight_factor > 0) {
        Step wg = compute(kCompute, cm_.gemm(g.k, g.n, g.m, prec_, g.batch), fl * op.bwd_weight_factor, label + ".wgrad");
        // Autograd computes the weight gradient before it moves to the next node, so the next
        // backward step waits for it too (`pending`); only Megatron's explicit asynchronous
        // SP reduce-scatter overlaps it (see the TpGather backward).
        const int wi = b.add(wg, before, gathered);
        b.p.steps[static_cast<std::size_t>(wi)].wgrad = true;
        if (op.expert_part != 0) tag(b, wi, Role::ExpertWgrad, &op);
        b.join(wi);
        ip.bwd_flops += fl * op.bwd_weight_factor;
      }
      if (overlapped >= 0 && gathered != overlapped) b.join(overlapped);
      break;
    }
    case OpKind::Attention: {
      b.flush_overlap();
      emit_attention(op, label, b, true, kCompute, ip, count);
      break;
    }
    case OpKind::Vector: {
      b.flush_overlap();
      const double bytes = op.bwd_data_factor * vector_bytes(op);
      if (bytes <= 0) break;
      b.chained(compute(kCompute, cm_.memory_bound(Bytes{bytes}), 0.0, label + ".bwd"));
      if (op.expert_part != 0) tag(b, b.chain, Role::ExpertDgrad, &op);
      break;
    }
    case OpKind::Comm: {
      const std::string bl = label + ".bwd";
      switch (op.comm) {
        case Comm::TpGather:  // gradient of a gather: reduce-scatter (SP) or all-reduce
          if (p_.tp > 1) {
            // Megatron launches it asynchronously right after the data gradient and computes
            // the weight gradient meanwhile: it does not wait for the pending weight gradient,
            // the step after it waits for both.
            const int wgrad = b.pending;
            b.pending = -1;
            b.chained(collective(GroupKind::Tp, p_.sequence_parallel ? Collective::ReduceScatter : Collective::AllReduce,
                                 op.bytes_per_token * tok_.Tc, kTpComm, Stream::Tp, bl, count));
            b.pending = wgrad;
          }
          break;
        case Comm::TpScatter:  // gradient of a reduce-scatter: all-gather (SP); identity otherwise
          if (p_.tp > 1 && p_.sequence_parallel)
            emit_tp(b, Collective::AllGather, op.bytes_per_token * tok_.Tc, bl, count, true);
          break;
        case Comm::TpReduceSmall: break;
        case Comm::EpDispatch:
        case Comm::EpCombine: {
          const bool grad_of_dispatch = op.comm == Comm::EpDispatch;  // flows back like a combine
          const double bytes = op.bytes_per_token * tok_.Tseq;
          const double dedup = alltoall_dedup_ratio(m_.num_experts, m_.top_k, shape(GroupKind::Ep).nodes);
          if (lay_.etp > 1 && grad_of_dispatch)
            b.chained(collective(GroupKind::Etp, Collective::ReduceScatter, bytes * lay_.etp, kEpComm, Stream::Ep,
                                 bl + ".etp", count));
          b.chained(collective(GroupKind::Ep, Collective::AllToAll, bytes, kEpComm, Stream::Ep, bl, count, dedup));
          tag(b, b.chain, grad_of_dispatch ? Role::FromExperts : Role::ToExperts, &op);
          if (lay_.etp > 1 && !grad_of_dispatch)
            b.chained(collective(GroupKind::Etp, Collective::AllGather, bytes * lay_.etp, kEpComm, Stream::Ep, bl + ".etp",
                                 count));
          break;
        }
        case Comm::None: break;
      }
      break;
    }
  }
}

void Lowering::emit_tp(Builder& b, Collective kind, double bytes, const std::string& label, int count,
                       bool before_gemm) {
  Step c = collective(GroupKind::Tp, kind, bytes, kTpComm, Stream::Tp, label, count);
  if (c.duration == 0) return;
  if (!p_.tp_comm_overlap) {
    b.chained(c);
    return;
  }
  if (before_gemm) {
    // Gather chunks stream into the GEMM that consumes them: the GEMM does not wait for the
    // whole gather; whatever follows the GEMM waits for both.
    b.overlap_next = b.add(c, b.chain, -1);
  } else {
    // Reduce-scatter of the GEMM's output chunks as they are produced: starts with the GEMM.
    b.join(b.add(c, b.prev_chain, -1));
  }
}

void Lowering::emit_attention(const Op& op, const std::string& label, Builder& b, bool backward, sim::Category cat,
                              ItemProgram& ip, int count) {
  const double heads = op.heads / p_.tp;
  const double sq = static_cast<double>(s_.training.seq_length) / p_.cp;
  double skv = static_cast<double>(s_.training.seq_length);
  bool causal = op.causal;
  if (op.window > 0 && op.window < skv) {
    skv = op.window;
    causal = false;  // banded: each query sees about `window` keys
  }
  const double bh = static_cast<double>(p_.mbs) * heads;
  const std::string lbl = backward ? label + ".bwd" : label;
  const int before = b.chain;
  // Context parallelism: K/V blocks travel around the CP ring while blocks are computed (and
  // their gradients travel back in backward).
  int ring = -1;
  if (p_.cp > 1) {
    const double kv_heads =
        (m_.attention == models::AttentionKind::MLA ? op.heads : m_.kv_heads) / static_cast<double>(p_.tp);
    const double block = p_.mbs * sq * std::max(1.0, kv_heads) * (op.d_qk + op.d_v) * models::kActivationBytes;
    Step c = collective(GroupKind::Cp, Collective::AllGather, (backward ? 2 : 1) * block * p_.cp, kCpComm, Stream::Cp,
                        lbl + ".kv_ring", count);
    if (c.duration > 0) ring = b.add(c, before, -1);
  }
  // Attention math runs in 16-bit even in FP8 recipes (Transformer Engine keeps it in BF16).
  const models::Precision ap = prec_ == models::Precision::FP8 ? models::Precision::BF16 : prec_;
  if (op.attention_kernel == models::AttentionKernel::Flash) {
    const double fwd_fl = 2.0 * bh * sq * skv * (op.d_qk + op.d_v) * (causal ? 0.5 : 1.0);
    const double fl = backward ? op.bwd_data_factor * fwd_fl : fwd_fl;
    const Seconds t = cm_.attention(bh, sq, skv, op.d_qk, op.d_v, causal, backward ? op.bwd_data_factor : 0.0, prec_);
    b.chained(compute(cat, t, fl, lbl));
    if (s_.training.documents.packed) b.p.steps[static_cast<std::size_t>(b.chain)].role = Role::Attention;
    (backward ? ip.bwd_flops : ip.fwd_flops) += cat == kRecompute ? 0.0 : fl;
  } else {
    // Unfused (Megatron before flash attention): batched GEMMs over the full s x s scores, a
    // fused scale-mask-softmax and dropout that stream the scores through HBM.
    const double elems = bh * sq * skv;
    const double drop = op.attention_dropout > 0 ? 1.0 : 0.0;
    double fl = 0;
    auto gemm = [&](double m, double n, double k, const char* name) {
      fl += 2.0 * m * n * k * bh;
      b.chained(compute(cat, cm_.gemm(m, n, k, ap, bh), 2.0 * m * n * k * bh, lbl + name));
    };
    auto stream = [&](double bytes_per_elem, const char* name) {
      b.chained(compute(cat, cm_.memory_bound(Bytes{elems * bytes_per_elem}), 0.0, lbl + name));
    };
    if (!backward) {
      gemm(sq, skv, op.d_qk, ".qk");
      stream(4.0, ".softmax");                 // read scores, write probabilities
      if (drop > 0) stream(5.0, ".dropout");   // read, write, 1-byte mask
      gemm(sq, op.d_v, skv, ".av");
    } else {
      gemm(sq, skv, op.d_v, ".dp");            // dP = dO V^T
      gemm(skv, op.d_v, sq, ".dv");            // dV = P^T dO
      if (drop > 0) stream(5.0, ".dropout");
      stream(6.0, ".softmax");                 // read P and dP, write dS
      gemm(sq, op.d_qk, skv, ".dq");           // dQ = dS K
      gemm(skv, op.d_qk, sq, ".dk");           // dK = dS^T Q
    }
    (backward ? ip.bwd_flops : ip.fwd_flops) += cat == kRecompute ? 0.0 : fl;
  }
  b.join(ring);
}

Lowering::ItemProgram Lowering::build_item(const models::PipelineItem& item, bool full_recompute, int uniform_group,
                                           int mb_count) {
  ItemProgram ip;
  const models::Program& prog = w_.programs[item.program];
  const std::string pre = item_prefix(item);
  current_moe_layer_ = moe_ordinal(item);
  const bool decoder = item.kind == models::ItemKind::Decoder || item.kind == models::ItemKind::Mtp;
  const std::uint32_t modules = p_.recompute == Recompute::Selective ? p_.recompute_modules : 0u;
  const int fwd_count = mb_count;

  // Shared-expert overlap (Megatron --moe-shared-expert-overlap, MindSpeed
  // --moe-alltoall-overlap-comm): the shared expert branches off before the dispatch
  // all-to-all and is issued right after it, so it computes while the tokens travel; its
  // backward is issued right after the combine's backward all-to-all. Both rejoin the layer.
  std::vector<bool> shared(prog.ops.size(), false);
  int dispatch = -1, combine = -1, unpermute = -1;
  if (p_.shared_expert_overlap && current_moe_layer_ >= 0) {
    for (std::size_t i = 0; i < prog.ops.size(); ++i) {
      const Op& op = prog.ops[i];
      shared[i] = op.name.rfind("shared_", 0) == 0;
      if (op.kind == OpKind::Comm && op.comm == models::Comm::EpDispatch) dispatch = static_cast<int>(i);
      if (op.kind == OpKind::Comm && op.comm == models::Comm::EpCombine) combine = static_cast<int>(i);
      if (op.name.find("unpermute") != std::string::npos) unpermute = static_cast<int>(i);
    }
    if (dispatch < 0 || combine < 0 || unpermute < 0) std::fill(shared.begin(), shared.end(), false);
  }
  const bool branch = std::find(shared.begin(), shared.end(), true) != shared.end();
  // Emits the shared expert's ops on a branch from step `from`; returns the branch's end.
  auto shared_branch = [&](Builder& b, int from, bool backward) {
    const int main_chain = b.chain, main_pending = b.pending;
    b.chain = from;
    b.pending = -1;
    if (!backward) {
      for (std::size_t i = 0; i < prog.ops.size(); ++i)
        if (shared[i]) emit_forward_op(prog.ops[i], pre, b, false, ip, fwd_count);
    } else {
      for (std::size_t i = prog.ops.size(); i-- > 0;)
        if (shared[i]) emit_backward_op(prog.ops[i], pre, b, ip, mb_count);
    }
    b.flush_overlap();
    int end = b.chain;
    if (b.pending >= 0) {
      Step j;
      j.label = builder_.label(pre + "shared_end");
      end = b.add(j, b.chain, b.pending);
    }
    b.chain = main_chain;
    b.pending = main_pending;
    return end;
  };

  // Forward.
  {
    Builder b{ip.fwd};
    int before_dispatch = -1, shared_end = -1;
    for (std::size_t i = 0; i < prog.ops.size(); ++i) {
      if (shared[i]) continue;
      if (branch && static_cast<int>(i) == dispatch) {
        b.flush_overlap();
        before_dispatch = b.chain;
      }
      emit_forward_op(prog.ops[i], pre, b, false, ip, fwd_count);
      if (branch && static_cast<int>(i) == dispatch) shared_end = shared_branch(b, before_dispatch, false);
      if (branch && static_cast<int>(i) == unpermute) b.join(shared_end);
    }
    b.flush_overlap();
    if (b.pending >= 0) {
      Step end;
      end.label = builder_.label(pre + "end");
      b.chain = b.add(end, b.chain, b.pending);
      b.pending = -1;
    }
    ip.fwd.chain_end = b.chain;
  }
  // Backward: re-run what recomputation dropped, then the gradients in reverse.
  {
    Builder b{ip.bwd};
    const bool full = full_recompute && decoder;
    for (const Op& op : prog.ops) {
      const bool rerun = full || (decoder && (op.rerun_tag & modules) != 0);
      if (rerun) emit_forward_op(op, pre, b, true, ip, mb_count);
    }
    b.flush_overlap();
    int grad_out = -1, shared_end = -1;
    for (std::size_t i = prog.ops.size(); i-- > 0;) {
      if (shared[i]) continue;
      if (branch && static_cast<int>(i) == unpermute) {
        b.flush_overlap();
        grad_out = b.chain;  // the layer's output gradient, which the shared expert also takes
      }
      emit_backward_op(prog.ops[i], pre, b, ip, mb_count);
      if (branch && static_cast<int>(i) == combine) shared_end = shared_branch(b, grad_out, true);
      if (branch && static_cast<int>(i) == dispatch) b.join(shared_end);
    }
    b.flush_overlap();
    if (b.pending >= 0) {  // a last weight gradient: the item ends when it is done
      Step end;
      end.label = builder_.label(pre + "end");
      b.chain = b.add(end, b.chain, b.pending);
      b.pending = -1;
    }
    ip.bwd.chain_end = b.chain;
  }
  // Memory: activations kept for backward and the largest working buffer.
  for (const Op& op : prog.ops) {
    const double bytes = op.saved_bytes * saved_tokens(op);
    ip.act_bytes_full += bytes;
    const bool dropped = decoder && (full_recompute || (op.saved_tag & modules) != 0);
    if (!dropped) ip.act_bytes += bytes;
    if (op.kind == OpKind::Attention && op.attention_kernel == models::AttentionKernel::Unfused) {
      // The s x s probabilities (2 bytes), and with dropout its mask (1) and output (2), per
      // head: Korthikanti et al.'s 5as^2b. Recomputing core attention drops them.
      const double seq = static_cast<double>(s_.training.seq_length);
      const double scores = p_.mbs * (op.heads / p_.tp) * (seq / p_.cp) * seq;
      const double sb = scores * (op.attention_dropout > 0 ? 5.0 : 2.0);
      ip.act_bytes_full += sb;
      const bool gone = full_recompute || (modules & models::recompute::kCoreAttn) != 0;
      if (!gone) ip.act_bytes += sb;
      ip.transient = std::max(ip.transient, 2.0 * scores * 2.0);
    }
    double out_bytes = 0;
    if (op.kind == OpKind::Gemm) {
      const GemmShape g = gemm_shape(op);
      out_bytes = g.m * g.n * g.batch * models::kActivationBytes;
    }
    if (op.name.find("cross_entropy") != std::string::npos) out_bytes = op.bytes_per_token * tok_.Tc / p_.tp;
    ip.transient = std::max(ip.transient, 2.0 * out_bytes);
    // Parameters held by one rank.
    double params = op.params;
    if (op.shares_embedding && p_.pp == 1) params = 0;  // the same tensor as the embedding
    if (op.region == Region::Expert) {
      ip.params_expert += params / lay_.ep / (op.split != Split::None ? lay_.etp : 1);
    } else if ((op.region == Region::Tensor && op.split != Split::None) || op.is_embedding) {
      ip.params_dense += params / p_.tp;
    } else {
      ip.params_dense += params;
    }
  }
  if (decoder && full_recompute) {
    // Only the layer input is kept (one per group of `uniform_group` layers).
    ip.act_bytes = static_cast<double>(m_.hidden) * models::kActivationBytes * tok_.Tseq / std::max(1, uniform_group);
    ip.transient = std::max(ip.transient, ip.act_bytes_full);
  }
  for (const Step& st : ip.fwd.steps) ip.fwd_seconds += to_seconds(st.duration).value();
  for (const Step& st : ip.bwd.steps) ip.bwd_seconds += to_seconds(st.duration).value();
  return ip;
}

std::vector<int> Lowering::partition(const std::vector<double>& cost, double first_extra, double last_extra,
                                     bool refine) {
  // DualPipe: partition the p stages as for 1F1B; each is held twice (once per direction).
  const bool bidir = bidirectional(p_.schedule);
  if (bidir) {
    std::vector<int> counts = partition_positions(cost, first_extra, last_extra, refine, p_.pp, 1);
    std::vector<int> twice = counts;
    twice.insert(twice.end(), counts.begin(), counts.end());
    return twice;
  }
  return partition_positions(cost, first_extra, last_extra, refine, p_.virtual_stages(), p_.vpp);
}

std::vector<int> Lowering::partition_positions(const std::vector<double>& cost, double first_extra, double last_extra,
                                               bool refine, int V, int chunks) {
  const int L = static_cast<int>(cost.size());
  std::vector<int> counts(V, 0);
  if (p_.partition == "explicit") return p_.layers_per_stage;
  if (p_.partition == "even") {
    const int slots = L + p_.noop_layers;
    int rest = slots, stages = V;
    if (p_.first_stage_layers >= 0) {
      rest -= p_.first_stage_layers;
      --stages;
    }
    if (p_.last_stage_layers >= 0) {
      rest -= p_.last_stage_layers;
      --stages;
    }
    const int each = stages > 0 ? rest / stages : 0;
    for (int v = 0; v < V; ++v) counts[v] = each;
    if (p_.first_stage_layers >= 0) counts[0] = p_.first_stage_layers;
    if (p_.last_stage_layers >= 0) counts[V - 1] = p_.last_stage_layers;
    // Noop padding layers occupy the last slots: remove them from the last stages' counts.
    int noop = p_.noop_layers;
    for (int v = V - 1; v >= 0 && noop > 0; --v) {
      const int take = std::min(noop, counts[v]);
      counts[v] -= take;
      noop -= take;
    }
    return counts;
  }
  // auto: balance the *stages* (a stage runs all its chunks for every micro-batch), not the
  // virtual stages. Start from a water-filling by average layer cost that leaves room for the
  // embedding on stage 0 and the head (and MTP) on the last stage, then move single layers
  // between virtual stages while the most loaded stage gets lighter (ties: smaller sum of
  // squares).
  const int pp = p_.pp;
  // Score: (most loaded stage, sum of squared virtual-stage loads) — the second term keeps the
  // chunks of a stage even, which the interleaved schedule needs.
  auto score = [&](const std::vector<int>& n) {
    std::vector<double> load(pp, 0.0);
    double sq = 0;
    int layer = 0;
    for (int v = 0; v < V; ++v) {
      double l = (v == 0 ? first_extra : 0.0) + (v == V - 1 ? last_extra : 0.0);
      for (int k = 0; k < n[v]; ++k) l += cost[layer++];
      load[stage_of_virtual(p_.schedule, pp, v)] += l;
      sq += l * l;
    }
    return std::pair{*std::max_element(load.begin(), load.end()), sq};
  };
  const double avg = L > 0 ? std::accumulate(cost.begin(), cost.end(), 0.0) / L : 1.0;
  {
    // Water-filling on stages, then spread each stage's layers over its chunks.
    std::vector<double> extra(pp, 0.0);
    extra[0] += first_extra;
    extra[stage_of_virtual(p_.schedule, pp, V - 1)] += last_extra;
    std::vector<int> per_stage(pp, 0);
    for (int k = 0; k < L; ++k) {
      int best = 0;
      for (int st = 1; st < pp; ++st)
        if (extra[st] + per_stage[st] * avg < extra[best] + per_stage[best] * avg) best = st;
      ++per_stage[best];
    }
    for (int st = 0; st < pp; ++st)
      for (int c = 0; c < chunks; ++c)
        counts[virtual_stage(p_.schedule, pp, st, c)] = per_stage[st] / chunks + (c < per_stage[st] % chunks ? 1 : 0);
  }
  // A virtual stage may end up with no decoder layer (it then only forwards activations, like
  // Megatron's "L" loss-only stage in a custom layout); the search prefers balanced counts.
  auto min_layers = [&](int) { return 0; };
  if (!refine) return counts;
  auto best = score(counts);
  for (int iter = 0; iter < 4 * L; ++iter) {
    auto cand_best = best;
    int from = -1, to = -1;
    for (int a = 0; a < V; ++a) {
      if (counts[a] <= min_layers(a)) continue;
      for (int b = 0; b < V; ++b) {
        if (a == b) continue;
        --counts[a];
        ++counts[b];
        const auto sc = score(counts);
        if (sc.first < cand_best.first * (1 - 1e-9) ||
            (sc.first <= cand_best.first * (1 + 1e-9) && sc.second < cand_best.second * (1 - 1e-9))) {
          cand_best = sc;
          from = a;
          to = b;
        }
        ++counts[a];
        --counts[b];
      }
    }
    if (from < 0) break;
    --counts[from];
    ++counts[to];
    best = cand_best;
  }
  return counts;
}

std::vector<std::vector<int>> Lowering::virtual_stage_items(const std::vector<int>& counts) const {
  // Items in order: the embedding, the decoder layers, then the head (and MTP). A pipeline of
  // P positions starts with the embedding and ends with the head; DualPipe runs two such
  // pipelines over the same items (virtual stages 0..p-1 and p..2p-1).
  const int V = static_cast<int>(counts.size());
  const int P = bidirectional(p_.schedule) ? V / 2 : V;
  std::vector<std::vector<int>> out(static_cast<std::size_t>(V));
  int layer_item = 1;
  for (int v = 0; v < V; ++v) {
    if (v % P == 0) layer_item = 1;
    if (v % P == 0) out[v].push_back(0);
    for (int k = 0; k < counts[v]; ++k) out[v].push_back(layer_item++);
    if (v % P == P - 1)
      for (std::size_t i = static_cast<std::size_t>(layer_item); i < w_.items.size(); ++i) out[v].push_back(static_cast<int>(i));
  }
  return out;
}

void Lowering::build_ranks(Fidelity f) {
  // Which ranks of a stage are simulated: one representative when all ranks of a stage are
  // alike; every member of an expert-parallel group when the routing makes them differ; every
  // rank at full fidelity.
  sim_locals_.clear();
  // A user's expert map can load the ranks unevenly even under balanced routing.
  skewed_ = (s_.routing.skewed() || !s_.placement.expert_map.empty()) && m_.is_moe() && lay_.ep > 1 &&
            f != Fidelity::Fast;
  if (f == Fidelity::Full) {
    for (int l = 0; l < lay_.block; ++l) sim_locals_.push_back(l);
  } else if (skewed_) {
    sim_locals_ = lay_.members(GroupKind::Ep, 0);
    std::sort(sim_locals_.begin(), sim_locals_.end());
  } else {
    sim_locals_.push_back(0);
  }
  pos_of_local_.assign(static_cast<std::size_t>(lay_.block), -1);
  for (std::size_t q = 0; q < sim_locals_.size(); ++q) pos_of_local_[sim_locals_[q]] = static_cast<int>(q);
  const double weight = static_cast<double>(lay_.block) / static_cast<double>(sim_locals_.size());
  for (int stage = 0; stage < p_.pp; ++stage) {
    for (int l : sim_locals_) {
      SimRank r;
      r.stage = stage;
      r.local = l;
      r.global_rank = stage * lay_.block + l;
      r.weight = weight;
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

const Lowering::MoeDraw& Lowering::draw(int moe_layer, int mb, int group) {
  const std::array<int, 3> key{moe_layer, mb, group};
  auto it = draws_.find(key);
  if (it != draws_.end()) return it->second;
  const int E = m_.num_experts, ep = lay_.ep, per = E / ep;
  auto pop = popularity_.find(moe_layer);
  if (pop == popularity_.end())
    pop = popularity_.emplace(moe_layer, models::expert_probabilities(s_.routing, moe_layer, E, m_.top_k, s_.seed)).first;
  // Token copies routed inside one expert-parallel group in one micro-batch.
  const double copies = tok_.Tseq * lay_.etp * m_.top_k * ep;
  Rng rng = Rng::stream(s_.seed, "routing/layer" + std::to_string(moe_layer) + "/mb" + std::to_string(mb) + "/group" +
                                     std::to_string(group));
  // Balanced routing (with a user's expert map): every expert gets exactly its share.
  const std::vector<std::uint64_t> load =
      s_.routing.skewed() ? models::sample_expert_load(pop->second, static_cast<std::uint64_t>(std::llround(copies)), rng)
                          : std::vector<std::uint64_t>(static_cast<std::size_t>(E),
                                                       static_cast<std::uint64_t>(std::llround(copies / E)));
  MoeDraw d;
  d.copies.assign(static_cast<std::size_t>(ep), std::vector<double>(static_cast<std::size_t>(per), 0.0));
  d.recv.assign(static_cast<std::size_t>(ep), 0.0);
  const double cap = s_.routing.capacity_factor > 0 ? std::ceil(s_.routing.capacity_factor * copies / E) : 0.0;
  std::vector<double> per_expert(static_cast<std::size_t>(E), 0.0);
  for (int e = 0; e < E; ++e) {
    double x = static_cast<double>(load[e]);
    d.total += x;
    if (cap > 0 && x > cap) {
      d.dropped += x - cap;
      x = cap;
    }
    d.total_kept += x;
    per_expert[e] = x;
  }
  // Experts' copies onto their ranks (a replicated expert's copies split over its replicas).
  const Placement& pl = placement(moe_layer);
  std::vector<int> fill(static_cast<std::size_t>(ep), 0);
  for (int e = 0; e < E; ++e)
    for (const auto& [rank, share] : pl.where[e]) {
      auto& slots = d.copies[rank];
      const int slot = fill[rank]++;
      if (slot >= static_cast<int>(slots.size())) slots.resize(static_cast<std::size_t>(slot) + 1, 0.0);
      slots[slot] = per_expert[e] * share;
      d.recv[rank] += per_expert[e] * share;
    }
  // All-to-all volumes: every source holds an equal share of the tokens, so member i sends
  // recv[j] / ep copies to member j.
  const double bytes_per_copy = static_cast<double>(m_.hidden) * models::kActivationBytes;
  std::vector<std::vector<double>> to(static_cast<std::size_t>(ep), std::vector<double>(static_cast<std::size_t>(ep), 0.0));
  for (int i = 0; i < ep; ++i)
    for (int j = 0; j < ep; ++j) to[i][j] = d.recv[j] / ep * bytes_per_copy;
  std::vector<std::vector<double>> from(to.size(), std::vector<double>(to.size(), 0.0));
  for (int i = 0; i < ep; ++i)
    for (int j = 0; j < ep; ++j) from[j][i] = to[i][j];
  const Algorithm algo = a2a_algorithm();
  const double dedup = algo == Algorithm::AllGatherAllToAll
                           ? 1.0 / std::max(1, m_.top_k)
                           : alltoall_dedup_ratio(m_.num_experts, m_.top_k, shape(GroupKind::Ep).nodes);
  if (flow_) {
    // The expert-parallel group `group` of the current stage.
    const auto& devs0 = group_devices_[static_cast<int>(GroupKind::Ep)];
    const int base = devs0.front() - devs0.front() % lay_.block;
    std::vector<int> devs;
    for (int l : lay_.members(GroupKind::Ep, group * lay_.etp * ep)) devs.push_back(base + l);
    const int concurrent = std::max(1, lay_.block / ep);
    d.to_experts = to_ticks(flow_->alltoallv(to, devs, shape(GroupKind::Ep), algo, dedup, concurrent).time);
    d.from_experts = to_ticks(flow_->alltoallv(from, devs, shape(GroupKind::Ep), algo, dedup, concurrent).time);
  } else {
    std::vector<int> node;
    for (int l : lay_.members(GroupKind::Ep, 0)) node.push_back(l / topo_.spec().devices_per_node);
    d.to_experts = to_ticks(alltoallv_cost(to, node, shape(GroupKind::Ep), algo, dedup).time);
    d.from_experts = to_ticks(alltoallv_cost(from, node, shape(GroupKind::Ep), algo, dedup).time);
  }
  return draws_.emplace(key, std::move(d)).first->second;
}

const Lowering::Placement& Lowering::placement(int moe_layer) {
  auto it = placement_.find(moe_layer);
  if (it != placement_.end()) return it->second;
  const int E = m_.num_experts, ep = lay_.ep, per = E / ep;
  const PlacementSpec& ps = s_.placement;
  Placement st;  // static: the user's map, or expert e on rank e / per
  st.where.resize(static_cast<std::size_t>(E));
  std::vector<int> home(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) {
    if (!ps.expert_map.empty()) {
      const auto& ranks = ps.expert_map[e];
      for (int r : ranks) st.where[e].emplace_back(r, 1.0 / static_cast<double>(ranks.size()));
    } else {
      st.where[e] = {{e / per, 1.0}};
    }
    home[e] = st.where[e].front().first;
  }
  if (!ps.rebalance) return placement_.emplace(moe_layer, std::move(st)).first->second;

  // Predicted load: an exponential moving average of the loads of the previous steps (each a
  // draw of one step's copies of this group from the layer's popularity), newest weighted 1 - ema.
  const auto& pop = popularity_.at(moe_layer);
  const double step_copies = tok_.Tseq * lay_.etp * m_.top_k * ep * p_.num_microbatches;
  Rng rng = Rng::stream(s_.seed, "placement/layer" + std::to_string(moe_layer));
  std::vector<double> pred(static_cast<std::size_t>(E), 0.0);
  const int history = 32;
  for (int h = 0; h < history; ++h) {
    const auto load = models::sample_expert_load(pop, static_cast<std::uint64_t>(std::llround(step_copies)), rng);
    for (int e = 0; e < E; ++e) pred[e] = h == 0 ? static_cast<double>(load[e]) : ps.ema * pred[e] + (1 - ps.ema) * load[e];
  }
  // Redundant experts: each extra replica goes to the expert with the highest load per replica.
  std::vector<int> replicas(static_cast<std::size_t>(E), 1);
  for (int r = 0; r < ps.redundant_experts; ++r) {
    int best = 0;
    for (int e = 1; e < E; ++e)
      if (pred[e] / replicas[e] > pred[best] / replicas[best]) best = e;
    if (replicas[best] >= ep) break;  // at most one replica per rank
    ++replicas[best];
  }
  // Greedy (longest processing time first): replicas by load, each onto the least loaded rank
  // with a free slot that does not hold the expert yet.
  const int slots = per + (ps.redundant_experts + ep - 1) / ep;
  std::vector<std::pair<double, int>> items;  // (load per replica, expert)
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < replicas[e]; ++r) items.emplace_back(pred[e] / replicas[e], e);
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<double> rank_load(static_cast<std::size_t>(ep), 0.0);
  std::vector<int> used(static_cast<std::size_t>(ep), 0);
  std::vector<std::vector<std::pair<int, double>>> bins(static_cast<std::size_t>(E));  // expert -> (bin, share)
  for (const auto& [load, e] : items) {
    int best = -1;
    for (int r = 0; r < ep; ++r) {
      if (used[r] >= slots) continue;
      bool holds = false;
      for (const auto& w : bins[e]) holds = holds || w.first == r;
      if (holds) continue;
      if (best < 0 || rank_load[r] < rank_load[best]) best = r;
    }
    if (best < 0) best = static_cast<int>(std::min_element(rank_load.begin(), rank_load.end()) - rank_load.begin());
    bins[e].emplace_back(best, 1.0 / replicas[e]);
    rank_load[best] += load;
    ++used[best];
  }
  // The bins are interchangeable: give each bin the rank whose static experts it keeps most of
  // (greedy on the overlap), so that as few experts as possible move.
  std::vector<std::vector<int>> overlap(static_cast<std::size_t>(ep), std::vector<int>(static_cast<std::size_t>(ep), 0));
  for (int e = 0; e < E; ++e)
    for (const auto& [b, share] : bins[e]) ++overlap[b][home[e]];
  std::vector<int> rank_of(static_cast<std::size_t>(ep), -1);
  std::vector<bool> taken(static_cast<std::size_t>(ep), false);
  for (int round = 0; round < ep; ++round) {
    int bb = -1, br = -1;
    for (int b = 0; b < ep; ++b) {
      if (rank_of[b] >= 0) continue;
      for (int r = 0; r < ep; ++r)
        if (!taken[r] && (bb < 0 || overlap[b][r] > overlap[bb][br])) {
          bb = b;
          br = r;
        }
    }
    rank_of[bb] = br;
    taken[br] = true;
  }
  Placement bal;
  bal.where.resize(static_cast<std::size_t>(E));
  bal.moved_in.assign(static_cast<std::size_t>(ep), 0);
  for (int e = 0; e < E; ++e)
    for (const auto& [b, share] : bins[e]) {
      const int r = rank_of[b];
      bal.where[e].emplace_back(r, share);
      if (r != home[e]) {
        ++bal.moved;
        ++bal.moved_in[r];
      }
    }
  // Migrate only when the predicted imbalance (coefficient of variation of the ranks' loads)
  // drops by more than the threshold.
  auto cv = [&](const Placement& p) {
    std::vector<double> l(static_cast<std::size_t>(ep), 0.0);
    for (int e = 0; e < E; ++e)
      for (const auto& [r, share] : p.where[e]) l[r] += pred[e] * share;
    const double mean = std::accumulate(l.begin(), l.end(), 0.0) / ep;
    double var = 0;
    for (double x : l) var += (x - mean) * (x - mean);
    return mean > 0 ? std::sqrt(var / ep) / mean : 0.0;
  };
  const bool migrate = cv(st) - cv(bal) > ps.threshold;
  return placement_.emplace(moe_layer, migrate ? std::move(bal) : std::move(st)).first->second;
}

void Lowering::sample_documents() {
  const DocumentSpec& ds = s_.training.documents;
  const int dp = p_.dp, m = p_.num_microbatches, mbs = p_.mbs;
  const double seq = static_cast<double>(s_.training.seq_length);
  const int n = dp * m * mbs;  // sequences of one step
  // Documents of lognormal length fill the sequences back to back (a document cut at a
  // sequence's end continues in the next); attention stays inside each document.
  Rng rng = Rng::stream(s_.seed, "documents");
  const double mu = std::log(ds.mean_tokens) - 0.5 * ds.sigma * ds.sigma;
  std::vector<double> work(static_cast<std::size_t>(n), 0.0);
  double carry = 0;
  for (int i = 0; i < n; ++i) {
    double room = seq, w = 0;
    while (room > 0) {
      double len = carry > 0 ? carry : std::max(1.0, std::round(std::exp(mu + ds.sigma * rng.normal())));
      carry = 0;
      if (len > room) {
        carry = len - room;
        len = room;
      }
      w += len * len;
      room -= len;
    }
    work[i] = w / (seq * seq);
  }
  // Sequences to (rank, micro-batch): in order, or, reordered, longest-work-first onto the
  // least-loaded data-parallel rank with room, then likewise onto its micro-batches.
  std::vector<std::vector<double>> per_rank(static_cast<std::size_t>(dp));
  if (!ds.reorder) {
    for (int i = 0; i < n; ++i) per_rank[i / (m * mbs)].push_back(work[i]);
  } else {
    std::vector<int> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return work[a] > work[b]; });
    std::vector<double> sum(static_cast<std::size_t>(dp), 0.0);
    for (int i : order) {
      int best = -1;
      for (int r = 0; r < dp; ++r)
        if (static_cast<int>(per_rank[r].size()) < m * mbs && (best < 0 || sum[r] < sum[best])) best = r;
      per_rank[best].push_back(work[i]);
      sum[best] += work[i];
    }
  }
  std::vector<std::pair<double, std::vector<double>>> ranks;  // (total, per micro-batch factor)
  for (auto& seqs : per_rank) {
    std::vector<double> mb(static_cast<std::size_t>(m), 0.0);
    if (!ds.reorder) {
      for (std::size_t j = 0; j < seqs.size(); ++j) mb[j / mbs] += seqs[j] / mbs;
    } else {
      std::vector<int> cnt(static_cast<std::size_t>(m), 0);
      for (double w : seqs) {  // already longest first
        int best = -1;
        for (int k = 0; k < m; ++k)
          if (cnt[k] < mbs && (best < 0 || mb[k] < mb[best])) best = k;
        mb[best] += w / mbs;
        ++cnt[best];
      }
    }
    ranks.emplace_back(std::accumulate(mb.begin(), mb.end(), 0.0), std::move(mb));
  }
  // The step waits for the slowest data-parallel ranks at the gradient reduction: simulate those.
  std::stable_sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  double mean = 0;
  for (const auto& r : ranks) mean += r.first / dp;
  out_.attention_work_max_over_mean = mean > 0 ? ranks.front().first / mean : 1.0;
  out_.attention_work_mean = mean / m;
  attention_factor_.clear();
  for (auto& r : ranks) attention_factor_.push_back(std::move(r.second));
}

double Lowering::migration_seconds(int stage) {
  if (!skewed_ || !s_.placement.rebalance) return 0.0;
  const double params = 3.0 * static_cast<double>(m_.hidden) * static_cast<double>(m_.expert_ffn_hidden) / lay_.etp;
  const double bytes_per_param = 2.0 + (p_.distributed_optimizer ? 12.0 / lay_.edp : 12.0);
  const GroupShape& sh = shape(GroupKind::Ep);
  const double bw = sh.spans_nodes() ? sh.inter_bandwidth : sh.intra_bandwidth;
  double worst_total = 0;
  for (const auto& chunk : out_.stages[stage].chunk_items)
    for (int idx : chunk) {
      const int k = moe_ordinal(w_.items[idx]);
      if (k < 0 || placement_.find(k) == placement_.end()) continue;
      const auto& mi = placement_.at(k).moved_in;
      if (!mi.empty()) worst_total += *std::max_element(mi.begin(), mi.end());
    }
  return bw > 0 ? worst_total * params * bytes_per_param / bw / s_.placement.interval_steps : 0.0;
}

Tick Lowering::routed_duration(const Step& st, int mb, int local) {
  const int ep_rank = (local / lay_.etp) % lay_.ep;
  const int group = local / (lay_.etp * lay_.ep);
  const MoeDraw& d = draw(st.moe_layer, mb, group);
  if (st.role == Role::ToExperts) return d.to_experts;
  if (st.role == Role::FromExperts) return d.from_experts;
  const Op& op = *st.op;
  const std::vector<double>& m = d.copies[static_cast<std::size_t>(ep_rank)];
  double rows = 0;
  for (double x : m) rows += x;
  if (op.kind == OpKind::Vector) {
    double bytes = op.bytes_per_token * rows / (op.split == Split::Column ? lay_.etp : 1);
    if (st.role == Role::ExpertDgrad) bytes *= op.bwd_data_factor;
    return to_ticks(cm_.memory_bound(Bytes{bytes}));
  }
  // Expert GEMM: the split dimension is divided by the expert tensor-parallel size.
  const double n = op.split == Split::Column ? op.n / lay_.etp : op.n;
  const double k = op.split == Split::Row ? op.k / lay_.etp : op.k;
  const std::vector<double> ks(m.size(), k), ns(m.size(), n);
  switch (st.role) {
    case Role::ExpertFwd: return to_ticks(cm_.grouped_gemm(m, ks, n, prec_) + fp8_cast(rows * k));
    case Role::ExpertDgrad: return to_ticks(cm_.grouped_gemm(m, ns, k, prec_) + fp8_cast(rows * n));
    case Role::ExpertWgrad: {
      const std::vector<double> rows_k(m.size(), k);  // [k x m_e] x [m_e x n] per expert
      return to_ticks(cm_.grouped_gemm(rows_k, m, n, prec_));
    }
    default: return st.duration;
  }
}

void Lowering::expert_load_stats() {
  ExpertLoad& el = out_.expert_load;
  const int ep = lay_.ep;
  el.routing = models::routing_name(s_.routing.kind);
  el.ep = ep;
  el.a2a_bytes_per_rank.assign(static_cast<std::size_t>(ep), 0.0);
  const double bytes_per_copy = static_cast<double>(m_.hidden) * models::kActivationBytes;
  // One (layer, micro-batch): rank i sends recv[j]/ep copies to every other j and gets
  // recv[i]/ep from each; the combine reverses it and the backward repeats both.
  auto add_bytes = [&](const std::vector<double>& recv) {
    double total = 0;
    for (double x : recv) total += x;
    for (int i = 0; i < ep; ++i) {
      const double dispatch_out = (total - recv[i]) / ep, dispatch_in = recv[i] * (ep - 1) / ep;
      el.a2a_bytes_per_rank[i] += 2.0 * (dispatch_out + dispatch_in) * bytes_per_copy;
    }
  };
  std::vector<int> layers;
  for (const auto& item : w_.items)
    if (const int k = moe_ordinal(item); k >= 0) layers.push_back(k);
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  const int m = p_.num_microbatches;
  el.layer_rank_share.assign(layers.size(), std::vector<double>(static_cast<std::size_t>(ep), 1.0 / ep));
  if (!skewed_) {
    const std::vector<double> recv(static_cast<std::size_t>(ep), tok_.Tseq * lay_.etp * m_.top_k);
    for (std::size_t l = 0; l < layers.size(); ++l)
      for (int mb = 0; mb < m; ++mb) add_bytes(recv);
    return;
  }
  // Skewed routing: the draws of the first expert-parallel group (every group at full
  // fidelity draws alike in distribution); one per (layer, micro-batch).
  double sum_mom = 0, sum_score = 0, worst = 0, dropped = 0, routed = 0;
  int n = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    std::vector<double>& share = el.layer_rank_share[l];
    std::fill(share.begin(), share.end(), 0.0);
    for (int mb = 0; mb < m; ++mb) {
      const MoeDraw& d = draw(layers[l], mb, 0);
      double total = 0, mx = 0, mn = d.recv.empty() ? 0 : d.recv[0];
      for (double x : d.recv) {
        total += x;
        mx = std::max(mx, x);
        mn = std::min(mn, x);
      }
      if (total <= 0) continue;
      const double mom = mx / (total / ep);
      sum_mom += mom;
      worst = std::max(worst, mom);
      sum_score += (mx - mn) / total;
      for (int i = 0; i < ep; ++i) share[i] += d.recv[i] / total / m;
      dropped += d.dropped;
      routed += d.total;
      ++n;
      add_bytes(d.recv);
    }
  }
  if (n > 0) {
    el.max_over_mean = sum_mom / n;
    el.max_over_mean_worst = worst;
    el.imbalance_score = sum_score / n;
  }
  el.drop_rate = routed > 0 ? dropped / routed : 0.0;
  el.placement = s_.placement.rebalance ? "rebalanced" : "static";
  for (const auto& [k, pl] : placement_) el.experts_moved += pl.moved;
}

Lowered Lowering::run() {
  const Fidelity fid = s_.simulation.fidelity;
  const int V = p_.virtual_stages();
  const int m = p_.num_microbatches;
  out_.schedule = make_schedule(p_.schedule, p_.pp, p_.vpp, m);

  // Item costs for the partition, with stage 0's group shapes.
  compute_shapes(0);
  std::vector<double> layer_cost;
  double first_extra = 0, last_extra = 0;
  for (const auto& item : w_.items) {
    ItemProgram ip = build_item(item, p_.recompute == Recompute::Full, std::max(1, p_.recompute_num_layers), 0);
    const double c = ip.fwd_seconds + ip.bwd_seconds;
    if (item.kind == models::ItemKind::Decoder) layer_cost.push_back(c);
    else if (item.kind == models::ItemKind::Embedding) first_extra += c;
    else last_extra += c;
  }
  out_.layers_per_virtual_stage = partition(layer_cost, first_extra, last_extra);
  uses_.clear();
  coll_index_.clear();

  // Items per virtual stage.
  const std::vector<std::vector<int>> vs_items = virtual_stage_items(out_.layers_per_virtual_stage);

  build_ranks(fid);
  out_.stages.resize(p_.pp);
  fwd_.assign(p_.pp, std::vector<Program>(p_.vpp));
  bwd_.assign(p_.pp, std::vector<Program>(p_.vpp));
  wgt_.assign(p_.pp, std::vector<Program>(p_.vpp));
  bwd_full_.assign(p_.pp, std::vector<Program>(p_.vpp));
  chunk_item_params_.assign(p_.pp, std::vector<std::vector<std::pair<double, double>>>(p_.vpp));
  std::vector<std::vector<double>>& chunk_act = chunk_act_;
  chunk_act.assign(p_.pp, std::vector<double>(p_.vpp, 0.0));
  std::vector<std::vector<double>> chunk_act_full(p_.pp, std::vector<double>(p_.vpp, 0.0));  // no recomputation
  std::vector<double> stage_flops(p_.pp, 0.0);

  for (int stage = 0; stage < p_.pp; ++stage) {
    compute_shapes(stage);
    StageInfo& si = out_.stages[stage];
    si.stage = stage;
    si.chunk_items.resize(p_.vpp);
    double transient = 0;
    for (int c = 0; c < p_.vpp; ++c) {
      const int v = virtual_stage(p_.schedule, p_.pp, stage, c);
      si.chunk_items[c] = vs_items[v];
      std::vector<ItemProgram> items;
      int layer_pos = 0;
      for (int item_idx : vs_items[v]) {
        const auto& item = w_.items[item_idx];
        bool full = p_.recompute == Recompute::Full;
        if (item.kind == models::ItemKind::Decoder) {
          if (full && p_.recompute_method == RecomputeMethod::Block) full = layer_pos < p_.recompute_num_layers;
          ++layer_pos;
          ++si.decoder_layers;
        }
        const int group = p_.recompute_method == RecomputeMethod::Uniform ? std::max(1, p_.recompute_num_layers) : 1;
        items.push_back(build_item(item, full, group, m));
      }
      // Forward runs the items in order, backward in reverse; each item's input is the
      // previous item's output.
      Program& F = fwd_[stage][c];
      Program& Bw = bwd_[stage][c];
      for (const ItemProgram& ip : items) append_program(F, ip.fwd);
      for (auto it = items.rbegin(); it != items.rend(); ++it) append_program(Bw, it->bwd);
      std::reverse(Bw.item_end.begin(), Bw.item_end.end());  // indexed in forward item order
      finalize_program(F);
      finalize_program(Bw);
      if (pairs_forward_backward(p_.schedule)) bwd_full_[stage][c] = Bw;
      if (splits_weight_gradients(p_.schedule)) split_weight_gradients(Bw, wgt_[stage][c]);
      for (const ItemProgram& ip : items) {
        chunk_item_params_[stage][c].push_back({ip.params_dense, ip.params_expert});
        si.params_dense += ip.params_dense;
        si.params_expert += ip.params_expert;
        chunk_act[stage][c] += ip.act_bytes;
        chunk_act_full[stage][c] += ip.act_bytes_full;
        transient = std::max(transient, ip.transient);
        si.forward_seconds += ip.fwd_seconds;
        si.backward_seconds += ip.bwd_seconds;
        double recompute_flops = 0;
        for (const Step& st : ip.bwd.steps)
          if (st.cat == kRecompute) recompute_flops += st.flops;
        stage_flops[stage] += (ip.fwd_flops + ip.bwd_flops + recompute_flops) * (bidirectional(p_.schedule) ? m / 2 : m);
      }
    }
    for (int c = 0; c < p_.vpp; ++c) si.activation_bytes_per_microbatch += chunk_act[stage][c];
    si.memory.transient = transient;
  }
  // Collective counts were recorded once per emitted op program; scale to per-step counts.
  for (auto& u : uses_) u.count_per_step = std::max(1, u.count_per_step);

  // The zero-bubble list schedule follows the passes' real durations (each program's longest
  // dependency path, streams ignored).
  if (splits_weight_gradients(p_.schedule)) {
    auto span = [](const Program& prog) {
      std::vector<Tick> end(prog.steps.size(), 0);
      Tick longest = 0;
      for (std::size_t i = 0; i < prog.steps.size(); ++i) {
        const Step& st = prog.steps[i];
        Tick start = 0;
        if (st.dep0 >= 0) start = std::max(start, end[st.dep0]);
        if (st.dep1 >= 0) start = std::max(start, end[st.dep1]);
        end[i] = add_ticks(start, st.duration);
        longest = std::max(longest, end[i]);
      }
      return longest;
    };
    StageCosts costs(static_cast<std::size_t>(p_.pp), std::vector<PassCosts>(static_cast<std::size_t>(p_.vpp)));
    for (int stage = 0; stage < p_.pp; ++stage)
      for (int c = 0; c < p_.vpp; ++c)
        costs[stage][c] = PassCosts{span(fwd_[stage][c]), span(bwd_[stage][c]), span(wgt_[stage][c])};
    out_.schedule = make_schedule(p_.schedule, p_.pp, p_.vpp, m, costs);
  }

  // ---- memory per stage ----------------------------------------------------------------------
  const double wbytes = prec_ == models::Precision::FP8 ? 3.0 : 2.0;  // BF16 weights (+ FP8 copies)
  for (int stage = 0; stage < p_.pp; ++stage) {
    StageInfo& si = out_.stages[stage];
    MemoryBreakdown& mem = si.memory;
    const double params = si.params_dense + si.params_expert;
    mem.weights = params * wbytes;
    mem.gradients = params * 4.0;  // FP32 main gradients (Megatron accumulates in FP32)
    const double dense_shard = p_.distributed_optimizer ? static_cast<double>(p_.dp * p_.cp) : 1.0;
    const double expert_shard = p_.distributed_optimizer ? static_cast<double>(lay_.edp) : 1.0;
    mem.optimizer = 12.0 * (si.params_dense / dense_shard + si.params_expert / expert_shard);  // FP32 master, m, v
    if (p_.swap_optimizer) {
      // Optimizer states live in host memory; one gradient bucket's states are on the device
      // at a time while the step streams through them.
      mem.swapped += mem.optimizer - std::min(mem.optimizer, 12.0 * 40e6);
      mem.optimizer = std::min(mem.optimizer, 12.0 * 40e6);
    }
    // In-flight activations follow the stage's schedule.
    double cur = 0, peak = 0, cur_full = 0, peak_full = 0;
    int alive = 0, peak_alive = 0;
    // With separate W passes the inputs the weight gradients need stay until W.
    const Phase frees = splits_weight_gradients(p_.schedule) ? Phase::WeightGrad : Phase::Backward;
    for (const PipeOp& op : out_.schedule[stage]) {
      if (op.phase == Phase::Forward) {
        cur += chunk_act[stage][op.chunk];
        cur_full += chunk_act_full[stage][op.chunk];
        ++alive;
      } else if (op.phase == frees) {
        cur -= chunk_act[stage][op.chunk];
        cur_full -= chunk_act_full[stage][op.chunk];
        --alive;
      }
      if (cur > peak) {
        peak = cur;
        peak_alive = alive;
      }
      peak_full = std::max(peak_full, cur_full);
    }
    mem.activations_unoptimised = peak_full;
    // Swapping: a fraction of every chunk's saved activations waits in host memory between its
    // forward and its backward; one chunk's worth is back on the device (prefetched) at a time.
    const double f = p_.swap_activations;
    double largest = 0;
    for (double a : chunk_act[stage]) largest = std::max(largest, a);
    const double act_swapped = f > 0 ? std::max(0.0, f * (peak - largest)) : 0.0;
    mem.swapped += act_swapped;
    mem.activations = peak - act_swapped;
    mem.peak_inflight = peak_alive;
    mem.reserved = s_.cluster.device.memory_reserved.value();
  }

  // ---- p2p transfer time between consecutive virtual stages ------------------------------------
  {
    const double bytes = static_cast<double>(m_.hidden) * models::kActivationBytes * tok_.Tseq;
    p2p_seconds_.assign(V, 0.0);
    for (int v = 0; v + 1 < V; ++v) {
      const int s0 = stage_of_virtual(p_.schedule, p_.pp, v), s1 = stage_of_virtual(p_.schedule, p_.pp, v + 1);
      if (s0 == s1 || (bidirectional(p_.schedule) && v == p_.pp - 1)) continue;  // DualPipe: two pipelines
      const auto r = topo_.route(s0 * lay_.block, s1 * lay_.block);
      p2p_seconds_[v] = p2p_time(bytes, r).value();
    }
  }

  if (s_.training.documents.packed) sample_documents();
  emit(fid);
  if (m_.is_moe()) expert_load_stats();

  // Executed FLOPs per simulated rank.
  out_.executed_flops.resize(out_.ranks.size());
  for (std::size_t i = 0; i < out_.ranks.size(); ++i) out_.executed_flops[i] = stage_flops[out_.ranks[i].stage];
  out_.collectives = std::move(uses_);
  out_.graph = std::move(builder_).build();
  return std::move(out_);
}

void Lowering::emit(Fidelity fid) {
  const int pp = p_.pp, vpp = p_.vpp, m = p_.num_microbatches;
  // Simulated ranks of a stage are addressed by position (0 .. per_stage-1); sim_locals_ maps a
  // position to its local index inside the stage.
  const int per_stage = static_cast<int>(sim_locals_.size());
  // Fast fidelity: each pass becomes one task per stream (sums of the detailed durations).
  // With host dispatch, what the host thread adds to the pass timed alone becomes one task of
  // its own ahead of the pass's compute (breakdown: host-bound).
  const Tick launch_ticks = to_ticks(Seconds{s_.simulation.launch_overhead});
  if (fid == Fidelity::Fast) {
    for (int stage = 0; stage < pp; ++stage)
      for (int c = 0; c < vpp; ++c)
        for (Program* prog : {&fwd_[stage][c], &bwd_[stage][c], &wgt_[stage][c], &bwd_full_[stage][c]}) {
          if (prog->steps.empty()) continue;
          Tick host_extra = 0;
          if (launch_ticks > 0) {
            double unused = 0;
            std::array<double, kNumCats> unused_comm{};
            const double with_host = time_alone(*prog, launch_ticks, unused, unused_comm);
            const double alone = time_alone(*prog, 0, unused, unused_comm);
            host_extra = std::max<Tick>(0, to_ticks(Seconds{with_host}) - to_ticks(Seconds{alone}));
          }
          Program merged;
          std::array<Tick, kNumCats> by_cat{};
          std::array<GroupKind, kNumCats> grp{};
          std::array<Stream, kNumCats> stream{};
          for (const Step& st : prog->steps) {
            by_cat[st.cat] = add_ticks(by_cat[st.cat], st.duration);
            grp[st.cat] = st.group;
            stream[st.cat] = st.stream;
          }
          double flops = 0;
          for (const Step& st : prog->steps) flops += st.flops;
          int last = -1;
          if (host_extra > 0) {
            Step st;
            st.duration = host_extra;
            st.cat = kLaunch;
            st.stream = Stream::Compute;
            st.label = builder_.label(std::string(prog == &fwd_[stage][c] ? "F" : prog == &bwd_[stage][c] ? "B" : "W") +
                                      ".chunk" + std::to_string(c) + ".host_bound");
            merged.steps.push_back(st);
            last = 0;
          }
          for (int cat = 0; cat < kNumCats; ++cat) {
            if (by_cat[cat] == 0) continue;
            Step st;
            st.duration = by_cat[cat];
            st.cat = static_cast<sim::Category>(cat);
            st.stream = stream[cat];
            st.group = grp[cat];
            st.label = builder_.label(std::string(prog == &fwd_[stage][c] ? "F" : prog == &bwd_[stage][c] ? "B" : "W") +
                                      ".chunk" + std::to_string(c) +
                                      "." + category_names()[cat]);
            st.dep0 = last;
            st.flops = cat == kCompute ? flops : 0;
            merged.steps.push_back(st);
            last = static_cast<int>(merged.steps.size()) - 1;
          }
          merged.chain_end = last;
          merged.item_end.assign(prog->item_end.size(), last);
          *prog = std::move(merged);
        }
  }

  const auto& ranks = out_.ranks;
  auto rank_index = [&](int stage, int local) { return stage * per_stage + local; };
  // first/last task of each (stage, local, mb, chunk, phase)
  const std::size_t slots = static_cast<std::size_t>(pp) * per_stage * m * vpp * 3;
  std::vector<sim::TaskId> first(slots, sim::kNoTask), last(slots, sim::kNoTask);
  auto slot = [&](int stage, int local, int mb, int chunk, Phase ph) {
    return ((((static_cast<std::size_t>(stage) * per_stage + local) * m + mb) * vpp + chunk) * 3) +
           static_cast<std::size_t>(ph);
  };
  // Seconds per byte of a chunk's activations swapped one way (0: no swapping).
  const double host_bw = s_.cluster.device.host_bandwidth.value();
  const double swap_seconds = p_.swap_activations > 0 && host_bw > 0 ? p_.swap_activations / host_bw : 0.0;
  // With separate weight-gradient passes, a micro-batch's gradients are complete after its W.
  const bool split_w = splits_weight_gradients(p_.schedule);
  const Phase grads_done = split_w ? Phase::WeightGrad : Phase::Backward;

  std::vector<sim::ResourceId> res;
  std::vector<sim::TaskId> step_task;  // per step of the current program, per rank
  // Group-shared tasks (full fidelity): task per group for the current step.
  std::vector<sim::TaskId> group_task(static_cast<std::size_t>(lay_.block), sim::kNoTask);

  // A task runs on its stream; a collective at full fidelity holds the streams of all its
  // members, so it starts when the last member reaches it. Collectives do not hold link
  // resources: exclusive first-come-first-served links would serialise what the network
  // shares, and would break the symmetry of identical ranks. Bandwidth sharing between
  // concurrent collectives is the flow-level network model's job.
  // A collective is one task for all its members when they are all simulated (it starts when
  // the last one reaches it); otherwise each simulated member runs its own copy.
  auto shared_group = [&](GroupKind g, int local) {
    return g != GroupKind::None && lay_.members(g, local).size() > 1 && group_simulated(g, local);
  };
  auto resources_for = [&](const Step& st, int stage, int q, bool shared, std::vector<sim::ResourceId>& out) {
    out.clear();
    if (!shared) {
      out.push_back(ranks[rank_index(stage, q)].streams[static_cast<int>(st.stream)]);
      return;
    }
    for (int l : lay_.members(st.group, sim_locals_[q]))
      out.push_back(ranks[rank_index(stage, pos_of_local_[l])].streams[static_cast<int>(st.stream)]);
  };

  // Instantiate one program for every simulated rank of a stage; fills tasks_out[step][rank].
  const sim::LabelId launch_label = builder_.label("launch");
  const sim::LabelId sync_label = builder_.label("host_sync.tokens_per_expert");
  // One step of a program for every simulated rank of the stage (tasks_out[step][rank]).
  auto instantiate_step = [&](const Program& prog, std::size_t i, int stage, int mb, std::vector<sim::TaskId>& tasks_out) {
    const Step& st = prog.steps[i];
    const bool shared = shared_group(st.group, sim_locals_[0]);
    if (shared) std::fill(group_task.begin(), group_task.end(), sim::kNoTask);
    const Tick host = host_ticks(st, launch_ticks);  // the same for every rank of the stage
    for (int q = 0; q < per_stage; ++q) {
      const int local = sim_locals_[q];
      Tick dur = st.duration;
      if (st.role == Role::Attention) {
        const int dp_i = local / (p_.tp * p_.cp);
        dur = scale_ticks(dur, attention_factor_[dp_i][mb]);
      } else if (skewed_ && st.role != Role::None) {
        dur = routed_duration(st, mb, local);
      }
      sim::TaskId t;
      if (shared) {
        const int g = lay_.group_index(st.group, local);
        if (group_task[g] == sim::kNoTask) {
          resources_for(st, stage, q, true, res);
          group_task[g] = builder_.add_task(dur, st.cat, st.label, mb, res);
        }
        t = group_task[g];
      } else {
        resources_for(st, stage, q, false, res);
        t = builder_.add_task(dur, st.cat, st.label, mb, res);
      }
      tasks_out[i * per_stage + q] = t;
      // Host dispatch: the host thread issues every kernel in program order; a kernel cannot
      // start before its launch.
      if (host > 0) {
        const sim::TaskId ln = builder_.add_task(host, kLaunch, launch_label, mb,
                                                 {ranks[rank_index(stage, q)].streams[static_cast<int>(Stream::Launch)]});
        builder_.depend(ln, t);
      }
      // The dispatch all-to-all(v) needs the tokens per expert on the host (Megatron's
      // alltoall dispatcher copies them to the CPU): the host thread waits for the router's
      // result before it can issue anything further, so it cannot run ahead past a dispatch.
      if (launch_ticks > 0 && st.role == Role::ToExperts && (st.dep0 >= 0 || st.dep1 >= 0)) {
        const sim::TaskId sync = builder_.add_task(launch_ticks, kLaunch, sync_label, mb,
                                                   {ranks[rank_index(stage, q)].streams[static_cast<int>(Stream::Launch)]});
        if (st.dep0 >= 0) builder_.depend(tasks_out[st.dep0 * per_stage + q], sync);
        if (st.dep1 >= 0) builder_.depend(tasks_out[st.dep1 * per_stage + q], sync);
        builder_.depend(sync, t);
      }
      if (st.dep0 >= 0) builder_.depend(tasks_out[st.dep0 * per_stage + q], t);
      if (st.dep1 >= 0) builder_.depend(tasks_out[st.dep1 * per_stage + q], t);
    }
  };
  // Instantiate one program for every simulated rank of a stage; fills tasks_out[step][rank].
  auto instantiate = [&](const Program& prog, int stage, int mb, std::vector<sim::TaskId>& tasks_out) {
    tasks_out.assign(prog.steps.size() * per_stage, sim::kNoTask);
    for (std::size_t i = 0; i < prog.steps.size(); ++i) instantiate_step(prog, i, stage, mb, tasks_out);
  };
  // Forward-backward overlap (MindSpeed --moe-fb-overlap, DualPipe's core): a backward and a
  // forward of different micro-batches are issued as one interleaved stream of work. The issue
  // order comes from running the two programs together on the stage's streams (durations only,
  // inputs assumed ready): the next step of either program goes first if it can start first,
  // the backward winning ties — so the forward fills the compute stream while the backward
  // waits for its all-to-all, and the other way round. Tasks of a stream run in issue order.
  auto instantiate_pair = [&](const Program& a, int mb_a, std::vector<sim::TaskId>& out_a, const Program& b, int mb_b,
                              std::vector<sim::TaskId>& out_b, int stage, bool balance) {
    out_a.assign(a.steps.size() * per_stage, sim::kNoTask);
    out_b.assign(b.steps.size() * per_stage, sim::kNoTask);
    std::array<Tick, kNumStreams> stream_free{};
    std::vector<Tick> end_a(a.steps.size(), 0), end_b(b.steps.size(), 0);
    auto start_of = [&](const Step& st, const std::vector<Tick>& end) {
      Tick t = stream_free[static_cast<int>(st.stream)];
      if (st.dep0 >= 0) t = std::max(t, end[st.dep0]);
      if (st.dep1 >= 0) t = std::max(t, end[st.dep1]);
      return t;
    };
    // Of two steps that can start at once a communication goes first (so that it runs under
    // the other's compute); then, with `balance` (DualPipeV, whose pairs send both outputs on
    // at once), the program with more compute left, so the two end together instead of one
    // running on alone with its all-to-alls exposed; otherwise (moe_fb_overlap in 1F1B) the
    // backward `a`, whose gradient the previous stage waits for. Measured: balancing makes
    // DualPipeV's 718B step 11.00 -> 10.66 s but the small two-stage fb-overlap test 0.055 ->
    // 0.068 s.
    auto remaining = [](const Program& p) {
      std::vector<Tick> r(p.steps.size() + 1, 0);
      for (std::size_t k = p.steps.size(); k-- > 0;)
        r[k] = add_ticks(r[k + 1], p.steps[k].stream == Stream::Compute ? p.steps[k].duration : 0);
      return r;
    };
    const std::vector<Tick> rem_a = remaining(a), rem_b = remaining(b);
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
      instantiate_step(prog, k, stage, take_a ? mb_a : mb_b, take_a ? out_a : out_b);
    }
  };

  // Gradient buckets (Megatron's default: 40M parameters per bucket).
  constexpr double kBucketParams = 40e6;
  const bool distopt = p_.distributed_optimizer;
  // Emits the data-parallel collectives for `params_dense` / `params_expert` parameters of a
  // stage, split into buckets; returns the tasks created for each rank of the stage.
  auto emit_dp = [&](int stage, double params_dense, double params_expert, bool gather, const std::string& label) {
    std::vector<std::vector<sim::TaskId>> created(per_stage);
    // BF16 parameters; FP32 gradients (Megatron's default for BF16) unless grad_reduce_in_bf16.
    const double bytes_per_param = gather ? 2.0 : (p_.grad_reduce_in_bf16 ? 2.0 : 4.0);
    const Collective op = gather ? Collective::AllGather : (distopt ? Collective::ReduceScatter : Collective::AllReduce);
    for (auto [params, g] : {std::pair{params_dense, GroupKind::Dp}, std::pair{params_expert, GroupKind::Edp}}) {
      if (params <= 0 || shape(g).size <= 1) continue;
      const int buckets = std::max(1, static_cast<int>(std::ceil(params / kBucketParams)));
      const Step st = collective(g, op, params / buckets * bytes_per_param, kDpComm, Stream::Dp,
                                 label + (g == GroupKind::Edp ? ".expert" : ""), buckets);
      if (st.duration == 0) continue;
      const bool shared = shared_group(g, sim_locals_[0]);
      for (int bk = 0; bk < buckets; ++bk) {
        if (shared) std::fill(group_task.begin(), group_task.end(), sim::kNoTask);
        for (int q = 0; q < per_stage; ++q) {
          sim::TaskId t = sim::kNoTask;
          const int gi = shared ? lay_.group_index(g, sim_locals_[q]) : 0;
          if (!shared || group_task[gi] == sim::kNoTask) {
            resources_for(st, stage, q, shared, res);
            t = builder_.add_task(st.duration, st.cat, st.label, -1, res);
            if (shared) group_task[gi] = t;
          } else {
            t = group_task[gi];
          }
          created[q].push_back(t);
        }
      }
    }
    return created;
  };
  std::vector<std::vector<sim::TaskId>> dp_tasks(ranks.size());  // everything the optimizer waits for

  std::vector<sim::TaskId> tasks, tasks2;
  for (int stage = 0; stage < pp; ++stage) {
    compute_shapes(stage);
    const StageInfo& si = out_.stages[stage];
    // Distributed optimizer with overlapped parameter gather: the previous step's all-gather of
    // each item's buckets runs ahead, and the first forward of the item waits for its own
    // buckets only (Megatron waits per bucket in a forward pre-hook) — steady state of a
    // periodic step.
    std::vector<std::vector<std::vector<std::vector<sim::TaskId>>>> item_gather(vpp);  // [chunk][item][rank]
    if (distopt && p_.overlap_param_gather) {
      for (int c = 0; c < vpp; ++c) {
        const auto& items = si.chunk_items[c];
        for (std::size_t k = 0; k < items.size(); ++k) {
          const auto [pd, pe] = chunk_item_params_[stage][c][k];
          item_gather[c].push_back(emit_dp(stage, pd, pe, true, "param_gather." + item_prefix(w_.items[items[k]])));
        }
      }
    }
    std::vector<int> last_bwd_mb(vpp, -1);
    for (const PipeOp& op : out_.schedule[stage])
      if (op.phase == grads_done) last_bwd_mb[op.chunk] = op.microbatch;
    std::vector<bool> first_fwd_seen(vpp, false);

    auto program_of = [&](const PipeOp& op) -> const Program& {
      return op.phase == Phase::Forward    ? fwd_[stage][op.chunk]
             : op.phase == Phase::Backward ? bwd_[stage][op.chunk]
                                           : wgt_[stage][op.chunk];
    };
    // Bookkeeping of one instantiated pass: its first and last tasks, its inputs inside the
    // stage, parameter gathers before the first forward, gradient reduction after the last.
    // `fused`: the W of a backward instantiated whole (B and W in one program, DualPipeV's pairs).
    auto finish_op = [&](const PipeOp& op, const Program& prog, const std::vector<sim::TaskId>& tasks, bool fused = false) {
      int entry = 0;
      while (prog.steps[entry].dep0 >= 0 || prog.steps[entry].dep1 >= 0) ++entry;
      for (int l = 0; l < per_stage; ++l) {
        const std::size_t sl = slot(stage, l, op.microbatch, op.chunk, op.phase);
        first[sl] = tasks[static_cast<std::size_t>(entry) * per_stage + l];
        last[sl] = tasks[static_cast<std::size_t>(std::max(0, prog.chain_end)) * per_stage + l];
        if (op.phase == Phase::Backward)  // the chunk's own forward came first (loss on the last stage)
          builder_.depend(last[slot(stage, l, op.microbatch, op.chunk, Phase::Forward)], first[sl]);
        if (op.phase == Phase::WeightGrad && !fused) {  // needs the output gradients B received
          const sim::TaskId b = last[slot(stage, l, op.microbatch, op.chunk, Phase::Backward)];
          builder_.depend(b != sim::kNoTask ? b : last[slot(stage, l, op.microbatch, op.chunk, Phase::Forward)], first[sl]);
        }
        // Activation swapping: after the forward a share of the chunk's saved activations
        // goes to host memory; the backward waits for it to come back. Copies out and in
        // queue on two host streams (the link is full duplex), each in issue order.
        if (swap_seconds > 0 && op.phase != Phase::WeightGrad) {
          const double secs = swap_seconds * chunk_act_[stage][op.chunk];
          const sim::TaskId copy = builder_.add_task(
              to_ticks(Seconds{secs}), kSwap, builder_.label(op.phase == Phase::Forward ? "swap_out" : "swap_in"),
              op.microbatch,
              {ranks[rank_index(stage, l)].streams[static_cast<int>(op.phase == Phase::Forward ? Stream::Host : Stream::HostIn)]});
          if (op.phase == Phase::Forward) {
            builder_.depend(last[sl], copy);
          } else {
            builder_.depend(last[slot(stage, l, op.microbatch, op.chunk, Phase::Forward)], copy);
            builder_.depend(copy, first[sl]);
          }
        }
        if (op.phase == Phase::Forward && !first_fwd_seen[op.chunk]) {
          const auto& gathers = item_gather[op.chunk];
          for (std::size_t k = 0; k < gathers.size(); ++k) {
            const int begin = k == 0 ? entry : prog.item_end[k - 1] + 1;
            if (begin >= static_cast<int>(prog.steps.size())) continue;
            for (sim::TaskId g : gathers[k][l]) builder_.depend(g, tasks[static_cast<std::size_t>(begin) * per_stage + l]);
          }
        }
      }
      if (op.phase == Phase::Forward) first_fwd_seen[op.chunk] = true;
      // Overlapped gradient reduction: each item's buckets start once the chunk's last
      // backward has produced that item's gradients.
      if (op.phase == grads_done && p_.overlap_grad_reduce && op.microbatch == last_bwd_mb[op.chunk]) {
        const auto& items = si.chunk_items[op.chunk];
        for (int k = static_cast<int>(items.size()) - 1; k >= 0; --k) {
          const auto [pd, pe] = chunk_item_params_[stage][op.chunk][k];
          auto rs = emit_dp(stage, pd, pe, false, "grad_reduce." + item_prefix(w_.items[items[k]]));
          const int end_step = std::max(0, prog.item_end[k]);
          for (int l = 0; l < per_stage; ++l)
            for (sim::TaskId t : rs[l]) {
              builder_.depend(tasks[static_cast<std::size_t>(end_step) * per_stage + l], t);
              dp_tasks[rank_index(stage, l)].push_back(t);
            }
        }
      }
    };
    const auto& order = out_.schedule[stage];
    for (std::size_t oi = 0; oi < order.size(); ++oi) {
      throw_if_cancelled(cancel_);
      const PipeOp& op = order[oi];
      const Program& prog = program_of(op);
      if (prog.steps.empty()) continue;
      // Forward-backward overlap: a backward followed by the forward of another micro-batch
      // (1F1B's steady state) are issued together. The backward's gradient is what the stage
      // waits for; the next forward's input has usually arrived already, so pairing in this
      // order does not hold the forward back.
      // DualPipeV: a pair issued as B, F, W of the B's micro-batch and chunk overlaps the
      // forward with the whole backward (B and W), as DeepSeek's overlapped chunk does.
      if (pairs_forward_backward(p_.schedule) && op.phase == Phase::Backward && oi + 2 < order.size() &&
          order[oi + 1].phase == Phase::Forward && order[oi + 1].microbatch != op.microbatch &&
          order[oi + 2].phase == Phase::WeightGrad && order[oi + 2].microbatch == op.microbatch &&
          order[oi + 2].chunk == op.chunk && !program_of(order[oi + 1]).steps.empty()) {
        const PipeOp& next = order[oi + 1];
        const Program& whole = bwd_full_[stage][op.chunk];
        instantiate_pair(whole, op.microbatch, tasks, program_of(next), next.microbatch, tasks2, stage, true);
        finish_op(op, whole, tasks);
        finish_op(next, program_of(next), tasks2);
        finish_op(order[oi + 2], whole, tasks, true);
        oi += 2;
        continue;
      }
      if (p_.fb_overlap && op.phase == Phase::Backward && oi + 1 < order.size() &&
          order[oi + 1].phase == Phase::Forward && order[oi + 1].microbatch != op.microbatch &&
          !program_of(order[oi + 1]).steps.empty()) {
        const PipeOp& next = order[oi + 1];
        instantiate_pair(prog, op.microbatch, tasks, program_of(next), next.microbatch, tasks2, stage,
                         pairs_forward_backward(p_.schedule));
        finish_op(op, prog, tasks);
        finish_op(next, program_of(next), tasks2);
        ++oi;
        continue;
      }
      instantiate(prog, stage, op.microbatch, tasks);
      finish_op(op, prog, tasks);
    }
  }

  // Cross-stage sends: activations forward, gradients backward.
  const int V = pp * vpp;
  std::vector<sim::ResourceId> pres;
  for (int stage = 0; stage < pp; ++stage) {
    for (const PipeOp& op : out_.schedule[stage]) {
      if (op.phase == Phase::WeightGrad) continue;  // nothing to send
      const int v = virtual_stage(p_.schedule, pp, stage, op.chunk);
      const bool fwd = op.phase == Phase::Forward;
      const int v_next = fwd ? v + 1 : v - 1;
      if (v_next < 0 || v_next >= V) continue;
      if (bidirectional(p_.schedule) && std::min(v, v_next) == pp - 1) continue;  // the two directions do not meet
      const int s_next = stage_of_virtual(p_.schedule, pp, v_next), c_next = chunk_of_virtual(p_.schedule, pp, v_next);
      const double secs = fwd ? p2p_seconds_[v] : p2p_seconds_[v_next];
      for (int l = 0; l < per_stage; ++l) {
        const sim::TaskId src = last[slot(stage, l, op.microbatch, op.chunk, op.phase)];
        const sim::TaskId dst = first[slot(s_next, l, op.microbatch, c_next, op.phase)];
        if (src == sim::kNoTask || dst == sim::kNoTask) continue;
        if (secs <= 0) {
          builder_.depend(src, dst);
          continue;
        }
        const SimRank& a = ranks[rank_index(stage, l)];
        const SimRank& b = ranks[rank_index(s_next, l)];
        pres.clear();
        pres.push_back(a.streams[static_cast<int>(Stream::Pp)]);
        const bool same_node = topo_.node_of(a.global_rank) == topo_.node_of(b.global_rank);
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

  // End of step: gradient reduction (unless overlapped), optimizer, parameter all-gather.
  for (int stage = 0; stage < pp; ++stage) {
    compute_shapes(stage);
    const StageInfo& si = out_.stages[stage];
    if (!p_.overlap_grad_reduce) {
      auto rs = emit_dp(stage, si.params_dense, si.params_expert, false, "grad_reduce");
      for (int l = 0; l < per_stage; ++l)
        for (sim::TaskId t : rs[l]) {
          for (int c = 0; c < vpp; ++c)
            for (int mb = 0; mb < m; ++mb)
              for (Phase ph : {Phase::Backward, Phase::WeightGrad}) {
                const sim::TaskId b = last[slot(stage, l, mb, c, ph)];
                if (b != sim::kNoTask) builder_.depend(b, t);
              }
          dp_tasks[rank_index(stage, l)].push_back(t);
        }
    }
    // Adam on the local shard: read parameter, gradient, m, v (FP32), write parameter, m, v
    // and the BF16 copy, plus the gradient-norm pass: about 34 bytes per shard parameter.
    const double shard = distopt ? si.params_dense / (p_.dp * p_.cp) + si.params_expert / lay_.edp
                                 : si.params_dense + si.params_expert;
    const Seconds opt_t = cm_.memory_bound(Bytes{34.0 * shard});
    out_.optimizer_seconds = std::max(out_.optimizer_seconds, opt_t.value());
    std::vector<sim::TaskId> opt(per_stage);
    for (int l = 0; l < per_stage; ++l) {
      const SimRank& r = ranks[rank_index(stage, l)];
      opt[l] = builder_.add_task(to_ticks(opt_t), kOptimizer, builder_.label("optimizer_step"), -1,
                                 {r.streams[static_cast<int>(Stream::Compute)]});
      for (int mb = 0; mb < m; ++mb)
        for (int c = 0; c < vpp; ++c)
          for (Phase ph : {Phase::Backward, Phase::WeightGrad}) {
            const sim::TaskId t = last[slot(stage, l, mb, c, ph)];
            if (t != sim::kNoTask) builder_.depend(t, opt[l]);
          }
      for (sim::TaskId t : dp_tasks[rank_index(stage, l)]) builder_.depend(t, opt[l]);
      // Optimizer states in host memory (MindSpeed --swap-optimizer): they are fetched before
      // the step, once the stage's last forward has run (the fetch overlaps the cooldown
      // backwards); writing them back overlaps the next step's forwards and is not charged.
      if (p_.swap_optimizer && host_bw > 0) {
        const Seconds fetch{12.0 * shard / host_bw};
        const sim::TaskId in = builder_.add_task(to_ticks(fetch), kSwap, builder_.label("swap_in.optimizer_states"), -1,
                                                 {r.streams[static_cast<int>(Stream::HostIn)]});
        // Each chunk's last forward in the stage's order (DualPipe's chunk 0 ends at m/2 - 1).
        std::vector<int> last_fwd_mb(vpp, -1);
        for (const PipeOp& op : out_.schedule[stage])
          if (op.phase == Phase::Forward) last_fwd_mb[op.chunk] = op.microbatch;
        for (int c = 0; c < vpp; ++c) {
          if (last_fwd_mb[c] < 0) continue;
          const sim::TaskId f = last[slot(stage, l, last_fwd_mb[c], c, Phase::Forward)];
          if (f != sim::kNoTask) builder_.depend(f, in);
        }
        builder_.depend(in, opt[l]);
      }
    }
    // Load-aware expert placement: the moved experts' weights and optimizer shards are fetched
    // after the optimizer step (every interval_steps, amortised per step).
    if (const double mig = migration_seconds(stage); mig > 0) {
      out_.expert_load.migration_seconds = std::max(out_.expert_load.migration_seconds, mig);
      for (int l = 0; l < per_stage; ++l) {
        const SimRank& r = ranks[rank_index(stage, l)];
        const sim::TaskId t = builder_.add_task(to_ticks(Seconds{mig}), kEpComm, builder_.label("expert_migration"), -1,
                                                {r.streams[static_cast<int>(Stream::Ep)]});
        builder_.depend(opt[l], t);
      }
    }
    if (distopt && !p_.overlap_param_gather) {
      auto ag = emit_dp(stage, si.params_dense, si.params_expert, true, "param_gather");
      for (int l = 0; l < per_stage; ++l)
        for (sim::TaskId t : ag[l]) builder_.depend(opt[l], t);
    }
  }
}


PlanEstimate Lowering::estimate(EstimatorCache& cache) {
  PlanEstimate e;
  const int V = p_.virtual_stages();
  const int m = p_.num_microbatches;
  const int pp = p_.pp, vpp = p_.vpp;
  compute_shapes(0);

  const Tick launch_ticks = to_ticks(Seconds{s_.simulation.launch_overhead});
  const int group = p_.recompute_method == RecomputeMethod::Uniform ? std::max(1, p_.recompute_num_layers) : 1;
  auto cost_of = [&](int item_idx, bool full) -> const ItemCost& {
    const auto& item = w_.items[item_idx];
    const bool decoder = item.kind == models::ItemKind::Decoder;
    const std::array<int, 16> key{item.program,
                                  decoder ? 1 : static_cast<int>(item.kind) + 10,
                                  full ? 1 : 0,
                                  group,
                                  p_.tp,
                                  p_.cp,
                                  lay_.ep,
                                  lay_.etp,
                                  p_.mbs,
                                  p_.sequence_parallel ? 1 : 0,
                                  static_cast<int>(p_.recompute),
                                  static_cast<int>(p_.recompute_modules),
                                  p_.tp_comm_overlap ? 1 : 0,
                                  static_cast<int>(p_.alltoall),
                                  p_.pp == 1 ? 1 : 0,
                                  0};
    auto it = cache.items.find(key);
    if (it != cache.items.end()) return it->second;
    const ItemProgram ip = build_item(item, full, group, 0);
    ItemCost c;
    c.fwd_s = time_alone(ip.fwd, launch_ticks, c.fwd_compute_s, c.comm_s);
    c.bwd_s = time_alone(ip.bwd, launch_ticks, c.bwd_compute_s, c.comm_s);
    for (const Step& st : ip.bwd.steps)
      if (st.wgrad) c.wgrad_s += to_seconds(st.duration).value();
    c.act_bytes = ip.act_bytes;
    c.transient = ip.transient;
    c.params_dense = ip.params_dense;
    c.params_expert = ip.params_expert;
    return cache.items.emplace(key, c).first->second;
  };

  // Partition on layer costs (the water-filling start of the automatic partition).
  const bool full_all = p_.recompute == Recompute::Full && p_.recompute_method == RecomputeMethod::Uniform;
  std::vector<double> layer_cost;
  double first_extra = 0, last_extra = 0;
  for (std::size_t i = 0; i < w_.items.size(); ++i) {
    const auto& item = w_.items[i];
    const ItemCost& c = cost_of(static_cast<int>(i), p_.recompute == Recompute::Full);
    if (item.kind == models::ItemKind::Decoder) layer_cost.push_back(c.fwd_s + c.bwd_s);
    else if (item.kind == models::ItemKind::Embedding) first_extra += c.fwd_s + c.bwd_s;
    else last_extra += c.fwd_s + c.bwd_s;
  }
  const std::vector<int> counts = partition(layer_cost, first_extra, last_extra, false);

  // Stages: per micro-batch forward and backward time, memory.
  std::vector<double> F(pp, 0.0), B(pp, 0.0), act_chunk_max(pp, 0.0), act_sum(pp, 0.0), trans(pp, 0.0);
  std::vector<double> Cmp(pp, 0.0), Wg(pp, 0.0);  // compute and weight-gradient time per micro-batch
  std::vector<double> pd(pp, 0.0), pe(pp, 0.0);
  double compute_total = 0, comm_total = 0;
  std::array<double, kNumCats> comm_cat{};
  {
    const std::vector<std::vector<int>> vs_items = virtual_stage_items(counts);
    for (int v = 0; v < V; ++v) {
      const int st = stage_of_virtual(p_.schedule, pp, v);
      const std::vector<int>& items = vs_items[v];
      double act = 0;
      int pos = 0;
      for (int idx : items) {
        bool full = p_.recompute == Recompute::Full;
        if (w_.items[idx].kind == models::ItemKind::Decoder && p_.recompute == Recompute::Full && !full_all)
          full = pos++ < p_.recompute_num_layers;
        const ItemCost& c = cost_of(idx, full);
        F[st] += c.fwd_s;
        B[st] += c.bwd_s;
        Cmp[st] += c.fwd_compute_s + c.bwd_compute_s;
        Wg[st] += c.wgrad_s;
        act += c.act_bytes;
        trans[st] = std::max(trans[st], c.transient);
        pd[st] += c.params_dense;
        pe[st] += c.params_expert;
        if (st == 0) {
          compute_total += c.fwd_compute_s + c.bwd_compute_s;
          comm_total += (c.fwd_s + c.bwd_s) - (c.fwd_compute_s + c.bwd_compute_s);
          for (int k = 0; k < kNumCats; ++k) comm_cat[k] += c.comm_s[k];
        }
      }
      act_chunk_max[st] = std::max(act_chunk_max[st], act);
      act_sum[st] += act;
    }
  }
  // Memory: weights, FP32 gradients, sharded optimizer, activations in flight, reserve.
  const double wbytes = prec_ == models::Precision::FP8 ? 3.0 : 2.0;
  const double dense_shard = p_.distributed_optimizer ? static_cast<double>(p_.dp * p_.cp) : 1.0;
  const double expert_shard = p_.distributed_optimizer ? static_cast<double>(lay_.edp) : 1.0;
  e.capacity_bytes = s_.cluster.device.hbm_capacity.value();
  const ScheduleKind sk = p_.schedule;
  const bool bidir = bidirectional(sk);
  for (int st = 0; st < pp; ++st) {
    // Chunk activations alive at the peak, as the schedules generate them (the zero-bubble
    // ones hold a chunk's activations until its W).
    int alive = 0;
    if (sk == ScheduleKind::ZeroBubbleV || sk == ScheduleKind::DualPipeV) {
      alive = std::min(2 * m, 2 * pp + 1);
    } else if (bidir) {
      alive = std::min(m, pp + 1);  // DeepSeek's table: PP + 1 micro-batches
    } else if (vpp > 1) {
      const int total = m * vpp;
      const int warm = (m == pp) ? total : std::min((pp - st - 1) * 2 + (vpp - 1) * pp, total);
      alive = std::min(total, warm + 1);
    } else {
      alive = std::min(pp - st, m);
      // Deferred Ws keep a few more micro-batches (the lowering's list schedule: +3 on the
      // 718B's peak stage, +1..2 on a 4-stage Llama): two.
      if (sk == ScheduleKind::ZeroBubbleH1) alive = std::min(m, alive + 2);
    }
    double act = alive * (act_sum[st] / vpp);
    // Swapped activations (all chunks but the one prefetched) and optimizer states, as in the
    // lowering's memory model.
    if (p_.swap_activations > 0) act -= p_.swap_activations * std::max(0.0, act - act_chunk_max[st]);
    double opt_states = 12.0 * (pd[st] / dense_shard + pe[st] / expert_shard);
    if (p_.swap_optimizer) opt_states = std::min(opt_states, 12.0 * 40e6);
    const double mem = (pd[st] + pe[st]) * (wbytes + 4.0) + opt_states + act + trans[st] +
                       s_.cluster.device.memory_reserved.value();
    e.peak_memory_bytes = std::max(e.peak_memory_bytes, mem);
  }
  e.fits = e.peak_memory_bytes <= e.capacity_bytes;

  // Pipeline: the slowest stage for every micro-batch, plus the others' fill and drain.
  double tmax = 0, tsum = 0;
  int slow = 0;
  for (int st = 0; st < pp; ++st) {
    const double t = F[st] + B[st];
    if (t > tmax) {
      tmax = t;
      slow = st;
    }
    tsum += t;
  }
  double p2p = 0;
  if (pp > 1) {
    const double bytes = static_cast<double>(m_.hidden) * models::kActivationBytes * tok_.Tseq;
    p2p = p2p_time(bytes, topo_.route(0, lay_.block)).value();
  }
  // Fill and drain: 1F1B's (p - 1) passes of the other stages, shortened by the schedule.
  // Zero-bubble: W fills them ((p - 1)(F + B - W), Qi et al.; ZB-V in half-size chunks);
  // DualPipe(V): (p/2 - 1)(F&B + B - 3W) in whole stages (DeepSeek's table), and the steady
  // state runs F&B pairs whose all-to-alls hide behind the other pass's compute (so does
  // moe_fb_overlap's). DualPipe runs each micro-batch on one of a device's two stages.
  double wsum = 0;
  for (int st = 0; st < pp; ++st) wsum += Wg[st];
  const double half = bidir ? 0.5 : 1.0;  // per micro-batch, a DualPipe device runs one of its two stages
  const double w_share = tsum > 0 ? wsum / tsum : 0.0;
  const bool paired = pairs_forward_backward(sk) || p_.fb_overlap;
  // Steady state per micro-batch on the slowest stage: paired passes cost their compute or
  // their communication, whichever is longer.
  const double t_steady = paired ? half * std::max(Cmp[slow], tmax - Cmp[slow]) : half * tmax;
  double fill = (tsum - tmax) / vpp;
  switch (sk) {
    case ScheduleKind::ZeroBubbleH1: fill = (tsum - tmax) * (1.0 - w_share); break;
    case ScheduleKind::ZeroBubbleV: fill = 0.5 * (tsum - tmax) * std::max(0.0, 1.0 - 2.0 * w_share); break;
    case ScheduleKind::DualPipe:
    case ScheduleKind::DualPipeV: {
      // DeepSeek's PP counts stages: DualPipe's p, each half of a device's two; DualPipeV's 2p
      // chunks, each half of a device's pair.
      const double n = bidir ? pp / 2.0 - 1.0 : pp - 1.0;
      const double pair = std::max(Cmp[slow], tmax - Cmp[slow]);
      fill = std::max(0.0, n * 0.5 * (pair + B[slow] - 3.0 * Wg[slow]));
      break;
    }
    default: break;
  }
  const double pipe = m * t_steady + fill + 2.0 * (pp - 1) * p2p;
  // Data-parallel traffic and how much of it the last backward / first forward hides.
  double dp_exposed = 0;
  {
    const double gb = p_.grad_reduce_in_bf16 ? 2.0 : 4.0;
    auto coll = [&](GroupKind g, Collective c, double bytes) {
      const GroupShape& sh = shape(g);
      if (sh.size <= 1 || bytes <= 0) return 0.0;
      const double buckets = std::max(1.0, std::ceil(bytes / gb / 40e6));
      return buckets * collective_cost(c, bytes / buckets, sh).time.value();
    };
    const Collective red = p_.distributed_optimizer ? Collective::ReduceScatter : Collective::AllReduce;
    for (int st = 0; st < pp; ++st) {
      const double rs = coll(GroupKind::Dp, red, pd[st] * gb) + coll(GroupKind::Edp, red, pe[st] * gb);
      const double ag = p_.distributed_optimizer
                            ? coll(GroupKind::Dp, Collective::AllGather, pd[st] * 2.0) +
                                  coll(GroupKind::Edp, Collective::AllGather, pe[st] * 2.0)
                            : 0.0;
      const double rs_exp = p_.overlap_grad_reduce ? std::max(0.0, rs - B[st] / vpp) : rs;
      const double ag_exp = p_.overlap_param_gather ? std::max(0.0, ag - F[st] / vpp) : ag;
      dp_exposed = std::max(dp_exposed, rs_exp + ag_exp);
    }
  }
  const double shard = p_.distributed_optimizer ? (pd[slow] / (p_.dp * p_.cp) + pe[slow] / lay_.edp) : pd[slow] + pe[slow];
  const double opt = cm_.memory_bound(Bytes{34.0 * shard}).value();
  e.step_s = pipe + dp_exposed + opt;
  e.tokens_per_s = s_.training.tokens_per_step() / e.step_s;
  e.mfu = w_.model_flops_per_token * e.tokens_per_s /
          (static_cast<double>(s_.cluster.devices) * s_.cluster.device.mfu_peak(prec_).value());
  // Where the time goes, for the "main bottleneck" column.
  const double per_mb = F[0] + B[0];
  const double frac_comm = per_mb > 0 ? comm_total / per_mb : 0.0;
  e.compute_s = m * half * tmax * (1.0 - frac_comm);
  e.exposed_comm_s = std::max(0.0, m * t_steady - e.compute_s);
  e.bubble_s = pipe - m * t_steady;
  e.dp_exposed_s = dp_exposed;
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
      if (comm_cat[k] > comm_cat[best_cat]) best_cat = k;
    consider(e.exposed_comm_s, best_cat == kEpComm ? "ep_comm" : best_cat == kCpComm ? "cp_comm" : "tp_comm");
  }
  consider(e.bubble_s, "bubble");
  consider(e.dp_exposed_s, "dp_comm");
  return e;
}

}  // namespace

Lowered lower(const Scenario& s, const topologies::Topology& topo, const models::Workload& w,
              const CancelFlag* cancel) {
  Lowering l(s, s.plan, topo, w);
  l.set_cancel(cancel);
  return l.run();
}

Estimator::Estimator(const Scenario& base, const topologies::Topology& topo, const models::Workload& w)
    : base_(base), topo_(topo), w_(w), cache_(new EstimatorCache) {}

Estimator::~Estimator() { delete cache_; }

PlanEstimate Estimator::estimate(const Plan& plan) {
  Lowering l(base_, plan, topo_, w_, &cache_->shapes);
  return l.estimate(*cache_);
}

}  // namespace moesim::strategies
