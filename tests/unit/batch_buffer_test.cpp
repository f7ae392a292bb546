// The coordinator's batch bookkeeping: results grouped by policy version, a batch handed
// over only when whole, re-run results counted once, and versions the learner left behind
// dropped.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "demo/batch_buffer.hpp"
#include "demo/collector.hpp"
#include "demo/learner.hpp"

// In the demo's own namespace, so its names win in a unity build where another test brings
// rlbus's into view (the SDK's rlbus::policy beside the demo's policy).
namespace rlbus::demo {

namespace {

// Every result of `version` for `directions` directions, with returns that tell them apart.
std::vector<episode_result> full_batch(std::uint64_t version, std::uint32_t directions) {
  std::vector<episode_result> out;
  for (std::uint32_t d = 0; d < directions; ++d)
    for (const std::int8_t sign : {std::int8_t{1}, std::int8_t{-1}})
      out.push_back({version, d, sign, 10.0 * d + (sign == 1 ? 1 : 2), 7});
  return out;
}

}  // namespace

TEST_CASE("a batch is handed over only once every result of its version is in", "[unit][demo]") {
  batch_buffer b(3);
  auto results = full_batch(0, 3);
  std::mt19937_64 gen(5);
  std::shuffle(results.begin(), results.end(), gen);
  for (std::size_t i = 0; i + 1 < results.size(); ++i) {
    CHECK(b.add(results[i]) == batch_buffer::add_status::added);
    CHECK_FALSE(b.batch(0));
  }
  CHECK(b.received(0) == 5);
  CHECK(b.add(results.back()) == batch_buffer::add_status::added);
  const auto batch = b.batch(0);
  REQUIRE(batch);
  CHECK(*batch == full_batch(0, 3));  // in direction order, + before -, whatever the arrival
  CHECK(b.batch(0) == batch);         // asked again (a lost reply): the same batch
}

TEST_CASE("results are grouped by version and never mixed", "[unit][demo]") {
  batch_buffer b(2);
  for (const auto& r : full_batch(1, 2)) CHECK(b.add(r) == batch_buffer::add_status::added);
  const auto v0 = full_batch(0, 2);
  for (std::size_t i = 0; i < 3; ++i) b.add(v0[i]);

  CHECK_FALSE(b.batch(0));  // version 0 lacks one result; version 1's do not count for it
  CHECK(b.received(0) == 3);
  CHECK(b.received(1) == 4);
  const auto v1 = b.batch(1);
  REQUIRE(v1);
  CHECK(*v1 == full_batch(1, 2));
}

TEST_CASE("a re-run task's results are counted once", "[unit][demo]") {
  batch_buffer b(2);
  const auto results = full_batch(4, 2);
  b.forget_before(4);
  b.add(results[0]);
  b.add(results[1]);
  // The task was re-queued after its first direction: the second attempt sends it again.
  CHECK(b.add(results[0]) == batch_buffer::add_status::duplicate);
  CHECK(b.add(results[1]) == batch_buffer::add_status::duplicate);
  CHECK_FALSE(b.batch(4));
  b.add(results[2]);
  b.add(results[3]);
  const auto batch = b.batch(4);
  REQUIRE(batch);
  CHECK(batch->size() == 4);
  CHECK(b.duplicates() == 2);
}

TEST_CASE("versions the learner has left behind are dropped", "[unit][demo]") {
  batch_buffer b(1);
  for (const auto& r : full_batch(0, 1)) b.add(r);
  b.add(full_batch(1, 1)[0]);
  REQUIRE(b.batch(0));

  // The learner asks for version 1: version 0 is forgotten, late results for it are stale.
  CHECK_FALSE(b.batch(1));
  CHECK(b.oldest_wanted() == 1);
  CHECK(b.received(0) == 0);
  CHECK(b.add(full_batch(0, 1)[0]) == batch_buffer::add_status::stale);
  CHECK(b.stale() == 1);
  CHECK_FALSE(b.batch(0));

  // Announcing a version forgets the older ones too, even before the learner asks.
  b.forget_before(3);
  CHECK(b.received(1) == 0);
  CHECK(b.add(full_batch(2, 1)[1]) == batch_buffer::add_status::stale);
  CHECK(b.oldest_wanted() == 3);
  b.forget_before(2);  // never backwards
  CHECK(b.oldest_wanted() == 3);
}

TEST_CASE("results far ahead or out of range are dropped", "[unit][demo]") {
  batch_buffer b(2, /*lookahead=*/2);
  CHECK(b.add(full_batch(2, 2)[0]) == batch_buffer::add_status::added);
  CHECK(b.add(full_batch(3, 2)[0]) == batch_buffer::add_status::too_far);
  auto bad = full_batch(0, 2)[0];
  bad.direction = 2;
  CHECK(b.add(bad) == batch_buffer::add_status::invalid);
  bad = full_batch(0, 2)[0];
  bad.sign = 0;
  CHECK(b.add(bad) == batch_buffer::add_status::invalid);
  CHECK(b.invalid() == 2);
  CHECK(b.stale() == 1);
}

TEST_CASE("a learner fed whole batches through the buffer trains as if in-process",
          "[unit][demo]") {
  learner_config cfg;
  cfg.seed = 3;
  cfg.directions = 6;
  cfg.top_directions = 2;
  learner direct(cfg);
  learner via_buffer(cfg);
  batch_buffer b(cfg.directions);
  for (int version = 0; version < 3; ++version) {
    // Collectors run slices in any order; one slice twice (a re-queued task).
    auto parts = split_work(via_buffer.work(), 3);
    std::reverse(parts.begin(), parts.end());
    parts.push_back(parts.front());
    for (const auto& part : parts)
      for (const auto& r : collect(part)) b.add(r);
    const auto batch = b.batch(via_buffer.version());
    REQUIRE(batch);
    for (const auto& r : *batch) via_buffer.submit(r);
    for (const auto& r : collect(direct.work())) direct.submit(r);
    CHECK(via_buffer.version() == direct.version());
    CHECK(via_buffer.params() == direct.params());
  }
}

}  // namespace rlbus::demo
