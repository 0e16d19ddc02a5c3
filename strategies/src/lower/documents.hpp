#pragma once
// Packed documents: how much attention work each data-parallel rank's micro-batches carry when
// documents of random length are packed into the sequences (attention stays inside a document).

#include <cstdint>
#include <vector>

#include "moesim/strategies/plan/plan.hpp"

namespace moesim::strategies::lowering {

struct DocumentWork {
  /// [data-parallel rank, slowest first][micro-batch]: attention work relative to one causal
  /// sequence per sample.
  std::vector<std::vector<double>> factor;
  double max_over_mean = 1;  ///< the slowest rank's work over the mean
  double mean = 1;           ///< mean work per micro-batch
};

[[nodiscard]] DocumentWork sample_documents(const DocumentSpec& ds, int dp, int num_microbatches, int mbs,
                                            long long seq_length, std::uint64_t seed);

}  // namespace moesim::strategies::lowering
