// See standby_door.hpp.
#include "broker/group/standby_door.hpp"

#include <array>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "codec/codec.hpp"
#include "util/bind.hpp"
#include "util/poll.hpp"

namespace rlbus::broker {

namespace {
// Small: a standby's answers are a few hundred bytes each, and a peer that does not read them
// loses only refusals.
constexpr int door_hwm = 1000;
constexpr std::size_t door_max_message = std::size_t{64} * 1024;  // a HELLO is far smaller
}  // namespace

standby_door::standby_door(zmq::context_t& ctx, const config& cfg, const std::string& replication)
    : cfg_(cfg),
      gate_(ctx, cfg),
      router_(ctx, zmq::socket_type::router),
      events_(ctx, zmq::socket_type::pub),
      replication_(ctx, zmq::socket_type::router) {
  router_.set(zmq::sockopt::router_mandatory, 1);
  router_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(door_max_message));
  router_.set(zmq::sockopt::linger, 0);
  router_.set(zmq::sockopt::sndhwm, door_hwm);
  router_.set(zmq::sockopt::rcvhwm, door_hwm);
  events_.set(zmq::sockopt::linger, 0);
  replication_.set(zmq::sockopt::linger, 0);
  try {
    (void)gate_.secure(router_, zap_domain_router);
    util::bind_freed(router_, normalize_endpoint(cfg_.router_endpoint));
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    (void)gate_.secure(events_, zap_domain_events);
    util::bind_freed(events_, normalize_endpoint(cfg_.events_endpoint));
    if (!replication.empty()) {
      (void)gate_.secure(replication_, zap_domain_replication);
      util::bind_freed(replication_, replication);
      replication_endpoint_ = replication_.get(zmq::sockopt::last_endpoint);
    }
  } catch (...) {
    gate_.release_all();  // before the sockets close (gatekeeper.hpp)
    throw;
  }
}

standby_door::~standby_door() {
  gate_.release_all();  // before the sockets close (gatekeeper.hpp)
}

void standby_door::serve(const leader_hint& leader, util::time_point until, int wake_fd) {
  while (true) {
    std::vector<zmq::pollitem_t> items{{router_.handle(), 0, ZMQ_POLLIN, 0},
                                       {nullptr, wake_fd, ZMQ_POLLIN, 0}};
    gate_.poll_items(items);
    const auto now = util::clock::now();
    if (now >= until) return;
    util::poll(items.data(), items.size(), util::poll_timeout_ms(now, until));
    if (std::any_of(items.begin() + 2, items.end(),
                    [](const zmq::pollitem_t& i) { return (i.revents & ZMQ_POLLIN) != 0; }))
      gate_.on_readable();
    if ((items[0].revents & ZMQ_POLLIN) != 0 || gate_.awaits_drain()) drain(leader);
    if ((items[1].revents & ZMQ_POLLIN) != 0) return;
  }
}

void standby_door::drain(const leader_hint& leader) {
  util::frame_array frames;
  while (true) {
    if (!util::try_recv(router_, frames[0])) {
      gate_.router_drained();
      return;
    }
    const std::size_t count = util::read_rest(router_, frames).count;
    const auto header = count >= 2 ? codec::parse_header(frames[1].to_string_view()) : std::nullopt;
    const int fd = count >= 2 ? frames[1].get(ZMQ_SRCFD) : -1;
    if (!header || (fd >= 0 && gate_.cut_off(fd))) {
      ++dropped_;
      continue;
    }
    codec::error e;
    e.code = static_cast<std::uint16_t>(codec::error_code::not_leader);
    e.ref_type = header->type;
    if (leader.epoch != 0) {
      e.reason = fmt::format("a standby of group {}: {} leads (epoch {}), at {}", cfg_.cluster_name,
                             leader.member, leader.epoch, leader.endpoint);
      e.leader = leader.endpoint;
      e.leader_epoch = leader.epoch;
    } else {
      e.reason = fmt::format("a standby of group {}: no leader yet", cfg_.cluster_name);
    }
    if (e.reason.size() > codec::max_reason_length) e.reason.resize(codec::max_reason_length);
    out_.clear();
    codec::encode_body(codec::message{e}, out_);
    const auto head = codec::make_header(codec::msg_type::error);
    try {
      if (!router_.send(zmq::buffer(frames[0].data(), frames[0].size()),
                        zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        ++dropped_;  // the peer's queue is full
        continue;
      }
    } catch (const zmq::error_t& err) {
      if (err.num() != EHOSTUNREACH) throw;
      ++dropped_;  // the connection is gone
      continue;
    }
    router_.send(zmq::buffer(head), zmq::send_flags::sndmore);
    router_.send(zmq::const_buffer(out_.data(), out_.size()), zmq::send_flags::none);
    ++refused_;
  }
}

}  // namespace rlbus::broker
