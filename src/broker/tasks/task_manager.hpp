// The broker's task manager (SPEC §12): tasks submitted by coordinators wait in a FIFO
// queue, are assigned to free workers whose resources fit, and move through
//   queued -> starting -> running -> closing -> (finished)
// with a deadline on every step. A timeout, a failed handler or a lost worker ends the
// attempt: the task is re-queued with the next attempt number or, past max attempts,
// failed. Every worker message carries the attempt it belongs to, so one from an attempt
// that has ended is refused (STALE_ATTEMPT) and counted: a worker declared dead that comes
// back cannot touch the task's new attempt.
//
// Each coordinator gets an ordered stream of TASK_EVENTs about its own tasks, numbered
// by seq and kept in a bounded ring; lifecycle events are also published on the PUB. A
// coordinator may ask for its stream again from any seq the ring still holds (REPLAY), and
// once it acknowledges what it has processed (ACK) the broker keeps at most a window of
// events in flight to it and hands its collectors data credit out of that window, so a slow
// coordinator slows its collectors down instead of losing their data (SPEC §12.9).
//
// Single-threaded: the broker loop owns it. It talks to the world only through task_sink,
// so tests can drive it with a fake clock and a fake sink.
//
// Its parts with state of their own are objects it owns: the workers (worker_pool: who is
// free, which worker a task goes to, quarantine), the coordinators' streams (stream_set: the
// rings, the memory they share, what each window lets out; one stream is a
// coordinator_stream), each attempt's data credit and index (attempt_data), the policies
// (policy_store), the tasks themselves with their queue (task_store, each a task) and when each
// task's deadline is looked at (task_schedule). What is left here is what ties them together:
// how a task moves from step to step.
// Its member functions live by concern: task_manager.cpp (lifecycle, assignment, timers),
// task_stream.cpp (events, the stream's window and data credit, reliable data; the credit
// and index state of an attempt is an attempt_data), task_journal.cpp (durability) and
// task_ops.cpp (its counts, and what an operator sees and steers).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "broker/core/config.hpp"
#include "broker/core/refusal.hpp"
#include "broker/durability/journal.hpp"
#include "broker/ops/histogram.hpp"
#include "broker/tasks/attempt_data.hpp"
#include "broker/tasks/policy_store.hpp"
#include "broker/tasks/stream.hpp"
#include "broker/tasks/stream_set.hpp"
#include "broker/tasks/task.hpp"
#include "broker/tasks/task_schedule.hpp"
#include "broker/tasks/task_sink.hpp"
#include "broker/tasks/task_store.hpp"
#include "broker/tasks/worker_pool.hpp"
#include "codec/codec.hpp"
#include "codec/map_writer.hpp"
#include "codec/messages.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

class task_manager {
 public:
  task_manager(const config& cfg, task_sink& sink);

  /// A worker session began (or a coordinator's: ignored).
  void peer_joined(const std::string& id, rlbus::role role, const rlbus::resources& res,
                   std::uint64_t serial, util::time_point now);
  /// A worker re-announced its resources (a repeated or resuming HELLO).
  void peer_resources(const std::string& id, const rlbus::resources& res, util::time_point now);
  /// A session went on on a new connection (after its WELCOME): a collector is told how far
  /// its running task's indexed DATA got (DATA_ACK, §12.11); a coordinator's windowed stream
  /// waits for its REPLAY or ACK (§12.9.7).
  void peer_resumed(const std::string& id);
  /// A session ended: a worker's task is re-queued or failed. A coordinator's tasks are
  /// cancelled and its stream dropped when it said DISCONNECT (`orderly`); otherwise they are
  /// orphaned for the coordinator grace, to be adopted by a new session of its id (§12.5.8).
  void peer_gone(const std::string& id, rlbus::role role, util::time_point now,
                 bool orderly = true);
  /// A new coordinator session of `id` takes over what an earlier one left orphaned: the seq
  /// its stream was acknowledged up to, or nullopt when nothing awaited it (a new stream).
  std::optional<std::uint64_t> adopt(const std::string& id);
  /// Whether tasks of coordinator `id` wait for a new session to adopt them.
  [[nodiscard]] bool orphaned(const std::string& id) const { return orphans_.count(id) != 0; }

  /// Handles a task message from peer `from`; nullopt when accepted.
  std::optional<refusal> handle(const std::string& from, rlbus::role role, codec::message&& m,
                                util::time_point now);
  /// Handles a DATA read in place (what handle() does with a decoded one).
  std::optional<refusal> on_data(const std::string& from, rlbus::role role,
                                 const codec::data_view& d, util::time_point now);

