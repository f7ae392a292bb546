// The receiving half of rlbus::bus (SPEC §17.4.3, §17.5, §17.6): the deliveries of a node's
// session become the publications recv() hands out, in `seq` order and each once (copies a
// resumption sends again are dropped by `seq`), batches split (their publications share the
// batch's `seq`), fragments joined per sender; an abandoned publication drops its sender's
// partial, a gap drops every partial, and both count in lost(). It also says what the node may
// acknowledge: every delivery taken, handed to the caller or absorbed into a partial, and when a
// BUS_ACK is due (every 32 taken, and whenever all received are taken).
//
// Plain state, no locks and no sockets: rlbus::bus keeps it under its core's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "codec/messages.hpp"
#include "rlbus/bus.hpp"

namespace rlbus::client::detail {

class bus_inbox {
 public:
  /// Deliveries taken between two BUS_ACKs (SPEC §17.4.3).
  static constexpr std::uint64_t ack_every = 32;

  explicit bus_inbox(std::size_t max_partial_bytes) : max_partial_(max_partial_bytes) {}

  /// A DELIVER and its payload frame; true when it completed a publication (or a batch's) for
  /// recv().
  bool deliver(const codec::deliver& d, std::string_view payload);
  /// BUS_GAP: deliveries `first`..`last` will never come.
  void gap(std::uint64_t first, std::uint64_t last);
  /// A new session: delivery numbering starts again at 1 and incomplete publications are
  /// lost; what recv() has not handed out yet stays.
  void new_session();

  [[nodiscard]] bool empty() const noexcept { return ready_.empty(); }
  /// The next publication (the inbox must not be empty()).
  bus_message take();

  /// A BUS_ACK is due: send ack_upto(), then acked().
  [[nodiscard]] bool ack_due() const noexcept { return ack_due_ && consumed_ > ack_sent_; }
  [[nodiscard]] std::uint64_t ack_upto() const noexcept { return consumed_; }
  void acked(std::uint64_t upto) noexcept {
    ack_sent_ = std::max(ack_sent_, upto);
    ack_due_ = false;
  }

  [[nodiscard]] std::uint64_t lost() const noexcept { return lost_; }
  /// Publications of this node's own that it could not hand over, counted as lost too.
  void count_lost(std::uint64_t n) noexcept { lost_ += n; }
  [[nodiscard]] std::size_t partials() const noexcept { return partial_.size(); }
  [[nodiscard]] std::size_t partial_bytes() const noexcept { return partial_bytes_; }

 private:
  struct partial {
    std::string topic;
    std::uint32_t next_part = 1;
    std::string bytes;
  };
  /// The publication `d` completes, if any.
  std::optional<bus_message> join(const codec::deliver& d, std::string_view payload);
  bool drop_partial(const std::string& sender);
  void bound_partials();

  std::size_t max_partial_;
  std::deque<std::pair<std::uint64_t, bus_message>> ready_;  // (seq, publication)
  std::map<std::string, partial, std::less<>> partial_;      // by sender
  std::size_t partial_bytes_ = 0;
  std::uint64_t taken_ = 0;     // deliveries received (or reported lost) up to here
  std::uint64_t consumed_ = 0;  // all up to here handed out or absorbed
  std::uint64_t ack_sent_ = 0;
  bool ack_due_ = false;
  std::uint64_t lost_ = 0;
};

}  // namespace rlbus::client::detail
