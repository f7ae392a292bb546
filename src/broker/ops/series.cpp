// See series.hpp.
#include "broker/ops/series.hpp"

#include <algorithm>

#include "broker/ops/metrics.hpp"
#include "codec/protocol.hpp"

namespace rlbus::broker {

namespace {

std::uint64_t max_version(const stats& s) {
  std::uint64_t v = 0;
  for (const auto& [name, version] : s.policy_versions) v = std::max(v, version);
  return v;
}

std::uint64_t sent(const stats& s, codec::msg_type t) {
  return s.sent_by_type[static_cast<std::uint8_t>(t)];
}

// Each column's value in a snapshot, in the order of columns().
std::vector<std::uint64_t> values_of(const stats& s) {
  using codec::msg_type;
  return {
      s.messages_in,
      s.messages_out,
      sent(s, msg_type::task_event),
      s.data_items,
      s.data_lag_items,
      s.data_lag_versions,
      s.assignment_latency.count,
      s.tasks_finished,
      s.tasks_requeued,
      s.tasks_failed,
      s.bus.published,
      s.bus.published_bytes,
      s.bus.delivered,
      s.bus.dropped,
      s.tasks_queued,
      s.tasks_running,
      s.queued_bytes + s.ring_bytes,
      s.bus.queued_bytes,
      s.connections,
      s.peers,
      max_version(s),
  };
}

}  // namespace

const std::vector<series::column>& series::columns() {
  static const std::vector<column> all{
      {"messages_in", kind::counter, "messages received"},
      {"messages_out", kind::counter, "messages sent"},
      {"task_events", kind::counter, "TASK_EVENTs sent to coordinators"},
      {"data_items", kind::counter, "collected data items relayed (each item of a batch)"},
      {"data_lag_items", kind::counter, "collected items that name their policy's version"},
      {"data_lag_versions", kind::counter,
       "versions those items trailed their policy's newest, in all"},
      {"tasks_started", kind::counter, "attempts assigned to a worker"},
      {"tasks_finished", kind::counter, "tasks finished"},
      {"tasks_requeued", kind::counter, "attempts that ended and went back to the queue"},
      {"tasks_failed", kind::counter, "tasks failed for good"},
      {"bus_published", kind::counter, "bus publications"},
      {"bus_published_bytes", kind::counter, "bytes of bus publications"},
      {"bus_delivered", kind::counter, "bus deliveries"},
      {"bus_dropped", kind::counter, "bus deliveries dropped by a bound (gaps)"},
      {"tasks_queued", kind::gauge, "tasks waiting for a worker"},
      {"tasks_running", kind::gauge, "tasks on a worker"},
      {"memory_budget_used", kind::gauge, "bytes of memory-budget in use (send queues, rings)"},
      {"bus_memory_used", kind::gauge, "bytes the bus's queues hold"},
      {"connections", kind::gauge, "live connections"},
      {"peers", kind::gauge, "live sessions"},
      {"policy_version", kind::gauge, "the newest version of any policy"},
  };
  return all;
}

bool series::due(std::int64_t at_ms) const {
  const std::lock_guard hold(mu_);
  return ring_.empty() || at_ms - ring_[(first_ + ring_.size() - 1) % keep_].at_ms >= every_ms_;
}

void series::record(std::int64_t at_ms, const stats& s) {
  if (!due(at_ms)) return;
  sample next{at_ms, values_of(s)};
  const std::lock_guard hold(mu_);
  if (ring_.size() < keep_) {
    ring_.push_back(std::move(next));
  } else {
    ring_[first_] = std::move(next);
    first_ = (first_ + 1) % keep_;
  }
}

std::vector<series::sample> series::since(std::int64_t after_ms) const {
  const std::lock_guard hold(mu_);
  std::vector<sample> out;
  for (std::size_t i = 0; i < ring_.size(); ++i) {
    const auto& s = ring_[(first_ + i) % keep_];
    if (s.at_ms > after_ms) out.push_back(s);
  }
  return out;
}

}  // namespace rlbus::broker
