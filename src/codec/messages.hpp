// Typed v1 messages: one struct per message of SPEC.md §4 and one per event body of §7.
// Plain values; the codec turns them into bytes and back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "codec/bus_messages.hpp"
#include "codec/protocol.hpp"
#include "codec/replication_messages.hpp"
#include "codec/task_messages.hpp"
#include "codec/vocabulary.hpp"

namespace rlbus::codec {

/// HELLO (peer -> broker): introduction. `session` resumes an earlier session (SPEC §4.1).
struct hello {
  rlbus::role role = rlbus::role::collector;
  std::string id;
  std::uint32_t heartbeat_ms = 1000;
  rlbus::resources resources;
  std::optional<std::uint64_t> session;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("role", s.role);
    f("id", s.id, rule::id{});
    f("heartbeat_ms", s.heartbeat_ms, rule::range{min_heartbeat_ms, max_heartbeat_ms});
    f("resources", s.resources);
    f("session", s.session, rule::range{1, ~std::uint64_t{0}});
  }
  bool operator==(const hello&) const = default;
};

/// WELCOME (broker -> peer): the session is live with these agreed timings.
struct welcome {
  std::uint64_t session = 0;
  std::uint64_t epoch = 0;
  std::uint32_t heartbeat_ms = 0;
  std::uint32_t liveness = 0;
  std::uint64_t max_message = 0;
  bool resumed = false;
  /// A coordinator's new session adopted an earlier one's tasks and stream (SPEC §12.5.8):
  /// the stream goes on after this acknowledged seq.
  std::optional<std::uint64_t> stream_acked;
  /// The broker leads a group of brokers under this leadership epoch (SPEC §14.9).
  std::optional<std::uint64_t> leader_epoch;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("session", s.session, rule::range{1, ~std::uint64_t{0}});
    f("epoch", s.epoch, rule::u64);
    f("heartbeat_ms", s.heartbeat_ms, rule::range{min_heartbeat_ms, max_heartbeat_ms});
    f("liveness", s.liveness, rule::range{1, 1000});
    f("max_message", s.max_message, rule::u64);
    f("resumed", s.resumed);
    f("stream_acked", s.stream_acked, rule::u64);
    f("leader_epoch", s.leader_epoch, rule::range{1, ~std::uint64_t{0}});
  }
  bool operator==(const welcome&) const = default;
};

/// HEARTBEAT (both ways): an empty map; its arrival is the whole message.
struct heartbeat {
  template <class S, class F>
  static void fields(S& /*s*/, F&& /*f*/) {}
  bool operator==(const heartbeat&) const = default;
};

/// DISCONNECT (both ways): the session ends; `code` says why (SPEC §6).
struct disconnect {
  std::uint16_t code = static_cast<std::uint16_t>(error_code::goodbye);
  std::string reason;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("code", s.code, rule::range{0, 0xFFFF});
    f("reason", s.reason, rule::reason);
  }
  bool operator==(const disconnect&) const = default;
};

/// ERROR (broker -> peer): the message of type `ref_type` was not accepted.
struct error {
  std::uint16_t code = 0;
  std::string reason;
  std::optional<std::uint8_t> ref_type;
  /// NOT_LEADER (421): the endpoint of the group's leader and its leadership epoch, when the
  /// standby knows them (SPEC §14.9).
  std::optional<std::string> leader;
  std::optional<std::uint64_t> leader_epoch;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("code", s.code, rule::range{0, 0xFFFF});
    f("reason", s.reason, rule::reason);
    f("ref_type", s.ref_type, rule::range{0, 0xFF});
    f("leader", s.leader, rule::text{max_reason_length, 1});
    f("leader_epoch", s.leader_epoch, rule::range{1, ~std::uint64_t{0}});
  }
  bool operator==(const error&) const = default;
};

