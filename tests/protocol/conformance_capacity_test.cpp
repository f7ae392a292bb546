// Conformance, SPEC §12.10: capacity reports. Raw DEALERs play coordinators (which keep the
// CAPACITY messages a raw_peer otherwise drops) and workers that join, resume and go. Each
// test is named after the clause it checks and quotes it ("..." marks a cut).
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using codec::capacity_change;
using codec::error_code;

namespace {

inline constexpr std::uint8_t type_capacity = 0x16;

/// A coordinator that sees CAPACITY, joined; its snapshot (§12.10.4) is read and returned as
/// {collectors, learners}.
std::pair<std::uint64_t, std::uint64_t> join_coordinator(raw_peer& c, const std::string& id) {
  c.keep_capacity();
  join(c, id, role::coordinator);
  const auto collectors = next_a<codec::capacity>(c);
  const auto learners = next_a<codec::capacity>(c);
  CHECK(collectors.kind == role::collector);
  CHECK(learners.kind == role::learner);
  CHECK(collectors.change == capacity_change::snapshot);
  CHECK(learners.change == capacity_change::snapshot);
  return {collectors.count, learners.count};
}

/// The very next message to `c` must be CAPACITY with these fields.
void expect_capacity(raw_peer& c, role kind, capacity_change change, const std::string& worker,
                     std::uint64_t count) {
  const auto m = next_a<codec::capacity>(c);
  CHECK(m.kind == kind);
  CHECK(m.change == change);
  CHECK(m.worker_id == worker);
  CHECK(m.count == count);
}

}  // namespace

