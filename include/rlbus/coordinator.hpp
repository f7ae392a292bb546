// rlbus::coordinator: the client a DI-engine-style coordinator uses to run tasks through
// the broker. It submits collector and learner tasks, receives the ordered stream of events
// about its own tasks, and answers them through callbacks named after the seed's
// callback_fn keys, so porting a coordinator is mechanical.
//
// The stream is lossless while the broker holds it: the SDK acknowledges what its callbacks
// have processed, so the broker keeps no more than its window in flight and holds the
// coordinator's collectors back when it falls behind; a jump in seq or a new connection
// makes it ask for a replay; duplicates are dropped; events the broker could not keep are
// reported (on_stream_lost), never skipped in silence (SPEC §12.9).
//
// A coordinator that vanishes without its DISCONNECT (a crash, a long partition) leaves its
// tasks running on the broker for the broker's coordinator grace; a new coordinator under
// the same id adopts them and its callbacks go on after the last event the old one
// acknowledged (SPEC §12.5.8). The destructor says DISCONNECT: the tasks end at once.
//
// Threads: one I/O thread owns the socket; one callback thread runs every callback, in
// stream order, one at a time. Public members are safe from any thread, but submit()
// must not be called from inside a callback (it waits for the broker's answer).
// User data (task_info, data, info, results) travels as msgpack bytes in std::string.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "rlbus/connection.hpp"
#include "rlbus/defaults.hpp"
#include "rlbus/types.hpp"

namespace rlbus {

struct coordinator_options {
  /// The broker's ROUTER endpoint, or the brokers of a group separated by commas
  /// ("tcp://a:7235,tcp://b:7235"): the client goes to the leader, and follows a takeover.
  std::string endpoint{defaults::router_endpoint};
  std::string id = "coordinator";
  std::chrono::milliseconds heartbeat = defaults::heartbeat;
  std::chrono::milliseconds reconnect_min = defaults::reconnect_min;
  std::chrono::milliseconds reconnect_max = defaults::reconnect_max;
  /// CURVE keys when the broker has CURVE on (SPEC §15); unset: plain.
  std::optional<rlbus::curve_keys> curve;
};

/// A task to submit. Unset timeouts and attempts take the broker's defaults.
struct task_spec {
  std::string task_id;
  rlbus::role kind = rlbus::role::collector;       // collector or learner
  std::string task_info = std::string("\x80", 1);  // msgpack map, {} by default
  rlbus::resources requirements;
  std::optional<std::uint32_t> start_timeout_ms, step_timeout_ms, close_timeout_ms, task_timeout_ms,
      max_attempts;
  /// Each attempt starts with the latest version of this policy the broker holds (SPEC §13).
  std::optional<std::string> policy_id;
  /// The task fails when no worker takes it within this many ms of being queued (each time
  /// it is queued); unset: the broker's --queue-timeout-ms (SPEC §12.7.6).
  std::optional<std::uint32_t> queue_timeout_ms;
};

/// The broker's answer to a submit.
struct submit_result {
  bool accepted = false;
  std::uint16_t code = 0;  // why not (411 duplicate id, 412 queue full ...), 0 when accepted
  std::string reason;
  std::uint64_t queued = 0;  // tasks ahead of it in the queue
};

/// The seed's callback_fn, one member per key, with the seed's defaults for the judges.
/// All run on the callback thread. Unset members are skipped (a data request with no
/// deal_with_learner_get_data is answered "none yet").
struct coordinator_callbacks {
  /// A collector produced data: `data` is {data_id, buffer_id, meta, payload?} (msgpack).
  std::function<void(const std::string& task_id, const std::string& buffer_id,
                     const std::string& data_id, const std::string& data)>
      deal_with_collector_send_data;
  /// Is the collector task finished, given this info? Default: info["collector_done"].
  std::function<bool(const std::string& task_id, const std::string& info)>
      deal_with_collector_judge_finish;
  std::function<void(const std::string& task_id, const std::string& result)>
      deal_with_collector_finish_task;
  /// A learner asks for a batch: msgpack data, or nullopt for "not enough data yet". After
  /// nullopt the learner is told to wait 10 ms, doubled for each further nullopt in a row
  /// for the same task up to 1 s; data given starts the count over (SPEC §12.5.9).
  std::function<std::optional<std::string>(const std::string& task_id, const std::string& buffer_id,
                                           std::uint32_t batch_size,
                                           std::uint64_t cur_learner_iter)>
      deal_with_learner_get_data;
  /// Is the learner task finished, given this learn info? Default: info["learner_done"].
  std::function<bool(const std::string& task_id, const std::string& info)>
      deal_with_learner_judge_finish;
  std::function<void(const std::string& task_id, const std::string& buffer_id,
                     const std::string& info)>
      deal_with_learner_send_info;
  std::function<void(const std::string& task_id, const std::string& result)>
      deal_with_learner_finish_task;
  /// Beyond the seed: an attempt ended and the task went back to the queue, or failed for
  /// good (the seed only printed these and waited forever). `result` is the msgpack map a
  /// failing worker sent with its TASK_FAILED (a handler's rlbus::task_failure), byte for
  /// byte; nullopt when it sent none, or when the attempt ended otherwise (a timeout, a
  /// lost worker).
  std::function<void(const std::string& task_id, std::uint32_t attempt, const std::string& reason,
                     const std::optional<std::string>& result)>
      on_task_requeued;
  std::function<void(const std::string& task_id, const std::string& reason,
                     const std::optional<std::string>& result)>
      on_task_failed;
  /// Beyond the seed: the task was cancelled, by cancel() or by the broker (a broker that
  /// shuts down cancels what it will not run, SPEC §11).
  std::function<void(const std::string& task_id, const std::string& reason)> on_task_cancelled;

