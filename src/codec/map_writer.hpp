// Builds small msgpack maps (event bodies the broker composes) with opaque values spliced
// in verbatim. Fields are written in the order they are added; the count is fixed up front.
// The bytes go straight into the blob that done() hands over: no buffer to copy out of.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

#include <msgpack.hpp>

#include "codec/task_messages.hpp"

namespace rlbus::codec {

class map_writer {
 public:
  /// `reserve`: the bytes expected, so a body with a payload is written in one allocation.
  explicit map_writer(std::uint32_t fields, std::size_t reserve = 64) : pk_(buf_) {
    buf_.bytes.reserve(reserve);
    pk_.pack_map(fields);
  }
  map_writer& str(std::string_view k, std::string_view v) {
    pk_.pack(k).pack(v);
    return *this;
  }
  map_writer& uint(std::string_view k, std::uint64_t v) {
    pk_.pack(k).pack(v);
    return *this;
  }
  /// `v` must be one complete msgpack value (a blob that passed decoding, or made here).
  map_writer& raw(std::string_view k, const blob& v) {
    pk_.pack(k);
    buf_.bytes.append(v);
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
    for (const auto& item : items) buf_.bytes.append(item);
    return *this;
  }
  /// The map, moved out: call once, last.
  [[nodiscard]] blob done() { return std::move(buf_.bytes); }

 private:
  struct sink {  // what msgpack::packer writes to
    blob bytes;
    void write(const char* p, std::size_t n) { bytes.append(p, n); }
  };
  sink buf_;
  msgpack::packer<sink> pk_;
};

}  // namespace rlbus::codec
