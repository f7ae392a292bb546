// The live tasks (SPEC §12.4): by id, the FIFO queue of those waiting for a worker (by the
// order of their first SUBMIT, which a re-queued task keeps), and how many each coordinator
// holds (its limit, max-tasks-per-coordinator, counts them). A task leaves the store when it
// finishes, fails or is cancelled. Single-threaded, like the task manager that owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

#include "broker/tasks/task.hpp"

namespace rlbus::broker {

class task_store {
  struct id_hash {  // lets a task be found by a view of its id
    using is_transparent = void;
    std::size_t operator()(std::string_view id) const noexcept {
      return std::hash<std::string_view>{}(id);
    }
  };

 public:
  using map = std::unordered_map<std::string, task, id_hash, std::equal_to<>>;
  using queue = std::map<std::uint64_t, std::string>;  // order -> task id

  /// A task just submitted: the next order is its, it waits at the back of the queue and
  /// counts for its owner. Its id must not be live.
  task& add(task&& t);
  /// A task read back from a journal, not queued yet: its order stays (later ones number on
  /// past it), and it counts for its owner.
  task& restore(task&& t);
  /// Back in the queue, in its first place: ahead of later submissions.
  void requeue(const task& t) { queue_.emplace(t.order, t.id); }
  /// Out of the queue (a worker took it) by its place in it: the next place.
  queue::iterator dequeue(queue::iterator at) { return queue_.erase(at); }
  /// The task leaves the store (and the queue, and its owner's count).
  void erase(std::string_view id);

  [[nodiscard]] task* find(std::string_view id);
  [[nodiscard]] const task* find(std::string_view id) const;
  [[nodiscard]] task& at(std::string_view id);
  [[nodiscard]] const task& at(std::string_view id) const;
  [[nodiscard]] bool contains(std::string_view id) const { return tasks_.find(id) != tasks_.end(); }
  /// Live tasks, queued or on a worker.
  [[nodiscard]] std::size_t size() const noexcept { return tasks_.size(); }
  [[nodiscard]] std::size_t queued() const noexcept { return queue_.size(); }
  /// The live tasks coordinator `id` holds.
  [[nodiscard]] std::size_t owned_by(const std::string& id) const;

  /// Every live task, by id, in no order.
  [[nodiscard]] map::iterator begin() noexcept { return tasks_.begin(); }
  [[nodiscard]] map::iterator end() noexcept { return tasks_.end(); }
  [[nodiscard]] map::const_iterator begin() const noexcept { return tasks_.begin(); }
  [[nodiscard]] map::const_iterator end() const noexcept { return tasks_.end(); }
  /// The queue, first waiting first.
  [[nodiscard]] queue& waiting() noexcept { return queue_; }
  [[nodiscard]] const queue& waiting() const noexcept { return queue_; }

 private:
  map tasks_;
  queue queue_;
  std::uint64_t next_order_ = 0;
  std::unordered_map<std::string, std::size_t> owned_;  // coordinator id -> its live tasks
};

}  // namespace rlbus::broker
