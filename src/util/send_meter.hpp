// What a socket's owner holds in ZeroMQ's send queues, in bytes: per connection and in all.
//
// ZeroMQ bounds a pipe in messages (the high-water mark), not in bytes, so a peer that never
// reads can make the sender hold its high-water mark times the largest message it answers
// with. Here every metered message is handed to ZeroMQ as a buffer of ours with a free
// function: its bytes are counted when the message is queued and counted off when libzmq lets
// go of it (once written to the kernel, or dropped with its connection), on libzmq's I/O
// thread, so the counts are atomics. A send that would take a connection past its bound, or
// all of them past the budget, is not made: the caller treats it as a full queue.
//
// A connection whose queue has not moved for a while (libzmq let go of nothing of it) when
// more than half of the budget is held is stalled: its owner may cut it (stalled()). That is the
// one way to get back what it holds: a message handed to libzmq stays until it is read, or
// dropped with its connection.
//
// Lifetime: an account lives while the meter knows it and while any message charged to it is
// queued, and keeps the meter's total alive with it: libzmq may free a message after the
// socket, and the meter, are gone.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "util/clock.hpp"

namespace rlbus::util {

class send_meter {
 public:
  /// Charged on top of each message's body: the frames before it and ZeroMQ's bookkeeping.
  static constexpr std::size_t per_message = 256;
  /// A connection whose queue moved within this long reads what it is sent (admits()).
  static constexpr std::chrono::seconds moving_window{5};

  class account {
   public:
    [[nodiscard]] std::size_t bytes() const noexcept {
      return bytes_.load(std::memory_order_relaxed);
    }
    /// The descriptor of the connection, once its owner has seen one of its messages (-1
    /// until then): what stalled() names.
    [[nodiscard]] int fd() const noexcept { return fd_; }
    void set_fd(int fd) noexcept { fd_ = fd; }

   private:
    friend class send_meter;
    explicit account(std::shared_ptr<std::atomic<std::size_t>> total) : total_(std::move(total)) {}
    void charge(std::size_t n) noexcept;
    void refund(std::size_t n) noexcept;  // from any thread; may delete the account
    void release() noexcept;              // one reference fewer; the last deletes it
    std::shared_ptr<std::atomic<std::size_t>> total_;
    std::atomic<std::size_t> bytes_{0};
    std::atomic<std::uint32_t> refs_{1};  // the meter's own, plus one per queued message
    // When its queue last moved: went from empty to holding something, or libzmq let go of one
    // of its messages (steady clock ticks; written on either thread)
    std::atomic<clock::rep> moved_{0};
    std::atomic<clock::rep> freed_{0};  // when libzmq last let go of one of its messages
    int fd_ = -1;                       // the owner's thread only
  };

  send_meter(std::size_t per_connection, std::size_t budget)
      : per_connection_(per_connection), budget_(budget) {}
  ~send_meter();
  send_meter(const send_meter&) = delete;
  send_meter& operator=(const send_meter&) = delete;

  /// The account of the connection `routing_id`, made on first use.
  account& of(std::string_view routing_id);
  /// Notes that a message of `routing_id`'s connection came in on descriptor `fd`, if the
  /// connection has an account (messages in do not make one).
  void seen(std::string_view routing_id, int fd);
  /// When more than half of the budget is held (with `elsewhere`, as in admits()):
  /// the descriptors of the connections that hold bytes and whose queues have not moved since
  /// `since`. Each is named once (its account forgets the descriptor), so a descriptor that
  /// libzmq gives to a new connection afterwards is not named for the old one.
  [[nodiscard]] std::vector<int> stalled(time_point since, std::size_t elsewhere = 0);
  /// Whether a message of `body` bytes may be queued for `a` at `now`: within its
  /// connection's bound, and, with the `elsewhere` bytes the owner holds outside the queues
  /// from the same budget (the broker's event rings), within the budget, whose last quarter is
  /// kept for connections that read (that hold nothing, or of whose messages libzmq let go
  /// within moving_window), each up to a 64th of the budget. `now` is read from the clock
  /// when not given, and only when the answer depends on it.
  [[nodiscard]] bool admits(const account& a, std::size_t body, std::size_t elsewhere = 0,
                            time_point now = {}) const noexcept;
  /// `body` as a frame charged to `a` until libzmq frees it (or it is dropped unsent).
  [[nodiscard]] zmq::message_t charge(account& a, std::string_view body);
  /// The same for a large body that the message shares: see send_last_shared.
  [[nodiscard]] zmq::message_t charge_shared(account& a, std::string_view body, void* keep,
                                             void (*drop)(void*));
  /// Sends `body` as the last frame of a message on `s`, charged to `a` until libzmq frees it.
  /// The frames before it must have been queued; `s` must take it (it is never refused).
  /// With `flags` sndmore it is not the last: another frame follows (a payload frame).
  void send_last(zmq::socket_t& s, account& a, std::string_view body,
                 zmq::send_flags flags = zmq::send_flags::none);
  /// The same for a large body shared by several messages: `keep` is a heap object the message
  /// holds (deleted with `drop` once libzmq lets go of it) that keeps `body` alive.
  void send_last_shared(zmq::socket_t& s, account& a, std::string_view body, void* keep,
                        void (*drop)(void*), zmq::send_flags flags = zmq::send_flags::none);
  /// Forgets the accounts of connections that hold nothing now (call it now and then; a
  /// connection that sends again gets a fresh one).
  void prune();

  [[nodiscard]] std::size_t total() const noexcept {
    return total_->load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t connections() const noexcept { return accounts_.size(); }

 private:
  struct by_name {  // heterogeneous lookup by string_view
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::size_t per_connection_, budget_;
  std::shared_ptr<std::atomic<std::size_t>> total_ = std::make_shared<std::atomic<std::size_t>>(0);
  std::unordered_map<std::string, account*, by_name, std::equal_to<>> accounts_;
};

}  // namespace rlbus::util
