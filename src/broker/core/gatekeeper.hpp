// The broker's door (SPEC §15): the ZAP handler that libzmq asks about every new connection
// on the ROUTER and the event socket, and the count of live connections per source address.
//
// With CURVE on, a connection gets in only when its public key is in the allowlist (and,
// on the event socket, may subscribe); the key is handed to the broker as the connection's
// ZAP user id, so a HELLO can be checked against what the key may be. With CURVE off
// (plain), every key is the empty one, no socket asks ZAP (libzmq would keep a pipe to the
// handler for every connection), and only the connection limits apply. Connections
// are counted from the sockets' monitors (accepted, disconnected), so that a limit counts
// every TCP connection, also one that never finishes its ZeroMQ handshake.
//
// libzmq allows one ZAP handler per context: a context that holds a broker holds only one.
// Threads: the broker loop's, like the sockets it watches.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <zmq.hpp>

#include "broker/core/allowlist.hpp"
#include "broker/core/config.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

/// ZAP domains: which socket a connection is for.
inline constexpr std::string_view zap_domain_router = "rlbus";
inline constexpr std::string_view zap_domain_events = "rlbus.events";
inline constexpr std::string_view zap_domain_replication = "rlbus.replication";

struct gate_counts {
  std::uint64_t connections = 0;         // live TCP/IPC connections, both sockets
  std::uint64_t admitted = 0;            // let in: by the ZAP handler, or (plain) at accept
  std::uint64_t refused_key = 0;         // CURVE key not in the allowlist
  std::uint64_t refused_subscriber = 0;  // listed key without the subscriber role (events)
  std::uint64_t refused_address = 0;     // past max-connections-per-address
  std::uint64_t refused_total = 0;       // past max-connections
  std::uint64_t bounced = 0;   // cut at accept: its descriptor's cut connection had unread messages
  std::uint64_t hoarding = 0;  // cut: it sent more than its bound that made no whole message
  std::uint64_t allowlist_reloads = 0;  // successful loads after the first
  std::uint64_t allowlist_errors = 0;   // reloads refused (the old list stays)
};

class gatekeeper {
 public:
  /// Binds the ZAP handler in `ctx` and, with CURVE on, reads the broker's key and the
  /// allowlist. Throws std::invalid_argument for an unusable key or allowlist (the broker
  /// must not start: CURVE without a handler admits everyone).
  gatekeeper(zmq::context_t& ctx, const config& cfg);

  /// Sets what a socket needs before it binds: the handshake timeout and, with CURVE on, its
  /// ZAP domain, the server role and secret key. Then monitors it for connections;
  /// returns the monitor's handle, for release().
  ///
  /// A secured socket must be released before it closes (and before the gatekeeper goes):
  /// libzmq goes on reporting a closing socket's connections to its monitor from the context's
  /// I/O thread, and a report to a monitor whose reader is gone blocks that thread for good,
  /// which stops every TCP socket of the context (as a broker's next turn would find).
  int secure(zmq::socket_t& s, std::string_view domain);
  /// Before a secured socket closes: stops its monitor and forgets its connections. Once per
  /// handle; a handle released already is left alone.
  void release(int handle);
  /// Releases every socket not released yet: what an owner of secured sockets does first when
  /// it goes, before its sockets close.
  void release_all();
  ~gatekeeper();
  gatekeeper(const gatekeeper&) = delete;
  gatekeeper& operator=(const gatekeeper&) = delete;

  [[nodiscard]] bool curve() const noexcept { return curve_; }
  /// The broker's public key (Z85), "" in plain mode.
  [[nodiscard]] const std::string& public_key() const noexcept { return public_key_; }
  /// The allowlist entry of a connection's key; nullptr when it is not (or no longer)
  /// listed. Always nullptr in plain mode.
  [[nodiscard]] const allowlist_entry* entry(std::string_view key) const { return list_.find(key); }

  /// For the loop's poll: the ZAP socket and the monitors.
  void poll_items(std::vector<zmq::pollitem_t>& items);
  /// Handles whatever is readable: monitor events first, so that a connection is counted
  /// before it is asked about.
  void on_readable();
  /// Whether the connection on descriptor `fd` (a message's source) was cut at accept for a
  /// limit: its messages must never make a session. Reads the monitors first, as a message
  /// can reach the broker before the event of its connection's accept does.
  [[nodiscard]] bool cut_off(int fd);
  /// The ROUTER had nothing more to read: whatever a connection cut and gone said before its
  /// end has been read by now (libzmq hands a connection's messages on before it tells the
  /// monitor of the end), so its descriptor may serve a new connection.
  void router_drained() {
    cut_gone_.clear();
    drained_ = true;
  }
  /// Whether the door waits for the ROUTER to be read to the end before a new connection on a
  /// cut one's descriptor is served: the owner reads it now, not when a message next comes,
  /// or every connection that lands there on a quiet broker would be cut at each reconnect.
  [[nodiscard]] bool awaits_drain() const noexcept { return !cut_gone_.empty(); }
  /// Cuts the live connection on descriptor `fd` (one that has stopped reading, SPEC §15.5,
  /// or sends only faults, §10.4): libzmq sees it end and drops what was queued for it; its
  /// peer may connect again. Returns the connection's source address, or nothing when no
  /// connection of ours has that descriptor now (it ended meanwhile).
  std::optional<std::string> cut(int fd);

