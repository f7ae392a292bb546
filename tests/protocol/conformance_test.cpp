// Conformance: one test per MUST/SHALL clause of protocol/SPEC.md, run against the real
// broker over tcp with a raw DEALER. Each test quotes the clause it checks.
#include <catch2/catch.hpp>

#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;
using codec::error_code;

namespace {

constexpr auto code_of(error_code c) {
  return static_cast<std::uint16_t>(c);
}

std::string header(std::uint8_t version, std::uint8_t type) {
  return {'R', 'L', static_cast<char>(version), static_cast<char>(type)};
}

codec::error expect_error(raw_peer& p, error_code code) {
  auto e = p.recv_a<codec::error>();
  REQUIRE(e);
  INFO(e->reason);
  CHECK(e->code == code_of(code));
  CHECK_FALSE(e->reason.empty());
  return *e;
}

struct fixture {
  broker::server_thread broker{test_config()};
  zmq::context_t ctx;
  std::string router = broker.get().router_endpoint();
};

}  // namespace

// §3.1 "A message on the ROUTER MUST consist of exactly two frames after the routing id:
// the header and the body. The broker MUST answer any other frame count with ERROR 400."
TEST_CASE_METHOD(fixture, "SPEC 3.1: a wrong frame count is answered with ERROR 400", "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames({header(1, 0x03)});
  expect_error(p, error_code::bad_frame);
  p.send_frames({header(1, 0x03), "\x80", "extra"});
  expect_error(p, error_code::bad_frame);
}

// §3.2 "The header frame MUST be exactly 4 bytes: 0x52 0x4C, the version, the type id.
// A header of another size or signature MUST be answered with ERROR 400."
TEST_CASE_METHOD(fixture, "SPEC 3.2: a bad header is answered with ERROR 400 without ref_type",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames({"XL\x01\x03", "\x80"});
  CHECK_FALSE(expect_error(p, error_code::bad_frame).ref_type);
  p.send_frames({"RL\x01", "\x80"});
  expect_error(p, error_code::bad_frame);
}

// §3.3 "A message whose version is not 1 MUST be answered with ERROR 405."
TEST_CASE_METHOD(fixture, "SPEC 3.3: another protocol version is answered with ERROR 405",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames(
      {header(2, 0x01), codec::encode_body(codec::hello{role::collector, "c", 1000, {}, {}})});
  const auto e = expect_error(p, error_code::version_mismatch);
  CHECK_THAT(e.reason, Catch::Contains("version 1"));
}

// §3.4 "The body MUST be exactly one msgpack map with string keys ... otherwise ERROR 401."
TEST_CASE_METHOD(fixture, "SPEC 3.4: a body that is not one msgpack map is answered with ERROR 401",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames({header(1, 0x01), "\x93\x01\x02\x03"});
  CHECK(expect_error(p, error_code::bad_body).ref_type == std::optional<std::uint8_t>{0x01});
  p.send_frames({header(1, 0x01), "\xdd\x1e\x1e\x1e\x1e\x1e"});
  expect_error(p, error_code::bad_body);
}

// §3.5 "An unassigned type id, or a type only the broker sends, MUST be answered with
// ERROR 404."
TEST_CASE_METHOD(fixture, "SPEC 3.5: unknown and broker-only types are answered with ERROR 404",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send_frames({header(1, 0x7e), "\x80"});
  expect_error(p, error_code::unknown_type);
  p.introduce("c-1");
  p.send(codec::welcome{1, 1, 1000, 3, 1024, false});
  expect_error(p, error_code::unknown_type);
  p.send_frames({header(1, 0x60), "\x80"});
  expect_error(p, error_code::unknown_type);
}

