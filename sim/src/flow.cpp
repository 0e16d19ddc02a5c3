#include "moesim/sim/flow.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace moesim::sim {

std::uint32_t FlowNetwork::add(double bytes, std::span<const std::uint32_t> links, Tick release) {
  const auto id = static_cast<std::uint32_t>(bytes_.size());
  bytes_.push_back(bytes);
  release_.push_back(release);
  path_.insert(path_.end(), links.begin(), links.end());
  path_offset_.push_back(static_cast<std::uint32_t>(path_.size()));
  return id;
}

namespace {

/// Progressive filling over a fixed set of flows whose members come and go (released, ended),
/// with all scratch space kept across recomputations (no allocation once grown).
///
/// Two things keep a recomputation proportional to the active flows' saturable links:
/// - Links that can never saturate are dropped from the paths once: a link whose capacity
///   exceeds the sum, over every flow crossing it, of that flow's smallest capacity on its path
///   (no flow can go faster than that) never binds. A flow's own smallest-capacity link always
///   stays. The rates are the same (such a link never freezes a flow); a device's internal link
///   to its NIC is the usual case.
/// - The link -> flows table is built once over the unfinished flows and kept; flows that end
///   are skipped in it (rebuilt without them when they outnumber the live ones). Per link the
///   count of active flows is kept as flows start and end.
/// Unfrozen flows all sit at the current water level; a link's spare capacity is capacity -
/// frozen rates - level x unfrozen flows, so raising the level costs O(links), and a flow's
/// rate is written once, when it freezes.
class Filling {
 public:
  Filling(const std::vector<double>& capacity, const std::vector<std::uint32_t>& path_offset,
          const std::vector<std::uint32_t>& path)
      : capacity_(capacity) {
    const std::size_t n = path_offset.size() - 1, nl = capacity.size();
    std::vector<double> bound_sum(nl, 0.0);
    for (std::size_t f = 0; f < n; ++f) {
      double b = std::numeric_limits<double>::infinity();
      for (std::uint32_t i = path_offset[f]; i < path_offset[f + 1]; ++i) b = std::min(b, capacity[path[i]]);
      for (std::uint32_t i = path_offset[f]; i < path_offset[f + 1]; ++i) bound_sum[path[i]] += b;
    }
    std::vector<char> keep(nl);
    for (std::size_t l = 0; l < nl; ++l) keep[l] = !(capacity[l] > bound_sum[l] * (1 + 1e-9));
    offset_.assign(n + 1, 0);
    for (std::size_t f = 0; f < n; ++f) {
      for (std::uint32_t i = path_offset[f]; i < path_offset[f + 1]; ++i)
        if (keep[path[i]]) path_.push_back(path[i]);
      offset_[f + 1] = static_cast<std::uint32_t>(path_.size());
    }
    live_.assign(n, 0);
    frozen_.assign(n, 0);
    finished_.assign(n, 0);
    live_count_.assign(nl, 0);
    frozen_sum_.assign(nl, 0.0);
    unfrozen_.assign(nl, 0);
    index();
  }

  [[nodiscard]] bool has_links(std::uint32_t f) const { return offset_[f + 1] > offset_[f]; }

  void start(std::uint32_t f) {
    live_[f] = 1;
    for (std::uint32_t i = offset_[f]; i < offset_[f + 1]; ++i) ++live_count_[path_[i]];
  }
  void end(std::uint32_t f) {
    live_[f] = 0;
    finished_[f] = 1;
    ++ended_since_index_;
    for (std::uint32_t i = offset_[f]; i < offset_[f + 1]; ++i) --live_count_[path_[i]];
  }

