// rlbus::worker: a collector or learner process's connection to the broker.
//
// A worker connects, introduces itself (HELLO with its role, id and resources), heartbeats
// on its own, notices a silent broker (liveness x heartbeat without a word) and reconnects
// with capped exponential backoff, resuming its session when the broker still holds it.
//
// Threads: the constructor starts one background I/O thread that owns the ZeroMQ socket;
// no socket is ever touched by the caller's thread. Every public member is safe to call
// from any thread. Task handlers (start / learn / close) arrive with the task protocol.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "rlbus/types.hpp"

namespace rlbus {

/// Where a connection stands. connecting covers "waiting to retry" too.
enum class connection_state {
  connecting,  // no session yet (first attempt, or reconnecting after a loss)
  ready,       // the broker welcomed this worker and heartbeats flow
  refused,     // the broker refused the worker for good (see last_error()); no more retries
  stopped,     // stop() ran, or the destructor
};

std::string_view to_string(connection_state s) noexcept;

struct worker_options {
  /// The broker's ROUTER endpoint.
  std::string endpoint = "tcp://127.0.0.1:7235";
  /// collector or learner.
  rlbus::role role = rlbus::role::collector;
  /// Unique among live peers on the broker: 1-128 characters of A-Z a-z 0-9 . _ : @ / -.
  std::string id;
  /// What this worker offers (e.g. {"cpu", 4}, {"gpu", 1}); tasks will be matched on it.
  rlbus::resources resources;
  /// Heartbeat interval asked of the broker, which may clamp it (the agreed one is used).
  std::chrono::milliseconds heartbeat{1000};
  /// Reconnect backoff: first delay, doubled per failed attempt up to the cap (+0-25% jitter).
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
};

class worker {
 public:
  /// Validates `opts` (throws std::invalid_argument naming the bad option) and starts
  /// connecting in the background. Never blocks on the network.
  explicit worker(worker_options opts);
  /// Stops (see stop()).
  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
  worker(worker&&) noexcept;
  worker& operator=(worker&&) noexcept;

  [[nodiscard]] connection_state state() const;
  /// Blocks until state() == s or `timeout` passes; returns whether it got there.
  [[nodiscard]] bool wait_for(connection_state s, std::chrono::milliseconds timeout) const;
  /// The broker's session token, 0 before the first WELCOME.
  [[nodiscard]] std::uint64_t session() const;
  /// How many times the broker has welcomed this worker (1 + reconnects that succeeded).
  [[nodiscard]] std::uint64_t welcomes() const;
  /// The last error or refusal the broker sent, "" if none.
  [[nodiscard]] std::string last_error() const;
  [[nodiscard]] const worker_options& options() const;

  /// Says DISCONNECT to the broker (when connected), closes the socket and joins the I/O
  /// thread. Idempotent; afterwards state() is stopped.
  void stop();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace rlbus
