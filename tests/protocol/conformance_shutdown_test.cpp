// Conformance, SPEC §11: shutdown as a drain, then a stop. An in-process broker with a drain
// timeout of its own is asked to stop (request_stop(), what a signal does) while raw DEALERs
// play a coordinator and its workers. Each test is named after the clause it checks and
// quotes it ("..." marks a cut); every wait has a deadline.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using codec::error_code;

namespace {

/// A broker that drains for `drain_ms` when asked to stop.
std::unique_ptr<broker::server_thread> draining_broker(std::uint32_t drain_ms) {
  auto cfg = test_config();
  cfg.drain_ms = drain_ms;
  return std::make_unique<broker::server_thread>(cfg);
}

/// Asks `b` to stop (the first request starts the drain) and waits until it drains.
void start_drain(broker::server_thread& b) {
  b.get().request_stop();
  REQUIRE(wait_until([&] { return b.get().snapshot().draining; }));
}

/// The reason field of a `cancelled` TASK_EVENT body.
std::string reason_of(const codec::task_event& e) {
  const auto oh = msgpack::unpack(e.body.data(), e.body.size());
  const auto& m = oh.get();
  REQUIRE(m.type == msgpack::type::MAP);
  for (std::uint32_t i = 0; i < m.via.map.size; ++i)
    if (m.via.map.ptr[i].key.as<std::string>() == "reason")
      return m.via.map.ptr[i].val.as<std::string>();
  FAIL("no reason in the event body");
  return "";
}

/// The very next message must be DISCONNECT 503.
void expect_busy_disconnect(raw_peer& p) {
  const auto d = next_a<codec::disconnect>(p);
  INFO(d.reason);
  CHECK(d.code == code_of(error_code::busy));
}

}  // namespace

