// See support.hpp.
#include "support/support.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include <catch2/catch.hpp>

#include "codec/codec.hpp"
#include "codec/field_reader.hpp"

namespace rlbus::test {

std::string binary_from_env(const char* name) {
  const char* v = std::getenv(name);
  INFO(name << " must name the binary");
  REQUIRE(v != nullptr);
  return v;
}

broker::config test_config(const std::string& transport) {
  broker::config cfg;
  if (transport == "ipc") {
    cfg.router_endpoint = ipc_endpoint("router");
    cfg.events_endpoint = ipc_endpoint("events");
  } else {
    cfg.router_endpoint = "tcp://127.0.0.1:*";
    cfg.events_endpoint = "tcp://127.0.0.1:*";
  }
  cfg.heartbeat_min_ms = 10;
  cfg.status_interval_ms = 20;
  cfg.shutdown_linger_ms = 200;
  cfg.drain_ms = 0;  // stop at once; the tests of the drain (SPEC §11) set their own
  return cfg;
}

std::string ipc_endpoint(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "ipc:///tmp/rlbus-test-" + std::to_string(::getpid()) + "-" + tag + "-" +
         std::to_string(counter++);
}

void use_curve(zmq::socket_t& s, const rlbus::curve_keys& keys) {
  s.set(zmq::sockopt::curve_serverkey, keys.server_key);
  s.set(zmq::sockopt::curve_publickey, keys.public_key);
  s.set(zmq::sockopt::curve_secretkey, keys.secret_key);
}

raw_peer::raw_peer(zmq::context_t& ctx, const std::string& endpoint, const rlbus::curve_keys* keys)
    : sock_(ctx, zmq::socket_type::dealer) {
  sock_.set(zmq::sockopt::linger, 0);
  if (keys != nullptr) use_curve(sock_, *keys);
  sock_.connect(endpoint);
}

void raw_peer::send_frames(const std::vector<std::string>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    sock_.send(zmq::buffer(frames[i]), flags);
  }
}

void raw_peer::send(const codec::message& m) {
  const auto h = codec::make_header(codec::type_of(m));
  send_frames({std::string(h.data(), h.size()), codec::encode_body(m)});
}

void raw_peer::send(const codec::message& m, std::string_view payload) {
  const auto h = codec::make_header(codec::type_of(m));
  send_frames({std::string(h.data(), h.size()), codec::encode_body(m), std::string(payload)});
}

std::vector<zmq::message_t> recv_frames(zmq::socket_t& sock, std::chrono::milliseconds timeout) {
  std::vector<zmq::message_t> frames;
  zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
  if (timeout.count() <= 0 || zmq::poll(&item, 1, timeout) == 0) return frames;
  do {
    frames.emplace_back();
    (void)sock.recv(frames.back(), zmq::recv_flags::none);
  } while (frames.back().more());
  return frames;
}

std::vector<zmq::message_t> raw_peer::recv_message(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = timeout;
  while (true) {
    auto frames = recv_frames(sock_, left);
    const bool capacity =
        frames.size() == 2 && frames[0].size() == codec::header_size &&
        frames[0].data<std::uint8_t>()[3] == static_cast<std::uint8_t>(codec::msg_type::capacity);
    if (!capacity || keep_capacity_) return frames;
    left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  }
}

std::optional<codec::message> raw_peer::recv(std::chrono::milliseconds timeout) {
  const auto frames = recv_message(timeout);
  if (frames.empty()) return std::nullopt;
  const auto h = codec::parse_header(frames[0].to_string_view());
  REQUIRE(h);
  // A message with a payload (SPEC §17.1.1) has three frames; the payload is kept aside.
  REQUIRE(frames.size() == (codec::has_payload_frame(h->type) ? 3U : 2U));
  payload_ = frames.size() == 3 ? frames[2].to_string() : std::string();
  REQUIRE(h->version == codec::protocol_version);
  auto m = codec::decode_body(h->type, frames[1].to_string_view());
  INFO((m ? std::string() : m.error().reason));
  REQUIRE(m);
  return std::move(m).value();
}

