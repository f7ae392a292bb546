// Conformance, SPEC §2-§5: transport limits, framing, the message bodies and the decoding
// rules, run against the real broker over tcp with a raw DEALER. Each test is named after the
// clause it checks and quotes its key sentences verbatim ("..." marks a cut).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <set>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using codec::error_code;

// ---- §2 Transport -------------------------------------------------------------------------

// §2.4 "The broker SHALL set ZMQ_MAXMSGSIZE on the ROUTER socket to max-message ... A peer
// that sends a larger frame is disconnected by the ZeroMQ transport itself: it gets no ERROR,
// the broker sees no message, and its session (if any) lasts until it expires (§9.5) ...
// WELCOME announces the value (`max_message`)"
TEST_CASE("SPEC 2.4: WELCOME announces max-message and a larger frame never reaches the broker",
          "[spec]") {
  auto cfg = test_config();
  cfg.max_message = 4096;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  event_listener events(ctx, b.get().events_endpoint());
  raw_peer p(ctx, b.get().router_endpoint());
  const auto w = p.introduce("bulky", role::collector, 50);
  CHECK(w.max_message == 4096);
  REQUIRE(events.next("worker.joined", about("bulky")));
  const auto before = b.get().snapshot();
  p.send_frames({header(1, type_heartbeat), std::string(8192, '\x80')});
  const auto lost = events.next("worker.lost", about("bulky"));
  REQUIRE(lost);
  CHECK(std::get<codec::peer_gone>(lost->body).code == code_of(error_code::expired));
  const auto after = b.get().snapshot();
  CHECK(after.messages_in == before.messages_in);
  CHECK(after.faults == before.faults);
  CHECK_FALSE(p.recv(100ms));  // no ERROR (and the DISCONNECT went to the dropped connection)
}

// ---- §3 Framing ---------------------------------------------------------------------------

// §3.1 "After the routing id that the ROUTER socket prepends, a message on the ROUTER endpoint
// SHALL consist of exactly two frames, `[header][body]`, in both directions; a DEALER peer
// MUST NOT add an empty delimiter frame. Any other frame count SHALL be answered with ERROR
// 400 (BAD_FRAME) without `ref_type`; frames beyond the third are read and dropped."
TEST_CASE_METHOD(fixture, "SPEC 3.1: a wrong frame count is answered with ERROR 400", "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames({header(1, 0x03)});
  CHECK_FALSE(expect_error(p, error_code::bad_frame).ref_type);
  p.send_frames({header(1, 0x03), "\x80", "extra"});
  CHECK_FALSE(expect_error(p, error_code::bad_frame).ref_type);
  p.send_frames({"", header(1, type_hello), hello_body("collector", "delimited")});
  next_error(p, error_code::bad_frame, no_ref);
  // Six frames make one message and one answer; the next message is read normally.
  p.send_frames({header(1, type_heartbeat), "\x80", "a", "b", "c", "d"});
  next_error(p, error_code::bad_frame, no_ref);
  p.send(codec::hello{role::collector, "framed", 1000, {}, {}});
  CHECK_FALSE(next_a<codec::welcome>(p).resumed);
}

// §3.2 "The header frame SHALL be exactly 4 bytes ... A header frame of another length, or whose
// first two bytes differ from the signature, SHALL be answered with ERROR 400 (BAD_FRAME)
// without `ref_type`."
TEST_CASE_METHOD(fixture, "SPEC 3.2: a bad header is answered with ERROR 400 without ref_type",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames({"XL\x01\x03", "\x80"});
  CHECK_FALSE(expect_error(p, error_code::bad_frame).ref_type);
  p.send_frames({"RL\x01", "\x80"});
  expect_error(p, error_code::bad_frame);
  p.send_frames({header(1, type_heartbeat) + '\0', "\x80"});
  next_error(p, error_code::bad_frame, no_ref);
  p.send_frames({"", "\x80"});
  next_error(p, error_code::bad_frame, no_ref);
  p.send_frames({"rl\x01\x01", hello_body("collector", "lower")});
  next_error(p, error_code::bad_frame, no_ref);
}

// §3.3 "A header whose version byte is not 1 SHALL be answered with ERROR 405
// (VERSION_MISMATCH) carrying the header's type byte as `ref_type`. The version is checked
// before the type id, so this applies even to unassigned type ids."
TEST_CASE_METHOD(fixture, "SPEC 3.3: another protocol version is answered with ERROR 405",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames(
      {header(2, 0x01), codec::encode_body(codec::hello{role::collector, "c", 1000, {}, {}})});
  const auto e = expect_error(p, error_code::version_mismatch);
  CHECK_THAT(e.reason, Catch::Contains("version 1"));
  CHECK(e.ref_type == ref(type_hello));
  p.send_frames({header(0, type_unassigned), "\x80"});
  next_error(p, error_code::version_mismatch, ref(type_unassigned));
  p.introduce("versioned");
  p.send_frames({header(0xff, type_heartbeat), "\x80"});
  next_error(p, error_code::version_mismatch, ref(type_heartbeat));
}

