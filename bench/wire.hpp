// Protocol-level clients for the bench: a DEALER that speaks rlbus frames through the codec
// (no SDK threads in the way, so what it measures is the broker), frames encoded once and
// sent many times, and the cheap reads the bench's receivers need on their hot path.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <zmq.hpp>

#include "codec/codec.hpp"
#include "rlbus/coordinator.hpp"
#include "rlbus/types.hpp"

namespace rlbus::bench {

/// One message as its two wire frames (header, body).
struct frames {
  std::string header;
  std::string body;
};

/// Encodes `m` once, canonically.
frames encode(const codec::message& m);

/// A msgpack bin of `size` bytes (a DATA_REPLY / DATA payload the broker passes on as is).
std::string bin_blob(std::size_t size);

/// The `seq` of a canonical TASK_EVENT body without decoding the rest (it is the first
/// field); nullopt when the body does not start that way.
std::optional<std::uint64_t> peek_seq(std::string_view body);

/// The uint field `key` of a msgpack map body (decoded under the protocol's limits).
std::optional<std::uint64_t> map_uint(std::string_view body, std::string_view key);

/// A DEALER that sends and receives whole protocol messages. Owned by one thread at a
/// time; setup errors (a refusal, a silent broker) throw std::runtime_error.
class wire_peer {
 public:
  /// With `keys`, the connection speaks CURVE.
  wire_peer(zmq::context_t& ctx, const std::string& endpoint,
            const rlbus::curve_keys* keys = nullptr);

  void send(const codec::message& m);
  void send(const frames& f);
  /// The next message within `timeout` (nullopt on timeout). Throws on a malformed one.
  /// Every TASK_EVENT read here advances last_seq() and counts a jump as a gap.
  std::optional<codec::message> recv(std::chrono::milliseconds timeout);
  /// The next message of type T, skipping others; throws on ERROR or timeout.
  template <class T>
  T expect(const char* what, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      auto m = recv(left(deadline));
      if (!m) fail(std::string("no ") + what + " within the deadline");
      if (auto* t = std::get_if<T>(&*m)) return std::move(*t);
      if (const auto* e = std::get_if<codec::error>(&*m))
        fail(std::string("ERROR ") + std::to_string(e->code) + " " + e->reason + " waiting for " +
             what);
    }
  }
  /// HELLO with the longest heartbeat, so setup needs no heartbeats; waits for WELCOME.
  void hello(rlbus::role r, const std::string& id, rlbus::resources res = {});

  [[nodiscard]] std::uint64_t last_seq() const noexcept { return last_seq_; }
  [[nodiscard]] std::uint64_t gaps() const noexcept { return gaps_; }
  zmq::socket_t& socket() noexcept { return sock_; }

 private:
  static std::chrono::milliseconds left(std::chrono::steady_clock::time_point deadline);
  [[noreturn]] static void fail(const std::string& why);
  zmq::socket_t sock_;
  std::uint64_t last_seq_ = 0;
  std::uint64_t gaps_ = 0;
  int rcvtimeo_ = -1;
};

/// The SDK coordinator's task_spec for the same task as the protocol-level SUBMIT `t`.
inline rlbus::task_spec spec_of(const codec::submit& t) {
  return {t.task_id,          t.kind,
          t.task_info,        t.requirements,
          t.start_timeout_ms, t.step_timeout_ms,
          t.close_timeout_ms, t.task_timeout_ms};
}

}  // namespace rlbus::bench
