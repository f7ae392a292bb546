// Which brokers make up a group: each broker of a group registers itself in etcd, under a key
// of its own name attached to a lease it keeps alive, so that a misconfigured broker is
// refused at start (a name or an advertised endpoint another live broker of the group holds,
// a version other than the group's) and an operator can list the group (rlbus-ctl cluster).
//
// Keys: /rlbus/<group>/members/<member>, whose value is JSON {member, advertise, version,
// since} (since: when the broker started, in milliseconds of the Unix epoch).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rlbus::cluster {

struct member_info {
  std::string member, advertise, version;
  std::int64_t since_ms = 0;
};

/// The broker may not join the group (the message says why and what to change).
class membership_conflict : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The brokers registered in `group` now, in name order (throws etcd_unavailable).
std::vector<member_info> members_of(const std::vector<std::string>& etcd, const std::string& group,
                                    std::chrono::milliseconds timeout);

class membership {
 public:
  /// Registers `me`, after checking the group's other members; throws membership_conflict (or
  /// etcd_unavailable). A key of its own name that an earlier run of this broker left (its
  /// process killed) is waited out for up to `ttl` and a second.
  membership(std::vector<std::string> etcd, std::string group, member_info me,
             std::chrono::seconds ttl, std::chrono::milliseconds timeout);
  /// Unregisters (best effort).
  ~membership();
  membership(const membership&) = delete;
  membership& operator=(const membership&) = delete;

 private:
  void run();
  [[nodiscard]] std::string key() const;

  const std::vector<std::string> etcd_;
  const std::string group_;
  const member_info me_;
  const std::chrono::seconds ttl_;
  const std::chrono::milliseconds timeout_;
  std::int64_t lease_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace rlbus::cluster