codec::welcome raw_peer::introduce(const std::string& id, rlbus::role r,
                                   std::uint32_t heartbeat_ms) {
  send(codec::hello{r, id, heartbeat_ms, {}, std::nullopt});
  auto m = recv();
  REQUIRE(m);
  if (auto* e = std::get_if<codec::error>(&*m))
    FAIL("HELLO refused: " << e->code << " " << e->reason);
  REQUIRE(std::holds_alternative<codec::welcome>(*m));
  return std::get<codec::welcome>(*m);
}

event_listener::event_listener(zmq::context_t& ctx, const std::string& endpoint)
    : sock_(ctx, zmq::socket_type::sub) {
  sock_.set(zmq::sockopt::linger, 0);
  sock_.set(zmq::sockopt::subscribe, "");
  sock_.connect(endpoint);
  REQUIRE(next(std::string(codec::topic::broker_heartbeat)));
}

std::optional<codec::event> event_listener::next_any(
    std::chrono::steady_clock::time_point deadline) {
  const auto frames = recv_frames(sock_, std::chrono::duration_cast<std::chrono::milliseconds>(
                                             deadline - std::chrono::steady_clock::now()));
  if (frames.empty()) return std::nullopt;
  REQUIRE(frames.size() == 3);
  const auto h = codec::parse_header(frames[1].to_string_view());
  REQUIRE(h);
  REQUIRE(h->type == static_cast<std::uint8_t>(codec::msg_type::event));
  auto e = codec::decode_event(frames[0].to_string_view(), frames[2].to_string_view());
  REQUIRE(e);
  seen_.push_back(e.value());
  return std::move(e).value();
}

fake_broker::fake_broker(zmq::context_t& ctx) : sock_(ctx, zmq::socket_type::router) {
  sock_.set(zmq::sockopt::linger, 0);
  sock_.bind("tcp://127.0.0.1:*");
  endpoint_ = sock_.get(zmq::sockopt::last_endpoint);
}

codec::hello fake_broker::answer_hello(const codec::message& reply) {
  const auto frames = recv_frames(sock_, 5000ms);
  REQUIRE(frames.size() == 3);
  const auto h = codec::parse_header(frames[1].to_string_view());
  REQUIRE(h);
  auto hello = codec::decode_body(h->type, frames[2].to_string_view());
  REQUIRE(hello);
  REQUIRE(std::holds_alternative<codec::hello>(hello.value()));
  const auto header = codec::make_header(codec::type_of(reply));
  sock_.send(zmq::buffer(frames[0].to_string_view()), zmq::send_flags::sndmore);
  sock_.send(zmq::buffer(header), zmq::send_flags::sndmore);
  sock_.send(zmq::buffer(codec::encode_body(reply)));
  return std::get<codec::hello>(hello.value());
}

codec::task_event until_event(raw_peer& coord, const std::string& name,
                              std::vector<codec::task_event>* seen) {
  while (true) {
    auto e = coord.recv_a<codec::task_event>(5000ms);
    REQUIRE(e);
    if (seen != nullptr) seen->push_back(*e);
    if (e->event == name) return *e;
  }
}

std::string flag_map(std::string_view key, bool value) {
  msgpack::sbuffer b;
  msgpack::packer pk(b);
  pk.pack_map(1).pack(key).pack(value);
  return {b.data(), b.size()};
}

std::string nested_map(std::size_t levels) {
  if (levels <= 1) return "\x80";
  return "\x81\xa1x" + std::string(levels - 2, '\x91') + "\x90";
}

std::vector<std::string> data_ids(const std::vector<codec::task_event>& events) {
  std::vector<std::string> out;
  const auto id_of = [&](std::string_view item) {
    codec::detail::field_reader r(item, {});
    std::string id;
    r.str("data_id", id, 256);
    REQUIRE_FALSE(r.fault());
    out.push_back(std::move(id));
  };
  for (const auto& e : events) {
    if (e.event == "data") id_of(e.body);
    if (e.event != "data_batch") continue;
    const auto batch = codec::read_data_batch_body(e.body);
    REQUIRE(batch);
    for (const auto& item : batch.value().items) id_of(item.bytes);
  }
  return out;
}

std::string event_peer_id(const codec::event& e) {
  if (const auto* j = std::get_if<codec::peer_joined>(&e.body)) return j->id;
  if (const auto* g = std::get_if<codec::peer_gone>(&e.body)) return g->id;
  if (const auto* q = std::get_if<codec::worker_quarantine>(&e.body)) return q->id;
  return "";
}

}  // namespace rlbus::test
