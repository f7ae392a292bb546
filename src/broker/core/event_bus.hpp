// The broker's PUB side: stamps every event with the next sequence number, the broker's
// epoch and a wall-clock time, and publishes it as [topic][header][body].
// Sequence numbers start at 1 and increase by one per event across all topics, so a
// subscriber of every topic sees a gap as a jump.
//
// The socket is an XPUB so the broker knows which prefixes anyone subscribed to: an event
// no subscriber asked for is counted (its seq is used) but not composed or sent. libzmq
// passes on the first subscription to a prefix and the last unsubscription from it, so a
// plain set of prefixes is the whole picture.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <msgpack.hpp>
#include <zmq.hpp>

#include "codec/messages.hpp"

namespace rlbus::broker {

class event_bus {
 public:
  /// Readies a new socket before it binds (security options, monitor); returns a handle
  /// the bus gives back to `release` before it closes that socket.
  using prepare_fn = std::function<int(zmq::socket_t&)>;
  using release_fn = std::function<void(int)>;

  /// Binds an XPUB socket on `endpoint`; throws zmq::error_t if it cannot.
  event_bus(zmq::context_t& ctx, const std::string& endpoint, std::uint64_t epoch,
            prepare_fn prepare = {}, release_fn release = {});
  ~event_bus();
  event_bus(const event_bus&) = delete;
  event_bus& operator=(const event_bus&) = delete;
  /// Closes the socket and binds a new one on the same endpoint: every subscriber is cut
  /// off and connects again (its SUB socket does so by itself), passing the door anew.
  /// Sequence numbers go on. Throws zmq::error_t if the endpoint cannot be bound again.
  void reopen();

  /// Publishes one event and returns its sequence number. Never blocks: PUB drops for a
  /// subscriber past its high-water mark, which the sequence numbers make visible.
  std::uint64_t publish(std::string_view topic, decltype(codec::event::body) body);
  /// Whether some subscriber asked for a prefix of `topic`, as of the last
  /// read_subscriptions(). Lets a caller skip building a body nobody will get.
  [[nodiscard]] bool wanted(std::string_view topic) const;
  /// Takes in the (un)subscriptions that arrived; the loop calls it when the socket is
  /// readable. A subscription counts from then on, which to a subscriber is no different
  /// from its subscription taking a little longer on the way.
  void read_subscriptions();
  /// For the broker loop's poll.
  [[nodiscard]] void* handle() noexcept { return pub_.handle(); }
  /// Events made with no subscriber for their topic (counted, never sent).
  [[nodiscard]] std::uint64_t unheard() const noexcept { return unheard_; }

  [[nodiscard]] std::string endpoint() const;
  [[nodiscard]] std::uint64_t last_seq() const noexcept { return seq_; }
  void set_linger(int ms) { pub_.set(zmq::sockopt::linger, ms); }

 private:
  void open(const std::string& endpoint);
  void release();

  zmq::context_t& ctx_;
  prepare_fn prepare_;
  release_fn release_;
  int handle_ = -1;  // what prepare_ gave for the socket in use; -1: nothing to release
  zmq::socket_t pub_;
  std::uint64_t epoch_;
  std::uint64_t seq_ = 0;
  std::uint64_t unheard_ = 0;
  msgpack::sbuffer buf_;
  // Subscribed to by someone; past max_prefixes the broker stops filtering, so that a flood
  // of subscriptions cannot slow every publication (libzmq still filters per subscriber).
  std::vector<std::string> prefixes_;
  std::uint64_t untracked_ = 0;  // subscriptions past max_prefixes not yet undone
};

}  // namespace rlbus::broker
