// rlbus::bus: a node of the broker's topic bus (SPEC §17): publish payloads on topics and
// receive what other nodes publish, lossless and in order.
//
// A bus is one session of role `bus`. Like the other roles it connects in the background,
// heartbeats, notices a silent broker and reconnects with capped exponential backoff,
// resuming its session when the broker still holds it. What it guarantees (SPEC §17.10):
//
// - subscribe() and unsubscribe() return once the broker has the change in force: whatever
//   is published after subscribe() returned reaches this node. Subscriptions are kept and
//   made again by themselves when the broker begins a new session for the node.
// - publish() waits for the broker's credit, so a slow subscriber slows its publishers down
//   instead of losing messages. A payload larger than one message travels in fragments.
//   Every publication is kept until the broker has taken it and sent again after a
//   resumption.
// - recv() hands out publications in the broker's order, each once, fragments joined. The
//   broker's window is acknowledged only for what the caller took, so a node that stops
//   reading holds back the publishers of what it subscribed to.
// - What the broker had to drop is counted in lost(); a new session (the broker restarted,
//   or the node was silent past its liveness window) in sessions_lost(), since what was in
//   flight then is gone.
//
// Threads: the constructor starts one background I/O thread that owns the ZeroMQ socket.
// Every public member is safe to call from any thread: several threads may publish (each
// thread's publications keep their order), subscribe and recv at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlbus/connection.hpp"
#include "rlbus/defaults.hpp"
#include "rlbus/types.hpp"

namespace rlbus {

struct bus_options {
  /// The broker's ROUTER endpoint, or the brokers of a group separated by commas
  /// ("tcp://a:7235,tcp://b:7235"): the client goes to the leader, and follows a takeover.
  std::string endpoint{defaults::router_endpoint};
  /// Unique among live peers on the broker: 1-128 characters of A-Z a-z 0-9 . _ : @ / -.
  /// Subscribers see it as the sender of this node's publications.
  std::string id;
  /// Heartbeat interval asked of the broker, which may clamp it (the agreed one is used).
  std::chrono::milliseconds heartbeat = defaults::heartbeat;
  /// Reconnect backoff: first delay, doubled per failed attempt up to the cap (+0-25% jitter).
  std::chrono::milliseconds reconnect_min = defaults::reconnect_min;
  std::chrono::milliseconds reconnect_max = defaults::bus_reconnect_max;
  /// CURVE keys when the broker has CURVE on (SPEC §15; curve_keys_from_files reads them);
  /// unset: plain.
  std::optional<rlbus::curve_keys> curve;
  /// The bytes of fragmented publications this node holds while they are incomplete; past
  /// it the largest is dropped, logged and counted in lost(). 256 MiB fits a small machine.
  std::size_t max_partial_bytes = std::size_t{256} << 20U;
};

/// One publication as a subscriber gets it.
struct bus_message {
  std::string topic;
  std::string payload;
  std::string sender;     // the publisher's node id
  bool retained = false;  // a topic's last value, delivered for a subscription with `last`
};

/// How a subscription matches (SPEC §17.2.2).
struct subscribe_options {
  /// true: every topic that begins with the subscription's topic (which may then be empty:
  /// every topic); false: that topic only.
  bool prefix = false;
  /// true: this node's own publications match too.
  bool echo = false;
  /// true: the retained values of the matching topics are delivered first (SPEC §17.7).
  bool last = false;
};

struct publish_options {
  /// true: the broker keeps the publication as its topic's last value (an empty payload
  /// clears it). Only a payload that fits in one message can be retained: a larger one is
  /// published in fragments, not retained.
  bool retain = false;
};

/// Why a call of the bus did not do what it was asked.
enum class bus_errc {
  none,     // it did
  timeout,  // the broker did not answer (or held this node back) within the timeout
  closed,   // the bus was closed before or while waiting
  refused,  // the broker refused it: bus_result::code and reason say why
};

/// "none", "timeout", "closed" or "refused".
std::string_view to_string(bus_errc e) noexcept;

/// The outcome of subscribe(), unsubscribe() and publish(): true when it worked.
struct [[nodiscard]] bus_result {
  bus_errc error = bus_errc::none;
  /// refused: the broker's code (431 UNAUTHORIZED, 440 TOO_MANY_SUBSCRIPTIONS, ...).
  std::uint16_t code = 0;
  /// What happened, for people ("" when it worked).
  std::string reason;
  [[nodiscard]] bool ok() const noexcept { return error == bus_errc::none; }
  explicit operator bool() const noexcept { return ok(); }
};

class bus {
 public:
  /// Validates `opts` (throws std::invalid_argument naming the bad option) and starts
  /// connecting in the background. Never blocks on the network.
  explicit bus(bus_options opts);
  /// Closes (see close()) with a timeout of 5 s.
  ~bus();
  bus(const bus&) = delete;
  bus& operator=(const bus&) = delete;
  bus(bus&&) noexcept;
  bus& operator=(bus&&) noexcept;

