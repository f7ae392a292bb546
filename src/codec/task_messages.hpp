// Task messages (SPEC §12, type ids 0x10-0x3F): coordinators submit and steer tasks,
// the broker drives workers through them, workers report back. Each struct lists its
// fields once, in canonical order, in `fields()`; one generic encoder and one generic
// decoder (task_codec.cpp) serve them all, so a message is declared in one place.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codec/protocol.hpp"
#include "codec/vocabulary.hpp"

namespace rlbus::codec {

/// Opaque user data (task_info, info, result, data ...): one complete msgpack value kept as
/// its exact bytes, so the broker forwards it unchanged.
using blob = std::string;
inline const blob empty_map_blob{"\x80", 1};
inline const blob nil_blob{"\xc0", 1};

/// Field rules the generic codec applies (SPEC §12.2).
namespace rule {
struct id {};    // 1-128 characters of A-Z a-z 0-9 . _ : @ / -
struct kind {};  // a task's kind of worker: collector or learner, never coordinator (§12.2.5)
struct text {
  std::size_t max;
  std::size_t min = 0;  // 1: must not be empty
};
// One of these words (an enum that stays a str in its struct).
struct words {
  std::span<const std::string_view> allowed;
};
// A capacity change as published (§12.10.3): increase or decrease; snapshots go to
// coordinators only (§12.10.4).
struct no_snapshot {};
struct range {
  std::uint64_t lo, hi;
};
// relayed_map: a map the broker relays one level deeper than it came (DATA's meta inside a
// `data` event's body, ...), so it may nest at most max_relayed_nesting levels (§12.2.3.1).
// batched_map: a DATA_BATCH item's meta, relayed three levels deeper than a DATA's meta
// comes (inside the item, `items`, the event's body), so it nests at most 12 (§12.2.3.1).
enum class shape { map, any, map_or_nil, relayed_map, batched_map };
inline constexpr std::size_t max_relayed_nesting = 14;
inline constexpr std::size_t max_batched_nesting = 12;
// items: DATA_BATCH's array of 1..max data items, kept as its exact bytes (§12.12.2).
struct items {
  std::size_t max;
};
struct bin {
  std::size_t max;
};
inline constexpr range attempt{1, 1000};
inline constexpr range u32{0, 0xFFFF'FFFF};
inline constexpr range u64{0, ~std::uint64_t{0}};
inline constexpr range timeout_ms{1, 86'400'000};
inline constexpr range version{1, ~std::uint64_t{0}};
inline constexpr text reason{max_reason_length};
inline constexpr text policy_ref{max_reason_length};
}  // namespace rule

#define RLBUS_TASK_MESSAGE(name_, id_)            \
  static constexpr msg_type type = msg_type::id_; \
  bool operator==(const name_&) const = default;

/// SUBMIT (coordinator -> broker): run a task of `kind` (collector or learner).
struct submit {
  std::string task_id;
  rlbus::role kind = rlbus::role::collector;
  blob task_info = empty_map_blob;
  rlbus::resources requirements;
  std::optional<std::uint32_t> start_timeout_ms, step_timeout_ms, close_timeout_ms, task_timeout_ms,
      max_attempts;
  std::optional<std::string> policy_id;  // hand the latest version of this policy at start (§13)
  // Longest wait in the queue, each time queued, before the task fails (§12.7.6).
  std::optional<std::uint32_t> queue_timeout_ms;
  RLBUS_TASK_MESSAGE(submit, submit)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("kind", s.kind, rule::kind{});
    f("task_info", s.task_info, rule::shape::map);
    f("requirements", s.requirements);
    f("start_timeout_ms", s.start_timeout_ms, rule::timeout_ms);
    f("step_timeout_ms", s.step_timeout_ms, rule::timeout_ms);
    f("close_timeout_ms", s.close_timeout_ms, rule::timeout_ms);
    f("task_timeout_ms", s.task_timeout_ms, rule::timeout_ms);
    f("max_attempts", s.max_attempts, rule::attempt);
    f("policy_id", s.policy_id, rule::id{});
    f("queue_timeout_ms", s.queue_timeout_ms, rule::timeout_ms);
  }
};

/// SUBMITTED (broker -> coordinator): the answer to SUBMIT, at once.
struct submitted {
  std::string task_id;
  bool accepted = false;
  std::uint16_t code = 0;
  std::string reason;
  std::uint64_t queued = 0;  // tasks ahead of it in the queue (0: assigned or refused)
  RLBUS_TASK_MESSAGE(submitted, submitted)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("accepted", s.accepted);
    f("code", s.code, rule::range{0, 0xFFFF});
    f("reason", s.reason, rule::reason);
    f("queued", s.queued, rule::u64);
  }
};

