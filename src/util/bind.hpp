// Binding an endpoint that a socket of this process closed a moment ago: libzmq closes a
// listener on its I/O thread, after zmq_close returns, so the port may still be taken for a
// few milliseconds (a broker of a group binds its ROUTER endpoint as a standby, then as the
// leader, then as a standby again). An endpoint taken for longer is another process's.
#pragma once

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "util/clock.hpp"

namespace rlbus::util {

inline constexpr std::chrono::milliseconds bind_wait{2000};

/// Binds `s` to `endpoint`, trying again while the address is in use, for up to `wait`;
/// throws zmq::error_t as bind() does once that passed.
inline void bind_freed(zmq::socket_t& s, const std::string& endpoint,
                       std::chrono::milliseconds wait = bind_wait) {
  const auto give_up = clock::now() + wait;
  while (true) {
    try {
      s.bind(endpoint);
      return;
    } catch (const zmq::error_t& e) {
      if (e.num() != EADDRINUSE || clock::now() >= give_up) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

}  // namespace rlbus::util
