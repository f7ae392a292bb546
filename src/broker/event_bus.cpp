// See event_bus.hpp.
#include "broker/event_bus.hpp"

#include "codec/codec.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

event_bus::event_bus(zmq::context_t& ctx, const std::string& endpoint, std::uint64_t epoch)
    : pub_(ctx, zmq::socket_type::pub), epoch_(epoch) {
  pub_.set(zmq::sockopt::sndhwm, 100'000);
  pub_.set(zmq::sockopt::linger, 0);
  pub_.bind(endpoint);
}

std::uint64_t event_bus::publish(std::string_view topic, decltype(codec::event::body) body) {
  codec::event e;
  e.seq = ++seq_;
  e.epoch = epoch_;
  e.ts_ms = util::wall_ms();
  e.body = std::move(body);
  buf_.clear();
  codec::encode_event(e, buf_);
  const auto header = codec::make_header(codec::msg_type::event);
  pub_.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  pub_.send(zmq::buffer(header), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  pub_.send(zmq::const_buffer(buf_.data(), buf_.size()), zmq::send_flags::dontwait);
  return e.seq;
}

std::string event_bus::endpoint() const {
  return pub_.get(zmq::sockopt::last_endpoint);
}

}  // namespace rlbus::broker