/// FINISH (coordinator -> broker): the coordinator judged the task finished: close it.
struct finish {
  std::string task_id;
  RLBUS_TASK_MESSAGE(finish, finish)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
  }
};

/// CANCEL (coordinator -> broker): drop the task wherever it is.
struct cancel {
  std::string task_id;
  std::string reason;
  RLBUS_TASK_MESSAGE(cancel, cancel)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("reason", s.reason, rule::reason);
  }
};

/// DATA_REPLY (coordinator -> broker): the answer to a learner's data request; nil data
/// means "not enough data yet" (the learner asks again after a short backoff).
struct data_reply {
  std::string task_id;
  std::uint64_t request_id = 0;
  blob data = nil_blob;
  // With nil data: what NO_DATA tells the learner to wait (otherwise the broker's setting).
  std::optional<std::uint32_t> retry_ms;
  RLBUS_TASK_MESSAGE(data_reply, data_reply)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("request_id", s.request_id, rule::u64);
    f("data", s.data, rule::shape::any);
    f("retry_ms", s.retry_ms, rule::range{0, 3'600'000});
  }
};

/// TASK_EVENT (broker -> coordinator): one step of one of its tasks, numbered by `seq` in
/// the coordinator's stream. `event` names the step (SPEC §12.5); `body` is its data.
struct task_event {
  std::uint64_t seq = 0;
  std::string task_id;
  std::uint32_t attempt = 0;
  std::string event;
  std::string worker_id;
  blob body = empty_map_blob;
  // The task's kind, on the events that end a task (finished, failed, cancelled): a
  // coordinator that adopted the task (§12.5.8) learns it here.
  std::optional<rlbus::role> kind;
  RLBUS_TASK_MESSAGE(task_event, task_event)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("seq", s.seq, rule::range{1, ~std::uint64_t{0}});
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::u32);
    f("event", s.event, rule::text{32});
    f("worker_id", s.worker_id, rule::text{max_id_length});
    f("body", s.body, rule::shape::any);
    f("kind", s.kind, rule::kind{});
  }
};

/// What a CAPACITY reports (SPEC §12.10): a worker joined, a worker's session ended, or the
/// current count as a coordinator's session begins.
enum class capacity_change { increase, decrease, snapshot };

/// The wire spelling ("increase", "decrease", "snapshot").
std::string_view to_string(capacity_change c) noexcept;
/// Parses a wire spelling; nullopt for anything else (case-sensitive).
std::optional<capacity_change> parse_capacity_change(std::string_view text) noexcept;

/// CAPACITY (broker -> coordinator): the number of live workers of `kind` is now `count`,
/// because `worker_id` joined (increase) or its session ended (decrease); a snapshot, sent
/// right after WELCOME, names no worker (SPEC §12.10).
struct capacity {
  rlbus::role kind = rlbus::role::collector;
  capacity_change change = capacity_change::increase;
  std::string worker_id;
  std::uint64_t count = 0;
  RLBUS_TASK_MESSAGE(capacity, capacity)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("kind", s.kind, rule::kind{});
    f("change", s.change);
    f("worker_id", s.worker_id, rule::text{max_id_length});
    f("count", s.count, rule::u64);
  }
};

