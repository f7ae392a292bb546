// Conformance, SPEC §6-§8: events and the session state machine (§6's error codes are checked
// where each is raised), run against the real broker over tcp with a raw DEALER. Each test is
// named after the clause it checks and quotes its key sentences verbatim ("..." marks a cut).
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <set>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using codec::error_code;

// ---- §7 Events ----------------------------------------------------------------------------

// §7.1 "Every event on the PUB endpoint SHALL be three frames: `[topic][header][body]`." §7.2
// "Every event body SHALL begin with these fields ... `seq` ... `epoch` ... the broker's epoch
// ... `ts_ms` ... wall-clock time of publication, ms since the Unix epoch"
TEST_CASE_METHOD(fixture, "SPEC 7.1, 7.2: every event has the envelope and the broker's epoch",
                 "[spec]") {
  const auto wall_ms = [] {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count());
  };
  const auto before = wall_ms();
  raw_events raw(ctx, broker.get().events_endpoint());
  REQUIRE(raw.next("broker.heartbeat", ""));
  raw_peer p(ctx, router);
  const auto w = p.introduce("envelope", role::coordinator);
  p.send(codec::disconnect{200, "done"});
  REQUIRE(raw.next("coordinator.left", "envelope"));
  const auto after = wall_ms();
  REQUIRE(raw.seen().size() >= 3);
  for (const auto& item : raw.seen()) {
    INFO(item.topic);
    CHECK(item.event.epoch == broker.get().epoch());
    CHECK(item.event.epoch == w.epoch);
    CHECK(item.event.seq >= 1);
    CHECK(item.event.ts_ms + 1000 >= before);  // 1 s of slack for a stepped wall clock
    CHECK(item.event.ts_ms <= after + 1000);
    // The envelope comes first, in order: seq, epoch, ts_ms.
    const auto oh = msgpack::unpack(item.body.data(), item.body.size());
    const auto& m = oh.get();
    REQUIRE(m.type == msgpack::type::MAP);
    REQUIRE(m.via.map.size >= 3);
    CHECK(m.via.map.ptr[0].key.as<std::string>() == "seq");
    CHECK(m.via.map.ptr[1].key.as<std::string>() == "epoch");
    CHECK(m.via.map.ptr[2].key.as<std::string>() == "ts_ms");
  }
}

// §7.3 "`seq` SHALL be 1 for the first event a broker process publishes and SHALL grow by
// exactly one per event across all topics."
TEST_CASE_METHOD(fixture, "SPEC 7.3: event sequence numbers increase by one", "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer a(ctx, router), c(ctx, router);
  a.introduce("seq-a");
  c.introduce("seq-c", role::coordinator);
  REQUIRE(events.next("coordinator.joined"));
  const auto& seen = events.seen();
  for (std::size_t i = 1; i < seen.size(); ++i) CHECK(seen[i].seq == seen[i - 1].seq + 1);
  for (const auto& e : seen) CHECK(e.epoch == broker.get().epoch());
  std::set<std::string> topics;
  for (const auto& e : seen) topics.insert(e.topic);
  CHECK(topics.size() >= 3);  // broker.heartbeat, worker.joined, coordinator.joined
}

// §7.3 "`seq` SHALL be 1 for the first event a broker process publishes" (with §7.4: the first
// is `broker.heartbeat`, "when the broker starts").
TEST_CASE("SPEC 7.3: seq counts every event from 1, the start-up heartbeat", "[spec]") {
  auto cfg = test_config();
  cfg.status_interval_ms = 600'000;  // only the start-up broker.heartbeat, then our events
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  REQUIRE(wait_until([&] { return b.get().snapshot().events == 1; }));
  raw_events raw(ctx, b.get().events_endpoint());
  std::vector<std::unique_ptr<raw_peer>> probes;
  std::optional<codec::event> first;
  // Until the subscription is live, joined events go unseen: keep adding peers until one shows.
  // Coordinators, whose joining is one event (a worker's is two: joined and capacity, §12.10).
  for (int i = 0; !first && i < 50; ++i) {
    probes.push_back(std::make_unique<raw_peer>(ctx, b.get().router_endpoint()));
    probes.back()->introduce("probe-" + std::to_string(i), role::coordinator);
    first = raw.next(200ms);
  }
  REQUIRE(first);
  REQUIRE(first->topic == "coordinator.joined");
  const auto id = event_peer_id(*first);
  REQUIRE(id.rfind("probe-", 0) == 0);
  const auto index = std::stoull(id.substr(6));
  CHECK(first->seq == index + 2);  // seq 1 was the start-up heartbeat
  for (auto next = raw.next(200ms); next; next = raw.next(200ms)) {
    CHECK(next->seq == std::stoull(event_peer_id(*next).substr(6)) + 2);
  }
  CHECK(wait_until([&] { return b.get().snapshot().events == probes.size() + 1; }));
}

