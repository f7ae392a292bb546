// Helpers shared by the codec's translation units: msgpack unpacking under limits,
// `field_reader` (typed access to one map's fields that records the first fault instead of
// throwing) and the canonical packing of numbers. Internal to src/codec.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <msgpack.hpp>

#include "codec/codec.hpp"

namespace rlbus::codec::detail {

/// A decoded body and the zone it lives in. The zone comes from a per-thread spare and goes
/// back to it on destruction (unless the handle was moved away), so decoding a message does
/// not allocate a fresh zone each time.
struct unpacked {
  msgpack::object_handle handle;
  std::optional<decode_error> fault;
  unpacked() = default;
  unpacked(unpacked&&) = default;
  unpacked& operator=(unpacked&&) = default;
  unpacked(const unpacked&) = delete;
  unpacked& operator=(const unpacked&) = delete;
  ~unpacked();
};

/// Unpacks `body` under `lim`; fault unless it is exactly one map. Strings and binaries in
/// the result point into `body`, which must outlive it.
unpacked unpack_map(std::string_view body, const decode_limits& lim);

/// Offset just past the msgpack value starting at `pos` in `buf`, or nullopt if it runs
/// past the end. Only for bytes that already passed unpack_map (structure is trusted).
std::optional<std::size_t> skip_value(std::string_view buf, std::size_t pos);

/// Resources in canonical form: whole numbers below 2^53 as integers, others as float64.
void pack_resources(msgpack::packer<msgpack::sbuffer>& pk, msgpack::sbuffer& out,
                    const rlbus::resources& res);

inline constexpr std::uint64_t u16_max = 0xFFFF;
inline constexpr std::uint64_t u64_max = ~std::uint64_t{0};

// Reasons quote input only in short pieces, so an ERROR always fits its own reason limit.
inline constexpr std::size_t max_quoted_key = 64;

inline std::string_view as_view(const msgpack::object& o) {
  return {o.via.str.ptr, o.via.str.size};
}

// Typed access to the fields of one map. Unknown keys are ignored (SPEC §5: forward
// compatibility); duplicate or non-string keys make the whole body invalid.
class field_reader {
 public:
  /// `map` is the decoded body and `body` its bytes (for blob(): values kept verbatim).
  field_reader(const msgpack::object& map, std::string_view body) : body_(body) {
    const auto& m = map.via.map;
    fields_ = m.ptr;
    for (std::uint32_t i = 0; i < m.size; ++i) {
      const auto& kv = m.ptr[i];
      if (kv.key.type != msgpack::type::STR) {
        fault_ = decode_error{error_code::bad_body, "map key is not a string"};
        return;
      }
      const auto key = as_view(kv.key);
      if (find(key) != nullptr) {
        fault_ = decode_error{error_code::bad_body,
                              fmt::format("duplicate key '{}'", key.substr(0, max_quoted_key))};
        return;
      }
      ++count_;  // the fields before it are checked: find() looks at those
    }
  }

  [[nodiscard]] const std::optional<decode_error>& fault() const { return fault_; }
  [[nodiscard]] bool has(std::string_view key) const { return find(key) != nullptr; }

  void str(std::string_view key, std::string& out, std::size_t max_len, bool required = true) {
    const auto* o = get(key, required);
    if (o == nullptr) return;
    if (o->type != msgpack::type::STR) return fail(key, "expected a string");
    if (o->via.str.size > max_len) return fail(key, fmt::format("longer than {} bytes", max_len));
    out.assign(o->via.str.ptr, o->via.str.size);
  }

  template <class U>
  void uint(std::string_view key, U& out, std::uint64_t lo, std::uint64_t hi) {
    std::optional<std::uint64_t> v;
    read_uint(key, v, lo, hi, true);
    if (v) out = static_cast<U>(*v);
  }

  template <class U>
  void opt_uint(std::string_view key, std::optional<U>& out, std::uint64_t lo, std::uint64_t hi) {
    std::optional<std::uint64_t> v;
    read_uint(key, v, lo, hi, false);
    if (v) out = static_cast<U>(*v);
  }

  void boolean(std::string_view key, bool& out, bool required = true) {
    const auto* o = get(key, required);
    if (o == nullptr) return;
    if (o->type != msgpack::type::BOOLEAN) return fail(key, "expected a boolean");
    out = o->via.boolean;
  }

