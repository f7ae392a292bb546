// The task store: the queue keeps the order of first submission across re-queues, a task
// taken from the queue is skipped, each coordinator's live tasks are counted, and a task
// restored from a journal keeps its order while later ones number on past it.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "broker/tasks/task_store.hpp"

using rlbus::broker::task;
using rlbus::broker::task_store;

namespace {

task store_task(const std::string& id, const std::string& owner = "coord") {
  task t;
  t.id = id;
  t.owner = owner;
  return t;
}

std::vector<std::string> queued_ids(const task_store& s) {
  std::vector<std::string> out;
  for (const auto& [order, id] : s.waiting()) out.push_back(id);
  return out;
}

using store_ids = std::vector<std::string>;

}  // namespace

TEST_CASE("the queue keeps the order of first submission, re-queues included", "[unit][tasks]") {
  task_store s;
  s.add(store_task("a"));
  s.add(store_task("b"));
  s.add(store_task("c"));
  CHECK(queued_ids(s) == store_ids{"a", "b", "c"});
  // A worker takes a, then b; a comes back (its attempt ended) ahead of c.
  auto q = s.waiting().begin();
  q = s.dequeue(q);
  CHECK(q->second == "b");
  s.dequeue(q);
  CHECK(queued_ids(s) == store_ids{"c"});
  s.requeue(s.at("a"));
  CHECK(queued_ids(s) == store_ids{"a", "c"});
  CHECK(s.queued() == 2);
  CHECK(s.size() == 3);
}

TEST_CASE("each coordinator's live tasks are counted until they leave", "[unit][tasks]") {
  task_store s;
  s.add(store_task("a", "c1"));
  s.add(store_task("b", "c1"));
  s.add(store_task("x", "c2"));
  CHECK(s.owned_by("c1") == 2);
  CHECK(s.owned_by("c2") == 1);
  CHECK(s.owned_by("nobody") == 0);
  s.erase("a");
  CHECK(s.owned_by("c1") == 1);
  CHECK_FALSE(s.contains("a"));
  CHECK(s.find("a") == nullptr);
  CHECK(queued_ids(s) == store_ids{"b", "x"});  // out of the queue too
  s.erase("a");                                 // gone already: nothing happens
  CHECK(s.size() == 2);
  CHECK_THROWS_AS(s.at("a"), std::out_of_range);
}

TEST_CASE("restored tasks keep their order and later ones number on past it", "[unit][tasks]") {
  task_store s;
  auto t = store_task("old");
  t.order = 41;
  auto& held = s.restore(std::move(t));
  CHECK(s.queued() == 0);  // the caller queues it when it should wait
  CHECK(s.owned_by("coord") == 1);
  s.requeue(held);
  auto& fresh = s.add(store_task("new"));
  CHECK(fresh.order == 42);
  CHECK(queued_ids(s) == store_ids{"old", "new"});
}
