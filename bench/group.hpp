// A group of two brokers elected through an etcd (SPEC §14.9, §14.10), as the bench's child
// processes with their logs in the run's log folder: the journal scenario's broker with a
// standby, and the takeover scenario's leader to kill. Members are named a and b; each has
// a journal of its own; a leads first and b copies it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "process.hpp"
#include "scenario.hpp"

namespace rlbus::bench {

/// "" when etcd is installed, else what to install.
std::string etcd_missing();

class broker_group {
 public:
  /// Starts etcd, then a (which leads) and b, and waits until a holds b in sync. `extra`
  /// goes on each broker's command line. Throws std::runtime_error with a child's log.
  broker_group(const settings& s, const std::string& tag, const std::vector<std::string>& extra);
  ~broker_group();
  broker_group(const broker_group&) = delete;
  broker_group& operator=(const broker_group&) = delete;

  /// Both routers, leader first, comma-separated: an endpoint list for the SDKs.
  [[nodiscard]] std::string endpoints() const;
  /// The leader's router.
  [[nodiscard]] std::string leader_router() const;
  /// SIGKILLs the leader and waits until it is gone; the standby takes over once the
  /// leader's lease runs out.
  void kill_leader();
  /// Starts the broker kill_leader() killed again, as a standby, and waits until the new
  /// leader holds it in sync.
  void rejoin();

 private:
  struct member {
    std::string name, router;
    std::unique_ptr<child_process> proc;
  };
  void start(member& m);

  const settings& s_;
  std::string dir_, etcd_url_;
  std::vector<std::string> extra_;
  std::unique_ptr<child_process> etcd_;
  member members_[2];
  int leader_ = 0;
};

}  // namespace rlbus::bench