  void role(std::string_view key, rlbus::role& out) {
    std::string text;
    str(key, text, 32);
    if (fault_) return;
    if (auto r = parse_role(text)) {
      out = *r;
    } else {
      fail(key, fmt::format("unknown role '{}' (collector, learner or coordinator)", text));
    }
  }

  /// A str of at most 32 bytes that `parse` turns into a value (an enum spelled as words);
  /// anything else is refused, naming the `expected` words.
  template <class T, class Parse>
  void word(std::string_view key, T& out, Parse&& parse, std::string_view expected) {
    std::string text;
    str(key, text, 32);
    if (fault_) return;
    if (auto v = parse(text)) {
      out = *v;
    } else {
      fail(key, fmt::format("unknown value '{}' ({})", text, expected));
    }
  }

  void peer_id(std::string_view key, std::string& out) {
    str(key, out, max_id_length);
    if (!fault_ && !valid_peer_id(out))
      fail(key, "must be 1-128 characters of A-Z a-z 0-9 . _ : @ / -");
  }

  void resources(std::string_view key, rlbus::resources& out) {
    const auto* o = get(key, false);
    if (o == nullptr) return;
    if (o->type != msgpack::type::MAP) return fail(key, "expected a map of name -> number");
    if (o->via.map.size > max_resources)
      return fail(key, fmt::format("more than {} entries", max_resources));
    for (std::uint32_t i = 0; i < o->via.map.size; ++i) {
      const auto& kv = o->via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR || kv.key.via.str.size == 0 ||
          kv.key.via.str.size > max_resource_name)
        return fail(key, fmt::format("names must be strings of 1-{} bytes", max_resource_name));
      double value = 0;
      switch (kv.val.type) {
        case msgpack::type::POSITIVE_INTEGER:
          value = static_cast<double>(kv.val.via.u64);
          break;
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64:
          value = kv.val.via.f64;
          break;
        default:
          return fail(key, "values must be non-negative numbers");
      }
      if (!std::isfinite(value) || value < 0)
        return fail(key, "values must be non-negative finite numbers");
      if (!out.emplace(std::string(as_view(kv.key)), value).second)
        return fail(key, "duplicate resource name");
    }
  }

  /// An opaque value (user data: task_info, info, result ...) kept as its exact bytes, so
  /// it is forwarded unchanged. `allow_nil` accepts nil ("none"); otherwise it must be a
  /// map (`want_map`) or any value.
  void blob(std::string_view key, std::string& out, bool required, bool want_map,
            bool allow_nil = false);

  void string_list(std::string_view key, std::vector<std::string>& out, std::size_t max_items,
                   std::size_t max_len);

  /// Binary payload (bin type) of at most `max_len` bytes.
  void binary(std::string_view key, std::string& out, std::size_t max_len, bool required);

 private:
  [[nodiscard]] const msgpack::object* find(std::string_view key) const {
    for (std::uint32_t i = 0; i < count_; ++i)
      if (as_view(fields_[i].key) == key) return &fields_[i].val;
    return nullptr;
  }

  const msgpack::object* get(std::string_view key, bool required) {
    if (fault_) return nullptr;
    const auto* o = find(key);
    if (o == nullptr && required) fail(key, "missing");
    return o;
  }

  void read_uint(std::string_view key, std::optional<std::uint64_t>& out, std::uint64_t lo,
                 std::uint64_t hi, bool required) {
    const auto* o = get(key, required);
    if (o == nullptr) return;
    if (o->type != msgpack::type::POSITIVE_INTEGER)
      return fail(key, "expected a non-negative integer");
    if (o->via.u64 < lo || o->via.u64 > hi)
      return fail(key, fmt::format("{} is outside {}..{}", o->via.u64, lo, hi));
    out = o->via.u64;
  }

  void fail(std::string_view key, std::string_view what) {
    if (!fault_)
      fault_ = decode_error{error_code::bad_field, fmt::format("field '{}': {}", key, what)};
  }

  std::string_view body_;
  // The decoded map's own entries (no copy): the first count_ have string keys, no two alike.
  const msgpack::object_kv* fields_ = nullptr;
  std::uint32_t count_ = 0;
  std::optional<decode_error> fault_;
};

}  // namespace rlbus::codec::detail
