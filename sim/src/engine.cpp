#include "moesim/sim/engine.hpp"

#include <algorithm>
#include <string>

#include "moesim/sim/progress.hpp"

namespace moesim::sim {
namespace {

struct Event {
  Tick time;
  std::uint64_t seq;
  TaskId task;
};

// Min-heap on (time, seq) over a vector reserved once; push/pop never allocate after that.
class EventHeap {
 public:
  void reserve(std::size_t n) { v_.reserve(n); }
  [[nodiscard]] bool empty() const { return v_.empty(); }
  void push(Event e) {
    v_.push_back(e);
    std::size_t i = v_.size() - 1;
    while (i > 0) {
      const std::size_t p = (i - 1) / 2;
      if (!less(v_[i], v_[p])) break;
      std::swap(v_[i], v_[p]);
      i = p;
    }
  }
  Event pop() {
    Event top = v_.front();
    v_.front() = v_.back();
    v_.pop_back();
    std::size_t i = 0;
    const std::size_t n = v_.size();
    while (true) {
      const std::size_t l = 2 * i + 1, r = l + 1;
      std::size_t m = i;
      if (l < n && less(v_[l], v_[m])) m = l;
      if (r < n && less(v_[r], v_[m])) m = r;
      if (m == i) break;
      std::swap(v_[i], v_[m]);
      i = m;
    }
    return top;
  }

 private:
  static bool less(const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.seq < b.seq;
  }
  std::vector<Event> v_;
};

constexpr std::uint32_t kNil = 0xffffffffu;

class Run {
 public:
  Run(const TaskGraph& g, const CancelFlag* cancel) : g_(g), cancel_(cancel), progress_(progress_of(cancel)) {
    const std::size_t n = g.num_tasks();
    const std::size_t nr = g.num_resources();
    const std::size_t ns = g.num_slots();
    r_.start.assign(n, -1);
    r_.end.assign(n, -1);
    deps_.resize(n);
    for (std::size_t t = 0; t < n; ++t) deps_[t] = static_cast<std::uint32_t>(g.predecessors(static_cast<TaskId>(t)).size());
    state_.assign(n, kIdle);
    head_.assign(nr, 0);
    is_link_.resize(nr);
    for (std::size_t r = 0; r < nr; ++r) is_link_[r] = g.resource(static_cast<ResourceId>(r)).kind == ResourceKind::Link;
    link_holder_.assign(nr, kNoTask);
    wait_head_.assign(nr, kNil);
    wait_tail_.assign(nr, kNil);
    slot_prev_.assign(ns, kNil);
    slot_next_.assign(ns, kNil);
    heap_.reserve(nr + 1);  // at most one running task per resource
  }

  RunResult run() {
    const std::size_t n = g_.num_tasks();
    for (std::size_t t = 0; t < n; ++t)
      if (deps_[t] == 0) try_start(static_cast<TaskId>(t));
    std::size_t finished = 0;
    while (!heap_.empty() && !stopped_) {
      const Event e = heap_.pop();
      now_ = e.time;
      ++r_.events;
      complete(e.task);
      ++finished;
      if (cancel_ != nullptr && (finished & 4095) == 0) {
        if (progress_ != nullptr) progress_->advance(finished);
        if (cancel_->requested()) {
          stopped_ = true;
          r_.completed = false;
          r_.cancelled = true;
          r_.error = "engine: cancelled";
        }
      }
    }
    r_.makespan = now_;
    if (progress_ != nullptr) progress_->advance(finished);
    if (!stopped_ && finished != n) describe_deadlock(finished);
    return std::move(r_);
  }

 private:
  enum : std::uint8_t { kIdle = 0, kWaiting = 1, kRunning = 2, kDone = 3 };

  void try_start(TaskId t) {
    if (deps_[t] != 0 || state_[t] >= kRunning || stopped_) return;
    const auto res = g_.resources_of(t);
    bool links_free = true;
    for (ResourceId r : res) {
      if (!is_link_[r]) {
        const auto order = g_.stream_order(r);
        if (head_[r] >= order.size() || order[head_[r]] != t) return;  // not its turn yet
      } else if (link_holder_[r] != kNoTask) {
        links_free = false;
      }
    }
    if (!links_free) {
      if (state_[t] != kWaiting) enqueue_waiting(t);
      return;
    }
    if (state_[t] == kWaiting) dequeue_waiting(t);
    // now_ <= kMaxTick always, so the subtraction cannot wrap; an end at or past the horizon
    // stops the run instead of wrapping into a negative time.
    const Tick d = g_.duration(t);
    if (d < 0 || d >= kMaxTick - now_) {
      out_of_range(t, d);
      return;
    }
    for (ResourceId r : res)
      if (is_link_[r]) link_holder_[r] = t;
    state_[t] = kRunning;
    r_.start[t] = now_;
    heap_.push(Event{now_ + d, seq_++, t});
  }

