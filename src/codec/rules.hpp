// What the generated message model (codec/model.hpp, made from protocol/messages.json) is
// made of: the value types its members have beyond the standard ones, the rules its fields()
// tables name, and the field limits of SPEC §4 and §17. The codec's one reader
// (task_codec.cpp) and one writer (field_writer.hpp) give each rule its meaning; the model
// test checks that each rule says what messages.json says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rlbus::codec {

/// Field limits (SPEC §4): a peer id, a reason, a worker's resources, a heartbeat, a topic.
inline constexpr std::size_t max_id_length = 128;
inline constexpr std::size_t max_reason_length = 1024;
inline constexpr std::size_t max_resources = 32;
inline constexpr std::size_t max_resource_name = 64;
inline constexpr std::uint32_t min_heartbeat_ms = 10;
inline constexpr std::uint32_t max_heartbeat_ms = 600'000;
inline constexpr std::size_t max_topic_length = 256;
/// Items a DATA_BATCH carries at most (the array limit of §5.1).
inline constexpr std::size_t max_batch_items = 1024;

/// Opaque user data (task_info, info, result, data ...): one complete msgpack value kept as
/// its exact bytes, so the broker forwards it unchanged.
using blob = std::string;
inline const blob empty_map_blob{"\x80", 1};
inline const blob nil_blob{"\xc0", 1};

/// What a CAPACITY reports (SPEC §12.10): a worker joined, a worker's session ended, or the
/// current count as a coordinator's session begins.
enum class capacity_change { increase, decrease, snapshot };

/// The wire spelling ("increase", "decrease", "snapshot").
std::string_view to_string(capacity_change c) noexcept;
/// Parses a wire spelling; nullopt for anything else (case-sensitive).
std::optional<capacity_change> parse_capacity_change(std::string_view text) noexcept;

/// DATA_BATCH's `items`: the msgpack array exactly as it travels, and where each item ends
/// in it (offsets past each item, noted by the decoder and by items_writer, so that nobody
/// walks the bytes again to find them; empty when unknown). Only the bytes travel and count.
struct item_array {
  blob bytes;
  std::vector<std::uint32_t> ends;
  bool operator==(const item_array& o) const { return bytes == o.bytes; }
};

/// Field rules the generic codec applies (SPEC §12.2, §17.2).
namespace rule {
struct id {};    // 1-128 characters of A-Z a-z 0-9 . _ : @ / -
struct kind {};  // a task's kind of worker: collector or learner, never coordinator (§12.2.5)
struct text {
  std::size_t max;
  std::size_t min = 0;  // 1: must not be empty
};
// One of these words (an enum that stays a str in its struct).
struct words {
  std::span<const std::string_view> allowed;
};
// A capacity change as published (§12.10.3): increase or decrease; snapshots go to
// coordinators only (§12.10.4).
struct no_snapshot {};
struct range {
  std::uint64_t lo, hi;
};
// relayed_map: a map the broker relays one level deeper than it came (DATA's meta inside a
// `data` event's body, ...), so it may nest at most max_relayed_nesting levels (§12.2.3.1).
// batched_map: a DATA_BATCH item's meta, relayed three levels deeper than a DATA's meta
// comes (inside the item, `items`, the event's body), so it nests at most 12 (§12.2.3.1).
enum class shape { map, any, map_or_nil, relayed_map, batched_map };
inline constexpr std::size_t max_relayed_nesting = 14;
inline constexpr std::size_t max_batched_nesting = 12;
// items: DATA_BATCH's array of 1..max data items, kept as its exact bytes (§12.12.2).
struct items {
  std::size_t max;
};
struct bin {
  std::size_t max;
};
// A topic (SPEC §17.2.1): 1..256 printable ASCII characters, space excluded (0x21-0x7E).
// `empty_ok`: a subscription's topic, which may be empty (a prefix of every topic).
struct topic {
  bool empty_ok = false;
};
// An optional field with a default: absent means false (a bool) or 0 (a uint, whose range
// rule comes before the flag), and it is written only when it holds something else. A
// present false or 0 is read as the default (not canonical, but valid).
struct flag {};
inline constexpr range u32{0, 0xFFFF'FFFF};
inline constexpr range u64{0, ~std::uint64_t{0}};
inline constexpr text reason{max_reason_length};
}  // namespace rule

/// True when `t` is a valid topic (1..256 bytes of 0x21-0x7E; 0 bytes too with `empty_ok`).
bool valid_topic(std::string_view t, rule::topic r = {}) noexcept;

}  // namespace rlbus::codec