  /// The broker is draining (SPEC §11.2): from now on SUBMIT is refused with BUSY, nothing
  /// is assigned, and every queued task, now or when an attempt ends later, is cancelled with
  /// `reason`. Running tasks go on. Idempotent.
  void close_queue(const std::string& reason);
  /// The drain is over (SPEC §11.3): every live task is aborted (TASK_ABORT to its holder)
  /// and cancelled with `reason`. Returns how many there were.
  std::size_t abort_all(const std::string& reason);
  /// Tasks not yet finished, failed or cancelled (queued or on a worker).
  [[nodiscard]] std::size_t live() const noexcept { return tasks_.size(); }

  /// Ends attempts whose step deadline has passed.
  void on_timers(util::time_point now);
  /// Sends what each windowed stream holds unsent within its window, and DATA_CREDIT that
  /// did not reach its worker: a send refused for a full connection or the broker's memory
  /// budget leaves a coordinator nothing to acknowledge, and a collector nothing to wait for
  /// (call it now and then).
  void pump_streams();
  [[nodiscard]] std::optional<util::time_point> next_deadline() const;

  [[nodiscard]] task_counts counts() const;
  /// Bytes the event rings of all streams hold now (at most half the memory budget).
  [[nodiscard]] std::size_t ring_bytes() const noexcept { return streams_.ring_bytes(); }

  // ---- what an operator sees and steers (SPEC §16) ----
  struct task_view {
    std::string id;
    rlbus::role kind = rlbus::role::collector;
    std::string_view state;  // queued, starting, running or closing
    std::uint32_t attempt = 0;
    std::string worker, coordinator;
    util::time_point submitted{};
    util::time_point started{};     // its current attempt's start (not queued)
    rlbus::resources requirements;  // what a worker must have to take it
  };
  /// An attempt that ended: finished, failed, requeued or cancelled, and why.
  struct ended_view {
    std::string id;
    rlbus::role kind = rlbus::role::collector;
    std::string how;  // the event that ended it
    std::uint32_t attempt = 0;
    std::string worker, coordinator, reason;
    util::time_point at{};
  };
  /// The last attempts that ended (at most 64), oldest first.
  [[nodiscard]] const std::deque<ended_view>& recently_ended() const noexcept { return ended_; }
  /// Live tasks matching every filter given (empty: any), queued ones first in queue order,
  /// then the others by submission; at most `limit` after the first `offset`, and how many
  /// matched in all.
  [[nodiscard]] std::pair<std::vector<task_view>, std::size_t> list_tasks(
      std::string_view state, std::optional<rlbus::role> kind, std::string_view coordinator,
      std::size_t limit, std::uint64_t offset = 0) const;
  struct worker_view {
    std::string task;  // "" when free
    std::uint32_t attempt = 0;
    bool quarantined = false, leaving = false, drained = false;
  };
  /// What the task manager knows of a worker session; nullopt when it holds none.
  [[nodiscard]] std::optional<worker_view> worker_state(const std::string& id) const;
  struct stream_view {
    std::string coordinator;
    std::uint64_t seq = 0, acked = 0;
    bool windowed = false;
    std::size_t held = 0;
  };
  [[nodiscard]] std::vector<stream_view> list_streams() const;
  /// Queued tasks by what they require ("gpu=1,mem=16", "" for nothing), and the latest
  /// version of each policy held: what the metrics show per resource shape and policy.
  [[nodiscard]] std::vector<std::pair<std::string, std::uint64_t>> queued_by_shape() const;
  [[nodiscard]] std::vector<std::pair<std::string, std::uint64_t>> policy_versions() const;
  /// A drained worker gets no new task (the one it holds runs on) until undrained or gone.
  /// False when `id` holds no worker session.
  bool set_drained(const std::string& id, bool drained, util::time_point now);
  /// Takes the worker's task back (the attempt ends as a failed one would, with `reason`;
  /// the worker is told TASK_ABORT). Returns the task it held ("" when free); the caller
  /// ends the session. Nullopt when `id` holds no worker session.
  std::optional<std::string> take_back(const std::string& id, const std::string& reason,
                                       util::time_point now);
  /// From the time a task is queued to the start of its attempt, each attempt; and from the
  /// start of an attempt to its RESULT, each finished one. Readable from any thread.
  [[nodiscard]] const histogram& assignment_latency() const noexcept { return assignment_; }
  [[nodiscard]] const histogram& task_duration() const noexcept { return duration_; }

  // ---- durability (SPEC §14) ----
  /// Takes up what a journal held when the broker started: tasks queued again in their
  /// order, each attempt that was running ended (`requeued`, "broker restarted"; the next
  /// attempt gets the next number, so the old one's worker is refused), policies held,
  /// streams numbered on from where they were, with the events that ended a task kept for
  /// replay; every coordinator's tasks wait the grace for a new session to adopt them.
  void restore(const journal_state& js, util::time_point now);
  /// Records what it accepts in `j` from now on (nullptr: nothing).
  void attach(journal* j) noexcept { journal_ = j; }
  /// Writes the live state as journal records: the content of a compacted journal.
  void write_snapshot(journal& j) const;

