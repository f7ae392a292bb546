// See event_bus.hpp.
#include "broker/core/event_bus.hpp"

#include <algorithm>

#include "codec/codec.hpp"
#include "util/bind.hpp"
#include "util/poll.hpp"

namespace rlbus::broker {

namespace {
constexpr std::size_t max_subscription = 1025;  // the byte, then a prefix of up to 1 KiB
constexpr std::size_t max_prefixes = 1024;      // distinct ones the broker filters by
}  // namespace

event_bus::event_bus(zmq::context_t& ctx, const std::string& endpoint, std::uint64_t epoch,
                     prepare_fn prepare, release_fn release)
    : ctx_(ctx), prepare_(std::move(prepare)), release_(std::move(release)), epoch_(epoch) {
  open(endpoint);
}

event_bus::~event_bus() {
  release();
}

void event_bus::open(const std::string& endpoint) {
  pub_ = zmq::socket_t(ctx_, zmq::socket_type::xpub);
  pub_.set(zmq::sockopt::sndhwm, 100'000);
  pub_.set(zmq::sockopt::linger, 0);
  // What a subscriber sends is its subscriptions: a byte and a topic prefix each (SPEC §10.5).
  pub_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_subscription));
  if (prepare_) handle_ = prepare_(pub_);
  try {
    util::bind_freed(pub_, endpoint);
  } catch (...) {
    release();
    throw;
  }
}

void event_bus::release() {
  if (release_ && handle_ >= 0) release_(handle_);
  handle_ = -1;
}

void event_bus::reopen() {
  const auto ep = endpoint();
  release();
  pub_.close();
  prefixes_.clear();  // the subscribers subscribe again when they reconnect
  untracked_ = 0;
  open(ep);  // the old listener may take a moment to free the port (util/bind.hpp)
}

void event_bus::read_subscriptions() {
  // Subscription messages: 1 (subscribe) or 0 (unsubscribe), then the prefix.
  zmq::message_t m;
  while (util::try_recv(pub_, m)) {
    if (m.empty()) continue;
    const auto* b = static_cast<const char*>(m.data());
    std::string prefix(b + 1, m.size() - 1);
    const auto it = std::find(prefixes_.begin(), prefixes_.end(), prefix);
    if (b[0] == 1 && it == prefixes_.end()) {
      if (prefixes_.size() < max_prefixes)
        prefixes_.push_back(std::move(prefix));
      else
        ++untracked_;
    }
    if (b[0] == 0 && it != prefixes_.end()) prefixes_.erase(it);
    if (b[0] == 0 && it == prefixes_.end() && untracked_ > 0) --untracked_;
  }
}

bool event_bus::wanted(std::string_view topic) const {
  if (untracked_ > 0) return true;
  return std::any_of(prefixes_.begin(), prefixes_.end(),
                     [&](const std::string& p) { return topic.substr(0, p.size()) == p; });
}

std::uint64_t event_bus::publish(std::string_view topic, decltype(codec::event::body) body) {
  if (!wanted(topic)) {  // filtered out for everyone: the seq is used all the same (§2.5)
    ++unheard_;
    return ++seq_;
  }
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
