// Cart-pole dynamics from the standard equations of motion (Florian 2007, as Gym writes
// them), integrated with explicit Euler: positions advance with the old velocities.
#include "demo/cartpole.hpp"

#include <cassert>
#include <cmath>

#include "demo/rng.hpp"

namespace rlbus::demo {

cartpole::cartpole(std::uint64_t seed, std::uint32_t max_steps)
    : gen_(seed), max_steps_(max_steps) {
  assert(max_steps_ > 0);
  reset();
}

const cartpole::state& cartpole::reset() {
  // Drawn in a fixed order with our own uniform so a seed means the same start everywhere.
  state_.x = uniform(gen_, -initial_spread, initial_spread);
  state_.x_dot = uniform(gen_, -initial_spread, initial_spread);
  state_.theta = uniform(gen_, -initial_spread, initial_spread);
  state_.theta_dot = uniform(gen_, -initial_spread, initial_spread);
  steps_ = 0;
  done_ = false;
  return state_;
}

cartpole::step_result cartpole::step(action a) {
  assert(!done_);
  state_ = advance(state_, a);
  ++steps_;
  step_result r;
  r.reward = 1.0;  // Gym pays the failing step too, so a return equals the episode length
  r.terminated = failed(state_);
  r.truncated = !r.terminated && steps_ >= max_steps_;
  done_ = r.terminated || r.truncated;
  return r;
}

cartpole::state cartpole::advance(const state& s, action a) noexcept {
  constexpr double total_mass = cart_mass + pole_mass;
  constexpr double pole_mass_length = pole_mass * half_length;
  const double force = a == action::push_right ? force_magnitude : -force_magnitude;
  const double cos_theta = std::cos(s.theta);
  const double sin_theta = std::sin(s.theta);

  const double temp =
      (force + pole_mass_length * s.theta_dot * s.theta_dot * sin_theta) / total_mass;
  const double theta_acc =
      (gravity * sin_theta - cos_theta * temp) /
      (half_length * (4.0 / 3.0 - pole_mass * cos_theta * cos_theta / total_mass));
  const double x_acc = temp - pole_mass_length * theta_acc * cos_theta / total_mass;

  state next;
  next.x = s.x + tau * s.x_dot;
  next.x_dot = s.x_dot + tau * x_acc;
  next.theta = s.theta + tau * s.theta_dot;
  next.theta_dot = s.theta_dot + tau * theta_acc;
  return next;
}

bool cartpole::failed(const state& s) noexcept {
  return s.x < -x_limit || s.x > x_limit || s.theta < -theta_limit || s.theta > theta_limit;
}

}  // namespace rlbus::demo
