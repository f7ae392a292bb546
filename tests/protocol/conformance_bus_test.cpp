// Conformance, SPEC §17: the topic bus. Raw DEALERs play nodes (role bus): they subscribe,
// publish with payload frames, acknowledge (or not) and resume. Each test is named after the
// clause it checks and quotes it ("..." marks a cut).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "codec/batch.hpp"
#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using codec::error_code;

namespace {

inline constexpr std::uint8_t type_subscribe = 0x70;
inline constexpr std::uint8_t type_publish = 0x73;
inline constexpr std::uint8_t type_bus_ack = 0x76;

/// A node: joined, its first PUBLISH_CREDIT read and returned.
codec::publish_credit join_node(raw_peer& n, const std::string& id) {
  join(n, id, role::bus);
  return next_a<codec::publish_credit>(n);
}

/// SUBSCRIBE (request `req`) and its SUBSCRIBED, which must accept it.
codec::subscribed subscribe_ok(raw_peer& n, std::string topic, bool prefix = false,
                               std::uint64_t req = 1, bool echo = false, bool last = false) {
  n.send(codec::subscribe{req, std::move(topic), prefix, echo, last});
  const auto a = next_a<codec::subscribed>(n);
  INFO(a.reason);
  CHECK(a.req == req);
  REQUIRE(a.accepted);
  CHECK(a.code == 0);
  return a;
}

codec::publish pub(std::uint64_t seq, std::string topic, std::uint32_t part = 0, bool more = false,
                   bool retain = false) {
  return codec::publish{seq, std::move(topic), part, more, retain};
}

/// The very next message must be DELIVER; returns it with its payload.
std::pair<codec::deliver, std::string> next_delivery(raw_peer& n) {
  auto d = next_a<codec::deliver>(n);
  return {d, n.payload()};
}

/// Like expect_quiet, for a publisher: the PUBLISH_CREDIT that say what the broker took may
/// come first (§17.4.2); anything else fails.
void quiet_publisher(raw_peer& p) {
  p.send(codec::heartbeat{});
  for (;;) {
    auto m = p.recv();
    REQUIRE(m);
    if (std::holds_alternative<codec::heartbeat>(*m)) return;
    INFO("got message type 0x" << std::hex << static_cast<int>(codec::type_of(*m)));
    REQUIRE(std::holds_alternative<codec::publish_credit>(*m));
  }
}

/// The next message to a publisher that is not PUBLISH_CREDIT must be ERROR `code`.
void publish_refused(raw_peer& p, error_code code) {
  for (;;) {
    auto m = p.recv();
    REQUIRE(m);
    if (std::holds_alternative<codec::publish_credit>(*m)) continue;
    REQUIRE(std::holds_alternative<codec::error>(*m));
    const auto& e = std::get<codec::error>(*m);
    INFO(e.reason);
    CHECK(e.code == code_of(code));
    CHECK(e.ref_type == ref(type_publish));
    return;
  }
}

broker::config bus_config() {
  auto cfg = test_config();
  return cfg;
}

}  // namespace

// §17.1 "They SHALL be refused with ERROR 404 from a session whose role is not `bus`, and a
// node's task messages (§12) ... are refused as from any peer that may not send them (ERROR
// 404 ...)."
TEST_CASE("SPEC 17.1: bus messages need role bus, and nodes send no task messages", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  raw_peer w(ctx, b.get().router_endpoint()), n(ctx, b.get().router_endpoint());
  join(w, "w", role::collector);
  w.send(codec::subscribe{1, "t", false, false, false});
  next_error(w, error_code::unknown_type, ref(type_subscribe));
  join_node(n, "n");
  n.send(task_of("t1"));
  next_error(n, error_code::unknown_type, ref(0x10));
  n.send(codec::started{"t1", 1});
  next_error(n, error_code::unknown_type, ref(type_started));
  expect_quiet(n);
}

