// The batch framing of the topic bus (SPEC §17.5.1): a PUBLISH or DELIVER with `count` carries
// that many publications in its payload frame, each as a 4-byte big-endian length and then
// that many bytes, back to back. The broker checks a batch and relays it whole; the SDKs make
// and split them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rlbus/defaults.hpp"

namespace rlbus::codec {

inline constexpr std::size_t batch_item_head = 4;  // the length before each item

// What the reference SDKs put in one batch: publications of at most 8 KiB, at most 256 of them
// and 64 KiB in all (larger ones travel alone); the model's defaults say so.
inline constexpr std::size_t batch_max_items = defaults::bus_batch_max_items;
inline constexpr std::size_t batch_max_item_bytes = defaults::bus_batch_max_item_bytes;
inline constexpr std::size_t batch_max_bytes = defaults::bus_batch_max_bytes;

/// The length before an item (4 bytes, big-endian).
inline std::size_t batch_item_length(const char* at) noexcept {
  const auto* b = reinterpret_cast<const unsigned char*>(at);
  return (std::size_t{b[0]} << 24U) | (std::size_t{b[1]} << 16U) | (std::size_t{b[2]} << 8U) |
         std::size_t{b[3]};
}

/// Calls `each(item)` for the items of `payload`, a batch of `count`; false, having called it
/// for none, when `payload` is not exactly `count` items (a length running past the end, bytes
/// left over, fewer or more items).
template <class F>
bool for_each_in_batch(std::string_view payload, std::uint32_t count, F&& each) {
  // First the framing, whole: a bad batch hands on nothing.
  std::size_t pos = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (payload.size() - pos < batch_item_head) return false;
    const auto n = batch_item_length(payload.data() + pos);
    pos += batch_item_head;
    if (payload.size() - pos < n) return false;
    pos += n;
  }
  if (pos != payload.size()) return false;
  for (pos = 0; pos < payload.size();) {
    const auto n = batch_item_length(payload.data() + pos);
    each(payload.substr(pos + batch_item_head, n));
    pos += batch_item_head + n;
  }
  return true;
}

/// Whether `payload` is a batch of exactly `count` items.
inline bool valid_batch(std::string_view payload, std::uint32_t count) {
  return for_each_in_batch(payload, count, [](std::string_view) {});
}

/// Appends `item` to the batch being made in `out`.
inline void append_to_batch(std::string& out, std::string_view item) {
  const auto n = static_cast<std::uint32_t>(item.size());
  const char head[batch_item_head] = {static_cast<char>(n >> 24U), static_cast<char>(n >> 16U),
                                      static_cast<char>(n >> 8U), static_cast<char>(n)};
  out.append(head, batch_item_head);
  out.append(item);
}

}  // namespace rlbus::codec
