// Sending an encoded body as the last frame of a message: small bodies are copied into the
// ZeroMQ message (cheap, and the buffer keeps its capacity for the next one); a large one is
// handed over as it is (its buffer becomes the message's and is freed by libzmq), so a
// payload of a megabyte is not copied once more on its way out.
#pragma once

#include <cstdlib>

#include <msgpack.hpp>
#include <zmq.hpp>

namespace rlbus::util {

inline constexpr std::size_t zero_copy_from = 64 * 1024;

/// Sends `body` as the last frame on `s` (which must take it: the frames before it were
/// queued). `body` is empty afterwards when it was handed over.
inline void send_last_frame(zmq::socket_t& s, msgpack::sbuffer& body) {
  if (body.size() < zero_copy_from) {
    s.send(zmq::const_buffer(body.data(), body.size()), zmq::send_flags::none);
    return;
  }
  const auto size = body.size();
  char* data = body.release();
  zmq::message_t m(
      data, size, [](void* d, void* /*hint*/) { std::free(d); }, nullptr);
  s.send(m, zmq::send_flags::none);
}

}  // namespace rlbus::util
