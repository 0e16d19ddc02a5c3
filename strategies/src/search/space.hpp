#pragma once
// Internal to strategies/src/search/: the plans of a search space (space.cpp), enumerated by a
// mixed-radix index over its axes, and the recompute module names search.cpp writes plans with.
// Not part of the public API (search.hpp).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moesim/strategies/search/search.hpp"

namespace moesim::strategies::search_detail {

/// Selective recompute modules as "core_attn+layernorm+..." (Megatron's names).
[[nodiscard]] std::string module_names(std::uint32_t bits);

/// The plans of a space, one per mixed-radix index over its axes (0 .. space.size() - 1).
class PlanEnumerator {
 public:
  PlanEnumerator(const Scenario& base, const SearchSpace& space);

  /// The plan at `index` into `p` (and its recompute choice's name into `rc_name`); false when
  /// the index names no valid plan or one another index names too.
  bool make_plan(std::size_t index, Plan& p, std::string& rc_name) const;

 private:
  [[nodiscard]] bool has_plain_twin(int ep_size) const;
  /// Sets the schedule of axis value `sk`; false when the plan's vpp does not run it.
  [[nodiscard]] bool set_schedule(int sk, Plan& p) const;

  const Scenario* base_;
  const SearchSpace* space_;
  std::array<std::size_t, 19> radices_{};
  bool plain_etp1_ = false;
};

}  // namespace moesim::strategies::search_detail
