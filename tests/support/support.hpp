// Test helpers: waiting on conditions with deadlines (never sleep-and-hope), an in-process
// broker on ephemeral endpoints, a raw DEALER that speaks frames by hand, and an event
// listener on the broker's PUB.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "broker/core/server.hpp"
#include "codec/codec.hpp"
#include "rlbus/types.hpp"

namespace rlbus::test {

using namespace std::chrono_literals;

/// Polls `pred` every millisecond until it holds or `timeout` passes.
template <class Pred>
bool wait_until(Pred&& pred, std::chrono::milliseconds timeout = 5000ms) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

/// A broker config for tests: ephemeral tcp ports (or fresh ipc paths), fast timers.
broker::config test_config(const std::string& transport = "tcp");

/// The binary an environment variable names (the meson tests set RLBUS_BROKER_BIN and the
/// like); fails the test when it is unset.
std::string binary_from_env(const char* name);

/// The broker binary under test ($RLBUS_BROKER_BIN).
inline std::string broker_bin() {
  return binary_from_env("RLBUS_BROKER_BIN");
}

/// Whether `needle` occurs in `haystack`.
inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

/// first, first + 1, ..., last.
inline std::vector<std::uint64_t> range(std::uint64_t first, std::uint64_t last) {
  std::vector<std::uint64_t> out;
  for (auto s = first; s <= last; ++s) out.push_back(s);
  return out;
}

/// The bytes a hex string spells ("a1ff" -> "\xa1\xff").
inline std::string unhex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

/// A fresh ipc:// endpoint path under /tmp.
std::string ipc_endpoint(const std::string& tag);

/// All frames of the next message on `sock` within `timeout`; empty if none came.
std::vector<zmq::message_t> recv_frames(zmq::socket_t& sock, std::chrono::milliseconds timeout);

/// A DEALER that sends and receives protocol frames by hand.
class raw_peer {
 public:
  /// With `keys`, the connection speaks CURVE (SPEC §15).
  raw_peer(zmq::context_t& ctx, const std::string& endpoint,
           const rlbus::curve_keys* keys = nullptr);
  void send_frames(const std::vector<std::string>& frames);
  void send(const codec::message& m);
  /// A message with a payload frame (PUBLISH, SPEC §17.1.1).
  void send(const codec::message& m, std::string_view payload);
  /// The payload frame of the last message recv() returned ("" when it had none).
  [[nodiscard]] const std::string& payload() const { return payload_; }
  /// Next message (any type) within `timeout`; fails the test if it is malformed.
  std::optional<codec::message> recv(std::chrono::milliseconds timeout = 3000ms);
  /// Next message of type T within `timeout`, skipping others (e.g. HEARTBEATs).
  template <class T>
  std::optional<T> recv_a(std::chrono::milliseconds timeout = 3000ms) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto m = recv(left);
      if (!m) return std::nullopt;
      if (auto* t = std::get_if<T>(&*m)) return *t;
    }
  }
  /// HELLO and wait for WELCOME; returns it (fails the test on anything else).
  codec::welcome introduce(const std::string& id, rlbus::role r = rlbus::role::collector,
                           std::uint32_t heartbeat_ms = 1000);
  zmq::socket_t& socket() { return sock_; }
  /// A coordinator gets CAPACITY (SPEC §12.10) whenever a worker joins or goes and as its
  /// session begins; tests of anything else would have to step over them, so a raw_peer drops
  /// them unless a test asks to see them.
  void keep_capacity(bool keep = true) { keep_capacity_ = keep; }
  /// All frames of the next message within `timeout` (CAPACITY dropped unless kept); empty
  /// if none came.
  std::vector<zmq::message_t> recv_message(std::chrono::milliseconds timeout);

 private:
  zmq::socket_t sock_;
  bool keep_capacity_ = false;
  std::string payload_;
};

/// Sets a socket's CURVE client keys (before it connects).
void use_curve(zmq::socket_t& s, const rlbus::curve_keys& keys);

/// A SUB on the broker's PUB that collects decoded events.
class event_listener {
 public:
  /// Subscribes to everything and waits for the first broker.heartbeat, so the
  /// subscription is known to be live before the test goes on.
  event_listener(zmq::context_t& ctx, const std::string& endpoint);
  /// The next event whose topic equals `topic` (and satisfies `pred`), within `timeout`.
  template <class Pred>
  std::optional<codec::event> next(const std::string& topic, Pred&& pred,
                                   std::chrono::milliseconds timeout = 5000ms) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      auto e = next_any(deadline);
      if (!e) return std::nullopt;
      if (e->topic == topic && pred(*e)) return e;
    }
  }
  std::optional<codec::event> next(const std::string& topic,
                                   std::chrono::milliseconds timeout = 5000ms) {
    return next(
        topic, [](const codec::event&) { return true; }, timeout);
  }
  /// Every event seen so far, in arrival order.
  const std::vector<codec::event>& seen() const { return seen_; }

 private:
  std::optional<codec::event> next_any(std::chrono::steady_clock::time_point deadline);
  zmq::socket_t sock_;
  std::vector<codec::event> seen_;
};

/// A ROUTER that plays the broker's part by hand, to show a client what a real broker
/// would not do (go silent, refuse for good).
class fake_broker {
 public:
  explicit fake_broker(zmq::context_t& ctx);
  [[nodiscard]] const std::string& endpoint() const { return endpoint_; }
  /// Waits for the next HELLO and answers it with `reply`; returns the HELLO.
  codec::hello answer_hello(const codec::message& reply);

 private:
  zmq::socket_t sock_;
  std::string endpoint_;
};

/// Reads a coordinator's TASK_EVENTs until one named `name` (each event read is appended to
/// `seen` when given); fails the test if none comes within 5 s.
codec::task_event until_event(raw_peer& coord, const std::string& name,
                              std::vector<codec::task_event>* seen = nullptr);

/// A one-entry msgpack map {key: value}, the shape of DI-engine's done flags.
std::string flag_map(std::string_view key, bool value);

/// A msgpack map of `levels` (>= 1) levels of maps and arrays, its own the first:
/// {"x": [[...[]...]]}.
std::string nested_map(std::size_t levels);

/// The data_id of every item the `data` and `data_batch` events among `events` carry, in
/// stream order (a worker batches DATA by itself when they wait together, SPEC §12.12.5).
std::vector<std::string> data_ids(const std::vector<codec::task_event>& events);

/// The id a peer_joined / peer_gone / worker_quarantine event is about ("" for others).
std::string event_peer_id(const codec::event& e);

}  // namespace rlbus::test
