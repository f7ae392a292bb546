// Cart-pole physics: one step checked against values worked out from the equations, the
// pole falling without feedback control, and episodes fixed entirely by their seed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "demo/cartpole.hpp"
#include "demo/rng.hpp"

// In the demo's own namespace, so its names win in a unity build where another test brings
// rlbus's into view (the SDK's rlbus::policy beside the demo's policy).
namespace rlbus::demo {

namespace {

std::vector<cartpole::state> trajectory(std::uint64_t seed) {
  // A feedback rule that keeps the pole up for a while, so the trajectory is long enough
  // to show drift if anything were nondeterministic.
  cartpole env(seed);
  std::vector<cartpole::state> out{env.current()};
  while (!env.done()) {
    const auto& s = env.current();
    env.step(s.theta + s.theta_dot > 0 ? action::push_right : action::push_left);
    out.push_back(env.current());
  }
  return out;
}

}  // namespace

TEST_CASE("one step from rest matches the closed form", "[unit][demo]") {
  // From rest with cos = 1 and sin = 0 the equations reduce to fractions:
  // temp = F / (M + m) = 100/11, theta_acc = -temp / (l (4/3 - m / (M + m))) = -600/41,
  // x_acc = temp - m l theta_acc / (M + m) = 400/41; Euler moves only the velocities.
  const auto s = cartpole::advance({}, action::push_right);
  CHECK(s.x == 0.0);
  CHECK(s.theta == 0.0);
  CHECK(s.x_dot == Approx(0.02 * 400.0 / 41.0).epsilon(1e-14));
  CHECK(s.theta_dot == Approx(0.02 * -600.0 / 41.0).epsilon(1e-14));

  const auto mirrored = cartpole::advance({}, action::push_left);
  CHECK(mirrored.x_dot == -s.x_dot);
  CHECK(mirrored.theta_dot == -s.theta_dot);
}

TEST_CASE("one step from a tilted, moving state matches hand-computed values", "[unit][demo]") {
  // Values from the same equations evaluated separately (Python, float64). Positions move
  // with the old velocities (explicit Euler): x = 0.01 + 0.02 * -0.02, theta = 0.03 + 0.02 *
  // -0.04. Pushing left while leaning right swings the pole further right.
  const cartpole::state before{0.01, -0.02, 0.03, -0.04};
  const auto s = cartpole::advance(before, action::push_left);
  CHECK(s.x == Approx(0.0096).epsilon(1e-12));
  CHECK(s.x_dot == Approx(-0.21553901710278936).epsilon(1e-12));
  CHECK(s.theta == Approx(0.0292).epsilon(1e-12));
  CHECK(s.theta_dot == Approx(0.26199522377603923).epsilon(1e-12));
}

TEST_CASE("failure is leaving the track or tilting past 12 degrees", "[unit][demo]") {
  CHECK_FALSE(cartpole::failed({}));
  CHECK_FALSE(cartpole::failed({2.39, 0, 0.2094, 0}));
  CHECK(cartpole::failed({2.41, 0, 0, 0}));
  CHECK(cartpole::failed({-2.41, 0, 0, 0}));
  CHECK(cartpole::failed({0, 0, 0.2095, 0}));  // 12 degrees is 0.20944 rad
  CHECK(cartpole::failed({0, 0, -0.2095, 0}));
}

TEST_CASE("pushing one way regardless of the pole drops it within a dozen steps", "[unit][demo]") {
  for (const auto a : {action::push_left, action::push_right}) {
    for (std::uint64_t seed = 0; seed < 200; ++seed) {
      cartpole env(seed);
      cartpole::step_result last;
      while (!env.done()) last = env.step(a);
      INFO("seed " << seed);
      CHECK(last.terminated);
      CHECK_FALSE(last.truncated);
      CHECK(env.steps() <= 12);
      CHECK(last.reward == 1.0);  // the failing step is paid too, as in Gym
    }
  }
}

TEST_CASE("an episode still up after 500 steps is truncated, not terminated", "[unit][demo]") {
  cartpole env(3);
  cartpole::step_result last;
  double total = 0;
  while (!env.done()) {
    // A hand-tuned linear controller (all gains positive) that balances indefinitely.
    const auto& s = env.current();
    const double score = 0.5 * s.x + 1.0 * s.x_dot + 10.0 * s.theta + 2.0 * s.theta_dot;
    last = env.step(score > 0 ? action::push_right : action::push_left);
    total += last.reward;
  }
  CHECK(last.truncated);
  CHECK_FALSE(last.terminated);
  CHECK(env.steps() == cartpole::max_episode_steps);
  CHECK(total == 500.0);

  cartpole short_env(3, 200);  // CartPole-v0's cap
  while (!short_env.done()) short_env.step(action::push_right);
  CHECK(short_env.steps() < 200);
}

TEST_CASE("initial states are uniform in [-0.05, 0.05) and fixed by the seed", "[unit][demo]") {
  cartpole env(42);
  // Pinned: std::mt19937_64 is specified bit for bit by the standard and the uniform is ours,
  // so this holds with any standard library.
  const cartpole::state first{0.025515553295453894, 0.013903139385469748, 0.025214520074802668,
                              -0.036372731636756299};
  CHECK(env.current() == first);
  CHECK(cartpole(42).current() == first);
  CHECK_FALSE(cartpole(43).current() == first);

  double lo = 1;
  double hi = -1;
  for (int i = 0; i < 1000; ++i) {
    const auto& s = env.reset();
    CHECK(env.steps() == 0);
    CHECK_FALSE(env.done());
    for (const double v : {s.x, s.x_dot, s.theta, s.theta_dot}) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  CHECK(lo >= -0.05);
  CHECK(lo < -0.049);
  CHECK(hi < 0.05);
  CHECK(hi > 0.049);
}

TEST_CASE("the same seed replays the same episode exactly", "[unit][demo]") {
  const auto a = trajectory(7);
  CHECK(a.size() > 20);
  CHECK(a == trajectory(7));
  CHECK_FALSE(a == trajectory(8));
}

TEST_CASE("uniform01 is the top 53 bits of one draw, scaled", "[unit][demo]") {
  // The standard fixes a default-seeded mt19937_64's first output at 14514284786278117030;
  // (that >> 11) * 2^-53 = 7087053118299861 * 2^-53, exactly representable.
  std::mt19937_64 gen;
  CHECK(uniform01(gen) == 7087053118299861.0 / 9007199254740992.0);
  CHECK(derive_seed(1, 0) != derive_seed(1, 1));
  CHECK(derive_seed(1, 0) != derive_seed(2, 0));
}

}  // namespace rlbus::demo
