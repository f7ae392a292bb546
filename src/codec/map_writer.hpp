// Builds small msgpack maps (event bodies the broker composes) with opaque values spliced
// in verbatim. Fields are written in the order they are added; the count is fixed up front.
#pragma once

#include <cstdint>
#include <string_view>

#include <msgpack.hpp>

#include "codec/task_messages.hpp"

namespace rlbus::codec {

class map_writer {
 public:
  explicit map_writer(std::uint32_t fields) : pk_(buf_) { pk_.pack_map(fields); }
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
    buf_.write(v.data(), v.size());
    return *this;
  }
  map_writer& bin(std::string_view k, std::string_view v) {
    pk_.pack(k);
    pk_.pack_bin(static_cast<std::uint32_t>(v.size()));
    pk_.pack_bin_body(v.data(), static_cast<std::uint32_t>(v.size()));
    return *this;
  }
  [[nodiscard]] blob done() const { return {buf_.data(), buf_.size()}; }

 private:
  msgpack::sbuffer buf_;
  msgpack::packer<msgpack::sbuffer> pk_;
};

}  // namespace rlbus::codec
