// Protocol v1 constants: the header frame, message type ids, error codes and the decode
// limits. protocol/SPEC.md and protocol/messages.json are the source of truth; this file
// mirrors them, and tests/protocol checks that the two agree.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace rlbus::codec {

/// Every message (ROUTER and PUB) carries a 4-byte header frame: 'R' 'L' version type.
inline constexpr std::uint8_t signature_0 = 0x52;  // 'R'
inline constexpr std::uint8_t signature_1 = 0x4C;  // 'L'
inline constexpr std::uint8_t protocol_version = 1;
inline constexpr std::size_t header_size = 4;

/// Message type ids (SPEC.md §3.5, §12). Ranges: 0x01-0x0F session, 0x10-0x3F tasks,
/// 0x40-0x4F stream flow control and replay, 0x50-0x5F operations, 0x60 events, 0x70-0x7F the
/// topic bus.
enum class msg_type : std::uint8_t {
  hello = 0x01,
  welcome = 0x02,
  heartbeat = 0x03,
  disconnect = 0x04,
  error = 0x05,
  // coordinator <-> broker (§12)
  submit = 0x10,
  submitted = 0x11,
  finish = 0x12,
  cancel = 0x13,
  data_reply = 0x14,
  task_event = 0x15,
  capacity = 0x16,
  // broker -> worker
  task_start = 0x20,
  task_close = 0x21,
  learn = 0x22,
  no_data = 0x23,
  task_abort = 0x24,
  policy_update = 0x25,  // a newer version of the running task's policy (§13.4.7)
  // worker -> broker
  started = 0x30,
  data = 0x31,
  info = 0x32,
  get_data = 0x33,
  learn_info = 0x34,
  result = 0x35,
  task_failed = 0x36,
  task_alive = 0x38,  // the worker still works on its attempt: push its deadline (§12.3.19)
  leaving = 0x39,     // the worker will go away: no new task, a bound on its attempt (§12.3.20)
  // learner -> broker (§13)
  policy = 0x37,
  // stream flow control and replay (§12.9): coordinator <-> broker, then broker -> collector
  replay = 0x40,
  ack = 0x41,
  stream_gap = 0x42,
  data_credit = 0x48,
  data_ack = 0x49,    // broker -> collector: what the broker relayed (§12.11)
  data_lost = 0x4A,   // collector -> broker: DATA it dropped unconfirmed (§12.11)
  data_batch = 0x4B,  // collector -> broker: consecutive DATA in one message (§12.12)
  ops = 0x50,         // operator -> broker: a question or an order (§16)
  ops_reply = 0x51,   // broker -> operator: its answer
  event = 0x60,
  // the topic bus (§17): node <-> broker
  subscribe = 0x70,
  unsubscribe = 0x71,
  subscribed = 0x72,
  publish = 0x73,  // with a payload frame
  publish_credit = 0x74,
  deliver = 0x75,  // with a payload frame
  bus_ack = 0x76,
  bus_gap = 0x77,
  // replication between the brokers of a group (§14.10): standby <-> leader
  sync = 0x80,
  snapshot = 0x81,
  records = 0x82,
  synced = 0x83,
};

/// Name of a known type ("HELLO", ...), or nullopt for an unassigned id.
std::optional<std::string_view> type_name(std::uint8_t id) noexcept;

/// Error codes carried by ERROR and DISCONNECT (SPEC.md §6).
enum class error_code : std::uint16_t {
  goodbye = 200,                 // DISCONNECT only: an orderly leave, nothing went wrong
  bad_frame = 400,               // wrong frame count or header signature
  bad_body = 401,                // body is not one well-formed msgpack map within the limits
  bad_field = 402,               // a field is missing, has the wrong type or is out of range
  not_ready = 403,               // a message other than HELLO before WELCOME
  unknown_type = 404,            // unassigned type id, or a type peers never send
  version_mismatch = 405,        // header version is not one the broker speaks
  duplicate_id = 409,            // HELLO names an id that a live session holds
  expired = 410,                 // DISCONNECT only: the peer was silent past its liveness window
  too_many_faults = 429,         // DISCONNECT only: the peer sent too many bad messages
  replaced = 430,                // DISCONNECT only: a newer connection resumed this session
  unknown_task = 406,            // no live task of this id belongs to the sender
  stale_attempt = 407,           // the attempt number is not the task's current one
  wrong_state = 408,             // the task is not in a state where this message makes sense
  duplicate_task = 411,          // SUBMIT with the id of a live task
  queue_full = 412,              // SUBMIT past the broker's queue bound
  bad_seq = 413,                 // REPLAY or ACK names a seq past the head of the stream
  no_credit = 414,               // DATA past the data credit the broker granted the attempt
  bad_index = 415,               // DATA_LOST that skips DATA the broker never had, or past credit
  too_many_tasks = 416,          // SUBMIT past the tasks one coordinator may hold
  not_leader = 421,              // a standby of a group: go to the leader it names (§14.9)
  unauthorized = 431,            // HELLO (or OPS) the peer's key may not make; DISCONNECT: revoked
  no_such_peer = 432,            // OPS names a worker without a session (§16.3.1)
  evicted = 433,                 // DISCONNECT: an operator ended the session (§16.5)
  too_many_subscriptions = 440,  // SUBSCRIBED: past bus-max-subscriptions (§17.8)
  bad_fragment = 441,            // PUBLISH that breaks the fragment rules (§17.5)
  bad_batch = 442,               // PUBLISH whose batch breaks the batch rules (§17.5.1)
  stale_policy = 426,            // POLICY with a version not above the one the broker holds
  policy_limit = 427,            // POLICY over the broker's size or policy-count limit
  busy = 503,                    // broker full (max peers) or shutting down
};

/// Short upper-case name of a code ("BAD_FRAME"), "UNKNOWN" for anything else.
std::string_view code_name(std::uint16_t code) noexcept;

/// Limits applied to every untrusted msgpack body (SPEC.md §5). They bound what a decode
/// can allocate to a small multiple of the input size.
struct decode_limits {
  std::size_t max_array = 1024;
  std::size_t max_map = 256;
  std::size_t max_str = std::size_t{64} * 1024;
  std::size_t max_bin = std::size_t{1024} * 1024;
  std::size_t max_depth = 16;
};

/// Field limits for v1 messages (SPEC.md §4).
inline constexpr std::size_t max_id_length = 128;
inline constexpr std::size_t max_reason_length = 1024;
inline constexpr std::size_t max_resources = 32;
inline constexpr std::size_t max_resource_name = 64;
inline constexpr std::uint32_t min_heartbeat_ms = 10;
inline constexpr std::uint32_t max_heartbeat_ms = 600'000;

}  // namespace rlbus::codec