// §4.1 "Fields MUST be valid ... otherwise ERROR 402." A refused HELLO creates nothing.
TEST_CASE_METHOD(fixture, "SPEC 4.1: a HELLO with a bad field is refused with ERROR 402",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send(codec::hello{role::collector, "bad id", 1000, {}, {}});
  const auto e = expect_error(p, error_code::bad_field);
  CHECK(e.ref_type == std::optional<std::uint8_t>{0x01});
  CHECK_THAT(e.reason, Catch::Contains("id"));
  CHECK(broker.get().snapshot().peers == 0);
}

// §8 "Before WELCOME a peer MUST NOT send anything but HELLO; the broker answers ERROR 403
// and keeps no state for the connection."
TEST_CASE_METHOD(fixture, "SPEC 8: messages before HELLO get ERROR 403 and leave no state",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send(codec::heartbeat{});
  const auto e = expect_error(p, error_code::not_ready);
  CHECK(e.ref_type == std::optional<std::uint8_t>{0x03});
  CHECK(broker.get().snapshot().peers == 0);
}

// §8 "HELLO with a valid body MUST be answered with WELCOME carrying a non-zero session
// token, the broker's epoch, the agreed heartbeat interval and the liveness factor."
TEST_CASE_METHOD(fixture, "SPEC 8: HELLO is answered with WELCOME and agreed timings", "[spec]") {
  raw_peer p(ctx, router);
  p.send(codec::hello{role::learner, "learner-0", 5, {{"gpu", 1}}, {}});  // wire-valid? no: 5 < 10
  expect_error(p, error_code::bad_field);
  p.send(codec::hello{role::learner, "learner-0", 10, {{"gpu", 1}}, {}});
  auto w = p.recv_a<codec::welcome>();
  REQUIRE(w);
  CHECK(w->session != 0);
  CHECK(w->epoch == broker.get().epoch());
  CHECK(w->heartbeat_ms == 10);  // within the test broker's [10, 60000]
  CHECK(w->liveness == 3);
  CHECK_FALSE(w->resumed);
  CHECK(broker.get().snapshot().peers == 1);
}

// §8 "The broker MUST clamp the requested interval into its configured bounds."
TEST_CASE("SPEC 8: the heartbeat interval is clamped to the broker's bounds", "[spec]") {
  auto cfg = test_config();
  cfg.heartbeat_min_ms = 200;
  cfg.heartbeat_max_ms = 400;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  raw_peer fast(ctx, b.get().router_endpoint());
  CHECK(fast.introduce("fast", role::collector, 50).heartbeat_ms == 200);
  raw_peer slow(ctx, b.get().router_endpoint());
  CHECK(slow.introduce("slow", role::collector, 5000).heartbeat_ms == 400);
}

// §8 "A repeated HELLO on the same connection with the same id and role MUST be answered
// with WELCOME for the same session, resumed = true."
TEST_CASE_METHOD(fixture, "SPEC 8: a repeated HELLO gets the same session back", "[spec]") {
  raw_peer p(ctx, router);
  const auto first = p.introduce("c-2");
  const auto again = p.introduce("c-2");
  CHECK(again.session == first.session);
  CHECK(again.resumed);
  p.send(codec::hello{role::collector, "other-id", 1000, {}, {}});
  expect_error(p, error_code::bad_field);
}

// §8 "A HELLO from another connection naming a live id MUST be refused with ERROR 409,
// unless it carries that session's token and the same role."
TEST_CASE_METHOD(fixture, "SPEC 8: a duplicate live id is refused with ERROR 409", "[spec]") {
  raw_peer first(ctx, router);
  const auto w = first.introduce("dup");
  raw_peer second(ctx, router);
  second.send(codec::hello{role::collector, "dup", 1000, {}, {}});
  CHECK_THAT(expect_error(second, error_code::duplicate_id).reason, Catch::Contains("dup"));
  second.send(codec::hello{role::collector, "dup", 1000, {}, w.session + 1});  // wrong token
  expect_error(second, error_code::duplicate_id);
  second.send(codec::hello{role::learner, "dup", 1000, {}, w.session});  // wrong role
  expect_error(second, error_code::duplicate_id);
  CHECK(broker.get().snapshot().refused_hellos == 3);
}

