#include "replay.hpp"

#include <algorithm>

namespace moesim::strategies::search_detail {

namespace {

class Replay {
 public:
  Replay(const PipelineReplay& r, const std::vector<StageOrder>& orders)
      : r_(r), orders_(orders), V_(virtual_count(r)), next_(r.pp, 0), free_(r.pp, 0.0), queued_(r.pp, 1),
        end_f_(slots(), -1.0), end_b_(slots(), -1.0), end_w_(slots(), -1.0), host_in_(r.pp, 0.0),
        last_fwd_(r.pp, 0.0), swapped_(r.swap_in.empty() ? 0 : slots(), 0.0) {}

  ReplayResult run() {
    std::vector<int> work(r_.pp);
    for (int s = 0; s < r_.pp; ++s) work[s] = r_.pp - 1 - s;  // popped from the back: stage 0 first
    while (!work.empty()) {
      const int s = work.back();
      work.pop_back();
      queued_[s] = 0;
      advance(s, work);
    }
    ReplayResult res;
    for (int s = 0; s < r_.pp; ++s)
      if (next_[s] < orders_[s].size()) return res;  // the orders wait on each other
    res.span = 0;
    res.stage_end = free_;
    res.host_in_free = host_in_;
    res.last_forward = last_fwd_;
    for (double e : free_) res.span = std::max(res.span, e);
    res.grads_done.assign(static_cast<std::size_t>(r_.pp) * r_.vpp, 0.0);
    const std::vector<double>& done = splits_weight_gradients(r_.kind) ? end_w_ : end_b_;
    for (int s = 0; s < r_.pp; ++s)
      for (const PipeOp& op : orders_[s]) {
        const std::size_t i = at(op.microbatch, virtual_stage(r_.kind, r_.pp, s, op.chunk));
        double& g = res.grads_done[cost_index(s, op.chunk)];
        g = std::max(g, done[i]);
      }
    return res;
  }

