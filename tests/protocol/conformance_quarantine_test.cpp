// Conformance, SPEC §12.6.9: a worker whose attempts keep ending through it is quarantined:
// no task for a while, a `worker.quarantined` event, back in service when it runs out. Run
// against the real broker over tcp with raw DEALERs playing a coordinator and its workers.
// Each test is named after the clause it checks and quotes it ("..." marks a cut); every
// wait has a deadline.
#include <catch2/catch.hpp>

#include <string>

#include "protocol/conformance.hpp"
#include "util/clock.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using namespace std::string_literals;

namespace {

constexpr auto quarantine_for = 400ms;

/// A broker that quarantines a worker after 2 bad ends in a row, for 400 ms.
broker::config quarantining() {
  auto cfg = test_config();
  cfg.quarantine_after = 2;
  cfg.quarantine_ms = static_cast<std::uint32_t>(quarantine_for.count());
  return cfg;
}

codec::submit attempts(std::string id, std::uint32_t n) {
  auto s = task_of(std::move(id));
  s.max_attempts = n;
  return s;
}

/// `w` takes the next TASK_START, starts it and fails it (TASK_FAILED `why`).
codec::task_start take_and_fail(raw_peer& coord, raw_peer& w, const std::string& why) {
  const auto start = next_a<codec::task_start>(w);
  next_event(coord, start.task_id, "assigned");
  w.send(codec::started{start.task_id, start.attempt});
  next_event(coord, start.task_id, "started");
  w.send(codec::task_failed{start.task_id, start.attempt, why, std::nullopt});
  return start;
}

}  // namespace

// §12.6.9 "When the count reaches quarantine-after ... the worker is in quarantine for
// quarantine-ms ... the broker SHALL publish `worker.quarantined` ... While in quarantine the
// worker keeps its session ... but is not assigned a task ...; when the quarantine ends, the
// queue is tried again." §7.5 quarantine: id, role, failures, quarantine_ms, reason.
TEST_CASE("SPEC 12.6.9: failing attempts in a row quarantine a worker, then it is back", "[spec]") {
  broker_with b(quarantining());
  raw_events events(b.ctx, b.broker.get().events_endpoint());
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  submit_ok(coord, attempts("t", 3));
  take_and_fail(coord, w, "env crashed");
  next_event(coord, "t", "requeued");
  // The quarantine runs from when the broker read the failure, which is after this.
  const auto failing = std::chrono::steady_clock::now();
  take_and_fail(coord, w, "env crashed again");  // the only worker: it gets the task again
  next_event(coord, "t", "requeued");
  const auto q = events.next("worker.quarantined", "w");
  REQUIRE(q);
  const auto& body = std::get<codec::worker_quarantine>(q->body);
  CHECK(body.role == role::collector);
  CHECK(body.failures == 2);
  CHECK(body.quarantine_ms == static_cast<std::uint64_t>(quarantine_for.count()));
  CHECK(body.reason == "worker reported: env crashed again");
  // Its session goes on (heartbeats are answered), but the task waits for the quarantine.
  expect_quiet(w);
  const auto start = next_a<codec::task_start>(w, 3000ms);
  CHECK(std::chrono::steady_clock::now() - failing >= quarantine_for);  // not before it ran out
  CHECK(start.attempt == 3);
  w.send(codec::started{"t", 3});
  CHECK(b.broker.get().snapshot().quarantines == 1);
}

// §12.6.9 "An attempt that ends otherwise (CANCEL, its owner's end, a drain) leaves the count
// as it is: a coordinator's cancels never quarantine a worker." "A RESULT it accepts from the
// worker sets the count to 0."
TEST_CASE("SPEC 12.6.9: cancels never quarantine a worker, a RESULT clears its count", "[spec]") {
  broker_with b(quarantining());
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  for (int i = 0; i < 3; ++i) {
    const auto id = "c" + std::to_string(i);
    start_task(coord, w, task_of(id));
    coord.send(codec::cancel{id, "enough"});
    next_event(coord, id, "cancelled");
    next_a<codec::task_abort>(w);
  }
  // fail, succeed, fail: never two in a row
  submit_ok(coord, attempts("f1", 1));
  take_and_fail(coord, w, "broke");
  next_event(coord, "f1", "failed");
  start_task(coord, w, task_of("ok"));
  w.send(codec::info{"ok", 1, codec::empty_map_blob});
  next_event(coord, "ok", "info");
  coord.send(codec::finish{"ok"});
  next_a<codec::task_close>(w);
  w.send(codec::task_result{"ok", 1, codec::empty_map_blob});
  next_event(coord, "ok", "finished");
  submit_ok(coord, attempts("f2", 1));
  take_and_fail(coord, w, "broke");
  next_event(coord, "f2", "failed");
  // still in service: the next task starts at once
  start_task(coord, w, task_of("next"));
  CHECK(b.broker.get().snapshot().quarantines == 0);
}

