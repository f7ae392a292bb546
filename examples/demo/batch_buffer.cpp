// See batch_buffer.hpp. Per version, one slot per (direction, sign): a duplicate is a filled
// slot, completeness is a count, and forgetting a version is erasing one map entry.
#include "demo/batch_buffer.hpp"

#include <cassert>

namespace rlbus::demo {

batch_buffer::batch_buffer(std::uint32_t directions, std::uint64_t lookahead)
    : directions_(directions), lookahead_(lookahead) {
  assert(directions > 0);
}

batch_buffer::add_status batch_buffer::add(const episode_result& r) {
  if (r.direction >= directions_ || (r.sign != 1 && r.sign != -1)) {
    ++invalid_;
    return add_status::invalid;
  }
  if (r.policy_version < floor_) {
    ++stale_;
    return add_status::stale;
  }
  if (r.policy_version - floor_ > lookahead_) {
    ++stale_;
    return add_status::too_far;
  }
  auto& slot = versions_[r.policy_version];
  if (slot.plus.empty()) {
    slot.plus.resize(directions_);
    slot.minus.resize(directions_);
  }
  auto& cell = r.sign == 1 ? slot.plus[r.direction] : slot.minus[r.direction];
  if (cell) {
    ++duplicates_;
    return add_status::duplicate;
  }
  cell = r;
  ++slot.received;
  return add_status::added;
}

std::optional<std::vector<episode_result>> batch_buffer::batch(std::uint64_t version) {
  forget_before(version);
  const auto it = versions_.find(version);
  if (it == versions_.end() || it->second.received < 2 * directions_) return std::nullopt;
  std::vector<episode_result> out;
  out.reserve(2 * static_cast<std::size_t>(directions_));
  for (std::uint32_t d = 0; d < directions_; ++d) {
    out.push_back(*it->second.plus[d]);
    out.push_back(*it->second.minus[d]);
  }
  return out;
}

void batch_buffer::forget_before(std::uint64_t version) {
  if (version <= floor_) return;
  floor_ = version;
  versions_.erase(versions_.begin(), versions_.lower_bound(version));
}

std::uint32_t batch_buffer::received(std::uint64_t version) const {
  const auto it = versions_.find(version);
  return it == versions_.end() ? 0 : it->second.received;
}

}  // namespace rlbus::demo
