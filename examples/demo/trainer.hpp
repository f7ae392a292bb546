// The demo's coordinator: runs one training through the broker. It submits the learner
// task, then for every policy version the learner announces, collector tasks that cover
// that version's perturbation directions; it buffers their results and hands the learner
// whole batches; it reports progress once per learner iteration and stops when the learner
// says the policy is solved or a limit is reached.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "demo/console.hpp"
#include "rlbus/coordinator.hpp"

namespace rlbus::demo {

struct trainer_options {
  std::string endpoint{defaults::router_endpoint};
  std::uint64_t seed = 1;
  std::uint32_t directions = 32;
  std::uint32_t top_directions = 8;
  float sigma = 0.1F;
  float step_size = 0.03F;
  std::uint32_t directions_per_task = 4;
  std::uint32_t episode_cost_ms = 20;
  std::uint64_t max_iterations = 200;
  std::chrono::seconds time_limit{120};
  std::chrono::milliseconds heartbeat{250};
  /// When the run began (progress times count from it).
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

enum class training_state { running, solved, out_of_iterations, out_of_time, failed };

/// The collector to kill to see a task re-queued: it holds a task of the current version
/// that it has started reporting on and not finished.
struct busy_collector {
  std::string collector;
  std::string task_id;
};

/// Running totals the launcher compares across a chaos event.
struct trainer_counts {
  std::uint64_t events = 0;    // task events heard from the broker
  std::uint64_t requeued = 0;  // tasks the broker re-queued (their worker or broker was lost)
};

/// Single-owner: one thread calls start/poll/stop; the coordinator's callback thread feeds
/// it through its own lock.
class trainer {
 public:
  /// Validates the options (throws std::invalid_argument naming the bad one) and connects.
  trainer(trainer_options opts, console& out);
  ~trainer();
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// Waits for the broker's welcome and submits the learner task; throws
  /// std::runtime_error if either does not happen within `timeout`.
  void start(std::chrono::milliseconds timeout);

  /// Submits the collector tasks a new policy version needs, checks the limits, and waits
  /// up to `wait` for news from the broker (returns at once when there is some).
  training_state poll(std::chrono::milliseconds wait);

  /// The latest iteration the learner reported (0 before its first report).
  [[nodiscard]] std::uint64_t iteration() const;
  [[nodiscard]] std::optional<busy_collector> find_busy_collector() const;
  [[nodiscard]] trainer_counts counts() const;

  /// Disconnects; the broker cancels whatever is still open.
  void stop();

  /// The closing block: result, iterations, time, episodes, tasks, data, events.
  void print_summary(training_state s) const;

 private:
  struct state;
  trainer_options opts_;
  console& out_;
  std::unique_ptr<state> st_;
  std::unique_ptr<rlbus::coordinator> coord_;
};

}  // namespace rlbus::demo
