// Codec unit tests: round trips, and a decoder that refuses hostile input with the right
// code instead of crashing or allocating without bound.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <msgpack.hpp>

#include "codec/codec.hpp"
#include "codec/field_reader.hpp"
#include "codec/map_writer.hpp"
#include "support/support.hpp"
#include "unit/round_trip.hpp"

using namespace rlbus;
using codec::error_code;
using test::round_trip;
using test::unhex;

namespace {

error_code refusal(std::uint8_t type, const std::string& body) {
  auto r = codec::decode_body(type, body);
  REQUIRE_FALSE(r);
  INFO(r.error().reason);
  CHECK_FALSE(r.error().reason.empty());
  return r.error().code;
}

constexpr auto hello_t = static_cast<std::uint8_t>(codec::msg_type::hello);

/// A deterministic stream of pseudo-random numbers (xorshift64).
class xorshift {
 public:
  explicit xorshift(std::uint64_t seed) : state_(seed) {}
  std::uint64_t operator()() {
    state_ ^= state_ << 13U;
    state_ ^= state_ >> 7U;
    state_ ^= state_ << 17U;
    return state_;
  }

 private:
  std::uint64_t state_;
};

/// Applies up to `max_edits` random edits to `body`: a byte changed, a cut, an inserted
/// header byte drawn from `header_base` + 0..header_span-1, or a splice of its own start.
void mutate(std::string& body, xorshift& next, int min_edits, int max_edits,
            std::uint8_t header_base, unsigned header_span) {
  const int edits =
      min_edits + static_cast<int>(next() % static_cast<unsigned>(max_edits - min_edits + 1));
  for (int e = 0; e < edits && !body.empty(); ++e) {
    const auto at = next() % body.size();
    switch (next() % 4) {
      case 0:
        body[at] = static_cast<char>(next());
        break;
      case 1:
        body.resize(at);
        break;
      case 2:
        body.insert(at, 1, static_cast<char>(header_base + next() % header_span));
        break;
      default:
        body.insert(at, body.substr(0, next() % (body.size() + 1)));
        break;
    }
  }
}

std::string hello_with(const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& extra,
                       std::uint32_t n_extra) {
  msgpack::sbuffer buf;
  msgpack::packer pk(buf);
  pk.pack_map(3 + n_extra);
  pk.pack("role").pack("collector");
  pk.pack("id").pack("c0");
  pk.pack("heartbeat_ms").pack(1000);
  extra(pk);
  return {buf.data(), buf.size()};
}

}  // namespace

TEST_CASE("every v1 message survives an encode/decode round trip", "[unit][codec]") {
  codec::hello h{role::learner, "learner-1", 250, {{"cpu", 8}, {"gpu", 2}, {"mem", 0.5}}, 99};
  CHECK(round_trip(h) == h);
  h.session.reset();
  h.resources.clear();
  CHECK(round_trip(h) == h);
  codec::welcome w{1, 2, 3000, 3, 1 << 20, true};
  CHECK(round_trip(w) == w);
  CHECK(round_trip(codec::heartbeat{}) == codec::heartbeat{});
  codec::disconnect d{410, "silent"};
  CHECK(round_trip(d) == d);
  codec::error e{402, "field 'id': missing", 1};
  CHECK(round_trip(e) == e);
  e.ref_type.reset();
  CHECK(round_trip(e) == e);
}

TEST_CASE("events survive an encode/decode round trip", "[unit][codec]") {
  codec::event e{"worker.lost", 7, 11, 1234,
                 codec::peer_gone{"c1", role::collector, 5, 410, "quiet"}};
  auto back = codec::decode_event(e.topic, codec::encode_event(e));
  REQUIRE(back);
  CHECK(back.value() == e);
  codec::event j{"coordinator.joined", 8, 11, 1,
                 codec::peer_joined{"co", role::coordinator, 6, {}, true}};
  auto jb = codec::decode_event(j.topic, codec::encode_event(j));
  REQUIRE(jb);
  CHECK(jb.value() == j);
}

