// The coordinator's side of its task stream (SPEC §12.9): events reach the callback thread in
// seq order, each once. A duplicate (a replay of what came already) is dropped; one that comes
// early (after a gap) waits while a REPLAY fetches what is missing; what the broker no longer
// holds is reported lost in its place. Processed events are acknowledged (ACK) in bulk, so the
// broker keeps no more than its window in flight.
//
// Not thread-safe: the coordinator guards it with its core's lock. The I/O thread feeds it;
// the callback thread takes its items and reports what it processed.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "client/core/core.hpp"
#include "codec/messages.hpp"

namespace rlbus::client::detail {

class event_stream {
 public:
  /// One item for the callback thread: a stream event, a range the broker lost, or a
  /// capacity report (which has no seq).
  struct item {
    codec::task_event event;
    std::uint64_t lost_first = 0, lost_last = 0;  // lost_last != 0: a lost range
    std::optional<codec::capacity> capacity;      // set: a capacity report, not a stream step
    std::uint64_t generation = 0;                 // of the stream it belongs to
  };

  /// REPLAYs and ACKs go to `io`'s outbox; `id` names the coordinator in the log.
  event_stream(core& io, std::string id) : io_(io), id_(std::move(id)) {}

  // ---- I/O thread ----
  /// Every WELCOME: a new session begins a new stream (unless it adopted ours), and the
  /// broker is asked to replay what came after the last event processed.
  void on_welcome(const codec::welcome& w);
  void on_event(codec::task_event&& e);
  void on_gap(const codec::stream_gap& g);
  /// A capacity report, in order with the events around it.
  void on_capacity(codec::capacity&& c);

  // ---- callback thread ----
  /// What arrived, in order, for the callback thread to take.
  [[nodiscard]] std::deque<item>& items() noexcept { return items_; }
  /// The callback thread processed `seq` (the last of a lost range for one) of stream
  /// `generation`; `more`: it holds others already. Acknowledges every ack_every events, and
  /// whenever the callback thread has caught up, so a window smaller than that never stalls.
  void processed(std::uint64_t seq, std::uint64_t generation, bool more);

  [[nodiscard]] std::uint64_t gaps() const noexcept { return gaps_; }
  [[nodiscard]] std::uint64_t duplicates() const noexcept { return duplicates_; }
  [[nodiscard]] std::uint64_t replays() const noexcept { return replays_; }

 private:
  void ask_replay(std::uint64_t from, bool first = false);
  void deliver(codec::task_event&& e);
  /// Hands on what `early_` holds in order, and asks once per gap for what is missing.
  void settle();

  core& io_;
  std::string id_;
  std::deque<item> items_;                            // in arrival order
  std::uint64_t next_seq_ = 1;                        // the next seq to hand on
  std::uint64_t processed_ = 0;                       // the last seq the callback thread finished
  std::uint64_t since_ack_ = 0;                       // processed since the last ACK
  std::uint64_t generation_ = 0;                      // +1 per new stream (a new session)
  std::map<std::uint64_t, codec::task_event> early_;  // arrived ahead of a gap
  std::optional<std::uint64_t> replay_asked_;         // next_seq_ when the pending REPLAY was asked
  std::uint64_t gaps_ = 0;                            // events lost: they never arrived
  std::uint64_t duplicates_ = 0;
  std::uint64_t replays_ = 0;
};

}  // namespace rlbus::client::detail
