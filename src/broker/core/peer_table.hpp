// The broker's sessions: one `peer` per introduced connection, found by ROUTER routing id
// or by peer id, and an expiry schedule ordered by deadline.
//
// Expiry is a min-heap of (deadline, slot, generation) with lazy refresh: a message from a
// peer only stores its arrival time (O(1) on the hot path); when a heap entry comes due the
// table re-checks the peer and either expires it or re-schedules it at its real deadline.
// Each live peer has exactly one entry, and every due entry is examined, so no expired peer
// hides behind a live one (the failure of a list scan that stops at the first live peer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "codec/vocabulary.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

/// Where a worker kind sits in the broker's per-kind arrays (its free pools, its live
/// counts): collectors 0, learners 1.
inline std::size_t worker_slot(rlbus::role kind) {
  return kind == rlbus::role::learner ? 1 : 0;
}

struct peer {
  std::string routing_id;
  std::string id;
  rlbus::role role = rlbus::role::collector;
  rlbus::resources resources;
  std::uint64_t session = 0;  // the secret token; only this peer's connection ever sees it
  std::uint64_t serial = 0;   // public number of the session, for events and logs
  std::uint32_t heartbeat_ms = 0;
  util::clock::duration window{};  // silence allowed: liveness x heartbeat
  util::time_point joined{};
  util::time_point last_seen{};
  std::uint32_t faults = 0;
  std::string task_id;  // the task a worker runs now ("" = free)
  std::string key;      // the CURVE public key it connected with ("" in plain mode)
};

class peer_table {
 public:
  /// Lookups; the pointer is valid until the peer is erased or another peer is inserted.
  peer* by_routing(std::string_view routing_id);
  peer* by_id(std::string_view id);
  const peer* by_id(std::string_view id) const;

  /// Adds a peer (routing id and id must both be unused) and schedules its expiry.
  peer& insert(peer p);
  /// Moves a session to a new connection (a resumed session); the old routing id is freed.
  void rebind(peer& p, std::string routing_id);
  /// Re-plans a peer's expiry after its window changed (a resumed session may shrink it).
  void reschedule(peer& p);
  /// Removes a peer; its pending heap entry becomes stale and is skipped later.
  void erase(const peer& p);

  [[nodiscard]] std::size_t size() const noexcept { return by_id_.size(); }
  /// Earliest scheduled check (may be earlier than any real deadline, never later).
  [[nodiscard]] std::optional<util::time_point> next_check() const;

  /// Hands every peer silent past its window at `now` to `on_expired`, then erases it.
  void expire(util::time_point now, const std::function<void(const peer&)>& on_expired);

  template <class F>
  void for_each(F&& f) const {
    for (const auto& slot : slots_)
      if (slot) f(*slot);
  }

 private:
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  using index = std::unordered_map<std::string, std::uint32_t, string_hash, std::equal_to<>>;

  struct check {
    util::time_point due;
    std::uint32_t slot;
    std::uint32_t generation;
    bool operator>(const check& o) const noexcept { return due > o.due; }
  };

  std::uint32_t slot_of(const peer& p) const;

  std::vector<std::optional<peer>> slots_;
  std::vector<std::uint32_t> generation_;  // bumped on erase and reschedule: old checks go stale
  std::vector<std::uint32_t> free_;
  index by_routing_;
  index by_id_;
  std::priority_queue<check, std::vector<check>, std::greater<>> checks_;
};

}  // namespace rlbus::broker