  /// Subscribes to `topic` and returns once the broker has it in force (or timed out, or
  /// refused: a refusal drops the subscription; after a timeout it is still made when it can
  /// be). Subscribing again to one held replaces its `echo`. Throws std::invalid_argument
  /// for a topic that breaks the topic rule (1-256 printable ASCII characters other than
  /// space; empty only with `prefix`).
  bus_result subscribe(std::string_view topic, subscribe_options o = {},
                       std::chrono::milliseconds timeout = std::chrono::seconds(30));
  /// Drops the subscription of `topic` of that kind; returns once the broker has.
  bus_result unsubscribe(std::string_view topic, bool prefix = false,
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));
  /// The subscriptions in force or being made, as (topic, prefix), sorted.
  [[nodiscard]] std::vector<std::pair<std::string, bool>> subscriptions() const;

  /// Publishes `payload` (any size; copied once) on `topic`. Returns once it is queued to
  /// leave; waits while the broker holds this node back (a subscriber of what it publishes
  /// is slow) for at most `timeout`, then fails with bus_errc::timeout and nothing queued.
  /// bus_errc::closed once closed. Throws std::invalid_argument for a bad topic.
  bus_result publish(std::string_view topic, std::string_view payload, publish_options o = {},
                     std::chrono::milliseconds timeout = std::chrono::seconds(60));
  /// Waits until the broker has taken everything published so far; false after `timeout`
  /// (logged, with how many are not taken: unsent()), or when the connection was refused or
  /// stopped.
  bool flush(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  /// Publications the broker has not taken yet (queued here, or sent and not taken).
  [[nodiscard]] std::size_t unsent() const;

  /// The next publication for this node, waiting as long as it takes; nullopt once closed
  /// (and what was received before is handed out).
  std::optional<bus_message> recv();
  /// The same, waiting at most `timeout`.
  std::optional<bus_message> recv(std::chrono::milliseconds timeout);

  /// Flushes (for up to `timeout`, when connected), says DISCONNECT and stops; a blocked
  /// recv() returns nullopt, and waiting subscribe/publish calls fail with closed. Returns
  /// how many publications the broker had not taken by then: they are dropped, logged and
  /// counted in lost() (0: everything was handed over). Idempotent (again: 0).
  std::size_t close(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  [[nodiscard]] bool closed() const;

  [[nodiscard]] connection_state state() const;
  /// Blocks until state() == s or `timeout` passes; returns whether it got there.
  [[nodiscard]] bool wait_for(connection_state s, std::chrono::milliseconds timeout) const;
  /// The broker's session token, 0 before the first WELCOME.
  [[nodiscard]] std::uint64_t session() const;
  /// How many times the broker has welcomed this node (1 + reconnects that succeeded).
  [[nodiscard]] std::uint64_t welcomes() const;
  /// The last error or refusal the broker sent, "" if none.
  [[nodiscard]] std::string last_error() const;
  /// Deliveries and publications the broker reported lost (a gap), that this node dropped
  /// (an incomplete publication past max_partial_bytes, or whose end never came), and its
  /// own publications that close() could not hand over.
  [[nodiscard]] std::uint64_t lost() const;
  /// New sessions after the first: the broker held nothing of this node any more, so what
  /// was in flight is gone, and how much of it is not known.
  [[nodiscard]] std::uint64_t sessions_lost() const;
  /// ERRORs the broker answered this node's messages with.
  [[nodiscard]] std::uint64_t errors() const;
  [[nodiscard]] const bus_options& options() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace rlbus
