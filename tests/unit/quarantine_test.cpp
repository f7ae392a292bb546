// Quarantine bookkeeping (SPEC §12.6.9) on a fake clock: the count in a row, the doubling
// back-off and its cap, what a RESULT clears, and the bound on the ids remembered.
#include <catch2/catch.hpp>

#include <string>

#include "broker/tasks/quarantine.hpp"

using namespace rlbus;
using namespace std::chrono_literals;

TEST_CASE("quarantine: after N bad ends in a row, for a period that doubles up to 8x",
          "[unit][tasks]") {
  broker::quarantine q(3, 100ms, 16);
  const util::time_point t0{};
  CHECK_FALSE(q.failed("w", t0));
  CHECK_FALSE(q.failed("w", t0));
  const auto first = q.failed("w", t0);
  REQUIRE(first);
  CHECK(first->length == 100ms);
  CHECK(first->failures == 3);
  CHECK(q.held("w"));
  CHECK_FALSE(q.held("other"));
  CHECK(q.next_release() == t0 + 100ms);
  CHECK(q.active() == 1);
  CHECK(q.released(t0 + 99ms).empty());
  CHECK(q.released(t0 + 100ms) == std::vector<std::string>{"w"});
  CHECK_FALSE(q.held("w"));
  CHECK_FALSE(q.next_release());
  // each further quarantine in a row without a RESULT between: 200, 400, 800, then 800
  for (const auto expect : {200ms, 400ms, 800ms, 800ms}) {
    q.failed("w", t0);
    q.failed("w", t0);
    const auto again = q.failed("w", t0);
    REQUIRE(again);
    CHECK(again->length == expect);
    q.released(t0 + 1h);
  }
  CHECK(q.total() == 5);
  // a RESULT clears the count and the back-off
  q.succeeded("w");
  q.failed("w", t0);
  q.failed("w", t0);
  q.succeeded("w");
  CHECK_FALSE(q.failed("w", t0));
  CHECK_FALSE(q.failed("w", t0));
  CHECK(q.failed("w", t0)->length == 100ms);
}

TEST_CASE("quarantine: off at 0; a RESULT ends a quarantine; the table stays bounded",
          "[unit][tasks]") {
  const util::time_point t0{};
  broker::quarantine off(0, 100ms, 16);
  for (int i = 0; i < 10; ++i) CHECK_FALSE(off.failed("w", t0));
  broker::quarantine q(1, 100ms, 4);
  REQUIRE(q.failed("a", t0));
  q.succeeded("a");  // e.g. a RESULT of an attempt it held before its quarantine began
  CHECK_FALSE(q.held("a"));
  CHECK(q.active() == 0);
  // 10 ids through a table of 4: at most 4 remembered, the quarantines on first
  for (int i = 0; i < 10; ++i) q.failed("w" + std::to_string(i), t0 + std::chrono::milliseconds(i));
  CHECK(q.active() <= 4);
  CHECK(q.held("w9"));        // the newest is always kept
  CHECK_FALSE(q.held("w0"));  // the one ending first made room
}