// §11.1 "The first request SHALL begin the drain (§11.2). A second request during the drain
// SHALL end it at once (§11.5)."
TEST_CASE("SPEC 11.1: a second stop request ends the drain at once", "[spec]") {
  auto b = draining_broker(600'000);  // far longer than any wait below
  zmq::context_t ctx;
  const auto router = b->get().router_endpoint();
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  start_task(coord, w, task_of("t"));
  start_drain(*b);
  expect_quiet(w);  // the first request aborts nothing: the task runs on
  b->get().request_stop();
  const auto abort = next_a<codec::task_abort>(w);
  CHECK(abort.task_id == "t");
  CHECK(contains(abort.reason, "stopped again"));
  const auto cancelled = next_event(coord, "t", "cancelled");
  CHECK(reason_of(cancelled) == abort.reason);
  expect_busy_disconnect(w);
  expect_busy_disconnect(coord);
}

// §11.2 "On the first stop request the broker SHALL publish `broker.stopping` with `drain_ms` =
// the drain timeout, cancel the queued tasks (§11.3), and from then on refuse all new work: a
// HELLO that would begin a new session is refused with ERROR 503 (§8.3 rule 2) and a SUBMIT is
// answered with SUBMITTED `accepted` = false, `code` = 503 (§12.6.7)."
TEST_CASE("SPEC 11.2: the drain is announced and takes no new sessions or tasks", "[spec]") {
  auto b = draining_broker(600'000);
  zmq::context_t ctx;
  const auto router = b->get().router_endpoint();
  event_listener events(ctx, b->get().events_endpoint());
  raw_peer coord(ctx, router), w(ctx, router), late(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  start_task(coord, w, task_of("running"));  // keeps the drain going
  start_drain(*b);
  const auto stopping = events.next("broker.stopping");
  REQUIRE(stopping);
  CHECK(std::get<codec::broker_stopping>(stopping->body).drain_ms == 600'000);
  late.send(codec::hello{role::collector, "late", 1000, {}, {}});
  next_error(late, error_code::busy, ref(type_hello));
  coord.send(task_of("new"));
  const auto refused = next_a<codec::submitted>(coord);
  INFO(refused.reason);
  CHECK(refused.task_id == "new");
  CHECK_FALSE(refused.accepted);
  CHECK(refused.code == code_of(error_code::busy));
  CHECK(contains(refused.reason, "shutting down"));
  CHECK(refused.queued == 0);
  CHECK(b->get().snapshot().peers == 2);
  CHECK(b->get().snapshot().faults == 1);  // the HELLO; a refused SUBMIT is no fault (§12.4.6)
  b->get().request_stop();
}

// §11.3 "Nothing is assigned during the drain. A task that is queued when the drain begins, or
// that is re-queued during the drain because an attempt ended (§12.7.4; its `requeued` is
// emitted first), SHALL be cancelled at once: its owner gets `cancelled` (§12.5.6), reason
// `broker shutting down: queued tasks are not started`, and the task is forgotten."
TEST_CASE("SPEC 11.3: queued and re-queued tasks are cancelled by the drain", "[spec]") {
  auto b = draining_broker(600'000);
  zmq::context_t ctx;
  const auto router = b->get().router_endpoint();
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  auto first = task_of("first");
  first.max_attempts = 3;
  const auto start = start_task(coord, w, first);
  CHECK(submit_ok(coord, task_of("waiting")).queued == 0);  // no free worker: it waits
  start_drain(*b);
  const auto queued = next_event(coord, "waiting", "cancelled");
  CHECK(reason_of(queued) == "broker shutting down: queued tasks are not started");
  CHECK(queued.attempt == 0);
  CHECK(queued.worker_id.empty());
  // The running task's attempt ends with attempts left: re-queued, then cancelled, not re-run.
  w.send(codec::task_failed{"first", start.attempt, "handler raised"});
  CHECK(next_event(coord, "first", "requeued").attempt == 1);
  const auto requeued = next_event(coord, "first", "cancelled");
  CHECK(reason_of(requeued) == "broker shutting down: queued tasks are not started");
  CHECK(requeued.worker_id.empty());
  // No task is live any more, so the drain is over: the worker got no second TASK_START.
  expect_busy_disconnect(w);
  expect_busy_disconnect(coord);
}

// §11.4 "Everything else SHALL go on as before: sessions send and are answered HEARTBEAT (§9),
// expire, leave and are resumed (§8.5, §8.6); events are published; and the tasks in starting,
// running or closing follow §12 to their ends" §11.5 "The drain SHALL end as soon as no task
// is live"
TEST_CASE("SPEC 11.4: sessions and running tasks go on during the drain", "[spec]") {
  auto b = draining_broker(600'000);
  zmq::context_t ctx;
  const auto router = b->get().router_endpoint();
  event_listener events(ctx, b->get().events_endpoint());
  raw_peer coord(ctx, router), w(ctx, router), idle(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  const auto token = join(idle, "idle", role::learner).session;
  start_task(coord, w, task_of("t"));
  start_drain(*b);
  REQUIRE(events.next("broker.stopping"));
  // Heartbeats, a repeated HELLO and a resumption are all still served.
  expect_quiet(coord);
  expect_quiet(w);
  idle.send(codec::hello{role::learner, "idle", 30'000, {}, {}});
  CHECK(next_a<codec::welcome>(idle).resumed);
  raw_peer idle2(ctx, router);
  idle2.send(codec::hello{role::learner, "idle", 30'000, {}, token});
  CHECK(next_a<codec::welcome>(idle2).resumed);
  CHECK(next_a<codec::disconnect>(idle).code == code_of(error_code::replaced));
  REQUIRE(events.next("worker.joined", about("idle")));  // events are still published
  // The task runs to its end: progress, FINISH, TASK_CLOSE, RESULT.
  w.send(codec::info{"t", 1, flag_map("collector_done", true)});
  next_event(coord, "t", "info");
  coord.send(codec::finish{"t"});
  CHECK(next_a<codec::task_close>(w).task_id == "t");
  expect_quiet(coord);  // the drain waits: nothing is cancelled while the task closes
  w.send(codec::task_result{"t", 1, flag_map("collector_done", true)});
  next_event(coord, "t", "finished");
  // That was the last live task: the drain ends and everyone is told.
  expect_busy_disconnect(coord);
  expect_busy_disconnect(w);
  expect_busy_disconnect(idle2);
  CHECK(b->get().snapshot().tasks_finished == 1);
}

// §11.5 "The drain SHALL end ... when the drain timeout has passed since it began ... and not
// before. Every task still live then SHALL be cancelled: its holder gets TASK_ABORT and its
// owner `cancelled` (§12.5.6), both with the reason `broker shutting down: its drain of <n> ms
// ran out` (n the drain timeout)" §11.1 "0 makes the drain end as soon as it begins"
TEST_CASE("SPEC 11.5: tasks still running when the drain runs out are aborted", "[spec]") {
  const std::uint32_t drain_ms = GENERATE(0U, 300U);
  INFO("drain " << drain_ms << " ms");
  auto b = draining_broker(drain_ms);
  zmq::context_t ctx;
  const auto router = b->get().router_endpoint();
  raw_peer coord(ctx, router), w(ctx, router), learner(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(learner, "l", role::learner);
  start_task(coord, w, task_of("stuck"));
  submit_ok(coord, task_of("learning", role::learner));
  CHECK(next_a<codec::task_start>(learner).attempt == 1);
  next_event(coord, "learning", "assigned");  // starting, never STARTED: live all the same
  const auto t0 = std::chrono::steady_clock::now();
  b->get().request_stop();
  const auto reason =
      "broker shutting down: its drain of " + std::to_string(drain_ms) + " ms ran out";
  const auto abort = next_a<codec::task_abort>(w, 5000ms);
  CHECK(since(t0) >= std::chrono::milliseconds(drain_ms));
  CHECK(abort.task_id == "stuck");
  CHECK(abort.attempt == 1);
  CHECK(abort.reason == reason);
  CHECK(next_a<codec::task_abort>(learner).reason == reason);
  // In submission order, each with its attempt and holder.
  const auto stuck = next_event(coord, "stuck", "cancelled");
  CHECK(stuck.attempt == 1);
  CHECK(stuck.worker_id == "w");
  CHECK(reason_of(stuck) == reason);
  CHECK(next_event(coord, "learning", "cancelled").worker_id == "l");
  expect_busy_disconnect(coord);
}

// §11.6 "The broker SHALL then send DISCONNECT 503 (BUSY) to every live session (best effort),
// each after the messages of §11.5 for the same connection ... and exit with status 0. No
// `*.left`, `*.lost` or `capacity.*` events are published and no CAPACITY is sent for the
// sessions it ends this way."
TEST_CASE("SPEC 11.6: the stop says DISCONNECT 503 to every peer and nothing else", "[spec]") {
  auto b = std::make_unique<broker::server_thread>(test_config());
  zmq::context_t ctx;
  event_listener events(ctx, b->get().events_endpoint());
  raw_peer p1(ctx, b->get().router_endpoint()), p2(ctx, b->get().router_endpoint());
  p1.introduce("s1");
  p2.keep_capacity();
  p2.introduce("s2", role::coordinator);
  // The coordinator's snapshot (§12.10.4): one collector, no learner.
  CHECK(next_a<codec::capacity>(p2).count == 1);
  CHECK(next_a<codec::capacity>(p2).count == 0);
  b->stop();
  expect_busy_disconnect(p1);
  expect_busy_disconnect(p2);  // the very next message: no CAPACITY before it
  const auto stopping = events.next("broker.stopping");
  REQUIRE(stopping);
  CHECK(std::get<codec::broker_stopping>(stopping->body).drain_ms == 0);
  CHECK_FALSE(events.next("no such topic", 300ms));  // collect whatever else was published
  bool after_stop = false;
  for (const auto& e : events.seen()) {
    INFO(e.topic);
    CHECK(e.topic.find(".left") == std::string::npos);
    CHECK(e.topic.find(".lost") == std::string::npos);
    if (after_stop) CHECK(e.topic.rfind("capacity.", 0) != 0);
    after_stop = after_stop || e.topic == "broker.stopping";
  }
}