// §3.4 "The body frame SHALL hold exactly one msgpack map whose keys are strings, none repeated,
// with no bytes after it and no ext values anywhere inside it ... An empty body, a truncated or
// malformed value, trailing bytes, a top-level value that is not a map, a non-string or
// duplicate top-level key, an ext value or an exceeded limit SHALL be answered with ERROR 401
// (BAD_BODY). A message with no fields (HEARTBEAT) still carries a body: the empty map, byte
// `0x80`."
TEST_CASE_METHOD(fixture, "SPEC 3.4: a body that is not one msgpack map is answered with ERROR 401",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames({header(1, 0x01), "\x93\x01\x02\x03"});
  CHECK(expect_error(p, error_code::bad_body).ref_type == std::optional<std::uint8_t>{0x01});
  p.send_frames({header(1, 0x01), "\xdd\x1e\x1e\x1e\x1e\x1e"});
  expect_error(p, error_code::bad_body);
  const auto good = hello_body("collector", "body");
  const std::vector<std::string> bad_bodies{
      "",                                                          // empty
      good.substr(0, good.size() - 1),                             // truncated
      "\xc1",                                                      // malformed (never-used byte)
      good + '\0',                                                 // trailing bytes
      good + good,                                                 // two maps
      "\xc0",                                                      // nil, not a map
      packed([](packer& pk) { pk.pack_map(1).pack(1).pack(1); }),  // non-string key
      hello_body("collector", "body", 1, [](packer& pk) { pk.pack("id").pack("again"); }),
      hello_body("collector", "body", 1,
                 [](packer& pk) { pk.pack("x").pack_ext(1, 1).pack_ext_body("\x01", 1); }),
  };
  for (const auto& body : bad_bodies) {
    p.send_frames({header(1, type_hello), body});
    next_error(p, error_code::bad_body, ref(type_hello));
  }
  p.introduce("body");
  p.send_frames({header(1, type_heartbeat), ""});
  next_error(p, error_code::bad_body, ref(type_heartbeat));
  p.send_frames({header(1, type_heartbeat), "\x80"});
  next_a<codec::heartbeat>(p);
}

// §3.5.1 "A message from a connection that holds a session and carries an unknown type id SHALL
// be answered with ERROR 404 (UNKNOWN_TYPE), `ref_type` = the id, before the body is read."
// §3.5.2 "A message from a session holder of a type that only the broker sends (WELCOME, ERROR,
// EVENT) SHALL be answered with ERROR 404."
// §3.5.3 "A connection without a session is handled by §8.2: an unknown id gets ERROR 404 ..."
TEST_CASE_METHOD(fixture, "SPEC 3.5.1-3.5.3: unknown and broker-only types get ERROR 404",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames({header(1, 0x7e), "\x80"});
  CHECK(expect_error(p, error_code::unknown_type).ref_type == ref(type_unassigned));
  p.introduce("c-1");
  p.send(codec::welcome{1, 1, 1000, 3, 1024, false});
  CHECK(expect_error(p, error_code::unknown_type).ref_type == ref(type_welcome));
  p.send_frames({header(1, 0x60), "\x80"});
  CHECK(expect_error(p, error_code::unknown_type).ref_type == ref(type_event));
  p.send(codec::error{400, "from a peer", {}});
  next_error(p, error_code::unknown_type, ref(type_error));
  p.send_frames({header(1, type_unassigned), "\xc1"});  // the body is never read
  next_error(p, error_code::unknown_type, ref(type_unassigned));
  p.send_frames({header(1, type_event), "\xc1"});
  next_error(p, error_code::unknown_type, ref(type_event));
  p.send(codec::heartbeat{});
  next_a<codec::heartbeat>(p);  // the session goes on
}

