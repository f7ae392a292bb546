// Protocol v1 constants: the header frame, message type ids, error codes and the decode
// limits. protocol/SPEC.md and protocol/messages.json are the source of truth; this file
// mirrors them, and tests/protocol checks that the two agree.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace rlbus::codec {

/// Every message (ROUTER and PUB) carries a 4-byte header frame: 'R' 'L' version type.
inline constexpr std::uint8_t signature_0 = 0x52;  // 'R'
inline constexpr std::uint8_t signature_1 = 0x4C;  // 'L'
inline constexpr std::uint8_t protocol_version = 1;
inline constexpr std::size_t header_size = 4;

/// Message type ids (SPEC.md §3). Ranges are reserved so later parts slot in without
/// renumbering: 0x10-0x3F task messages, 0x40-0x4F event replay, 0x50-0x5F operations.
enum class msg_type : std::uint8_t {
  hello = 0x01,
  welcome = 0x02,
  heartbeat = 0x03,
  disconnect = 0x04,
  error = 0x05,
  event = 0x60,
};

/// Name of a known type ("HELLO", ...), or nullopt for an unassigned id.
std::optional<std::string_view> type_name(std::uint8_t id) noexcept;

/// Error codes carried by ERROR and DISCONNECT (SPEC.md §6).
enum class error_code : std::uint16_t {
  goodbye = 200,           // DISCONNECT only: an orderly leave, nothing went wrong
  bad_frame = 400,         // wrong frame count or header signature
  bad_body = 401,          // body is not one well-formed msgpack map within the limits
  bad_field = 402,         // a field is missing, has the wrong type or is out of range
  not_ready = 403,         // a message other than HELLO before WELCOME
  unknown_type = 404,      // unassigned type id, or a type peers never send
  version_mismatch = 405,  // header version is not one the broker speaks
  duplicate_id = 409,      // HELLO names an id that a live session holds
  expired = 410,           // DISCONNECT only: the peer was silent past its liveness window
  too_many_faults = 429,   // DISCONNECT only: the peer sent too many bad messages
  replaced = 430,          // DISCONNECT only: a newer connection resumed this session
  busy = 503,              // broker full (max peers) or shutting down
};

/// Short upper-case name of a code ("BAD_FRAME"), "UNKNOWN" for anything else.
std::string_view code_name(std::uint16_t code) noexcept;

/// Limits applied to every untrusted msgpack body (SPEC.md §5). They bound what a decode
/// can allocate to a small multiple of the input size.
struct decode_limits {
  std::size_t max_array = 1024;
  std::size_t max_map = 256;
  std::size_t max_str = std::size_t{64} * 1024;
  std::size_t max_bin = std::size_t{1024} * 1024;
  std::size_t max_depth = 16;
};

/// Field limits for v1 messages (SPEC.md §4).
inline constexpr std::size_t max_id_length = 128;
inline constexpr std::size_t max_reason_length = 1024;
inline constexpr std::size_t max_resources = 32;
inline constexpr std::size_t max_resource_name = 64;
inline constexpr std::uint32_t min_heartbeat_ms = 10;
inline constexpr std::uint32_t max_heartbeat_ms = 600'000;

}  // namespace rlbus::codec
