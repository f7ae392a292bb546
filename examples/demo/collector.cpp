// Collector functions: regenerate a perturbation from its seed, run episodes, report.
// Everything here is a function of its arguments; determinism is the whole design.
#include "demo/collector.hpp"

#include <algorithm>
#include <cassert>
#include <random>
#include <utility>

#include "demo/rng.hpp"

namespace rlbus::demo {

std::vector<float> noise_direction(std::uint64_t noise_seed, std::uint32_t direction,
                                   std::size_t size) {
  std::mt19937_64 gen(derive_seed(noise_seed, direction));
  std::vector<float> out(size);
  for (float& v : out) v = static_cast<float>(unit_noise(gen));
  return out;
}

policy perturbed_policy(std::span<const float> mean, const perturbation& p) {
  std::vector<float> params(mean.begin(), mean.end());
  if (p.sign != 0) {
    const auto noise = noise_direction(p.noise_seed, p.direction, params.size());
    const double step = static_cast<double>(p.sign) * static_cast<double>(p.sigma);
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i] =
          static_cast<float>(static_cast<double>(params[i]) + step * static_cast<double>(noise[i]));
  }
  return policy(std::move(params));
}

std::uint64_t episode_seed(std::uint64_t env_seed, std::uint32_t direction) noexcept {
  return derive_seed(env_seed, direction);
}

episode_outcome run_episode(const policy& pi, std::uint64_t env_seed, std::uint32_t max_steps) {
  cartpole env(env_seed, max_steps);
  episode_outcome out;
  while (!env.done()) out.episode_return += env.step(pi.act(env.current())).reward;
  out.steps = env.steps();
  return out;
}

std::vector<episode_result> collect(const work_item& item) {
  std::vector<episode_result> out;
  out.reserve(2 * static_cast<std::size_t>(item.direction_count));
  for (std::uint32_t k = 0; k < item.direction_count; ++k) {
    const std::uint32_t direction = item.first_direction + k;
    // Both sides of a pair start from the same state, so their difference measures the
    // direction rather than the luck of the draw (common random numbers).
    const std::uint64_t seed = episode_seed(item.env_seed, direction);
    for (const std::int8_t sign : {std::int8_t{1}, std::int8_t{-1}}) {
      const perturbation p{item.noise_seed, direction, sign, item.sigma};
      const auto outcome = run_episode(perturbed_policy(item.params, p), seed, item.max_steps);
      out.push_back({item.policy_version, direction, sign, outcome.episode_return, outcome.steps});
    }
  }
  return out;
}

evaluation evaluate(const policy& pi, std::uint64_t seed, std::uint32_t episodes,
                    std::uint32_t max_steps) {
  assert(episodes > 0);
  cartpole env(seed, max_steps);
  evaluation e;
  e.min_return = static_cast<double>(max_steps);
  double total = 0;
  for (std::uint32_t i = 0; i < episodes; ++i) {
    if (i > 0) env.reset();
    double ret = 0;
    while (!env.done()) ret += env.step(pi.act(env.current())).reward;
    total += ret;
    e.min_return = std::min(e.min_return, ret);
    e.max_return = std::max(e.max_return, ret);
  }
  e.episodes = episodes;
  e.mean_return = total / static_cast<double>(episodes);
  return e;
}

bool solved(const evaluation& e) noexcept {
  return e.episodes >= cartpole::solved_episodes && e.mean_return >= cartpole::solved_mean_return;
}

}  // namespace rlbus::demo
