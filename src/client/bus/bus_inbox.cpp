// See bus_inbox.hpp.
#include "client/bus/bus_inbox.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "codec/batch.hpp"

namespace rlbus::client::detail {

bool bus_inbox::deliver(const codec::deliver& d, std::string_view payload) {
  if (d.seq <= taken_) return false;                    // sent again after a resumption: we have it
  if (d.seq > taken_ + 1) lost_ += d.seq - taken_ - 1;  // not announced: a gap all the same
  taken_ = d.seq;
  if (d.count) {  // a batch: its publications, in order, under the one seq (SPEC §17.5.1)
    if (drop_partial(d.from)) ++lost_;  // a batch is part 0 of nothing: an open one ended
    const bool whole = codec::for_each_in_batch(payload, *d.count, [&](std::string_view item) {
      ready_.emplace_back(d.seq, bus_message{d.topic, std::string(item), d.from, false});
    });
    if (whole) return true;  // (nothing of a bad one was handed on)
    spdlog::warn("bus: a batch of {} from {} on '{}' does not hold its items: {} lost", *d.count,
                 d.from, d.topic, *d.count);
    lost_ += *d.count;
  } else if (auto done = join(d, payload)) {
    ready_.emplace_back(d.seq, std::move(*done));
    return true;
  }
  if (ready_.empty()) consumed_ = d.seq;  // absorbed into a partial, or dropped
  if (ready_.empty() && consumed_ - ack_sent_ >= ack_every) ack_due_ = true;
  return false;
}

std::optional<bus_message> bus_inbox::join(const codec::deliver& d, std::string_view payload) {
  if (d.abandoned) {
    if (drop_partial(d.from)) ++lost_;
    return std::nullopt;
  }
  if (d.part == 0) {
    if (drop_partial(d.from)) ++lost_;  // its end never came
    if (!d.more) return bus_message{d.topic, std::string(payload), d.from, d.retained};
    partial_.insert_or_assign(d.from, partial{d.topic, 1, std::string(payload)});
    partial_bytes_ += payload.size();
    bound_partials();
    return std::nullopt;
  }
  const auto it = partial_.find(d.from);
  if (it == partial_.end() || it->second.next_part != d.part || it->second.topic != d.topic)
    return std::nullopt;  // its start was lost (a gap, the bound): counted then
  auto& held = it->second;
  held.bytes.append(payload);
  partial_bytes_ += payload.size();
  if (d.more) {
    ++held.next_part;
    bound_partials();
    return std::nullopt;
  }
  partial_bytes_ -= held.bytes.size();
  bus_message m{std::move(held.topic), std::move(held.bytes), d.from, false};
  partial_.erase(it);
  return m;
}

bool bus_inbox::drop_partial(const std::string& sender) {
  const auto it = partial_.find(sender);
  if (it == partial_.end()) return false;
  partial_bytes_ -= it->second.bytes.size();
  partial_.erase(it);
  return true;
}

void bus_inbox::bound_partials() {
  while (partial_bytes_ > max_partial_ && !partial_.empty()) {
    const auto largest = std::max_element(
        partial_.begin(), partial_.end(),
        [](const auto& a, const auto& b) { return a.second.bytes.size() < b.second.bytes.size(); });
    spdlog::warn(
        "bus: dropping an incomplete publication of {} ({} bytes held, max_partial_bytes {})",
        largest->first, partial_bytes_, max_partial_);
    partial_bytes_ -= largest->second.bytes.size();
    partial_.erase(largest);
    ++lost_;
  }
}

void bus_inbox::gap(std::uint64_t first, std::uint64_t last) {
  if (last <= taken_) return;  // heard of it already
  lost_ += last - std::max(first - 1, taken_);
  taken_ = last;
  lost_ += partial_.size();  // a fragment of any of them may be among those lost
  partial_.clear();
  partial_bytes_ = 0;
  if (ready_.empty()) consumed_ = last;
  ack_due_ = true;
}

void bus_inbox::new_session() {
  lost_ += partial_.size();
  partial_.clear();
  partial_bytes_ = 0;
  for (auto& r : ready_) r.first = 0;  // their seqs belong to the session that ended
  taken_ = consumed_ = ack_sent_ = 0;
  ack_due_ = false;
}

bus_message bus_inbox::take() {
  auto m = std::move(ready_.front().second);
  ready_.pop_front();
  // Everything before the next one waiting is taken (handed out, or absorbed).
  consumed_ = ready_.empty() ? taken_ : std::max<std::uint64_t>(ready_.front().first, 1) - 1;
  if (consumed_ - ack_sent_ >= ack_every || ready_.empty()) ack_due_ = true;
  return m;
}

}  // namespace rlbus::client::detail
