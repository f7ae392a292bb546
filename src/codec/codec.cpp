// Protocol v1 codec: session messages (§4) and events (§7). Decoding runs msgpack's parser
// with hard limits (an unlimited unpack of a 6-byte array32 header asks for 16 GiB), then
// checks each field with `field_reader`, which records the first fault instead of throwing.
#include "codec/codec.hpp"

#include "codec/field_reader.hpp"
#include "codec/task_codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace rlbus::codec {

namespace {

using detail::field_reader;
using detail::u16_max;
using detail::u64_max;

template <class T>
result<message> done(field_reader& r, T&& value) {
  if (r.fault()) return *r.fault();
  return message{std::forward<T>(value)};
}

decode_error unknown_type(std::uint8_t type) {
  return {error_code::unknown_type,
          fmt::format("message type 0x{:02x} is not a ROUTER message of protocol v{}", type,
                      protocol_version)};
}

result<message> read_message(std::uint8_t type, field_reader& r) {
  switch (static_cast<msg_type>(type)) {
    case msg_type::hello: {
      hello m;
      r.role("role", m.role);
      r.peer_id("id", m.id);
      r.uint("heartbeat_ms", m.heartbeat_ms, min_heartbeat_ms, max_heartbeat_ms);
      r.resources("resources", m.resources);
      r.opt_uint("session", m.session, 1, u64_max);
      return done(r, std::move(m));
    }
    case msg_type::welcome: {
      welcome m;
      r.uint("session", m.session, 1, u64_max);
      r.uint("epoch", m.epoch, 0, u64_max);
      r.uint("heartbeat_ms", m.heartbeat_ms, min_heartbeat_ms, max_heartbeat_ms);
      r.uint("liveness", m.liveness, 1, 1000);
      r.uint("max_message", m.max_message, 0, u64_max);
      r.boolean("resumed", m.resumed);
      r.opt_uint("stream_acked", m.stream_acked, 0, u64_max);
      return done(r, m);
    }
    case msg_type::heartbeat:
      return done(r, heartbeat{});
    case msg_type::disconnect: {
      disconnect m;
      r.uint("code", m.code, 0, u16_max);
      r.str("reason", m.reason, max_reason_length);
      return done(r, std::move(m));
    }
    case msg_type::error: {
      error m;
      r.uint("code", m.code, 0, u16_max);
      r.str("reason", m.reason, max_reason_length);
      r.opt_uint("ref_type", m.ref_type, 0, 0xFF);
      return done(r, std::move(m));
    }
    default:
      if (is_task_type(type) || is_ops_type(type)) return detail::read_task(type, r);
      break;
  }
  return unknown_type(type);
}

using packer = msgpack::packer<msgpack::sbuffer>;

void pack_kv(packer& pk, std::string_view key, std::string_view v) {
  pk.pack(key).pack(v);
}
void pack_kv(packer& pk, std::string_view key, std::uint64_t v) {
  pk.pack(key).pack(v);
}
void pack_kv(packer& pk, std::string_view key, bool v) {
  pk.pack(key).pack(v);
}
void pack_kv(packer& pk, std::string_view key, rlbus::role v) {
  pk.pack(key).pack(to_string(v));
}

void pack_kv(packer& pk, msgpack::sbuffer& out, std::string_view key, const rlbus::resources& res) {
  pk.pack(key);
  detail::pack_resources(pk, out, res);
}

struct body_encoder {
  packer& pk;
  msgpack::sbuffer& out;
  template <class T>
  void operator()(const T& m) const {  // task messages (§12): one generic writer
    detail::write_task(m, pk, out);
  }
  void operator()(const hello& m) const {
    pk.pack_map(m.session ? 5 : 4);
    pack_kv(pk, "role", m.role);
    pack_kv(pk, "id", m.id);
    pack_kv(pk, "heartbeat_ms", std::uint64_t{m.heartbeat_ms});
    pack_kv(pk, out, "resources", m.resources);
    if (m.session) pack_kv(pk, "session", *m.session);
  }
  void operator()(const welcome& m) const {
    pk.pack_map(m.stream_acked ? 7 : 6);
    pack_kv(pk, "session", m.session);
    pack_kv(pk, "epoch", m.epoch);
    pack_kv(pk, "heartbeat_ms", std::uint64_t{m.heartbeat_ms});
    pack_kv(pk, "liveness", std::uint64_t{m.liveness});
    pack_kv(pk, "max_message", m.max_message);
    pack_kv(pk, "resumed", m.resumed);
    if (m.stream_acked) pack_kv(pk, "stream_acked", *m.stream_acked);
  }
  void operator()(const heartbeat& /*m*/) const { pk.pack_map(0); }
  void operator()(const disconnect& m) const {
    pk.pack_map(2);
    pack_kv(pk, "code", std::uint64_t{m.code});
    pack_kv(pk, "reason", m.reason);
  }
  void operator()(const error& m) const {
    pk.pack_map(m.ref_type ? 3 : 2);
    pack_kv(pk, "code", std::uint64_t{m.code});
    pack_kv(pk, "reason", m.reason);
    if (m.ref_type) pack_kv(pk, "ref_type", std::uint64_t{*m.ref_type});
  }
};

// Event bodies: the envelope (seq, epoch, ts_ms) first, then the topic's own fields.
struct event_encoder {
  packer& pk;
  msgpack::sbuffer& out;
  const event& e;
  void envelope(std::uint32_t extra) const {
    pk.pack_map(3 + extra);
    pack_kv(pk, "seq", e.seq);
    pack_kv(pk, "epoch", e.epoch);
    pack_kv(pk, "ts_ms", e.ts_ms);
  }
  void operator()(std::monostate /*unused*/) const { envelope(0); }
  void operator()(const peer_joined& b) const {
    envelope(5);
    pack_kv(pk, "id", b.id);
    pack_kv(pk, "role", b.role);
    pack_kv(pk, "serial", b.serial);
    pack_kv(pk, out, "resources", b.resources);
    pack_kv(pk, "resumed", b.resumed);
  }
  void operator()(const peer_gone& b) const {
    envelope(5);
    pack_kv(pk, "id", b.id);
    pack_kv(pk, "role", b.role);
    pack_kv(pk, "serial", b.serial);
    pack_kv(pk, "code", std::uint64_t{b.code});
    pack_kv(pk, "reason", b.reason);
  }
  void operator()(const worker_quarantine& b) const {
    envelope(5);
    pack_kv(pk, "id", b.id);
    pack_kv(pk, "role", b.role);
    pack_kv(pk, "failures", std::uint64_t{b.failures});
    pack_kv(pk, "quarantine_ms", b.quarantine_ms);
    pack_kv(pk, "reason", b.reason);
  }
  void operator()(const broker_status& b) const {
    envelope(2);
    pack_kv(pk, "peers", b.peers);
    pack_kv(pk, "uptime_ms", b.uptime_ms);
  }
  void operator()(const broker_stopping& b) const {
    envelope(1);
    pack_kv(pk, "drain_ms", b.drain_ms);
  }
  void operator()(const capacity_status& b) const {
    envelope(4);
    pack_kv(pk, "kind", b.kind);
    pk.pack("change").pack(to_string(b.change));
    pack_kv(pk, "worker_id", b.worker_id);
    pack_kv(pk, "count", b.count);
  }
  void operator()(const task_status& b) const {
    envelope(5);
    pack_kv(pk, "task_id", b.task_id);
    pack_kv(pk, "kind", b.kind);
    pack_kv(pk, "attempt", std::uint64_t{b.attempt});
    pack_kv(pk, "worker_id", b.worker_id);
    pack_kv(pk, "detail", b.detail);
  }
  void operator()(const policy_status& b) const {
    envelope(4);
    pack_kv(pk, "policy_id", b.policy_id);
    pack_kv(pk, "version", b.version);
    pack_kv(pk, "publisher", b.publisher);
    pack_kv(pk, "size", b.size);
  }
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::optional<header> parse_header(std::string_view frame) noexcept {
  if (frame.size() != header_size || static_cast<std::uint8_t>(frame[0]) != signature_0 ||
      static_cast<std::uint8_t>(frame[1]) != signature_1)
    return std::nullopt;
  return header{static_cast<std::uint8_t>(frame[2]), static_cast<std::uint8_t>(frame[3])};
}

std::array<char, header_size> make_header(msg_type t) noexcept {
  return {static_cast<char>(signature_0), static_cast<char>(signature_1),
          static_cast<char>(protocol_version), static_cast<char>(t)};
}

result<message> decode_body(std::uint8_t type, std::string_view body, const decode_limits& limits) {
  if (!type_name(type) || static_cast<msg_type>(type) == msg_type::event) return unknown_type(type);
  field_reader r(body, limits);
  if (r.fault()) return *r.fault();
  return read_message(type, r);
}

void encode_body(const message& m, msgpack::sbuffer& out) {
  packer pk(out);
  std::visit(body_encoder{pk, out}, m);
}

std::string encode_body(const message& m) {
  msgpack::sbuffer buf;
  encode_body(m, buf);
  return {buf.data(), buf.size()};
}

result<event> decode_event(std::string_view topic, std::string_view body,
                           const decode_limits& limits) {
  field_reader r(body, limits);
  if (r.fault()) return *r.fault();
  event e;
  e.topic = topic;
  r.uint("seq", e.seq, 1, u64_max);
  r.uint("epoch", e.epoch, 0, u64_max);
  r.uint("ts_ms", e.ts_ms, 0, u64_max);
  if (ends_with(topic, ".joined")) {
    peer_joined b;
    r.peer_id("id", b.id);
    r.role("role", b.role);
    r.uint("serial", b.serial, 1, u64_max);
    r.resources("resources", b.resources);
    r.boolean("resumed", b.resumed);
    e.body = std::move(b);
  } else if (ends_with(topic, ".left") || ends_with(topic, ".lost")) {
    peer_gone b;
    r.peer_id("id", b.id);
    r.role("role", b.role);
    r.uint("serial", b.serial, 1, u64_max);
    r.uint("code", b.code, 0, u16_max);
    r.str("reason", b.reason, max_reason_length);
    e.body = std::move(b);
  } else if (topic == topic::worker_quarantined) {
    worker_quarantine b;
    r.peer_id("id", b.id);
    r.word(
        "role", b.role,
        [](std::string_view text) {
          const auto r = parse_role(text);  // a worker's: never a coordinator
          return r == rlbus::role::coordinator ? std::nullopt : r;
        },
        "collector or learner");
    r.uint("failures", b.failures, 1, 1000);
    r.uint("quarantine_ms", b.quarantine_ms, 1, u64_max);
    r.str("reason", b.reason, max_reason_length);
    e.body = std::move(b);
  } else if (topic == topic::broker_heartbeat) {
    broker_status b;
    r.uint("peers", b.peers, 0, u64_max);
    r.uint("uptime_ms", b.uptime_ms, 0, u64_max);
    e.body = b;
  } else if (topic == topic::broker_stopping) {
    broker_stopping b;
    r.uint("drain_ms", b.drain_ms, 0, u64_max);
    e.body = b;
  } else if (topic.rfind("capacity.", 0) == 0) {
    capacity_status b;
    r.kind("kind", b.kind);
    // Snapshots go to coordinators only (SPEC §12.10.4): an event is a change.
    r.word(
        "change", b.change,
        [](std::string_view text) {
          auto c = parse_capacity_change(text);
          return c == capacity_change::snapshot ? std::nullopt : c;
        },
        "increase or decrease");
    r.peer_id("worker_id", b.worker_id);
    r.uint("count", b.count, 0, u64_max);
    e.body = std::move(b);
  } else if (topic.rfind("task.", 0) == 0) {
    task_status b;
    r.peer_id("task_id", b.task_id);
    r.kind("kind", b.kind);
    r.uint("attempt", b.attempt, 0, 0xFFFF'FFFF);
    r.str("worker_id", b.worker_id, max_id_length);
    r.str("detail", b.detail, max_reason_length);
    e.body = std::move(b);
  } else if (topic.rfind("policy.", 0) == 0) {
    policy_status b;
    r.peer_id("policy_id", b.policy_id);
    r.uint("version", b.version, 1, u64_max);
    r.peer_id("publisher", b.publisher);
    r.uint("size", b.size, 0, u64_max);
    e.body = std::move(b);
  }
  if (r.fault()) return *r.fault();
  return e;
}

void encode_event(const event& e, msgpack::sbuffer& out) {
  packer pk(out);
  std::visit(event_encoder{pk, out, e}, e.body);
}

std::string encode_event(const event& e) {
  msgpack::sbuffer buf;
  encode_event(e, buf);
  return {buf.data(), buf.size()};
}

std::optional<decode_error> check_user_map(std::string_view value, std::size_t max_nesting,
                                           const decode_limits& limits) {
  return detail::check_user_map_impl(value, max_nesting, limits);
}

bool valid_peer_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > max_id_length) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '@' || c == '/' || c == '-';
  });
}

