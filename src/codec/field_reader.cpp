// See field_reader.hpp. The field reader walks a body's bytes once under the limits
// (msgpack-c's unpacker would build an object tree in a zone for the same verdict), noting
// where each top-level field lies, and reads a field only when asked.
#include "codec/field_reader.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

namespace rlbus::codec::detail {

namespace {

std::uint64_t read_be(std::string_view buf, std::size_t pos, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v = (v << 8U) | static_cast<std::uint8_t>(buf[pos + i]);
  return v;
}

std::int64_t read_signed(std::string_view buf, std::size_t pos, std::size_t n) {
  const auto u = read_be(buf, pos, n);
  if (n == 0 || n >= 8) return static_cast<std::int64_t>(u);
  const auto shift = 64U - 8U * static_cast<unsigned>(n);
  return static_cast<std::int64_t>(u << shift) >> shift;  // sign-extend n bytes
}

}  // namespace

std::optional<head> read_head(std::string_view buf, std::size_t pos) {
  using k = head::kind;
  if (pos >= buf.size()) return std::nullopt;
  const auto b = static_cast<std::uint8_t>(buf[pos]);
  const auto need = [&](std::size_t n) { return n <= buf.size() - pos; };
  head h;
  // A length or count of `n` bytes after the type byte, then the data.
  const auto sized = [&](k kind, std::size_t n) -> std::optional<head> {
    if (!need(1 + n)) return std::nullopt;
    h.k = kind;
    h.n = read_be(buf, pos + 1, n);
    h.data = pos + 1 + n;
    return h;
  };
  const auto integer = [&](std::size_t n, bool is_signed) -> std::optional<head> {
    if (!need(1 + n)) return std::nullopt;
    h.data = pos + 1 + n;
    if (!is_signed) {
      h.k = k::uint;
      h.n = read_be(buf, pos + 1, n);
    } else {
      const auto v = read_signed(buf, pos + 1, n);
      h.k = v >= 0 ? k::uint : k::nint;
      h.n = static_cast<std::uint64_t>(v);
    }
    return h;
  };
  // fixext and ext: n bytes after the ext type byte.
  const auto ext = [&](std::size_t len_bytes, std::uint64_t fixed) -> std::optional<head> {
    if (!need(1 + len_bytes)) return std::nullopt;
    h.k = k::ext;
    h.n = len_bytes > 0 ? read_be(buf, pos + 1, len_bytes) : fixed;
    h.data = pos + 1 + len_bytes;  // the ext type byte, then n bytes
    return h;
  };
  if (b <= 0x7f) {
    h.k = k::uint;
    h.n = b;
    h.data = pos + 1;
    return h;
  }
  if (b >= 0xe0) {
    h.k = k::nint;
    h.n = static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int8_t>(b)));
    h.data = pos + 1;
    return h;
  }
  if ((b & 0xf0U) == 0x80 || (b & 0xf0U) == 0x90 || (b & 0xe0U) == 0xa0) {
    h.k = (b & 0xf0U) == 0x80 ? k::map : (b & 0xf0U) == 0x90 ? k::array : k::str;
    h.n = (b & 0xe0U) == 0xa0 ? (b & 0x1fU) : (b & 0x0fU);
    h.data = pos + 1;
    return h;
  }
  switch (b) {
    case 0xc0:
      h.k = k::nil;
      h.data = pos + 1;
      return h;
    case 0xc2:
    case 0xc3:
      h.k = k::boolean;
      h.n = b == 0xc3 ? 1 : 0;
      h.data = pos + 1;
      return h;
    case 0xc4:
      return sized(k::bin, 1);
    case 0xc5:
      return sized(k::bin, 2);
    case 0xc6:
      return sized(k::bin, 4);
    case 0xc7:
      return ext(1, 0);
    case 0xc8:
      return ext(2, 0);
    case 0xc9:
      return ext(4, 0);
    case 0xca: {
      if (!need(5)) return std::nullopt;
      const auto bits = static_cast<std::uint32_t>(read_be(buf, pos + 1, 4));
      float f = 0;
      std::memcpy(&f, &bits, sizeof f);
      h.k = k::real;
      h.real = f;
      h.data = pos + 5;
      return h;
    }
    case 0xcb: {
      if (!need(9)) return std::nullopt;
      const auto bits = read_be(buf, pos + 1, 8);
      std::memcpy(&h.real, &bits, sizeof h.real);
      h.k = k::real;
      h.data = pos + 9;
      return h;
    }
    case 0xcc:
      return integer(1, false);
    case 0xcd:
      return integer(2, false);
    case 0xce:
      return integer(4, false);
    case 0xcf:
      return integer(8, false);
    case 0xd0:
      return integer(1, true);
    case 0xd1:
      return integer(2, true);
    case 0xd2:
      return integer(4, true);
    case 0xd3:
      return integer(8, true);
    case 0xd4:
      return ext(0, 1);
    case 0xd5:
      return ext(0, 2);
    case 0xd6:
      return ext(0, 4);
    case 0xd7:
      return ext(0, 8);
    case 0xd8:
      return ext(0, 16);
    case 0xd9:
      return sized(k::str, 1);
    case 0xda:
      return sized(k::str, 2);
    case 0xdb:
      return sized(k::str, 4);
    case 0xdc:
      return sized(k::array, 2);
    case 0xdd:
      return sized(k::array, 4);
    case 0xde:
      return sized(k::map, 2);
    case 0xdf:
      return sized(k::map, 4);
    default:
      return std::nullopt;  // 0xc1 is never used
  }
}

