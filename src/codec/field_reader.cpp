// See field_reader.hpp. skip_value() walks raw msgpack to find where a value ends, so an
// opaque field can be forwarded byte for byte instead of being re-packed (msgpack-c would
// turn a whole float64 into an integer on the way).
#include "codec/field_reader.hpp"

#include <array>
#include <cstring>
#include <memory>

namespace rlbus::codec::detail {

namespace {

// Strings and binaries in a decoded object point into the input frame (no copy): the
// decoded msgpack::object never outlives the call that made it.
bool reference_everything(msgpack::type::object_type /*type*/, std::size_t /*size*/,
                          void* /*user*/) {
  return true;
}

// One zone kept per thread between decodes: clear() keeps its first chunk, so a message
// whose objects fit in it costs no allocation for the tree.
thread_local std::unique_ptr<msgpack::zone> spare_zone;

std::unique_ptr<msgpack::zone> take_zone() {
  if (spare_zone) return std::move(spare_zone);
  return std::make_unique<msgpack::zone>();
}

}  // namespace

unpacked::~unpacked() {
  auto& z = handle.zone();
  if (!z || spare_zone) return;
  z->clear();
  spare_zone = std::move(z);
}

unpacked unpack_map(std::string_view body, const decode_limits& lim) {
  unpacked u;
  if (body.empty()) {
    u.fault = decode_error{error_code::bad_body, "empty body: expected a msgpack map"};
    return u;
  }
  const msgpack::unpack_limit limit(lim.max_array, lim.max_map, lim.max_str, lim.max_bin,
                                    /*ext=*/0, lim.max_depth);
  std::size_t offset = 0;
  try {
    auto zone = take_zone();
    bool referenced = false;
    const auto obj = msgpack::unpack(*zone, body.data(), body.size(), offset, referenced,
                                     reference_everything, nullptr, limit);
    u.handle = msgpack::object_handle(obj, std::move(zone));
  } catch (const msgpack::insufficient_bytes&) {
    u.fault = decode_error{error_code::bad_body, "truncated msgpack body"};
    return u;
  } catch (const msgpack::depth_size_overflow&) {
    u.fault = decode_error{error_code::bad_body, "msgpack nesting too deep"};
    return u;
  } catch (const msgpack::size_overflow& e) {
    u.fault =
        decode_error{error_code::bad_body, fmt::format("msgpack limit exceeded ({})", e.what())};
    return u;
  } catch (const std::exception& e) {
    u.fault = decode_error{error_code::bad_body, fmt::format("malformed msgpack ({})", e.what())};
    return u;
  }
  if (offset != body.size()) {
    u.fault =
        decode_error{error_code::bad_body,
                     fmt::format("{} trailing bytes after the msgpack body", body.size() - offset)};
  } else if (u.handle.get().type != msgpack::type::MAP) {
    u.fault = decode_error{error_code::bad_body, "body is not a msgpack map"};
  }
  return u;
}

namespace {

std::uint64_t read_be(std::string_view buf, std::size_t pos, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v = (v << 8U) | static_cast<std::uint8_t>(buf[pos + i]);
  return v;
}

}  // namespace

std::optional<std::size_t> skip_value(std::string_view buf, std::size_t pos) {
  std::uint64_t pending = 1;  // values still to skip; arrays and maps add their elements
  while (pending > 0) {
    if (pos >= buf.size()) return std::nullopt;
    --pending;
    const auto b = static_cast<std::uint8_t>(buf[pos]);
    std::size_t head = 1;        // header bytes
    std::uint64_t payload = 0;   // bytes after the header
    std::uint64_t children = 0;  // nested values
    const auto need = [&](std::size_t n) { return pos + n <= buf.size(); };
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
      // positive/negative fixint, nil, false, true
    } else if ((b & 0xf0U) == 0x80) {
      children = 2ULL * (b & 0x0fU);
    } else if ((b & 0xf0U) == 0x90) {
      children = b & 0x0fU;
    } else if ((b & 0xe0U) == 0xa0) {
      payload = b & 0x1fU;
    } else {
      switch (b) {
        case 0xc4:
        case 0xd9:
          head = 2;
          if (!need(2)) return std::nullopt;
          payload = read_be(buf, pos + 1, 1);
          break;
        case 0xc5:
        case 0xda:
          head = 3;
          if (!need(3)) return std::nullopt;
          payload = read_be(buf, pos + 1, 2);
          break;
        case 0xc6:
        case 0xdb:
          head = 5;
          if (!need(5)) return std::nullopt;
          payload = read_be(buf, pos + 1, 4);
          break;
        case 0xc7:
          head = 3;
          if (!need(3)) return std::nullopt;
          payload = read_be(buf, pos + 1, 1) + 1;
          break;
        case 0xc8:
          head = 4;
          if (!need(4)) return std::nullopt;
          payload = read_be(buf, pos + 1, 2) + 1;
          break;
        case 0xc9:
          head = 6;
          if (!need(6)) return std::nullopt;
          payload = read_be(buf, pos + 1, 4) + 1;
          break;
        case 0xca:
          payload = 4;
          break;
        case 0xcb:
          payload = 8;
          break;
        case 0xcc:
        case 0xd0:
          payload = 1;
          break;
        case 0xcd:
        case 0xd1:
          payload = 2;
          break;
        case 0xce:
        case 0xd2:
          payload = 4;
          break;
        case 0xcf:
        case 0xd3:
          payload = 8;
          break;
        case 0xd4:
          payload = 2;
          break;
        case 0xd5:
          payload = 3;
          break;
        case 0xd6:
          payload = 5;
          break;
        case 0xd7:
          payload = 9;
          break;
        case 0xd8:
          payload = 17;
          break;
        case 0xdc:
          head = 3;
          if (!need(3)) return std::nullopt;
          children = read_be(buf, pos + 1, 2);
          break;
        case 0xdd:
          head = 5;
          if (!need(5)) return std::nullopt;
          children = read_be(buf, pos + 1, 4);
          break;
        case 0xde:
          head = 3;
          if (!need(3)) return std::nullopt;
          children = 2 * read_be(buf, pos + 1, 2);
          break;
        case 0xdf:
          head = 5;
          if (!need(5)) return std::nullopt;
          children = 2 * read_be(buf, pos + 1, 4);
          break;
        default:
          return std::nullopt;  // 0xc1 is never used
      }
    }
    if (payload > buf.size() - pos - std::min(head, buf.size() - pos)) return std::nullopt;
    if (children > buf.size()) return std::nullopt;  // each child needs a byte at least
    pos += head + payload;
    pending += children;
  }
  return pos;
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

void field_reader::blob(std::string_view key, std::string& out, bool required, bool want_map,
                        bool allow_nil) {
  const auto* o = get(key, required);
  if (o == nullptr) return;
  if (o->type == msgpack::type::NIL) {
    if (!allow_nil) return fail(key, "must not be nil");
  } else if (want_map && o->type != msgpack::type::MAP) {
    return fail(key, "expected a map");
  }
  // Walk the raw top-level map to the same field: keys and values alternate in order.
  std::size_t pos = 0;
  const auto b = static_cast<std::uint8_t>(body_[0]);
  pos = (b & 0xf0U) == 0x80 ? 1 : b == 0xde ? 3 : 5;
  for (std::uint32_t i = 0; i < count_; ++i) {
    const auto* v = &fields_[i].val;
    const auto key_end = skip_value(body_, pos);
    if (!key_end) return fail(key, "malformed");
    const auto value_end = skip_value(body_, *key_end);
    if (!value_end) return fail(key, "malformed");
    if (v == o) {
      out.assign(body_.substr(*key_end, *value_end - *key_end));
      return;
    }
    pos = *value_end;
  }
  fail(key, "not found in the raw body");
}

void field_reader::string_list(std::string_view key, std::vector<std::string>& out,
                               std::size_t max_items, std::size_t max_len) {
  const auto* o = get(key, false);
  if (o == nullptr) return;
  if (o->type != msgpack::type::ARRAY) return fail(key, "expected an array of strings");
  if (o->via.array.size > max_items) return fail(key, fmt::format("more than {} items", max_items));
  for (std::uint32_t i = 0; i < o->via.array.size; ++i) {
    const auto& item = o->via.array.ptr[i];
    if (item.type != msgpack::type::STR || item.via.str.size > max_len)
      return fail(key, fmt::format("items must be strings of at most {} bytes", max_len));
    out.emplace_back(as_view(item));
  }
}

void field_reader::binary(std::string_view key, std::string& out, std::size_t max_len,
                          bool required) {
  const auto* o = get(key, required);
  if (o == nullptr) return;
  if (o->type != msgpack::type::BIN) return fail(key, "expected binary");
  if (o->via.bin.size > max_len) return fail(key, fmt::format("longer than {} bytes", max_len));
  out.assign(o->via.bin.ptr, o->via.bin.size);
}

}  // namespace rlbus::codec::detail
