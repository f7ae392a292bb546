// Helpers shared by the codec's translation units: the check of a body against the
// protocol's limits, `field_reader` (typed access to one map's fields that records the first
// fault instead of throwing) and the canonical packing of numbers. Internal to src/codec.
//
// Bodies are read in place: the field reader walks the bytes once under the limits, noting
// where each top-level field lies, and then reads a field from there when asked. Decoding
// builds no msgpack object tree and copies only what ends up in the message.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <msgpack.hpp>

#include "codec/codec.hpp"

namespace rlbus::codec::detail {

/// What a msgpack value's first bytes say. Integers follow msgpack-c's reading: any integer
/// format holding a value >= 0 is `uint` (n: the value); below 0 it is `nint`.
struct head {
  enum class kind : std::uint8_t { nil, boolean, uint, nint, real, str, bin, array, map, ext };
  kind k = kind::nil;
  std::uint64_t n = 0;   // uint: the value; boolean: 0/1; str, bin, ext: bytes; array: items;
                         // map: pairs
  double real = 0;       // real: a float32 or float64, as a double
  std::size_t data = 0;  // offset of the bytes (str, bin, ext) or of the first item
};

/// The header of the value at `pos`, or nullopt when it runs past the end of `buf` or is the
/// never-used byte 0xc1. Payload lengths are not checked against `buf`.
std::optional<head> read_head(std::string_view buf, std::size_t pos);

/// The levels of maps and arrays in the value at the start of `buf` (checked bytes).
std::size_t nesting_levels(std::string_view buf);

/// codec::check_user_map's work (it needs the body checker of field_reader.cpp).
std::optional<decode_error> check_user_map_impl(std::string_view value, std::size_t max_nesting,
                                                const decode_limits& limits);

/// Resources in canonical form: whole numbers below 2^53 as integers, others as float64.
void pack_resources(msgpack::packer<msgpack::sbuffer>& pk, msgpack::sbuffer& out,
                    const rlbus::resources& res);

inline constexpr std::uint64_t u16_max = 0xFFFF;
inline constexpr std::uint64_t u64_max = ~std::uint64_t{0};

// Reasons quote input only in short pieces, so an ERROR always fits its own reason limit.
inline constexpr std::size_t max_quoted_key = 64;

// Typed access to the fields of one map. Unknown keys are ignored (SPEC §5: forward
// compatibility); duplicate or non-string keys make the whole body invalid.
class field_reader {
 public:
  /// Checks that `body` is exactly one msgpack map within `lim` (collection sizes, string
  /// and binary lengths, nesting depth, no ext values), complete, with nothing after it and
  /// with string keys, no two alike; fault() is a BAD_BODY saying what is wrong otherwise.
  /// The reader keeps views into `body`.
  field_reader(std::string_view body, const decode_limits& lim);
  /// With `prefix`, the map may be followed by more bytes: it reads the map at the start of
  /// `body` only, and bytes() is then just the map (at most as deep as `lim` allows).
  field_reader(std::string_view body, const decode_limits& lim, bool prefix);
  /// The bytes of the map read.
  [[nodiscard]] std::string_view bytes() const { return body_; }

  [[nodiscard]] const std::optional<decode_error>& fault() const { return fault_; }
  [[nodiscard]] bool has(std::string_view key) const { return find(key).has_value(); }

  /// A str of at most `max_len` bytes; into a string_view, a view of the body's bytes.
  /// Each reader of a value says whether it set `out` (false: absent, or a fault).
  bool str(std::string_view key, std::string_view& out, std::size_t max_len, bool required = true) {
    const auto v = get(key, required);
    if (!v) return false;
    if (v->k != head::kind::str) return refused(key, "expected a string");
    if (v->n > max_len) return refused(key, fmt::format("longer than {} bytes", max_len));
    out = body_.substr(v->data, v->n);
    return true;
  }
  bool str(std::string_view key, std::string& out, std::size_t max_len, bool required = true) {
    std::string_view v;
    if (!str(key, v, max_len, required)) return false;
    out.assign(v);
    return true;
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
    const auto v = get(key, required);
    if (!v) return;
    if (v->k != head::kind::boolean) return fail(key, "expected a boolean");
    out = v->n != 0;
  }

  void role(std::string_view key, rlbus::role& out) {
    std::string text;
    str(key, text, 32);
    if (fault_) return;
    if (auto r = parse_role(text)) {
      out = *r;
    } else {
      fail(key, fmt::format("unknown role '{}' (collector, learner, coordinator or bus)", text));
    }
  }

