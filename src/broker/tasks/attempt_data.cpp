// See attempt_data.hpp.
#include "broker/tasks/attempt_data.hpp"

#include <algorithm>

namespace rlbus::broker {

void attempt_data::begin() noexcept {
  relayed_ = 0;
  ack_pending_ = 0;
  ack_pending_bytes_ = 0;
  out_of_order_ = 0;
}

void attempt_data::begin_credit() noexcept {
  credited_ = true;
  accepted_ = 0;
  limit_ = 0;
  told_.reset();
}

bool attempt_data::end_credit() noexcept {
  if (!credited_) return false;
  credited_ = false;
  accepted_ = 0;
  limit_ = 0;
  told_.reset();
  return true;
}

std::uint64_t attempt_data::top_up(std::uint64_t chunk, std::uint64_t room) noexcept {
  const auto add = std::min(chunk - unused(), room);
  limit_ += add;
  return add;
}

std::uint64_t attempt_data::chunk(std::uint64_t window, std::size_t attempts) noexcept {
  return std::max<std::uint64_t>(1, window / (2 * std::max<std::size_t>(1, attempts)));
}

std::uint64_t attempt_data::room(std::uint64_t window, std::uint64_t backlog,
                                 std::uint64_t outstanding, std::size_t unacked_bytes,
                                 std::size_t byte_budget, std::size_t item_bytes,
                                 bool held_back) noexcept {
  if (held_back || unacked_bytes >= byte_budget) return 0;
  std::uint64_t room = backlog + outstanding < window ? window - backlog - outstanding : 0;
  if (item_bytes > 0) {
    const std::uint64_t fit = (byte_budget - unacked_bytes) / item_bytes;
    room = std::min(room, fit > outstanding ? fit - outstanding : 0);
  }
  return room;
}

bool attempt_data::relayed_up_to(std::uint64_t last, std::uint64_t items,
                                 std::size_t bytes) noexcept {
  relayed_ = last;
  out_of_order_ = 0;
  ack_pending_ += items;
  ack_pending_bytes_ += bytes;
  return ack_pending_ >= ack_every || ack_pending_bytes_ >= ack_bytes;
}

void attempt_data::lost_up_to(std::uint64_t last) noexcept {
  relayed_ = last;
  out_of_order_ = 0;
}

void attempt_data::acked() noexcept {
  ack_pending_ = 0;
  ack_pending_bytes_ = 0;
}

}  // namespace rlbus::broker
