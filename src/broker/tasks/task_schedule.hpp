// When each task's deadline is looked at (SPEC §12.7.1): at most one pending check per task,
// in a heap ordered by time. Progress that moves a deadline later leaves the check where it
// is (it looks again when due, as peer expiry does), so a busy task costs no heap work; a
// deadline moved earlier, or dropped, bumps the task's generation, and the check it leaves
// behind goes stale and is skipped when it comes up. Each task keeps its own slot (when its
// check is due, its generation); the schedule keeps the heap. No clock: the task manager
// says when.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "util/clock.hpp"

namespace rlbus::broker {

class task_schedule {
 public:
  /// What a task holds of the schedule.
  struct slot {
    std::optional<util::time_point> due;  // when its pending check comes up; none pending
    std::uint32_t generation = 0;         // bumped when a pending check is dropped
  };

  /// A check of task `id` by `due`: none is added when one at or before `due` is pending
  /// (that one looks again), and a later one is dropped for it.
  void no_later_than(slot& s, const std::string& id, util::time_point due);
  /// A check of task `id` at exactly `due`; a pending one is dropped.
  void exactly(slot& s, const std::string& id, util::time_point due);
  /// The task waits for no deadline: its pending check, if any, is dropped.
  static void clear(slot& s) noexcept;

  /// The id of a task whose check came due by `now` (each once, earliest first), its slot
  /// left with none pending; nullopt when none is due. `slot_of(id)` gives a task's slot, or
  /// nullptr for a task that is gone; stale checks are dropped on the way.
  std::optional<std::string> pop_due(util::time_point now,
                                     const std::function<slot*(const std::string&)>& slot_of);
  /// When the earliest check comes up (maybe a stale one: it only makes a loop wake early).
  [[nodiscard]] std::optional<util::time_point> next() const;
  [[nodiscard]] std::size_t size() const noexcept { return heap_.size(); }

 private:
  struct check {
    util::time_point due;
    std::string task_id;
    std::uint32_t generation;
    bool operator>(const check& o) const noexcept { return due > o.due; }
  };
  std::priority_queue<check, std::vector<check>, std::greater<>> heap_;
};

}  // namespace rlbus::broker
