// Shared helpers for the SPEC conformance tests (conformance_*_test.cpp): raw frame and
// msgpack builders, strict receive-and-expect checks, a raw event SUB and a broker fixture.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/support.hpp"

namespace rlbus::test::spec {

constexpr auto code_of(codec::error_code c) {
  return static_cast<std::uint16_t>(c);
}

inline constexpr std::uint8_t type_hello = 0x01;
inline constexpr std::uint8_t type_welcome = 0x02;
inline constexpr std::uint8_t type_heartbeat = 0x03;
inline constexpr std::uint8_t type_disconnect = 0x04;
inline constexpr std::uint8_t type_error = 0x05;
inline constexpr std::uint8_t type_event = 0x60;
inline constexpr std::uint8_t type_unassigned = 0x7e;

inline std::string header(std::uint8_t version, std::uint8_t type) {
  return {'R', 'L', static_cast<char>(version), static_cast<char>(type)};
}

inline std::optional<std::uint8_t> ref(std::uint8_t type) {
  return type;
}
inline const std::optional<std::uint8_t> no_ref;

inline codec::error expect_error(raw_peer& p, codec::error_code code) {
  auto e = p.recv_a<codec::error>();
  REQUIRE(e);
  INFO(e->reason);
  CHECK(e->code == code_of(code));
  CHECK_FALSE(e->reason.empty());
  return *e;
}

/// The very next message from the broker (nothing skipped) must be a T.
template <class T>
T next_a(raw_peer& p, std::chrono::milliseconds timeout = 3000ms) {
  auto m = p.recv(timeout);
  REQUIRE(m);
  if (const auto* e = std::get_if<codec::error>(&*m))
    FAIL("unexpected ERROR " << e->code << " (ref_type "
                             << (e->ref_type ? static_cast<int>(*e->ref_type) : -1)
                             << "): " << e->reason);
  REQUIRE(std::holds_alternative<T>(*m));
  return std::get<T>(*m);
}

/// The very next message must be ERROR `code` carrying exactly `ref_type`.
inline codec::error next_error(raw_peer& p, codec::error_code code,
                               std::optional<std::uint8_t> ref_type) {
  auto m = p.recv();
  REQUIRE(m);
  INFO("expected ERROR " << code_of(code) << ", got type " << static_cast<int>(codec::type_of(*m)));
  REQUIRE(std::holds_alternative<codec::error>(*m));
  const auto e = std::get<codec::error>(*m);
  INFO(e.reason);
  CHECK(e.code == code_of(code));
  CHECK(e.ref_type == ref_type);
  CHECK_FALSE(e.reason.empty());
  return e;
}

using packer = msgpack::packer<msgpack::sbuffer>;

template <class F>
std::string packed(F&& f) {
  msgpack::sbuffer buf;
  packer pk(buf);
  f(pk);
  return {buf.data(), buf.size()};
}

/// A HELLO body with `role`, `id` and heartbeat_ms 1000, then `n_extra` fields from `extra`.
template <class F>
std::string hello_body(std::string_view role_name, std::string_view id, std::uint32_t n_extra,
                       F&& extra) {
  return packed([&](packer& pk) {
    pk.pack_map(3 + n_extra);
    pk.pack("role").pack(role_name);
    pk.pack("id").pack(id);
    pk.pack("heartbeat_ms").pack(1000);
    extra(pk);
  });
}

inline std::string hello_body(std::string_view role_name, std::string_view id) {
  return hello_body(role_name, id, 0, [](packer&) {});
}

/// A msgpack float64 by hand: msgpack-c's packer writes a whole double as an integer.
inline std::string float64(double d) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof bits);
  std::string out(1, '\xcb');
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(bits >> (8 * i)));
  return out;
}

/// The 8 bytes of `v`, most significant first.
inline std::string be64(std::uint64_t v) {
  std::string out;
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

/// Every integer anywhere inside a msgpack value (keys included).
inline void collect_uints(const msgpack::object& o, std::vector<std::uint64_t>& out) {
  switch (o.type) {
    case msgpack::type::POSITIVE_INTEGER:
      out.push_back(o.via.u64);
      break;
    case msgpack::type::ARRAY:
      for (std::uint32_t i = 0; i < o.via.array.size; ++i) collect_uints(o.via.array.ptr[i], out);
      break;
    case msgpack::type::MAP:
      for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
        collect_uints(o.via.map.ptr[i].key, out);
        collect_uints(o.via.map.ptr[i].val, out);
      }
      break;
    default:
      break;
  }
}