  /// A task's kind of worker (§12.2.5): collector or learner; coordinator and bus are
  /// refused.
  void kind(std::string_view key, rlbus::role& out) {
    word(
        key, out,
        [](std::string_view text) -> std::optional<rlbus::role> {
          const auto r = parse_role(text);
          if (r == rlbus::role::collector || r == rlbus::role::learner) return r;
          return std::nullopt;
        },
        "collector or learner");
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

  template <class S>  // std::string or std::string_view
  void peer_id(std::string_view key, S& out) {
    str(key, out, max_id_length);
    if (!fault_ && !valid_peer_id(out))
      fail(key, "must be 1-128 characters of A-Z a-z 0-9 . _ : @ / -");
  }

  void resources(std::string_view key, rlbus::resources& out);

  /// An opaque value (user data: task_info, info, result ...) kept as its exact bytes, so
  /// it is forwarded unchanged. `allow_nil` accepts nil ("none"); otherwise it must be a
  /// map (`want_map`) or any value. A `max_nesting` other than 0 bounds the levels of maps
  /// and arrays in it, its own included.
  bool blob(std::string_view key, std::string_view& out, bool required, bool want_map,
            bool allow_nil = false, std::size_t max_nesting = 0);
  bool blob(std::string_view key, std::string& out, bool required, bool want_map,
            bool allow_nil = false, std::size_t max_nesting = 0) {
    std::string_view v;
    if (!blob(key, v, required, want_map, allow_nil, max_nesting)) return false;
    out.assign(v);
    return true;
  }

  /// An array of 1..max_items maps (DATA_BATCH's `items`), kept as its exact bytes in `out`
  /// and where each item ends in `ends` (either may be null). `check` reads one item's fields
  /// from its own reader and says why it is not what the array must hold (nullopt: it is).
  void items(std::string_view key, std::string* out, std::vector<std::uint32_t>* ends,
             std::size_t max_items,
             const std::function<std::optional<std::string>(field_reader& item)>& check);

  void string_list(std::string_view key, std::vector<std::string>& out, std::size_t max_items,
                   std::size_t max_len);

  /// Binary payload (bin type) of at most `max_len` bytes.
  bool binary(std::string_view key, std::string_view& out, std::size_t max_len, bool required);
  bool binary(std::string_view key, std::string& out, std::size_t max_len, bool required) {
    std::string_view v;
    if (!binary(key, v, max_len, required)) return false;
    out.assign(v);
    return true;
  }

  /// Refuses the field `key` (402) for `what`, unless a fault came first.
  void fail(std::string_view key, std::string_view what) {
    if (!fault_)
      fault_ = decode_error{error_code::bad_field, fmt::format("field '{}': {}", key, what)};
  }

 private:
  struct field {
    std::string_view key;
    std::uint64_t hash = 0;          // the key's signature: most keys differ in it
    std::size_t begin = 0, end = 0;  // the value's bytes in the body
  };

  [[nodiscard]] const field& at(std::size_t i) const {
    return i < inline_fields ? fields_[i] : more_[i - inline_fields];
  }
  /// Checks the body and notes where its fields lie (the constructor's work).
  std::optional<decode_error> index(const decode_limits& lim, bool prefix = false);
  /// Looks from just after the last field found: fields read in the order they were written
  /// (canonical order, on both sides) are found at the first try.
  [[nodiscard]] std::optional<std::size_t> find(std::string_view key) const;

  std::optional<head> get(std::string_view key, bool required) {
    if (fault_) return std::nullopt;
    const auto i = find(key);
    if (!i) {
      if (required) fail(key, "missing");
      return std::nullopt;
    }
    return read_head(body_, at(*i).begin);  // never nullopt: the body passed the check
  }

  void read_uint(std::string_view key, std::optional<std::uint64_t>& out, std::uint64_t lo,
                 std::uint64_t hi, bool required) {
    const auto v = get(key, required);
    if (!v) return;
    if (v->k != head::kind::uint) return fail(key, "expected a non-negative integer");
    if (v->n < lo || v->n > hi) return fail(key, fmt::format("{} is outside {}..{}", v->n, lo, hi));
    out = v->n;
  }

  bool refused(std::string_view key, std::string_view what) {
    fail(key, what);
    return false;
  }

  std::string_view body_;
  // The map's fields in body order: the first inline, the rest (a body may hold up to the
  // map limit of them) in `more_`.
  static constexpr std::size_t inline_fields = 16;
  std::array<field, inline_fields> fields_{};
  std::vector<field> more_;
  std::size_t count_ = 0;
  mutable std::size_t next_ = 0;  // where find() starts: just after the field found last
  std::optional<decode_error> fault_;
};

}  // namespace rlbus::codec::detail