// §17.1.1 "A PUBLISH with two frames, or any other message with three, SHALL be answered
// with ERROR 400 (BAD_FRAME) without `ref_type`."
TEST_CASE("SPEC 17.1.1: PUBLISH has three frames, every other message two", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  raw_peer n(ctx, b.get().router_endpoint());
  join_node(n, "n");
  const auto h = codec::make_header(codec::msg_type::publish);
  n.send_frames({std::string(h.data(), h.size()), codec::encode_body(pub(1, "t"))});
  next_error(n, error_code::bad_frame, no_ref);
  n.send(codec::subscribe{1, "t", false, false, false}, "payload");
  next_error(n, error_code::bad_frame, no_ref);
  n.send(pub(1, "t"), "");  // a payload of 0 bytes is still a frame
  quiet_publisher(n);
}

// §17.2.1 topic rule, §17.8 rule 2: "SUBSCRIBE or UNSUBSCRIBE with an empty `topic` and
// `prefix` not true, or a `topic` that breaks the topic rule: ERROR 402."
TEST_CASE("SPEC 17.2.1: topics are 1..256 printable ASCII characters other than space", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  raw_peer n(ctx, b.get().router_endpoint());
  join_node(n, "n");
  n.send(codec::subscribe{1, "", false, false, false});
  next_error(n, error_code::bad_field, ref(type_subscribe));
  n.send(codec::subscribe{2, "has space", false, false, false});
  next_error(n, error_code::bad_field, ref(type_subscribe));
  n.send(pub(1, std::string(257, 'a')), "x");
  next_error(n, error_code::bad_field, ref(type_publish));
  // Case, dots and '*' are the name's own: DI-engine's topics are taken verbatim.
  subscribe_ok(n, "task.context_exchanger_Role.COLLECTOR*", false, 3);
}

// §17.2.2 "exact ... matches that topic only; prefix ... matches every topic that begins
// with it, and its topic may be empty (0 bytes: every topic)." §17.2.3 "each such node gets
// it once, however many of its subscriptions match", "other than its publisher".
TEST_CASE("SPEC 17.2.2/17.2.3: exact and prefix subscriptions, each node once, never itself",
          "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer a(ctx, router), exact(ctx, router), prefix(ctx, router), all(ctx, router);
  join_node(a, "a");
  join_node(exact, "exact");
  join_node(prefix, "prefix");
  join_node(all, "all");
  subscribe_ok(a, "", true);  // the publisher hears everything but itself
  subscribe_ok(exact, "task.x");
  subscribe_ok(prefix, "task.", true);
  CHECK(subscribe_ok(prefix, "task.x", false, 2).subscriptions == 2);  // matches twice
  subscribe_ok(all, "", true);
  a.send(pub(1, "task.x"), "one");
  a.send(pub(2, "task.y"), "two");
  a.send(pub(3, "other"), "three");
  for (auto* n : {&exact, &prefix, &all}) {
    const auto [d, payload] = next_delivery(*n);
    CHECK(d.seq == 1);
    CHECK(d.topic == "task.x");
    CHECK(d.from == "a");
    CHECK(payload == "one");
  }
  CHECK(next_delivery(prefix).second == "two");
  CHECK(next_delivery(all).second == "two");
  CHECK(next_delivery(all).second == "three");
  for (auto* n : {&exact, &prefix, &all}) expect_quiet(*n);
  quiet_publisher(a);
}

// §17.3.1 `echo`: "the node's own publications match too".
TEST_CASE("SPEC 17.3.1: echo lets a node hear its own publications", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  raw_peer n(ctx, b.get().router_endpoint());
  join_node(n, "n");
  subscribe_ok(n, "t", false, 1, true);
  n.send(pub(1, "t"), "mine");
  const auto [d, payload] = next_delivery(n);
  CHECK(d.from == "n");
  CHECK(payload == "mine");
}

// §17.3.3 "The answer to one SUBSCRIBE or UNSUBSCRIBE, sent after it took effect", §17.8
// "An UNSUBSCRIBE of a subscription the node does not hold is accepted and changes nothing."
TEST_CASE("SPEC 17.3.3: SUBSCRIBED answers each request and counts what the node holds", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer pubr(ctx, router), sub(ctx, router);
  join_node(pubr, "p");
  join_node(sub, "s");
  CHECK(subscribe_ok(sub, "t", false, 7).subscriptions == 1);
  CHECK(subscribe_ok(sub, "t", false, 8).subscriptions == 1);  // held already: counts once
  sub.send(codec::unsubscribe{9, "t", true});                  // not held as a prefix
  auto a = next_a<codec::subscribed>(sub);
  CHECK(a.req == 9);
  CHECK(a.accepted);
  CHECK(a.subscriptions == 1);
  sub.send(codec::unsubscribe{10, "t", false});
  a = next_a<codec::subscribed>(sub);
  CHECK(a.req == 10);
  CHECK(a.subscriptions == 0);
  pubr.send(pub(1, "t"), "after");
  quiet_publisher(pubr);
  expect_quiet(sub);  // unsubscribed before the PUBLISH was read: nothing came
}

