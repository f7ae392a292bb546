// Random search split into learner and collectors, in one process: perturbations rebuilt
// from their seeds, work items that can be cut and re-run, results taken in any order and
// faulty ones dropped, and a fixed-seed run that reaches the CartPole-v1 threshold.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "demo/collector.hpp"
#include "demo/learner.hpp"
#include "demo/policy.hpp"
#include "demo/rng.hpp"

// In the demo's own namespace, so its names win in a unity build where another test brings
// rlbus's into view (the SDK's rlbus::policy beside the demo's policy).
namespace rlbus::demo {

namespace {

learner_config small_config() {
  learner_config cfg;
  cfg.seed = 11;
  cfg.directions = 4;
  cfg.top_directions = 2;
  return cfg;
}

void submit_all(learner& l, const std::vector<episode_result>& results) {
  for (const auto& r : results) l.submit(r);
}

}  // namespace

TEST_CASE("a perturbation is rebuilt from its seed and direction alone", "[unit][demo]") {
  const auto a = noise_direction(5, 3, 1000);
  CHECK(a == noise_direction(5, 3, 1000));
  CHECK(a != noise_direction(5, 4, 1000));
  CHECK(a != noise_direction(6, 3, 1000));

  // Unit variance per coordinate, centred: what sigma's meaning relies on.
  double sum = 0;
  double squares = 0;
  for (const float v : a) {
    sum += v;
    squares += static_cast<double>(v) * v;
  }
  CHECK(std::abs(sum / 1000) < 0.1);
  CHECK(squares / 1000 == Approx(1.0).epsilon(0.15));

  const std::vector<float> mean{1.0F, 2.0F, 3.0F, 4.0F, 5.0F};
  const auto noise = noise_direction(9, 1, mean.size());
  const auto plus = perturbed_policy(mean, {9, 1, 1, 0.5F}).params();
  const auto minus = perturbed_policy(mean, {9, 1, -1, 0.5F}).params();
  CHECK(perturbed_policy(mean, {9, 1, 0, 0.5F}).params() == mean);
  for (std::size_t i = 0; i < mean.size(); ++i) {
    CHECK(plus[i] == Approx(mean[i] + 0.5F * noise[i]));
    CHECK(minus[i] == Approx(mean[i] - 0.5F * noise[i]));
  }
}

TEST_CASE("a collector's results depend only on the work item", "[unit][demo]") {
  learner l(small_config());
  const work_item& item = l.work();
  CHECK(item.policy_version == 0);
  CHECK(item.direction_count == 4);
  CHECK(item.params == l.params());

  const auto results = collect(item);
  REQUIRE(results.size() == 8);
  CHECK(results == collect(item));
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    CHECK(r.policy_version == 0);
    CHECK(r.direction == i / 2);
    CHECK(r.sign == (i % 2 == 0 ? 1 : -1));
    CHECK(r.episode_return == static_cast<double>(r.steps));
    const auto again = run_episode(
        perturbed_policy(item.params, {item.noise_seed, r.direction, r.sign, item.sigma}),
        episode_seed(item.env_seed, r.direction), item.max_steps);
    CHECK(again.episode_return == r.episode_return);
  }
}

TEST_CASE("a work item cut for several collectors gives the same results", "[unit][demo]") {
  learner_config cfg = small_config();
  cfg.directions = 7;
  learner l(cfg);
  const auto whole = collect(l.work());

  for (const std::uint32_t parts : {1U, 2U, 3U, 7U, 50U}) {
    INFO(parts << " parts");
    const auto cut = split_work(l.work(), parts);
    CHECK(cut.size() == std::min(parts, 7U));
    std::vector<episode_result> joined;
    std::uint32_t next = 0;
    for (const auto& part : cut) {
      CHECK(part.first_direction == next);
      CHECK(part.direction_count >= 7 / cut.size());
      CHECK(part.direction_count <= 7 / cut.size() + 1);
      next += part.direction_count;
      const auto results = collect(part);
      joined.insert(joined.end(), results.begin(), results.end());
    }
    CHECK(next == 7);
    CHECK(joined == whole);
  }
}

