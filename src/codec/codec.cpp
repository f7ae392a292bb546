// Protocol v1 codec: messages (§4, §12) and events (§7). Decoding runs msgpack's parser
// with hard limits (an unlimited unpack of a 6-byte array32 header asks for 16 GiB), then
// checks each field with `field_reader`, which records the first fault instead of throwing.
// Each message and event body lists its fields once (fields()); one generic writer
// (field_writer.hpp) and one generic reader (task_codec.cpp) serve them all.
#include "codec/codec.hpp"

#include "codec/field_reader.hpp"
#include "codec/field_writer.hpp"
#include "codec/task_codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace rlbus::codec {

namespace {

using detail::field_reader;

decode_error unknown_type(std::uint8_t type) {
  return {error_code::unknown_type,
          fmt::format("message type 0x{:02x} is not a ROUTER message of protocol v{}", type,
                      protocol_version)};
}

result<message> read_message(std::uint8_t type, field_reader& r) {
  if (static_cast<msg_type>(type) == msg_type::event) return unknown_type(type);
  return detail::read_fields_message(type, r);
}

using packer = msgpack::packer<msgpack::sbuffer>;

struct body_encoder {  // every message: one generic writer, driven by its fields()
  packer& pk;
  msgpack::sbuffer& out;
  template <class T>
  void operator()(const T& m) const {
    write_fields(pk, out, m);
  }
};

// Event bodies: the envelope (seq, epoch, ts_ms) first, then the topic's own fields.
struct event_encoder {
  packer& pk;
  msgpack::sbuffer& out;
  const event& e;
  template <class B>
  void operator()(const B& b) const {
    constexpr bool has_body = !std::is_same_v<B, std::monostate>;
    std::uint32_t n = field_count(e);
    if constexpr (has_body) n += field_count(b);
    pk.pack_map(n);
    detail::field_writer<msgpack::sbuffer> w{pk, out};
    event::fields(e, w);
    if constexpr (has_body) B::fields(b, w);
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

decltype(event::body) event_body_of(std::string_view topic) {
  if (ends_with(topic, ".joined")) return peer_joined{};
  if (ends_with(topic, ".left") || ends_with(topic, ".lost")) return peer_gone{};
  if (topic == topic::worker_quarantined) return worker_quarantine{};
  if (topic == topic::broker_heartbeat) return broker_status{};
  if (topic == topic::broker_stopping) return broker_stopping{};
  if (topic.rfind("capacity.", 0) == 0) return capacity_status{};
  if (topic.rfind("task.", 0) == 0) return task_status{};
  if (topic.rfind("policy.", 0) == 0) return policy_status{};
  return std::monostate{};
}

result<event> decode_event(std::string_view topic, std::string_view body,
                           const decode_limits& limits) {
  field_reader r(body, limits);
  if (r.fault()) return *r.fault();
  event e;
  e.topic = topic;
  e.body = event_body_of(topic);
  detail::read_event_fields(r, e);
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
    case msg_type::subscribe:
      return "SUBSCRIBE";
    case msg_type::unsubscribe:
      return "UNSUBSCRIBE";
    case msg_type::subscribed:
      return "SUBSCRIBED";
    case msg_type::publish:
      return "PUBLISH";
    case msg_type::publish_credit:
      return "PUBLISH_CREDIT";
    case msg_type::deliver:
      return "DELIVER";
    case msg_type::bus_ack:
      return "BUS_ACK";
    case msg_type::bus_gap:
      return "BUS_GAP";
    case msg_type::sync:
      return "SYNC";
    case msg_type::snapshot:
      return "SNAPSHOT";
    case msg_type::records:
      return "RECORDS";
    case msg_type::synced:
      return "SYNCED";
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
    case error_code::not_leader:
      return "NOT_LEADER";
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
    case error_code::too_many_subscriptions:
      return "TOO_MANY_SUBSCRIPTIONS";
    case error_code::bad_fragment:
      return "BAD_FRAGMENT";
    case error_code::bad_batch:
      return "BAD_BATCH";
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
    case role::bus:
      return "bus";
  }
  return "unknown";
}

std::optional<role> parse_role(std::string_view text) noexcept {
  if (text == "collector") return role::collector;
  if (text == "learner") return role::learner;
  if (text == "coordinator") return role::coordinator;
  if (text == "bus") return role::bus;
  return std::nullopt;
}

}  // namespace rlbus
