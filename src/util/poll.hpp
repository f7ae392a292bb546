// zmq::poll (and a non-blocking receive) that treat a signal's interruption (EINTR) as an ordinary
// early wake-up: the broker's signal handler interrupts the poll on purpose.
#pragma once

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

}  // namespace rlbus::util
