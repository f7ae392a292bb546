// The codec of the topic bus (SPEC §17): its eight messages, the topic and flag rules, the
// role `bus`, and which type ids are the bus's and carry a payload frame.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <msgpack.hpp>

#include "codec/batch.hpp"
#include "codec/codec.hpp"
#include "unit/round_trip.hpp"

using namespace rlbus;
using codec::error_code;
using codec::msg_type;
using test::round_trip;

namespace {

using packer = msgpack::packer<msgpack::sbuffer>;

// A body written by hand: a map of `n` entries that `fill` packs.
template <class Fill>
std::string body(std::uint32_t n, Fill&& fill) {
  msgpack::sbuffer buf;
  packer pk(buf);
  pk.pack_map(n);
  fill(pk);
  return {buf.data(), buf.size()};
}

codec::result<codec::message> decode(msg_type t, const std::string& bytes) {
  return codec::decode_body(static_cast<std::uint8_t>(t), bytes);
}

// The keys of a body, in order.
std::vector<std::string> keys_of(const std::string& bytes) {
  const auto oh = msgpack::unpack(bytes.data(), bytes.size());
  std::vector<std::string> out;
  const auto& m = oh.get().via.map;
  for (std::uint32_t i = 0; i < m.size; ++i) out.push_back(m.ptr[i].key.as<std::string>());
  return out;
}

std::string publish_with_topic(const std::string& topic) {
  return body(2, [&](packer& pk) {
    pk.pack(std::string("seq")).pack(1);
    pk.pack(std::string("topic")).pack(topic);
  });
}

std::string subscribe_with_topic(const std::string& topic) {
  return body(2, [&](packer& pk) {
    pk.pack(std::string("req")).pack(1);
    pk.pack(std::string("topic")).pack(topic);
  });
}

void refused_402(msg_type t, const std::string& bytes, const std::string& field) {
  const auto r = decode(t, bytes);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::bad_field);
  CHECK_THAT(r.error().reason, Catch::Contains("'" + field + "'"));
}

}  // namespace