  /// The broker read a whole message that came on the ROUTER's descriptor `fd`.
  void delivered(int fd) {
    if (const auto it = connections_.find(fd); it != connections_.end()) ++it->second.delivered;
  }
  /// When the inbound sweep is due next: every 100 ms, less often past 2048 connections (each
  /// costs two system calls). Never while there is no connection.
  [[nodiscard]] util::time_point next_sweep() const noexcept {
    return connections_.empty() ? util::time_point::max() : next_sweep_;
  }
  /// The inbound sweep (SPEC §10.5): libzmq holds what a connection sends until it makes a
  /// whole message, however long that message is, so the door compares, per TCP connection of
  /// the ROUTER and the event socket, what libzmq has taken off the wire with what came out as
  /// whole messages, and cuts a connection that holds too much: on the ROUTER, more than 4 x
  /// max-message since its last whole message (libzmq drops the partial one); on the event
  /// socket, more than 1 MiB in all (a subscriber sends only its subscriptions); and, while
  /// all of them together hold more than half of memory-budget, the biggest holders until
  /// they no longer do. Returns how many it cut.
  std::size_t sweep_inbound(util::time_point now);

  /// Whether the allowlist file changed on disk since it was read (checked about once a
  /// second by the loop).
  [[nodiscard]] bool allowlist_changed() const;
  /// Reads the allowlist again. On success returns true and the new list is in force; on
  /// a bad file logs why, keeps the old list and returns false.
  bool reload_allowlist();
  /// Whether some subscriber let in earlier may no longer subscribe (after a reload): the
  /// event socket must then be opened afresh, so every subscriber passes the door again.
  [[nodiscard]] bool subscriber_revoked() const;
  /// The event socket was opened afresh: its subscribers are let in again from scratch.
  void forget_subscribers() { subscriber_keys_.clear(); }

  [[nodiscard]] const gate_counts& counts() const noexcept { return counts_; }

 private:
  struct file_id {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    std::int64_t mtime_ns = 0;
    bool operator==(const file_id&) const = default;
  };
  [[nodiscard]] std::optional<file_id> stat_allowlist() const;
  void on_zap();
  void note_refusal(std::string_view address, std::string_view why,
                    std::string_view verb = "refused");
  void read_monitors();  // every live monitor's events so far
  void on_monitor(int handle);
  /// 200 with the key as user id, or a refusal: {status, text}.
  std::pair<std::string, std::string> decide(std::string_view domain, std::string_view address,
                                             std::string_view mechanism, std::string& key);

  zmq::context_t& ctx_;
  const config& cfg_;
  bool curve_ = false;
  std::string public_key_, secret_key_;
  allowlist list_;
  std::optional<file_id> list_file_;
  zmq::socket_t zap_;
  std::vector<zmq::socket_t> monitors_;
  std::vector<void*> watched_;  // the socket each monitor watches; nullptr once released
  // Their descriptors, polled as plain fds: zmq_poll would ask each socket for its state
  // (two getsockopt calls) on every turn of the broker loop, for sockets that speak only
  // when a connection comes or goes. -1: a monitor released.
  int zap_fd_ = -1;
  std::vector<int> monitor_fds_;
  struct connection {
    int monitor;          // which socket's
    std::string address;  // source address
    bool cut = false;     // past a limit at accept: its messages are never served
    bool swept = false;   // cut by the inbound sweep (it had no whole message queued)
    // For the inbound sweep: whole messages the broker read from it (ROUTER), how many the
    // last sweep saw, the bytes taken off the wire at the last sweep that saw one more, and
    // the sweeps since then.
    std::uint64_t delivered = 0;
    std::uint64_t delivered_seen = 0;
    std::uint64_t mark = 0;
    std::uint32_t quiet = 0;
  };
  void forget(std::unordered_map<int, connection>::iterator it);
  std::unordered_map<int, connection> connections_;  // by fd
  // Descriptors of the ROUTER's cut connections since gone, whose messages may still wait in
  // the ROUTER: a message carries only its descriptor, so a new connection on one of them
  // before the ROUTER has been read to the end would be taken for the cut one (or the cut one
  // for it); such a connection is cut too, and its peer connects again.
  std::unordered_set<int> cut_gone_;
  int router_monitor_ = -1;  // the handle of the ROUTER's monitor
  int events_monitor_ = -1;  // and of the event socket's (a new one when it is opened afresh)
  bool drained_ = false;     // the ROUTER was read to the end since the last inbound sweep
  util::time_point next_sweep_{};
  std::unordered_map<std::string, std::uint32_t> per_address_;  // live connections
  std::set<std::string> subscriber_keys_;                       // keys let in on the event socket
  gate_counts counts_;
  std::uint64_t unlogged_ = 0;  // refusals since the last log line about them
  util::time_point next_log_{};
};

}  // namespace rlbus::broker
