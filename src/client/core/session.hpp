// The client side of protocol v1, shared by every SDK role: one DEALER to the broker,
// HELLO -> WELCOME, heartbeats, broker-silence detection and reconnection with backoff.
//
// Not thread-safe: one thread (the SDK's I/O thread) owns a session and drives it by
// polling pollitem(), calling on_readable() and on_timers(), and sleeping no longer than
// next_timer(). State changes are reported through the callback given at construction.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <msgpack.hpp>
#include <zmq.hpp>

#include "codec/messages.hpp"
#include "rlbus/connection.hpp"
#include "rlbus/types.hpp"
#include "util/clock.hpp"

namespace rlbus::client::detail {

struct session_options {
  /// One broker, or the brokers of a group separated by commas (SPEC §14.9.2).
  std::string endpoint;
  rlbus::role role = rlbus::role::collector;
  std::string id;
  rlbus::resources resources;
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
  std::optional<rlbus::curve_keys> curve;  // unset: plain
};

/// Throws std::invalid_argument naming the first bad option.
void validate(const session_options& o);

/// The payload frame of a PUBLISH (SPEC §17.1.1): `size` bytes at `offset` of `bytes`, kept
/// alive until libzmq has sent them, so a large payload (or a fragment of one) is not copied
/// on its way out, however many times it is sent.
struct payload_frame {
  std::shared_ptr<const std::string> bytes;
  std::size_t offset = 0;
  std::size_t size = 0;
};

class session {
 public:
  /// Called on every state change (and on an ERROR that changes nothing) with the session
  /// token and a human-readable detail (e.g. the refusal reason, "" when there is none).
  using state_callback =
      std::function<void(connection_state, std::uint64_t token, const std::string& detail)>;

  /// Called with every message that is not part of the session layer (task messages), and
  /// with each WELCOME that makes the session ready (after the state callback).
  using message_callback = std::function<void(codec::message&&)>;

  /// Called with every message that comes with a payload frame (DELIVER, SPEC §17.1.1) and
  /// that frame; such messages never reach the message callback.
  using payload_callback = std::function<void(codec::message&&, zmq::message_t&&)>;

  session(zmq::context_t& ctx, session_options opts, state_callback on_state,
          message_callback on_message = {}, payload_callback on_payload = {});
  /// Stops the socket's monitor before either closes: libzmq would otherwise go on reporting
  /// to a monitor nobody reads, which can block the context's I/O thread for good.
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// Sends one message if the session is ready; false otherwise (nothing is queued).
  bool send_ready(const codec::message& m);
  /// The same with a payload frame after the body (PUBLISH).
  bool send_ready(const codec::message& m, const payload_frame& payload);

  /// Opens the socket and sends HELLO.
  void start(util::time_point now);
  /// The socket to poll; fd -1 / null socket while waiting to reconnect.
  [[nodiscard]] zmq::pollitem_t pollitem();
  /// Reads and handles everything queued on the socket.
  void on_readable(util::time_point now);
  /// Sends due heartbeats, notices a silent broker, reconnects after backoff.
  void on_timers(util::time_point now);
  [[nodiscard]] util::time_point next_timer() const;
  /// Says DISCONNECT (when ready) and closes the socket; the session is then stopped.
  void stop();

  [[nodiscard]] connection_state state() const noexcept { return state_; }
  [[nodiscard]] std::uint64_t token() const noexcept { return token_; }

 private:
  void open(util::time_point now);
  void close_socket();
  /// Reads the socket's monitor: a failed handshake (why no WELCOME comes) or a refused TCP
  /// connection.
  void read_monitor();
  /// Why the socket's last handshake failed, from its monitor ("" when none did).
  [[nodiscard]] std::string handshake_failure();
  /// Whether a connection that is lost, or that got no WELCOME, sends the next one to the
  /// next broker: more than one in the list, or one named by a NOT_LEADER.
  [[nodiscard]] bool rotating() const noexcept { return endpoints_.size() > 1 || followed_; }
  /// The next attempt goes to the next endpoint of the list.
  void next_endpoint();
  /// ERROR 421 (SPEC §14.9.2): go to the leader it names, else to the next endpoint.
  void follow(const codec::error& e, util::time_point now, const std::string& detail);
  [[nodiscard]] std::chrono::milliseconds hello_timeout() const;
  [[nodiscard]] std::chrono::milliseconds broker_silence() const;
  void retry_later(util::time_point now, const std::string& why);
  void revoked(util::time_point now, const std::string& detail);
  void handle(codec::message&& m, util::time_point now);
  void set_state(connection_state s, const std::string& detail);
  /// Waiting for a WELCOME: connecting before the first one, reconnecting after.
  [[nodiscard]] bool waiting() const noexcept {
    return state_ == connection_state::connecting || state_ == connection_state::reconnecting;
  }
  [[nodiscard]] connection_state waiting_state() const noexcept {
    return welcomed_ ? connection_state::reconnecting : connection_state::connecting;
  }
  bool send(const codec::message& m, const payload_frame* payload = nullptr);

  zmq::context_t& ctx_;
  session_options opts_;
  state_callback on_state_;
  message_callback on_message_;
  payload_callback on_payload_;
  std::optional<zmq::socket_t> socket_;
  std::optional<zmq::socket_t> monitor_;  // the socket's handshake failures
  std::vector<std::string> endpoints_;    // the list, in order
  std::size_t next_ = 0;                  // the one the next attempt takes
  std::string leader_;                    // a NOT_LEADER's leader, for the next attempt
  std::string current_;                   // the endpoint of this socket
  bool followed_ = false;                 // this socket goes to a NOT_LEADER's leader
  std::uint64_t leader_epoch_ = 0;        // the highest leadership epoch seen
  std::string handshake_why_;             // the monitor's latest handshake failure
  bool refused_ = false;                  // the monitor saw the TCP connection refused
  connection_state state_ = connection_state::connecting;
  std::uint64_t token_ = 0;
  bool welcomed_ = false;  // a WELCOME came once: a lost connection is then "reconnecting"
  std::chrono::milliseconds heartbeat_;
  std::uint32_t liveness_ = 3;
  unsigned attempt_ = 0;
  std::string revoked_;  // the DISCONNECT or ERROR 431 since the last WELCOME, if any
  util::time_point hello_deadline_{};
  util::time_point next_heartbeat_{};
  util::time_point broker_deadline_{};
  std::optional<util::time_point> reconnect_at_;
  std::minstd_rand jitter_;
  msgpack::sbuffer out_;
};

}  // namespace rlbus::client::detail
