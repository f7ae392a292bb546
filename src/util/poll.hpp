// zmq::poll (and a non-blocking receive) that treat a signal's interruption (EINTR) as an ordinary
// early wake-up: the broker's signal handler interrupts the poll on purpose; and reading the
// rest of a peer's message whole.
#pragma once

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>

#include <zmq.hpp>

namespace rlbus::util {

/// Polls `count` items for up to `timeout_ms`; returns how many are ready (0 on EINTR).
inline int poll(zmq::pollitem_t* items, std::size_t count, long timeout_ms) {
  try {
    return zmq::poll(items, count, std::chrono::milliseconds(timeout_ms));
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;
    throw;
  }
}

/// A non-blocking receive of one frame: false when nothing is queued, or when a signal
/// interrupted libzmq's look at its commands (the loop looks again on its next turn).
inline bool try_recv(zmq::socket_t& s, zmq::message_t& m) {
  try {
    return s.recv(m, zmq::recv_flags::dontwait).has_value();
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    throw;
  }
}

/// The most frames a peer's message has: routing id, header, body, a payload (SPEC §17.1.1).
inline constexpr std::size_t max_frames = 4;
using frame_array = std::array<zmq::message_t, max_frames>;

/// What read_rest kept: how many frames, and whether more came (read and dropped).
struct frames_read {
  std::size_t count = 1;
  bool overflow = false;
};

/// Reads the rest of the multipart message whose first frame is `frames[0]` (the rest of a
/// multipart message is always there at once), so the next receive starts a new message
/// however many frames a peer sent.
inline frames_read read_rest(zmq::socket_t& s, frame_array& frames) {
  std::size_t count = 1;
  bool overflow = false;
  bool more = frames[0].more();
  zmq::message_t extra;
  while (more) {
    zmq::message_t& dst = count < max_frames ? frames[count] : extra;
    (void)s.recv(dst, zmq::recv_flags::none);
    more = dst.more();
    if (count < max_frames)
      ++count;
    else
      overflow = true;
  }
  return {count, overflow};
}

}  // namespace rlbus::util