TEST_CASE("header frames are exactly 'R' 'L' version type", "[unit][codec]") {
  const auto h = codec::make_header(codec::msg_type::heartbeat);
  const auto parsed = codec::parse_header({h.data(), h.size()});
  REQUIRE(parsed);
  CHECK(parsed->version == 1);
  CHECK(parsed->type == 0x03);
  CHECK_FALSE(codec::parse_header(unhex("524c01")));      // short
  CHECK_FALSE(codec::parse_header(unhex("524c010300")));  // long
  CHECK_FALSE(codec::parse_header(unhex("584c0103")));    // wrong signature
  CHECK_FALSE(codec::parse_header(""));
}

TEST_CASE("the decoder refuses the 6-byte array32 bomb without allocating", "[unit][codec]") {
  // dd 1e 1e 1e 1e 1e: an array32 header claiming ~505 million elements. Unlimited, the
  // unpacker would reserve 16 GiB; with limits it must fail at once.
  CHECK(refusal(hello_t, unhex("dd1e1e1e1e1e")) == error_code::bad_body);
  CHECK(refusal(hello_t, unhex("df7fffffff")) == error_code::bad_body);  // map32 bomb
  CHECK(refusal(hello_t, unhex("dbffffffff")) == error_code::bad_body);  // str32 bomb
  CHECK(refusal(hello_t, unhex("c6ffffffff")) == error_code::bad_body);  // bin32 bomb
}

TEST_CASE("the decoder refuses oversized, deep, truncated and trailing input", "[unit][codec]") {
  SECTION("a string past the 64 KiB limit") {
    const std::string big(70 * 1024, 'x');
    CHECK(refusal(hello_t, hello_with([&](auto& pk) { pk.pack("note").pack(big); }, 1)) ==
          error_code::bad_body);
  }
  SECTION("an array past the element limit") {
    CHECK(refusal(hello_t, hello_with(
                               [](auto& pk) {
                                 pk.pack("xs");
                                 pk.pack_array(2000);
                                 for (int i = 0; i < 2000; ++i) pk.pack(i);
                               },
                               1)) == error_code::bad_body);
  }
  SECTION("nesting past the depth limit") {
    CHECK(refusal(hello_t, hello_with(
                               [](auto& pk) {
                                 pk.pack("deep");
                                 for (int i = 0; i < 100; ++i) pk.pack_array(1);
                                 pk.pack(0);
                               },
                               1)) == error_code::bad_body);
  }
  SECTION("the top map is the first level: 15 containers under it pass, 16 do not") {
    const auto nested = [](int levels) {
      return [levels](auto& pk) {
        pk.pack("deep");
        for (int i = 0; i < levels; ++i) pk.pack_array(1);
        pk.pack(0);
      };
    };
    CHECK(codec::decode_body(hello_t, hello_with(nested(15), 1)));
    CHECK(refusal(hello_t, hello_with(nested(16), 1)) == error_code::bad_body);
  }
  SECTION("every truncation of a valid body") {
    const auto body =
        codec::encode_body(codec::hello{role::collector, "c0", 1000, {{"cpu", 1}}, 5});
    for (std::size_t n = 0; n < body.size(); ++n) {
      INFO("truncated to " << n << " bytes");
      CHECK(refusal(hello_t, body.substr(0, n)) == error_code::bad_body);
    }
  }
  SECTION("trailing bytes after the map") {
    const auto body = codec::encode_body(codec::heartbeat{}) + '\xc0';
    CHECK(refusal(static_cast<std::uint8_t>(codec::msg_type::heartbeat), body) ==
          error_code::bad_body);
  }
  SECTION("a body that is not a map") {
    CHECK(refusal(hello_t, unhex("93010203")) == error_code::bad_body);
    CHECK(refusal(hello_t, unhex("c0")) == error_code::bad_body);
  }
}