// §12.10.1 "A session counts from its WELCOME with `resumed` = false (§8.4) until it ends by
// DISCONNECT from the peer (§8.7), expiry (§9.5) or faults (§10.3). A repeated HELLO (§8.5) and
// a resumption (§8.6) change no count, and the DISCONNECT 430 of a replaced connection is no
// end."
TEST_CASE("SPEC 12.10.1: a worker counts from its first WELCOME to the end of its session",
          "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 1;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer c(ctx, router), w(ctx, router), w2(ctx, router), expiring(ctx, router),
      faulty(ctx, router);
  CHECK(join_coordinator(c, "coord") == std::make_pair(0UL, 0UL));
  const auto token = join(w, "w", role::collector).session;
  expect_capacity(c, role::collector, capacity_change::increase, "w", 1);
  // A repeated HELLO and a resumption: no change.
  w.send(codec::hello{role::collector, "w", 30'000, {{"cpu", 2}}, {}});
  CHECK(next_a<codec::welcome>(w).resumed);
  w2.send(codec::hello{role::collector, "w", 30'000, {}, token});
  CHECK(next_a<codec::welcome>(w2).resumed);
  CHECK(next_a<codec::disconnect>(w).code == code_of(error_code::replaced));
  expect_quiet(c);
  CHECK(wait_until([&] { return b.get().snapshot().collectors == 1; }));
  // Expiry and faults end sessions; so does DISCONNECT.
  expiring.introduce("expiring", role::learner, 20);
  expect_capacity(c, role::learner, capacity_change::increase, "expiring", 1);
  expect_capacity(c, role::learner, capacity_change::decrease, "expiring", 0);
  faulty.introduce("faulty", role::collector);
  expect_capacity(c, role::collector, capacity_change::increase, "faulty", 2);
  faulty.send_frames({header(1, type_heartbeat), "\xc1"});
  expect_capacity(c, role::collector, capacity_change::decrease, "faulty", 1);
  w2.send(codec::disconnect{200, "done"});
  expect_capacity(c, role::collector, capacity_change::decrease, "w", 0);
  CHECK(wait_until([&] { return b.get().snapshot().collectors == 0; }));
}

// §12.10.2 "CAPACITY (0x16, broker -> coordinator). ... Like every broker-only type, a
// CAPACITY from a peer is refused with 404 (§3.5.2)." (fields in canonical order, §5.5)
TEST_CASE_METHOD(fixture, "SPEC 12.10.2: CAPACITY is canonical and only the broker sends it",
                 "[spec]") {
  raw_peer c(ctx, router), w(ctx, router);
  c.keep_capacity();
  join(c, "coord", role::coordinator);
  const std::vector<std::string> keys{"kind", "change", "worker_id", "count"};
  for (int i = 0; i < 2; ++i) check_canonical(next_body(c, type_capacity), keys);  // snapshot
  join(w, "w", role::learner);
  check_canonical(next_body(c, type_capacity), keys);
  for (auto* p : {&c, &w}) {
    p->send(codec::capacity{role::collector, capacity_change::increase, "x", 1});
    next_error(*p, error_code::unknown_type, ref(type_capacity));
  }
  CHECK(wait_until([&] { return broker.get().snapshot().learners == 1; }));
}

// §12.10.3 "When a count changes, the broker SHALL send CAPACITY to every coordinator session
// ... and SHALL publish the same four fields (§7.5 capacity) on topic `capacity.<kind>`. For a
// worker that joined, this comes after its WELCOME and `worker.joined` and before any task is
// assigned to it; for one that went, after `worker.left` or `worker.lost` and after the end of
// its attempt, if it held one, has been handled (§12.7.4)."
TEST_CASE_METHOD(fixture, "SPEC 12.10.3: every coordinator hears of a worker coming and going",
                 "[spec]") {
  raw_events raw(ctx, broker.get().events_endpoint());
  REQUIRE(raw.next("broker.heartbeat", ""));
  raw_peer c1(ctx, router), c2(ctx, router), w(ctx, router), l(ctx, router);
  join_coordinator(c1, "coord-1");
  join_coordinator(c2, "coord-2");
  auto s = task_of("t");
  s.max_attempts = 2;
  submit_ok(c1, s);  // queued: no collector yet
  join(w, "w", role::collector);
  // The increase reaches both coordinators, before the new worker's first task.
  expect_capacity(c1, role::collector, capacity_change::increase, "w", 1);
  next_event(c1, "t", "assigned");
  expect_capacity(c2, role::collector, capacity_change::increase, "w", 1);
  CHECK(next_a<codec::task_start>(w).task_id == "t");
  join(l, "l", role::learner);
  expect_capacity(c1, role::learner, capacity_change::increase, "l", 1);
  expect_capacity(c2, role::learner, capacity_change::increase, "l", 1);
  // The worker leaves holding the task: its attempt ends first, then the decrease.
  w.send(codec::disconnect{200, "bye"});
  next_event(c1, "t", "requeued");
  expect_capacity(c1, role::collector, capacity_change::decrease, "w", 0);
  expect_capacity(c2, role::collector, capacity_change::decrease, "w", 0);
  // The PUB copies, each after the session's own event.
  const auto left = raw.next("worker.left", "w");
  REQUIRE(left);
  const auto gone = raw.next("capacity.collector", "");
  REQUIRE(gone);
  CHECK(std::get<codec::capacity_status>(gone->body) ==
        codec::capacity_status{role::collector, capacity_change::decrease, "w", 0});
  std::vector<std::string> order;
  for (const auto& item : raw.seen())
    if (item.topic.rfind("task.", 0) != 0 && item.topic != "broker.heartbeat")
      order.push_back(item.topic);
  const std::vector<std::string> expected{
      "coordinator.joined", "coordinator.joined", "worker.joined", "capacity.collector",
      "worker.joined",      "capacity.learner",   "worker.left",   "capacity.collector"};
  CHECK(order == expected);
  for (const auto& item : raw.seen())
    if (item.topic == "capacity.learner")
      CHECK(std::get<codec::capacity_status>(item.event.body) ==
            codec::capacity_status{role::learner, capacity_change::increase, "l", 1});
}

// §12.10.4 "Right after a WELCOME that begins (§8.4) or resumes (§8.6) a coordinator's
// session, the broker SHALL send that coordinator two CAPACITY with `change` = `snapshot` and
// an empty `worker_id`: first `kind` = `collector`, then `kind` = `learner`, each with the
// current count. A repeated HELLO (§8.5) gets no snapshot. Snapshots are not published."
TEST_CASE_METHOD(fixture, "SPEC 12.10.4: a coordinator is told the counts as its session begins",
                 "[spec]") {
  raw_events raw(ctx, broker.get().events_endpoint());
  REQUIRE(raw.next("broker.heartbeat", ""));
  raw_peer c0(ctx, router), c1(ctx, router), w0(ctx, router), w1(ctx, router), l0(ctx, router);
  join(w0, "w0", role::collector);
  join(w1, "w1", role::collector);
  join(l0, "l0", role::learner);
  c0.keep_capacity();
  const auto token = join(c0, "coord", role::coordinator).session;
  expect_capacity(c0, role::collector, capacity_change::snapshot, "", 2);
  expect_capacity(c0, role::learner, capacity_change::snapshot, "", 1);
  c0.send(codec::hello{role::coordinator, "coord", 30'000, {}, {}});
  CHECK(next_a<codec::welcome>(c0).resumed);
  expect_quiet(c0);  // a repeated HELLO: no snapshot
  c1.keep_capacity();
  c1.send(codec::hello{role::coordinator, "coord", 30'000, {}, token});
  CHECK(next_a<codec::welcome>(c1).resumed);
  expect_capacity(c1, role::collector, capacity_change::snapshot, "", 2);
  expect_capacity(c1, role::learner, capacity_change::snapshot, "", 1);
  REQUIRE(raw.next("coordinator.joined", "coord"));
  REQUIRE(raw.next("coordinator.joined", "coord"));  // the resumption
  CHECK_FALSE(raw.next("no such topic", "", 200ms));
  std::size_t capacity_events = 0;
  for (const auto& item : raw.seen())
    if (item.topic.rfind("capacity.", 0) == 0) ++capacity_events;
  CHECK(capacity_events == 3);  // one per worker that joined; a snapshot would not decode
}

// §12.10.5 "CAPACITY is sent like any reply (§10.4): when the connection is gone or its queue
// is full it is dropped and not retried. ... since `count` is the whole count, the next
// CAPACITY, or the snapshot after a resumption, puts right a coordinator that missed one."
TEST_CASE_METHOD(fixture, "SPEC 12.10.5: a resumption's snapshot makes up for lost reports",
                 "[spec]") {
  auto gone = std::make_unique<raw_peer>(ctx, router);
  gone->keep_capacity();
  const auto token = join(*gone, "coord", role::coordinator).session;
  gone.reset();  // the connection is cut; the session lives on
  raw_peer w(ctx, router);
  join(w, "w", role::collector);  // its increase has no live connection to go to
  raw_peer back(ctx, router);
  back.keep_capacity();
  back.send(codec::hello{role::coordinator, "coord", 30'000, {}, token});
  CHECK(next_a<codec::welcome>(back).resumed);
  expect_capacity(back, role::collector, capacity_change::snapshot, "", 1);
  expect_capacity(back, role::learner, capacity_change::snapshot, "", 0);
}

// §12.10.6 "The sessions that the stop of §11.6 ends change no count that anyone is told of:
// the broker sends no CAPACITY and publishes no `capacity.` event for them." (§11.6 checks the
// same from the coordinator's side.)
TEST_CASE("SPEC 12.10.6: the stop sends no CAPACITY", "[spec]") {
  auto b = std::make_unique<broker::server_thread>(test_config());
  zmq::context_t ctx;
  const auto router = b->get().router_endpoint();
  raw_events raw(ctx, b->get().events_endpoint());
  REQUIRE(raw.next("broker.heartbeat", ""));
  raw_peer c(ctx, router), w(ctx, router), l(ctx, router);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  join_coordinator(c, "coord");
  b->stop();
  const auto d = next_a<codec::disconnect>(c);
  CHECK(d.code == code_of(error_code::busy));
  REQUIRE(raw.next("broker.stopping", ""));
  CHECK_FALSE(raw.next("capacity.collector", "", 300ms));
  CHECK(b->get().snapshot().collectors == 1);  // as they were when the stop came
}