/// A SUB on the broker's PUB that keeps every event's raw frames as well as its decoding,
/// for checks on bytes a typed decoder would drop.
class raw_events {
 public:
  struct item {
    std::string topic;
    std::string body;
    codec::event event;
  };

  raw_events(zmq::context_t& ctx, const std::string& endpoint) : sock_(ctx, zmq::socket_type::sub) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.set(zmq::sockopt::subscribe, "");
    sock_.connect(endpoint);
  }

  /// The next event within `timeout`, or nullopt.
  std::optional<codec::event> next(std::chrono::milliseconds timeout) {
    zmq::pollitem_t poll_item{sock_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&poll_item, 1, timeout) == 0) return std::nullopt;
    std::vector<zmq::message_t> frames;
    do {
      frames.emplace_back();
      (void)sock_.recv(frames.back(), zmq::recv_flags::none);
    } while (frames.back().more());
    REQUIRE(frames.size() == 3);
    const auto h = codec::parse_header(frames[1].to_string_view());
    REQUIRE(h);
    REQUIRE(h->version == codec::protocol_version);
    REQUIRE(h->type == type_event);
    auto e = codec::decode_event(frames[0].to_string_view(), frames[2].to_string_view());
    INFO((e ? std::string() : e.error().reason));
    REQUIRE(e);
    seen_.push_back({frames[0].to_string(), frames[2].to_string(), e.value()});
    return e.value();
  }

  /// Events until one of `topic` about peer `id` ("" for any), within `timeout`.
  std::optional<codec::event> next(std::string_view topic, std::string_view id,
                                   std::chrono::milliseconds timeout = 5000ms) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto e = next(left);
      if (!e) return std::nullopt;
      if (e->topic == topic && (id.empty() || event_peer_id(*e) == id)) return e;
    }
  }

  [[nodiscard]] const std::vector<item>& seen() const { return seen_; }

 private:
  zmq::socket_t sock_;
  std::vector<item> seen_;
};

/// Matches events about peer `id`.
inline auto about(std::string id) {
  return [id = std::move(id)](const codec::event& e) { return event_peer_id(e) == id; };
}

/// The next message's raw frames ([header][body]) within `timeout`; empty if none came.
inline std::vector<std::string> recv_frames(raw_peer& p,
                                            std::chrono::milliseconds timeout = 3000ms) {
  zmq::pollitem_t item{p.socket().handle(), 0, ZMQ_POLLIN, 0};
  std::vector<std::string> frames;
  if (zmq::poll(&item, 1, timeout) == 0) return frames;
  zmq::message_t frame;
  do {
    (void)p.socket().recv(frame, zmq::recv_flags::none);
    frames.push_back(frame.to_string());
  } while (frame.more());
  return frames;
}

/// Checks that `body` is in the canonical form of §5.5 with exactly the top-level `keys`, in
/// order: msgpack-c's packer writes the shortest form of every integer, str and map header,
/// so re-packing the decoded value must give the same bytes.
inline void check_canonical(const std::string& body, const std::vector<std::string>& keys) {
  const auto oh = msgpack::unpack(body.data(), body.size());
  const auto& m = oh.get();
  REQUIRE(m.type == msgpack::type::MAP);
  std::vector<std::string> got;
  for (std::uint32_t i = 0; i < m.via.map.size; ++i) {
    const auto& kv = m.via.map.ptr[i];
    got.push_back(kv.key.as<std::string>());
    if (kv.val.type == msgpack::type::MAP) {  // resources: entries in bytewise order of name
      std::vector<std::string> names;
      for (std::uint32_t j = 0; j < kv.val.via.map.size; ++j)
        names.push_back(kv.val.via.map.ptr[j].key.as<std::string>());
      CHECK(std::is_sorted(names.begin(), names.end()));
    }
  }
  CHECK(got == keys);
  msgpack::sbuffer buf;
  msgpack::pack(buf, m);
  CHECK(std::string(buf.data(), buf.size()) == body);
}

struct fixture {
  broker::server_thread broker{test_config()};
  zmq::context_t ctx;
  std::string router = broker.get().router_endpoint();
};

}  // namespace rlbus::test::spec