TEST_CASE("every bus message round-trips with its flags set and unset", "[unit][codec][bus]") {
  codec::subscribe sub{7, "sensors.", true, true, true};
  CHECK(round_trip(sub) == sub);
  CHECK(round_trip(codec::subscribe{1, "", true, false, false}).topic.empty());
  codec::unsubscribe unsub{8, "sensors.", true};
  CHECK(round_trip(unsub) == unsub);
  codec::subscribed ans{7, false, 440, "bus-max-subscriptions is 1024", 1024};
  CHECK(round_trip(ans) == ans);
  codec::publish pub{~std::uint64_t{0}, "a/b.c", 0xFFFF'FFFF, true, false};
  CHECK(round_trip(pub) == pub);
  codec::publish_credit credit{64, 128};
  CHECK(round_trip(credit) == credit);
  codec::deliver d{3, "x", "node-1", 2, true, true, true};
  CHECK(round_trip(d) == d);
  codec::bus_ack ack{0};
  CHECK(round_trip(ack) == ack);
  codec::bus_gap gap{4, 9};
  CHECK(round_trip(gap) == gap);
  for (const auto& m : {codec::message{codec::subscribe{}}, codec::message{codec::publish{}},
                        codec::message{codec::deliver{}}})
    CHECK(codec::is_bus_type(static_cast<std::uint8_t>(codec::type_of(m))));
}

TEST_CASE("flags are written only when true or not 0", "[unit][codec][bus]") {
  using strings = std::vector<std::string>;
  CHECK(keys_of(codec::encode_body(codec::subscribe{1, "t"})) == strings{"req", "topic"});
  CHECK(keys_of(codec::encode_body(codec::subscribe{1, "t", false, true, false})) ==
        strings{"req", "topic", "echo"});
  CHECK(keys_of(codec::encode_body(codec::publish{1, "t"})) == strings{"seq", "topic"});
  CHECK(keys_of(codec::encode_body(codec::publish{1, "t", 3, false, true})) ==
        strings{"seq", "topic", "part", "retain"});
  CHECK(keys_of(codec::encode_body(codec::deliver{5, "t", "p", 0, false, false, true})) ==
        strings{"seq", "topic", "from", "abandoned"});
  // The map header counts exactly the fields written (§5.5): fixmap of 2.
  CHECK(codec::encode_body(codec::publish{1, "t"})[0] == '\x82');
}

TEST_CASE("a present false or 0 flag decodes as the default", "[unit][codec][bus]") {
  const auto explicit_defaults = body(5, [](packer& pk) {
    pk.pack(std::string("seq")).pack(2);
    pk.pack(std::string("topic")).pack(std::string("t"));
    pk.pack(std::string("part")).pack(0);
    pk.pack(std::string("more")).pack(false);
    pk.pack(std::string("retain")).pack(false);
  });
  const auto r = decode(msg_type::publish, explicit_defaults);
  INFO((r ? "" : r.error().reason));
  REQUIRE(r);
  const auto& p = std::get<codec::publish>(r.value());
  CHECK(p == codec::publish{2, "t"});
  // Not canonical: its re-encoding leaves them out.
  CHECK(codec::encode_body(r.value()) == codec::encode_body(codec::publish{2, "t"}));
  CHECK(codec::encode_body(r.value()).size() < explicit_defaults.size());
}

TEST_CASE("flags of another kind or out of range are refused with 402", "[unit][codec][bus]") {
  refused_402(msg_type::subscribe,
              body(3,
                   [](packer& pk) {
                     pk.pack(std::string("req")).pack(1);
                     pk.pack(std::string("topic")).pack(std::string("t"));
                     pk.pack(std::string("prefix")).pack(1);
                   }),
              "prefix");
  const auto publish_part = [](auto&& write_value) {
    return body(3, [&](packer& pk) {
      pk.pack(std::string("seq")).pack(1);
      pk.pack(std::string("topic")).pack(std::string("t"));
      pk.pack(std::string("part"));
      write_value(pk);
    });
  };
  refused_402(msg_type::publish, publish_part([](packer& pk) { pk.pack_true(); }), "part");
  refused_402(msg_type::publish, publish_part([](packer& pk) { pk.pack_int8(-1); }), "part");
  refused_402(msg_type::publish,
              publish_part([](packer& pk) { pk.pack_uint64(std::uint64_t{1} << 32U); }), "part");
  refused_402(msg_type::publish, publish_part([](packer& pk) { pk.pack_double(1.5); }), "part");
  refused_402(msg_type::publish, publish_part([](packer& pk) { pk.pack_str(0); }), "part");
  const auto top =
      decode(msg_type::publish, publish_part([](packer& pk) { pk.pack_uint32(0xFFFF'FFFF); }));
  REQUIRE(top);
  CHECK(std::get<codec::publish>(top.value()).part == 0xFFFF'FFFFU);
  // msgpack nil in place of an optional field is a type error (§4), flags included.
  refused_402(msg_type::deliver,
              body(4,
                   [](packer& pk) {
                     pk.pack(std::string("seq")).pack(1);
                     pk.pack(std::string("topic")).pack(std::string("t"));
                     pk.pack(std::string("from")).pack(std::string("p"));
                     pk.pack(std::string("more")).pack_nil();
                   }),
              "more");
}

TEST_CASE("topics are 1 to 256 printable ASCII characters other than space", "[unit][codec][bus]") {
  std::string every;
  for (int c = 0x21; c <= 0x7E; ++c) every.push_back(static_cast<char>(c));
  for (const auto& ok : {every, std::string(256, 'a'), std::string("*"), std::string("A.b/C")}) {
    INFO("topic " << ok);
    CHECK(decode(msg_type::publish, publish_with_topic(ok)));
    CHECK(decode(msg_type::subscribe, subscribe_with_topic(ok)));
    CHECK(codec::valid_topic(ok));
  }
  for (const auto& bad :
       {std::string(257, 'a'), std::string("a b"), std::string("a\tb"), std::string("a\x7f"),
        std::string("\xc3\xa9"), std::string("a\n"), std::string("a\0b", 3)}) {
    INFO("topic " << bad);
    refused_402(msg_type::publish, publish_with_topic(bad), "topic");
    refused_402(msg_type::subscribe, subscribe_with_topic(bad), "topic");
    CHECK_FALSE(codec::valid_topic(bad, codec::rule::topic{true}));
  }
  // Empty: a prefix subscription's topic (the prefix of every topic); never a publication's.
  refused_402(msg_type::publish, publish_with_topic(""), "topic");
  CHECK(decode(msg_type::subscribe, subscribe_with_topic("")));
  CHECK(decode(msg_type::unsubscribe, subscribe_with_topic("")));
  CHECK_FALSE(codec::valid_topic(""));
  CHECK(codec::valid_topic("", codec::rule::topic{true}));
  // A topic is a str: bin is not accepted (§4).
  refused_402(msg_type::publish,
              body(2,
                   [](packer& pk) {
                     pk.pack(std::string("seq")).pack(1);
                     pk.pack(std::string("topic"));
                     pk.pack_bin(1);
                     pk.pack_bin_body("t", 1);
                   }),
              "topic");
}

TEST_CASE("bus messages refuse missing and out-of-range fields", "[unit][codec][bus]") {
  refused_402(msg_type::publish, body(1, [](packer& pk) { pk.pack(std::string("seq")).pack(1); }),
              "topic");
  refused_402(msg_type::publish,
              body(1, [](packer& pk) { pk.pack(std::string("topic")).pack(std::string("t")); }),
              "seq");
  refused_402(msg_type::subscribe,
              body(2,
                   [](packer& pk) {
                     pk.pack(std::string("req")).pack(0);
                     pk.pack(std::string("topic")).pack(std::string("t"));
                   }),
              "req");
  refused_402(msg_type::deliver, publish_with_topic("t"), "from");
  refused_402(msg_type::deliver,
              body(3,
                   [](packer& pk) {
                     pk.pack(std::string("seq")).pack(1);
                     pk.pack(std::string("topic")).pack(std::string("t"));
                     pk.pack(std::string("from")).pack(std::string("no id!"));
                   }),
              "from");
  refused_402(msg_type::bus_gap,
              body(2,
                   [](packer& pk) {
                     pk.pack(std::string("first")).pack(0);
                     pk.pack(std::string("last")).pack(1);
                   }),
              "first");
  refused_402(msg_type::subscribed,
              body(5,
                   [](packer& pk) {
                     pk.pack(std::string("req")).pack(1);
                     pk.pack(std::string("accepted")).pack(true);
                     pk.pack(std::string("code")).pack(65536);
                     pk.pack(std::string("reason")).pack(std::string());
                     pk.pack(std::string("subscriptions")).pack(0);
                   }),
              "code");
  refused_402(msg_type::bus_ack, body(0, [](packer&) {}), "seq");
  refused_402(msg_type::publish_credit,
              body(1, [](packer& pk) { pk.pack(std::string("acked")).pack(0); }), "limit");
}

TEST_CASE("bus type ids: 0x70-0x77, none of them a task type, two with a payload frame",
          "[unit][codec][bus]") {
  for (int id = 0; id < 256; ++id) {
    const auto t = static_cast<std::uint8_t>(id);
    INFO("type 0x" << std::hex << id);
    const bool bus = id >= 0x70 && id <= 0x77;
    CHECK(codec::is_bus_type(t) == bus);
    if (bus) {
      CHECK_FALSE(codec::is_task_type(t));
      CHECK_FALSE(codec::is_ops_type(t));
      CHECK(codec::type_name(t));
    }
    CHECK(codec::has_payload_frame(t) == (id == 0x73 || id == 0x75));
    if (id >= 0x78 && id <= 0x7F) CHECK_FALSE(codec::type_name(t));  // still reserved
  }
  CHECK(codec::type_name(0x70) == "SUBSCRIBE");
  CHECK(codec::type_name(0x73) == "PUBLISH");
  CHECK(codec::type_name(0x75) == "DELIVER");
  CHECK(codec::type_name(0x77) == "BUS_GAP");
  CHECK(codec::code_name(440) == "TOO_MANY_SUBSCRIPTIONS");
  CHECK(codec::code_name(441) == "BAD_FRAGMENT");
  CHECK(codec::code_name(442) == "BAD_BATCH");
}

TEST_CASE("role bus: its spelling, HELLO and the bus.* events; never a task's kind",
          "[unit][codec][bus]") {
  CHECK(to_string(role::bus) == "bus");
  CHECK(parse_role("bus") == role::bus);
  CHECK_FALSE(parse_role("Bus"));
  const codec::hello h{role::bus, "node-1", 1000, {}, {}};
  CHECK(round_trip(h).role == role::bus);
  for (const auto topic :
       {codec::topic::bus_joined, codec::topic::bus_left, codec::topic::bus_lost}) {
    codec::event e{std::string(topic), 1, 2, 3};
    if (topic == codec::topic::bus_joined)
      e.body = codec::peer_joined{"node-1", role::bus, 4, {}, false};
    else
      e.body = codec::peer_gone{"node-1", role::bus, 4, 200, "bye"};
    const auto back = codec::decode_event(topic, codec::encode_event(e));
    INFO(topic << (back ? "" : ": " + back.error().reason));
    REQUIRE(back);
    CHECK(back.value() == e);
  }
  // A task's kind stays collector or learner (§12.2.5).
  const auto submit = codec::encode_body(codec::submit{"t", role::bus});
  const auto r = decode(msg_type::submit, submit);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::bad_field);
  CHECK_THAT(r.error().reason, Catch::Contains("'kind'") && Catch::Contains("bus"));
  codec::event status{"task.c.started", 1, 0, 0};
  status.body = codec::task_status{"t", role::bus, 1, "w", ""};
  CHECK_FALSE(codec::decode_event(status.topic, codec::encode_event(status)));
}

TEST_CASE("batch framing: made and split back, and any other bytes refused whole",
          "[unit][codec][bus]") {
  const std::vector<std::string> items{"a", "", std::string(300, 'x'), std::string("\0\1", 2)};
  std::string batch;
  for (const auto& i : items) codec::append_to_batch(batch, i);
  CHECK(batch.size() == 4 * codec::batch_item_head + 1 + 300 + 2);
  CHECK(batch.substr(0, 5) == std::string("\0\0\0\1a", 5));
  std::vector<std::string> back;
  CHECK(codec::for_each_in_batch(batch, 4, [&](std::string_view i) { back.emplace_back(i); }));
  CHECK(back == items);
  CHECK_FALSE(codec::valid_batch(batch, 3));
  CHECK_FALSE(codec::valid_batch(batch, 5));
  // Every cut, every byte changed, every byte added: refused or read back as the same number
  // of items lying within the payload; nothing is handed on from a refused one.
  std::uint32_t seed = 7;
  for (std::size_t k = 0; k <= batch.size(); ++k) {
    const auto cut = batch.substr(0, k);
    int handed = 0;
    const bool ok = codec::for_each_in_batch(cut, 4, [&](std::string_view) { ++handed; });
    CHECK(ok == (k == batch.size()));
    CHECK(handed == (ok ? 4 : 0));
    if (k < batch.size()) {
      auto changed = batch;
      seed = seed * 1664525U + 1013904223U;
      changed[k] = static_cast<char>(seed >> 24);
      handed = 0;
      std::size_t bytes = 0;
      if (codec::for_each_in_batch(changed, 4, [&](std::string_view i) {
            ++handed;
            bytes += i.size();
          })) {
        CHECK(handed == 4);
        CHECK(bytes + 4 * codec::batch_item_head == changed.size());
      } else {
        CHECK(handed == 0);
      }
    }
  }
  CHECK_FALSE(codec::valid_batch(batch + std::string(1, '\0'), 4));
  CHECK_FALSE(codec::valid_batch(std::string("\xff\xff\xff\xff", 4), 2));  // a length past the end
}
