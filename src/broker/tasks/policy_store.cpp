#include "broker/tasks/policy_store.hpp"

#include <fmt/format.h>

namespace rlbus::broker {

std::optional<refusal> policy_store::publish(const std::string& publisher, codec::policy&& p) {
  if (p.params && p.params->size() > max_bytes_)
    return refusal{codec::error_code::policy_limit,
                   fmt::format("policy '{}' version {}: {} bytes of params, the limit is {}",
                               p.policy_id, p.version, p.params->size(), max_bytes_)};
  const auto it = policies_.find(p.policy_id);
  if (it == policies_.end()) {
    if (policies_.size() >= max_ids_)
      return refusal{codec::error_code::policy_limit,
                     fmt::format("policy '{}': the broker already holds its limit of {} policies",
                                 p.policy_id, max_ids_)};
  } else if (p.version <= it->second.version) {
    return refusal{codec::error_code::stale_policy,
                   fmt::format("policy '{}': version {} is not above the held version {}",
                               p.policy_id, p.version, it->second.version),
                   true};
  }
  policies_[p.policy_id] =
      stored_policy{p.version, std::move(p.ref), std::move(p.params), publisher};
  return std::nullopt;
}

const stored_policy* policy_store::latest(const std::string& policy_id) const {
  const auto it = policies_.find(policy_id);
  return it == policies_.end() ? nullptr : &it->second;
}

}  // namespace rlbus::broker
