// rlbus::worker: a session driven by one I/O thread, with its state mirrored under a mutex
// for the caller's threads. See include/rlbus/worker.hpp for the contract.
#include "rlbus/worker.hpp"

#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>

#include "client/session.hpp"
#include "util/poll.hpp"
#include "util/wake_pipe.hpp"

namespace rlbus {

std::string_view to_string(connection_state s) noexcept {
  switch (s) {
    case connection_state::connecting:
      return "connecting";
    case connection_state::ready:
      return "ready";
    case connection_state::refused:
      return "refused";
    case connection_state::stopped:
      return "stopped";
  }
  return "unknown";
}

struct worker::impl {
  explicit impl(worker_options o) : opts(std::move(o)), ctx(1) {
    if (opts.role != role::collector && opts.role != role::learner)
      throw std::invalid_argument("a worker's role is collector or learner");
    client::detail::validate(to_session_options(opts));
    thread = std::thread([this] { loop(); });
  }

  static client::detail::session_options to_session_options(const worker_options& o) {
    return {o.endpoint, o.role, o.id, o.resources, o.heartbeat, o.reconnect_min, o.reconnect_max};
  }

  void loop() {
    client::detail::session s(
        ctx, to_session_options(opts),
        [this](connection_state st, std::uint64_t t, const std::string& detail) {
          std::lock_guard lock(mu);
          if (st == connection_state::ready && state != st) ++welcomes;
          if (st != connection_state::ready && !detail.empty()) last_error = detail;
          state = st;
          token = t;
          changed.notify_all();
        });
    s.start(util::clock::now());
    while (!stopping.load(std::memory_order_relaxed)) {
      std::array<zmq::pollitem_t, 2> items{s.pollitem(), {nullptr, wake.read_fd(), ZMQ_POLLIN, 0}};
      const auto now = util::clock::now();
      util::poll(items.data(), items.size(), util::poll_timeout_ms(now, s.next_timer()));
      if ((items[1].revents & ZMQ_POLLIN) != 0) wake.drain();
      if ((items[0].revents & ZMQ_POLLIN) != 0) s.on_readable(util::clock::now());
      s.on_timers(util::clock::now());
    }
    s.stop();
  }

  void stop() {
    if (!thread.joinable()) return;
    stopping.store(true, std::memory_order_relaxed);
    wake.notify();
    thread.join();
  }

  worker_options opts;
  zmq::context_t ctx;
  util::wake_pipe wake;
  std::atomic<bool> stopping{false};
  mutable std::mutex mu;
  mutable std::condition_variable changed;
  connection_state state = connection_state::connecting;
  std::uint64_t token = 0;
  std::uint64_t welcomes = 0;
  std::string last_error;
  std::thread thread;
};

worker::worker(worker_options opts) : impl_(std::make_unique<impl>(std::move(opts))) {}
worker::~worker() {
  stop();
}
worker::worker(worker&&) noexcept = default;
worker& worker::operator=(worker&& other) noexcept {
  if (this != &other) {
    stop();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

connection_state worker::state() const {
  std::lock_guard lock(impl_->mu);
  return impl_->state;
}

bool worker::wait_for(connection_state s, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mu);
  return impl_->changed.wait_for(lock, timeout, [&] { return impl_->state == s; });
}

std::uint64_t worker::session() const {
  std::lock_guard lock(impl_->mu);
  return impl_->token;
}

std::uint64_t worker::welcomes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->welcomes;
}

std::string worker::last_error() const {
  std::lock_guard lock(impl_->mu);
  return impl_->last_error;
}

const worker_options& worker::options() const {
  return impl_->opts;
}

void worker::stop() {
  if (impl_) impl_->stop();
}

}  // namespace rlbus