/// Any message that travels on the ROUTER.
using message =
    std::variant<hello, welcome, heartbeat, disconnect, error,               // session (§4)
                 submit, submitted, finish, cancel, data_reply, task_event,  // coordinator (§12)
                 capacity,                                                   // (§12.10)
                 task_start, task_close, learn, no_data, task_abort,         // to workers
                 started, data_ready, info, get_data, learn_info, task_result, task_failed,
                 policy,                                // (§13)
                 replay, ack, stream_gap, data_credit,  // stream flow control (§12.9)
                 data_ack, data_lost,                   // reliable data (§12.11)
                 data_batch,                            // batched data (§12.12)
                 task_alive,                            // keep-alive of an attempt
                 leaving,                               // the worker will go away (§12.3.20)
                 policy_update,                         // a newer policy version (§13.4.7)
                 ops, ops_reply,                        // operations (§16)
                 subscribe, unsubscribe, subscribed,    // the topic bus (§17)
                 publish, publish_credit, deliver, bus_ack, bus_gap, repl_sync, repl_snapshot,
                 repl_records, repl_synced>;  // replication (§14.10)

/// The type id each message struct travels under.
constexpr msg_type type_of(const hello&) noexcept {
  return msg_type::hello;
}
constexpr msg_type type_of(const welcome&) noexcept {
  return msg_type::welcome;
}
constexpr msg_type type_of(const heartbeat&) noexcept {
  return msg_type::heartbeat;
}
constexpr msg_type type_of(const disconnect&) noexcept {
  return msg_type::disconnect;
}
constexpr msg_type type_of(const error&) noexcept {
  return msg_type::error;
}
/// Task messages carry their type id as a static member.
template <class T, class = decltype(T::type)>
constexpr msg_type type_of(const T&) noexcept {
  return T::type;
}
msg_type type_of(const message& m) noexcept;

// ---- events (PUB) --------------------------------------------------------------------

/// Topics of v1 events (SPEC §7). Peers of role coordinator use the "coordinator." prefix,
/// nodes of the topic bus the "bus." one (§17.9).
namespace topic {
inline constexpr std::string_view worker_joined = "worker.joined";
inline constexpr std::string_view worker_left = "worker.left";
inline constexpr std::string_view worker_lost = "worker.lost";
inline constexpr std::string_view coordinator_joined = "coordinator.joined";
inline constexpr std::string_view coordinator_left = "coordinator.left";
inline constexpr std::string_view coordinator_lost = "coordinator.lost";
inline constexpr std::string_view bus_joined = "bus.joined";
inline constexpr std::string_view bus_left = "bus.left";
inline constexpr std::string_view bus_lost = "bus.lost";
inline constexpr std::string_view worker_quarantined = "worker.quarantined";
inline constexpr std::string_view broker_heartbeat = "broker.heartbeat";
inline constexpr std::string_view broker_stopping = "broker.stopping";
inline constexpr std::string_view capacity_collector = "capacity.collector";
inline constexpr std::string_view capacity_learner = "capacity.learner";
}  // namespace topic

/// Body of *.joined. `serial` numbers sessions within one broker epoch (1, 2, ...); it is
/// public, unlike the session token, which never leaves the peer's own connection.
struct peer_joined {
  std::string id;
  rlbus::role role = rlbus::role::collector;
  std::uint64_t serial = 0;
  rlbus::resources resources;
  bool resumed = false;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("id", s.id, rule::id{});
    f("role", s.role);
    f("serial", s.serial, rule::range{1, ~std::uint64_t{0}});
    f("resources", s.resources);
    f("resumed", s.resumed);
  }
  bool operator==(const peer_joined&) const = default;
};

/// Body of *.left (the peer said DISCONNECT) and *.lost (expired or thrown out).
struct peer_gone {
  std::string id;
  rlbus::role role = rlbus::role::collector;
  std::uint64_t serial = 0;
  std::uint16_t code = 0;
  std::string reason;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("id", s.id, rule::id{});
    f("role", s.role);
    f("serial", s.serial, rule::range{1, ~std::uint64_t{0}});
    f("code", s.code, rule::range{0, 0xFFFF});
    f("reason", s.reason, rule::reason);
  }
  bool operator==(const peer_gone&) const = default;
};