/// TASK_START (broker -> worker): begin attempt `attempt` of a task, with the latest version
/// of the task's policy when its SUBMIT named one and the broker holds a version (§13).
struct task_start {
  std::string task_id;
  std::uint32_t attempt = 1;
  rlbus::role kind = rlbus::role::collector;
  blob task_info = empty_map_blob;
  std::optional<std::string> policy_id;
  std::optional<std::uint64_t> policy_version;
  std::optional<std::string> policy_ref;
  std::optional<std::string> policy_params;
  RLBUS_TASK_MESSAGE(task_start, task_start)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("kind", s.kind, rule::kind{});
    f("task_info", s.task_info, rule::shape::map);
    f("policy_id", s.policy_id, rule::id{});
    f("policy_version", s.policy_version, rule::version);
    f("policy_ref", s.policy_ref, rule::policy_ref);
    f("policy_params", s.policy_params, rule::bin{~std::size_t{0}});
  }
  /// The policy fields travel together: an id, a version and exactly one of ref / params.
  static std::optional<std::string_view> check(const task_start& s) {
    if (!s.policy_id && !s.policy_version && !s.policy_ref && !s.policy_params) return std::nullopt;
    if (!s.policy_id || !s.policy_version)
      return "'policy_id' and 'policy_version' come together, with 'policy_ref' or 'policy_params'";
    if (s.policy_ref.has_value() == s.policy_params.has_value())
      return "exactly one of 'policy_ref' and 'policy_params'";
    return std::nullopt;
  }
};

/// TASK_CLOSE (broker -> worker): finish the task and answer with RESULT.
struct task_close {
  std::string task_id;
  std::uint32_t attempt = 1;
  RLBUS_TASK_MESSAGE(task_close, task_close)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
  }
};

/// LEARN (broker -> learner): a batch for the learner's request `request_id`.
struct learn {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::uint64_t request_id = 0;
  blob data = empty_map_blob;
  RLBUS_TASK_MESSAGE(learn, learn)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("request_id", s.request_id, rule::u64);
    f("data", s.data, rule::shape::any);
  }
};

/// NO_DATA (broker -> learner): the coordinator has no batch yet; ask again after retry_ms.
struct no_data {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::uint64_t request_id = 0;
  std::uint32_t retry_ms = 0;
  RLBUS_TASK_MESSAGE(no_data, no_data)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("request_id", s.request_id, rule::u64);
    f("retry_ms", s.retry_ms, rule::u32);
  }
};

/// TASK_ABORT (broker -> worker): stop this attempt now; nothing more is accepted for it.
struct task_abort {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::string reason;
  RLBUS_TASK_MESSAGE(task_abort, task_abort)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("reason", s.reason, rule::reason);
  }
};

/// POLICY_UPDATE (broker -> worker): the broker now holds a newer version of the policy the
/// attempt's task named; the same policy fields as TASK_START, all of them present (§13.4.7).
struct policy_update {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::string policy_id;
  std::uint64_t policy_version = 1;
  std::optional<std::string> policy_ref;
  std::optional<std::string> policy_params;
  RLBUS_TASK_MESSAGE(policy_update, policy_update)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("policy_id", s.policy_id, rule::id{});
    f("policy_version", s.policy_version, rule::version);
    f("policy_ref", s.policy_ref, rule::policy_ref);
    f("policy_params", s.policy_params, rule::bin{~std::size_t{0}});
  }
  static std::optional<std::string_view> check(const policy_update& u) {
    if (u.policy_ref.has_value() == u.policy_params.has_value())
      return "exactly one of 'policy_ref' and 'policy_params'";
    return std::nullopt;
  }
};

/// STARTED (worker -> broker): the worker took the task.
struct started {
  std::string task_id;
  std::uint32_t attempt = 1;
  RLBUS_TASK_MESSAGE(started, started)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
  }
};