msg_type type_of(const message& m) noexcept {
  return std::visit([](const auto& v) { return type_of(v); }, m);
}

std::optional<std::string_view> type_name(std::uint8_t id) noexcept {
  switch (static_cast<msg_type>(id)) {
    case msg_type::hello:
      return "HELLO";
    case msg_type::welcome:
      return "WELCOME";
    case msg_type::heartbeat:
      return "HEARTBEAT";
    case msg_type::disconnect:
      return "DISCONNECT";
    case msg_type::error:
      return "ERROR";
    case msg_type::submit:
      return "SUBMIT";
    case msg_type::submitted:
      return "SUBMITTED";
    case msg_type::finish:
      return "FINISH";
    case msg_type::cancel:
      return "CANCEL";
    case msg_type::data_reply:
      return "DATA_REPLY";
    case msg_type::task_event:
      return "TASK_EVENT";
    case msg_type::capacity:
      return "CAPACITY";
    case msg_type::task_start:
      return "TASK_START";
    case msg_type::task_close:
      return "TASK_CLOSE";
    case msg_type::learn:
      return "LEARN";
    case msg_type::no_data:
      return "NO_DATA";
    case msg_type::task_abort:
      return "TASK_ABORT";
    case msg_type::policy_update:
      return "POLICY_UPDATE";
    case msg_type::started:
      return "STARTED";
    case msg_type::data:
      return "DATA";
    case msg_type::info:
      return "INFO";
    case msg_type::get_data:
      return "GET_DATA";
    case msg_type::learn_info:
      return "LEARN_INFO";
    case msg_type::result:
      return "RESULT";
    case msg_type::task_failed:
      return "TASK_FAILED";
    case msg_type::task_alive:
      return "TASK_ALIVE";
    case msg_type::leaving:
      return "LEAVING";
    case msg_type::policy:
      return "POLICY";
    case msg_type::replay:
      return "REPLAY";
    case msg_type::ack:
      return "ACK";
    case msg_type::stream_gap:
      return "STREAM_GAP";
    case msg_type::data_credit:
      return "DATA_CREDIT";
    case msg_type::data_ack:
      return "DATA_ACK";
    case msg_type::data_lost:
      return "DATA_LOST";
    case msg_type::data_batch:
      return "DATA_BATCH";
    case msg_type::ops:
      return "OPS";
    case msg_type::ops_reply:
      return "OPS_REPLY";
    case msg_type::event:
      return "EVENT";
  }
  return std::nullopt;
}

