#pragma once
// Flow-level network: flows over paths of links share every link max-min fairly.
//
//   sim::FlowNetwork net({25e9, 25e9, 50e9});          // link capacities, bytes/s
//   net.add(1e9, {0, 2});                              // 1 GB over links 0 and 2, ready at 0
//   net.add(1e9, {1, 2}, /*release=*/to_ticks(Seconds{1e-3}));
//   sim::FlowRun r = net.run();                        // r.finish[f], r.makespan
//
// Rates come from progressive filling: every unfrozen flow's rate rises together until a link
// saturates; that link's flows freeze at their rate; repeat until every flow is frozen. The
// rates change only when a flow starts or ends, so the run recomputes them only then (all flows
// starting or ending at the same tick in one recomputation) and advances every flow linearly
// in between. A flow with an empty path (a copy inside one device) finishes when released.
// Time is integer ticks (see units.hpp); completion ticks are rounded up. Flows due within 1%
// of the elapsed time after the first one to finish are retired together, each at its own due
// tick, with one recomputation (a skewed all-to-all has every flow end at a slightly different
// time); the survivors then get the freed bandwidth at most 1% of the elapsed time early.
//
// Knows nothing of collectives or MoE: strategies/ expands a collective into flows over the
// topology's routes.

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "moesim/sim/units.hpp"

namespace moesim::sim {

struct FlowRun {
  std::vector<Tick> finish;  ///< per flow, in the order added
  Tick makespan = 0;
  std::uint64_t recomputations = 0;  ///< rate recomputations (flow starts / ends)
};

class FlowNetwork {
 public:
  explicit FlowNetwork(std::vector<double> capacity) : capacity_(std::move(capacity)) {}

  /// A flow of `bytes` over `links` (indices into the capacities), ready at `release`.
  std::uint32_t add(double bytes, std::span<const std::uint32_t> links, Tick release = 0);
  std::uint32_t add(double bytes, std::initializer_list<std::uint32_t> links, Tick release = 0) {
    return add(bytes, std::span<const std::uint32_t>(links.begin(), links.size()), release);
  }
  [[nodiscard]] std::size_t num_flows() const { return bytes_.size(); }
  [[nodiscard]] std::size_t num_links() const { return capacity_.size(); }

  /// Runs every flow to completion.
  [[nodiscard]] FlowRun run() const;

  /// Max-min fair rates (bytes/s) of the flows in `active` alone, written to rate[flow].
  void max_min_rates(std::span<const std::uint32_t> active, std::vector<double>& rate) const;

 private:
  std::vector<double> capacity_;
  std::vector<double> bytes_;
  std::vector<Tick> release_;
  std::vector<std::uint32_t> path_offset_{0};
  std::vector<std::uint32_t> path_;
};

}  // namespace moesim::sim
