// `rlbus-demo run`: the launcher. It starts the real broker binary, then this binary again
// as a learner and N collectors (separate processes, over tcp), and is itself the
// coordinator (a trainer). It supervises the children, reports them, can kill a collector,
// the broker (started again on its journal) or the leader of a group of brokers (its standby
// takes over) on purpose (chaos), and stops everything in order at the end or on Ctrl-C.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "demo/trainer.hpp"

namespace rlbus::demo {

struct launch_options {
  trainer_options training;   // endpoint is filled in from the broker
  std::uint16_t port = 7235;  // 0: any free port
  std::uint32_t collectors = 3;
  std::string broker_path;  // "": rlbus-broker next to this executable
  std::optional<std::uint64_t> kill_collector_at;
  /// SIGKILL the broker at this iteration and start it again on its journal.
  std::optional<std::uint64_t> kill_broker_at;
  /// Run two brokers in a group beside a throwaway etcd, and SIGKILL the leader at this
  /// iteration: the standby takes over on its copy of the journal.
  std::optional<std::uint64_t> kill_leader_at;
  bool respawn = false;
  /// After training ends, keep every process (and so the broker's web view) up this long, or
  /// until Ctrl-C, which then only ends the wait.
  std::chrono::seconds linger{0};
  /// Broker liveness: a worker silent for liveness x heartbeat (training.heartbeat) is lost.
  std::uint32_t liveness = 4;
};

/// Exit statuses of `run`.
enum exit_code : int {
  exit_solved = 0,
  exit_not_solved = 1,  // a limit was reached, or training failed
  exit_usage = 2,
  exit_start_failed = 3,  // the broker or a child could not start
  exit_interrupted = 130,
};

/// Runs the whole demo; returns an exit_code. Installs SIGINT/SIGTERM handlers. Call from
/// main (it forks children and must outlive them).
int run_demo(launch_options opts);

}  // namespace rlbus::demo
