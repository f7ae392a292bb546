// The worker pool (SPEC §12.6): which worker a task goes to (the first free one of its kind
// that fits, another than the last attempt's when one fits) and when a worker is free (no
// task, not leaving, not drained, not in quarantine), whatever order those come and go in.
#include <catch2/catch.hpp>

#include <string>

#include "broker/tasks/worker_pool.hpp"

using namespace rlbus;
using namespace std::chrono_literals;

namespace {
broker::worker_pool pool() {
  return broker::worker_pool(2, 100ms, 16);
}
}  // namespace

TEST_CASE("worker pool: a task goes to the first free worker of its kind that fits",
          "[unit][tasks]") {
  auto p = pool();
  p.join("small", role::collector, {{"gpu", 0}}, 1);
  p.join("big", role::collector, {{"gpu", 2}}, 2);
  p.join("learner", role::learner, {{"gpu", 8}}, 3);
  CHECK(p.assign(role::collector, {{"gpu", 1}}, "", "t1") == "big");
  CHECK(p.find("big")->task == "t1");
  CHECK_FALSE(p.assign(role::collector, {{"gpu", 1}}, "", "t2"));  // only "small" is free
  CHECK(p.assign(role::collector, {}, "", "t2") == "small");
  CHECK_FALSE(p.assign(role::collector, {}, "", "t3"));
  CHECK(p.any_free());  // the learner
  p.release("big");
  CHECK(p.assign(role::collector, {}, "", "t3") == "big");
}

TEST_CASE("worker pool: a task avoids the worker its last attempt ended on unless none other fits",
          "[unit][tasks]") {
  auto p = pool();
  p.join("a", role::collector, {}, 1);
  p.join("b", role::collector, {}, 2);
  CHECK(p.assign(role::collector, {}, "a", "t") == "b");
  CHECK(p.assign(role::collector, {}, "a", "u") == "a");  // nobody else is free
}

TEST_CASE("worker pool: leaving, drained and quarantined workers get no task", "[unit][tasks]") {
  auto p = pool();
  const util::time_point t0{};
  p.join("w", role::collector, {}, 1);
  p.set_leaving("w");
  CHECK_FALSE(p.any_free());
  p.join("d", role::collector, {}, 2);
  REQUIRE(p.set_drained("d", true));
  CHECK_FALSE(p.any_free());
  p.release("d");  // its task ends: still drained
  CHECK_FALSE(p.any_free());
  REQUIRE(p.set_drained("d", false));
  CHECK(p.any_free());
  CHECK_FALSE(p.set_drained("nobody", true));

  // Two bad endings in a row quarantine "d"; it is free again when the quarantine ends, and
  // a restarted process under its id waits the quarantine out too.
  REQUIRE(p.assign(role::collector, {}, "", "t") == "d");
  p.release("d");
  CHECK_FALSE(p.failed("d", t0));
  CHECK(p.failed("d", t0));
  CHECK_FALSE(p.any_free());
  CHECK(p.quarantined("d"));
  REQUIRE(p.leave("d"));
  p.join("d", role::collector, {}, 3);
  CHECK_FALSE(p.any_free());
  CHECK_FALSE(p.end_quarantines(t0 + 99ms));
  CHECK(p.end_quarantines(t0 + 100ms));
  CHECK(p.assign(role::collector, {}, "", "t2") == "d");
  // A worker that ends its quarantine while it holds a task is not free by it.
  p.join("e", role::learner, {}, 4);
  REQUIRE(p.assign(role::learner, {}, "", "t3") == "e");
  CHECK_FALSE(p.failed("e", t0));
  CHECK(p.failed("e", t0));
  CHECK_FALSE(p.end_quarantines(t0 + 1s));
  CHECK_FALSE(p.leave("nobody"));
}
