// The loop every SDK role runs on its I/O thread: one session (HELLO, heartbeats, reconnects),
// a wake-up pipe that the role's other threads poke when they queue something, and the role's
// own outbox, flushed after every turn. The worker and the coordinator differ only in what
// they queue and in what they do with the messages the session hands them.
#pragma once

#include <array>
#include <atomic>
#include <functional>

#include <zmq.hpp>

#include "client/session.hpp"
#include "util/clock.hpp"
#include "util/poll.hpp"
#include "util/wake_pipe.hpp"

namespace rlbus::client::detail {

struct io_hooks {
  /// Sends what the role queued while the session is ready; false when the socket's queue
  /// was full with more to send (the loop then also wakes when the socket takes more).
  std::function<bool(session&)> flush;
  /// Optional: one more descriptor to watch (-1: none) and what to do when it is readable;
  /// on_extra returns whether to keep watching it.
  int extra_fd = -1;
  std::function<bool()> on_extra;
};

/// Runs `s` until `stop`: polls its socket, `wake` and the extra descriptor, reads what
/// came, runs the session's timers and flushes the outbox once per turn, however many
/// messages the other threads queued meanwhile. Flushes once more, then says DISCONNECT.
inline void run_io_loop(session& s, const util::wake_pipe& wake, const std::atomic<bool>& stop,
                        io_hooks hooks) {
  s.start(util::clock::now());
  bool blocked = false;  // the socket's queue was full: wait until it takes more
  while (!stop.load(std::memory_order_relaxed)) {
    auto socket = s.pollitem();
    if (blocked) socket.events |= ZMQ_POLLOUT;
    const bool extra = hooks.extra_fd >= 0;
    std::array<zmq::pollitem_t, 3> items{socket,
                                         zmq::pollitem_t{nullptr, wake.read_fd(), ZMQ_POLLIN, 0},
                                         zmq::pollitem_t{nullptr, hooks.extra_fd, ZMQ_POLLIN, 0}};
    util::poll(items.data(), extra ? 3 : 2,
               util::poll_timeout_ms(util::clock::now(), s.next_timer()));
    if ((items[1].revents & ZMQ_POLLIN) != 0) wake.drain();
    if (extra && hooks.on_extra && !hooks.on_extra()) hooks.extra_fd = -1;
    if ((items[0].revents & ZMQ_POLLIN) != 0) s.on_readable(util::clock::now());
    s.on_timers(util::clock::now());
    blocked = !hooks.flush(s);
  }
  hooks.flush(s);
  s.stop();
}

}  // namespace rlbus::client::detail