  void out_of_range(TaskId t, Tick d) {
    stopped_ = true;
    r_.completed = false;
    r_.out_of_range = true;
    r_.failed_task = t;
    const auto res = g_.resources_of(t);
    r_.error = "engine: " + g_.label_text(g_.label(t)) + "#" + std::to_string(g_.ordinal(t)) +
               (res.empty() ? std::string() : " on " + g_.resource(res[0]).name) + (d < 0 ? " has a negative duration" : " would end past the horizon") +
               " (start " + std::to_string(to_seconds(now_).value()) + " s, duration " +
               (ticks_out_of_range(d) ? std::string(">= horizon") : std::to_string(to_seconds(d).value()) + " s") + ")";
  }

  void complete(TaskId t) {
    state_[t] = kDone;
    r_.end[t] = now_;
    for (ResourceId r : g_.resources_of(t)) {
      if (!is_link_[r]) {
        const auto order = g_.stream_order(r);
        ++head_[r];
        if (head_[r] < order.size()) try_start(order[head_[r]]);
      } else {
        link_holder_[r] = kNoTask;
        // First come, first served among the tasks waiting for this link.
        for (std::uint32_t s = wait_head_[r]; s != kNil && link_holder_[r] == kNoTask;) {
          const std::uint32_t next = slot_next_[s];
          try_start(slot_task(s));
          s = next;
        }
      }
    }
    for (TaskId s : g_.successors(t)) {
      if (--deps_[s] == 0) try_start(s);
    }
  }

  TaskId slot_task(std::uint32_t slot) const { return slot_owner_[slot]; }

  void enqueue_waiting(TaskId t) {
    state_[t] = kWaiting;
    ensure_slot_owner();
    const std::uint32_t base = g_.slot_begin(t);
    const auto res = g_.resources_of(t);
    for (std::uint32_t i = 0; i < res.size(); ++i) {
      const ResourceId r = res[i];
      if (!is_link_[r]) continue;
      const std::uint32_t s = base + i;
      slot_prev_[s] = wait_tail_[r];
      slot_next_[s] = kNil;
      if (wait_tail_[r] != kNil) slot_next_[wait_tail_[r]] = s;
      else wait_head_[r] = s;
      wait_tail_[r] = s;
    }
  }

  void dequeue_waiting(TaskId t) {
    const std::uint32_t base = g_.slot_begin(t);
    const auto res = g_.resources_of(t);
    for (std::uint32_t i = 0; i < res.size(); ++i) {
      const ResourceId r = res[i];
      if (!is_link_[r]) continue;
      const std::uint32_t s = base + i;
      if (slot_prev_[s] != kNil) slot_next_[slot_prev_[s]] = slot_next_[s];
      else wait_head_[r] = slot_next_[s];
      if (slot_next_[s] != kNil) slot_prev_[slot_next_[s]] = slot_prev_[s];
      else wait_tail_[r] = slot_prev_[s];
      slot_prev_[s] = slot_next_[s] = kNil;
    }
  }

  // Slot -> task map, built lazily the first time a task has to wait for a link
  // (graphs without contended links never pay for it).
  void ensure_slot_owner() {
    if (!slot_owner_.empty() || g_.num_slots() == 0) return;
    slot_owner_.resize(g_.num_slots());
    for (std::size_t t = 0; t < g_.num_tasks(); ++t) {
      const std::uint32_t b = g_.slot_begin(static_cast<TaskId>(t));
      const auto k = g_.resources_of(static_cast<TaskId>(t)).size();
      for (std::uint32_t i = 0; i < k; ++i) slot_owner_[b + i] = static_cast<TaskId>(t);
    }
  }

