#pragma once
// Decoder layers onto pipeline positions: how many layers each virtual stage holds, and which
// pipeline items (embedding, layers, head, MTP) each virtual stage runs.

#include <cstddef>
#include <vector>

#include "moesim/strategies/plan/plan.hpp"

namespace moesim::strategies::lowering {

/// Decoder layers per virtual stage for `layer_cost` (seconds per layer) with the embedding's
/// cost on the first stage and the head's on the last. `refine` runs the local search after
/// the water-filling start (the search's screening skips it). Explicit and even partitions
/// follow the plan.
[[nodiscard]] std::vector<int> partition_layers(const Plan& p, const std::vector<double>& layer_cost,
                                                double first_extra, double last_extra, bool refine = true);

/// Items per virtual stage (indices into Workload::items, `num_items` of them): the embedding,
/// the decoder layers, then the head (and MTP). DualPipe runs two such pipelines over the same
/// items.
[[nodiscard]] std::vector<std::vector<int>> virtual_stage_items(const Plan& p, const std::vector<int>& counts,
                                                                std::size_t num_items);

}  // namespace moesim::strategies::lowering
