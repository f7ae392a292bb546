// See send_meter.hpp.
#include "util/send_meter.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

namespace rlbus::util {

namespace {

// What a queued message carries for its free function: the account, the bytes charged, and
// for a shared body what keeps it alive.
struct charged {
  send_meter::account* account;
  std::size_t bytes;
  void* keep = nullptr;
  void (*drop)(void*) = nullptr;
};

}  // namespace

void send_meter::account::charge(std::size_t n) noexcept {
  refs_.fetch_add(1, std::memory_order_relaxed);
  if (bytes_.fetch_add(n, std::memory_order_relaxed) == 0)
    moved_.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  total_->fetch_add(n, std::memory_order_relaxed);
}

void send_meter::account::refund(std::size_t n) noexcept {
  const auto now = clock::now().time_since_epoch().count();
  moved_.store(now, std::memory_order_relaxed);
  freed_.store(now, std::memory_order_relaxed);
  total_->fetch_sub(n, std::memory_order_relaxed);
  bytes_.fetch_sub(n, std::memory_order_relaxed);
  release();
}

void send_meter::account::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

send_meter::~send_meter() {
  for (auto& [id, a] : accounts_) a->release();
}

send_meter::account& send_meter::of(std::string_view routing_id) {
  if (const auto it = accounts_.find(routing_id); it != accounts_.end()) return *it->second;
  auto* a = new account(total_);
  accounts_.emplace(std::string(routing_id), a);
  return *a;
}

void send_meter::seen(std::string_view routing_id, int fd) {
  if (const auto it = accounts_.find(routing_id); it != accounts_.end()) it->second->fd_ = fd;
}

std::vector<int> send_meter::stalled(time_point since, std::size_t elsewhere) {
  std::vector<int> fds;
  if (total() + elsewhere <= budget_ / 2) return fds;
  const auto before = since.time_since_epoch().count();
  for (auto& [id, a] : accounts_) {
    if (a->fd_ < 0 || a->bytes() == 0 || a->moved_.load(std::memory_order_relaxed) >= before)
      continue;
    fds.push_back(a->fd_);
    a->fd_ = -1;
  }
  return fds;
}

bool send_meter::admits(const account& a, std::size_t body, std::size_t elsewhere,
                        time_point now) const noexcept {
  const auto n = body + per_message;
  const auto held = a.bytes() + n;
  if (held > per_connection_) return false;
  // The queues share the budget with the bytes held elsewhere. Its last quarter is kept for
  // connections that read: those that never read fill three quarters at most (with what is
  // held elsewhere), however many there are, and the others are served meanwhile. A
  // connection reads when it holds nothing (a peer asking something) or when libzmq let go of
  // one of its messages within moving_window (a subscriber reading its stream always has
  // some in flight); it may hold up to a 64th of the budget from the reserve. (A connection
  // that never reads parks at most that much there.)
  const auto wanted = total() + elsewhere + n;
  if (wanted <= budget_ - budget_ / 4) return true;  // the common case: no reserve needed
  if (wanted > budget_ || held > budget_ / 64) return false;
  if (a.bytes() == 0) return true;
  const auto freed = a.freed_.load(std::memory_order_relaxed);
  if (now == time_point{}) now = clock::now();
  return freed != 0 && now - time_point(clock::duration(freed)) <= moving_window;
}

void send_meter::send_last(zmq::socket_t& s, account& a, std::string_view body,
                           zmq::send_flags flags) {
  auto m = charge(a, body);
  s.send(m, flags);
}

void send_meter::send_last_shared(zmq::socket_t& s, account& a, std::string_view body, void* keep,
                                  void (*drop)(void*), zmq::send_flags flags) {
  auto m = charge_shared(a, body, keep, drop);
  s.send(m, flags);
}

zmq::message_t send_meter::charge(account& a, std::string_view body) {
  // One allocation: what the free function needs, then the bytes.
  void* block = std::malloc(sizeof(charged) + body.size());
  if (block == nullptr) throw std::bad_alloc();
  auto* c = new (block) charged{&a, body.size() + per_message};
  char* data = static_cast<char*>(block) + sizeof(charged);
  if (!body.empty()) std::memcpy(data, body.data(), body.size());
  a.charge(c->bytes);
  zmq::message_t m(
      data, body.size(),
      [](void* /*data*/, void* hint) {
        auto* held = static_cast<charged*>(hint);
        held->account->refund(held->bytes);
        std::free(hint);
      },
      c);
  return m;
}

zmq::message_t send_meter::charge_shared(account& a, std::string_view body, void* keep,
                                         void (*drop)(void*)) {
  auto* c = new charged{&a, body.size() + per_message, keep, drop};
  a.charge(c->bytes);
  zmq::message_t m(
      const_cast<char*>(body.data()), body.size(),
      [](void* /*data*/, void* hint) {
        auto* held = static_cast<charged*>(hint);
        held->account->refund(held->bytes);
        held->drop(held->keep);
        delete held;
      },
      c);
  return m;
}

void send_meter::prune() {
  for (auto it = accounts_.begin(); it != accounts_.end();) {
    if (it->second->bytes() == 0) {
      it->second->release();
      it = accounts_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace rlbus::util
