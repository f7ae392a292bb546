// The task schedule: one pending check per task, stale checks skipped, checks in time order
// and only once due. Plain state with a made-up clock.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "broker/tasks/task_schedule.hpp"

using namespace std::chrono_literals;
using rlbus::broker::task_schedule;
using rlbus::util::time_point;

namespace {

struct schedule_fixture {
  task_schedule schedule;
  std::map<std::string, task_schedule::slot> tasks;  // the tasks alive, by id
  time_point t0 = rlbus::util::clock::now();

  /// The ids of the tasks whose checks come due by `now`, in order.
  std::vector<std::string> due(time_point now) {
    std::vector<std::string> out;
    const auto slot_of = [&](const std::string& id) -> task_schedule::slot* {
      const auto it = tasks.find(id);
      return it == tasks.end() ? nullptr : &it->second;
    };
    while (auto id = schedule.pop_due(now, slot_of)) out.push_back(*id);
    return out;
  }
};

using schedule_ids = std::vector<std::string>;

}  // namespace

TEST_CASE_METHOD(schedule_fixture, "checks come up in time order, each once, and only when due",
                 "[unit][tasks]") {
  schedule.exactly(tasks["b"], "b", t0 + 20ms);
  schedule.exactly(tasks["a"], "a", t0 + 10ms);
  schedule.exactly(tasks["c"], "c", t0 + 30ms);
  CHECK(schedule.next() == t0 + 10ms);
  CHECK(due(t0 + 9ms).empty());
  CHECK(due(t0 + 20ms) == schedule_ids{"a", "b"});
  CHECK_FALSE(tasks["a"].due);  // popped: none pending
  CHECK(tasks["c"].due == t0 + 30ms);
  CHECK(due(t0 + 20ms).empty());  // each once
  CHECK(due(t0 + 1s) == schedule_ids{"c"});
  CHECK_FALSE(schedule.next());
}

TEST_CASE_METHOD(schedule_fixture,
                 "a later deadline keeps the pending check; an earlier one replaces it",
                 "[unit][tasks]") {
  auto& s = tasks["t"];
  schedule.no_later_than(s, "t", t0 + 10ms);
  schedule.no_later_than(s, "t", t0 + 50ms);  // progress: no heap work, the check looks again
  CHECK(schedule.size() == 1);
  CHECK(s.due == t0 + 10ms);
  schedule.no_later_than(s, "t", t0 + 5ms);  // earlier: the check at 10 ms goes stale
  CHECK(s.due == t0 + 5ms);
  CHECK(due(t0 + 5ms) == schedule_ids{"t"});
  CHECK(due(t0 + 10ms).empty());  // the stale one is skipped
  CHECK(schedule.size() == 0);
}

TEST_CASE_METHOD(schedule_fixture, "a cleared check, or one of a task that is gone, never comes up",
                 "[unit][tasks]") {
  schedule.exactly(tasks["cleared"], "cleared", t0 + 10ms);
  schedule.exactly(tasks["gone"], "gone", t0 + 10ms);
  schedule.exactly(tasks["kept"], "kept", t0 + 10ms);
  task_schedule::clear(tasks["cleared"]);
  CHECK_FALSE(tasks["cleared"].due);
  tasks.erase("gone");
  CHECK(due(t0 + 1s) == schedule_ids{"kept"});
  // Armed again after a clear, it comes up at its new time only.
  schedule.exactly(tasks["cleared"], "cleared", t0 + 2s);
  CHECK(due(t0 + 1s).empty());
  CHECK(due(t0 + 2s) == schedule_ids{"cleared"});
}
