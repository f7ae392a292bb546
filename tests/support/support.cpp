// See support.hpp.
#include "support/support.hpp"

#include <unistd.h>

#include <atomic>

#include <catch2/catch.hpp>

namespace rlbus::test {

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
  return cfg;
}

std::string ipc_endpoint(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "ipc:///tmp/rlbus-test-" + std::to_string(::getpid()) + "-" + tag + "-" +
         std::to_string(counter++);
}

raw_peer::raw_peer(zmq::context_t& ctx, const std::string& endpoint)
    : sock_(ctx, zmq::socket_type::dealer) {
  sock_.set(zmq::sockopt::linger, 0);
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

std::optional<codec::message> raw_peer::recv(std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
  std::vector<zmq::message_t> frames;
  do {
    frames.emplace_back();
    (void)sock_.recv(frames.back(), zmq::recv_flags::none);
  } while (frames.back().more());
  REQUIRE(frames.size() == 2);
  const auto h = codec::parse_header(frames[0].to_string_view());
  REQUIRE(h);
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
  zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0 || zmq::poll(&item, 1, left) == 0) return std::nullopt;
  std::vector<zmq::message_t> frames;
  do {
    frames.emplace_back();
    (void)sock_.recv(frames.back(), zmq::recv_flags::none);
  } while (frames.back().more());
  REQUIRE(frames.size() == 3);
  const auto h = codec::parse_header(frames[1].to_string_view());
  REQUIRE(h);
  REQUIRE(h->type == static_cast<std::uint8_t>(codec::msg_type::event));
  auto e = codec::decode_event(frames[0].to_string_view(), frames[2].to_string_view());
  REQUIRE(e);
  seen_.push_back(e.value());
  return std::move(e).value();
}

std::string event_peer_id(const codec::event& e) {
  if (const auto* j = std::get_if<codec::peer_joined>(&e.body)) return j->id;
  if (const auto* g = std::get_if<codec::peer_gone>(&e.body)) return g->id;
  return "";
}

}  // namespace rlbus::test