/// DATA (collector -> broker): data is ready: its id, metadata and an optional inline payload.
struct data_ready {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::string data_id;
  std::string buffer_id;
  blob meta = empty_map_blob;
  std::optional<std::string> payload;
  std::optional<std::uint64_t> policy_version;  // of the policy the data was collected with
  // Its number within the attempt, from 1 (§12.11): the broker relays each index once and
  // in order, so a collector may send again what a lost connection may have swallowed.
  std::optional<std::uint64_t> index;
  RLBUS_TASK_MESSAGE(data_ready, data)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("data_id", s.data_id, rule::text{256});
    f("buffer_id", s.buffer_id, rule::text{256});
    f("meta", s.meta, rule::shape::relayed_map);
    f("payload", s.payload, rule::bin{~std::size_t{0}});
    f("policy_version", s.policy_version, rule::version);
    f("index", s.index, rule::range{1, ~std::uint64_t{0}});
  }
};

/// INFO (collector -> broker): progress of a collector task (collector_done, counts ...).
struct info {
  std::string task_id;
  std::uint32_t attempt = 1;
  blob body = empty_map_blob;
  std::optional<std::uint64_t> index;  // in the attempt's DATA sequence (§12.11.10)
  RLBUS_TASK_MESSAGE(info, info)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("info", s.body, rule::shape::map);
    f("index", s.index, rule::range{1, ~std::uint64_t{0}});
  }
};

/// GET_DATA (learner -> broker): ask the task's coordinator for a batch.
struct get_data {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::uint64_t request_id = 0;
  std::string buffer_id;
  std::uint32_t batch_size = 0;
  std::uint64_t cur_learner_iter = 0;
  RLBUS_TASK_MESSAGE(get_data, get_data)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("request_id", s.request_id, rule::u64);
    f("buffer_id", s.buffer_id, rule::text{256});
    f("batch_size", s.batch_size, rule::u32);
    f("cur_learner_iter", s.cur_learner_iter, rule::u64);
  }
};

/// LEARN_INFO (learner -> broker): what one learning step did (learner_step, priority_info,
/// learner_done ...).
struct learn_info {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::string buffer_id;
  blob body = empty_map_blob;
  std::optional<std::uint64_t> index;  // within the learner attempt (§12.11.10)
  RLBUS_TASK_MESSAGE(learn_info, learn_info)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("buffer_id", s.buffer_id, rule::text{256});
    f("info", s.body, rule::shape::relayed_map);
    f("index", s.index, rule::range{1, ~std::uint64_t{0}});
  }
};

/// RESULT (worker -> broker): the final result, the answer to TASK_CLOSE.
struct task_result {
  std::string task_id;
  std::uint32_t attempt = 1;
  blob result = empty_map_blob;
  RLBUS_TASK_MESSAGE(task_result, result)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("result", s.result, rule::shape::map);
  }
};

/// TASK_FAILED (worker -> broker): the worker could not run the task (its handler failed).
/// An optional `result` map (user data) travels on to the coordinator in the `requeued` or
/// `failed` TASK_EVENT, byte for byte.
struct task_failed {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::string reason;
  std::optional<blob> result;
  RLBUS_TASK_MESSAGE(task_failed, task_failed)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("reason", s.reason, rule::reason);
    f("result", s.result, rule::shape::relayed_map);
  }
};

/// TASK_ALIVE (worker -> broker): still working on the attempt; pushes its start or step
/// deadline out by a full timeout, never its task timeout (§12.3.19). No TASK_EVENT.
struct task_alive {
  std::string task_id;
  std::uint32_t attempt = 1;
  RLBUS_TASK_MESSAGE(task_alive, task_alive)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
  }
};

/// LEAVING (worker -> broker): the worker will go away soon; it takes no new task, and the
/// attempt it holds may run for at most `deadline_ms` more (§12.3.20, §12.6.10).
struct leaving {
  std::uint32_t deadline_ms = 0;
  RLBUS_TASK_MESSAGE(leaving, leaving)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("deadline_ms", s.deadline_ms, rule::range{0, 86'400'000});
  }
};

