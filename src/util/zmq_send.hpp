// Sending an encoded body as the last frame of a message: small bodies are copied into the
// ZeroMQ message (cheap, and the buffer keeps its capacity for the next one); a large one is
// handed over as it is (its buffer becomes the message's and is freed by libzmq), so a
// payload of a megabyte is not copied once more on its way out.
//
// A body that may be sent more than once (a coordinator stream's held event, sent again on a
// replay) is kept as `shared_frame`: a large one lives in a buffer that every ZeroMQ message
// carrying it shares, so no send copies it.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include <msgpack.hpp>
#include <zmq.hpp>

#include "util/send_meter.hpp"

namespace rlbus::util {

inline constexpr std::size_t zero_copy_from = std::size_t{64} * 1024;

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

/// The same, charged to `a` of `meter` until libzmq lets go of it (see send_meter.hpp).
inline void send_last_frame(zmq::socket_t& s, send_meter& meter, send_meter::account& a,
                            msgpack::sbuffer& body) {
  if (body.size() < zero_copy_from) {
    meter.send_last(s, a, {body.data(), body.size()});
    return;
  }
  const auto size = body.size();
  char* data = body.release();
  meter.send_last_shared(s, a, {data, size}, data, [](void* d) { std::free(d); });
}

/// The same frame, not sent: for a message held back before it is sent.
inline zmq::message_t charged_frame(send_meter& meter, send_meter::account& a,
                                    msgpack::sbuffer& body) {
  if (body.size() < zero_copy_from) return meter.charge(a, {body.data(), body.size()});
  const auto size = body.size();
  char* data = body.release();
  return meter.charge_shared(a, {data, size}, data, [](void* d) { std::free(d); });
}

/// Encoded bytes kept to be sent, maybe more than once. Empty when default-made.
class shared_frame {
 public:
  shared_frame() = default;
  explicit shared_frame(std::string bytes) {
    if (bytes.size() < zero_copy_from) {
      small_ = std::move(bytes);
    } else {
      large_ = std::make_shared<const std::string>(std::move(bytes));
    }
  }
  [[nodiscard]] std::string_view view() const noexcept {
    return large_ ? std::string_view(*large_) : std::string_view(small_);
  }
  [[nodiscard]] std::size_t size() const noexcept { return view().size(); }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  /// Sends the bytes as the last frame on `s`, as send_last_frame does.
  void send_last(zmq::socket_t& s) const {
    if (!large_) {
      s.send(zmq::const_buffer(small_.data(), small_.size()), zmq::send_flags::none);
      return;
    }
    // The message holds a reference of its own, dropped by libzmq (on its I/O thread: the
    // count is atomic) once the bytes are sent.
    using ref = std::shared_ptr<const std::string>;
    auto held = std::make_unique<ref>(large_);
    zmq::message_t m(
        const_cast<char*>(large_->data()), large_->size(),
        [](void* /*data*/, void* hint) { delete static_cast<ref*>(hint); }, held.get());
    (void)held.release();  // the message owns it now
    s.send(m, zmq::send_flags::none);
  }
  /// The same, charged to `a` of `meter` until libzmq lets go of it.
  void send_last(zmq::socket_t& s, send_meter& meter, send_meter::account& a) const {
    auto m = charged(meter, a);
    s.send(m, zmq::send_flags::none);
  }
  /// The frame send_last() sends, not sent.
  [[nodiscard]] zmq::message_t charged(send_meter& meter, send_meter::account& a) const {
    if (!large_) return meter.charge(a, small_);
    using ref = std::shared_ptr<const std::string>;
    return meter.charge_shared(a, *large_, new ref(large_),
                               [](void* r) { delete static_cast<ref*>(r); });
  }

 private:
  std::string small_;
  std::shared_ptr<const std::string> large_;
};

}  // namespace rlbus::util