namespace {

// The field reader's check of a body: one value and everything in it, depth-first. Sizes are
// checked against the limits before anything is counted, so a header that claims a billion items
// costs nothing; every item takes at least one byte, so no count can outrun the input.
class checker {
 public:
  checker(std::string_view buf, const decode_limits& lim) : buf_(buf), lim_(lim) {}

  // The offset just past the value at `pos` (`depth`: containers around it), or nullopt
  // with `fault` set. Recursion is bounded by the depth limit.
  std::optional<std::size_t> value(std::size_t pos, std::size_t depth) {
    if (pos >= buf_.size()) return truncated();
    // The common small cases first: a positive fixint, and a fixstr (every key).
    const auto b = static_cast<std::uint8_t>(buf_[pos]);
    if (b <= 0x7f) return pos + 1;
    if ((b & 0xe0U) == 0xa0) {
      if ((b & 0x1fU) > lim_.max_str) return limit("str size overflow");
      if ((b & 0x1fU) > buf_.size() - pos - 1) return truncated();
      return pos + 1 + (b & 0x1fU);
    }
    const auto h = read_head(buf_, pos);
    if (!h) {
      if (static_cast<std::uint8_t>(buf_[pos]) == 0xc1) return malformed("byte 0xc1");
      return truncated();
    }
    const auto left = buf_.size() - h->data;
    switch (h->k) {
      case head::kind::str:
        if (h->n > lim_.max_str) return limit("str size overflow");
        if (h->n > left) return truncated();
        return h->data + h->n;
      case head::kind::bin:
        if (h->n > lim_.max_bin) return limit("bin size overflow");
        if (h->n > left) return truncated();
        return h->data + h->n;
      case head::kind::ext:
        return limit("ext size overflow");  // no ext value is part of the protocol (§5.1)
      case head::kind::array:
      case head::kind::map: {
        const bool is_map = h->k == head::kind::map;
        if (h->n > (is_map ? lim_.max_map : lim_.max_array))
          return limit(is_map ? "map size overflow" : "array size overflow");
        if (depth + 1 > lim_.max_depth) return deep();
        const auto items = is_map ? 2 * h->n : h->n;
        if (items > left) return truncated();
        auto at = h->data;
        for (std::uint64_t i = 0; i < items; ++i) {
          const auto next = value(at, depth + 1);
          if (!next) return std::nullopt;
          at = *next;
        }
        return at;
      }
      default:
        return h->data;  // nil, boolean, integers and floats: the header is all of it
    }
  }

