// Encoding and decoding of protocol v1: the header frame and the msgpack bodies.
// Decoding treats every byte as hostile: limits on every unpack, strict field checks, and
// faults come back as values (never exceptions) so the broker can answer ERROR and go on.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <msgpack.hpp>

#include "codec/messages.hpp"
#include "codec/protocol.hpp"

namespace rlbus::codec {

/// A parsed header frame. Version and type are raw: the caller decides what it accepts.
struct header {
  std::uint8_t version = 0;
  std::uint8_t type = 0;
};

/// Parses a header frame: nullopt unless it is exactly 4 bytes starting 'R' 'L'.
std::optional<header> parse_header(std::string_view frame) noexcept;

/// The 4 header bytes for a message of type `t` at this protocol version.
std::array<char, header_size> make_header(msg_type t) noexcept;

/// Why a body was refused: the code to answer with and a reason a person can act on.
struct decode_error {
  error_code code = error_code::bad_body;
  std::string reason;
};

/// A decoded value or the reason it could not be decoded.
template <class T>
class result {
 public:
  result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  result(decode_error err) : v_(std::move(err)) {}  // NOLINT(google-explicit-constructor)
  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  [[nodiscard]] T& value() & { return std::get<0>(v_); }
  [[nodiscard]] const T& value() const& { return std::get<0>(v_); }
  [[nodiscard]] T&& value() && { return std::get<0>(std::move(v_)); }
  [[nodiscard]] const decode_error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, decode_error> v_;
};

/// Decodes the body of a ROUTER message of type `type`. Any type that is not a ROUTER
/// message of this version yields error_code::unknown_type. Never throws.
result<message> decode_body(std::uint8_t type, std::string_view body,
                            const decode_limits& limits = {});

/// Appends the canonical encoding of `m` (fields in SPEC order, smallest integer forms).
void encode_body(const message& m, msgpack::sbuffer& out);
std::string encode_body(const message& m);

/// Decodes an event body published under `topic`. Never throws.
result<event> decode_event(std::string_view topic, std::string_view body,
                           const decode_limits& limits = {});

/// Appends the canonical encoding of an event body (the topic travels in its own frame).
void encode_event(const event& e, msgpack::sbuffer& out);
std::string encode_event(const event& e);

// is_task_type, is_ops_type, is_bus_type, is_replication_type and has_payload_frame, which
// sort type ids by the ranges the model reserves, are generated with it (codec/model.hpp).

/// Why `value` cannot travel as a user map field of a message (task_info, meta, info,
/// result): nullopt when it is one complete msgpack map within `limits` at the depth of a
/// body's field (SPEC §5.1) and, when `max_nesting` is not 0, of at most that many levels of
/// maps and arrays (§12.2.3.1). What the broker's decoder would say, without a whole message.
std::optional<decode_error> check_user_map(std::string_view value, std::size_t max_nesting = 0,
                                           const decode_limits& limits = {});

/// A DATA read in place, as the broker relays it: views into the body it was read from,
/// which must outlive it. The same fields, under the same rules, as data_ready.
struct data_view {
  std::string_view task_id;
  std::uint32_t attempt = 1;
  std::string_view data_id;
  std::string_view buffer_id;
  std::string_view meta = empty_map_blob;  // one complete msgpack map
  std::optional<std::string_view> payload;
  std::optional<std::uint64_t> policy_version;
  std::optional<std::uint64_t> index;
  bool operator==(const data_view&) const = default;
};
/// Decodes a DATA body into views, as decode_body would judge it. Never throws.
result<data_view> read_data(std::string_view body, const decode_limits& limits = {});
/// Views of a decoded DATA's fields.
data_view view_of(const data_ready& d);

/// A `data_batch` event's body (§12.5.6, §12.12): the index of its first item and each item's
/// bytes (views into the body): a map of data_id, buffer_id, meta, payload?,
/// policy_version?, the body a `data` event with that item would carry.
struct batch_view {
  struct item {
    std::string_view bytes;  // the item, as the coordinator's data callback gets it
    std::string data_id, buffer_id;
  };
  std::uint64_t first_index = 1;
  std::vector<item> items;
};
/// Reads and checks a `data_batch` body as the field rules of DATA_BATCH say. Never throws.
result<batch_view> read_data_batch_body(std::string_view body);

/// The items of a DATA_BATCH's `items` (decoded, or made by items_writer: both note where
/// each item ends; an array made by hand without `ends` has none here): each item's bytes,
/// in order. Views into `items`.
std::vector<std::string_view> split_items(const item_array& items);
/// The policy_version of one item as split_items gives it (of a decoded batch, whose items
/// were checked); nullopt when it has none, or when `item` is not a data item.
std::optional<std::uint64_t> item_policy_version(std::string_view item);

/// Builds DATA_BATCH's `items` (§12.12.2) one item at a time, each in canonical form.
class items_writer {
 public:
  items_writer();
  /// The item a DATA stands for: its data_id, buffer_id, meta, payload and policy_version.
  void add(const data_ready& d);
  void add(const data_item& item);
  [[nodiscard]] std::size_t count() const noexcept { return ends_.size(); }
  /// The bytes written so far (the array's header aside).
  [[nodiscard]] std::size_t bytes() const noexcept { return buf_.size() - header_room; }
  /// The array, moved out; the writer is empty again.
  [[nodiscard]] item_array done();

 private:
  static constexpr std::size_t header_room = 3;  // an array16 header: up to 65535 items
  blob buf_;
  std::vector<std::uint32_t> ends_;
};

/// The levels of maps and arrays in `value`, one complete msgpack value within the limits
/// (its own level included: a scalar is 0, an empty map 1), as §12.2.3.1 counts them.
std::size_t nesting_of(std::string_view value);

/// True when `id` is a valid peer id: 1..128 bytes of [A-Za-z0-9._:@/-].
bool valid_peer_id(std::string_view id) noexcept;

}  // namespace rlbus::codec
