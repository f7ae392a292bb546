// The part of the SDK every role shares: the I/O thread that owns the session (HELLO,
// heartbeats, reconnects) and its socket, the outbox the role's other threads fill (and the
// wake-up that tells the I/O thread), and the connection as the user sees it: its state,
// wait_for, the session token, the welcome count and the last error. rlbus::worker and
// rlbus::coordinator are roles on this core: they say what to do with the messages the session
// hands up and, when plain in-order sending is not enough, how the outbox is flushed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "client/core/session.hpp"
#include "codec/messages.hpp"
#include "rlbus/connection.hpp"
#include "util/wake_pipe.hpp"

namespace rlbus::client::detail {

class core {
 public:
  struct role_hooks {
    /// I/O thread, mu() not held: a task-layer message, or the WELCOME that made the session
    /// ready (after the state changed).
    std::function<void(codec::message&&)> on_message;
    /// I/O thread, mu() held, once per turn of the loop: sends what the outbox holds while the
    /// session is ready; false when the socket's queue filled with more to send (the loop then
    /// also wakes when it takes more). Unset: send_in_order().
    std::function<bool(session&)> flush;
    /// Optional: one more descriptor to watch (-1: none) and what to do when it is readable;
    /// on_extra returns whether to keep watching it.
    int extra_fd = -1;
    std::function<bool()> on_extra;
    /// I/O thread, mu() not held: a message that came with a payload frame (DELIVER) and the
    /// frame. Unset: such messages are dropped.
    std::function<void(codec::message&&, zmq::message_t&&)> on_payload_message;
  };

  /// `opts` must be valid (validate()). At most `max_outbox` messages wait in the outbox.
  core(session_options opts, std::size_t max_outbox);
  /// Stops (see stop()).
  ~core();
  core(const core&) = delete;
  core& operator=(const core&) = delete;

  /// Starts the I/O thread: the session connects. Once, after the role is ready for its hooks.
  void start(role_hooks hooks);
  /// Flushes the outbox once more, says DISCONNECT (when ready), closes the socket and joins
  /// the I/O thread; state() is then stopped. Idempotent.
  void stop();

  // ---- the outbox: messages for the broker, sent in order ----
  /// Guards the outbox and whatever the role keeps beside it (one lock for both, so that the
  /// role can decide and queue in one step).
  [[nodiscard]] std::mutex& mu() const noexcept { return mu_; }
  /// mu() held.
  [[nodiscard]] std::deque<codec::message>& outbox() noexcept { return outbox_; }
  [[nodiscard]] bool outbox_full() const noexcept { return outbox_.size() >= max_outbox_; }
  /// Queues `m` (mu() held); false, with nothing queued, when the outbox is full. True in
  /// `wake_needed` when the I/O thread must be woken (wake()) once the lock is let go: only
  /// when the outbox was empty, since otherwise a wake-up is on its way, or the I/O thread is
  /// about to flush, or it waits for the socket to take more.
  bool queue(codec::message m, bool& wake_needed);
  /// queue() under the lock, and the wake-up it needs.
  bool post(codec::message m);
  /// Tells the I/O thread to flush (from any thread).
  void wake() const { wake_.notify(); }
  /// Sends the outbox in order while the session is ready (I/O thread, mu() held); as flush.
  bool send_in_order(session& s);

  // ---- the connection ----
  [[nodiscard]] connection_state state() const;
  /// Blocks until state() == s or `timeout` passes; returns whether it got there.
  [[nodiscard]] bool wait_for(connection_state s, std::chrono::milliseconds timeout) const;
  /// The broker's session token, 0 before the first WELCOME.
  [[nodiscard]] std::uint64_t token() const;
  /// How many times the broker welcomed this client (1 + reconnects that succeeded).
  [[nodiscard]] std::uint64_t welcomes() const;
  /// The last error or refusal the broker sent (or why a connection was given up), "" if none.
  [[nodiscard]] std::string last_error() const;

 private:
  void run(role_hooks hooks);
  void on_state(connection_state st, std::uint64_t token, const std::string& detail);

  session_options opts_;
  std::size_t max_outbox_;
  zmq::context_t ctx_{1};
  util::wake_pipe wake_;
  mutable std::mutex mu_;
  std::deque<codec::message> outbox_;
  std::atomic<bool> stopping_{false};
  std::thread io_thread_;

  mutable std::mutex state_mu_;  // the connection's state as the user sees it
  mutable std::condition_variable state_changed_;
  connection_state state_ = connection_state::connecting;
  std::uint64_t token_ = 0;
  std::uint64_t welcomes_ = 0;
  std::string last_error_;
};

}  // namespace rlbus::client::detail