  std::optional<decode_error> fault;

 private:
  std::optional<std::size_t> set(std::string reason) {
    fault = decode_error{error_code::bad_body, std::move(reason)};
    return std::nullopt;
  }
  std::optional<std::size_t> truncated() { return set("truncated msgpack body"); }
  std::optional<std::size_t> deep() { return set("msgpack nesting too deep"); }
  std::optional<std::size_t> limit(const char* what) {
    return set(fmt::format("msgpack limit exceeded ({})", what));
  }
  std::optional<std::size_t> malformed(const char* what) {
    return set(fmt::format("malformed msgpack ({})", what));
  }

  std::string_view buf_;
  const decode_limits& lim_;
};

// A key's signature: its length and three of its bytes. Telling keys apart by it is cheap
// and, keys being few and different words, rarely leaves a full comparison to make.
std::uint64_t signature(std::string_view s) {
  if (s.empty()) return 0;
  const auto byte = [&](std::size_t i) { return std::uint64_t{static_cast<std::uint8_t>(s[i])}; };
  return s.size() | byte(0) << 32U | byte(s.size() / 2) << 40U | byte(s.size() - 1) << 48U;
}

}  // namespace

field_reader::field_reader(std::string_view body, const decode_limits& lim)
    : body_(body), fault_(index(lim)) {}

field_reader::field_reader(std::string_view body, const decode_limits& lim, bool prefix)
    : body_(body), fault_(index(lim, prefix)) {}

std::optional<decode_error> field_reader::index(const decode_limits& lim, bool prefix) {
  const auto refuse = [](std::string reason) {
    return decode_error{error_code::bad_body, std::move(reason)};
  };
  if (body_.empty()) return refuse("empty body: expected a msgpack map");
  checker c(body_, lim);
  const auto map = read_head(body_, 0);
  if (!map || map->k != head::kind::map) {
    // Not a map: say what is wrong with the value itself first, as a reader would see it.
    const auto end = c.value(0, 0);
    if (!end) return refuse(c.fault->reason);
    if (*end != body_.size())
      return refuse(fmt::format("{} trailing bytes after the msgpack body", body_.size() - *end));
    return refuse("body is not a msgpack map");
  }
  if (map->n > lim.max_map) return refuse("msgpack limit exceeded (map size overflow)");
  if (lim.max_depth < 1) return refuse("msgpack nesting too deep");
  if (2 * map->n > body_.size() - map->data) return refuse("truncated msgpack body");
  if (map->n > inline_fields) more_.reserve(map->n - inline_fields);
  auto pos = map->data;
  for (std::uint64_t i = 0; i < map->n; ++i) {
    const auto key_end = c.value(pos, 1);
    if (!key_end) return refuse(c.fault->reason);
    const auto key = *read_head(body_, pos);
    const auto value_end = c.value(*key_end, 1);
    if (!value_end) return refuse(c.fault->reason);
    if (key.k != head::kind::str) return refuse("map key is not a string");
    field f{body_.substr(key.data, key.n), 0, *key_end, *value_end};
    f.hash = signature(f.key);
    for (std::size_t j = 0; j < count_; ++j) {
      if (at(j).hash == f.hash && at(j).key == f.key)
        return refuse(fmt::format("duplicate key '{}'", f.key.substr(0, max_quoted_key)));
    }
    if (count_ < inline_fields)
      fields_[count_] = f;
    else
      more_.push_back(f);
    ++count_;
    pos = *value_end;
  }
  if (prefix) {
    body_ = body_.substr(0, pos);
  } else if (pos != body_.size()) {
    return refuse(fmt::format("{} trailing bytes after the msgpack body", body_.size() - pos));
  }
  return std::nullopt;
}

std::optional<std::size_t> field_reader::find(std::string_view key) const {
  const auto h = signature(key);
  for (std::size_t i = 0; i < count_; ++i) {
    auto j = next_ + i;
    if (j >= count_) j -= count_;
    const auto& f = at(j);
    if (f.hash == h && f.key == key) {
      next_ = j + 1;
      return j;
    }
  }
  return std::nullopt;
}