/// Body of worker.quarantined (SPEC §12.6.9): `id` gets no task for `quarantine_ms`, after
/// `failures` attempts in a row that it ended badly, the last for `reason`.
struct worker_quarantine {
  std::string id;
  rlbus::role role = rlbus::role::collector;
  std::uint32_t failures = 0;
  std::uint64_t quarantine_ms = 0;
  std::string reason;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("id", s.id, rule::id{});
    f("role", s.role, rule::kind{});  // a worker's: never a coordinator
    f("failures", s.failures, rule::range{1, 1000});
    f("quarantine_ms", s.quarantine_ms, rule::range{1, ~std::uint64_t{0}});
    f("reason", s.reason, rule::reason);
  }
  bool operator==(const worker_quarantine&) const = default;
};

/// Body of broker.heartbeat.
struct broker_status {
  std::uint64_t peers = 0;
  std::uint64_t uptime_ms = 0;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("peers", s.peers, rule::u64);
    f("uptime_ms", s.uptime_ms, rule::u64);
  }
  bool operator==(const broker_status&) const = default;
};

/// Body of broker.stopping.
struct broker_stopping {
  std::uint64_t drain_ms = 0;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("drain_ms", s.drain_ms, rule::u64);
  }
  bool operator==(const broker_stopping&) const = default;
};

/// Body of task.<coordinator>.<event>: one step of a task, for observers (the owning
/// coordinator gets the full TASK_EVENT on the ROUTER). `detail` is the data id of a
/// data event, or the reason of a requeued / failed / cancelled one.
struct task_status {
  std::string task_id;
  rlbus::role kind = rlbus::role::collector;
  std::uint32_t attempt = 0;
  std::string worker_id;
  std::string detail;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("task_id", s.task_id, rule::id{});
    f("kind", s.kind, rule::kind{});
    f("attempt", s.attempt, rule::u32);
    f("worker_id", s.worker_id, rule::text{max_id_length});
    f("detail", s.detail, rule::reason);
  }
  bool operator==(const task_status&) const = default;
};

/// Body of policy.<policy_id>: the broker now holds this version (the parameters themselves
/// are never published; a collector gets them in TASK_START).
struct policy_status {
  std::string policy_id;
  std::uint64_t version = 0;
  std::string publisher;   // the learner that published it
  std::uint64_t size = 0;  // bytes of inline params, 0 for a reference
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("policy_id", s.policy_id, rule::id{});
    f("version", s.version, rule::version);
    f("publisher", s.publisher, rule::id{});
    f("size", s.size, rule::u64);
  }
  bool operator==(const policy_status&) const = default;
};

/// Body of capacity.collector and capacity.learner: the number of live workers of `kind`
/// changed to `count` because `worker_id` joined (increase) or its session ended (decrease).
/// The PUB copy of the CAPACITY every coordinator gets (SPEC §12.10).
struct capacity_status {
  rlbus::role kind = rlbus::role::collector;
  capacity_change change = capacity_change::increase;
  std::string worker_id;
  std::uint64_t count = 0;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("kind", s.kind, rule::kind{});
    f("change", s.change, rule::no_snapshot{});
    f("worker_id", s.worker_id, rule::id{});
    f("count", s.count, rule::u64);
  }
  bool operator==(const capacity_status&) const = default;
};

/// An event as published: the envelope every event has, and a topic-specific body.
/// A topic this build does not know decodes with `std::monostate` as its body.
struct event {
  std::string topic;
  std::uint64_t seq = 0;
  std::uint64_t epoch = 0;
  std::uint64_t ts_ms = 0;
  std::variant<std::monostate, peer_joined, peer_gone, broker_status, broker_stopping, task_status,
               policy_status, capacity_status, worker_quarantine>
      body;
  bool operator==(const event&) const = default;
  /// The envelope's fields (§7), written before the body's.
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("seq", s.seq, rule::range{1, ~std::uint64_t{0}});
    f("epoch", s.epoch, rule::u64);
    f("ts_ms", s.ts_ms, rule::u64);
  }
};

}  // namespace rlbus::codec
