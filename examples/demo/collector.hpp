// The collector's side of the demo: pure functions from (parameters, perturbation, episode
// seed) to returns. No state survives a call, so any collector can run any part of any work
// item, and re-running a lost part gives bit-identical results.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "demo/messages.hpp"
#include "demo/policy.hpp"

namespace rlbus::demo {

/// The unit-variance noise vector named by (noise_seed, direction), of `size` floats.
/// Learner and collectors both call this and get the same bits.
std::vector<float> noise_direction(std::uint64_t noise_seed, std::uint32_t direction,
                                   std::size_t size);

/// `mean` moved along perturbation `p`. Throws std::invalid_argument if the result is not a
/// valid policy's parameters (wrong count, or not finite).
policy perturbed_policy(std::span<const float> mean, const perturbation& p);

/// The seed of the episodes run for `direction` of a batch whose env seed is `env_seed`.
std::uint64_t episode_seed(std::uint64_t env_seed, std::uint32_t direction) noexcept;

/// What one episode gave: its return (1 per step) and its length.
struct episode_outcome {
  double episode_return = 0;
  std::uint32_t steps = 0;
};

/// Runs one episode of `pi` from the initial state drawn by `env_seed`, capped at max_steps.
episode_outcome run_episode(const policy& pi, std::uint64_t env_seed, std::uint32_t max_steps);

/// The collector's whole job for one work item: 2 * direction_count episodes, results in
/// direction order, + before -. Throws std::invalid_argument if the item's parameters are not
/// a valid policy (a learner bug, not a peer fault: the learner's own output is trusted).
std::vector<episode_result> collect(const work_item& item);

/// Mean, worst and best return of consecutive episodes of one policy.
struct evaluation {
  double mean_return = 0;
  double min_return = 0;
  double max_return = 0;
  std::uint32_t episodes = 0;
};

/// Runs `episodes` (> 0) consecutive episodes of `pi` on one env seeded with `seed` (each
/// starts from the next initial state that env draws).
evaluation evaluate(const policy& pi, std::uint64_t seed,
                    std::uint32_t episodes = cartpole::solved_episodes,
                    std::uint32_t max_steps = cartpole::max_episode_steps);

/// The CartPole-v1 criterion: at least cartpole::solved_episodes episodes with a mean return
/// of at least cartpole::solved_mean_return.
bool solved(const evaluation& e) noexcept;

}  // namespace rlbus::demo