TEST_CASE("the decoder refuses missing and mistyped fields with BAD_FIELD", "[unit][codec]") {
  const auto bad = [](const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& f) {
    msgpack::sbuffer buf;
    msgpack::packer pk(buf);
    f(pk);
    return refusal(hello_t, {buf.data(), buf.size()});
  };
  CHECK(bad([](auto& pk) { pk.pack_map(2).pack("role").pack("collector").pack("id").pack("c"); }) ==
        error_code::bad_field);  // heartbeat_ms missing
  CHECK(bad([](auto& pk) {
          pk.pack_map(3).pack("role").pack(3).pack("id").pack("c").pack("heartbeat_ms").pack(100);
        }) == error_code::bad_field);
  CHECK(bad([](auto& pk) {
          pk.pack_map(3)
              .pack("role")
              .pack("collector")
              .pack("id")
              .pack("c")
              .pack("heartbeat_ms")
              .pack("100");
        }) == error_code::bad_field);
  CHECK(bad([](auto& pk) {
          pk.pack_map(3)
              .pack("role")
              .pack("collector")
              .pack("id")
              .pack("a b")
              .pack("heartbeat_ms")
              .pack(100);
        }) == error_code::bad_field);
  CHECK(bad([](auto& pk) {
          pk.pack_map(4)
              .pack("role")
              .pack("collector")
              .pack("id")
              .pack("c")
              .pack("heartbeat_ms")
              .pack(100);
          pk.pack("resources").pack_map(1).pack("cpu").pack(std::nan(""));
        }) == error_code::bad_field);
  CHECK(bad([](auto& pk) {
          pk.pack_map(4)
              .pack("role")
              .pack("collector")
              .pack("id")
              .pack("c")
              .pack("heartbeat_ms")
              .pack(100);
          pk.pack("resources").pack_array(0);
        }) == error_code::bad_field);
}

TEST_CASE("unknown fields are ignored, so newer peers can add fields", "[unit][codec]") {
  const auto body =
      hello_with([](auto& pk) { pk.pack("future_field").pack_map(1).pack("x").pack(1); }, 1);
  auto r = codec::decode_body(hello_t, body);
  REQUIRE(r);
  CHECK(std::get<codec::hello>(r.value()).id == "c0");
}

TEST_CASE("unknown type ids are refused with UNKNOWN_TYPE", "[unit][codec]") {
  CHECK(refusal(0x7f, codec::encode_body(codec::heartbeat{})) == error_code::unknown_type);
  CHECK(refusal(0x00, codec::encode_body(codec::heartbeat{})) == error_code::unknown_type);
  CHECK(refusal(0x60, codec::encode_body(codec::heartbeat{})) == error_code::unknown_type);
}

TEST_CASE("peer ids follow the id rule", "[unit][codec]") {
  CHECK(codec::valid_peer_id("collector-0.ns:22270"));
  CHECK(codec::valid_peer_id("a@b/c_d"));
  CHECK(codec::valid_peer_id(std::string(128, 'x')));
  CHECK_FALSE(codec::valid_peer_id(std::string(129, 'x')));
  CHECK_FALSE(codec::valid_peer_id(""));
  CHECK_FALSE(codec::valid_peer_id("has space"));
  CHECK_FALSE(codec::valid_peer_id(std::string("nul\0", 4)));
}

TEST_CASE("mutated encodings never crash the decoder and always get a verdict", "[unit][codec]") {
  // A deterministic cousin of the libFuzzer target (tests/fuzz): flip, cut, splice and
  // grow valid bodies; every input must decode or be refused with a reason.
  const std::vector<std::pair<std::uint8_t, std::string>> seeds = {
      {hello_t,
       codec::encode_body(codec::hello{role::learner, "l-1", 500, {{"gpu", 2}, {"cpu", 1.5}}, 7})},
      {0x02, codec::encode_body(codec::welcome{9, 8, 1000, 3, 4096, true})},
      {0x04, codec::encode_body(codec::disconnect{410, "gone"})},
      {0x05, codec::encode_body(codec::error{402, "bad", 1})},
  };
  xorshift next(0x9E3779B97F4A7C15ULL);
  std::size_t accepted = 0;
  std::size_t refused = 0;
  for (int i = 0; i < 50'000; ++i) {
    const auto& [type, seed] = seeds[next() % seeds.size()];
    std::string body = seed;
    mutate(body, next, 1, 4, 0xdc, 4);  // array and map headers: big counts
    auto r = codec::decode_body(type, body);
    if (r) {
      ++accepted;
    } else {
      ++refused;
      REQUIRE_FALSE(r.error().reason.empty());
    }
  }
  CHECK(accepted > 0);  // the mutations are not all fatal, so field checks get exercised too
  CHECK(refused > 0);
}

