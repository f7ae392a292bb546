// rlbus::worker: a collector or learner process's connection to the broker.
//
// A worker connects, introduces itself (HELLO with its role, id and resources), heartbeats
// on its own, notices a silent broker (liveness x heartbeat without a word) and reconnects
// with capped exponential backoff, resuming its session when the broker still holds it.
//
// Threads: the constructor starts one background I/O thread that owns the ZeroMQ socket;
// no socket is ever touched by the caller's thread, and a second thread runs the task
// handlers. Every public member is safe to call from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "rlbus/connection.hpp"
#include "rlbus/defaults.hpp"
#include "rlbus/types.hpp"

namespace rlbus {

struct worker_options {
  /// The broker's ROUTER endpoint, or the brokers of a group separated by commas
  /// ("tcp://a:7235,tcp://b:7235"): the client goes to the leader, and follows a takeover.
  std::string endpoint{defaults::router_endpoint};
  /// collector or learner.
  rlbus::role role = rlbus::role::collector;
  /// Unique among live peers on the broker: 1-128 characters of A-Z a-z 0-9 . _ : @ / -.
  std::string id;
  /// What this worker offers (e.g. {"cpu", 4}, {"gpu", 1}); tasks will be matched on it.
  rlbus::resources resources;
  /// Heartbeat interval asked of the broker, which may clamp it (the agreed one is used).
  std::chrono::milliseconds heartbeat = defaults::heartbeat;
  /// Reconnect backoff: first delay, doubled per failed attempt up to the cap (+0-25% jitter).
  std::chrono::milliseconds reconnect_min = defaults::reconnect_min;
  std::chrono::milliseconds reconnect_max = defaults::reconnect_max;
  /// CURVE keys when the broker has CURVE on (SPEC §15; curve_keys_from_files reads them
  /// from the files rlbus-broker keygen writes); unset: plain.
  std::optional<rlbus::curve_keys> curve;
  /// Reliable data (SPEC §12.11): every DATA sent is kept until the broker confirms it
  /// relayed it, and sent again after a reconnect. At most this many DATA, and about this
  /// many bytes of them, are kept; past that the oldest are dropped, and any of those the
  /// broker turns out to lack are reported to the coordinator (on_data_lost) instead of
  /// missing in silence. DATA not sent yet wait in the outbox and are never dropped.
  std::size_t max_unconfirmed_data = 4096;
  std::size_t max_unconfirmed_bytes = std::size_t{16} << 20;
  /// Batched data (SPEC §12.12): DATA that wait together in the outbox (emit_data called
  /// faster than they leave) go as one DATA_BATCH of up to 1024 items and 64 KiB; one that
  /// waits alone goes at once, as a DATA. No timer holds anything back, so there is nothing
  /// to flush. The coordinator's callbacks see the same items either way. false: every DATA
  /// alone (for a broker older than batched data).
  bool batch_data = true;
  /// When set, SIGTERM makes the worker leave() with this deadline (the notice of a
  /// preempted machine or a cluster scheduler): the process installs a SIGTERM handler that
  /// only notes the signal, so the process goes on; wait for the task to end and stop().
  std::optional<std::chrono::milliseconds> leave_on_sigterm;
};

class worker;

/// What a task handler throws to fail its attempt with an account of why: `reason` (for
/// people) and, optionally, `result`, a msgpack map the coordinator receives byte for byte
/// with the attempt's end (on_task_requeued / on_task_failed, SPEC §12.3.18). Any other
/// exception fails the attempt too, with its message and no result.
class task_failure : public std::runtime_error {
 public:
  explicit task_failure(const std::string& reason,
                        std::optional<std::string> result_msgpack = std::nullopt)
      : std::runtime_error(reason), result_(std::move(result_msgpack)) {}
  [[nodiscard]] const std::optional<std::string>& result() const noexcept { return result_; }