  /// Max-min fair rates of the started, unfinished flows (`active`), written to rate[flow].
  void rates(std::span<const std::uint32_t> active, std::vector<double>& rate) {
    if (2 * ended_since_index_ > indexed_) index();
    const std::size_t nl = capacity_.size();
    rate.resize(offset_.size() - 1, 0.0);
    touched_.clear();
    for (std::size_t l = 0; l < nl; ++l) {
      frozen_sum_[l] = 0;
      unfrozen_[l] = live_count_[l];
      if (unfrozen_[l] > 0) touched_.push_back(static_cast<std::uint32_t>(l));
    }
    std::size_t left = 0;
    for (std::uint32_t f : active) {
      rate[f] = 0;
      frozen_[f] = 0;
      left += has_links(f) ? 1 : 0;
    }
    double level = 0;
    while (left > 0) {
      // The level at which the first link fills up.
      double next = std::numeric_limits<double>::infinity();
      std::size_t kept = 0;
      for (std::uint32_t l : touched_) {
        if (unfrozen_[l] == 0) continue;
        touched_[kept++] = l;
        next = std::min(next, (capacity_[l] - frozen_sum_[l]) / unfrozen_[l]);
      }
      touched_.resize(kept);
      if (!std::isfinite(next)) break;
      level = std::max(level, next);
      for (std::uint32_t l : touched_) {
        if (unfrozen_[l] == 0) continue;
        if (capacity_[l] - frozen_sum_[l] - level * unfrozen_[l] > 1e-9 * capacity_[l]) continue;
        for (std::uint32_t k = link_offset_[l]; k < link_offset_[l + 1]; ++k) {
          const std::uint32_t f = link_flows_[k];
          if (!live_[f] || frozen_[f]) continue;
          frozen_[f] = 1;
          rate[f] = level;
          --left;
          for (std::uint32_t i = offset_[f]; i < offset_[f + 1]; ++i) {
            --unfrozen_[path_[i]];
            frozen_sum_[path_[i]] += level;
          }
        }
      }
    }
  }

 private:
  /// The link -> flows table over the unfinished flows.
  void index() {
    const std::size_t nl = capacity_.size(), n = offset_.size() - 1;
    link_offset_.assign(nl + 1, 0);
    indexed_ = 0;
    for (std::size_t f = 0; f < n; ++f) {
      if (finished_[f]) continue;
      ++indexed_;
      for (std::uint32_t i = offset_[f]; i < offset_[f + 1]; ++i) ++link_offset_[path_[i] + 1];
    }
    for (std::size_t l = 0; l < nl; ++l) link_offset_[l + 1] += link_offset_[l];
    link_flows_.resize(link_offset_[nl]);
    fill_.assign(link_offset_.begin(), link_offset_.end() - 1);
    for (std::size_t f = 0; f < n; ++f) {
      if (finished_[f]) continue;
      for (std::uint32_t i = offset_[f]; i < offset_[f + 1]; ++i) link_flows_[fill_[path_[i]]++] = static_cast<std::uint32_t>(f);
    }
    ended_since_index_ = 0;
  }

  const std::vector<double>& capacity_;
  std::vector<std::uint32_t> offset_, path_;   // per flow: its saturable links
  std::vector<char> live_, frozen_, finished_;  // per flow
  std::vector<std::uint32_t> live_count_;       // per link: started, unfinished flows crossing it
  std::vector<double> frozen_sum_;              // per link: rates of the frozen flows crossing it
  std::vector<std::uint32_t> unfrozen_;         // per link: unfrozen flows crossing it
  std::vector<std::uint32_t> link_offset_, link_flows_, fill_;
  std::vector<std::uint32_t> touched_;  // links with unfrozen flows
  std::size_t indexed_ = 0, ended_since_index_ = 0;
};

}  // namespace

void FlowNetwork::max_min_rates(std::span<const std::uint32_t> active, std::vector<double>& rate) const {
  Filling s(capacity_, path_offset_, path_);
  for (std::uint32_t f : active) s.start(f);
  s.rates(active, rate);
}