std::string_view code_name(std::uint16_t code) noexcept {
  switch (static_cast<error_code>(code)) {
    case error_code::goodbye:
      return "GOODBYE";
    case error_code::bad_frame:
      return "BAD_FRAME";
    case error_code::bad_body:
      return "BAD_BODY";
    case error_code::bad_field:
      return "BAD_FIELD";
    case error_code::not_ready:
      return "NOT_READY";
    case error_code::unknown_type:
      return "UNKNOWN_TYPE";
    case error_code::version_mismatch:
      return "VERSION_MISMATCH";
    case error_code::duplicate_id:
      return "DUPLICATE_ID";
    case error_code::expired:
      return "EXPIRED";
    case error_code::too_many_faults:
      return "TOO_MANY_FAULTS";
    case error_code::replaced:
      return "REPLACED";
    case error_code::unknown_task:
      return "UNKNOWN_TASK";
    case error_code::stale_attempt:
      return "STALE_ATTEMPT";
    case error_code::wrong_state:
      return "WRONG_STATE";
    case error_code::duplicate_task:
      return "DUPLICATE_TASK";
    case error_code::queue_full:
      return "QUEUE_FULL";
    case error_code::stale_policy:
      return "STALE_POLICY";
    case error_code::policy_limit:
      return "POLICY_LIMIT";
    case error_code::bad_seq:
      return "BAD_SEQ";
    case error_code::no_credit:
      return "NO_CREDIT";
    case error_code::bad_index:
      return "BAD_INDEX";
    case error_code::too_many_tasks:
      return "TOO_MANY_TASKS";
    case error_code::unauthorized:
      return "UNAUTHORIZED";
    case error_code::no_such_peer:
      return "NO_SUCH_PEER";
    case error_code::evicted:
      return "EVICTED";
    case error_code::busy:
      return "BUSY";
  }
  return "UNKNOWN";
}

}  // namespace rlbus::codec

namespace rlbus {

std::string_view to_string(role r) noexcept {
  switch (r) {
    case role::collector:
      return "collector";
    case role::learner:
      return "learner";
    case role::coordinator:
      return "coordinator";
  }
  return "unknown";
}

std::optional<role> parse_role(std::string_view text) noexcept {
  if (text == "collector") return role::collector;
  if (text == "learner") return role::learner;
  if (text == "coordinator") return role::coordinator;
  return std::nullopt;
}

}  // namespace rlbus