// §3.6 "For every inbound message the broker SHALL apply the checks in this order and answer the
// first that fails: frame count (§3.1), header (§3.2), version (§3.3), session state (§8.2),
// type id (§3.5.1; EVENT §3.5.2), body (§3.4, §5.2), fields (§5.3), direction of WELCOME and
// ERROR (§3.5.2), then the rules of the message (§8, §9). Each failure is a fault (§10)."
TEST_CASE("SPEC 3.6: the first failing check, in the spec's order, decides the answer", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 1000;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer stranger(ctx, router), member(ctx, router);
  member.introduce("member");
  std::uint64_t refusals = 0;
  const auto refused = [&](raw_peer& p, error_code code, std::optional<std::uint8_t> ref_type) {
    ++refusals;
    next_error(p, code, ref_type);
  };
  // Frame count before header and version.
  stranger.send_frames({header(2, type_hello)});
  refused(stranger, error_code::bad_frame, no_ref);
  stranger.send_frames({"XX", "\xc1", "x"});
  refused(stranger, error_code::bad_frame, no_ref);
  // Header before version.
  stranger.send_frames({header(2, type_hello) + "x", "\x80"});
  refused(stranger, error_code::bad_frame, no_ref);
  // Version before session state and type id.
  stranger.send_frames({header(2, type_heartbeat), "\xc1"});
  refused(stranger, error_code::version_mismatch, ref(type_heartbeat));
  member.send_frames({header(2, type_unassigned), "\xc1"});
  refused(member, error_code::version_mismatch, ref(type_unassigned));
  // Session state before body.
  stranger.send_frames({header(1, type_heartbeat), "\xc1"});
  refused(stranger, error_code::not_ready, ref(type_heartbeat));
  stranger.send_frames({header(1, type_event), "\xc1"});
  refused(stranger, error_code::not_ready, ref(type_event));
  // Type id before body.
  stranger.send_frames({header(1, type_unassigned), "\xc1"});
  refused(stranger, error_code::unknown_type, ref(type_unassigned));
  member.send_frames({header(1, type_unassigned), "\xc1"});
  refused(member, error_code::unknown_type, ref(type_unassigned));
  member.send_frames({header(1, type_event), "\xc1"});
  refused(member, error_code::unknown_type, ref(type_event));
  // Body before fields.
  stranger.send_frames({header(1, type_hello), packed([](packer& pk) {
                          pk.pack_map(2).pack("role").pack(1).pack("role").pack(2);
                        })});
  refused(stranger, error_code::bad_body, ref(type_hello));
  // Body and fields before the direction of WELCOME and ERROR.
  member.send_frames({header(1, type_welcome), "\xc1"});
  refused(member, error_code::bad_body, ref(type_welcome));
  member.send(codec::welcome{0, 1, 1000, 3, 1024, false});  // session 0 is out of range
  refused(member, error_code::bad_field, ref(type_welcome));
  member.send_frames({header(1, type_error),
                      packed([](packer& pk) { pk.pack_map(1).pack("reason").pack("no code"); })});
  refused(member, error_code::bad_field, ref(type_error));
  member.send(codec::error{401, "well formed", {}});
  refused(member, error_code::unknown_type, ref(type_error));
  // Fields before the rules of the message: an invalid HELLO naming a live id is a 402.
  stranger.send(codec::hello{role::collector, "member", 5, {}, {}});
  refused(stranger, error_code::bad_field, ref(type_hello));
  // Each failure is a fault.
  CHECK(b.get().snapshot().faults == refusals);
  member.send(codec::heartbeat{});
  next_a<codec::heartbeat>(member);
}

// ---- §4 Messages --------------------------------------------------------------------------

// §4.1.1 "`role` is matched case-sensitively; at most 32 bytes are considered before
// matching." (HELLO table: `collector`, `learner` or `coordinator`; otherwise 402, §5.3.)
TEST_CASE_METHOD(fixture, "SPEC 4.1.1: role is one of three names, matched case-sensitively",
                 "[spec]") {
  raw_peer s(ctx, router);
  for (const auto& role_name : std::vector<std::string>{"Collector", "LEARNER", "coordinator ",
                                                        "worker", "", std::string(33, 'c')}) {
    INFO("role '" << role_name << "'");
    s.send_frames({header(1, type_hello), hello_body(role_name, "r")});
    CHECK_THAT(next_error(s, error_code::bad_field, ref(type_hello)).reason,
               Catch::Contains("role"));
  }
  CHECK(broker.get().snapshot().peers == 0);
  int n = 0;
  for (const std::string role_name : {"collector", "learner", "coordinator"}) {
    raw_peer p(ctx, router);
    p.send_frames({header(1, type_hello), hello_body(role_name, "r-" + std::to_string(n++))});
    next_a<codec::welcome>(p);
  }
  CHECK(broker.get().snapshot().peers == 3);
}

// §4.1.2 "Peer id rule: 1 to 128 characters, each one of `A-Z a-z 0-9 . _ : @ / -` ...
// Anything else is refused with 402." A refused HELLO creates nothing (§8.3 rule 1).
TEST_CASE_METHOD(fixture, "SPEC 4.1.2: a HELLO whose id breaks the peer id rule gets ERROR 402",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send(codec::hello{role::collector, "bad id", 1000, {}, {}});
  const auto e = expect_error(p, error_code::bad_field);
  CHECK(e.ref_type == std::optional<std::uint8_t>{0x01});
  CHECK_THAT(e.reason, Catch::Contains("id"));
  CHECK(broker.get().snapshot().peers == 0);
  for (const auto& id :
       {std::string(), std::string(129, 'a'), std::string("caf\xc3\xa9"), std::string("tab\tid"),
        std::string("nul\0id", 6), std::string("star*"), std::string("plus+")}) {
    INFO("id '" << id << "'");
    p.send_frames({header(1, type_hello), hello_body("collector", id)});
    next_error(p, error_code::bad_field, ref(type_hello));
  }
  CHECK(broker.get().snapshot().peers == 0);
  for (const auto& id :
       {std::string(128, 'z'), std::string("ABCxyz0189._:@/-"), std::string("-")}) {
    raw_peer q(ctx, router);
    q.send_frames({header(1, type_hello), hello_body("collector", id)});
    next_a<codec::welcome>(q);
  }
  CHECK(broker.get().snapshot().peers == 3);
}

