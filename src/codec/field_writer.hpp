// Writes a struct that lists its fields in `fields(s, f)` (the generated model.hpp, TASK_EVENT
// bodies included) as one msgpack map in canonical form: the count of fields present, then each
// field in the order listed. The one writer behind every message, event body and
// TASK_EVENT body, into a msgpack::sbuffer or straight into a blob.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <msgpack.hpp>

#include "codec/messages.hpp"

namespace rlbus::codec {

/// Resources (a map of str -> number) as they travel: canonical form (SPEC §4.1.4).
blob encode_resources(const rlbus::resources& res);

namespace detail {

template <class V>
constexpr bool present(const V& /*v*/) {
  return true;
}
template <class V>
constexpr bool present(const std::optional<V>& v) {
  return v.has_value();
}

/// Counts the fields of a value that travel (the optional ones only when set, flags only
/// when not false or 0).
struct field_counter {
  std::uint32_t n = 0;
  template <class V, class... Rule>
  void operator()(std::string_view /*key*/, const V& v, Rule... /*rule*/) {
    n += present(v) ? 1 : 0;
  }
  void operator()(std::string_view /*key*/, const bool& v, rule::flag /*f*/) { n += v ? 1 : 0; }
  template <class U>
  void operator()(std::string_view /*key*/, const U& v, rule::range /*r*/, rule::flag /*f*/) {
    n += v != 0 ? 1 : 0;
  }
};

/// Writes each field present as key and value; `Out` takes bytes by write(p, n).
template <class Out>
struct field_writer {
  msgpack::packer<Out>& pk;
  Out& out;

  void raw(std::string_view v) { out.write(v.data(), v.size()); }
  template <class V, class... Rule>
  void operator()(std::string_view k, const std::optional<V>& v, Rule... r) {
    if (v) (*this)(k, *v, r...);
  }
  void operator()(std::string_view k, std::string_view v, rule::id /*r*/) { pk.pack(k).pack(v); }
  void operator()(std::string_view k, std::string_view v, rule::text /*r*/) { pk.pack(k).pack(v); }
  void operator()(std::string_view k, std::string_view v, rule::words /*r*/) { pk.pack(k).pack(v); }
  void operator()(std::string_view k, const rlbus::role& v) { pk.pack(k).pack(to_string(v)); }
  void operator()(std::string_view k, const rlbus::role& v, rule::kind /*r*/) {
    pk.pack(k).pack(to_string(v));
  }
  void operator()(std::string_view k, const bool& v) { pk.pack(k).pack(v); }
  void operator()(std::string_view k, const bool& v, rule::flag /*f*/) {
    if (v) pk.pack(k).pack(true);
  }
  template <class U>
  requires std::is_integral_v<U>
  void operator()(std::string_view k, const U& v, rule::range /*r*/, rule::flag /*f*/) {
    if (v != 0) pk.pack(k).pack(static_cast<std::uint64_t>(v));
  }
  void operator()(std::string_view k, std::string_view v, rule::topic /*r*/) { pk.pack(k).pack(v); }
  template <class... Rule>
  void operator()(std::string_view k, const capacity_change& v, Rule... /*r*/) {
    pk.pack(k).pack(to_string(v));
  }
  template <class U>
  requires std::is_integral_v<U>
  void operator()(std::string_view k, const U& v, rule::range /*r*/) {
    pk.pack(k).pack(static_cast<std::uint64_t>(v));
  }
  void operator()(std::string_view k, std::string_view v, rule::shape /*s*/) {
    pk.pack(k);
    raw(v);  // already one complete msgpack value
  }
  void operator()(std::string_view k, const item_array& v, rule::items /*r*/) {
    pk.pack(k);
    raw(v.bytes);  // the array of items, as it travels
  }
  // Items spliced from elsewhere (a DATA_BATCH relayed in a data_batch event): each one
  // complete msgpack value.
  void operator()(std::string_view k, const std::span<const std::string_view>& items,
                  rule::items /*r*/) {
    pk.pack(k);
    pk.pack_array(static_cast<std::uint32_t>(items.size()));
    for (const auto item : items) raw(item);
  }
  void operator()(std::string_view k, const rlbus::resources& v) {
    pk.pack(k);
    if constexpr (std::is_same_v<Out, msgpack::sbuffer>)
      pack_resources(pk, out, v);
    else
      raw(encode_resources(v));
  }
  void operator()(std::string_view k, std::string_view v, rule::bin /*r*/) {
    pk.pack(k);
    pk.pack_bin(static_cast<std::uint32_t>(v.size()));
    pk.pack_bin_body(v.data(), static_cast<std::uint32_t>(v.size()));
  }
};

/// Adds up about how many bytes the fields present take (for a buffer's reservation).
struct size_estimate {
  std::size_t n = 1;
  template <class V, class... Rule>
  void operator()(std::string_view k, const std::optional<V>& v, Rule... r) {
    if (v) (*this)(k, *v, r...);
  }
  template <class V, class... Rule>
  void operator()(std::string_view k, const V& v, Rule... /*r*/) {
    n += k.size() + 10;
    if constexpr (std::is_convertible_v<const V&, std::string_view>)
      n += std::string_view(v).size();
    else if constexpr (std::is_same_v<V, std::span<const std::string_view>>)
      for (const auto item : v) n += item.size();
  }
};

}  // namespace detail

/// About how many bytes `m` takes written as a map.
template <class T>
std::size_t size_hint(const T& m) {
  detail::size_estimate e;
  T::fields(m, e);
  return e.n;
}

/// The number of fields of `m` that travel: the size of the map it is written as.
template <class T>
std::uint32_t field_count(const T& m) {
  detail::field_counter c;
  T::fields(m, c);
  return c.n;
}

/// Writes `m` as a map with `pk` into `out`.
template <class Out, class T>
void write_fields(msgpack::packer<Out>& pk, Out& out, const T& m) {
  pk.pack_map(field_count(m));
  T::fields(m, detail::field_writer<Out>{pk, out});
}

namespace detail {
struct blob_sink {  // what msgpack::packer writes to
  blob& bytes;
  void write(const char* p, std::size_t n) { bytes.append(p, n); }
};
}  // namespace detail

/// Appends `m`, written as a map, to `out`.
template <class T>
void append_fields(blob& out, const T& m) {
  detail::blob_sink sink{out};
  msgpack::packer<detail::blob_sink> pk(sink);
  write_fields(pk, sink, m);
}

/// `m` written as a map.
template <class T>
blob fields_blob(const T& m) {
  blob out;
  append_fields(out, m);
  return out;
}

}  // namespace rlbus::codec
