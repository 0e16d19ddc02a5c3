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

/// Progressive filling with scratch space reused across recomputations (no allocation once
/// the vectors have grown). Unfrozen flows all sit at the current water level; a link's spare
/// capacity is capacity - frozen rates - level x unfrozen flows, so raising the level costs
/// O(links), and a flow's rate is written once, when it freezes.
struct Filling {
  std::vector<double> frozen_sum;        // per link: rates of the frozen flows crossing it
  std::vector<std::uint32_t> unfrozen;   // per link: unfrozen flows crossing it
  std::vector<std::uint32_t> link_offset, link_flows, fill;  // per link: the active flows crossing it
  std::vector<char> frozen;              // per flow
  std::vector<std::uint32_t> touched;    // links with unfrozen flows

  void rates(const std::vector<double>& capacity, const std::vector<std::uint32_t>& path_offset,
             const std::vector<std::uint32_t>& path, std::span<const std::uint32_t> active, std::size_t n_flows,
             std::vector<double>& rate) {
    const std::size_t nl = capacity.size();
    frozen_sum.assign(nl, 0.0);
    unfrozen.assign(nl, 0);
    frozen.assign(n_flows, 0);
    rate.resize(n_flows, 0.0);
    for (std::uint32_t f : active)
      for (std::uint32_t i = path_offset[f]; i < path_offset[f + 1]; ++i) ++unfrozen[path[i]];
    link_offset.assign(nl + 1, 0);
    for (std::size_t l = 0; l < nl; ++l) link_offset[l + 1] = link_offset[l] + unfrozen[l];
    link_flows.resize(link_offset[nl]);
    fill.assign(link_offset.begin(), link_offset.end() - 1);
    for (std::uint32_t f : active)
      for (std::uint32_t i = path_offset[f]; i < path_offset[f + 1]; ++i) link_flows[fill[path[i]]++] = f;
    touched.clear();
    for (std::size_t l = 0; l < nl; ++l)
      if (unfrozen[l] > 0) touched.push_back(static_cast<std::uint32_t>(l));
    std::size_t left = 0;
    for (std::uint32_t f : active) {
      rate[f] = 0;
      left += path_offset[f + 1] > path_offset[f] ? 1 : 0;
    }
    double level = 0;
    while (left > 0) {
      // The level at which the first link fills up.
      double next = std::numeric_limits<double>::infinity();
      std::size_t kept = 0;
      for (std::uint32_t l : touched) {
        if (unfrozen[l] == 0) continue;
        touched[kept++] = l;
        next = std::min(next, (capacity[l] - frozen_sum[l]) / unfrozen[l]);
      }
      touched.resize(kept);
      if (!std::isfinite(next)) break;
      level = std::max(level, next);
      for (std::uint32_t l : touched) {
        if (unfrozen[l] == 0) continue;
        if (capacity[l] - frozen_sum[l] - level * unfrozen[l] > 1e-9 * capacity[l]) continue;
        for (std::uint32_t k = link_offset[l]; k < link_offset[l + 1]; ++k) {
          const std::uint32_t f = link_flows[k];
          if (frozen[f]) continue;
          frozen[f] = 1;
          rate[f] = level;
          --left;
          for (std::uint32_t i = path_offset[f]; i < path_offset[f + 1]; ++i) {
            --unfrozen[path[i]];
            frozen_sum[path[i]] += level;
          }
        }
      }
    }
  }
};

}  // namespace

void FlowNetwork::max_min_rates(std::span<const std::uint32_t> active, std::vector<double>& rate) const {
  Filling s;
  s.rates(capacity_, path_offset_, path_, active, bytes_.size(), rate);
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
  std::vector<double> remaining(bytes_), rate(n, 0.0);
  std::vector<Tick> due(n, 0);
  std::vector<std::uint32_t> active;
  active.reserve(n);
  std::size_t next = 0;
  Tick t = release_[pending[0]];
  constexpr double kPerTick = 1.0 / static_cast<double>(kTicksPerSecond);
  constexpr double kMergeFraction = 1e-2;
  Filling filling;
  const Tick t0 = t;
  bool changed = false;  // a flow started or ended since the last recomputation
  while (true) {
    while (next < n && release_[pending[next]] <= t) {
      const std::uint32_t f = pending[next++];
      if (bytes_[f] <= 0 || path_offset_[f + 1] == path_offset_[f]) {
        out.finish[f] = t;
      } else {
        active.push_back(f);
        changed = true;
      }
    }
    if (active.empty()) {
      if (next >= n) break;
      t = release_[pending[next]];
      continue;
    }
    if (changed) {
      changed = false;
      filling.rates(capacity_, path_offset_, path_, active, n, rate);
      ++out.recomputations;
      for (std::uint32_t f : active) {
        const double ticks = std::ceil(remaining[f] / (rate[f] * kPerTick));
        // Saturates at the horizon (a flow that slow is reported out of range by the engine).
        due[f] = add_ticks(t, std::max<Tick>(1, static_cast<Tick>(std::min(ticks, static_cast<double>(kMaxTick)))));
      }
    }
    Tick t_next = next < n ? release_[pending[next]] : kMaxTick;
    Tick first_due = kMaxTick;
    for (std::uint32_t f : active) first_due = std::min(first_due, due[f]);
    t_next = std::min(t_next, first_due);
    // Flows due within kMergeFraction of the elapsed time after the first one end at their own
    // due times, with one recomputation for all of them at the first: survivors get the freed
    // bandwidth at most that much early.
    const Tick merge_until =
        t_next == first_due ? add_ticks(t_next, static_cast<Tick>(kMergeFraction * static_cast<double>(t_next - t0))) : t_next;
    const double dt = static_cast<double>(t_next - t) * kPerTick;
    std::size_t kept = 0;
    for (std::uint32_t f : active) {
      if (due[f] <= merge_until) {
        out.finish[f] = due[f];
        changed = true;
        continue;
      }
      remaining[f] = std::max(0.0, remaining[f] - rate[f] * dt);
      active[kept++] = f;
    }
    active.resize(kept);
    t = t_next;
    if (t >= kMaxTick) {  // at the horizon: whatever is still running ends there (saturated)
      for (std::uint32_t f : active) out.finish[f] = kMaxTick;
      for (; next < n; ++next) out.finish[pending[next]] = kMaxTick;
      break;
    }
  }
  for (Tick f : out.finish) out.makespan = std::max(out.makespan, f);
  return out;
}

}  // namespace moesim::sim
