// Builds small msgpack maps (the results of OPS_REPLY) with opaque values spliced in
// verbatim. Fields are written in the order they are added; the count is fixed up front.
// The bytes go straight into the blob that done() hands over, or into one the caller is
// writing (a TASK_EVENT whose body this map is): no buffer to copy out of.
//
// event_fixed and event_head write a TASK_EVENT the same way, up to its body: the fields an
// attempt's events share are encoded once, for the attempt, not once per event.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

#include <msgpack.hpp>

#include "codec/field_writer.hpp"
#include "codec/messages.hpp"

namespace rlbus::codec {

class map_writer {
 public:
  /// `reserve`: the bytes expected, so a body with a payload is written in one allocation.
  explicit map_writer(std::uint32_t fields, std::size_t reserve = 64) : buf_{&own_}, pk_(buf_) {
    own_.reserve(reserve);
    pk_.pack_map(fields);
  }
  /// Appends the map to `into` instead (done() is then not called).
  map_writer(blob& into, std::uint32_t fields) : buf_{&into}, pk_(buf_) { pk_.pack_map(fields); }
  map_writer(const map_writer&) = delete;
  map_writer& operator=(const map_writer&) = delete;
  map_writer& str(std::string_view k, std::string_view v) {
    pk_.pack(k).pack(v);
    return *this;
  }
  map_writer& uint(std::string_view k, std::uint64_t v) {
    pk_.pack(k).pack(v);
    return *this;
  }
  map_writer& boolean(std::string_view k, bool v) {
    pk_.pack(k).pack(v);
    return *this;
  }
  /// A map of str -> number in canonical form (codec::encode_resources).
  map_writer& resources(std::string_view k, const rlbus::resources& res) {
    return raw(k, encode_resources(res));
  }
  /// `v` must be one complete msgpack value (a blob that passed decoding, or made here).
  map_writer& raw(std::string_view k, std::string_view v) {
    pk_.pack(k);
    buf_.bytes->append(v);
    return *this;
  }
  map_writer& bin(std::string_view k, std::string_view v) {
    pk_.pack(k);
    pk_.pack_bin(static_cast<std::uint32_t>(v.size()));
    pk_.pack_bin_body(v.data(), static_cast<std::uint32_t>(v.size()));
    return *this;
  }
  /// An array of `items`, each one complete msgpack value, spliced in as they are.
  template <class Items>
  map_writer& array(std::string_view k, const Items& items) {
    pk_.pack(k);
    pk_.pack_array(static_cast<std::uint32_t>(std::size(items)));
    for (const auto& item : items) buf_.bytes->append(item);
    return *this;
  }
  /// An array of strings.
  template <class Strings>
  map_writer& strings(std::string_view k, const Strings& items) {
    pk_.pack(k);
    pk_.pack_array(static_cast<std::uint32_t>(std::size(items)));
    for (const auto& item : items) pk_.pack(std::string_view(item));
    return *this;
  }
  /// The map, moved out: call once, last.
  [[nodiscard]] blob done() { return std::move(own_); }

 private:
  struct sink {  // what msgpack::packer writes to
    blob* bytes;
    void write(const char* p, std::size_t n) { bytes->append(p, n); }
  };
  blob own_;
  sink buf_;
  msgpack::packer<sink> pk_;
};

/// The fields of a TASK_EVENT (§12.5) that stay the same for an attempt, encoded: task_id and
/// attempt, then worker_id and the key of the body.
class event_fixed {
 public:
  event_fixed() = default;
  event_fixed(std::string_view task_id, std::uint32_t attempt, std::string_view worker_id);
  /// Whether these are the fields of `attempt` run by `worker_id`.
  [[nodiscard]] bool of(std::uint32_t attempt, std::string_view worker_id) const noexcept {
    return made_ && attempt_ == attempt && worker_id_ == worker_id;
  }

 private:
  friend blob event_head(const event_fixed& f, std::uint64_t seq, std::string_view event,
                         std::size_t reserve, bool with_kind);
  bool made_ = false;
  std::uint32_t attempt_ = 0;
  std::string worker_id_;
  blob task_;    // "task_id" id "attempt" n
  blob worker_;  // "worker_id" id "body"
};

/// A TASK_EVENT's encoded body up to the value of its `body`, which the caller appends (one
/// complete msgpack value; `reserve`: its expected size), and then, `with_kind`, its `kind`
/// (event_kind). With those, the bytes are those encode_body gives for the same task_event.
blob event_head(const event_fixed& f, std::uint64_t seq, std::string_view event,
                std::size_t reserve, bool with_kind = false);
/// Appends a TASK_EVENT's `kind` field, after its body (an event_head made `with_kind`).
void event_kind(blob& out, rlbus::role kind);

}  // namespace rlbus::codec
