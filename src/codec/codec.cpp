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
