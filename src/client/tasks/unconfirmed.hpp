// Reliable data on the worker's side (SPEC §12.11): the numbered items of one attempt (DATA
// and INFO, or LEARN_INFO, §12.11.10) that were sent and that the broker has not confirmed
// yet (DATA_ACK `relayed`). They are kept, within a bound, and go again after a resumed
// session or when the broker asks; what the bound made us drop is declared with DATA_LOST, so
// the broker reports to the coordinator what it never got instead of missing it in silence.
//
// Not thread-safe: the worker guards it with its core's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "codec/messages.hpp"

namespace rlbus::client::detail {

class unconfirmed_data {
 public:
  unconfirmed_data(std::size_t max_items, std::size_t max_bytes)
      : max_items_(max_items), max_bytes_(max_bytes) {}

  /// Keeps the items of attempt `attempt` of `task_id` from now on (attempt 0: of none), and
  /// forgets what was kept for the one before.
  void track(const std::string& task_id, std::uint32_t attempt);
  void forget() { track("", 0); }
  [[nodiscard]] bool tracking() const noexcept { return attempt_ != 0; }
  /// Whether attempt `attempt` of `task_id` is the one whose items are kept.
  [[nodiscard]] bool ours(const std::string& task_id, std::uint32_t attempt) const;

  /// A message just sent: kept until confirmed when it is a numbered item of ours. Past the
  /// bound the oldest go (most arrived long ago; only a resend finds out which did not).
  void sent(codec::message&& m);
  /// The broker relayed everything up to index `relayed`: those are let go.
  void confirm(std::uint64_t relayed);
  /// False for an outbox message not worth sending any more: the broker confirmed it.
  [[nodiscard]] bool worth_sending(const codec::message& m) const;
  /// The broker may lack anything sent and not confirmed: it all goes to the front of
  /// `outbox` again, after a DATA_LOST for what was dropped. Unsent items are all newer than
  /// kept ones, so the broker still gets them in index order.
  void resend(std::deque<codec::message>& outbox);

  /// The bytes of a DATA, INFO or LEARN_INFO's user data (what the byte bound counts).
  static std::size_t size_of(const codec::message& m);

  [[nodiscard]] std::uint64_t dropped() const noexcept { return dropped_count_; }
  [[nodiscard]] std::uint64_t resent() const noexcept { return resent_count_; }

 private:
  // The index of a numbered DATA, INFO or LEARN_INFO of the attempt whose items are kept.
  [[nodiscard]] std::optional<std::uint64_t> index_of(const codec::message& m) const;

  std::size_t max_items_;
  std::size_t max_bytes_;
  std::string task_;
  std::uint32_t attempt_ = 0;
  std::uint64_t confirmed_ = 0;      // the broker relayed every index up to this one
  std::uint64_t dropped_upto_ = 0;   // the bound let go of every index up to this one
  std::deque<codec::message> kept_;  // in index order
  std::size_t kept_bytes_ = 0;
  std::uint64_t dropped_count_ = 0;
  std::uint64_t resent_count_ = 0;
};

}  // namespace rlbus::client::detail
