// Cart-pole balancing (Barto, Sutton & Anderson 1983) as Gym's CartPole-v1 defines it:
// the same constants, Euler integration, failure bounds, 500-step cap and reward 1 per step,
// so "solved" means what it means elsewhere. No rendering, no allocation, no networking.
#pragma once

#include <cstdint>
#include <random>

namespace rlbus::demo {

/// The two forces the agent may apply; there is no "do nothing".
enum class action : std::uint8_t { push_left = 0, push_right = 1 };

/// One episode environment. Deterministic: the same seed gives the same initial states, and
/// the dynamics have no noise. Not thread-safe; cheap to create (one per episode is fine).
class cartpole {
 public:
  /// Physical state; it is also the observation (Gym's order: x, x_dot, theta, theta_dot).
  /// Metres, metres/second, radians (0 = upright, positive leans right), radians/second.
  struct state {
    double x = 0;
    double x_dot = 0;
    double theta = 0;
    double theta_dot = 0;
    bool operator==(const state&) const = default;
  };

  /// What one step produced. `terminated`: the pole fell or the cart left the track;
  /// `truncated`: the step cap was reached with the pole still up.
  struct step_result {
    double reward = 0;
    bool terminated = false;
    bool truncated = false;
  };

  static constexpr double gravity = 9.8;
  static constexpr double cart_mass = 1.0;
  static constexpr double pole_mass = 0.1;
  static constexpr double half_length = 0.5;  // Gym's "length": pivot to centre of mass
  static constexpr double force_magnitude = 10.0;
  static constexpr double tau = 0.02;  // seconds per step
  static constexpr double x_limit = 2.4;
  static constexpr double theta_limit = 12.0 * 3.14159265358979323846 / 180.0;
  static constexpr double initial_spread = 0.05;  // each state variable starts in [-0.05, 0.05)
  static constexpr std::uint32_t max_episode_steps = 500;

  /// "Solved" (CartPole-v1): a mean return of at least 475 over 100 consecutive episodes,
  /// each capped at 500 steps. A linear policy gets there in seconds, so there is no need to
  /// fall back to v0's 195 over 100 episodes with a 200-step cap.
  static constexpr double solved_mean_return = 475.0;
  static constexpr std::uint32_t solved_episodes = 100;

  /// Draws the first initial state from `seed`. `max_steps` (> 0) is the truncation cap.
  explicit cartpole(std::uint64_t seed, std::uint32_t max_steps = max_episode_steps);

  /// Starts the next episode from a fresh initial state drawn from this env's generator,
  /// so consecutive episodes of one env differ but the whole sequence is fixed by the seed.
  const state& reset();

  /// Applies `a` for one step. Precondition: !done() (asserted).
  step_result step(action a);

  [[nodiscard]] const state& current() const noexcept { return state_; }
  [[nodiscard]] std::uint32_t steps() const noexcept { return steps_; }
  [[nodiscard]] bool done() const noexcept { return done_; }

  /// The dynamics alone: the state one step after applying `a` in `s`. Pure.
  static state advance(const state& s, action a) noexcept;
  /// Whether `s` is a failure (cart off the track or pole past 12 degrees).
  static bool failed(const state& s) noexcept;

 private:
  std::mt19937_64 gen_;
  std::uint32_t max_steps_;
  state state_;
  std::uint32_t steps_ = 0;
  bool done_ = false;
};

}  // namespace rlbus::demo
