#pragma once
// Internal to strategies/src/rl/: what loading the rl section (rl_scenario.cpp) and simulating
// the RL step (rl.cpp) share. Not part of the public API (rl.hpp).

#include <cstdint>
#include <vector>

#include "moesim/strategies/rl/rl.hpp"

namespace moesim::strategies::rl_detail {

/// The rollouts of one RL step: per prompt its length and its responses' lengths.
struct StepDraw {
  std::vector<std::int64_t> prompt;                  ///< per prompt
  std::vector<std::vector<std::int64_t>> responses;  ///< per prompt, per rollout
  double prompt_tokens = 0, response_tokens = 0;
};

[[nodiscard]] StepDraw draw_step(const RlSpec& rl, std::uint64_t seed, int step);

/// The inference plan of a forward-only model: the rollout's plan without MTP (and without EP
/// for a dense model).
[[nodiscard]] InferencePlan forward_plan(const RlSpec& rl, const models::ModelSpec& m);

}  // namespace moesim::strategies::rl_detail
