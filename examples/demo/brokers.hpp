// The demo's brokers, as child processes of the launcher, each with a journal in a scratch
// directory of the run:
// - alone: one broker; chaos kills it and starts it again on its journal;
// - in a group: two brokers elected through a throwaway etcd, the standby copying the
//   leader's journal; chaos kills the leader, the standby takes over, and the killed one is
//   started again as the new standby.
// Peers are given endpoint(): one broker, or both of the group (the SDK finds the leader).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "demo/console.hpp"

namespace rlbus::cluster {
class local_etcd;
}

namespace rlbus::demo {

struct broker_options {
  std::string path;           // the rlbus-broker binary
  std::uint16_t port = 7235;  // the first broker's port on 127.0.0.1; 0: any free port
  std::uint32_t liveness = 4;
  bool group = false;
};

/// What a takeover took, as the launcher saw it (SIGKILL of the leader, the standby's log).
struct takeover_record {
  std::string killed, successor;
  std::chrono::steady_clock::time_point killed_at;
  std::optional<std::chrono::steady_clock::time_point> leading_at;
};

class broker_set {
 public:
  using clock = std::chrono::steady_clock;
  /// Starts the broker, or etcd and both brokers of the group, and waits until peers can be
  /// served (and, in a group, the standby has started); throws std::runtime_error saying
  /// what did not start and why.
  broker_set(broker_options o, console& out, clock::time_point started);
  ~broker_set();
  broker_set(const broker_set&) = delete;
  broker_set& operator=(const broker_set&) = delete;

  /// What peers connect to: one endpoint, or the group's two separated by a comma.
  [[nodiscard]] std::string endpoint() const;
  /// One line per process: pid, router, events (for the launcher's opening block).
  [[nodiscard]] std::vector<std::string> describe() const;
  /// Passes the brokers' warnings and errors (and, in a group, their elections) to the console.
  void forward(bool on);
  /// Called each turn of the launcher: starts the leader kill_leader() killed again once its
  /// successor leads, and returns why the brokers can no longer serve (a broker died that was
  /// not killed on purpose, or did not come back), or nullopt while they can.
  std::optional<std::string> tend();

  /// Alone: SIGKILL the broker and start it again on its journal (throws if it does not
  /// come back). Returns a line for the console.
  std::string kill_and_restart();
  /// A group: whether the standby holds everything the leader accepted, so that killing the
  /// leader loses nothing (a leader killed earlier would leave no broker allowed to lead).
  [[nodiscard]] bool standby_in_sync() const;
  /// A group: SIGKILL the leader (the standby takes over) and start it again as the new
  /// standby. Returns a line for the console.
  std::string kill_leader();
  /// The takeover, once kill_leader() ran; leading_at fills in when the successor leads.
  [[nodiscard]] std::optional<takeover_record> takeover() const;

  /// Stops the brokers (SIGTERM, then SIGKILL after `grace`), then etcd.
  void stop(std::chrono::milliseconds grace);

 private:
  struct member;
  std::unique_ptr<member> spawn(const std::string& name, std::uint16_t port, std::uint16_t web);
  static std::uint16_t free_web_port();
  [[nodiscard]] std::string label(const std::string& name) const;  // "broker a", "the broker"
  [[nodiscard]] std::vector<std::string> args(const std::string& name, std::uint16_t port,
                                              std::uint16_t web) const;

  broker_options o_;
  console& out_;
  clock::time_point started_;
  std::string scratch_;
  std::unique_ptr<cluster::local_etcd> etcd_;
  std::vector<std::unique_ptr<member>> members_;  // a group: [0] leads unless killed
  std::optional<takeover_record> takeover_;
  bool forward_ = false;
};

}  // namespace rlbus::demo
