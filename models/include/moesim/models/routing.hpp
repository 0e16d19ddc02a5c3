#pragma once
// Expert routing: how the router spreads token copies over the experts of each MoE layer.
//
//   RoutingSpec r = parse_routing(json["moe"], "/moe", diag, base_dir, model);
//   auto p = expert_probabilities(r, /*moe_layer=*/3, model.num_experts, model.top_k, seed);
//   auto load = sample_expert_load(p, copies, Rng::stream(seed, "routing/l3/mb7"));
//
// `balanced` (the default) is the ideal of forced load balancing: every expert gets exactly
// its share, and moesim simulates one rank per pipeline stage. The other distributions give
// each layer a popularity over experts — uniform, Zipf(s) over a random ranking of the experts,
// Dirichlet(alpha), or a measured histogram — and every micro-batch draws its token copies
// from it (multinomially), so the experts' ranks differ and every member of an expert-parallel
// group is simulated.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moesim/models/model_spec.hpp"
#include "moesim/sim/config.hpp"
#include "moesim/sim/random.hpp"

namespace moesim::models {

enum class RoutingKind : std::uint8_t { Balanced, Uniform, Zipf, Dirichlet, Histogram };
const char* routing_name(RoutingKind k);

struct RoutingSpec {
  RoutingKind kind = RoutingKind::Balanced;
  double zipf_s = 1.0;
  double dirichlet_alpha = 1.0;
  /// Measured relative loads: one row per MoE layer (or a single row for every layer).
  std::vector<std::vector<double>> histogram;
  std::string histogram_file;
  double capacity_factor = 0;  ///< 0: dropless; else each expert keeps at most cf x its share
  /// Each expert's input padded to its capacity (Megatron's drop-and-pad): static shapes, so
  /// the dispatcher needs no device-to-host copy of the token counts.
  bool pad_to_capacity = false;
  /// Whether the host must wait for the router's token counts before it can issue the
  /// dispatch (Megatron's alltoall dispatcher copies them to the CPU unless drop-and-pad).
  [[nodiscard]] bool dispatch_syncs_host() const { return !(capacity_factor > 0 && pad_to_capacity); }
  [[nodiscard]] bool skewed() const { return kind != RoutingKind::Balanced; }
};

/// Reads the routing keys of the scenario's "moe" section (the keys it does not own are left
/// to the caller's reader). Problems — unknown distributions, a histogram whose expert count is
/// not the model's, negative or non-finite loads — name the file and JSON path.
void parse_routing(ObjectReader& moe, RoutingSpec& out, const std::string& base_dir, const ModelSpec& m);

/// Popularity of the experts of one MoE layer (sums to 1), fixed for the step. A token's top_k
/// copies go to distinct experts, so no expert gets more than 1/top_k of them: popularity above
/// that is capped and the excess spread over the other experts.
std::vector<double> expert_probabilities(const RoutingSpec& r, int moe_layer, int num_experts, int top_k,
                                         std::uint64_t seed);

/// Token copies per expert for one micro-batch: `copies` draws from the popularity.
std::vector<std::uint64_t> sample_expert_load(const std::vector<double>& p, std::uint64_t copies, Rng& rng);

}  // namespace moesim::models
