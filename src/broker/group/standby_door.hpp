// What a standby of a group of brokers offers its peers (SPEC §14.9.1): the ROUTER endpoint,
// behind the same door as a leader's (CURVE, allowlist, connection limits), where every
// message whose header can be read is answered with ERROR 421 (NOT_LEADER) naming the
// group's leader as the standby last saw it; it holds the event endpoint too, publishing
// nothing. It holds no session and no state of a peer, so
// that a peer whose connection came back to a deposed leader, or that tried a standby first,
// learns at once where to go.
//
// Threads: the one that serves it (the broker binary's main thread while it stands by).
#pragma once

#include <cstdint>
#include <string>

#include <msgpack.hpp>
#include <zmq.hpp>

#include "broker/core/config.hpp"
#include "broker/core/gatekeeper.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

/// The leader a refusal names: nothing while the group has none (an election is under way).
struct leader_hint {
  std::string member, endpoint;
  std::uint64_t epoch = 0;  // 0: no leader known
};

class standby_door {
 public:
  /// Binds the ROUTER endpoint of `cfg` (throws zmq::error_t when it is in use), and holds
  /// `replication` (if given) for when the broker leads.
  standby_door(zmq::context_t& ctx, const config& cfg, const std::string& replication = "");
  ~standby_door();
  standby_door(const standby_door&) = delete;
  standby_door& operator=(const standby_door&) = delete;

  /// Answers what comes until `until`, or sooner once `wake_fd` (-1: none) is readable.
  void serve(const leader_hint& leader, util::time_point until, int wake_fd = -1);

  [[nodiscard]] const std::string& endpoint() const noexcept { return endpoint_; }
  /// The replication endpoint as bound ("*" ports resolved), "" when none was given.
  [[nodiscard]] const std::string& replication_endpoint() const noexcept {
    return replication_endpoint_;
  }
  /// How many messages were answered with NOT_LEADER, and how many were dropped (unreadable,
  /// from a connection cut at the door, or unroutable).
  [[nodiscard]] std::uint64_t refused() const noexcept { return refused_; }
  [[nodiscard]] std::uint64_t dropped() const noexcept { return dropped_; }

 private:
  void drain(const leader_hint& leader);

  const config& cfg_;
  gatekeeper gate_;
  zmq::socket_t router_;
  // The event endpoint, held so that nothing else takes its port (the kernel hands a free port
  // to outgoing connections, etcd's included, and keeps it for a minute after they close); it
  // publishes nothing.
  zmq::socket_t events_;
  zmq::socket_t replication_;  // held, and read by nobody, as the event endpoint is
  std::string endpoint_, replication_endpoint_;
  msgpack::sbuffer out_;
  std::uint64_t refused_ = 0, dropped_ = 0;
};

}  // namespace rlbus::broker