// §8 "... the session moves to the new connection; the old connection MUST get
// DISCONNECT 430 and a *.joined event with resumed = true is published."
TEST_CASE_METHOD(fixture, "SPEC 8: a HELLO with the session token resumes the session", "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer first(ctx, router);
  const auto w = first.introduce("mover");
  raw_peer second(ctx, router);
  second.send(codec::hello{role::collector, "mover", 1000, {}, w.session});
  const auto w2 = second.recv_a<codec::welcome>();
  REQUIRE(w2);
  CHECK(w2->session == w.session);
  CHECK(w2->resumed);
  const auto d = first.recv_a<codec::disconnect>();
  REQUIRE(d);
  CHECK(d->code == code_of(error_code::replaced));
  const auto e = events.next("worker.joined", [](const codec::event& ev) {
    return std::get<codec::peer_joined>(ev.body).resumed;
  });
  REQUIRE(e);
  CHECK(event_peer_id(*e) == "mover");
  // The session now answers on the new connection only.
  second.send(codec::heartbeat{});
  CHECK(second.recv_a<codec::heartbeat>());
  CHECK(broker.get().snapshot().peers == 1);
}

// §8 "When the broker holds max-peers sessions, HELLO MUST be refused with ERROR 503."
TEST_CASE("SPEC 8: HELLO past max peers is refused with ERROR 503", "[spec]") {
  auto cfg = test_config();
  cfg.max_peers = 2;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  raw_peer a(ctx, b.get().router_endpoint()), c(ctx, b.get().router_endpoint()),
      d(ctx, b.get().router_endpoint());
  a.introduce("a");
  c.introduce("c");
  d.send(codec::hello{role::collector, "d", 1000, {}, {}});
  expect_error(d, error_code::busy);
}

// §9 "The broker MUST answer every HEARTBEAT from a peer with a session with a HEARTBEAT."
TEST_CASE_METHOD(fixture, "SPEC 9: HEARTBEAT is answered with HEARTBEAT", "[spec]") {
  raw_peer p(ctx, router);
  p.introduce("hb");
  for (int i = 0; i < 3; ++i) {
    p.send(codec::heartbeat{});
    auto m = p.recv();
    REQUIRE(m);
    CHECK(std::holds_alternative<codec::heartbeat>(*m));
  }
}

// §9 "A peer silent for liveness x heartbeat_ms MUST be expired: the broker sends
// DISCONNECT 410 and publishes *.lost." (No earlier than the window; promptly after.)
TEST_CASE_METHOD(fixture, "SPEC 9: a silent peer is expired with DISCONNECT 410 and worker.lost",
                 "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer p(ctx, router);
  p.introduce("quiet", role::collector, 40);  // window 120 ms
  const auto joined = events.next("worker.joined");
  REQUIRE(joined);
  const auto t0 = std::chrono::steady_clock::now();
  const auto d = p.recv_a<codec::disconnect>(5000ms);
  const auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE(d);
  CHECK(d->code == code_of(error_code::expired));
  CHECK(waited >= 115ms);  // not before its window (less a little for the clock's grain)
  const auto e = events.next("worker.lost",
                             [](const codec::event& ev) { return event_peer_id(ev) == "quiet"; });
  REQUIRE(e);
  const auto& gone = std::get<codec::peer_gone>(e->body);
  CHECK(gone.code == code_of(error_code::expired));
  CHECK(gone.serial == std::get<codec::peer_joined>(joined->body).serial);
  CHECK(broker.get().snapshot().peers == 0);
  CHECK(broker.get().snapshot().expired == 1);
}

