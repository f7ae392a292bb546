// The coordinator's replay buffer for the demo: episode results grouped by policy version,
// handed to the learner as one whole batch per version. Collectors' results arrive in any
// order, twice when a lost task is re-run, and late after the learner moved on; this is
// where that is sorted out, so the learner only ever sees complete, clean batches.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "demo/messages.hpp"

namespace rlbus::demo {

class batch_buffer {
 public:
  /// What add() did with a result.
  enum class add_status {
    added,      // kept for its version
    stale,      // for a version before the oldest one still wanted: dropped
    too_far,    // more than `lookahead` versions past the oldest wanted: dropped
    duplicate,  // this (version, direction, sign) is already in (a re-run task): dropped
    invalid,    // direction out of range or sign not +-1: dropped
  };

  /// A batch is 2 x `directions` results (> 0). Results up to `lookahead` versions ahead of
  /// the oldest wanted one are kept (a collector may hold a newer policy than the learner
  /// has asked for yet); beyond that they can only be a bug, and would grow without bound.
  explicit batch_buffer(std::uint32_t directions, std::uint64_t lookahead = 4);

  add_status add(const episode_result& r);

  /// The whole batch of `version` once every result is in (ordered by direction, + before
  /// -), nullopt until then. Asking for a version means older ones are no longer wanted:
  /// they are forgotten, and their late results count as stale. The batch stays until a
  /// newer version is asked for, so asking twice (a lost reply) gives it again.
  std::optional<std::vector<episode_result>> batch(std::uint64_t version);

  /// Forgets every version before `version` (e.g. once the learner announced it).
  void forget_before(std::uint64_t version);

  /// Results held for `version`.
  [[nodiscard]] std::uint32_t received(std::uint64_t version) const;
  [[nodiscard]] std::uint64_t oldest_wanted() const noexcept { return floor_; }
  /// Results dropped so far, by reason (stale and too_far count as stale).
  [[nodiscard]] std::uint64_t stale() const noexcept { return stale_; }
  [[nodiscard]] std::uint64_t duplicates() const noexcept { return duplicates_; }
  [[nodiscard]] std::uint64_t invalid() const noexcept { return invalid_; }

 private:
  struct version_slot {
    std::vector<std::optional<episode_result>> plus, minus;
    std::uint32_t received = 0;
  };

  std::uint32_t directions_;
  std::uint64_t lookahead_;
  std::uint64_t floor_ = 0;
  std::map<std::uint64_t, version_slot> versions_;
  std::uint64_t stale_ = 0, duplicates_ = 0, invalid_ = 0;
};

}  // namespace rlbus::demo