// The broker's in-place DATA reader must judge every input as the decoder does, whatever
// the bytes: the same verdict, the same fields, the same reason.
TEST_CASE("DATA read in place gets the decoder's verdict on mutated input", "[unit][codec]") {
  const codec::data_ready full{
      "t-1", 3, "d-9", "buf", codec::map_writer(1).uint("k", 2).done(), std::string(40, 'p'),
      7,     12};
  const std::vector<std::string> seeds = {
      codec::encode_body(full),
      codec::encode_body(codec::data_ready{"t", 1, "d", "b", codec::empty_map_blob, {}, {}, {}}),
  };
  xorshift next(0xD1B54A32D192ED03ULL);
  std::size_t accepted = 0;
  for (int i = 0; i < 20'000; ++i) {
    std::string body = seeds[next() % seeds.size()];
    mutate(body, next, 1, 3, 0xc4, 2);
    const auto decoded = codec::decode_body(static_cast<std::uint8_t>(codec::msg_type::data), body);
    const auto read = codec::read_data(body);
    REQUIRE(read.ok() == decoded.ok());
    if (!decoded) {
      REQUIRE(read.error().reason == decoded.error().reason);
      continue;
    }
    ++accepted;
    const auto want = codec::view_of(std::get<codec::data_ready>(decoded.value()));
    REQUIRE(read.value() == want);
  }
  CHECK(accepted > 0);
}