FlowRun FlowNetwork::run() const {
  FlowRun out;
  const std::size_t n = bytes_.size();
  out.finish.assign(n, 0);
  if (n == 0) return out;
  std::vector<std::uint32_t> pending(n);
  std::iota(pending.begin(), pending.end(), 0u);
  std::stable_sort(pending.begin(), pending.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return release_[a] < release_[b]; });
  // The active flows' state in parallel arrays in the same order, walked front to back (a
  // skewed all-to-all has a million flows, the loops below run at every recomputation, and
  // they are bound by memory bandwidth).
  std::vector<std::uint32_t> a_flow;
  std::vector<double> a_rem, a_rate;  // bytes left at the last recomputation; bytes/s since then
  std::vector<Tick> a_due;
  a_flow.reserve(n);
  a_rem.reserve(n);
  a_rate.reserve(n);
  a_due.reserve(n);
  std::vector<double> rate(n, 0.0);
  std::size_t next = 0;
  Tick t = release_[pending[0]];
  constexpr double kPerTick = 1.0 / static_cast<double>(kTicksPerSecond);
  constexpr double kMergeFraction = 1e-2;
  Filling filling(capacity_, path_offset_, path_);
  const Tick t0 = t;
  bool changed = false;  // a flow started or ended since the last recomputation
  Tick first_due = kMaxTick;
  while (true) {
    while (next < n && release_[pending[next]] <= t) {
      const std::uint32_t f = pending[next++];
      if (bytes_[f] <= 0 || path_offset_[f + 1] == path_offset_[f]) {
        out.finish[f] = t;
      } else {
        a_flow.push_back(f);
        a_rem.push_back(bytes_[f]);
        a_rate.push_back(0.0);
        a_due.push_back(kMaxTick);
        filling.start(f);
        changed = true;
      }
    }
    if (a_flow.empty()) {
      if (next >= n) break;
      t = release_[pending[next]];
      continue;
    }
    if (changed) {
      changed = false;
      filling.rates(a_flow, rate);
      ++out.recomputations;
      first_due = kMaxTick;
      for (std::size_t i = 0; i < a_flow.size(); ++i) {
        a_rate[i] = rate[a_flow[i]];
        const double ticks = std::ceil(a_rem[i] / (a_rate[i] * kPerTick));
        // Saturates at the horizon (a flow that slow is reported out of range by the engine).
        a_due[i] = add_ticks(t, std::max<Tick>(1, static_cast<Tick>(std::min(ticks, static_cast<double>(kMaxTick)))));
        first_due = std::min(first_due, a_due[i]);
      }
    }
    const Tick t_next = std::min(next < n ? release_[pending[next]] : kMaxTick, first_due);
    // Flows due within kMergeFraction of the elapsed time after the first one end at their own
    // due times, with one recomputation for all of them at the first: survivors get the freed
    // bandwidth at most that much early.
    const Tick merge_until =
        t_next == first_due ? add_ticks(t_next, static_cast<Tick>(kMergeFraction * static_cast<double>(t_next - t0))) : t_next;
    const double dt = static_cast<double>(t_next - t) * kPerTick;
    std::size_t kept = 0;
    Tick survivors_due = kMaxTick;
    for (std::size_t i = 0; i < a_flow.size(); ++i) {
      if (a_due[i] <= merge_until) {
        out.finish[a_flow[i]] = a_due[i];
        filling.end(a_flow[i]);
        changed = true;
        continue;
      }
      a_flow[kept] = a_flow[i];
      a_rem[kept] = std::max(0.0, a_rem[i] - a_rate[i] * dt);
      a_rate[kept] = a_rate[i];
      a_due[kept] = a_due[i];
      survivors_due = std::min(survivors_due, a_due[i]);
      ++kept;
    }
    a_flow.resize(kept);
    a_rem.resize(kept);
    a_rate.resize(kept);
    a_due.resize(kept);
    first_due = survivors_due;
    t = t_next;
    if (t >= kMaxTick) {  // at the horizon: whatever is still running ends there (saturated)
      for (std::uint32_t f : a_flow) out.finish[f] = kMaxTick;
      for (; next < n; ++next) out.finish[pending[next]] = kMaxTick;
      break;
    }
  }
  for (Tick f : out.finish) out.makespan = std::max(out.makespan, f);
  return out;
}

}  // namespace moesim::sim