 private:
  std::optional<std::string> result_;
};

/// One task as its handlers see it: what to run and how to report. Every member is
/// thread-safe, so a handler may hand the task to threads of its own. User data travels as
/// msgpack bytes (a std::string holding one msgpack map), exactly as the coordinator sent
/// it or will receive it.
class task_handle {
 public:
  [[nodiscard]] const std::string& id() const noexcept { return id_; }
  [[nodiscard]] std::uint32_t attempt() const noexcept { return attempt_; }
  /// The task_info map from the coordinator's SUBMIT (msgpack).
  [[nodiscard]] const std::string& info() const noexcept { return info_; }
  /// The latest version of the task's policy known to this attempt: the one its TASK_START
  /// carried (set when the SUBMIT named a policy_id and a learner had published a version of
  /// it), replaced by each newer one the broker pushes while the attempt starts or runs
  /// (POLICY_UPDATE, SPEC §13.4.6); nullopt when there is none. emit_data() tags every data
  /// item with this version.
  [[nodiscard]] std::optional<rlbus::policy> policy() const;
  /// True once the broker asked to close the task or aborted it: wind down and return.
  [[nodiscard]] bool stop_requested() const;
  /// True when the broker aborted the task (timeout, cancel, re-assignment): nothing more
  /// from this attempt will be accepted.
  [[nodiscard]] bool aborted() const;
  /// Tells the broker this attempt is still being worked on (TASK_ALIVE), for work that
  /// goes on longer than the step timeout without other progress to report: the broker
  /// pushes the attempt's start or step deadline a full timeout on. It never extends the
  /// task timeout. False when the task is over or closing (nothing was sent).
  bool keep_alive();

  // Collector side. Each returns false when the task is over (nothing was sent), and throws
  // std::invalid_argument, sending nothing, when the broker would refuse what it was given
  // (meta or info not one msgpack map within the limits of SPEC §5.1 and §12.2.3.1, or a
  // message past the broker's max-message); emit_learn_info likewise.
  /// When the broker applies data credit to this attempt (its coordinator acknowledges its
  /// stream), emit_data waits while the credit is used up, until the coordinator catches
  /// up: a slow coordinator slows its collectors down instead of losing their data.
  bool emit_data(std::string data_id, std::string buffer_id, std::string meta_msgpack,
                 std::optional<std::string> payload = std::nullopt);
  /// An info counts as a data item (SPEC §12.11.10): it waits for credit like emit_data and
  /// is sent again after a reconnect until the broker confirms it.
  bool emit_info(std::string info_msgpack);

  // Learner side.
  /// Asks the coordinator for a batch and waits for it (msgpack). While the coordinator has
  /// none it asks again after the wait each NO_DATA names (the coordinator's backoff: 10 ms
  /// doubling to 1 s with the reference coordinator), at most 2 s and never past `timeout`.
  /// nullopt when the task stops or `timeout` passes.
  std::optional<std::string> get_data(const std::string& buffer_id, std::uint32_t batch_size,
                                      std::uint64_t cur_learner_iter,
                                      std::chrono::milliseconds timeout);
  bool emit_learn_info(std::string buffer_id, std::string info_msgpack);
  /// Publishes version `version` of policy `policy_id` (inline params, or a reference with
  /// publish_policy_ref): tasks that start afterwards and name this policy get it. Versions
  /// must grow; the broker refuses an older or equal one (see worker::last_error()). False
  /// when the task is over.
  bool publish_policy(std::string policy_id, std::uint64_t version, std::string params);
  bool publish_policy_ref(std::string policy_id, std::uint64_t version, std::string ref);

