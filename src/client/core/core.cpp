// See core.hpp. The I/O loop polls the session's socket, the wake-up pipe and the role's extra
// descriptor, reads what came, runs the session's timers and flushes the outbox once per turn,
// however many messages the other threads queued meanwhile.
#include "client/core/core.hpp"

#include <array>

#include "util/clock.hpp"
#include "util/poll.hpp"

namespace rlbus {

std::string_view to_string(connection_state s) noexcept {
  switch (s) {
    case connection_state::connecting:
      return "connecting";
    case connection_state::ready:
      return "ready";
    case connection_state::reconnecting:
      return "reconnecting";
    case connection_state::refused:
      return "refused";
    case connection_state::stopped:
      return "stopped";
  }
  return "unknown";
}

}  // namespace rlbus

namespace rlbus::client::detail {

core::core(session_options opts, std::size_t max_outbox)
    : opts_(std::move(opts)), max_outbox_(max_outbox) {}

core::~core() {
  stop();
}

void core::start(role_hooks hooks) {
  io_thread_ = std::thread([this, h = std::move(hooks)]() mutable { run(std::move(h)); });
}

void core::stop() {
  if (!io_thread_.joinable()) return;
  stopping_.store(true, std::memory_order_relaxed);
  wake_.notify();
  io_thread_.join();
}

bool core::queue(codec::message m, bool& wake_needed) {
  wake_needed = false;
  if (outbox_full()) return false;
  wake_needed = outbox_.empty();
  outbox_.push_back(std::move(m));
  return true;
}

bool core::post(codec::message m) {
  bool wake_needed = false;
  bool queued = false;
  {
    std::lock_guard lock(mu_);
    queued = queue(std::move(m), wake_needed);
  }
  if (wake_needed) wake_.notify();
  return queued;
}

bool core::send_in_order(session& s) {
  while (!outbox_.empty()) {
    if (!s.send_ready(outbox_.front())) return s.state() != connection_state::ready;
    outbox_.pop_front();
  }
  return true;
}

connection_state core::state() const {
  std::lock_guard lock(state_mu_);
  return state_;
}

bool core::wait_for(connection_state s, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_mu_);
  return state_changed_.wait_for(lock, timeout, [&] { return state_ == s; });
}

std::uint64_t core::token() const {
  std::lock_guard lock(state_mu_);
  return token_;
}

std::uint64_t core::welcomes() const {
  std::lock_guard lock(state_mu_);
  return welcomes_;
}

std::string core::last_error() const {
  std::lock_guard lock(state_mu_);
  return last_error_;
}

void core::on_state(connection_state st, std::uint64_t token, const std::string& detail) {
  std::lock_guard lock(state_mu_);
  const bool welcomed = st == connection_state::ready && state_ != st;
  if (welcomed) ++welcomes_;
  // Any refusal is kept, but not the note that comes with a welcome.
  if (!welcomed && !detail.empty()) last_error_ = detail;
  state_ = st;
  token_ = token;
  state_changed_.notify_all();
}

void core::run(role_hooks hooks) {
  session s(
      ctx_, opts_,
      [this](connection_state st, std::uint64_t t, const std::string& detail) {
        on_state(st, t, detail);
      },
      [&hooks](codec::message&& m) {
        if (hooks.on_message) hooks.on_message(std::move(m));
      },
      [&hooks](codec::message&& m, zmq::message_t&& payload) {
        if (hooks.on_payload_message) hooks.on_payload_message(std::move(m), std::move(payload));
      });
  const auto flush = [&] {
    std::lock_guard lock(mu_);
    return hooks.flush ? hooks.flush(s) : send_in_order(s);
  };
  s.start(util::clock::now());
  bool blocked = false;  // the socket's queue was full: wait until it takes more
  while (!stopping_.load(std::memory_order_relaxed)) {
    auto socket = s.pollitem();
    if (blocked) socket.events |= ZMQ_POLLOUT;
    const bool extra = hooks.extra_fd >= 0;
    std::array<zmq::pollitem_t, 3> items{socket,
                                         zmq::pollitem_t{nullptr, wake_.read_fd(), ZMQ_POLLIN, 0},
                                         zmq::pollitem_t{nullptr, hooks.extra_fd, ZMQ_POLLIN, 0}};
    util::poll(items.data(), extra ? 3 : 2,
               util::poll_timeout_ms(util::clock::now(), s.next_timer()));
    if ((items[1].revents & ZMQ_POLLIN) != 0) wake_.drain();
    if (extra && hooks.on_extra && !hooks.on_extra()) hooks.extra_fd = -1;
    if ((items[0].revents & ZMQ_POLLIN) != 0) s.on_readable(util::clock::now());
    s.on_timers(util::clock::now());
    blocked = !flush();
  }
  flush();
  s.stop();
}

}  // namespace rlbus::client::detail