TEST_CASE("the learner updates once a batch is complete, in any order", "[unit][demo]") {
  learner in_order(small_config());
  learner shuffled(small_config());
  const work_item first = in_order.work();
  auto results = collect(first);

  for (std::size_t i = 0; i + 1 < results.size(); ++i) {
    CHECK(in_order.submit(results[i]) == submit_status::accepted);
    CHECK(in_order.missing() == results.size() - i - 1);
  }
  CHECK(in_order.version() == 0);
  CHECK_FALSE(in_order.last_update());
  CHECK(in_order.submit(results.back()) == submit_status::updated);
  CHECK(in_order.version() == 1);
  CHECK(in_order.work().policy_version == 1);
  CHECK(in_order.work().params == in_order.params());
  CHECK(in_order.work().noise_seed != first.noise_seed);  // fresh directions every version
  CHECK(in_order.work().env_seed != first.env_seed);
  REQUIRE(in_order.last_update());
  CHECK(in_order.last_update()->policy_version == 0);
  CHECK(in_order.last_update()->moved);
  CHECK(in_order.params() != std::vector<float>(policy::parameter_count, 0.0F));

  std::mt19937_64 gen(3);
  std::shuffle(results.begin(), results.end(), gen);
  submit_all(shuffled, results);
  CHECK(shuffled.version() == 1);
  CHECK(shuffled.params() == in_order.params());
}

TEST_CASE("late, repeated and malformed results are dropped without effect", "[unit][demo]") {
  learner l(small_config());
  const auto first = collect(l.work());
  submit_all(l, first);
  REQUIRE(l.version() == 1);
  const auto params = l.params();

  CHECK(l.submit(first.front()) == submit_status::stale);  // version 0 is over
  auto future = first.front();
  future.policy_version = 7;
  CHECK(l.submit(future) == submit_status::stale);

  const auto second = collect(l.work());
  CHECK(l.submit(second[0]) == submit_status::accepted);
  CHECK(l.submit(second[0]) == submit_status::duplicate);  // a re-issued part ran it again

  auto bad = second[1];
  bad.direction = 4;
  CHECK(l.submit(bad) == submit_status::invalid);
  bad = second[1];
  bad.sign = 0;
  CHECK(l.submit(bad) == submit_status::invalid);
  bad = second[1];
  bad.episode_return = std::numeric_limits<double>::quiet_NaN();
  CHECK(l.submit(bad) == submit_status::invalid);
  bad.episode_return = 1e300;  // no cart-pole episode pays more than its cap
  CHECK(l.submit(bad) == submit_status::invalid);
  bad = second[1];
  bad.steps = cartpole::max_episode_steps + 1;
  CHECK(l.submit(bad) == submit_status::invalid);

  CHECK(l.missing() == 7);
  CHECK(l.params() == params);
  CHECK(l.total_episodes() == 9);
}

TEST_CASE("bad learner settings are refused with the setting's name", "[unit][demo]") {
  learner_config cfg;
  cfg.directions = 0;
  CHECK_THROWS_WITH(learner(cfg), Catch::Contains("directions"));
  cfg = {};
  cfg.top_directions = cfg.directions + 1;
  CHECK_THROWS_WITH(learner(cfg), Catch::Contains("top directions"));
  cfg = {};
  cfg.sigma = 0;
  CHECK_THROWS_WITH(learner(cfg), Catch::Contains("sigma"));
  cfg = {};
  cfg.step_size = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(learner(cfg), Catch::Contains("step size"));
  cfg = {};
  cfg.initial_params = {1.0F};
  CHECK_THROWS_AS(learner(cfg), std::invalid_argument);
}

TEST_CASE("a fixed-seed run solves CartPole-v1 within a bounded number of updates",
          "[unit][demo]") {
  // With the default settings this seed solves after 5 updates; over 2000 seeds the worst
  // took 13. The bound leaves room for harmless changes without hiding a broken learner
  // (the zero policy scores ~9, and a learner that does not learn stays far below 475).
  constexpr std::uint32_t max_updates = 30;
  learner_config cfg;
  cfg.seed = 1;
  learner l(cfg);

  evaluation e;
  std::uint32_t updates = 0;
  for (;; ++updates) {
    // Fresh evaluation episodes each time: the learner never sees them, so a pass is not luck
    // with one fixed set of start states.
    e = evaluate(policy(l.params()), derive_seed(0xE7A1, l.version()));
    if (solved(e) || updates == max_updates) break;
    for (const auto& part : split_work(l.work(), 3)) submit_all(l, collect(part));
    REQUIRE(l.version() == updates + 1);
  }
  INFO("updates " << updates << ", mean return " << e.mean_return << ", episodes "
                  << l.total_episodes() << ", steps " << l.total_steps());
  CHECK(e.episodes == cartpole::solved_episodes);
  CHECK(e.mean_return >= cartpole::solved_mean_return);
  CHECK(updates < max_updates);

  // The solved policy also holds up on start states no check has used.
  CHECK(evaluate(policy(l.params()), 424242).mean_return >= cartpole::solved_mean_return);
}

}  // namespace rlbus::demo