  void describe_deadlock(std::size_t finished) {
    r_.completed = false;
    std::string msg = "engine: " + std::to_string(g_.num_tasks() - finished) + " of " +
                      std::to_string(g_.num_tasks()) + " tasks never ran (cyclic wait); first stuck: ";
    int shown = 0;
    for (std::size_t t = 0; t < g_.num_tasks() && shown < 5; ++t) {
      if (state_[t] == kDone) continue;
      const auto id = static_cast<TaskId>(t);
      msg += (shown ? "; " : "") + g_.label_text(g_.label(id)) + "#" + std::to_string(g_.ordinal(id)) + " on " +
             g_.resource(g_.resources_of(id)[0]).name + " (waiting for " + std::to_string(deps_[t]) +
             " dependencies)";
      ++shown;
    }
    r_.error = msg;
  }

  const TaskGraph& g_;
  RunResult r_;
  std::vector<std::uint32_t> deps_;
  std::vector<std::uint8_t> state_;
  std::vector<std::uint32_t> head_;
  std::vector<std::uint8_t> is_link_;
  std::vector<TaskId> link_holder_;
  std::vector<std::uint32_t> wait_head_, wait_tail_;
  std::vector<std::uint32_t> slot_prev_, slot_next_;
  std::vector<TaskId> slot_owner_;
  const CancelFlag* cancel_;
  Progress* progress_;  ///< told the events done every 4096 events, with the cancel poll
  EventHeap heap_;
  Tick now_ = 0;
  bool stopped_ = false;
  std::uint64_t seq_ = 0;
};

}  // namespace

RunResult Engine::run() { return Run(g_, cancel_).run(); }

std::vector<TaskId> critical_path(const TaskGraph& g, const RunResult& r) {
  std::vector<TaskId> path;
  if (g.num_tasks() == 0 || !r.completed) return path;
  // Previous task on each link (links have no program order; use the run's order).
  std::vector<TaskId> prev_on_link(g.num_slots(), kNoTask);
  {
    std::vector<std::vector<TaskId>> per_link(g.num_resources());
    for (TaskId t = 0; t < g.num_tasks(); ++t)
      for (ResourceId res : g.resources_of(t))
        if (g.resource(res).kind == ResourceKind::Link) per_link[res].push_back(t);
    for (ResourceId res = 0; res < g.num_resources(); ++res) {
      auto& v = per_link[res];
      std::sort(v.begin(), v.end(), [&](TaskId a, TaskId b) {
        return r.start[a] != r.start[b] ? r.start[a] < r.start[b] : a < b;
      });
      for (std::size_t i = 1; i < v.size(); ++i) {
        const auto rs = g.resources_of(v[i]);
        for (std::uint32_t k = 0; k < rs.size(); ++k)
          if (rs[k] == res) prev_on_link[g.slot_begin(v[i]) + k] = v[i - 1];
      }
    }
  }
  // Position of each task in its streams' order, to find the previous task on a stream.
  std::vector<std::uint32_t> pos_in_stream(g.num_slots(), 0);
  for (ResourceId res = 0; res < g.num_resources(); ++res) {
    const auto order = g.stream_order(res);
    for (std::uint32_t i = 0; i < order.size(); ++i) {
      const auto rs = g.resources_of(order[i]);
      for (std::uint32_t k = 0; k < rs.size(); ++k)
        if (rs[k] == res) pos_in_stream[g.slot_begin(order[i]) + k] = i;
    }
  }
  TaskId cur = 0;
  for (TaskId t = 0; t < g.num_tasks(); ++t)
    if (r.end[t] > r.end[cur]) cur = t;
  while (cur != kNoTask) {
    path.push_back(cur);
    TaskId next = kNoTask;
    for (TaskId p : g.predecessors(cur))
      if (r.end[p] == r.start[cur] && (next == kNoTask || p < next)) next = p;
    if (next == kNoTask) {
      const auto rs = g.resources_of(cur);
      for (std::uint32_t k = 0; k < rs.size() && next == kNoTask; ++k) {
        TaskId p = kNoTask;
        if (g.resource(rs[k]).kind == ResourceKind::Link) {
          p = prev_on_link[g.slot_begin(cur) + k];
        } else {
          const std::uint32_t i = pos_in_stream[g.slot_begin(cur) + k];
          if (i > 0) p = g.stream_order(rs[k])[i - 1];
        }
        if (p != kNoTask && r.end[p] == r.start[cur]) next = p;
      }
    }
    if (next == kNoTask && r.start[cur] != 0) break;  // defensive: gaps cannot occur
    cur = next;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace moesim::sim