 private:
  friend class worker;
  struct owner;
  [[nodiscard]] std::uint64_t max_message() const;  // the broker's (0: not known yet)
  task_handle(owner& o, std::string id, std::uint32_t attempt, std::string info,
              std::optional<rlbus::policy> p)
      : owner_(o),
        id_(std::move(id)),
        attempt_(attempt),
        info_(std::move(info)),
        policy_(std::move(p)) {}
  [[nodiscard]] bool live() const;
  owner& owner_;
  std::string id_;
  std::uint32_t attempt_;
  std::string info_;
  std::optional<rlbus::policy> policy_;
};

/// What a worker does with its tasks. Both run on the worker's handler thread (one task at
/// a time: the broker gives a worker one task at a time), never on the I/O thread, so long
/// work does not stop heartbeats; a handler that hangs is caught by the task's step timeout.
struct task_handlers {
  /// Runs the task: collect and emit data/info (collector), or get_data / learn /
  /// emit_learn_info (learner). Return when done or when stop_requested(). An exception
  /// fails the attempt (TASK_FAILED with its message; a task_failure adds its result).
  std::function<void(task_handle&)> run;
  /// After `run`, once the broker asks to close: the final result (a msgpack map). Unset:
  /// an empty map.
  std::function<std::string(task_handle&)> close;
  /// Optional: a newer version of the running task's policy arrived (POLICY_UPDATE); the
  /// task's policy() already returns it. Runs on the worker's I/O thread, so it must be
  /// quick and must not wait on the task (get_data, emit_data under no credit ...).
  std::function<void(const std::string& task_id, std::uint32_t attempt, const rlbus::policy& p)>
      on_policy;
};

class worker {
 public:
  /// Validates `opts` (throws std::invalid_argument naming the bad option) and starts
  /// connecting in the background. Never blocks on the network. Without handlers the
  /// worker only keeps its session (tasks assigned to it fail at once).
  explicit worker(worker_options opts, task_handlers handlers = {});
  /// Stops (see stop()).
  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
  worker(worker&&) noexcept;
  worker& operator=(worker&&) noexcept;

  [[nodiscard]] connection_state state() const;
  /// Blocks until state() == s or `timeout` passes; returns whether it got there.
  [[nodiscard]] bool wait_for(connection_state s, std::chrono::milliseconds timeout) const;
  /// The broker's session token, 0 before the first WELCOME.
  [[nodiscard]] std::uint64_t session() const;
  /// How many times the broker has welcomed this worker (1 + reconnects that succeeded).
  [[nodiscard]] std::uint64_t welcomes() const;
  /// How many times emit_data had to wait for data credit (its coordinator was behind).
  [[nodiscard]] std::uint64_t credit_waits() const;
  /// Sent DATA let go of before the broker confirmed them, because more than
  /// max_unconfirmed_data (or _bytes) were waiting for confirmation. Most had arrived; those
  /// the broker had not received are reported to the coordinator as lost.
  [[nodiscard]] std::uint64_t data_dropped() const;
  /// DATA sent again after a reconnect, or because the broker asked (it drops duplicates).
  [[nodiscard]] std::uint64_t data_resent() const;
  /// DATA_BATCH messages sent, and the DATA they carried (batch_data).
  [[nodiscard]] std::uint64_t data_batches() const;
  [[nodiscard]] std::uint64_t data_batched() const;
  /// The last error or refusal the broker sent, "" if none.
  [[nodiscard]] std::string last_error() const;
  [[nodiscard]] const worker_options& options() const;

  /// Tells the broker this worker will go away soon (LEAVING, SPEC §12.6.10): it gets no
  /// new task for the rest of its session, and the task it runs, if any, may go on for at
  /// most `deadline` more. Past that the broker aborts it (the handle's stop_requested() and
  /// aborted()) and gives it to another worker at once; its coordinator sees it re-queued,
  /// "worker <id> leaving". Said
  /// again after a reconnect; calling it again can only bring the deadline closer. False
  /// once stopped. Throws std::invalid_argument for a deadline outside 0..24 h.
  bool leave(std::chrono::milliseconds deadline = std::chrono::milliseconds{0});
  /// True once leave() was called.
  [[nodiscard]] bool leaving() const;

  /// Says DISCONNECT to the broker (when connected), closes the socket and joins the I/O
  /// thread. Idempotent; afterwards state() is stopped.
  void stop();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace rlbus