/// POLICY (learner -> broker): version `version` of policy `policy_id`, as a reference the
/// workers resolve themselves (a path, a URL) or as inline parameters (§13).
struct policy {
  std::string policy_id;
  std::uint64_t version = 1;
  std::optional<std::string> ref;
  std::optional<std::string> params;
  RLBUS_TASK_MESSAGE(policy, policy)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("policy_id", s.policy_id, rule::id{});
    f("version", s.version, rule::version);
    f("ref", s.ref, rule::policy_ref);
    f("params", s.params, rule::bin{~std::size_t{0}});
  }
  static std::optional<std::string_view> check(const policy& p) {
    if (p.ref.has_value() == p.params.has_value()) return "exactly one of 'ref' and 'params'";
    return std::nullopt;
  }
};

// ---- stream flow control and replay (SPEC §12.9, type ids 0x40-0x4F) ----

/// REPLAY (coordinator -> broker): send my stream again from `from_seq`. It also says the
/// coordinator has processed every event before `from_seq`, and turns on the window.
struct replay {
  std::uint64_t from_seq = 1;
  RLBUS_TASK_MESSAGE(replay, replay)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("from_seq", s.from_seq, rule::range{1, ~std::uint64_t{0}});
  }
};

/// ACK (coordinator -> broker): every event of my stream up to `seq` is processed
/// (cumulative; 0 = none yet). The first one turns on the window.
struct ack {
  std::uint64_t seq = 0;
  RLBUS_TASK_MESSAGE(ack, ack)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("seq", s.seq, rule::u64);
  }
};

/// STREAM_GAP (broker -> coordinator): events `first`..`last` of your stream are gone from
/// the ring and will never come; the stream goes on at `last` + 1.
struct stream_gap {
  std::uint64_t first = 1;
  std::uint64_t last = 1;
  RLBUS_TASK_MESSAGE(stream_gap, stream_gap)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("first", s.first, rule::range{1, ~std::uint64_t{0}});
    f("last", s.last, rule::range{1, ~std::uint64_t{0}});
  }
};

/// DATA_CREDIT (broker -> collector): the attempt may send DATA until it has sent `limit`
/// of them in all (a running total that only grows).
struct data_credit {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::uint64_t limit = 0;
  RLBUS_TASK_MESSAGE(data_credit, data_credit)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("limit", s.limit, rule::u64);
  }
};

/// DATA_ACK (broker -> collector): the broker has relayed the attempt's indexed DATA up to
/// `relayed` (§12.11). With `resend` it also saw one past relayed + 1 and asks the worker to
/// send again from relayed + 1.
struct data_ack {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::uint64_t relayed = 0;
  bool resend = false;
  RLBUS_TASK_MESSAGE(data_ack, data_ack)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("relayed", s.relayed, rule::u64);
    f("resend", s.resend);
  }
};

/// DATA_LOST (collector -> broker): the worker dropped the attempt's DATA `first`..`last`
/// before the broker confirmed them and will never send them (§12.11).
struct data_lost {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::uint64_t first = 1;
  std::uint64_t last = 1;
  RLBUS_TASK_MESSAGE(data_lost, data_lost)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("first", s.first, rule::range{1, ~std::uint64_t{0}});
    f("last", s.last, rule::range{1, ~std::uint64_t{0}});
  }
};

// ---- operations (SPEC §16): not task messages, but written and read by the same machinery

/// The verbs of OPS (§16.3), and the words its filters take.
inline constexpr std::array<std::string_view, 8> ops_verbs{"status",  "workers", "tasks", "drain",
                                                           "undrain", "evict",   "set",   "topics"};
inline constexpr std::array<std::string_view, 4> ops_states{"queued", "starting", "running",
                                                            "closing"};

/// The kinds of worker, as the `kind` filter of OPS spells them.
inline constexpr std::array<std::string_view, 2> worker_kinds{"collector", "learner"};

