// ARS V1-t: theta += alpha / (b * sigma_R) * sum over the b best pairs of (r+ - r-) * delta,
// where sigma_R is the spread of those 2b returns. Dividing by sigma_R makes the step size
// independent of the return scale, which grows from ~10 to 500 as the pole learns to stay up.
#include "demo/learner.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "demo/collector.hpp"
#include "demo/policy.hpp"
#include "demo/rng.hpp"

namespace rlbus::demo {

void learner_config::validate() const {
  if (directions == 0) throw std::invalid_argument("learner: directions must be > 0");
  if (top_directions == 0 || top_directions > directions)
    throw std::invalid_argument("learner: top directions must be in [1, directions]");
  if (!(sigma > 0.0F) || !std::isfinite(sigma))
    throw std::invalid_argument("learner: sigma must be finite and > 0");
  if (!(step_size > 0.0F) || !std::isfinite(step_size))
    throw std::invalid_argument("learner: step size must be finite and > 0");
  if (max_steps == 0) throw std::invalid_argument("learner: max steps must be > 0");
  if (!initial_params.empty()) policy{initial_params};  // throws with the reason
}

learner::learner(learner_config cfg) : config_(std::move(cfg)) {
  config_.validate();
  params_ = config_.initial_params.empty() ? std::vector<float>(policy::parameter_count, 0.0F)
                                           : config_.initial_params;
  version_ = config_.initial_version;
  begin_version();
}

void learner::begin_version() {
  work_ = version_work(config_.seed, version_, params_, config_.sigma, config_.directions,
                       config_.max_steps);
  returns_plus_.assign(config_.directions, std::nullopt);
  returns_minus_.assign(config_.directions, std::nullopt);
  batch_steps_ = 0;
  received_ = 0;
}

submit_status learner::submit(const episode_result& r) {
  if (r.policy_version != version_) return submit_status::stale;
  // A return outside [0, cap] cannot come from cart-pole; letting one in would swamp the
  // return normalisation and throw the mean far off.
  const auto cap = static_cast<double>(config_.max_steps);
  if (r.direction >= config_.directions || (r.sign != 1 && r.sign != -1) ||
      !(r.episode_return >= 0.0 && r.episode_return <= cap) || r.steps > config_.max_steps)
    return submit_status::invalid;
  auto& slot = r.sign == 1 ? returns_plus_[r.direction] : returns_minus_[r.direction];
  if (slot) return submit_status::duplicate;
  slot = r.episode_return;
  batch_steps_ += r.steps;
  ++received_;
  ++total_episodes_;
  total_steps_ += r.steps;
  if (received_ < 2 * config_.directions) return submit_status::accepted;
  update();
  return submit_status::updated;
}

void learner::update() {
  const std::uint32_t n = config_.directions;
  const std::uint32_t b = config_.top_directions;

  update_stats stats;
  stats.policy_version = version_;
  stats.steps = batch_steps_;
  double sum = 0;
  for (std::uint32_t k = 0; k < n; ++k) {
    sum += *returns_plus_[k] + *returns_minus_[k];
    stats.max_return = std::max({stats.max_return, *returns_plus_[k], *returns_minus_[k]});
  }
  stats.mean_return = sum / (2.0 * n);

  // The b directions whose better side did best; ties go to the lower index so the choice
  // does not depend on the sort's implementation.
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0U);
  const auto best = [&](std::uint32_t k) {
    return std::max(*returns_plus_[k], *returns_minus_[k]);
  };
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t c) {
    return best(a) != best(c) ? best(a) > best(c) : a < c;
  });
  order.resize(b);

  double mean = 0;
  for (const auto k : order) mean += *returns_plus_[k] + *returns_minus_[k];
  mean /= 2.0 * b;
  double var = 0;
  for (const auto k : order) {
    var += (*returns_plus_[k] - mean) * (*returns_plus_[k] - mean);
    var += (*returns_minus_[k] - mean) * (*returns_minus_[k] - mean);
  }
  const double sigma_r = std::sqrt(var / (2.0 * b));

  // Equal returns everywhere (every episode capped, or every one failing alike) carry no
  // direction; skip rather than divide by zero, and try fresh noise next version.
  if (sigma_r > 1e-9) {
    std::vector<double> step(params_.size(), 0.0);
    for (const auto k : order) {
      const double diff = *returns_plus_[k] - *returns_minus_[k];
      const auto noise = noise_direction(work_.noise_seed, k, params_.size());
      for (std::size_t i = 0; i < step.size(); ++i) step[i] += diff * static_cast<double>(noise[i]);
    }
    const double scale = static_cast<double>(config_.step_size) / (b * sigma_r);
    for (std::size_t i = 0; i < params_.size(); ++i)
      params_[i] = static_cast<float>(static_cast<double>(params_[i]) + scale * step[i]);
    stats.moved = true;
  }

  last_ = stats;
  ++version_;
  begin_version();
}

work_item version_work(std::uint64_t run_seed, std::uint64_t version, std::vector<float> params,
                       float sigma, std::uint32_t directions, std::uint32_t max_steps) {
  work_item w;
  w.policy_version = version;
  w.params = std::move(params);
  w.sigma = sigma;
  // Even and odd streams of the run seed, so noise and start states never share a seed.
  w.noise_seed = derive_seed(run_seed, 2 * version);
  w.env_seed = derive_seed(run_seed, 2 * version + 1);
  w.first_direction = 0;
  w.direction_count = directions;
  w.max_steps = max_steps;
  return w;
}

std::vector<work_item> split_work(const work_item& item, std::uint32_t parts) {
  parts = std::clamp(parts, 1U, std::max(item.direction_count, 1U));
  std::vector<work_item> out;
  out.reserve(parts);
  std::uint32_t first = item.first_direction;
  for (std::uint32_t p = 0; p < parts; ++p) {
    work_item part = item;
    part.first_direction = first;
    part.direction_count =
        item.direction_count / parts + (p < item.direction_count % parts ? 1 : 0);
    first += part.direction_count;
    out.push_back(std::move(part));
  }
  return out;
}

}  // namespace rlbus::demo
