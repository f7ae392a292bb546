// What the task manager and the streams it owns need of the broker loop (task_sink: send to
// a peer, publish, ask what is wanted) and what they count for it (task_counts, which the
// broker's stats take up). The broker implements the sink; tests drive the task manager with
// a fake one (tests/support/fake_sink.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "codec/messages.hpp"
#include "util/zmq_send.hpp"

namespace rlbus::broker {

/// What the task manager needs from the broker loop.
class task_sink {
 public:
  virtual ~task_sink() = default;
  /// Sends to the live session of `peer_id`; false if there is none or it cannot take more.
  virtual bool send_to(std::string_view peer_id, const codec::message& m) = 0;
  /// The same for a message already encoded: `body` is a message of `type`, canonical.
  virtual bool send_encoded(std::string_view peer_id, codec::msg_type type,
                            const util::shared_frame& body) = 0;
  /// Publishes an event on the PUB.
  virtual void publish(std::string_view topic, decltype(codec::event::body) body) = 0;
  /// Whether any subscriber asked for `topic`: when not, a body need not be built.
  virtual bool wanted(std::string_view topic) = 0;
  /// Bytes queued to all connections now, which share the memory budget with the rings.
  [[nodiscard]] virtual std::size_t queued_bytes() const { return 0; }
};

struct task_counts {
  std::uint64_t queued = 0, running = 0, finished = 0, failed = 0, requeued = 0, cancelled = 0,
                stale = 0;
  // streams (§12.9): REPLAYs served, events sent again, events reported lost (STREAM_GAP)
  std::uint64_t replays = 0, resent = 0, lost = 0;
  // reliable data (§12.11): indexed DATA dropped as already relayed, dropped as past the
  // next index, and DATA declared lost by their collectors
  std::uint64_t data_duplicates = 0, data_out_of_order = 0, data_lost = 0;
  // collected data: items relayed (a DATA is one, a DATA_BATCH its new items), and of those
  // that name the version of their task's policy, how many and by how many versions in all
  // they trailed the newest one the broker held when they came (§13)
  std::uint64_t data_items = 0, data_lag_items = 0, data_lag_versions = 0;
  // quarantine (§12.6.9): workers in quarantine now, and quarantines begun in all
  std::uint64_t quarantined = 0, quarantines = 0;
  // coordinator grace (§12.5.8): coordinators whose tasks await adoption now, adoptions made
  std::uint64_t orphaned = 0, adoptions = 0;
  // SUBMITs refused because their coordinator held max-tasks-per-coordinator (§15.5)
  std::uint64_t task_limit = 0;
  // event body bytes all rings hold now, and events dropped from a ring past its share of
  // half the memory budget (§15.5)
  std::uint64_t ring_bytes = 0, ring_budget_drops = 0;
};

}  // namespace rlbus::broker
