// The latest version of each policy (SPEC §13). Learners publish versions; the store keeps
// only the newest complete one per policy id, so a collector starting a task is handed
// what the learner last published and never an older one. Bounded in ids and in bytes per
// version, so its memory is at most max_ids x max_bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "broker/core/refusal.hpp"
#include "codec/messages.hpp"

namespace rlbus::broker {

struct stored_policy {
  std::uint64_t version = 0;
  std::optional<std::string> ref;
  std::optional<std::string> params;
  std::string publisher;
};

class policy_store {
 public:
  policy_store(std::size_t max_ids, std::size_t max_bytes)
      : max_ids_(max_ids), max_bytes_(max_bytes) {}

  /// Keeps `p` as the latest version of its policy, or says why not: a version not above
  /// the held one (STALE_POLICY, a race between learners rather than a fault), inline
  /// params over the size limit or a new id past the id limit (POLICY_LIMIT).
  std::optional<refusal> publish(const std::string& publisher, codec::policy&& p);

  /// The latest version of `policy_id`, or nullptr before the first.
  [[nodiscard]] const stored_policy* latest(const std::string& policy_id) const;
  /// Every policy id with its latest version.
  [[nodiscard]] const std::unordered_map<std::string, stored_policy>& all() const noexcept {
    return policies_;
  }

 private:
  std::size_t max_ids_;
  std::size_t max_bytes_;
  std::unordered_map<std::string, stored_policy> policies_;
};

}  // namespace rlbus::broker