void field_reader::resources(std::string_view key, rlbus::resources& out) {
  const auto m = get(key, false);
  if (!m) return;
  if (m->k != head::kind::map) return fail(key, "expected a map of name -> number");
  if (m->n > max_resources) return fail(key, fmt::format("more than {} entries", max_resources));
  auto pos = m->data;
  for (std::uint64_t i = 0; i < m->n; ++i) {
    // Each entry is checked before the next is looked for: a name is a str and a value a
    // number, and neither goes past its own head and bytes.
    const auto name = *read_head(body_, pos);
    if (name.k != head::kind::str || name.n == 0 || name.n > max_resource_name)
      return fail(key, fmt::format("names must be strings of 1-{} bytes", max_resource_name));
    const auto val = *read_head(body_, name.data + name.n);
    pos = val.data;
    double value = 0;
    if (val.k == head::kind::uint) {
      value = static_cast<double>(val.n);
    } else if (val.k == head::kind::real) {
      value = val.real;
    } else {
      return fail(key, "values must be non-negative numbers");
    }
    if (!std::isfinite(value) || value < 0)
      return fail(key, "values must be non-negative finite numbers");
    if (!out.emplace(std::string(body_.substr(name.data, name.n)), value).second)
      return fail(key, "duplicate resource name");
  }
}

namespace {
// msgpack-c's pack_double turns any whole double into an integer; the spec keeps integers
// for whole numbers below 2^53 only (exact in both forms), so float64 is written by hand.
void pack_float64(msgpack::sbuffer& out, double v) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  std::array<char, 9> b{};
  b[0] = static_cast<char>(0xcb);
  for (std::size_t i = 0; i < 8; ++i) b[1 + i] = static_cast<char>(bits >> (56U - 8U * i));
  out.write(b.data(), b.size());
}
}  // namespace

void pack_resources(msgpack::packer<msgpack::sbuffer>& pk, msgpack::sbuffer& out,
                    const rlbus::resources& res) {
  pk.pack_map(static_cast<std::uint32_t>(res.size()));
  for (const auto& [name, value] : res) {
    pk.pack(std::string_view(name));
    if (value >= 0 && value < 9007199254740992.0 && std::floor(value) == value) {
      pk.pack(static_cast<std::uint64_t>(value));
    } else {
      pack_float64(out, value);
    }
  }
}

namespace {

// The levels of maps and arrays in the value at `pos` of a body that passed the checker (its
// own included: a scalar is 0, an empty map 1), and the offset just past it. Recursion is
// bounded by the depth limit the body passed.
std::pair<std::size_t, std::size_t> nesting(std::string_view buf, std::size_t pos) {
  const auto h = *read_head(buf, pos);
  switch (h.k) {
    case head::kind::str:
    case head::kind::bin:
      return {0, h.data + h.n};
    case head::kind::array:
    case head::kind::map: {
      const auto items = h.k == head::kind::map ? 2 * h.n : h.n;
      std::size_t deepest = 0;
      auto at = h.data;
      for (std::uint64_t i = 0; i < items; ++i) {
        const auto [levels, next] = nesting(buf, at);
        deepest = std::max(deepest, levels);
        at = next;
      }
      return {deepest + 1, at};
    }
    default:
      return {0, h.data};
  }
}

}  // namespace

std::size_t nesting_levels(std::string_view buf) {
  return nesting(buf, 0).first;
}

std::optional<decode_error> check_user_map_impl(std::string_view value, std::size_t max_nesting,
                                                const decode_limits& limits) {
  checker c(value, limits);
  const auto end = c.value(0, 1);  // a field's value: the body's map is the first level
  if (!end) return c.fault;
  if (*end != value.size())
    return decode_error{error_code::bad_body,
                        fmt::format("{} trailing bytes after the value", value.size() - *end)};
  if (read_head(value, 0)->k != head::kind::map)
    return decode_error{error_code::bad_field, "expected a map"};
  if (max_nesting != 0 && value.size() > max_nesting) {  // as field_reader::blob says
    const auto levels = nesting(value, 0).first;
    if (levels > max_nesting)
      return decode_error{error_code::bad_field,
                          fmt::format("nests {} levels of maps and arrays, more than the {} it "
                                      "may have, since the broker relays it deeper inside an event",
                                      levels, max_nesting)};
  }
  return std::nullopt;
}

