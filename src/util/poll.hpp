// zmq::poll that treats a signal's interruption (EINTR) as an ordinary early wake-up:
// the broker's signal handler interrupts the poll on purpose.
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

}  // namespace rlbus::util
