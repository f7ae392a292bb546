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
  INFO("got message type 0x" << std::hex << static_cast<int>(codec::type_of(*m)));
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

/// Sends `m` to the broker and requires ERROR `code` about its type as the very next message.
template <class M>
codec::error refused(raw_peer& p, const M& m, codec::error_code code) {
  p.send(m);
  return next_error(p, code, ref(static_cast<std::uint8_t>(M::type)));
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

/// A map whose insides are not canonical: a whole float64, a uint in a wider format than it
/// needs, keys out of order. Re-encoding it would change its bytes.
inline std::string odd_map() {
  using namespace std::string_literals;
  return "\x83\xa1z"s + float64(1.0) + "\xa1y\xcd\x00\x05\xa1x\x90"s;
}

/// {"reason": reason, "attempt": attempt}, as the broker composes it (§12.5.6).
inline std::string reason_body(const std::string& reason, std::uint64_t attempt) {
  return packed([&](packer& pk) {
    pk.pack_map(2);
    pk.pack("reason").pack(reason);
    pk.pack("attempt").pack(attempt);
  });
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
  std::vector<std::string> frames;
  for (const auto& f : p.recv_message(timeout)) frames.push_back(f.to_string());
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

// ---- §12 task messages ----------------------------------------------------------------------

inline constexpr std::uint8_t type_submit = 0x10;
inline constexpr std::uint8_t type_submitted = 0x11;
inline constexpr std::uint8_t type_finish = 0x12;
inline constexpr std::uint8_t type_cancel = 0x13;
inline constexpr std::uint8_t type_data_reply = 0x14;
inline constexpr std::uint8_t type_task_event = 0x15;
inline constexpr std::uint8_t type_task_start = 0x20;
inline constexpr std::uint8_t type_task_close = 0x21;
inline constexpr std::uint8_t type_learn = 0x22;
inline constexpr std::uint8_t type_no_data = 0x23;
inline constexpr std::uint8_t type_task_abort = 0x24;
inline constexpr std::uint8_t type_started = 0x30;
inline constexpr std::uint8_t type_data = 0x31;
inline constexpr std::uint8_t type_info = 0x32;
inline constexpr std::uint8_t type_get_data = 0x33;
inline constexpr std::uint8_t type_learn_info = 0x34;
inline constexpr std::uint8_t type_result = 0x35;
inline constexpr std::uint8_t type_task_failed = 0x36;

/// Introduces `p` as `id` of role `r` announcing `res`, with a heartbeat long enough that no
/// session expires during a test; returns the WELCOME.
inline codec::welcome join(raw_peer& p, const std::string& id, rlbus::role r,
                           rlbus::resources res = {}) {
  p.send(codec::hello{r, id, 30'000, std::move(res), std::nullopt});
  return next_a<codec::welcome>(p);
}

/// A SUBMIT of `kind` with an empty task_info and no options: the broker's settings apply.
inline codec::submit task_of(std::string id, rlbus::role kind = rlbus::role::collector,
                             rlbus::resources need = {}) {
  codec::submit s;
  s.task_id = std::move(id);
  s.kind = kind;
  s.requirements = std::move(need);
  return s;
}

/// Sends `s`; the very next message must be its SUBMITTED, accepted.
inline codec::submitted submit_ok(raw_peer& coord, const codec::submit& s) {
  coord.send(s);
  const auto a = next_a<codec::submitted>(coord);
  INFO("SUBMITTED " << a.code << " " << a.reason);
  CHECK(a.task_id == s.task_id);
  REQUIRE(a.accepted);
  return a;
}

/// The very next message to `coord` must be TASK_EVENT `event` about `task_id`.
inline codec::task_event next_event(raw_peer& coord, std::string_view task_id,
                                    std::string_view event,
                                    std::chrono::milliseconds timeout = 3000ms) {
  const auto e = next_a<codec::task_event>(coord, timeout);
  INFO("got TASK_EVENT '" << e.event << "' about '" << e.task_id << "', seq " << e.seq);
  CHECK(e.task_id == task_id);
  REQUIRE(e.event == event);
  return e;
}

/// A HEARTBEAT round trip whose answer must be the very next message: nothing the broker did
/// before it read this HEARTBEAT is still on its way to `p`.
inline void expect_quiet(raw_peer& p) {
  p.send(codec::heartbeat{});
  next_a<codec::heartbeat>(p);
}

/// The body of the very next message, which must be of type `type`, as raw bytes.
inline std::string next_body(raw_peer& p, std::uint8_t type,
                             std::chrono::milliseconds timeout = 3000ms) {
  const auto frames = recv_frames(p, timeout);
  REQUIRE(frames.size() == 2);
  const auto h = codec::parse_header(frames[0]);
  REQUIRE(h);
  REQUIRE(static_cast<int>(h->type) == static_cast<int>(type));
  return frames[1];
}

/// Submits `s` (a free `worker` must take it at once) and starts it: SUBMITTED, the worker's
/// TASK_START, `assigned`, STARTED, `started`. Returns the TASK_START.
inline codec::task_start start_task(raw_peer& coord, raw_peer& worker, const codec::submit& s) {
  submit_ok(coord, s);
  const auto start = next_a<codec::task_start>(worker);
  REQUIRE(start.task_id == s.task_id);
  next_event(coord, s.task_id, "assigned");
  worker.send(codec::started{s.task_id, start.attempt});
  next_event(coord, s.task_id, "started");
  return start;
}

/// A running collector task "t" on `w` for `coord` (plain stream, no credit).
inline void running(raw_peer& coord, raw_peer& w) {
  join(coord, "coord", rlbus::role::coordinator);
  join(w, "w", rlbus::role::collector);
  start_task(coord, w, task_of("t"));
}

/// DATA number `index` of attempt 1 of `task` (SPEC §12.11), its data_id naming the index.
inline codec::data_ready indexed_data(std::uint64_t index, const std::string& task = "t") {
  codec::data_ready d{task,        1, "d" + std::to_string(index), "b", codec::empty_map_blob,
                      std::nullopt};
  d.index = index;
  return d;
}

/// A broker with settings of its own, for the tests that change them.
struct broker_with {
  explicit broker_with(const broker::config& cfg) : broker(cfg) {}
  broker::server_thread broker;
  zmq::context_t ctx;
  std::string router = broker.get().router_endpoint();
};

/// Milliseconds since `t0`.
inline std::chrono::milliseconds since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0);
}

}  // namespace rlbus::test::spec
