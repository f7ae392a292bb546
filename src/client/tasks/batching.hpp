// Batched data on the worker's side (SPEC §12.12): DATA that wait together at the front of the
// outbox (emit_data called faster than they leave) go as one DATA_BATCH. No timer holds
// anything back: batching happens exactly when data comes faster than it leaves.
//
// Not thread-safe: the worker's I/O thread owns it and calls it with its core's lock held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "codec/codec.hpp"
#include "codec/messages.hpp"

namespace rlbus::client::detail {

class data_batcher {
 public:
  /// How many DATA at the front of `outbox` can share one DATA_BATCH: consecutive indexes of
  /// one attempt, within the batch bounds (well inside the broker's `max_message`, 0: not
  /// known), each meta shallow enough for a batch. 0 or 1: send the front alone.
  [[nodiscard]] static std::size_t batchable(const std::deque<codec::message>& outbox,
                                             std::uint64_t max_message);
  /// The first `n` (from batchable()) DATA of `outbox` as one DATA_BATCH.
  codec::message batch_of(const std::deque<codec::message>& outbox, std::size_t n);

 private:
  codec::items_writer items_;  // reused for every batch
};

}  // namespace rlbus::client::detail