bool field_reader::blob(std::string_view key, std::string_view& out, bool required, bool want_map,
                        bool allow_nil, std::size_t max_nesting) {
  const auto v = get(key, required);
  if (!v) return false;
  if (v->k == head::kind::nil) {
    if (!allow_nil) return refused(key, "must not be nil");
  } else if (want_map && v->k != head::kind::map) {
    return refused(key, "expected a map");
  }
  const auto& f = at(next_ - 1);  // the field get() just found
  // Every level takes a byte at least: a value no longer than the bound cannot pass it.
  if (max_nesting != 0 && f.end - f.begin > max_nesting) {
    const auto levels = nesting(body_, f.begin).first;
    if (levels > max_nesting)
      return refused(key, fmt::format("nests {} levels of maps and arrays, more than the {} it may "
                                      "have, since the broker relays it deeper inside an event",
                                      levels, max_nesting));
  }
  out = body_.substr(f.begin, f.end - f.begin);
  return true;
}

void field_reader::items(
    std::string_view key, std::string* out, std::vector<std::uint32_t>* ends, std::size_t max_items,
    const std::function<std::optional<std::string>(field_reader& item)>& check) {
  const auto a = get(key, true);
  if (!a) return;
  if (a->k != head::kind::array) return fail(key, "expected an array of items");
  if (a->n == 0) return fail(key, "holds no item: a batch carries at least one");
  if (a->n > max_items) return fail(key, fmt::format("more than {} items", max_items));
  const auto& f = at(next_ - 1);  // the field get() just found
  const auto value = body_.substr(f.begin, f.end - f.begin);
  if (ends != nullptr) {
    ends->clear();
    ends->reserve(a->n);
  }
  // The body passed the limits as a whole: each item's own reader finds where it ends.
  auto pos = a->data - f.begin;
  for (std::uint64_t i = 0; i < a->n; ++i) {
    if (read_head(value, pos)->k != head::kind::map)
      return fail(key, fmt::format("item {} is not a map", i));
    field_reader item(value.substr(pos), decode_limits{}, true);
    if (item.fault()) return fail(key, fmt::format("item {}: {}", i, item.fault()->reason));
    if (auto why = check(item)) return fail(key, fmt::format("item {}: {}", i, *why));
    pos += item.bytes().size();
    if (ends != nullptr) ends->push_back(static_cast<std::uint32_t>(pos));
  }
  if (out != nullptr) out->assign(value);
}

void field_reader::string_list(std::string_view key, std::vector<std::string>& out,
                               std::size_t max_items, std::size_t max_len) {
  const auto a = get(key, false);
  if (!a) return;
  if (a->k != head::kind::array) return fail(key, "expected an array of strings");
  if (a->n > max_items) return fail(key, fmt::format("more than {} items", max_items));
  auto pos = a->data;
  for (std::uint64_t i = 0; i < a->n; ++i) {
    const auto item = *read_head(body_, pos);
    if (item.k != head::kind::str || item.n > max_len)
      return fail(key, fmt::format("items must be strings of at most {} bytes", max_len));
    out.emplace_back(body_.substr(item.data, item.n));
    pos = item.data + item.n;
  }
}

bool field_reader::binary(std::string_view key, std::string_view& out, std::size_t max_len,
                          bool required) {
  const auto v = get(key, required);
  if (!v) return false;
  if (v->k != head::kind::bin) return refused(key, "expected binary");
  if (v->n > max_len) return refused(key, fmt::format("longer than {} bytes", max_len));
  out = body_.substr(v->data, v->n);
  return true;
}

}  // namespace rlbus::codec::detail
