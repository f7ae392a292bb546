// A coordinator's stream (SPEC §12.8, §12.9): its TASK_EVENTs, numbered by seq and kept in
// a bounded ring for REPLAY, and the window that holds back what the coordinator has not
// acknowledged. The task manager makes the events and grants data credit out of the window;
// this unit keeps the ring, the acknowledgement accounting (events, items, bytes) and sends
// what the window lets out. Single-threaded, like the task manager that owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "broker/core/refusal.hpp"
#include "broker/tasks/task_sink.hpp"
#include "codec/messages.hpp"
#include "util/zmq_send.hpp"

namespace rlbus::broker {

struct coordinator_stream {
  std::uint64_t seq = 0;  // the last event made: the head
  // Each a TASK_EVENT, held as the bytes it travels as: encoded once, however often it is
  // sent. With it, what the stream needs to know of it without decoding it.
  struct held {
    std::uint64_t seq = 0;
    util::shared_frame wire;     // empty: a seq the broker restarted without (§14)
    std::size_t body_bytes = 0;  // of the event's `body`: what the ring's byte bound counts
    // The data items it carries (a data_batch its items, any other event 1): the window and
    // data credit count items, so batching DATA cannot stretch them (§12.12.3).
    std::uint32_t items = 1;
    bool ends = false;  // the last event of a task, which the journal keeps (§14)
    [[nodiscard]] bool placeholder() const noexcept { return wire.empty(); }
  };
  std::deque<held> ring;
  std::size_t ring_bytes = 0;
  std::uint64_t ring_items = 0;   // the items of the ring's events
  std::uint64_t acked_items = 0;  // ... of those at or below `acked`
  // Flow control (§12.9), off until the coordinator's first ACK or REPLAY: until then
  // every event is sent as it is made, as in v1.
  bool windowed = false;
  // A new session adopted the stream (§12.5.8), or the session resumed on a new connection
  // (§8.6), and has not said where it goes on (its REPLAY or ACK): nothing is sent meanwhile,
  // so that it never sees an event before those it missed, nor one twice.
  bool awaiting_resume = false;
  std::uint64_t acked = 0;         // the coordinator has processed every event up to here
  std::uint64_t next = 1;          // the next event to send
  std::uint64_t sent_max = 0;      // the highest seq ever sent: sending one at or below is a resend
  std::size_t acked_bytes = 0;     // body bytes of the ring's events at or below `acked`
  std::size_t max_data_bytes = 0;  // the largest `data` body so far: what a unit of credit may cost
  std::set<std::string> credited;  // tasks whose current attempt holds data credit
  std::uint64_t reserved = 0;      // the journal allows seqs up to here (§14)

  void set_acked(std::uint64_t seq);
  /// A new event at the head; pop_front() drops the oldest.
  void push(held h);
  void pop_front();
  /// Drops the oldest events until the ring holds at most `events` of them and `bytes` of
  /// their bodies (§12.8.3).
  void trim(std::size_t events, std::size_t bytes);
  /// REPLAY from `from_seq` (§12.9.6) and ACK of `seq` (§12.9.8): the stream becomes
  /// windowed and its acknowledgement moves; a seq past the head is refused (413) and
  /// changes nothing.
  std::optional<refusal> replay(std::uint64_t from_seq);
  std::optional<refusal> ack(std::uint64_t seq);
  /// Sends held events while the window (`window` events past acked) has room: at most
  /// that many per call, so one REPLAY or ACK never makes a burst larger than the window.
  /// Events the ring no longer holds are reported with STREAM_GAP, never skipped in silence.
  void pump(task_sink& sink, const std::string& owner, std::size_t window, task_counts& counts);
  [[nodiscard]] std::size_t unacked_bytes() const { return ring_bytes - acked_bytes; }
  /// The items of the unacknowledged events: the ring's, and 1 for each event the ring
  /// dropped before it was acknowledged.
  [[nodiscard]] std::uint64_t unacked_items() const {
    const auto front = ring.empty() ? seq + 1 : ring.front().seq;
    const auto dropped = front - 1 > acked ? front - 1 - acked : 0;
    return ring_items - acked_items + dropped;
  }
};

}  // namespace rlbus::broker