 private:
  static int virtual_count(const PipelineReplay& r) { return r.pp * r.vpp; }
  [[nodiscard]] std::size_t slots() const { return static_cast<std::size_t>(r_.m) * V_; }
  [[nodiscard]] std::size_t at(int mb, int v) const { return static_cast<std::size_t>(mb) * V_ + v; }
  [[nodiscard]] int cost_index(int stage, int chunk) const { return stage * r_.vpp + chunk; }
  [[nodiscard]] int stage_of(int v) const { return stage_of_virtual(r_.kind, r_.pp, v); }
  /// The virtual stage a pass's input comes from (-1: none): v - 1 forwards, v + 1 backwards;
  /// DualPipe's two directions do not meet between p - 1 and p.
  [[nodiscard]] int upstream(int v, bool forward) const {
    const int u = forward ? v - 1 : v + 1;
    if (u < 0 || u >= V_) return -1;
    if (bidirectional(r_.kind) && std::min(u, v) == r_.pp - 1) return -1;
    return u;
  }
  /// When the pass `op` on `stage` may start as far as its inputs go (< 0: not yet known).
  [[nodiscard]] double ready(int stage, const PipeOp& op) const {
    const int v = virtual_stage(r_.kind, r_.pp, stage, op.chunk);
    if (op.phase == Phase::WeightGrad) return end_b_[at(op.microbatch, v)];
    const bool fwd = op.phase == Phase::Forward;
    double t = fwd && !r_.forward_ready.empty() ? r_.forward_ready[cost_index(stage, op.chunk)] : 0.0;
    if (!fwd) {
      t = end_f_[at(op.microbatch, v)];
      if (t < 0) return -1.0;
      if (!swapped_.empty()) t = std::max(t, swapped_[at(op.microbatch, v)]);
    }
    const int u = upstream(v, fwd);
    if (u < 0) return t;
    const double e = (fwd ? end_f_ : end_b_)[at(op.microbatch, u)];
    if (e < 0) return -1.0;
    return std::max(t, e + (stage_of(u) != stage ? r_.p2p : 0.0));
  }
  void finish(int stage, const PipeOp& op, double end, std::vector<int>& work) {
    const int v = virtual_stage(r_.kind, r_.pp, stage, op.chunk);
    if (op.phase == Phase::Forward) {
      last_fwd_[stage] = std::max(last_fwd_[stage], end);
      if (!swapped_.empty()) {  // the swap-in queues behind the stage's earlier ones
        host_in_[stage] = std::max(host_in_[stage], end) + r_.swap_in[cost_index(stage, op.chunk)];
        swapped_[at(op.microbatch, v)] = host_in_[stage];
      }
    }
    (op.phase == Phase::Forward ? end_f_ : op.phase == Phase::Backward ? end_b_ : end_w_)[at(op.microbatch, v)] = end;
    for (int u : {v - 1, v + 1})
      if (u >= 0 && u < V_) wake(stage_of(u), work);
  }
  void wake(int s, std::vector<int>& work) {
    if (queued_[s]) return;
    queued_[s] = 1;
    work.push_back(s);
  }
  /// Runs stage `s`'s passes in order until one's inputs are not there yet.
  void advance(int s, std::vector<int>& work) {
    const StageOrder& order = orders_[s];
    const bool pairs = pairs_forward_backward(r_.kind);
    while (next_[s] < order.size()) {
      const std::size_t oi = next_[s];
      const PipeOp& op = order[oi];
      const bool next_is_other_forward = op.phase == Phase::Backward && oi + 1 < order.size() &&
                                         order[oi + 1].phase == Phase::Forward &&
                                         order[oi + 1].microbatch != op.microbatch;
      const bool triple = pairs && next_is_other_forward && oi + 2 < order.size() &&
                          order[oi + 2].phase == Phase::WeightGrad && order[oi + 2].microbatch == op.microbatch &&
                          order[oi + 2].chunk == op.chunk;
      if (triple || (r_.fb_overlap && next_is_other_forward)) {
        // One overlapped pair: both inputs needed. DualPipe(V) balances a pair so that both
        // outputs leave at its end; moe_fb_overlap issues the backward first (the stage
        // upstream waits for its gradient), the forward filling its gaps, so the backward is
        // done a forward's length before the pair ends.
        const PipeOp& fw = order[oi + 1];
        const double ra = ready(s, op), rb = ready(s, fw);
        if (ra < 0 || rb < 0) return;
        const int cb = cost_index(s, op.chunk), cf = cost_index(s, fw.chunk);
        const double back = triple ? r_.b_whole[cb] : r_.b[cb];
        const double saving = 0.5 * (r_.pair_saving[cb] + r_.pair_saving[cf]);
        const double dur = std::max({back, r_.f[cf], back + r_.f[cf] - saving});
        const double end = std::max({free_[s], ra, rb}) + dur;
        free_[s] = end;
        finish(s, op, pairs ? end : end - r_.f[cf], work);
        finish(s, fw, end, work);
        if (triple) finish(s, order[oi + 2], end, work);
        next_[s] = oi + (triple ? 3 : 2);
        continue;
      }
      const double rd = ready(s, op);
      if (rd < 0) return;
      const int c = cost_index(s, op.chunk);
      const double dur = op.phase == Phase::Forward ? r_.f[c] : op.phase == Phase::Backward ? r_.b[c] : r_.w[c];
      const double end = std::max(free_[s], rd) + dur;
      free_[s] = end;
      finish(s, op, end, work);
      next_[s] = oi + 1;
    }
  }

  const PipelineReplay& r_;
  const std::vector<StageOrder>& orders_;
  int V_;
  std::vector<std::size_t> next_;
  std::vector<double> free_;
  std::vector<char> queued_;
  std::vector<double> end_f_, end_b_, end_w_;
  std::vector<double> host_in_, last_fwd_;  ///< per stage
  std::vector<double> swapped_;             ///< per (micro-batch, virtual stage): its swap-in done
};

}  // namespace

ReplayResult replay_pipeline(const PipelineReplay& r, const std::vector<StageOrder>& orders) {
  if (r.pp < 1 || r.vpp < 1 || r.m < 1 || static_cast<int>(orders.size()) != r.pp) return {};
  return Replay(r, orders).run();
}

}  // namespace moesim::strategies::search_detail
