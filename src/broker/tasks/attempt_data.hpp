// The data one attempt moves to its coordinator's stream: its data credit (SPEC §12.9.9),
// when the attempt began while its owner's stream was windowed, and where its indexed
// sequence of DATA, INFO and LEARN_INFO stands (reliable data, §12.11). It decides; the task
// manager relays what it accepts, sends what it is told to (DATA_ACK, DATA_CREDIT) and counts.
// No sockets, no clock, no stream: plain state and its rules, testable on their own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace rlbus::broker {

class attempt_data {
 public:
  /// A DATA_ACK goes out after this many relayed indexed items, or this many bytes of them,
  /// whichever comes first: what a worker keeps for a resend stays well within its bound.
  static constexpr std::uint64_t ack_every = 32;
  static constexpr std::size_t ack_bytes = std::size_t{1} << 20;

  /// A new attempt: nothing relayed yet, nothing to confirm, no gap seen. Its credit is
  /// left as it is (none: the attempt before gave it back).
  void begin() noexcept;

  // ---- data credit (§12.9.9) ----
  /// The attempt holds credit from now on, none granted yet.
  void begin_credit() noexcept;
  /// The attempt gives its credit back (it ended): false when it held none.
  bool end_credit() noexcept;
  [[nodiscard]] bool credited() const noexcept { return credited_; }
  /// Items accepted this attempt, and the running total granted in DATA_CREDIT.
  [[nodiscard]] std::uint64_t accepted() const noexcept { return accepted_; }
  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  /// Credit granted and not yet used (meaningful while credited).
  [[nodiscard]] std::uint64_t unused() const noexcept { return limit_ - accepted_; }
  /// Whether `items` more may be accepted: always without credit.
  [[nodiscard]] bool may_accept(std::uint64_t items = 1) const noexcept {
    return !credited_ || items <= unused();
  }
  /// Credited, and the worker may not know its limit: no DATA_CREDIT with the current limit
  /// reached its connection (the connection was full, or went down with it).
  [[nodiscard]] bool credit_untold() const noexcept { return credited_ && told_ != limit_; }
  /// DATA_CREDIT with the current limit went out; untold(): it may have been lost.
  void told() noexcept { told_ = limit_; }
  void untold() noexcept { told_.reset(); }
  /// Credited and all of it used: its collector waits for DATA_CREDIT.
  [[nodiscard]] bool exhausted() const noexcept { return credited_ && accepted_ >= limit_; }
  void accept(std::uint64_t items = 1) noexcept { accepted_ += items; }
  /// Used half of the `chunk` it is topped up to, or more: due a top-up.
  [[nodiscard]] bool due_top_up(std::uint64_t chunk) const noexcept {
    return unused() * 2 <= chunk;
  }
  /// Tops the unused credit up towards `chunk`, by at most `room`: what was added.
  std::uint64_t top_up(std::uint64_t chunk, std::uint64_t room) noexcept;

  /// The chunk each credited attempt of a stream is topped up to: the window shared by
  /// twice its credited attempts, at least 1.
  [[nodiscard]] static std::uint64_t chunk(std::uint64_t window, std::size_t attempts) noexcept;
  /// The credit a stream's window has room for: its unacknowledged items (`backlog`) plus
  /// all credit not yet used (`outstanding`) stay within `window`, and their bytes (a unit
  /// of credit costing `item_bytes`, the largest data item so far; 0: none yet) within
  /// `byte_budget` past the `unacked_bytes` held now. `held_back`: none at all.
  [[nodiscard]] static std::uint64_t room(std::uint64_t window, std::uint64_t backlog,
                                          std::uint64_t outstanding, std::size_t unacked_bytes,
                                          std::size_t byte_budget, std::size_t item_bytes,
                                          bool held_back) noexcept;

  // ---- reliable data (§12.11) ----
  /// Indexes 1..relayed() were relayed, or declared lost, this attempt.
  [[nodiscard]] std::uint64_t relayed() const noexcept { return relayed_; }
  /// Already relayed: a resend after a reconnect.
  [[nodiscard]] bool duplicate(std::uint64_t index) const noexcept { return index <= relayed_; }
  /// Past the next index: those before it went missing on the way.
  [[nodiscard]] bool past_next(std::uint64_t index) const noexcept { return index - 1 > relayed_; }
  /// An item past the next index came: whether to ask for a resend now (once per gap and
  /// then every 64th, so a worker that keeps sending cannot make the broker answer each).
  bool gap_asks_resend() noexcept { return out_of_order_++ % 64 == 0; }
  /// `items` items (`bytes` of them) were relayed, up to index `last`: whether a DATA_ACK
  /// is due.
  bool relayed_up_to(std::uint64_t last, std::uint64_t items, std::size_t bytes) noexcept;
  /// Items up to `last` were declared lost: they count as relayed.
  void lost_up_to(std::uint64_t last) noexcept;
  /// A DATA_ACK goes out (confirming relayed()): what it confirms starts anew.
  void acked() noexcept;

 private:
  bool credited_ = false;
  std::uint64_t accepted_ = 0;
  std::uint64_t limit_ = 0;
  std::optional<std::uint64_t> told_;  // the limit of the last DATA_CREDIT that went out
  // what was relayed since the last DATA_ACK, and the items dropped past the next index
  // since the last relay
  std::uint64_t relayed_ = 0;
  std::uint64_t ack_pending_ = 0;
  std::size_t ack_pending_bytes_ = 0;
  std::uint64_t out_of_order_ = 0;
};

}  // namespace rlbus::broker