 private:
  using state = task_state;
  using stream = coordinator_stream;

  // coordinator side
  std::optional<refusal> on_submit(const std::string& from, codec::submit&& s,
                                   util::time_point now);
  std::optional<refusal> on_finish(const std::string& from, const codec::finish& f,
                                   util::time_point now);
  std::optional<refusal> on_cancel(const std::string& from, const codec::cancel& c,
                                   util::time_point now);
  std::optional<refusal> on_data_reply(const std::string& from, codec::data_reply&& r);
  std::optional<refusal> on_replay(const std::string& from, const codec::replay& r);
  std::optional<refusal> on_ack(const std::string& from, const codec::ack& a);
  // learner side
  std::optional<refusal> on_policy(const std::string& from, codec::policy&& p);
  // worker side
  std::optional<refusal> on_worker_message(const std::string& from, codec::message&& m,
                                           util::time_point now);
  /// The task `from` runs in `attempt`, or nullptr with `why` (fencing, §12.7.5).
  task* held_task(const std::string& from, std::string_view task_id, std::uint32_t attempt,
                  std::optional<refusal>& why);
  static refusal wrong_state(const task& t, std::string_view what, bool late_if_closing = true);
  bool dropped_by_index(task& t, const std::optional<std::uint64_t>& index);
  static std::optional<refusal> out_of_credit(const task& t);
  void relayed(task& t, std::optional<std::uint64_t> last, std::uint64_t items, std::size_t bytes);
  /// The newest version of `t`'s policy the broker holds, 0 when none: what collected data
  /// trails (§13).
  [[nodiscard]] std::uint64_t newest_version(const task& t) const;
  /// Counts one collected item, and how far its `version` trails `newest` (when both are known).
  void collected(std::uint64_t newest, std::optional<std::uint64_t> version);
  std::optional<refusal> on_data_lost(task& t, const codec::data_lost& l, util::time_point now);
  std::optional<refusal> on_data_batch(task& t, const codec::data_batch& b, util::time_point now);
  std::optional<refusal> on_leaving(const std::string& from, const codec::leaving& l,
                                    util::time_point now);
  /// Whether `index` lies past the attempt's next DATA index (a gap): counted, and a resend
  /// asked for now and then.
  bool past_next(task& t, std::uint64_t index);
  void send_data_ack(task& t, bool resend);
  task* owned_task(const std::string& coordinator, const std::string& task_id,
                   std::optional<refusal>& why);

  void try_assign(util::time_point now);
  void start_attempt(task& t, const std::string& worker_id, util::time_point now);
  void set_deadline(task& t, util::time_point due);
  /// The task was queued (again): its wait is bounded by its queue timeout, if it has one.
  void arm_queue_timeout(task& t, util::time_point now);
  /// An attempt on `worker_id` ended through the worker (§12.6.9): it may begin a quarantine,
  /// which takes the worker out of its pool and is published.
  void ended_badly(const std::string& worker_id, rlbus::role role, const std::string& reason,
                   util::time_point now);
  /// `result`: the TASK_FAILED's own map, passed on in the event when the worker sent one.
  void end_attempt(task& t, const std::string& reason, util::time_point now,
                   const codec::blob* result = nullptr);
  void erase_task(const std::string& id);
  [[nodiscard]] static journal_task journal_task_of(const task& t);
  /// Cancels a coordinator's tasks without events and drops its stream (§12.5.8).
  void drop_coordinator(const std::string& id, util::time_point now);
  void cancel(task& t, const std::string& reason);
  /// An event with a body the broker composes (codec::event_body, generated from the model), named
  /// by its type.
  template <class Body>
  void emit(task& t, const Body& body, std::string_view detail = {}, std::uint32_t items = 1);
  /// An event whose body is a field of the worker's message, byte for byte (info, finished).
  template <class Body>
  void emit_verbatim(task& t, std::string_view body);
  template <class Body>
  void emit_with(task& t, std::string_view event, std::size_t reserve, Body&& write_body,
                 std::string_view detail = {}, std::uint32_t items = 1);
  // flow control (§12.9)
  void grant(stream& s, const task* announce);
  void tell_credit(task& t);
  void tell_untold_credit();
  void uncredit(task& t);

  const config& cfg_;
  task_sink& sink_;
  task_store tasks_;
  worker_pool workers_;
  std::string topic_;                                // emit()'s, reused for every event's topic
  std::deque<ended_view> ended_;                     // recently_ended()
  std::map<std::string, util::time_point> orphans_;  // coordinator id -> end of its grace
  policy_store policies_;
  task_schedule schedule_;
  task_counts counts_;
  stream_set streams_;  // after counts_, which it counts into
  histogram assignment_, duration_;
  std::optional<std::string> closed_;  // the queue is closed (draining), with this reason
  journal* journal_ = nullptr;
};

}  // namespace rlbus::broker
