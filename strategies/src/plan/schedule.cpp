#include "moesim/strategies/plan/schedule.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "moesim/sim/units.hpp"

namespace moesim::strategies {
namespace {

/// The first instant after `now` at which a stage frees or a pass ends (-1: none).
long long next_event(long long now, const std::vector<long long>& free_at, const std::vector<std::vector<long long>>& f_end,
                     const std::vector<std::vector<long long>>& b_end) {
  long long next = -1;
  auto consider = [&](long long t) {
    if (t > now && (next < 0 || t < next)) next = t;
  };
  for (long long t : free_at) consider(t);
  for (const auto* ends : {&f_end, &b_end})
    for (const auto& row : *ends)
      for (long long t : row) consider(t);
  return next;
}

/// Duration of pass k (0 F, 1 B, 2 W) of stage s, chunk c; equal passes when costs is empty.
long long pass_cost(const StageCosts& costs, int s, int c, int k) {
  if (costs.empty()) return 1000;
  const PassCosts& pc = costs[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
  return std::max<long long>(1, k == 0 ? pc.f : k == 1 ? pc.b : pc.w);
}

StageOrder one_f_one_b(int p, int s, int m) {
  StageOrder o;
  o.reserve(2 * static_cast<std::size_t>(m));
  const int warmup = std::min(p - s - 1, m);
  for (int i = 0; i < warmup; ++i) o.push_back({Phase::Forward, i, 0});
  for (int i = 0; i < m - warmup; ++i) {
    o.push_back({Phase::Forward, warmup + i, 0});
    o.push_back({Phase::Backward, i, 0});
  }
  for (int i = m - warmup; i < m; ++i) o.push_back({Phase::Backward, i, 0});
  return o;
}

/// Interleaved 1F1B's warm-up: (p - s - 1) x 2 + (v - 1) x p forwards, capped at all of them
/// (Megatron-core schedules.py get_pp_rank_microbatches; torch.distributed.pipelining's
/// ScheduleInterleaved1F1B._get_warmup_ops counts the same). Megatron-core before 2024-11-01
/// (commit 4295be1a) also ran every forward first when the micro-batches equalled the stages;
/// no published run moesim is checked against had that shape (vpp > 1 with m = p) before then.
int interleaved_warmup(int p, int v, int s, int m) {
  const int total = m * v;
  return std::min((p - s - 1) * 2 + (v - 1) * p, total);
}

StageOrder interleaved(int p, int v, int s, int m) {
  const int total = m * v;
  const int warmup = interleaved_warmup(p, v, s, m);
  auto fwd = [&](int k) {
    const int chunk = (k / p) % v;
    const int mb = (k / (p * v)) * p + k % p;
    return PipeOp{Phase::Forward, mb, chunk};
  };
  auto bwd = [&](int k) {
    const int chunk = v - 1 - (k / p) % v;
    const int mb = (k / (p * v)) * p + k % p;
    return PipeOp{Phase::Backward, mb, chunk};
  };
  StageOrder o;
  o.reserve(2 * static_cast<std::size_t>(total));
  for (int k = 0; k < warmup; ++k) o.push_back(fwd(k));
  const int remaining = total - warmup;
  for (int k = 0; k < remaining; ++k) {
    o.push_back(fwd(warmup + k));
    o.push_back(bwd(k));
  }
  for (int k = remaining; k < total; ++k) o.push_back(bwd(k));
  return o;
}

/// ZB-H1 as a list schedule over the stages' pass durations: every stage, whenever it is
/// free, runs a ready B (it lies on the gradient chain); else a pending W if more than p - s
/// are waiting (the inputs of deferred weight GEMMs stay in memory); else a forward if no
/// more than p - s micro-batches are between their F and their B (1F1B's in-flight count);
/// else a pending W. The order comes from a small event simulation of the pipeline without
/// communication; the engine then times the real passes in that order.
std::vector<StageOrder> zero_bubble_h1(int p, int m, const StageCosts& costs) {
  constexpr long long kUnset = -1;
  std::vector<StageOrder> out(static_cast<std::size_t>(p));
  std::vector<int> next_f(p, 0), w_done(p, 0), b_done(p, 0);
  std::vector<long long> free_at(p, 0);
  std::vector<std::vector<long long>> f_end(p, std::vector<long long>(m, kUnset)), b_end = f_end;
  std::vector<std::vector<int>> w_queue(p);
  std::vector<std::size_t> w_head(p, 0);
  auto cost = [&](int s, int k) { return pass_cost(costs, s, 0, k); };
  long long now = 0;
  int remaining = 3 * p * m;
  while (remaining > 0) {
    for (int s = 0; s < p; ++s) {
      if (free_at[s] > now) continue;
      const int nb = b_done[s];  // Bs run in micro-batch order
      const bool b_ready = nb < m && f_end[s][nb] != kUnset && f_end[s][nb] <= now &&
                           (s == p - 1 || (b_end[s + 1][nb] != kUnset && b_end[s + 1][nb] <= now));
      const int nf = next_f[s];
      const bool f_ready = nf < m && (s == 0 || (f_end[s - 1][nf] != kUnset && f_end[s - 1][nf] <= now)) &&
                           nf - b_done[s] < p - s;
      const bool w_ready = w_head[s] < w_queue[s].size();
      const bool w_due = w_ready && b_done[s] - w_done[s] > p - s;
      long long d = 0;
      if (b_ready) {
        out[s].push_back({Phase::Backward, nb, 0});
        d = cost(s, 1);
        b_end[s][nb] = add_ticks(now, d);
        ++b_done[s];
        w_queue[s].push_back(nb);
      } else if (w_due || (w_ready && !f_ready)) {
        out[s].push_back({Phase::WeightGrad, w_queue[s][w_head[s]++], 0});
        d = cost(s, 2);
        ++w_done[s];
      } else if (f_ready) {
        out[s].push_back({Phase::Forward, nf, 0});
        d = cost(s, 0);
        f_end[s][nf] = add_ticks(now, d);
        ++next_f[s];
      } else {
        continue;
      }
      free_at[s] = add_ticks(now, d);
      --remaining;
    }
    // Advance to the next time anything can change.
    const long long next = next_event(now, free_at, f_end, b_end);
    if (next < 0) break;
    now = next;
  }
  if (remaining > 0) throw std::logic_error("zero-bubble list schedule stalled with passes left");
  return out;
}

/// ZB-V as a list schedule over virtual stages placed as a V. Activations are held from a
/// chunk's F to its W; max_open (2p: 1F1B's memory in half-size chunks) bounds them. A free stage runs a ready B (lowest micro-batch, then the chunk nearer the loss),
/// else a W if the budget is full, else a ready F (the second chunk first, to reach the loss
/// and start backwards), else a W. A first-chunk F starts only within the budget; a
/// second-chunk F always may, since it leads to the loss and its B, so a stage that filled its
/// budget with first chunks cannot deadlock.
std::vector<StageOrder> zero_bubble_v(int p, int m, const StageCosts& costs, int max_open) {
  constexpr long long kUnset = -1;
  const int V = 2 * p;
  auto vs = [&](int s, int c) { return c == 0 ? s : V - 1 - s; };
  std::vector<StageOrder> out(static_cast<std::size_t>(p));
  std::vector<std::vector<long long>> f_end(V, std::vector<long long>(m, kUnset)), b_end = f_end;
  std::vector<std::array<int, 2>> next_f(p, {0, 0}), next_b(p, {0, 0});
  std::vector<int> open(p, 0), w_done(p, 0), b_count(p, 0);
  std::vector<std::vector<std::pair<int, int>>> w_queue(p);  // (chunk, micro-batch)
  std::vector<std::size_t> w_head(p, 0);
  std::vector<long long> free_at(p, 0);
  auto cost = [&](int s, int c, int k) { return pass_cost(costs, s, c, k); };
  auto done = [](long long t, long long now) { return t != kUnset && t <= now; };
  long long now = 0;
  int remaining = 3 * V * m;
  while (remaining > 0) {
    for (int s = 0; s < p; ++s) {
      if (free_at[s] > now) continue;
      // Ready backward: micro-batches in order within each chunk.
      int bc = -1;
      for (int c : {1, 0}) {
        const int mb = next_b[s][c], v = vs(s, c);
        if (mb >= m || !done(f_end[v][mb], now)) continue;
        if (v < V - 1 && !done(b_end[v + 1][mb], now)) continue;
        if (bc < 0 || mb < next_b[s][bc]) bc = c;
      }
      // Chunks whose activations are held: forward done, weight gradient not yet.
      const int held = open[s] + b_count[s] - w_done[s];
      int fc = -1;
      for (int c : {1, 0}) {
        const int mb = next_f[s][c], v = vs(s, c);
        if (mb >= m || (c == 0 && held >= max_open)) continue;
        if (v > 0 && !done(f_end[v - 1][mb], now)) continue;
        fc = c;
        break;
      }
      const bool w_ready = w_head[s] < w_queue[s].size();
      const bool w_due = w_ready && held >= max_open;
      long long d = 0;
      if (bc >= 0) {
        const int mb = next_b[s][bc]++;
        out[s].push_back({Phase::Backward, mb, bc});
        d = cost(s, bc, 1);
        b_end[vs(s, bc)][mb] = add_ticks(now, d);
        w_queue[s].push_back({bc, mb});
        ++b_count[s];
        --open[s];
      } else if (w_due || (w_ready && fc < 0)) {
        const auto [c, mb] = w_queue[s][w_head[s]++];
        out[s].push_back({Phase::WeightGrad, mb, c});
        d = cost(s, c, 2);
        ++w_done[s];
      } else if (fc >= 0) {
        const int mb = next_f[s][fc]++;
        out[s].push_back({Phase::Forward, mb, fc});
        d = cost(s, fc, 0);
        f_end[vs(s, fc)][mb] = add_ticks(now, d);
        ++open[s];
      } else {
        continue;
      }
      free_at[s] = add_ticks(now, d);
      --remaining;
    }
    // Advance to the next time anything can change.
    const long long next = next_event(now, free_at, f_end, b_end);
    if (next < 0) break;
    now = next;
  }
  if (remaining > 0) throw std::logic_error("zero-bubble list schedule stalled with passes left");
  return out;
}

/// DualPipeV (DeepSeek's DualPipe repository, dualpipev.py, after Sea AI Lab's "cut-in-half"):
/// eight phases per rank r of R, with m >= 2R micro-batches; chunk 0 is virtual stage r and
/// chunk 1 is 2R - 1 - r. "B" is a backward whose weight gradients are deferred to a later W
/// (zero-bubble), "BW" a full backward (B and its W at once), "F&B" an overlapped pair, issued
/// here as B then F (then W for a full backward) so that lowering interleaves them:
///   1. 2(R-r-1) x F0            2. (r+1) x F0 F1          3. (R-r-1) x B1 W F1
///   4. (m-2R+r+1) x F0&BW1, F1&BW0 (the last rank's first F0, BW1 not overlapped)
///   5. (R-r-1) x BW1, F1&BW0    6. (r+1) x B1, B0 (weight gradients deferred from the middle:
///      B1 on odd ranks, B0 on even ranks)
///   7. (R-r-1) x W B0           8. (r+1) x W
/// Deferred Ws run first in, first out.
StageOrder dualpipe_v_rank(int R, int r, int m) {
  StageOrder o;
  std::array<int, 2> nf{0, 0}, nb{0, 0};
  std::vector<std::pair<int, int>> deferred;  // (chunk, micro-batch), FIFO
  std::size_t head = 0;
  auto F = [&](int c) { o.push_back({Phase::Forward, nf[c]++, c}); };
  auto B = [&](int c, bool defer_w) {
    const int mb = nb[c]++;
    o.push_back({Phase::Backward, mb, c});
    if (defer_w) deferred.push_back({c, mb});
    return mb;
  };
  auto W_of = [&](int c, int mb) { o.push_back({Phase::WeightGrad, mb, c}); };
  auto W = [&] {
    if (head < deferred.size()) {
      W_of(deferred[head].first, deferred[head].second);
      ++head;
    }
  };
  auto BW = [&](int c) { W_of(c, B(c, false)); };
  auto overlap = [&](int fc, int bc) {  // F(fc) & full B(bc)
    const int mb = B(bc, false);
    F(fc);
    W_of(bc, mb);
  };
  for (int i = 0; i < 2 * (R - r - 1); ++i) F(0);
  for (int i = 0; i < r + 1; ++i) {
    F(0);
    F(1);
  }
  for (int i = 0; i < R - r - 1; ++i) {
    B(1, true);
    W();
    F(1);
  }
  for (int i = 0; i < m - 2 * R + r + 1; ++i) {
    if (i == 0 && r == R - 1) {
      F(0);
      BW(1);
    } else {
      overlap(0, 1);
    }
    overlap(1, 0);
  }
  for (int i = 0; i < R - r - 1; ++i) {
    BW(1);
    overlap(1, 0);
  }
  bool zb = false;
  for (int i = 0; i < r + 1; ++i) {
    if (i == (r + 1) / 2 && r % 2 == 1) zb = true;
    if (zb) B(1, true);
    else BW(1);
    if (i == (r + 1) / 2 && r % 2 == 0) zb = true;
    if (zb) B(0, true);
    else BW(0);
  }
  for (int i = 0; i < R - r - 1; ++i) {
    W();
    B(0, true);
  }
  while (head < deferred.size()) W();
  return o;
}

std::vector<StageOrder> dualpipe_v(int R, int m) {
  std::vector<StageOrder> out(static_cast<std::size_t>(R));
  for (int r = 0; r < R; ++r) out[static_cast<std::size_t>(r)] = dualpipe_v_rank(R, r, m);
  return out;
}

/// DualPipe (DeepSeek's dualpipe.py): the same eight phases on p/2 rank pairs with m/2
/// micro-batches per direction. Rank r plays rank min(r, p-1-r) of DualPipeV; its phase 0 is
/// the direction that reaches it first (chunk 0, fed from device 0, on the first half of the
/// ranks; chunk 1, fed from device p - 1, on the second half). Chunk 1's micro-batches are
/// numbered after chunk 0's.
std::vector<StageOrder> dualpipe(int p, int m) {
  std::vector<StageOrder> out(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    const bool second_half = r >= p / 2;
    for (PipeOp op : dualpipe_v_rank(p / 2, std::min(r, p - 1 - r), m / 2)) {
      if (second_half) op.chunk = 1 - op.chunk;
      if (op.chunk == 1) op.microbatch += m / 2;
      out[static_cast<std::size_t>(r)].push_back(op);
    }
  }
  return out;
}

// ---- closed forms for the search screen ----------------------------------------------------

/// 1F1B keeps p - s micro-batches in flight; interleaved 1F1B its warm-up plus one.
int inflight_interleaved_or_1f1b(int pp, int vpp, int m, int stage) {
  if (vpp > 1) return std::min(m * vpp, interleaved_warmup(pp, vpp, stage, m) + 1);
  return std::min(pp - stage, m);
}
/// ZB-H1's deferred Ws keep a few more micro-batches (the lowering's list schedule: +3 on the
/// 718B's peak stage, +1..2 on a 4-stage Llama): two.
int inflight_zb_h1(int pp, int vpp, int m, int stage) {
  if (vpp > 1) return inflight_interleaved_or_1f1b(pp, vpp, m, stage);
  return std::min(m, std::min(pp - stage, m) + 2);
}
/// The V schedules hold a chunk's activations until its W: 2p + 1 chunks at the peak.
int inflight_v(int pp, int, int m, int) { return std::min(2 * m, 2 * pp + 1); }
/// DeepSeek's table: PP + 1 micro-batches.
int inflight_dualpipe(int pp, int, int m, int) { return std::min(m, pp + 1); }

/// 1F1B's (p - 1) passes of the other stages, divided by the virtual stages.
double fill_1f1b(const PipelineCosts& c) { return (c.t_sum - c.t_max) / c.vpp; }
/// Zero-bubble: W fills them ((p - 1)(F + B - W), Qi et al.; ZB-V in half-size chunks).
double fill_zb_h1(const PipelineCosts& c) { return (c.t_sum - c.t_max) * (1.0 - c.w_share); }
double fill_zb_v(const PipelineCosts& c) { return 0.5 * (c.t_sum - c.t_max) * std::max(0.0, 1.0 - 2.0 * c.w_share); }
/// DualPipe(V): (PP/2 - 1)(F&B + B - 3W) in DeepSeek's table, whose PP counts stages:
/// DualPipe's p, each half of a device's two; DualPipeV's 2p chunks, each half of a device's pair.
double fill_dualpipe_v(const PipelineCosts& c) {
  const double n = c.pp - 1.0;
  return std::max(0.0, n * 0.5 * (c.pair + c.b_slow - 3.0 * c.w_slow));
}
double fill_dualpipe(const PipelineCosts& c) {
  const double n = c.pp / 2.0 - 1.0;
  return std::max(0.0, n * 0.5 * (c.pair + c.b_slow - 3.0 * c.w_slow));
}

// ---- generators and constraints ---------------------------------------------------------------

std::vector<StageOrder> generate_1f1b(int pp, int vpp, int m, const StageCosts&) {
  std::vector<StageOrder> out(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s) out[s] = one_f_one_b(pp, s, m);
  (void)vpp;
  return out;
}
std::vector<StageOrder> generate_interleaved(int pp, int vpp, int m, const StageCosts&) {
  std::vector<StageOrder> out(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s) out[s] = vpp > 1 ? interleaved(pp, vpp, s, m) : one_f_one_b(pp, s, m);
  return out;
}
std::vector<StageOrder> generate_zb_h1(int pp, int, int m, const StageCosts& costs) { return zero_bubble_h1(pp, m, costs); }
std::vector<StageOrder> generate_zb_v(int pp, int, int m, const StageCosts& costs) {
  return zero_bubble_v(pp, m, costs, 2 * pp);
}
std::vector<StageOrder> generate_dualpipe_v(int pp, int, int m, const StageCosts&) { return dualpipe_v(pp, m); }
std::vector<StageOrder> generate_dualpipe(int pp, int, int m, const StageCosts&) { return dualpipe(pp, m); }

std::vector<ScheduleProblem> no_constraints(int, int, int) { return {}; }
std::vector<ScheduleProblem> check_interleaved(int pp, int vpp, int m) {
  if (vpp > 1 && m % pp != 0)
    return {{"microbatches", "the interleaved schedule needs a multiple of pp=" + std::to_string(pp)}};
  return {};
}
/// DeepSeek's DualPipeV takes at least two micro-batches per device (dualpipev.py: num_chunks
/// >= num_ranks * 2); the V schedules are list schedules otherwise free of divisibility rules.
std::vector<ScheduleProblem> check_dualpipe_v(int pp, int, int m) {
  if (m < 2 * pp) return {{"microbatches", "dualpipev needs at least 2 x pp = " + std::to_string(2 * pp)}};
  return {};
}
/// DeepSeek's dualpipe.py: an even number of ranks and of micro-batches, at least 2 x ranks.
std::vector<ScheduleProblem> check_dualpipe(int pp, int, int m) {
  std::vector<ScheduleProblem> out;
  if (pp % 2 != 0) out.push_back({"pp", "must be even for dualpipe (devices pair up as mirror stages)"});
  if (m % 2 != 0 || m < 2 * pp)
    out.push_back({"microbatches", "dualpipe needs an even number (half from each end), at least 2 x pp = " +
                                       std::to_string(2 * pp)});
  return out;
}

std::string any_vpp(int) { return ""; }
std::string vpp_1f1b(int vpp) {
  return vpp > 1 ? "conflicts with virtual_pipeline_model_parallel_size > 1 (use interleaved_1f1b)" : "";
}
std::string vpp_one_chunk(int vpp) {
  return vpp > 1 ? "runs one model chunk per stage: needs virtual_pipeline_model_parallel_size 1 (got " +
                       std::to_string(vpp) + ")"
                 : "";
}
std::string vpp_v(int vpp) {
  return vpp != 2 ? "places two model chunks per stage as a V: needs virtual_pipeline_model_parallel_size 2 (got " +
                        std::to_string(vpp) + ")"
                  : "";
}
std::string vpp_dualpipe(int vpp) {
  return vpp != 1 ? "cuts the model into pipeline_model_parallel_size stages and holds two of them per device (one per "
                    "direction): needs virtual_pipeline_model_parallel_size 1 (got " + std::to_string(vpp) + ")"
                  : "";
}

// kind, name, splits W, bidirectional, V-shaped, pairs F&B, follows costs, automatic, chunks, plan vpp, ...
constexpr ScheduleTraits kTable[] = {
    {ScheduleKind::OneFOneB,     "1f1b",             false, false, false, false, false, true,  1, 1, generate_1f1b,
     inflight_interleaved_or_1f1b, fill_1f1b, no_constraints, vpp_1f1b},
    {ScheduleKind::Interleaved,  "interleaved_1f1b", false, false, false, false, false, true,  0, 0, generate_interleaved,
     inflight_interleaved_or_1f1b, fill_1f1b, check_interleaved, any_vpp},
    {ScheduleKind::ZeroBubbleH1, "zb_h1",            true,  false, false, false, true, false, 1, 1, generate_zb_h1,
     inflight_zb_h1, fill_zb_h1, no_constraints, vpp_one_chunk},
    {ScheduleKind::ZeroBubbleV,  "zb_v",             true,  false, true,  false, true, false, 2, 2, generate_zb_v,
     inflight_v, fill_zb_v, no_constraints, vpp_v},
    {ScheduleKind::DualPipeV,    "dualpipev",        true,  false, true,  true, false,  false, 2, 2, generate_dualpipe_v,
     inflight_v, fill_dualpipe_v, check_dualpipe_v, vpp_v},
    {ScheduleKind::DualPipe,     "dualpipe",         true,  true,  true,  true, false,  false, 1, 2, generate_dualpipe,
     inflight_dualpipe, fill_dualpipe, check_dualpipe, vpp_dualpipe},
    {ScheduleKind::InterleavedTorch, "interleaved_1f1b_torch", false, false, false, false, false, false, 0, 0,
     generate_interleaved, inflight_interleaved_or_1f1b, fill_1f1b, check_interleaved, any_vpp},
};

static_assert([] {
  for (std::size_t i = 0; i < std::size(kTable); ++i)
    if (kTable[i].kind != static_cast<ScheduleKind>(i)) return false;
  return true;
}(), "the schedule registry is indexed by ScheduleKind: keep kTable in enum order");

}  // namespace

const std::span<const ScheduleTraits> kSchedules{kTable};

std::span<const std::string_view> schedule_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const ScheduleTraits& t : kSchedules) v.emplace_back(t.name);
    return v;
  }();
  return names;
}

const ScheduleTraits* find_schedule(std::string_view name) {
  for (const ScheduleTraits& t : kSchedules)
    if (name == t.name) return &t;
  return nullptr;
}

}  // namespace moesim::strategies
