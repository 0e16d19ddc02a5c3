#pragma once
// Network models behind one interface: how long a collective on a group of devices takes.
//
//   auto net = make_collective_model(NetworkKind::Flow, topo);
//   GroupPlacement g{&shape, devices, nodes, others};  // others: the concurrent groups' devices
//   CollectiveCost c = net->collective(Collective::AllToAll, bytes, g, Algorithm::Pairwise, 1.0);
//
// Two implementations:
// - AnalyticalCollectives: the closed-form costs of collectives.hpp (alpha-beta per algorithm
//   on the group's summary shape; per-pair volumes bound by each member's ports).
// - FlowCollectiveModel: all-to-alls become flows on the topology's routes, sharing links
//   max-min fairly (netflow.hpp); other collectives keep the analytical cost (their traffic
//   is regular: rings and trees on dedicated links). Uniform all-to-alls are cached by
//   (first device, bytes, dedup, algorithm).
// A new network model (packet level, a measured table) implements CollectiveModel and is
// selected by `simulation.network`; the lowering asks only this interface.

#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "moesim/topologies/collectives.hpp"
#include "moesim/topologies/netflow.hpp"
#include "moesim/topologies/topology.hpp"

namespace moesim::topologies {

/// Where one group's members are: what a network model may look at.
struct GroupPlacement {
  const GroupShape* shape = nullptr;  ///< the group's summary (size, servers, links)
  std::span<const int> devices;       ///< member devices (global indices); may be empty for the analytical model
  std::span<const int> nodes;         ///< member servers, for per-pair volumes in the analytical model
  /// Devices of the other groups that run the same collective at the same time (data-parallel
  /// replicas in lockstep), group after group, each in the member order of `devices`; may be
  /// empty (no contention from them).
  std::span<const int> others;
};

class CollectiveModel {
 public:
  virtual ~CollectiveModel() = default;
  [[nodiscard]] virtual const char* name() const = 0;
  /// Whether the model looks at GroupPlacement::devices (callers may skip computing them).
  [[nodiscard]] virtual bool needs_devices() const = 0;
  /// Every member contributes `bytes` (all-to-all: sends bytes / size to each member).
  virtual CollectiveCost collective(Collective kind, double bytes, const GroupPlacement& g, Algorithm algo,
                                    double dedup) = 0;
  /// All-to-all with per-pair volumes: bytes[i][j] from member i to member j.
  virtual CollectiveCost alltoallv(const std::vector<std::vector<double>>& bytes, const GroupPlacement& g,
                                   Algorithm algo, double dedup) = 0;
};

class AnalyticalCollectives final : public CollectiveModel {
 public:
  [[nodiscard]] const char* name() const override { return "analytical"; }
  [[nodiscard]] bool needs_devices() const override { return false; }
  CollectiveCost collective(Collective kind, double bytes, const GroupPlacement& g, Algorithm algo,
                            double dedup) override;
  CollectiveCost alltoallv(const std::vector<std::vector<double>>& bytes, const GroupPlacement& g, Algorithm algo,
                           double dedup) override;
};

class FlowCollectiveModel final : public CollectiveModel {
 public:
  explicit FlowCollectiveModel(const Topology& topo) : flows_(topo) {}
  [[nodiscard]] const char* name() const override { return "flow"; }
  [[nodiscard]] bool needs_devices() const override { return true; }
  CollectiveCost collective(Collective kind, double bytes, const GroupPlacement& g, Algorithm algo,
                            double dedup) override;
  CollectiveCost alltoallv(const std::vector<std::vector<double>>& bytes, const GroupPlacement& g, Algorithm algo,
                           double dedup) override;
  [[nodiscard]] const FlowCollectives& flows() const { return flows_; }

 private:
  FlowCollectives flows_;
  std::map<std::tuple<int, double, double, int>, CollectiveCost> uniform_;
};

enum class NetworkKind : std::uint8_t { Analytical, Flow };
std::unique_ptr<CollectiveModel> make_collective_model(NetworkKind kind, const Topology& topo);

}  // namespace moesim::topologies
