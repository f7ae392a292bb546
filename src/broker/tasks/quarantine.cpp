// See quarantine.hpp.
#include "broker/tasks/quarantine.hpp"

#include <algorithm>

namespace rlbus::broker {

namespace {
constexpr std::uint32_t max_doublings = 3;  // 1, 2, 4, 8 x the period
}

quarantine::quarantine(std::uint32_t after, std::chrono::milliseconds period, std::size_t max_ids)
    : after_(after), period_(period), max_ids_(std::max<std::size_t>(max_ids, 1)) {}

std::optional<quarantine::begun> quarantine::failed(const std::string& id, util::time_point now) {
  if (after_ == 0) return std::nullopt;
  auto it = ids_.find(id);
  if (it == ids_.end()) {
    make_room();
    it = ids_.emplace(id, record{}).first;
  }
  auto& r = it->second;
  if (++r.failures < after_) return std::nullopt;
  const auto length = period_ * (1U << std::min(r.streak, max_doublings));
  r.failures = 0;
  ++r.streak;
  if (r.until) releases_.erase({*r.until, id});
  r.until = now + length;
  releases_.emplace(*r.until, id);
  ++total_;
  return begun{length, after_};
}

void quarantine::succeeded(const std::string& id) {
  const auto it = ids_.find(id);
  if (it != ids_.end()) forget(it);
}

bool quarantine::held(const std::string& id) const {
  const auto it = ids_.find(id);
  return it != ids_.end() && it->second.until.has_value();
}

std::optional<util::time_point> quarantine::next_release() const {
  if (releases_.empty()) return std::nullopt;
  return releases_.begin()->first;
}

std::vector<std::string> quarantine::released(util::time_point now) {
  std::vector<std::string> out;
  while (!releases_.empty() && releases_.begin()->first <= now) {
    auto id = releases_.begin()->second;
    releases_.erase(releases_.begin());
    ids_.at(id).until.reset();  // the count and the streak stay: failing again costs more
    out.push_back(std::move(id));
  }
  return out;
}

void quarantine::forget(std::unordered_map<std::string, record>::iterator it) {
  if (it->second.until) releases_.erase({*it->second.until, it->first});
  ids_.erase(it);
}

// A full table forgets the ids that are not in quarantine first; a table full of
// quarantines (more broken workers than max_ids) forgets the one that ends first.
void quarantine::make_room() {
  if (ids_.size() < max_ids_) return;
  for (auto it = ids_.begin(); it != ids_.end();) {
    if (!it->second.until) {
      it = ids_.erase(it);
    } else {
      ++it;
    }
  }
  if (ids_.size() >= max_ids_) forget(ids_.find(releases_.begin()->second));
}

}  // namespace rlbus::broker
