// Learner <-> collector messages as plain values: a work item per policy version, a result
// per episode. A perturbation travels as (seed, direction, sign) and is rebuilt on arrival,
// so a batch costs a few dozen bytes plus one copy of the parameters, whatever its size.
#pragma once

#include <cstdint>
#include <vector>

#include "demo/cartpole.hpp"

namespace rlbus::demo {

/// One perturbation of the mean parameters: mean + sign * sigma * noise(noise_seed,
/// direction), noise having unit variance per coordinate. sign 0 is the mean itself.
struct perturbation {
  std::uint64_t noise_seed = 0;
  std::uint32_t direction = 0;
  std::int8_t sign = 1;
  float sigma = 0;
  bool operator==(const perturbation&) const = default;
};

/// The learner's request for policy version `policy_version`: run every direction in
/// [first_direction, first_direction + direction_count) twice, once each side of the mean
/// (antithetic pairs), both runs starting from the same episode seed. A work item may be cut
/// into disjoint direction ranges for several collectors (split_work in learner.hpp).
struct work_item {
  std::uint64_t policy_version = 0;
  std::vector<float> params;  // the mean; params_to_bytes gives its wire form
  float sigma = 0;
  std::uint64_t noise_seed = 0;
  std::uint64_t env_seed = 0;  // with a direction, names that pair's start state
  std::uint32_t first_direction = 0;
  std::uint32_t direction_count = 0;
  std::uint32_t max_steps = cartpole::max_episode_steps;
  bool operator==(const work_item&) const = default;
};

/// A collector's report of one episode. (policy_version, direction, sign) identify it, so a
/// result that arrives twice or late (after the learner moved on) is recognised and dropped.
struct episode_result {
  std::uint64_t policy_version = 0;
  std::uint32_t direction = 0;
  std::int8_t sign = 1;  // +1 or -1
  double episode_return = 0;
  std::uint32_t steps = 0;
  bool operator==(const episode_result&) const = default;
};

}  // namespace rlbus::demo