// §7.4 "Workers (collector, learner) use the `worker.` prefix, coordinators the `coordinator.`
// prefix." (table: `*.joined` when "a session begins", `*.left` when "the peer sent
// DISCONNECT", `*.lost` when "the broker ended the session: expiry (410) or faults (429)",
// `broker.heartbeat` "when the broker starts, then every status interval") §7.5 bodies.
TEST_CASE_METHOD(fixture, "SPEC 7.4, 7.5: topics follow the role and bodies carry the session",
                 "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer l(ctx, router), col(ctx, router), c1(ctx, router), c2(ctx, router);
  l.send(codec::hello{role::learner, "lrn", 30'000, {{"gpu", 2}, {"mem", 1.5}}, {}});
  next_a<codec::welcome>(l);
  const auto lj = events.next("worker.joined", about("lrn"));
  REQUIRE(lj);
  const auto& lb = std::get<codec::peer_joined>(lj->body);
  CHECK(lb.role == role::learner);
  CHECK(lb.serial == 1);
  CHECK(lb.resources == rlbus::resources{{"gpu", 2}, {"mem", 1.5}});
  CHECK_FALSE(lb.resumed);
  col.introduce("col", role::collector, 30'000);
  const auto colj = events.next("worker.joined", about("col"));
  REQUIRE(colj);
  CHECK(std::get<codec::peer_joined>(colj->body).role == role::collector);
  c1.introduce("crd", role::coordinator, 30'000);
  const auto cj = events.next("coordinator.joined", about("crd"));
  REQUIRE(cj);
  CHECK(std::get<codec::peer_joined>(cj->body).role == role::coordinator);
  CHECK(std::get<codec::peer_joined>(cj->body).serial == 3);
  CHECK(std::get<codec::peer_joined>(cj->body).resources.empty());
  // broker.heartbeat: `peers` counts live sessions.
  const auto status = events.next("broker.heartbeat", [](const codec::event& e) {
    return std::get<codec::broker_status>(e.body).peers == 3;
  });
  REQUIRE(status);
  c1.send(codec::disconnect{7, "bye"});
  const auto cl = events.next("coordinator.left", about("crd"));
  REQUIRE(cl);
  const auto& clb = std::get<codec::peer_gone>(cl->body);
  CHECK(clb.role == role::coordinator);
  CHECK(clb.serial == 3);
  CHECK(clb.code == 7);
  CHECK(clb.reason == "bye");
  c2.introduce("crd-2", role::coordinator, 20);
  const auto clost = events.next("coordinator.lost", about("crd-2"));
  REQUIRE(clost);
  CHECK(std::get<codec::peer_gone>(clost->body).code == code_of(error_code::expired));
  CHECK(std::get<codec::peer_gone>(clost->body).serial == 4);
  l.send(codec::disconnect{200, "done"});
  const auto ll = events.next("worker.left", about("lrn"));
  REQUIRE(ll);
  CHECK(std::get<codec::peer_gone>(ll->body).role == role::learner);
  CHECK(std::get<codec::peer_gone>(ll->body).serial == 1);
  std::uint64_t last_uptime = 0;
  for (const auto& e : events.seen()) {
    INFO(e.topic << " " << event_peer_id(e));
    const auto id = event_peer_id(e);
    if (id.rfind("crd", 0) == 0) CHECK(e.topic.rfind("coordinator.", 0) == 0);
    if (id == "lrn" || id == "col") CHECK(e.topic.rfind("worker.", 0) == 0);
    if (const auto* s = std::get_if<codec::broker_status>(&e.body)) {
      CHECK(s->uptime_ms >= last_uptime);
      last_uptime = s->uptime_ms;
    }
  }
}

// ---- §8 Sessions --------------------------------------------------------------------------

// §8.2 "A connection without a session MAY only send HELLO. Any other assigned type SHALL be
// answered with ERROR 403 (NOT_READY) and an unassigned or reserved id with ERROR 404, both
// with `ref_type`. The broker SHALL keep no state for such connections"
TEST_CASE_METHOD(fixture, "SPEC 8.2: messages before HELLO get ERROR 403 and leave no state",
                 "[spec]") {
  raw_peer p(ctx, router);
  p.send(codec::heartbeat{});
  const auto e = expect_error(p, error_code::not_ready);
  CHECK(e.ref_type == std::optional<std::uint8_t>{0x03});
  CHECK(broker.get().snapshot().peers == 0);
  p.send(codec::disconnect{200, "never met"});
  next_error(p, error_code::not_ready, ref(type_disconnect));
  p.send(codec::welcome{1, 1, 1000, 3, 1024, false});
  next_error(p, error_code::not_ready, ref(type_welcome));
  p.send(codec::error{400, "x", {}});
  next_error(p, error_code::not_ready, ref(type_error));
  p.send_frames({header(1, type_event), "\x80"});
  next_error(p, error_code::not_ready, ref(type_event));
  p.send_frames({header(1, 0x17), "\x80"});  // unassigned within the task range
  next_error(p, error_code::unknown_type, ref(0x17));
  p.send_frames({header(1, type_unassigned), "\x80"});
  next_error(p, error_code::unknown_type, ref(type_unassigned));
  CHECK(broker.get().snapshot().peers == 0);
  CHECK(broker.get().snapshot().faults == 7);
  CHECK_FALSE(p.introduce("late").resumed);
}

// §8.3 "5. The broker holds max-peers sessions: ERROR 503 (BUSY). ... Refusals of rules 2, 4
// and 5 carry `ref_type` = 1 (HELLO)."
TEST_CASE("SPEC 8.3: HELLO past max peers is refused with ERROR 503", "[spec]") {
  auto cfg = test_config();
  cfg.max_peers = 2;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  raw_peer a(ctx, b.get().router_endpoint()), c(ctx, b.get().router_endpoint()),
      d(ctx, b.get().router_endpoint());
  a.introduce("a");
  c.introduce("c");
  d.send(codec::hello{role::collector, "d", 1000, {}, {}});
  CHECK(expect_error(d, error_code::busy).ref_type == ref(type_hello));
  CHECK(b.get().snapshot().peers == 2);
}

// §8.3 "HELLO is processed in this order; the first rule that applies decides: 1. Body and
// fields invalid: ERROR 401 or 402 (§5). ... 3. The connection already holds a session: §8.5.
// 4. A live session on another connection holds the id: §8.6. 5. The broker holds max-peers
// sessions: ERROR 503 (BUSY). ... Refusals of rules 2, 4 and 5 carry `ref_type` = 1 (HELLO)."
TEST_CASE("SPEC 8.3: the HELLO rules apply in their order", "[spec]") {
  auto cfg = test_config();
  cfg.max_peers = 2;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer a(ctx, router), c(ctx, router), n(ctx, router), m(ctx, router);
  const auto wa = a.introduce("full-a");
  c.introduce("full-c");  // the broker is now full
  // Rule 1 before rule 4: an invalid HELLO naming a live id is a field error.
  n.send(codec::hello{role::collector, "full-a", 5, {}, {}});
  next_error(n, error_code::bad_field, ref(type_hello));
  // Rule 4 before rule 5: a live id without its token is a duplicate, not busy ...
  n.send(codec::hello{role::collector, "full-a", 1000, {}, {}});
  next_error(n, error_code::duplicate_id, ref(type_hello));
  // ... and with its token the session is resumed although the broker is full.
  n.send(codec::hello{role::collector, "full-a", 1000, {}, wa.session});
  CHECK(next_a<codec::welcome>(n).resumed);
  // Rule 5 for a new id.
  m.send(codec::hello{role::collector, "full-m", 1000, {}, {}});
  next_error(m, error_code::busy, ref(type_hello));
  // Rule 3 before rule 4: from a connection with a session, another live id is a 402 (§8.5).
  c.send(codec::hello{role::collector, "full-a", 1000, {}, wa.session});
  next_error(c, error_code::bad_field, ref(type_hello));
  c.send(codec::heartbeat{});
  next_a<codec::heartbeat>(c);
  CHECK(b.get().snapshot().peers == 2);
}

// §8.4 "The broker SHALL create a session with a fresh token, the agreed heartbeat (§4.1.3) and
// the announced resources, send WELCOME with `resumed` = false and publish `worker.joined` or
// `coordinator.joined` with `resumed` = false." (§4.2 WELCOME fields.)
TEST_CASE_METHOD(fixture, "SPEC 8.4: HELLO is answered with WELCOME and agreed timings", "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
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
  CHECK(w->max_message == 1024 * 1024);
  CHECK_FALSE(w->resumed);
  CHECK(broker.get().snapshot().peers == 1);
  const auto joined = events.next("worker.joined", about("learner-0"));
  REQUIRE(joined);
  CHECK_FALSE(std::get<codec::peer_joined>(joined->body).resumed);
  CHECK(std::get<codec::peer_joined>(joined->body).resources == rlbus::resources{{"gpu", 1}});
}

// §8.4 "A `session` field naming no live session (for example a token from an earlier epoch or
// an expired session) is ignored: the peer gets a new session and a new token." §9.5 "...
// and forgets the session and its token."
TEST_CASE_METHOD(fixture, "SPEC 8.4: a token naming no live session gets a new session", "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  // An expired session's token.
  raw_peer first(ctx, router);
  const auto w1 = first.introduce("again", role::collector, 20);
  REQUIRE(events.next("worker.lost", about("again")));
  raw_peer second(ctx, router);
  second.send(codec::hello{role::collector, "again", 1000, {}, w1.session});
  const auto w2 = next_a<codec::welcome>(second);
  CHECK_FALSE(w2.resumed);
  CHECK(w2.session != w1.session);
  const auto joined = events.next("worker.joined", [](const codec::event& e) {
    return event_peer_id(e) == "again" && std::get<codec::peer_joined>(e.body).serial == 2;
  });
  REQUIRE(joined);
  CHECK_FALSE(std::get<codec::peer_joined>(joined->body).resumed);
  // A left session's token.
  second.send(codec::disconnect{200, "bye"});
  REQUIRE(events.next("worker.left", about("again")));
  raw_peer third(ctx, router);
  third.send(codec::hello{role::collector, "again", 1000, {}, w2.session});
  const auto w3 = next_a<codec::welcome>(third);
  CHECK_FALSE(w3.resumed);
  CHECK(w3.session != w2.session);
  // A token from another broker (another epoch), and one nobody was ever given.
  rlbus::broker::server_thread other(test_config());
  raw_peer there(ctx, other.get().router_endpoint());
  const auto w_other = there.introduce("elsewhere");
  CHECK(w_other.epoch != broker.get().epoch());
  raw_peer fourth(ctx, router);
  fourth.send(codec::hello{role::learner, "elsewhere", 1000, {}, w_other.session});
  const auto w4 = next_a<codec::welcome>(fourth);
  CHECK_FALSE(w4.resumed);
  CHECK(w4.session != w_other.session);
  raw_peer fifth(ctx, router);
  fifth.send(codec::hello{role::learner, "made-up", 1000, {}, 0x0123456789abcdefULL});
  CHECK_FALSE(next_a<codec::welcome>(fifth).resumed);
  CHECK(broker.get().snapshot().peers == 3);
}

// §8.5 "A HELLO on a connection that already holds a session, with the same `id` and `role`,
// SHALL be answered with WELCOME again, `resumed` = true, carrying the existing token. ... A
// different `id` or `role` is a fault answered with ERROR 402; the session continues
// unchanged."
TEST_CASE_METHOD(fixture, "SPEC 8.5: a repeated HELLO gets the same session back", "[spec]") {
  raw_peer p(ctx, router);
  const auto first = p.introduce("c-2");
  const auto again = p.introduce("c-2");
  CHECK(again.session == first.session);
  CHECK(again.resumed);
  p.send(codec::hello{role::collector, "other-id", 1000, {}, {}});
  CHECK(expect_error(p, error_code::bad_field).ref_type == ref(type_hello));
  p.send(codec::hello{role::learner, "c-2", 1000, {}, first.session});
  next_error(p, error_code::bad_field, ref(type_hello));
  p.send(codec::heartbeat{});
  next_a<codec::heartbeat>(p);
  CHECK(p.introduce("c-2").session == first.session);
  CHECK(broker.get().snapshot().peers == 1);
}

// §8.5 "The HELLO re-agrees the heartbeat interval (the WELCOME carries the new one), replaces
// the resources and counts as a sign of life; its `session` field is ignored and nothing is
// published."
TEST_CASE_METHOD(fixture, "SPEC 8.5: a repeated HELLO re-agrees the heartbeat, publishes nothing",
                 "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer p(ctx, router);
  const auto w = p.introduce("renew", role::collector, 20'000);  // window 60 s
  REQUIRE(w.heartbeat_ms == 20'000);
  REQUIRE(events.next("worker.joined", about("renew")));
  // A wrong token in a repeated HELLO is ignored.
  p.send(codec::hello{role::collector, "renew", 20, {{"gpu", 1}}, w.session + 1});
  const auto w2 = next_a<codec::welcome>(p);
  CHECK(w2.session == w.session);
  CHECK(w2.resumed);
  CHECK(w2.heartbeat_ms == 20);
  // Nothing was published for it: the next event is the marker's.
  raw_peer marker(ctx, router);
  marker.introduce("marker");
  REQUIRE(events.next("worker.joined", about("marker")));
  int joined_renew = 0;
  for (const auto& e : events.seen()) {
    if (event_peer_id(e) != "renew") continue;
    CHECK(e.topic != "worker.left");
    joined_renew += e.topic == "worker.joined" ? 1 : 0;  // (worker.lost may come, see below)
  }
  CHECK(joined_renew == 1);
  // The new interval governs liveness: silent now, the session expires in its 60 ms window
  // (the old window was 60 s).
  CHECK(next_a<codec::disconnect>(p, 10'000ms).code == code_of(error_code::expired));
  const auto lost = events.next("worker.lost", about("renew"));
  REQUIRE(lost);
  CHECK(std::get<codec::peer_gone>(lost->body).code == code_of(error_code::expired));
}

// §8.6 "A HELLO from a new connection naming the id of a live session SHALL be refused with
// ERROR 409 (DUPLICATE_ID) unless it carries that session's token in `session` and the
// session's role."
TEST_CASE_METHOD(fixture, "SPEC 8.6: a duplicate live id is refused with ERROR 409", "[spec]") {
  raw_peer first(ctx, router);
  const auto w = first.introduce("dup");
  raw_peer second(ctx, router);
  second.send(codec::hello{role::collector, "dup", 1000, {}, {}});
  CHECK_THAT(expect_error(second, error_code::duplicate_id).reason, Catch::Contains("dup"));
  second.send(codec::hello{role::collector, "dup", 1000, {}, w.session + 1});  // wrong token
  CHECK(expect_error(second, error_code::duplicate_id).ref_type == ref(type_hello));
  second.send(codec::hello{role::learner, "dup", 1000, {}, w.session});  // wrong role
  CHECK(expect_error(second, error_code::duplicate_id).ref_type == ref(type_hello));
  CHECK(broker.get().snapshot().refused_hellos == 3);
  first.send(codec::heartbeat{});
  next_a<codec::heartbeat>(first);  // the live session is untouched
}

// §8.6 "... the newer connection wins: the broker SHALL send DISCONNECT 430 (REPLACED) to the
// old connection (best effort), move the session to the new connection, ... answer WELCOME
// with the same token and `resumed` = true, and publish `*.joined` with `resumed` = true."
TEST_CASE_METHOD(fixture, "SPEC 8.6: a HELLO with the session token resumes the session",
                 "[spec]") {
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
  first.send(codec::heartbeat{});
  next_error(first, error_code::not_ready, ref(type_heartbeat));
}

// §8.6 "... re-agree the heartbeat from this HELLO, replace the resources, reset the session's
// fault count and liveness clock ... No `*.left` or `*.lost` is published for the old
// connection." §10.3 "Resumption (§8.6) resets the count."
TEST_CASE("SPEC 8.6: resumption re-agrees the session and resets its fault count", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 3;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  event_listener events(ctx, b.get().events_endpoint());
  const std::vector<std::string> garbage{header(1, type_heartbeat), "\xc1"};
  raw_peer first(ctx, router);
  const auto w = first.introduce("mover", role::learner, 1000);
  const auto joined = events.next("worker.joined", about("mover"));
  REQUIRE(joined);
  for (int i = 0; i < 2; ++i) {
    first.send_frames(garbage);
    next_error(first, error_code::bad_body, ref(type_heartbeat));
  }
  raw_peer second(ctx, router);
  second.send(codec::hello{role::learner, "mover", 5000, {{"gpu", 1}}, w.session});
  const auto w2 = next_a<codec::welcome>(second);
  CHECK(w2.session == w.session);
  CHECK(w2.resumed);
  CHECK(w2.heartbeat_ms == 5000);
  CHECK(w2.epoch == w.epoch);
  CHECK(next_a<codec::disconnect>(first).code == code_of(error_code::replaced));
  const auto rejoined = events.next("worker.joined", [](const codec::event& e) {
    return event_peer_id(e) == "mover" && std::get<codec::peer_joined>(e.body).resumed;
  });
  REQUIRE(rejoined);
  const auto& body = std::get<codec::peer_joined>(rejoined->body);
  CHECK(body.serial == std::get<codec::peer_joined>(joined->body).serial);
  CHECK(body.role == role::learner);
  CHECK(body.resources == rlbus::resources{{"gpu", 1}});
  // No *.left or *.lost for the old connection: the next event about anyone is the marker's.
  raw_peer marker(ctx, router);
  marker.introduce("marker");
  REQUIRE(events.next("worker.joined", about("marker")));
  for (const auto& e : events.seen()) {
    CHECK(e.topic != "worker.left");
    CHECK(e.topic != "worker.lost");
  }
  // Two faults are not yet max-faults (3): the count started again at resumption ...
  for (int i = 0; i < 2; ++i) {
    second.send_frames(garbage);
    next_error(second, error_code::bad_body, ref(type_heartbeat));
  }
  second.send(codec::heartbeat{});
  next_a<codec::heartbeat>(second);
  // ... and the third is.
  second.send_frames(garbage);
  next_error(second, error_code::bad_body, ref(type_heartbeat));
  CHECK(next_a<codec::disconnect>(second).code == code_of(error_code::too_many_faults));
  const auto lost = events.next("worker.lost", about("mover"));
  REQUIRE(lost);
  CHECK(std::get<codec::peer_gone>(lost->body).serial == body.serial);
}

// §8.7 "A peer that sends DISCONNECT ends its session at once: the broker SHALL publish `*.left`
// with the peer's code and reason, and does not reply."
TEST_CASE_METHOD(fixture, "SPEC 8.7: DISCONNECT ends the session with worker.left", "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer p(ctx, router);
  p.introduce("leaver", role::learner);
  p.send(codec::disconnect{200, "done"});
  const auto e = events.next("worker.left",
                             [](const codec::event& ev) { return event_peer_id(ev) == "leaver"; });
  REQUIRE(e);
  CHECK(std::get<codec::peer_gone>(e->body).reason == "done");
  CHECK(std::get<codec::peer_gone>(e->body).code == 200);
  CHECK(wait_until([&] { return broker.get().snapshot().peers == 0; }));
  p.send(codec::heartbeat{});
  // The session is gone, and nothing came before this ERROR: no reply to DISCONNECT.
  next_error(p, error_code::not_ready, ref(type_heartbeat));
}

// §8.7 "... the broker SHALL publish `*.left` with the peer's code and reason" (§4.4: "The
// broker accepts any code from a peer and repeats it in the `*.left` event"); a DISCONNECT
// that fails its field checks is a fault like any other (§5.3), and the session goes on.
TEST_CASE_METHOD(fixture, "SPEC 8.7: *.left repeats any code; a bad DISCONNECT ends nothing",
                 "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer p(ctx, router);
  p.introduce("coded", role::coordinator);
  p.send_frames({header(1, type_disconnect),
                 packed([](packer& pk) { pk.pack_map(1).pack("code").pack(200); })});
  CHECK_THAT(next_error(p, error_code::bad_field, ref(type_disconnect)).reason,
             Catch::Contains("reason"));
  p.send(codec::disconnect{200, std::string(1025, 'r')});
  next_error(p, error_code::bad_field, ref(type_disconnect));
  p.send_frames({header(1, type_disconnect), packed([](packer& pk) {
                   pk.pack_map(2).pack("code").pack(65536).pack("reason").pack("");
                 })});
  next_error(p, error_code::bad_field, ref(type_disconnect));
  p.send(codec::heartbeat{});
  next_a<codec::heartbeat>(p);
  p.send(codec::disconnect{4242, std::string(1024, 'r')});
  const auto left = events.next("coordinator.left", about("coded"));
  REQUIRE(left);
  CHECK(std::get<codec::peer_gone>(left->body).code == 4242);
  CHECK(std::get<codec::peer_gone>(left->body).reason == std::string(1024, 'r'));
  raw_peer q(ctx, router);
  q.introduce("zero-code");
  q.send(codec::disconnect{0, ""});
  const auto zero = events.next("worker.left", about("zero-code"));
  REQUIRE(zero);
  CHECK(std::get<codec::peer_gone>(zero->body).code == 0);
  CHECK(std::get<codec::peer_gone>(zero->body).reason.empty());
}

// §8.8 "the broker SHALL draw each token from the operating system's random generator (never
// 0, unrelated to the epoch or to other tokens) and SHALL NOT publish it ... Events and logs
// name a session by its `serial` instead: 1 for the first session of an epoch, +1 for each
// new session (a resumed session keeps its serial)."
TEST_CASE_METHOD(fixture, "SPEC 8.8: tokens are secret and distinct; events carry serials",
                 "[spec]") {
  raw_events raw(ctx, broker.get().events_endpoint());
  REQUIRE(raw.next("broker.heartbeat", ""));
  raw_peer a(ctx, router), b(ctx, router), c(ctx, router), a2(ctx, router);
  const auto wa = a.introduce("tok-a", role::collector, 30'000);
  const auto wb = b.introduce("tok-b", role::learner, 30'000);
  a2.send(codec::hello{role::collector, "tok-a", 30'000, {}, wa.session});
  CHECK(next_a<codec::welcome>(a2).session == wa.session);
  b.send(codec::disconnect{200, "bye"});
  REQUIRE(raw.next("worker.left", "tok-b"));
  const auto wc = c.introduce("tok-c", role::coordinator, 20);  // expires: coordinator.lost
  REQUIRE(raw.next("coordinator.lost", "tok-c"));
  // Tokens: non-zero, distinct, not the epoch.
  const std::vector<std::uint64_t> tokens{wa.session, wb.session, wc.session};
  CHECK(std::set<std::uint64_t>(tokens.begin(), tokens.end()).size() == 3);
  for (const auto t : tokens) {
    CHECK(t != 0);
    CHECK(t != broker.get().epoch());
  }
  // Serials: 1, 2, 3 in order of new sessions; the resumed session keeps 1.
  std::vector<std::pair<std::string, std::uint64_t>> serials;
  for (const auto& item : raw.seen()) {
    if (const auto* j = std::get_if<codec::peer_joined>(&item.event.body))
      serials.emplace_back(item.topic + " " + j->id + (j->resumed ? " resumed" : ""), j->serial);
    if (const auto* g = std::get_if<codec::peer_gone>(&item.event.body))
      serials.emplace_back(item.topic + " " + g->id, g->serial);
  }
  const std::vector<std::pair<std::string, std::uint64_t>> expected{
      {"worker.joined tok-a", 1},         {"worker.joined tok-b", 2},
      {"worker.joined tok-a resumed", 1}, {"worker.left tok-b", 2},
      {"coordinator.joined tok-c", 3},    {"coordinator.lost tok-c", 3}};
  CHECK(serials == expected);
  // No event carries a token: not as any integer anywhere in a body, nor as raw bytes.
  for (const auto& item : raw.seen()) {
    INFO(item.topic);
    const auto oh = msgpack::unpack(item.body.data(), item.body.size());
    std::vector<std::uint64_t> numbers;
    collect_uints(oh.get(), numbers);
    for (const auto t : tokens) {
      CHECK(std::find(numbers.begin(), numbers.end(), t) == numbers.end());
      CHECK(item.body.find(be64(t)) == std::string::npos);
      CHECK(item.body.find(std::to_string(t)) == std::string::npos);
      CHECK(item.topic.find(std::to_string(t)) == std::string::npos);
    }
  }
}