// Every size class of the fixed fields (fixstr and str8 ids, fixint to uint32 attempts,
// seqs past 2^32, no worker, a body past the zero-copy bound) comes out canonical.
TEST_CASE("a TASK_EVENT written from its fixed part is its canonical encoding", "[unit][codec]") {
  const std::vector<std::string> task_ids{"t", std::string(31, 'a'), std::string(128, 'b')};
  const std::vector<std::string> workers{"", "collector-7", std::string(40, 'w')};
  const std::vector<std::string> bodies{
      codec::empty_map_blob, codec::map_writer(1).bin("p", std::string(70'000, 'x')).done()};
  for (const auto& task_id : task_ids) {
    for (const std::uint32_t attempt : {1U, 127U, 128U, 65'536U, 0xFFFFFFFFU}) {
      for (const auto& worker : workers) {
        for (const std::uint64_t seq : {1ULL, 300ULL, 1ULL << 40U}) {
          for (const auto& body : bodies) {
            const codec::task_event e{seq, task_id, attempt, "data", worker, body};
            auto wire = codec::event_head(codec::event_fixed(task_id, attempt, worker), seq,
                                          e.event, body.size());
            wire.append(body);
            INFO(task_id.size() << " " << attempt << " '" << worker << "' " << seq);
            REQUIRE(wire == codec::encode_body(codec::message{e}));
          }
        }
      }
    }
  }
}

TEST_CASE("resource values keep one canonical form at every magnitude", "[unit][codec]") {
  // Whole numbers below 2^53 travel as integers; everything else as float64, even whole
  // numbers msgpack-c would silently turn into integers.
  for (const double v :
       {0.0, 3.0, 9007199254740991.0, 9007199254740992.0, 1e300, 18446744073709551616.0, 0.25}) {
    INFO(v);
    codec::hello h{role::collector, "c", 1000, {{"x", v}}, std::nullopt};
    const auto body = codec::encode_body(h);
    const bool as_float = body.find('\xcb') != std::string::npos;
    CHECK(as_float == !(v < 9007199254740992.0 && std::floor(v) == v));
    CHECK(round_trip(h) == h);
  }
}

TEST_CASE("a refusal quotes hostile input only in short pieces", "[unit][codec]") {
  const std::string key(3000, 'k');
  msgpack::sbuffer buf;
  msgpack::packer pk(buf);
  pk.pack_map(2).pack(key).pack(1).pack(key).pack(2);
  auto r = codec::decode_body(hello_t, {buf.data(), buf.size()});
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::bad_body);
  CHECK(r.error().reason.size() <= codec::max_reason_length);
}

TEST_CASE("every task message survives an encode/decode round trip", "[unit][codec]") {
  const std::string meta = codec::encode_body(codec::heartbeat{});  // {} as a blob
  std::string info_blob;
  {
    msgpack::sbuffer b;
    msgpack::packer pk(b);
    pk.pack_map(2).pack("collector_done").pack(true).pack("reward").pack_double(1.5);
    info_blob.assign(b.data(), b.size());
  }
  round_trip(
      codec::submit{"task-1", role::learner, info_blob, {{"gpu", 1}}, 1000, 2000, 3000, 60000, 3});
  round_trip(codec::submit{"task-2", role::collector, meta, {}, {}, {}, {}, {}, {}});
  round_trip(codec::submitted{"task-1", true, 0, "", 4});
  round_trip(codec::finish{"task-1"});
  round_trip(codec::cancel{"task-1", "no longer needed"});
  round_trip(codec::data_reply{"task-1", 7, codec::nil_blob});
  round_trip(codec::data_reply{"task-1", 8, info_blob});
  round_trip(codec::task_event{3, "task-1", 2, "data", "collector-0", info_blob});
  round_trip(codec::task_start{"task-1", 1, role::collector, info_blob});
  round_trip(codec::task_close{"task-1", 2});
  round_trip(codec::learn{"task-1", 1, 9, info_blob});
  round_trip(codec::no_data{"task-1", 1, 9, 20});
  round_trip(codec::task_abort{"task-1", 1, "re-assigned"});
  round_trip(codec::started{"task-1", 1});
  round_trip(
      codec::data_ready{"task-1", 1, "data-0001", "buffer-0", info_blob, std::string("\0\1\2", 3)});
  round_trip(codec::data_ready{"task-1", 1, "data-0002", "", meta, std::nullopt});
  round_trip(codec::info{"task-1", 1, info_blob});
  round_trip(codec::get_data{"task-1", 1, 5, "buffer-0", 64, 1000});
  round_trip(codec::learn_info{"task-1", 1, "buffer-0", info_blob});
  round_trip(codec::task_result{"task-1", 1, info_blob});
  round_trip(codec::task_failed{"task-1", 1, "handler threw"});
  round_trip(codec::task_alive{"task-1", 7});
}

TEST_CASE("opaque user data is forwarded byte for byte", "[unit][codec]") {
  // A whole float64 (1.0) would become the integer 1 if the codec re-packed user data.
  const std::string info_blob("\x81\xa1x\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00", 12);
  const auto body = codec::encode_body(codec::info{"t", 1, info_blob});
  auto back = codec::decode_body(static_cast<std::uint8_t>(codec::msg_type::info), body);
  REQUIRE(back);
  CHECK(std::get<codec::info>(back.value()).body == info_blob);
}

TEST_CASE("task messages refuse bad task ids, attempts and shapes", "[unit][codec]") {
  const auto type = [](codec::msg_type t) { return static_cast<std::uint8_t>(t); };
  CHECK(refusal(type(codec::msg_type::started), codec::encode_body(codec::started{"bad id", 1})) ==
        error_code::bad_field);
  CHECK(refusal(type(codec::msg_type::started), codec::encode_body(codec::started{"t", 0})) ==
        error_code::bad_field);
  // INFO's info must be a map
  CHECK(refusal(type(codec::msg_type::info),
                codec::encode_body(codec::info{"t", 1, codec::nil_blob})) == error_code::bad_field);
  // SUBMIT's kind must be a role
  msgpack::sbuffer b;
  msgpack::packer pk(b);
  pk.pack_map(3)
      .pack("task_id")
      .pack("t")
      .pack("kind")
      .pack("trainer")
      .pack("task_info")
      .pack_map(0);
  CHECK(refusal(type(codec::msg_type::submit), {b.data(), b.size()}) == error_code::bad_field);
}

// The decoder reads bodies in place (codec/field_reader): its own walk decides what is a
// well-formed body within the limits. msgpack-c's unpacker, given the same limits, is the
// reference: on every mutation of a set of valid bodies both must give the same verdict,
// and an accepted body must have the same top-level keys, each with the same value bytes.
TEST_CASE("the in-place body check agrees with msgpack-c's unpacker", "[unit][codec]") {
  const codec::decode_limits lim{};
  const std::vector<std::string> seeds = {
      codec::encode_body(codec::hello{role::learner, "l-1", 500, {{"gpu", 2}, {"cpu", 1.5}}, 7}),
      codec::encode_body(codec::error{402, "bad", 1}),
      codec::encode_body(codec::data_ready{"t-1", 2, "d-9", "buf",
                                           "\x82\xa1x\xd0\xfb\xa1y\xcb" + std::string(8, '\x01'),
                                           std::string(40, 'p'), 17, 3}),
      unhex("83a161dc0003c0c2c3a162d1ff00a163ca3f800000"),  // array16, nint16, float32
      unhex("82a16191c7010161a162d40102"),                  // ext values (refused)
      unhex("81a17891919191919191919191919191919100"),      // nesting 16 deep: the limit
      unhex("81a1789191919191919191919191919191919100"),    // 17 deep: refused
  };
  // The reference: unpack with limits, a single map, no trailing bytes, string keys, no
  // duplicate key; accepted bodies give each value by key (re-packed, and as read).
  struct value {
    std::string packed;
    msgpack::object_handle read;
  };
  const auto reference =
      [&](const std::string& body) -> std::optional<std::vector<std::pair<std::string, value>>> {
    if (body.empty()) return std::nullopt;
    const msgpack::unpack_limit limit(lim.max_array, lim.max_map, lim.max_str, lim.max_bin, 0,
                                      lim.max_depth);
    std::size_t off = 0;
    msgpack::object_handle h;
    try {
      h = msgpack::unpack(body.data(), body.size(), off, nullptr, nullptr, limit);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (off != body.size() || h.get().type != msgpack::type::MAP) return std::nullopt;
    std::vector<std::pair<std::string, value>> out;
    for (std::uint32_t i = 0; i < h.get().via.map.size; ++i) {
      const auto& kv = h.get().via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) return std::nullopt;
      std::string key(kv.key.via.str.ptr, kv.key.via.str.size);
      for (const auto& [k, v] : out)
        if (k == key) return std::nullopt;
      msgpack::sbuffer packed;
      msgpack::pack(packed, kv.val);
      out.emplace_back(std::move(key),
                       value{std::string(packed.data(), packed.size()), msgpack::clone(kv.val)});
    }
    return out;
  };
  xorshift next(0x2545F4914F6CDD1DULL);
  std::size_t agreed_accept = 0;
  std::size_t agreed_refuse = 0;
  for (int i = 0; i < 60'000; ++i) {
    std::string body = seeds[next() % seeds.size()];
    mutate(body, next, 0, 3, 0xc4, 28);  // every typed header from bin8 to map32
    const auto want = reference(body);
    codec::detail::field_reader reader(body, lim);
    const bool accepted = !reader.fault();
    INFO("body " << i << ": " << body.size() << " bytes");
    REQUIRE(accepted == want.has_value());
    if (!accepted) {
      ++agreed_refuse;
      continue;
    }
    ++agreed_accept;
    // Same keys; each value's bytes as the reader keeps them (blob) re-packed by msgpack-c
    // are what msgpack-c packs for its own reading of them; and a value's head reads as
    // msgpack-c reads it (type, integer, float, length).
    using kind = codec::detail::head::kind;
    for (const auto& [key, v] : *want) {
      std::string raw;
      reader.blob(key, raw, true, false, true);
      REQUIRE_FALSE(reader.fault());
      std::size_t off = 0;
      const auto again = msgpack::unpack(raw.data(), raw.size(), off);
      msgpack::sbuffer repacked;
      msgpack::pack(repacked, again.get());
      CHECK(std::string(repacked.data(), repacked.size()) == v.packed);
      const auto h = codec::detail::read_head(raw, 0);
      REQUIRE(h);
      const auto& o = v.read.get();
      switch (o.type) {
        case msgpack::type::POSITIVE_INTEGER:
          CHECK((h->k == kind::uint && h->n == o.via.u64));
          break;
        case msgpack::type::NEGATIVE_INTEGER:
          CHECK((h->k == kind::nint && static_cast<std::int64_t>(h->n) == o.via.i64));
          break;
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64:
          CHECK((h->k == kind::real && (h->real == o.via.f64 || std::isnan(o.via.f64))));
          break;
        case msgpack::type::BOOLEAN:
          CHECK((h->k == kind::boolean && (h->n != 0) == o.via.boolean));
          break;
        case msgpack::type::STR:
          CHECK((h->k == kind::str && h->n == o.via.str.size));
          break;
        case msgpack::type::BIN:
          CHECK((h->k == kind::bin && h->n == o.via.bin.size));
          break;
        case msgpack::type::ARRAY:
          CHECK((h->k == kind::array && h->n == o.via.array.size));
          break;
        case msgpack::type::MAP:
          CHECK((h->k == kind::map && h->n == o.via.map.size));
          break;
        default:
          CHECK(h->k == kind::nil);
      }
    }
  }
  CHECK(agreed_accept > 1000);
  CHECK(agreed_refuse > 1000);
}

TEST_CASE("check_user_map gives the decoder's verdict on one user map", "[unit][codec]") {
  using codec::error_code;
  const auto nested = test::nested_map;
  CHECK_FALSE(codec::check_user_map("\x80"));
  CHECK_FALSE(codec::check_user_map(nested(15)));  // a field may hold 15 levels (SPEC 5.1)
  CHECK_FALSE(codec::check_user_map(nested(14), 14));
  const auto code = [](const std::optional<codec::decode_error>& e) {
    REQUIRE(e);
    return e->code;
  };
  CHECK(code(codec::check_user_map(nested(16))) == error_code::bad_body);
  CHECK(code(codec::check_user_map(nested(15), 14)) == error_code::bad_field);
  CHECK(code(codec::check_user_map(std::string("\x01", 1))) == error_code::bad_field);
  CHECK(code(codec::check_user_map(std::string("\x80\x80", 2))) == error_code::bad_body);
  CHECK(code(codec::check_user_map(std::string("\x81\xa1", 2))) == error_code::bad_body);
  CHECK(code(codec::check_user_map(std::string("\x81\xa1x\xd4\x01\x00", 6))) ==
        error_code::bad_body);  // an ext value
}

// §12.2.5: a task's `kind` is collector or learner. The decoder refuses coordinator with 402
// wherever a kind travels (SUBMIT, CAPACITY, TASK_START, and the task and capacity events),
// as messages.json says, instead of reading it as a role.
TEST_CASE("a kind of coordinator is refused with 402", "[unit][codec]") {
  const auto refused = [](const codec::message& m) {
    const auto bytes = codec::encode_body(m);
    const auto back = codec::decode_body(static_cast<std::uint8_t>(codec::type_of(m)), bytes);
    REQUIRE_FALSE(back);
    CHECK(back.error().code == error_code::bad_field);
    CHECK_THAT(back.error().reason, Catch::Contains("'kind'") && Catch::Contains("coordinator"));
  };
  codec::submit s{"t", role::coordinator};
  refused(s);
  codec::capacity c{role::coordinator, codec::capacity_change::snapshot, "", 0};
  refused(c);
  codec::task_start start{"t", 1, role::coordinator};
  refused(start);
  s.kind = role::learner;
  CHECK(round_trip(s).kind == role::learner);

  for (const std::string topic : {"task.coord.started", "capacity.collector"}) {
    codec::event e{topic, 1, 0, 0};
    if (topic[0] == 't')
      e.body = codec::task_status{"t", role::coordinator, 1, "w", ""};
    else
      e.body = codec::capacity_status{role::coordinator, codec::capacity_change::increase, "w", 1};
    const auto back = codec::decode_event(topic, codec::encode_event(e));
    REQUIRE_FALSE(back);
    CHECK(back.error().code == error_code::bad_field);
  }
}