// §17.4.1 "any two subscribers that both receive two publications receive them in the same
// order, whoever published them."
TEST_CASE("SPEC 17.4.1: one order for every subscriber, per publisher as published", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer p1(ctx, router), p2(ctx, router), s1(ctx, router), s2(ctx, router);
  join_node(p1, "p1");
  join_node(p2, "p2");
  join_node(s1, "s1");
  join_node(s2, "s2");
  subscribe_ok(s1, "", true);
  subscribe_ok(s2, "t", true);
  constexpr int n = 20;
  for (int i = 1; i <= n; ++i) {
    p1.send(pub(i, "t1"), "p1-" + std::to_string(i));
    p2.send(pub(i, "t2"), "p2-" + std::to_string(i));
  }
  std::vector<std::string> seen1, seen2;
  for (int i = 0; i < 2 * n; ++i) {
    seen1.push_back(next_delivery(s1).second);
    seen2.push_back(next_delivery(s2).second);
  }
  CHECK(seen1 == seen2);
  int last1 = 0, last2 = 0;
  for (const auto& s : seen1) {
    auto& last = s[1] == '1' ? last1 : last2;
    CHECK(std::stoi(s.substr(3)) == last + 1);
    last = std::stoi(s.substr(3));
  }
}

// §17.4.2 "A PUBLISH is taken when its `seq` is `acked` + 1 and ... at most `limit`; a PUBLISH
// whose `seq` is at most `acked` ... SHALL be dropped, counted, and is no fault; one whose `seq`
// is greater than `acked` + 1 SHALL be refused with ERROR 413 (BAD_SEQ) and one past `limit`
// with ERROR 414 (NO_CREDIT), neither taking its `seq`."
TEST_CASE("SPEC 17.4.2: PUBLISH seqs are taken in order within the credit", "[spec]") {
  auto cfg = bus_config();
  cfg.bus_credit = 4;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer p(ctx, router), s(ctx, router);
  const auto first = join_node(p, "p");
  CHECK(first.acked == 0);
  CHECK(first.limit == 4);
  join_node(s, "s");
  subscribe_ok(s, "t");
  p.send(pub(2, "t"), "skips one");
  next_error(p, error_code::bad_seq, ref(type_publish));
  p.send(pub(1, "t"), "1");
  p.send(pub(1, "t"), "1 again");  // a copy: dropped, no ERROR
  CHECK(next_a<codec::publish_credit>(p).acked == 1);
  p.send(pub(2, "t"), "2");
  const auto topped = next_a<codec::publish_credit>(p);  // used half: topped up
  CHECK(topped.acked == 2);
  CHECK(topped.limit == 6);
  for (int i = 1; i <= 2; ++i) {
    const auto [d, payload] = next_delivery(s);
    CHECK(payload == std::to_string(i));
  }
  expect_quiet(s);  // the copy of 1 was not relayed
}