// §4.1.3 "Values outside 10..600000 are refused with 402. A value inside that range SHALL be
// accepted and clamped by the broker into its configured [heartbeat-min, heartbeat-max] ...;
// the clamped value is the agreed interval, returned in WELCOME."
TEST_CASE("SPEC 4.1.3: the heartbeat interval is clamped to the broker's bounds", "[spec]") {
  auto cfg = test_config();
  cfg.heartbeat_min_ms = 200;
  cfg.heartbeat_max_ms = 400;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  raw_peer fast(ctx, b.get().router_endpoint());
  CHECK(fast.introduce("fast", role::collector, 50).heartbeat_ms == 200);
  raw_peer slow(ctx, b.get().router_endpoint());
  CHECK(slow.introduce("slow", role::collector, 5000).heartbeat_ms == 400);
  raw_peer edges(ctx, b.get().router_endpoint());
  for (const std::uint32_t ms : {0U, 9U, 600'001U, 4'000'000'000U}) {
    INFO(ms << " ms");
    edges.send(codec::hello{role::collector, "edges", ms, {}, {}});
    CHECK_THAT(next_error(edges, error_code::bad_field, ref(type_hello)).reason,
               Catch::Contains("heartbeat_ms"));
  }
  CHECK(edges.introduce("edges", role::collector, 10).heartbeat_ms == 200);
  CHECK(edges.introduce("edges", role::collector, 600'000).heartbeat_ms == 400);
  CHECK(edges.introduce("edges", role::collector, 300).heartbeat_ms == 300);
}

// §4.1.4 "Resources rule: a map of at most 32 entries; each name a unique str of 1 to 64 bytes;
// each value a non-negative finite number, as a msgpack integer or float (32 or 64 bit). Any
// violation ... is refused with 402. ... the broker reads an absent field as the empty map."
TEST_CASE_METHOD(fixture, "SPEC 4.1.4: resources follow the resources rule", "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  const auto with_resources = [](std::string_view id, std::uint32_t n, auto&& entries) {
    return hello_body("learner", id, 1, [&](packer& pk) {
      pk.pack("resources").pack_map(n);
      entries(pk);
    });
  };
  // Integers and floats of both widths; a whole float64 is a value like any other.
  raw_peer p(ctx, router);
  p.send_frames({header(1, type_hello), with_resources("res", 4, [](packer& pk) {
                                          pk.pack("cpu").pack(8);
                                          pk.pack("frac").pack_float(0.5F);
                                          pk.pack("mem").pack_double(1.5);
                                          pk.pack("gpu");
                                        }) + float64(2.0)});
  next_a<codec::welcome>(p);
  const auto joined = events.next("worker.joined", about("res"));
  REQUIRE(joined);
  CHECK(std::get<codec::peer_joined>(joined->body).resources ==
        rlbus::resources{{"cpu", 8}, {"frac", 0.5}, {"gpu", 2}, {"mem", 1.5}});
  // Absent: the empty map.
  raw_peer none(ctx, router);
  none.send_frames({header(1, type_hello), hello_body("learner", "no-res")});
  next_a<codec::welcome>(none);
  const auto bare = events.next("worker.joined", about("no-res"));
  REQUIRE(bare);
  CHECK(std::get<codec::peer_joined>(bare->body).resources.empty());
  // At the limits: 32 entries, 64-byte names.
  raw_peer full(ctx, router);
  full.send_frames({header(1, type_hello), with_resources("res-32", 32, [](packer& pk) {
                      for (int i = 0; i < 32; ++i)
                        pk.pack(std::string(64, static_cast<char>('A' + i))).pack(i);
                    })});
  next_a<codec::welcome>(full);
  // Every violation is a 402.
  raw_peer s(ctx, router);
  const auto one = [&](auto&& value) {
    return with_resources("bad-res", 1, [&](packer& pk) {
      pk.pack("r");
      value(pk);
    });
  };
  const std::vector<std::string> bad{
      with_resources("bad-res", 33,
                     [](packer& pk) {
                       for (int i = 0; i < 33; ++i) pk.pack("r" + std::to_string(i)).pack(1);
                     }),
      with_resources("bad-res", 1, [](packer& pk) { pk.pack(std::string(65, 'n')).pack(1); }),
      with_resources("bad-res", 1, [](packer& pk) { pk.pack("").pack(1); }),
      with_resources("bad-res", 1, [](packer& pk) { pk.pack(7).pack(1); }),
      with_resources("bad-res", 2, [](packer& pk) { pk.pack("r").pack(1).pack("r").pack(2); }),
      one([](packer& pk) { pk.pack(-1); }),
      one([](packer& pk) { pk.pack_double(-0.5); }),
      one([](packer& pk) { pk.pack_double(std::nan("")); }),
      one([](packer& pk) { pk.pack_double(std::numeric_limits<double>::infinity()); }),
      one([](packer& pk) { pk.pack_float(-std::numeric_limits<float>::infinity()); }),
      one([](packer& pk) { pk.pack("1"); }),
      one([](packer& pk) { pk.pack_nil(); }),
      one([](packer& pk) { pk.pack(true); }),
      one([](packer& pk) { pk.pack_array(1).pack(1); }),
      hello_body("learner", "bad-res", 1,
                 [](packer& pk) { pk.pack("resources").pack_array(1).pack(1); }),
      hello_body("learner", "bad-res", 1, [](packer& pk) { pk.pack("resources").pack_nil(); }),
      with_resources("bad-res", 1, [](packer& pk) { pk.pack("r"); }) + float64(-2.0),
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    INFO("case " << i);
    s.send_frames({header(1, type_hello), bad[i]});
    CHECK_THAT(next_error(s, error_code::bad_field, ref(type_hello)).reason,
               Catch::Contains("resources"));
  }
  CHECK(broker.get().snapshot().peers == 3);
}

// §4.1.5 "`session` is present only when the peer resumes a session and holds that session's
// token (§8.6). 0 is not a token and is refused with 402." (§4: "An optional field is
// expressed by leaving it out; msgpack nil in its place is a type error (402).")
TEST_CASE_METHOD(fixture, "SPEC 4.1.5: session 0, nil or not a uint is refused with ERROR 402",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send(codec::hello{role::collector, "zero", 1000, {}, 0});
  CHECK_THAT(next_error(p, error_code::bad_field, ref(type_hello)).reason,
             Catch::Contains("session"));
  const auto with_session = [](auto&& value) {
    return hello_body("collector", "zero", 1, [&](packer& pk) {
      pk.pack("session");
      value(pk);
    });
  };
  for (const auto& body : {with_session([](packer& pk) { pk.pack_nil(); }),
                           with_session([](packer& pk) { pk.pack(-1); }),
                           with_session([](packer& pk) { pk.pack("12345"); }),
                           with_session([](packer&) {}) + float64(12345.0)}) {
    p.send_frames({header(1, type_hello), body});
    CHECK_THAT(next_error(p, error_code::bad_field, ref(type_hello)).reason,
               Catch::Contains("session"));
  }
  CHECK(broker.get().snapshot().peers == 0);
}

// §4.5 "`ref_type` SHALL be present whenever the refused message had a readable header, i.e.
// for every code except 400." §10.1 "The broker SHALL answer every fault with ERROR carrying
// the code, a reason a person can act on, and `ref_type` when the type byte was readable"
TEST_CASE("SPEC 4.5, 10.1: ERROR carries ref_type for every code except 400", "[spec]") {
  auto cfg = test_config();
  cfg.max_peers = 2;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer a(ctx, router), c(ctx, router), s(ctx, router);
  a.introduce("ref-a");
  s.send_frames({header(1, type_hello)});
  next_error(s, error_code::bad_frame, no_ref);
  s.send_frames({"RL", "\x80"});
  next_error(s, error_code::bad_frame, no_ref);
  s.send_frames({header(1, type_hello), "\x80\x80"});
  next_error(s, error_code::bad_body, ref(type_hello));
  s.send(codec::hello{role::collector, "", 1000, {}, {}});
  next_error(s, error_code::bad_field, ref(type_hello));
  s.send(codec::disconnect{200, "not yet"});
  next_error(s, error_code::not_ready, ref(type_disconnect));
  s.send_frames({header(1, 0x00), "\x80"});
  next_error(s, error_code::unknown_type, ref(0x00));
  s.send_frames({header(7, 0xff), "\x80"});
  next_error(s, error_code::version_mismatch, ref(0xff));
  s.send(codec::hello{role::collector, "ref-a", 1000, {}, {}});
  next_error(s, error_code::duplicate_id, ref(type_hello));
  c.introduce("ref-c");
  s.send(codec::hello{role::collector, "ref-s", 1000, {}, {}});
  next_error(s, error_code::busy, ref(type_hello));
  // The same from a session holder.
  a.send_frames({header(1, type_heartbeat), "\x80", "x"});
  next_error(a, error_code::bad_frame, no_ref);
  a.send_frames({header(1, type_disconnect), "\x80"});
  next_error(a, error_code::bad_field, ref(type_disconnect));
  a.send_frames({header(1, 0xff), "\x80"});
  next_error(a, error_code::unknown_type, ref(0xff));
}

// ---- §5 Decoding rules --------------------------------------------------------------------

// §5.1 "Every body SHALL be parsed under these limits, at every nesting level and including
// inside fields the receiver ignores: arrays of at most 1024 elements; maps of at most 256
// entries; str of at most 65536 bytes (64 KiB); bin of at most 1048576 bytes (1 MiB); no ext
// values; nesting depth at most 16. Exceeding any of them is a 401 (BAD_BODY)."
TEST_CASE("SPEC 5.1: decode limits hold everywhere, even in ignored fields", "[spec]") {
  auto cfg = test_config();
  cfg.max_message = std::size_t{4} << 20;  // room for a bin past its own limit
  cfg.max_faults = 1000;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  raw_peer p(ctx, b.get().router_endpoint());
  const auto extra = [](auto&& value) {
    return hello_body("collector", "limits", 1, [&](packer& pk) {
      pk.pack("x");
      value(pk);
    });
  };
  const auto str = [&](std::size_t n) {
    return extra([n](packer& pk) { pk.pack(std::string(n, 's')); });
  };
  const auto bin = [&](std::size_t n) {
    return extra([n](packer& pk) {
      const std::string bytes(n, 'b');
      pk.pack_bin(static_cast<std::uint32_t>(n));
      pk.pack_bin_body(bytes.data(), static_cast<std::uint32_t>(n));
    });
  };
  const auto array = [&](std::uint32_t n) {
    return extra([n](packer& pk) {
      pk.pack_array(n);
      for (std::uint32_t i = 0; i < n; ++i) pk.pack(0);
    });
  };
  const auto map = [&](std::uint32_t n) {
    return extra([n](packer& pk) {
      pk.pack_map(n);
      for (std::uint32_t i = 0; i < n; ++i) pk.pack(std::to_string(i)).pack(0);
    });
  };
  const auto nested = [&](int arrays) {  // depth = 1 (the body) + `arrays`
    return extra([arrays](packer& pk) {
      for (int i = 0; i < arrays; ++i) pk.pack_array(1);
      pk.pack(0);
    });
  };
  const auto top_level = [](std::uint32_t n) {  // a body of n top-level entries
    return hello_body("collector", "limits", n - 3, [n](packer& pk) {
      for (std::uint32_t i = 3; i < n; ++i) pk.pack("k" + std::to_string(i)).pack(i);
    });
  };
  for (const auto& body :
       {str(65536), bin(1048576), array(1024), map(256), nested(15), top_level(256)}) {
    p.send_frames({header(1, type_hello), body});
    next_a<codec::welcome>(p);
  }
  for (const auto& body :
       {str(65537), bin(1048577), array(1025), map(257), nested(16), top_level(257),
        extra([](packer& pk) { pk.pack_ext(0, 1); }),
        extra([](packer& pk) { pk.pack_array(1).pack_ext(4, 9).pack_ext_body("abcd", 4); })}) {
    p.send_frames({header(1, type_hello), body});
    next_error(p, error_code::bad_body, ref(type_hello));
  }
  // A HEARTBEAT, whose fields are all ignored, is decoded under the same limits.
  p.send_frames({header(1, type_heartbeat), packed([](packer& pk) {
                   pk.pack_map(1).pack("x").pack(std::string(65537, 's'));
                 })});
  next_error(p, error_code::bad_body, ref(type_heartbeat));
  p.send_frames({header(1, type_heartbeat), packed([](packer& pk) {
                   pk.pack_map(1).pack("x").pack(std::string(65536, 's'));
                 })});
  next_a<codec::heartbeat>(p);
}

// §5.3 "The fields of a message SHALL be checked in canonical order; the first that is missing,
// of the wrong type or out of range gives 402 (BAD_FIELD), with a reason that names the field.
// Any msgpack integer format (fixint, uint 8-64, int 8-64) holding a non-negative value is a
// valid uint; a float is never a uint, even when whole. Range checks are on the decoded value,
// not on its encoded width."
TEST_CASE_METHOD(fixture, "SPEC 5.3: fields are checked in order, uints in any integer format",
                 "[spec]") {
  raw_peer p(ctx, router);
  const auto hello_fields = [](auto&& role_v, auto&& id_v, auto&& hb_v) {
    return packed([&](packer& pk) {
      pk.pack_map(3);
      pk.pack("role");
      role_v(pk);
      pk.pack("id");
      id_v(pk);
      pk.pack("heartbeat_ms");
      hb_v(pk);
    });
  };
  const auto good_role = [](packer& pk) { pk.pack("collector"); };
  const auto good_id = [](packer& pk) { pk.pack("fields"); };
  const auto bad_hb = [](packer& pk) { pk.pack("1000"); };
  // The first bad field in canonical order is the one named.
  p.send_frames({header(1, type_hello), hello_fields([](packer& pk) { pk.pack(1); },
                                                     [](packer& pk) { pk.pack("a b"); }, bad_hb)});
  auto e = next_error(p, error_code::bad_field, ref(type_hello));
  CHECK_THAT(e.reason, Catch::Contains("role"));
  CHECK_THAT(e.reason, !Catch::Contains("heartbeat_ms"));
  p.send_frames({header(1, type_hello), hello_fields(
                                            good_role, [](packer& pk) { pk.pack_nil(); }, bad_hb)});
  e = next_error(p, error_code::bad_field, ref(type_hello));
  CHECK_THAT(e.reason, Catch::Contains("id"));
  CHECK_THAT(e.reason, !Catch::Contains("heartbeat_ms"));
  p.send_frames({header(1, type_hello), packed([](packer& pk) {
                   pk.pack_map(2).pack("role").pack("collector").pack("id").pack("fields");
                 })});
  CHECK_THAT(next_error(p, error_code::bad_field, ref(type_hello)).reason,
             Catch::Contains("heartbeat_ms"));  // missing
  p.send_frames({header(1, type_hello), hello_body("collector", "fields", 2, [](packer& pk) {
                   pk.pack("resources").pack(1);
                   pk.pack("session").pack(0);
                 })});
  e = next_error(p, error_code::bad_field, ref(type_hello));
  CHECK_THAT(e.reason, Catch::Contains("resources"));
  CHECK_THAT(e.reason, !Catch::Contains("session"));
  // A float is never a uint, even when whole; a negative integer is out of range.
  p.send_frames(
      {header(1, type_hello), hello_fields(good_role, good_id, [](packer&) {}) + float64(1000.0)});
  CHECK_THAT(next_error(p, error_code::bad_field, ref(type_hello)).reason,
             Catch::Contains("heartbeat_ms"));
  p.send_frames({header(1, type_hello),
                 hello_fields(good_role, good_id, [](packer& pk) { pk.pack_fix_int16(-1000); })});
  next_error(p, error_code::bad_field, ref(type_hello));
  // Range checks are on the value, not its width.
  p.send_frames({header(1, type_hello), hello_fields(good_role, good_id, [](packer& pk) {
                   pk.pack_fix_uint64(600'001);
                 })});
  next_error(p, error_code::bad_field, ref(type_hello));
  p.send_frames({header(1, type_hello),
                 hello_fields(good_role, good_id, [](packer& pk) { pk.pack_fix_uint32(9); })});
  next_error(p, error_code::bad_field, ref(type_hello));
  CHECK(broker.get().snapshot().peers == 0);
  // Any integer format holding a non-negative value is a uint.
  const std::vector<std::function<void(packer&)>> formats{
      [](packer& pk) { pk.pack_fix_uint8(100); },  [](packer& pk) { pk.pack_fix_uint16(101); },
      [](packer& pk) { pk.pack_fix_uint32(102); }, [](packer& pk) { pk.pack_fix_uint64(103); },
      [](packer& pk) { pk.pack_fix_int8(104); },   [](packer& pk) { pk.pack_fix_int16(105); },
      [](packer& pk) { pk.pack_fix_int32(106); },  [](packer& pk) { pk.pack_fix_int64(107); },
  };
  for (std::size_t i = 0; i < formats.size(); ++i) {
    p.send_frames({header(1, type_hello), hello_fields(good_role, good_id, formats[i])});
    CHECK(next_a<codec::welcome>(p).heartbeat_ms == 100 + i);
  }
}

// §5.4 "A decoder MUST ignore top-level fields it does not know ... Unknown fields remain
// subject to §3.4 and §5.1." §4.3 (HEARTBEAT) "A decoder MUST accept and ignore any fields in
// it (§5.4)."
TEST_CASE_METHOD(fixture, "SPEC 5.4, 4.3: unknown fields are ignored, within the body rules",
                 "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer p(ctx, router);
  p.send_frames({header(1, type_hello), hello_body("collector", "future", 6, [](packer& pk) {
                   pk.pack("priority").pack(3);
                   pk.pack("labels").pack_map(1).pack("zone").pack("a");
                   pk.pack("tags").pack_array(2).pack("x").pack(1.5);
                   pk.pack("nothing").pack_nil();
                   pk.pack("flag").pack(false);
                   pk.pack("Role").pack("learner");  // keys are case-sensitive
                 })});
  const auto w = next_a<codec::welcome>(p);
  CHECK_FALSE(w.resumed);
  CHECK(w.heartbeat_ms == 1000);
  const auto joined = events.next("worker.joined", about("future"));
  REQUIRE(joined);
  CHECK(std::get<codec::peer_joined>(joined->body).role == role::collector);
  // HEARTBEAT with fields is a HEARTBEAT.
  p.send_frames({header(1, type_heartbeat), packed([](packer& pk) {
                   pk.pack_map(2).pack("load").pack(0.25).pack("seq").pack(9);
                 })});
  next_a<codec::heartbeat>(p);
  // Unknown fields still obey §3.4 and §5.1.
  p.send_frames({header(1, type_heartbeat),
                 packed([](packer& pk) { pk.pack_map(2).pack("x").pack(1).pack("x").pack(2); })});
  next_error(p, error_code::bad_body, ref(type_heartbeat));
  p.send_frames({header(1, type_heartbeat), packed([](packer& pk) {
                   pk.pack_map(1).pack("x").pack_ext(1, 5).pack_ext_body("e", 1);
                 })});
  next_error(p, error_code::bad_body, ref(type_heartbeat));
  // DISCONNECT with an unknown field still ends the session.
  p.send_frames({header(1, type_disconnect), packed([](packer& pk) {
                   pk.pack_map(3).pack("code").pack(200).pack("reason").pack("bye");
                   pk.pack("detail").pack("later");
                 })});
  const auto left = events.next("worker.left", about("future"));
  REQUIRE(left);
  CHECK(std::get<codec::peer_gone>(left->body).reason == "bye");
}

// §5.5 "Encoders SHOULD, and the broker and reference client SHALL, emit the canonical form: a
// map header counting exactly the fields present; fields in the order of the tables in §4 and
// §7; optional fields left out when absent; no unknown fields; integers in the shortest
// unsigned msgpack format that holds the value; strings in the shortest str format; map
// headers in their shortest form; resources as in §4.1.4."
TEST_CASE("SPEC 5.5: everything the broker sends is in the canonical form", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 1;
  auto b = std::make_unique<broker::server_thread>(cfg);
  zmq::context_t ctx;
  const auto router = b->get().router_endpoint();
  raw_events raw(ctx, b->get().events_endpoint());
  REQUIRE(raw.next("broker.heartbeat", ""));
  const std::vector<std::string> welcome_keys{"session",  "epoch",       "heartbeat_ms",
                                              "liveness", "max_message", "resumed"};
  const std::vector<std::string> code_reason{"code", "reason"};
  const auto expect = [](raw_peer& p, std::uint8_t type, const std::vector<std::string>& keys) {
    const auto frames = recv_frames(p);
    REQUIRE(frames.size() == 2);
    CHECK(frames[0] == header(1, type));
    check_canonical(frames[1], keys);
  };
  raw_peer p(ctx, router);
  const rlbus::resources res{{"gpu", 2}, {"mem", 1.5}, {std::string(40, 'n'), 70'000}};
  p.send(codec::hello{role::learner, "canon", 1000, res, {}});
  expect(p, type_welcome, welcome_keys);
  p.send(codec::heartbeat{});
  const auto hb = recv_frames(p);
  CHECK(hb == std::vector<std::string>{header(1, type_heartbeat), "\x80"});
  p.send(codec::hello{role::learner, "canon", 1000, res, {}});
  expect(p, type_welcome, welcome_keys);  // resumed = true
  raw_peer s(ctx, router);
  s.send_frames({header(1, type_heartbeat)});
  expect(s, type_error, code_reason);  // 400: no ref_type
  s.send(codec::heartbeat{});
  expect(s, type_error, {"code", "reason", "ref_type"});
  // Resumption: WELCOME to the new connection, DISCONNECT 430 to the old one.
  raw_peer q(ctx, router);
  p.send(codec::hello{role::learner, "canon", 1000, res, {}});
  const auto w = next_a<codec::welcome>(p);
  q.send(codec::hello{role::learner, "canon", 1000, res, w.session});
  expect(q, type_welcome, welcome_keys);
  expect(p, type_disconnect, code_reason);
  raw_peer faulty(ctx, router), expiring(ctx, router), leaving(ctx, router);
  faulty.introduce("faulty", role::coordinator);
  faulty.send_frames({header(1, type_heartbeat), "\xc1"});
  expect(faulty, type_error, {"code", "reason", "ref_type"});
  expect(faulty, type_disconnect, code_reason);  // 429
  expiring.introduce("expiring", role::collector, 20);
  expect(expiring, type_disconnect, code_reason);  // 410
  leaving.introduce("leaving");
  leaving.send(codec::disconnect{200, "bye"});
  REQUIRE(raw.next("coordinator.lost", "faulty"));
  REQUIRE(raw.next("worker.lost", "expiring"));
  REQUIRE(raw.next("worker.left", "leaving"));
  b->stop();
  expect(q, type_disconnect, code_reason);  // 503
  REQUIRE(raw.next("broker.stopping", ""));
  const std::vector<std::string> envelope{"seq", "epoch", "ts_ms"};
  const auto with = [&](std::vector<std::string> fields) {
    fields.insert(fields.begin(), envelope.begin(), envelope.end());
    return fields;
  };
  std::set<std::string> topics;
  for (const auto& item : raw.seen()) {
    INFO(item.topic);
    topics.insert(item.topic);
    if (item.topic.find(".joined") != std::string::npos) {
      check_canonical(item.body, with({"id", "role", "serial", "resources", "resumed"}));
    } else if (item.topic.find(".left") != std::string::npos ||
               item.topic.find(".lost") != std::string::npos) {
      check_canonical(item.body, with({"id", "role", "serial", "code", "reason"}));
    } else if (item.topic == "broker.heartbeat") {
      check_canonical(item.body, with({"peers", "uptime_ms"}));
    } else if (item.topic.rfind("capacity.", 0) == 0) {
      check_canonical(item.body, with({"kind", "change", "worker_id", "count"}));
    } else {
      CHECK(item.topic == "broker.stopping");
      check_canonical(item.body, with({"drain_ms"}));
    }
  }
  CHECK(topics.size() == 9);  // every topic of §7.4 but coordinator.left and task.*
}
