// See peer_table.hpp for the expiry scheme.
#include "broker/core/peer_table.hpp"

#include <cassert>

namespace rlbus::broker {

peer* peer_table::by_routing(std::string_view routing_id) {
  const auto it = by_routing_.find(routing_id);
  return it == by_routing_.end() ? nullptr : &*slots_[it->second];
}

const peer* peer_table::by_id(std::string_view id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &*slots_[it->second];
}

peer* peer_table::by_id(std::string_view id) {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &*slots_[it->second];
}

peer& peer_table::insert(peer p) {
  assert(by_routing(p.routing_id) == nullptr && by_id(p.id) == nullptr);
  std::uint32_t slot = 0;
  if (free_.empty()) {
    slot = static_cast<std::uint32_t>(slots_.size());
    slots_.emplace_back();
    generation_.push_back(0);
  } else {
    slot = free_.back();
    free_.pop_back();
  }
  by_routing_.emplace(p.routing_id, slot);
  by_id_.emplace(p.id, slot);
  checks_.push({p.last_seen + p.window, slot, generation_[slot]});
  return slots_[slot].emplace(std::move(p));
}

void peer_table::rebind(peer& p, std::string routing_id) {
  const auto slot = slot_of(p);
  by_routing_.erase(p.routing_id);
  p.routing_id = std::move(routing_id);
  by_routing_.emplace(p.routing_id, slot);
}

void peer_table::reschedule(peer& p) {
  const auto slot = slot_of(p);
  ++generation_[slot];
  checks_.push({p.last_seen + p.window, slot, generation_[slot]});
}

void peer_table::erase(const peer& p) {
  const auto slot = slot_of(p);
  by_routing_.erase(p.routing_id);
  by_id_.erase(p.id);
  ++generation_[slot];
  slots_[slot].reset();
  free_.push_back(slot);
}

std::optional<util::time_point> peer_table::next_check() const {
  if (checks_.empty()) return std::nullopt;
  return checks_.top().due;
}

void peer_table::expire(util::time_point now, const std::function<void(const peer&)>& on_expired) {
  while (!checks_.empty() && checks_.top().due <= now) {
    const auto c = checks_.top();
    checks_.pop();
    if (generation_[c.slot] != c.generation || !slots_[c.slot]) continue;  // erased since
    const peer& p = *slots_[c.slot];
    const auto due = p.last_seen + p.window;
    if (due > now) {
      checks_.push({due, c.slot, c.generation});  // heard from since: look again then
      continue;
    }
    on_expired(p);
    erase(p);
  }
}

std::uint32_t peer_table::slot_of(const peer& p) const {
  const auto it = by_id_.find(p.id);
  assert(it != by_id_.end());
  return it->second;
}

}  // namespace rlbus::broker
