// What operations and metrics read of the broker: its parts, each as a const reference. The
// broker hands one over on its loop's thread (server::view()); nothing through it changes the
// broker, and it is valid only for the call it is given to.
#pragma once

#include <array>
#include <cstdint>

#include "broker/bus/topic_bus.hpp"
#include "broker/core/config.hpp"
#include "broker/core/gatekeeper.hpp"
#include "broker/core/peer_table.hpp"
#include "broker/durability/journal.hpp"
#include "broker/group/replicator.hpp"
#include "broker/tasks/task_manager.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

struct broker_view {
  const config& cfg;
  const peer_table& peers;
  const task_manager& tasks;
  const topic_bus& bus;
  const gatekeeper& gate;
  const journal* log;                    // null without a journal
  const replicator* replication;         // null unless a group's leader copies its journal
  std::array<std::uint64_t, 2> workers;  // live collectors, learners (SPEC §12.10.1)
  std::uint64_t nodes;                   // live sessions of role bus (SPEC §17.9)
  bool draining;
  util::time_point started;
  std::uint64_t epoch;  // this run's (SPEC §4.2.1)
};

}  // namespace rlbus::broker