// §9 "Any message from a peer counts as a sign of life."
TEST_CASE_METHOD(fixture, "SPEC 9: a peer that keeps talking is never expired", "[spec]") {
  raw_peer p(ctx, router);
  p.introduce("chatty", role::collector, 30);  // window 90 ms
  const auto until = std::chrono::steady_clock::now() + 600ms;
  while (std::chrono::steady_clock::now() < until) {
    p.send(codec::heartbeat{});
    auto m = p.recv(1000ms);
    REQUIRE(m);
    REQUIRE(std::holds_alternative<codec::heartbeat>(*m));
    std::this_thread::sleep_for(20ms);  // pacing the sender, not waiting for an outcome
  }
  CHECK(broker.get().snapshot().expired == 0);
  CHECK(broker.get().snapshot().peers == 1);
}

// §10 "A peer with a session that sends max-faults bad messages MUST be disconnected with
// DISCONNECT 429 and a *.lost event."
TEST_CASE("SPEC 10: too many faults end the session with DISCONNECT 429", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 3;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  event_listener events(ctx, b.get().events_endpoint());
  raw_peer p(ctx, b.get().router_endpoint());
  p.introduce("noisy");
  for (int i = 0; i < 3; ++i) p.send_frames({header(1, 0x03), "garbage"});
  const auto d = p.recv_a<codec::disconnect>();
  REQUIRE(d);
  CHECK(d->code == code_of(error_code::too_many_faults));
  const auto e = events.next("worker.lost",
                             [](const codec::event& ev) { return event_peer_id(ev) == "noisy"; });
  REQUIRE(e);
  CHECK(std::get<codec::peer_gone>(e->body).code == code_of(error_code::too_many_faults));
  CHECK(b.get().snapshot().peers == 0);
  CHECK(b.get().snapshot().faults == 3);
}

// §4.4 "A peer leaving MUST send DISCONNECT; the broker ends the session and publishes *.left."
TEST_CASE_METHOD(fixture, "SPEC 4.4: DISCONNECT ends the session with worker.left", "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer p(ctx, router);
  p.introduce("leaver", role::learner);
  p.send(codec::disconnect{200, "done"});
  const auto e = events.next("worker.left",
                             [](const codec::event& ev) { return event_peer_id(ev) == "leaver"; });
  REQUIRE(e);
  CHECK(std::get<codec::peer_gone>(e->body).reason == "done");
  CHECK(wait_until([&] { return broker.get().snapshot().peers == 0; }));
  p.send(codec::heartbeat{});
  expect_error(p, error_code::not_ready);  // the session is gone
}

// §7 "seq starts at 1 and increases by exactly one per event across all topics."
TEST_CASE_METHOD(fixture, "SPEC 7: event sequence numbers increase by one", "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer a(ctx, router), c(ctx, router);
  a.introduce("seq-a");
  c.introduce("seq-c", role::coordinator);
  REQUIRE(events.next("coordinator.joined"));
  const auto& seen = events.seen();
  for (std::size_t i = 1; i < seen.size(); ++i) CHECK(seen[i].seq == seen[i - 1].seq + 1);
  for (const auto& e : seen) CHECK(e.epoch == broker.get().epoch());
}

// §11 "On shutdown the broker MUST publish broker.stopping and send DISCONNECT 503 to
// every peer."
TEST_CASE("SPEC 11: shutdown says DISCONNECT 503 to every peer", "[spec]") {
  auto b = std::make_unique<broker::server_thread>(test_config());
  zmq::context_t ctx;
  event_listener events(ctx, b->get().events_endpoint());
  raw_peer p1(ctx, b->get().router_endpoint()), p2(ctx, b->get().router_endpoint());
  p1.introduce("s1");
  p2.introduce("s2", role::coordinator);
  b->stop();
  for (auto* p : {&p1, &p2}) {
    const auto d = p->recv_a<codec::disconnect>();
    REQUIRE(d);
    CHECK(d->code == code_of(error_code::busy));
  }
  CHECK(events.next("broker.stopping"));
}
