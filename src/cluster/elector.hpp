// Which broker of a group leads, decided by etcd. Each broker runs one elector, on a thread
// of its own (etcd's answers take milliseconds; the broker's loop must never wait for them).
//
// The leader is whoever holds the key `/rlbus/<group>/leader`, created only where it does not
// exist and attached to a lease the holder keeps alive; its value names the holder (member,
// advertised endpoint). The key's create revision, which etcd makes larger at every creation,
// is the leadership's epoch: a later leader always has a larger one. A standby looks at the
// key every poll interval and campaigns when it is gone, which etcd makes so once the lease
// has run out (or its holder revoked it).
//
// Fencing: a leader may serve until serving_until(), which only a renewal moves on: the time
// the renewal was asked for, plus the seconds etcd gave the lease from then, less a margin.
// Since etcd counts a lease's seconds from when it got the renewal, later than it was asked
// for, the leader has stopped serving before etcd can let the key go and a standby can take
// it, on any pair of clocks whose rates differ by less than the margin allows. A leader that
// cannot renew (etcd gone, its process frozen) just lets the time pass; on noticing, it steps
// down: it revokes its lease (best effort) and becomes a standby again.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "util/clock.hpp"

namespace rlbus::cluster {

struct elector_config {
  std::vector<std::string> etcd;  // etcd's client URLs
  std::string group;              // the brokers that share one leader
  std::string member;             // this broker's name in the group, unique in it
  std::string advertise;          // where peers reach this broker when it leads
  std::string replication;        // where its standbys reach it then (SPEC §14.10), if anywhere
  // Whether it copies its leader's journal (it has one): a group whose leader copied nothing
  // may be led by any member, one whose leader did only by a member in sync (SPEC §14.10.6).
  bool replicates = false;
  std::chrono::seconds lease_ttl{2};
  std::chrono::milliseconds margin{500};    // stop serving this long before the lease may end
  std::chrono::milliseconds renew{500};     // how often the leader renews
  std::chrono::milliseconds poll{100};      // how often a standby looks at the key
  std::chrono::milliseconds timeout{1000};  // per etcd request
};

/// The leader as an elector last saw it.
struct leader_info {
  std::string member, advertise;
  std::string replication;    // its replication endpoint ("" when it has none)
  std::int64_t epoch = 0;     // 0: no leader seen
  std::int64_t since_ms = 0;  // when it took the lead (ms of the Unix epoch, its own clock)
};

/// The members an in-sync set names ({"members": [...]}, SPEC §14.10.6); none for another value.
std::vector<std::string> in_sync_members(const std::string& value);

/// The leader of `group` as etcd holds it now (epoch 0: none; throws etcd_unavailable).
leader_info leader_of(const std::vector<std::string>& etcd, const std::string& group,
                      std::chrono::milliseconds timeout);

class elector {
 public:
  /// Checks the settings and starts campaigning. Throws std::invalid_argument for a setting
  /// that cannot work (e.g. a margin not below the lease).
  explicit elector(elector_config cfg);
  /// Stops; a leader revokes its lease first, so that a standby need not wait for it to end.
  ~elector();
  elector(const elector&) = delete;
  elector& operator=(const elector&) = delete;

  /// Until when this broker may serve as the leader; in the past when it does not lead.
  [[nodiscard]] util::time_point serving_until() const noexcept {
    return util::time_point(util::clock::duration(serving_until_.load()));
  }
  [[nodiscard]] bool leads(util::time_point now = util::clock::now()) const noexcept {
    return now < serving_until();
  }
  /// The epoch of this broker's leadership (0 when it does not lead).
  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_.load(); }
  [[nodiscard]] leader_info leader() const;
  /// Whether etcd answered the last request (for health and logs).
  [[nodiscard]] bool etcd_reachable() const noexcept { return reachable_.load(); }

  /// Waits until something changed (leadership won or lost, another leader seen) or `until`.
  void wait_change(util::time_point until);
  /// Gives leadership up for good (the broker is stopping): serving ends now, the lease is
  /// revoked, and it never campaigns again.
  void resign();
  /// Gives this leadership up (the broker could not serve: an endpoint it cannot bind) and
  /// campaigns again a second later; the group's in-sync set is left as it is.
  void step_aside();

  [[nodiscard]] std::string key() const { return "/rlbus/" + cfg_.group + "/leader"; }
  /// The members that hold everything the leader accepted: {"members": [...]} (SPEC §14.10.6).
  [[nodiscard]] std::string insync_key() const { return insync_key_of(cfg_.group); }
  static std::string insync_key_of(const std::string& group) {
    return "/rlbus/" + group + "/insync";
  }

 private:
  void run();
  void campaign();
  void renew();
  /// Serving may go on until `ttl_s` (as etcd gave it) from `asked`, less the margin.
  void extend(util::time_point asked, std::int64_t ttl_s);
  void step_down(const std::string& why);
  void set_leader(leader_info l);
  void notify();
  void sleep_for(std::chrono::milliseconds d);

  const elector_config cfg_;
  std::atomic<util::clock::rep> serving_until_{0};
  std::atomic<std::int64_t> epoch_{0};
  std::atomic<bool> reachable_{false};
  std::atomic<bool> stop_{false}, resign_{false}, aside_{false};
  std::int64_t lease_ = 0;   // the thread's: the lease it leads under
  std::int64_t orphan_ = 0;  // and one it could not give back yet
  mutable std::mutex mu_;
  std::condition_variable cv_;
  leader_info leader_;
  std::uint64_t changes_ = 0;
  std::string last_error_;
  bool told_not_in_sync_ = false;  // the thread's: the log said why it does not campaign
  std::thread thread_;
};

}  // namespace rlbus::cluster
