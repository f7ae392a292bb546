#include "broker/tasks/stream_set.hpp"

#include <algorithm>

#include "broker/tasks/attempt_data.hpp"

namespace rlbus::broker {

coordinator_stream* stream_set::find(const std::string& owner) {
  const auto it = streams_.find(owner);
  return it == streams_.end() ? nullptr : &it->second;
}

const coordinator_stream* stream_set::find(const std::string& owner) const {
  const auto it = streams_.find(owner);
  return it == streams_.end() ? nullptr : &it->second;
}

void stream_set::drop(const std::string& owner) {
  const auto it = streams_.find(owner);
  if (it == streams_.end()) return;
  ring_total_ -= it->second.ring_bytes;
  streams_.erase(it);
}

void stream_set::keep(const std::string& owner, coordinator_stream& s,
                      coordinator_stream::held event) {
  const auto ring_before = s.ring_bytes;
  s.push(std::move(event));
  s.trim(cfg_.stream_ring, cfg_.stream_ring_bytes);
  ring_total_ = ring_total_ - ring_before + s.ring_bytes;
  while (over_share(s) && s.ring.size() > 1) {
    ring_total_ -= s.ring.front().body_bytes;
    s.pop_front();
    ++counts_.ring_budget_drops;
  }
  pump(owner, s);
}

void stream_set::pump_all() {
  for (auto& [owner, s] : streams_)
    if (s.windowed && s.next <= s.seq) pump(owner, s);
}

void stream_set::recount() {
  ring_total_ = 0;
  for (const auto& [owner, s] : streams_) ring_total_ += s.ring_bytes;
}

std::size_t stream_set::pool() const {
  const auto budget = cfg_.memory_budget, shared = budget - budget / 4;
  return std::min(budget / 2, shared - std::min(sink_.queued_bytes(), shared));
}

bool stream_set::over_share(const coordinator_stream& s) const {
  const auto p = pool();
  return ring_total_ >= p && s.ring_bytes >= p / std::max<std::size_t>(1, streams_.size());
}

std::uint64_t stream_set::chunk(const coordinator_stream& s) const {
  return attempt_data::chunk(static_cast<std::uint64_t>(cfg_.stream_window), s.credited.size());
}

}  // namespace rlbus::broker