// §17.4.2 "unless the node is **held back**: some subscriber whose queue holds one of the
// node's publications has more than half of bus-queue-bytes unacknowledged ... It grants again
// when those queues shrink."
TEST_CASE("SPEC 17.4.2: a publisher whose subscriber lags gets no credit until it reads",
          "[spec]") {
  auto cfg = bus_config();
  cfg.bus_credit = 4;
  cfg.bus_window = 64;
  cfg.bus_queue_bytes = 128 * 1024;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer p(ctx, router), slow(ctx, router);
  join_node(p, "p");
  join_node(slow, "slow");
  subscribe_ok(slow, "t");
  const std::string big(20 * 1024, 'x');  // four of these pass half of the queue's bound
  std::uint64_t limit = 4, seq = 0;
  while (seq < limit) {
    p.send(pub(++seq, "t"), big);
    const auto c = next_a<codec::publish_credit>(p);
    limit = c.limit;
  }
  // Topped up while less than half of the queue's bound was unread, then no more.
  CHECK(limit == seq);
  CHECK(seq < 8);
  p.send(pub(seq + 1, "t"), "past the credit");
  next_error(p, error_code::no_credit, ref(type_publish));
  std::uint64_t got = 0;
  while (got < seq) got = next_delivery(slow).first.seq;
  slow.send(codec::bus_ack{got});
  const auto c = next_a<codec::publish_credit>(p);  // the queue drained: credit again
  CHECK(c.limit > limit);
}

