// A group of brokers as etcd holds it: who leads (since when, in which epoch), every
// registered member, and which of them hold everything the leader accepted. Read by
// `rlbus-ctl cluster` from etcd itself, and by a broker of the group for its web view,
// through group_watch, which asks etcd at most once in a while however often it is read.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/elector.hpp"
#include "cluster/membership.hpp"
#include "util/clock.hpp"

namespace rlbus::cluster {

struct group_view {
  std::string group;
  leader_info leader;                // epoch 0: no leader
  std::vector<member_info> members;  // in name order
  std::set<std::string> in_sync;     // empty: the leader copies its journal to nobody
};

/// Reads `group` from etcd (throws etcd_unavailable, or std::invalid_argument for a URL
/// that is not http://).
group_view read_group(const std::vector<std::string>& etcd, const std::string& group,
                      std::chrono::milliseconds timeout);

/// {group, leader: {member, advertise, epoch, since_ms} or null, members: [{member,
/// advertise, version, since_ms, role (leader or standby), in_sync}]}.
nlohmann::json to_json(const group_view& g);

/// The group as a member of it shows it: read from etcd at most once per `every`, from any
/// thread; the last reading in between. Its JSON (to_json) names this broker (`me`) and the
/// Unix time in ms of the reading (`read_ms`); when etcd did not answer, `error` says so and
/// the last reading that worked, if any, stays.
class group_watch {
 public:
  group_watch(std::vector<std::string> etcd, std::string group, std::string me,
              std::chrono::milliseconds timeout, std::chrono::milliseconds every);
  [[nodiscard]] nlohmann::json get();

 private:
  const std::vector<std::string> etcd_;
  const std::string group_, me_;
  const std::chrono::milliseconds timeout_, every_;
  std::mutex mu_;  // one reading at a time; the others wait for it and share it
  util::time_point read_at_{};
  bool read_ = false;
  nlohmann::json last_;
};

}  // namespace rlbus::cluster
