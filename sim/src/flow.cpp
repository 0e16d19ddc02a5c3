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

/// Scratch space for progressive filling, sized once per run.
struct Filling {
  std::vector<double> left;            // per link: capacity not yet handed out
  std::vector<std::uint32_t> unfrozen;  // per link: unfrozen flows crossing it
  std::vector<std::uint32_t> link_offset, link_flows;  // per link: the active flows crossing it
  std::vector<char> frozen;             // per flow
  std::vector<std::uint32_t> touched;   // links with flows this round
};

}  // namespace

void FlowNetwork::max_min_rates(std::span<const std::uint32_t> active, std::vector<double>& rate) const {
  Filling s;
  const std::size_t nl = capacity_.size();
  s.left.assign(capacity_.begin(), capacity_.end());
  s.unfrozen.assign(nl, 0);
  s.frozen.assign(bytes_.size(), 0);
  rate.resize(bytes_.size(), 0.0);
  for (std::uint32_t f : active) {
    rate[f] = 0;
    for (std::uint32_t i = path_offset_[f]; i < path_offset_[f + 1]; ++i) ++s.unfrozen[path_[i]];
  }
  s.link_offset.assign(nl + 1, 0);
  for (std::size_t l = 0; l < nl; ++l) s.link_offset[l + 1] = s.link_offset[l] + s.unfrozen[l];
  s.link_flows.resize(s.link_offset[nl]);
  {
    std::vector<std::uint32_t> fill(s.link_offset.begin(), s.link_offset.end() - 1);
    for (std::uint32_t f : active)
      for (std::uint32_t i = path_offset_[f]; i < path_offset_[f + 1]; ++i) s.link_flows[fill[path_[i]]++] = f;
  }
  for (std::size_t l = 0; l < nl; ++l)
    if (s.unfrozen[l] > 0) s.touched.push_back(static_cast<std::uint32_t>(l));
  std::size_t left_flows = 0;
  for (std::uint32_t f : active) left_flows += path_offset_[f + 1] > path_offset_[f] ? 1 : 0;
  while (left_flows > 0) {
    double inc = std::numeric_limits<double>::infinity();
    for (std::uint32_t l : s.touched)
      if (s.unfrozen[l] > 0) inc = std::min(inc, s.left[l] / s.unfrozen[l]);
    if (!std::isfinite(inc)) break;
    for (std::uint32_t f : active)
      if (!s.frozen[f]) rate[f] += inc;
    for (std::uint32_t l : s.touched)
      if (s.unfrozen[l] > 0) s.left[l] -= inc * s.unfrozen[l];
    // Freeze the flows of every link that is now full.
    for (std::uint32_t l : s.touched) {
      if (s.unfrozen[l] == 0 || s.left[l] > 1e-9 * capacity_[l]) continue;
      for (std::uint32_t k = s.link_offset[l]; k < s.link_offset[l + 1]; ++k) {
        const std::uint32_t f = s.link_flows[k];
        if (s.frozen[f]) continue;
        s.frozen[f] = 1;
        --left_flows;
        for (std::uint32_t i = path_offset_[f]; i < path_offset_[f + 1]; ++i) --s.unfrozen[path_[i]];
      }
    }
  }
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
      max_min_rates(active, rate);
      ++out.recomputations;
      for (std::uint32_t f : active) {
        const double ticks = std::ceil(remaining[f] / (rate[f] * kPerTick));
        due[f] = t + std::max<Tick>(1, static_cast<Tick>(std::min(ticks, static_cast<double>(kMaxTick / 2))));
      }
    }
    Tick t_next = next < n ? release_[pending[next]] : kMaxTick;
    for (std::uint32_t f : active) t_next = std::min(t_next, due[f]);
    const double dt = static_cast<double>(t_next - t) * kPerTick;
    std::size_t kept = 0;
    for (std::uint32_t f : active) {
      if (due[f] <= t_next) {
        out.finish[f] = t_next;
        changed = true;
        continue;
      }
      remaining[f] = std::max(0.0, remaining[f] - rate[f] * dt);
      active[kept++] = f;
    }
    active.resize(kept);
    t = t_next;
  }
  for (Tick f : out.finish) out.makespan = std::max(out.makespan, f);
  return out;
}

}  // namespace moesim::sim