// §17.4.3 "The broker SHALL send delivery `seq` only while `seq` <= acked + bus-window ... A
// BUS_ACK past the last delivery seq sent SHALL be refused with ERROR 413 ... after a
// resumption (§8.6) it sends again ... every delivery from acked + 1 on, byte for byte, with
// its `seq`."
TEST_CASE("SPEC 17.4.3: deliveries go through a window and again after a resumption", "[spec]") {
  auto cfg = bus_config();
  cfg.bus_window = 3;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer p(ctx, router), s(ctx, router), s2(ctx, router);
  join_node(p, "p");
  const auto token = join(s, "s", role::bus).session;
  next_a<codec::publish_credit>(s);
  subscribe_ok(s, "t");
  for (int i = 1; i <= 5; ++i) p.send(pub(i, "t"), std::to_string(i));
  for (int i = 1; i <= 3; ++i) CHECK(next_delivery(s).second == std::to_string(i));
  expect_quiet(s);  // 4 and 5 wait for an ack
  s.send(codec::bus_ack{4});
  next_error(s, error_code::bad_seq, ref(type_bus_ack));
  s.send(codec::bus_ack{1});
  CHECK(next_delivery(s).first.seq == 4);
  expect_quiet(s);
  // The same session on a new connection: 2, 3 and 4 again, within the window.
  s2.send(codec::hello{role::bus, "s", 30'000, {}, token});
  CHECK(next_a<codec::welcome>(s2).resumed);
  next_a<codec::publish_credit>(s2);
  for (int i = 2; i <= 4; ++i) {
    const auto [d, payload] = next_delivery(s2);
    CHECK(d.seq == static_cast<std::uint64_t>(i));
    CHECK(payload == std::to_string(i));
  }
  expect_quiet(s2);
  s2.send(codec::bus_ack{4});
  CHECK(next_delivery(s2).second == "5");
}

// §17.5 "The broker relays each fragment as it is taken, to the recipients fixed at part 0"
// and the rules of BAD_FRAGMENT (441); "When a publisher's session ends while its publication
// is open, the broker SHALL deliver ... `abandoned` true and an empty payload."
TEST_CASE("SPEC 17.5: fragments are relayed as they come, to the recipients of part 0", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer p(ctx, router), s(ctx, router), late(ctx, router);
  join_node(p, "p");
  join_node(s, "s");
  join_node(late, "late");
  subscribe_ok(s, "t");
  p.send(pub(1, "t", 1), "no start");
  publish_refused(p, error_code::bad_fragment);
  p.send(pub(2, "t", 0, true, true), "retained fragment");
  publish_refused(p, error_code::bad_fragment);
  p.send(pub(3, "t", 0, true), "A");
  subscribe_ok(late, "t");  // after part 0: gets none of it
  p.send(pub(4, "t", 0), "a new one while open");
  publish_refused(p, error_code::bad_fragment);
  p.send(pub(5, "u", 1, true), "on another topic");
  publish_refused(p, error_code::bad_fragment);
  p.send(pub(6, "t", 1, true), "B");
  p.send(pub(7, "t", 2), "C");
  for (const auto* want : {"A", "B", "C"}) {
    const auto [d, payload] = next_delivery(s);
    CHECK(payload == want);
    CHECK(d.more == (payload != "C"));
  }
  p.send(pub(8, "t", 0, true), "D");
  CHECK(next_delivery(s).second == "D");
  CHECK(next_delivery(late).second == "D");
  p.send(codec::disconnect{200, "gone mid-publication"});
  for (auto* n : {&s, &late}) {
    const auto [d, payload] = next_delivery(*n);
    CHECK(d.abandoned);
    CHECK(d.part == 1);
    CHECK(payload.empty());
  }
}

// §17.5.1 "A batch is taken, numbered, credited, queued, relayed and acknowledged as one
// PUBLISH and one delivery: its recipients get one DELIVER with the same `count` and the same
// payload frame" and the rules of BAD_BATCH (442).
TEST_CASE("SPEC 17.5.1: a batch travels as one publication, its framing checked", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer p(ctx, router), s(ctx, router);
  join_node(p, "p");
  join_node(s, "s");
  subscribe_ok(s, "t");
  std::string batch;
  for (const auto* item : {"one", "", "three"}) codec::append_to_batch(batch, item);
  const auto batch_of = [](std::uint64_t seq, std::uint32_t count, std::uint32_t part = 0,
                           bool more = false, bool retain = false) {
    auto m = pub(seq, "t", part, more, retain);
    m.count = count;
    return m;
  };
  p.send(batch_of(1, 3), batch);
  const auto [d, payload] = next_delivery(s);
  CHECK(d.seq == 1);
  CHECK(d.count == std::optional<std::uint32_t>(3));
  CHECK(d.from == "p");
  CHECK(payload == batch);
  std::vector<std::string> items;
  CHECK(codec::for_each_in_batch(payload, 3,
                                 [&](std::string_view i) { items.emplace(items.end(), i); }));
  CHECK(items == std::vector<std::string>{"one", "", "three"});
  // the framing, whole: fewer items, more, a length past the end, bytes left over
  p.send(batch_of(2, 4), batch);
  publish_refused(p, error_code::bad_batch);
  p.send(batch_of(3, 2), batch);
  publish_refused(p, error_code::bad_batch);
  p.send(batch_of(4, 3), batch.substr(0, batch.size() - 1));
  publish_refused(p, error_code::bad_batch);
  p.send(batch_of(5, 3), batch + "x");
  publish_refused(p, error_code::bad_batch);
  // never a fragment nor a retained value
  p.send(batch_of(6, 3, 0, true), batch);
  publish_refused(p, error_code::bad_batch);
  p.send(batch_of(7, 3, 0, false, true), batch);
  publish_refused(p, error_code::bad_batch);
  // each refused one used its seq, relayed nothing; the next is taken and is one delivery
  p.send(batch_of(8, 2), batch.substr(0, 4 + 3 + 4));
  const auto [d2, payload2] = next_delivery(s);
  CHECK(d2.seq == 2);
  CHECK(d2.count == std::optional<std::uint32_t>(2));
  s.send(codec::bus_ack{2});  // both batches acknowledged at once: two deliveries
  expect_quiet(s);
  quiet_publisher(p);
}

// §17.6 "When appending would take a node's queue past bus-queue-bytes ... the broker SHALL
// drop the oldest deliveries that it has not sent ... before the broker sends the delivery
// after it, it SHALL send BUS_GAP with `first` and `last` the dropped seqs". Credit keeps one
// publisher well within the bound (§17.4.2): several at once, each within its first credit,
// pass it.
TEST_CASE("SPEC 17.6: what a bound drops is reported as a numbered gap", "[spec]") {
  auto cfg = bus_config();
  cfg.bus_window = 1;
  cfg.bus_queue_bytes = 8 * 1024;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer s(ctx, router);
  join_node(s, "s");
  subscribe_ok(s, "t");
  std::vector<std::unique_ptr<raw_peer>> pubs;
  const std::string kb(1024, 'x');
  for (int k = 0; k < 6; ++k) {
    pubs.push_back(std::make_unique<raw_peer>(ctx, router));
    REQUIRE(join_node(*pubs.back(), "p" + std::to_string(k)).limit >= 2);
  }
  for (auto& p : pubs)
    for (int i = 1; i <= 2; ++i) p->send(pub(i, "t"), kb);
  for (auto& p : pubs) quiet_publisher(*p);  // all read: 12 KiB for a node that may hold 8
  const auto [first, payload] = next_delivery(s);
  CHECK(first.seq == 1);
  s.send(codec::bus_ack{1});
  const auto gap = next_a<codec::bus_gap>(s);
  CHECK(gap.first == 2);
  CHECK(gap.last >= 2);
  CHECK(gap.last < 12);
  std::uint64_t seq = gap.last;
  while (seq < 12) {
    s.send(codec::bus_ack{seq});
    const auto [d, body] = next_delivery(s);
    CHECK(d.seq == seq + 1);
    CHECK(body == kb);
    seq = d.seq;
  }
}

// §17.7 "A SUBSCRIBE with `last` true SHALL be followed, after its SUBSCRIBED, by a DELIVER
// with `retained` true of every retained value whose topic the new subscription matches ...
// one with an empty payload clears it."
TEST_CASE("SPEC 17.7: retained values reach nodes that subscribe later", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer p(ctx, router), s(ctx, router), s2(ctx, router);
  join_node(p, "p");
  join_node(s, "s");
  join_node(s2, "s2");
  p.send(pub(1, "model.b", 0, false, true), "b1");
  p.send(pub(2, "model.a", 0, false, true), "a1");
  p.send(pub(3, "model.a", 0, false, true), "a2");  // replaces a1
  p.send(pub(4, "model.c", 0, false, true), "c1");
  p.send(pub(5, "model.c", 0, false, true), "");  // clears model.c
  p.send(pub(6, "model.d"), "not retained");
  quiet_publisher(p);
  subscribe_ok(s, "model.", true, 1, false, true);
  for (const auto* want : {"a2", "b1"}) {  // in topic order
    const auto [d, payload] = next_delivery(s);
    CHECK(d.retained);
    CHECK(payload == want);
  }
  expect_quiet(s);
  subscribe_ok(s2, "model.b", false, 1, false, false);  // without `last`: nothing old
  expect_quiet(s2);
}

// §17.8 rule 4 "SUBSCRIBE that would give the node more than bus-max-subscriptions:
// SUBSCRIBED, `accepted` false, `code` 440"; §17.9 "bus-max-nodes ... bounds the live
// sessions of role `bus`".
TEST_CASE("SPEC 17.8/17.9: subscriptions and nodes are bounded", "[spec]") {
  auto cfg = bus_config();
  cfg.bus_max_subscriptions = 2;
  cfg.bus_max_nodes = 1;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer n(ctx, router), second(ctx, router);
  join_node(n, "n");
  subscribe_ok(n, "a", false, 1);
  subscribe_ok(n, "b", false, 2);
  n.send(codec::subscribe{3, "c", false, false, false});
  const auto a = next_a<codec::subscribed>(n);
  CHECK_FALSE(a.accepted);
  CHECK(a.code == code_of(error_code::too_many_subscriptions));
  CHECK(a.subscriptions == 2);
  second.send(codec::hello{role::bus, "second", 30'000, {}, std::nullopt});
  next_error(second, error_code::busy, ref(type_hello));
}

// §17.9 "Nodes publish `bus.joined`, `bus.left` and `bus.lost` on the PUB"; "the end of the
// session ... drops them": a later session under the id starts at `seq` 1, subscribed to
// nothing.
TEST_CASE("SPEC 17.9: a node's bus state is its session's", "[spec]") {
  broker::server_thread b(bus_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  event_listener events(ctx, b.get().events_endpoint());
  raw_peer p(ctx, router), s(ctx, router), again(ctx, router);
  join_node(p, "p");
  join_node(s, "s");
  REQUIRE(events.next("bus.joined", [](const codec::event& e) { return event_peer_id(e) == "s"; }));
  subscribe_ok(s, "t");
  p.send(pub(1, "t"), "1");
  CHECK(next_delivery(s).first.seq == 1);
  s.send(codec::disconnect{200, "bye"});
  REQUIRE(events.next("bus.left", [](const codec::event& e) { return event_peer_id(e) == "s"; }));
  join_node(again, "s");
  p.send(pub(2, "t"), "2");
  quiet_publisher(p);
  expect_quiet(again);  // no subscription any more
  subscribe_ok(again, "t");
  p.send(pub(3, "t"), "3");
  CHECK(next_delivery(again).first.seq == 1);
}