  /// The seed's capacity callbacks: one call per collector that joined the broker or whose
  /// session ended (SPEC §12.10). They track the broker's count: when this coordinator
  /// (re)connects, it is told the current count and these are called for the difference, so
  /// +1 per increase and -1 per decrease always adds up to collectors().
  std::function<void()> deal_with_increase_collector;
  std::function<void()> deal_with_decrease_collector;
  /// Beyond the seed: every capacity report, for both kinds of worker. `change` is "increase"
  /// or "decrease" (naming `worker_id`) or "snapshot" (the count as this coordinator
  /// connects, no worker); `count` is the number of live workers of `kind` after it.
  std::function<void(rlbus::role kind, const std::string& change, const std::string& worker_id,
                     std::uint64_t count)>
      on_capacity;
  /// Events `first`..`last` of the stream are lost for good: the broker no longer held them
  /// when they were asked for again (the coordinator fell further behind than the broker's
  /// ring). Called in stream order, in their place; counted in stream_gaps().
  std::function<void(std::uint64_t first, std::uint64_t last)> on_stream_lost;
  /// DATA `first`..`last` (their indexes within attempt `attempt`) of a collector task are
  /// lost for good: its worker had to drop them before the broker got them (SPEC §12.11).
  /// Called in stream order, in their place; counted in data_lost().
  std::function<void(const std::string& task_id, std::uint32_t attempt, std::uint64_t first,
                     std::uint64_t last)>
      on_data_lost;
};

class coordinator {
 public:
  /// Validates `opts` (throws std::invalid_argument) and starts connecting.
  coordinator(coordinator_options opts, coordinator_callbacks callbacks);
  ~coordinator();
  coordinator(const coordinator&) = delete;
  coordinator& operator=(const coordinator&) = delete;

  [[nodiscard]] connection_state state() const;
  /// Blocks until state() == s or `timeout` passes; returns whether it got there.
  [[nodiscard]] bool wait_for(connection_state s, std::chrono::milliseconds timeout) const;
  /// The broker's session token, 0 before the first WELCOME.
  [[nodiscard]] std::uint64_t session() const;
  /// How many times the broker has welcomed this coordinator (1 + reconnects that succeeded).
  [[nodiscard]] std::uint64_t welcomes() const;
  /// The last error or refusal the broker sent (or why a connection was given up), "" if none.
  [[nodiscard]] std::string last_error() const;

  /// Submits a task and waits for the broker's answer. nullopt when no answer came within
  /// `timeout` (not connected, or the broker is gone).
  std::optional<submit_result> submit(const task_spec& task,
                                      std::chrono::milliseconds timeout = std::chrono::seconds(5));
  /// Drops a task wherever it is (queued or running).
  void cancel(const std::string& task_id, const std::string& reason);
  /// Closes a running task now, as a judge returning true does: its worker is asked for its
  /// result, which reaches deal_with_*_finish_task. A judge's own FINISH goes once per attempt.
  /// A task still queued or starting (its worker's STARTED not yet at the broker, which only
  /// closes a running task) is closed as soon as this coordinator's stream says it runs.
  void finish(const std::string& task_id);

  /// Tasks submitted and not yet finished, failed or cancelled.
  [[nodiscard]] std::size_t open_tasks() const;
  /// Events of this coordinator's stream that never arrived: those the broker reported lost
  /// (on_stream_lost). A jump in seq that a replay filled is not a gap. 0 when none.
  [[nodiscard]] std::uint64_t stream_gaps() const;
  /// DATA that collectors reported lost (on_data_lost), summed over all tasks. 0 when none.
  [[nodiscard]] std::uint64_t data_lost() const;
  /// Live collectors and learners on the broker, as of the last capacity callback (0 before
  /// the first report arrives).
  [[nodiscard]] std::uint64_t collectors() const;
  [[nodiscard]] std::uint64_t learners() const;
  /// REPLAYs asked of the broker: one per connection, and one per jump in seq.
  [[nodiscard]] std::uint64_t stream_replays() const;
  /// Events that arrived twice (a replay resends what may have arrived) and were dropped.
  [[nodiscard]] std::uint64_t stream_duplicates() const;

  /// Says DISCONNECT, stops both threads. Idempotent. The broker then cancels open tasks.
  void stop();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace rlbus
