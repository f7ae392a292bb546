// See stream.hpp.
#include "broker/tasks/stream.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace rlbus::broker {

void coordinator_stream::push(held h) {
  ring_bytes += h.body_bytes;
  ring_items += h.items;
  ring.push_back(std::move(h));
}

void coordinator_stream::pop_front() {
  const auto& oldest = ring.front();
  const auto bytes = oldest.body_bytes;
  if (oldest.seq <= acked) {
    acked_bytes -= bytes;
    acked_items -= oldest.items;
  }
  ring_bytes -= bytes;
  ring_items -= oldest.items;
  ring.pop_front();
}

void coordinator_stream::trim(std::size_t events, std::size_t bytes) {
  while (ring.size() > events || ring_bytes > bytes) pop_front();
}

std::optional<refusal> coordinator_stream::replay(std::uint64_t from_seq) {
  if (from_seq > seq + 1)
    return refusal{codec::error_code::bad_seq,
                   fmt::format("REPLAY from {}: your stream's last event is {}, so from_seq is "
                               "1..{}",
                               from_seq, seq, seq + 1)};
  // "Everything before from_seq is processed, nothing from it on": the stream restarts there.
  windowed = true;
  awaiting_resume = false;
  set_acked(from_seq - 1);
  next = from_seq;
  return std::nullopt;
}

std::optional<refusal> coordinator_stream::ack(std::uint64_t s) {
  if (s > seq)
    return refusal{codec::error_code::bad_seq,
                   fmt::format("ACK of {}: your stream's last event is {}", s, seq)};
  windowed = true;
  awaiting_resume = false;
  if (s > acked) set_acked(s);  // an older ACK tells nothing new
  if (next <= acked) next = acked + 1;
  return std::nullopt;
}

void coordinator_stream::set_acked(std::uint64_t seq) {
  // acked_bytes stays the bytes of the ring's events at or below `acked`.
  const auto count_upto = [&](std::uint64_t v) -> std::size_t {
    if (ring.empty() || v < ring.front().seq) return 0;
    return static_cast<std::size_t>(std::min<std::uint64_t>(v - ring.front().seq + 1, ring.size()));
  };
  const auto from = count_upto(acked);
  const auto to = count_upto(seq);
  for (auto i = from; i < to; ++i) {
    acked_bytes += ring[i].body_bytes;
    acked_items += ring[i].items;
  }
  for (auto i = to; i < from; ++i) {
    acked_bytes -= ring[i].body_bytes;
    acked_items -= ring[i].items;
  }
  acked = seq;
}

void coordinator_stream::pump(task_sink& sink, const std::string& owner, std::size_t window_events,
                              task_counts& counts) {
  if (!windowed || awaiting_resume) return;
  const auto window = static_cast<std::uint64_t>(window_events);
  const auto limit = [&] {
    return acked > ~std::uint64_t{0} - window ? ~std::uint64_t{0} : acked + window;
  };
  while (next <= seq && next <= limit()) {
    const auto front = ring.empty() ? seq + 1 : ring.front().seq;
    if (next < front) {
      if (!sink.send_to(owner, codec::stream_gap{next, front - 1})) return;
      spdlog::warn("coordinator {}: events {}..{} of its stream are gone from the ring", owner,
                   next, front - 1);
      counts.lost += front - next;
      next = front;
      // Nothing to process in them: they count as acknowledged, out of the window's way.
      if (acked < front - 1) set_acked(front - 1);
      continue;
    }
    if (ring[next - front].placeholder()) {
      // Seqs the broker restarted without (§14): reported lost, as the ring's own losses.
      auto last = next;
      while (last < seq && ring[last + 1 - front].placeholder()) ++last;
      if (!sink.send_to(owner, codec::stream_gap{next, last})) return;
      counts.lost += last - next + 1;
      next = last + 1;
      if (acked < last) set_acked(last);
      continue;
    }
    // Not sent (the connection is gone or full): held, sent again on the next ACK or REPLAY.
    if (!sink.send_encoded(owner, codec::msg_type::task_event, ring[next - front].wire)) return;
    if (next <= sent_max)
      ++counts.resent;
    else
      sent_max = next;
    ++next;
  }
}

}  // namespace rlbus::broker
