// See batching.hpp.
#include "client/tasks/batching.hpp"

#include <algorithm>
#include <variant>

#include "client/tasks/unconfirmed.hpp"
#include "rlbus/defaults.hpp"

namespace rlbus::client::detail {

namespace {
// A DATA_BATCH holds at most this many bytes of items (§12.12.5); an item's keys and headers
// are counted at item_overhead.
constexpr std::size_t max_batch_bytes = rlbus::defaults::data_batch_max_bytes;
constexpr std::size_t item_overhead = 48;
}  // namespace

std::size_t data_batcher::batchable(const std::deque<codec::message>& outbox,
                                    std::uint64_t max_message) {
  const auto batch_bound =
      max_message == 0 ? max_batch_bytes : std::min<std::size_t>(max_batch_bytes, max_message / 2);
  std::size_t n = 0;
  std::size_t bytes = 0;
  const codec::data_ready* prev = nullptr;
  for (const auto& m : outbox) {
    const auto* d = std::get_if<codec::data_ready>(&m);
    if (d == nullptr || !d->index || n == codec::max_batch_items) break;
    if (prev != nullptr && (*d->index != *prev->index + 1 || d->attempt != prev->attempt ||
                            d->task_id != prev->task_id))
      break;
    const auto size = unconfirmed_data::size_of(m) + item_overhead;
    if (bytes + size > batch_bound ||
        (d->meta.size() > codec::rule::max_batched_nesting &&  // a level takes a byte
         codec::nesting_of(d->meta) > codec::rule::max_batched_nesting))
      break;
    bytes += size;
    prev = d;
    ++n;
  }
  return n;
}

codec::message data_batcher::batch_of(const std::deque<codec::message>& outbox, std::size_t n) {
  const auto& first = std::get<codec::data_ready>(outbox.front());
  for (std::size_t i = 0; i < n; ++i) items_.add(std::get<codec::data_ready>(outbox[i]));
  return codec::data_batch{first.task_id, first.attempt, *first.index, items_.done()};
}

}  // namespace rlbus::client::detail
