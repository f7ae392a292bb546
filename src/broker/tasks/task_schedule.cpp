// See task_schedule.hpp.
#include "broker/tasks/task_schedule.hpp"

namespace rlbus::broker {

void task_schedule::no_later_than(slot& s, const std::string& id, util::time_point due) {
  if (s.due && *s.due <= due) return;  // the check due then looks again
  exactly(s, id, due);
}

void task_schedule::exactly(slot& s, const std::string& id, util::time_point due) {
  ++s.generation;
  s.due = due;
  heap_.push({due, id, s.generation});
}

void task_schedule::clear(slot& s) noexcept {
  ++s.generation;
  s.due.reset();
}

std::optional<std::string> task_schedule::pop_due(
    util::time_point now, const std::function<slot*(const std::string&)>& slot_of) {
  while (!heap_.empty() && heap_.top().due <= now) {
    auto c = heap_.top();
    heap_.pop();
    slot* s = slot_of(c.task_id);
    if (s == nullptr || s->generation != c.generation) continue;
    s->due.reset();
    return std::move(c.task_id);
  }
  return std::nullopt;
}

std::optional<util::time_point> task_schedule::next() const {
  if (heap_.empty()) return std::nullopt;
  return heap_.top().due;
}

}  // namespace rlbus::broker