// §12.6.9 "... or the end of the worker's session while it held the attempt ... The count
// belongs to the id, not to a session: a worker process that restarts under the same id
// keeps it."
TEST_CASE("SPEC 12.6.9: a worker that dies with its task, again and again, is quarantined",
          "[spec]") {
  auto cfg = quarantining();
  broker_with b(cfg);
  raw_events events(b.ctx, b.broker.get().events_endpoint());
  raw_peer coord(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  submit_ok(coord, attempts("t", 5));
  auto failing = std::chrono::steady_clock::now();  // the last loss: the quarantine runs after it
  for (std::uint32_t life = 1; life <= 2; ++life) {
    raw_peer w(b.ctx, b.router);
    join(w, "w", role::collector);
    const auto start = next_a<codec::task_start>(w);
    CHECK(start.attempt == life);
    next_event(coord, "t", "assigned");
    failing = std::chrono::steady_clock::now();
    w.send(codec::disconnect{500, "crashed"});  // gone while it holds the attempt
    next_event(coord, "t", "requeued");
  }
  const auto q = events.next("worker.quarantined", "w");
  REQUIRE(q);
  CHECK(std::get<codec::worker_quarantine>(q->body).reason == "worker w lost");
  // A third process under the same id waits the quarantine out before it gets the task.
  raw_peer w(b.ctx, b.router);
  join(w, "w", role::collector);
  expect_quiet(w);
  const auto start = next_a<codec::task_start>(w, 3000ms);
  CHECK(start.attempt == 3);
  CHECK(std::chrono::steady_clock::now() - failing >= quarantine_for);  // not before it ran out
}

// §12.6.10 "A worker that sent LEAVING ... the broker SHALL NOT assign it a task again ...
// When that end passes the broker SHALL send the worker TASK_ABORT and end the attempt with
// the reason `worker <id> leaving`, at once rather than after the liveness window ... does
// not count toward quarantine". §12.3.20 "From a coordinator it SHALL be refused with 404".
TEST_CASE("SPEC 12.6.10: a leaving worker gets no new task, and its task comes back in time",
          "[spec]") {
  auto cfg = quarantining();
  cfg.quarantine_after = 1;  // any bad end would quarantine: leaving is none
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router), spare(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  coord.send(codec::leaving{0});
  next_error(coord, codec::error_code::unknown_type, ref(0x39));
  join(w, "w", role::collector);
  start_task(coord, w, attempts("t", 3));
  w.send(codec::leaving{300});
  expect_quiet(w);  // answered with nothing
  const auto said = std::chrono::steady_clock::now();
  join(spare, "spare", role::collector);  // joins after: the task goes to it, not back to w
  const auto abort = next_a<codec::task_abort>(w, 3000ms);
  CHECK(since(said) >= 250ms);  // not before the deadline it gave (less the timer's slack)
  CHECK(abort.reason == "worker w leaving");
  const auto requeued = next_event(coord, "t", "requeued");
  CHECK(requeued.body.find("worker w leaving") != std::string::npos);
  next_event(coord, "t", "assigned");
  const auto start = next_a<codec::task_start>(spare);
  CHECK(start.attempt == 2);
  // w is never given a task again in this session, and was not quarantined
  spare.send(codec::task_failed{"t", 2, "no", std::nullopt});
  next_event(coord, "t", "requeued");  // spare's bad end: spare is quarantined (after 1) ...
  expect_quiet(w);                     // ... and w, free and not quarantined, still gets none
  CHECK(b.broker.get().snapshot().quarantines == 1);
  // a LEAVING of 0 hands the task back at once; a leaving worker's session end is no failure
  raw_peer w2(b.ctx, b.router);
  join(w2, "w2", role::collector);
  next_a<codec::task_start>(w2);
  next_event(coord, "t", "assigned");
  w2.send(codec::leaving{0});
  CHECK(next_a<codec::task_abort>(w2).reason == "worker w2 leaving");
  CHECK(b.broker.get().snapshot().quarantines == 1);
}