/// OPS (operator -> broker): a question about the broker's state or an order to it (§16).
struct ops {
  std::uint64_t request_id = 1;
  std::string verb = "status";
  std::optional<std::string> worker;       // drain, undrain, evict
  std::optional<std::string> key;          // set
  std::optional<std::string> value;        // set
  std::optional<std::string> state;        // tasks: a filter
  std::optional<std::string> kind;         // tasks, workers: a filter
  std::optional<std::string> coordinator;  // tasks: a filter
  std::optional<std::uint32_t> limit;      // tasks, workers: most entries
  std::optional<std::uint64_t> offset;     // tasks, workers: matching entries skipped first
  RLBUS_TASK_MESSAGE(ops, ops)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("request_id", s.request_id, rule::range{1, ~std::uint64_t{0}});
    f("verb", s.verb, rule::words{ops_verbs});
    f("worker", s.worker, rule::id{});
    f("key", s.key, rule::text{64, 1});
    f("value", s.value, rule::text{256});
    f("state", s.state, rule::words{ops_states});
    f("kind", s.kind, rule::words{worker_kinds});
    f("coordinator", s.coordinator, rule::id{});
    f("limit", s.limit, rule::range{1, 10'000});
    f("offset", s.offset, rule::range{0, ~std::uint64_t{0}});
  }
};

/// OPS_REPLY (broker -> operator): what the verb of OPS `request_id` says (§16.5), a map.
struct ops_reply {
  std::uint64_t request_id = 1;
  std::string verb = "status";
  blob result = empty_map_blob;
  RLBUS_TASK_MESSAGE(ops_reply, ops_reply)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("request_id", s.request_id, rule::range{1, ~std::uint64_t{0}});
    f("verb", s.verb, rule::words{ops_verbs});
    f("result", s.result, rule::shape::map);
  }
};

/// One item of a DATA_BATCH (§12.12.2): the DATA it stands for, without the task, the
/// attempt and the index, which the batch gives once. Not a message: its fields() drive the
/// check of every item a batch carries, and the SDK's writing of them.
struct data_item {
  std::string data_id;
  std::string buffer_id;
  blob meta = empty_map_blob;
  std::optional<std::string> payload;
  std::optional<std::uint64_t> policy_version;
  bool operator==(const data_item&) const = default;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("data_id", s.data_id, rule::text{256});
    f("buffer_id", s.buffer_id, rule::text{256});
    f("meta", s.meta, rule::shape::batched_map);
    f("payload", s.payload, rule::bin{~std::size_t{0}});
    f("policy_version", s.policy_version, rule::version);
  }
};

/// Items a DATA_BATCH carries at most (the array limit of §5.1).
inline constexpr std::size_t max_batch_items = 1024;

/// DATA_BATCH's `items`: the msgpack array exactly as it travels, and where each item ends
/// in it (offsets past each item, noted by the decoder and by items_writer, so that nobody
/// walks the bytes again to find them; empty when unknown). Only the bytes travel and count.
struct item_array {
  blob bytes;
  std::vector<std::uint32_t> ends;
  bool operator==(const item_array& o) const { return bytes == o.bytes; }
};

/// DATA_BATCH (collector -> broker): consecutive indexed DATA of an attempt in one message;
/// item k has index first_index + k (§12.12). `items` is the msgpack array of data items
/// exactly as it travels, so the broker relays items without decoding them into copies.
struct data_batch {
  std::string task_id;
  std::uint32_t attempt = 1;
  std::uint64_t first_index = 1;
  item_array items;
  RLBUS_TASK_MESSAGE(data_batch, data_batch)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("attempt", s.attempt, rule::attempt);
    f("first_index", s.first_index, rule::range{1, std::uint64_t{1} << 63U});
    f("items", s.items, rule::items{max_batch_items});
  }
};

#undef RLBUS_TASK_MESSAGE

}  // namespace rlbus::codec
