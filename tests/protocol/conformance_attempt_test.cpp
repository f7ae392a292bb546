// Conformance, the life and end of an attempt and of a task's wait for one: TASK_ALIVE
// moving an attempt's deadlines (§12.3.19), the worker's account of a failure in TASK_FAILED's
// result reaching the coordinator (§12.3.18), and the queue timeout that fails a task no
// worker takes (§12.7.6). Each test is named after the clause it checks and quotes it ("..."
// marks a cut); every wait has a deadline, and the only sleeps pace a sender.
#include <catch2/catch.hpp>

#include <string>
#include <thread>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using namespace std::string_literals;
using codec::error_code;

namespace {

/// Sends TASK_ALIVE for `task_id` attempt 1 every 40 ms for `span` and reads nothing meanwhile
/// (a round trip per keep-alive would space them by the machine's speed). Returns when the
/// last one left: a deadline it moved runs from no earlier than that.
std::chrono::steady_clock::time_point keep_alive_for(raw_peer& worker, const std::string& task_id,
                                                     std::chrono::milliseconds span) {
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  while (since(t0) < span) {
    last = std::chrono::steady_clock::now();
    worker.send(codec::task_alive{task_id, 1});
    std::this_thread::sleep_for(40ms);  // pacing the sender, not waiting for an outcome
  }
  return last;
}

/// Sends HEARTBEATs (which do not count) until TASK_ABORT comes; returns it.
codec::task_abort abort_of(raw_peer& worker) {
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<codec::task_abort> abort;
  while (!abort && since(t0) < 5000ms) {
    worker.send(codec::heartbeat{});
    for (auto m = worker.recv(40ms); m && !abort; m = worker.recv(1ms))
      if (auto* a = std::get_if<codec::task_abort>(&*m)) abort = *a;
  }
  REQUIRE(abort);
  return *abort;
}

/// {"reason": reason, "attempt": attempt, "result": <result's bytes>} (§12.5.6).
std::string reason_result_body(const std::string& reason, std::uint64_t attempt,
                               const std::string& result) {
  return packed([&](packer& pk) {
           pk.pack_map(3);
           pk.pack("reason").pack(reason);
           pk.pack("attempt").pack(attempt);
           pk.pack("result");
         }) +
         result;
}

}  // namespace

// §12.3.18 "`result` is the worker's own account of the failure for its coordinator ...: the
// broker forwards it byte for byte in the `requeued` or `failed` TASK_EVENT that the end of the
// attempt emits (§12.5.6)"; §12.5.6 "then `result` (the TASK_FAILED's, byte for byte) only when
// a TASK_FAILED carrying one ended the attempt"
TEST_CASE_METHOD(fixture, "SPEC 12.3.18: TASK_FAILED's result reaches requeued and failed",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::learner);
  auto s = task_of("t", role::learner);
  s.max_attempts = 3;
  start_task(coord, w, s);
  // In running: the result comes with `requeued`, its bytes as sent.
  w.send(codec::task_failed{"t", 1, "loss is NaN", odd_map()});
  CHECK(next_event(coord, "t", "requeued").body ==
        reason_result_body("worker reported: loss is NaN", 1, odd_map()));
  // In starting, without a result: the body is as before, two keys.
  CHECK(next_a<codec::task_start>(w).attempt == 2);
  next_event(coord, "t", "assigned");
  w.send(codec::task_failed{"t", 2, "no GPU"});
  const auto plain = next_event(coord, "t", "requeued").body;
  check_canonical(plain, {"reason", "attempt"});
  // The last attempt: the result comes with `failed`.
  CHECK(next_a<codec::task_start>(w).attempt == 3);
  next_event(coord, "t", "assigned");
  const auto empty = "\x80"s;
  w.send(codec::task_failed{"t", 3, "gave up", empty});
  CHECK(next_event(coord, "t", "failed").body ==
        reason_result_body("worker reported: gave up", 3, empty));
}

// §12.3.18 "| 4 | `result` | map (opaque) | optional |"; §12.2.3 "`result` MUST be a map; any
// other value, nil included, is refused with 402"; §12.5.4 a refused message changes nothing.
TEST_CASE_METHOD(fixture, "SPEC 12.3.18: a TASK_FAILED result that is not a map gets 402",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  start_task(coord, w, task_of("t"));
  for (const auto& bad : {"\xc0"s, "\x92\x01\x02"s, "\xa1x"s}) {
    refused(w, codec::task_failed{"t", 1, "x", bad}, error_code::bad_field);
  }
  expect_quiet(coord);  // nothing ended
  w.send(codec::info{"t", 1, codec::empty_map_blob});
  next_event(coord, "t", "info");
}

// §12.3.19 "An accepted one SHALL set the attempt's deadline anew: while starting, start timeout
// from now; while running, step timeout from now (§12.7.1). ... the broker answers nothing and
// emits no TASK_EVENT for it."
TEST_CASE_METHOD(fixture, "SPEC 12.3.19: TASK_ALIVE moves the start and the step deadline",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), l(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  // Keep-alives 40 ms apart hold it: only a stall of the test longer than 360 ms would not.
  const auto timeout = 400ms;
  for (auto* worker : {&w, &l}) {
    const auto kind = worker == &w ? role::collector : role::learner;
    const std::string id = worker == &w ? "c" : "L";
    INFO("task " << id);
    auto s = task_of(id, kind);
    s.start_timeout_ms = static_cast<std::uint32_t>(timeout.count());
    s.step_timeout_ms = static_cast<std::uint32_t>(timeout.count());
    s.max_attempts = 1;
    submit_ok(coord, s);
    CHECK(next_a<codec::task_start>(*worker).task_id == id);
    next_event(coord, id, "assigned");
    // Starting for three start timeouts, alive all along: the attempt lives on (its
    // `started` is the coordinator's very next event, not `failed`).
    keep_alive_for(*worker, id, 3 * timeout);
    worker->send(codec::started{id, 1});
    next_event(coord, id, "started");
    // Running for three step timeouts, alive all along. Then silence: the step deadline
    // ends the attempt, a whole step timeout after the last keep-alive left, and `failed` is
    // the coordinator's very next event (no event for the keep-alives).
    const auto last = keep_alive_for(*worker, id, 3 * timeout);
    const auto abort = abort_of(*worker);
    CHECK(since(last) >= timeout);
    CHECK(abort.reason == "step timeout");
    next_event(coord, id, "failed");
    expect_quiet(coord);
  }
}

// §12.3.19 "It never extends the task timeout, which still caps every deadline"
TEST_CASE_METHOD(fixture, "SPEC 12.3.19: TASK_ALIVE never extends the task timeout", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  auto s = task_of("t");
  s.task_timeout_ms = 400;
  s.max_attempts = 1;
  const auto t0 = std::chrono::steady_clock::now();
  submit_ok(coord, s);
  next_a<codec::task_start>(w);
  next_event(coord, "t", "assigned");
  std::optional<codec::task_abort> abort;
  while (!abort && since(t0) < 5000ms) {
    w.send(codec::task_alive{"t", 1});
    for (auto m = w.recv(30ms); m && !abort; m = w.recv(1ms))
      if (auto* a = std::get_if<codec::task_abort>(&*m)) abort = *a;
  }
  REQUIRE(abort);
  CHECK(since(t0) >= 400ms);
  CHECK(abort->reason == "task timeout");
  next_event(coord, "t", "failed");
}

// §12.3.19 "TASK_ALIVE is fenced like every worker message (§12.7.5)"; §12.1.3 a worker
// message from a coordinator is refused with 404.
TEST_CASE_METHOD(fixture, "SPEC 12.3.19: TASK_ALIVE is fenced like every worker message",
                 "[spec]") {
  raw_peer coord(ctx, router), w1(ctx, router), w2(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w1, "w1", role::collector);
  refused(coord, codec::task_alive{"t", 1}, error_code::unknown_type);
  refused(w1, codec::task_alive{"t", 1}, error_code::unknown_task);  // not live
  auto s = task_of("t");
  s.max_attempts = 2;
  start_task(coord, w1, s);
  refused(w1, codec::task_alive{"t", 2}, error_code::unknown_task);  // a later attempt
  join(w2, "w2", role::collector);
  refused(w2, codec::task_alive{"t", 1}, error_code::unknown_task);  // not its attempt
  w1.send(codec::task_failed{"t", 1, "x"});
  next_event(coord, "t", "requeued");
  CHECK(next_a<codec::task_start>(w2).attempt == 2);
  next_event(coord, "t", "assigned");
  refused(w1, codec::task_alive{"t", 1}, error_code::stale_attempt);  // an ended attempt
  refused(w1, codec::task_alive{"t", 2}, error_code::unknown_task);   // runs on w2
  w2.send(codec::task_alive{"t", 2});
  expect_quiet(w2);
  expect_quiet(coord);
}

// §12.3.19 "While the task is closing it is refused with 408 like other progress, and that
// refusal is no strike (§12.5.5)."
TEST_CASE("SPEC 12.3.19: TASK_ALIVE while closing gets 408 and is no strike", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 2;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  start_task(coord, w, task_of("t"));
  coord.send(codec::finish{"t"});
  next_a<codec::task_close>(w);
  for (int i = 0; i < 4; ++i) refused(w, codec::task_alive{"t", 1}, error_code::wrong_state);
  expect_quiet(w);  // still in session past max-faults 2
  w.send(codec::task_result{"t", 1, codec::empty_map_blob});
  next_event(coord, "t", "finished");
}

// §12.3.1 "| 11 | `queue_timeout_ms` | uint | optional | 1..86400000 (§12.7.6) |"
TEST_CASE_METHOD(fixture, "SPEC 12.3.1: queue_timeout_ms is 1..86400000", "[spec]") {
  raw_peer coord(ctx, router);
  join(coord, "coord", role::coordinator);
  for (const std::uint32_t bad : {0U, 86'400'001U}) {
    auto s = task_of("t");
    s.queue_timeout_ms = bad;
    refused(coord, s, error_code::bad_field);
  }
  auto s = task_of("t");
  s.queue_timeout_ms = 86'400'000;
  submit_ok(coord, s);
}

// §12.7.6 "A task that has waited in the queue ... longer than its queue timeout SHALL fail:
// `failed` is emitted with the reason `no worker took the task within queue_timeout_ms=<n>`,
// the attempt that ended last (0 if none) and an empty `worker_id`, and the task is forgotten;
// its id is free."
TEST_CASE_METHOD(fixture, "SPEC 12.7.6: a task no worker takes within its queue timeout fails",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  auto s = task_of("t");
  s.queue_timeout_ms = 200;
  s.max_attempts = 3;
  const auto t0 = std::chrono::steady_clock::now();
  submit_ok(coord, s);
  const auto failed = next_event(coord, "t", "failed", 5000ms);
  CHECK(since(t0) >= 200ms);
  CHECK(failed.attempt == 0);
  CHECK(failed.worker_id.empty());
  CHECK(failed.body == reason_body("no worker took the task within queue_timeout_ms=200", 0));
  // Forgotten: the id is free, and a worker that comes now gets nothing of it.
  auto again = task_of("t");
  again.queue_timeout_ms = 60'000;
  submit_ok(coord, again);
  join(w, "w", role::collector);
  CHECK(next_a<codec::task_start>(w).task_id == "t");
}

// §12.7.6 "The wait is counted from the moment the task is queued, and again from each
// re-queue (§12.7.4); an assigned task is not bounded by it"
TEST_CASE_METHOD(fixture, "SPEC 12.7.6: the queue timeout restarts with each re-queue", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  auto s = task_of("t");
  s.queue_timeout_ms = 250;
  s.max_attempts = 3;
  start_task(coord, w, s);
  // Running for longer than the queue timeout does not end it.
  const auto t0 = std::chrono::steady_clock::now();
  while (since(t0) < 400ms) {
    w.send(codec::info{"t", 1, codec::empty_map_blob});
    next_event(coord, "t", "info");
    std::this_thread::sleep_for(40ms);  // pacing the sender, not waiting for an outcome
  }
  // Its worker goes: re-queued, with no worker to take it; the clock starts now.
  w.send(codec::disconnect{200, "bye"});
  next_event(coord, "t", "requeued");
  const auto t1 = std::chrono::steady_clock::now();
  const auto failed = next_event(coord, "t", "failed", 5000ms);
  CHECK(since(t1) >= 250ms - 20ms);  // queued a moment before `t1`
  CHECK(failed.attempt == 1);
  CHECK(failed.worker_id.empty());
  CHECK(failed.body == reason_body("no worker took the task within queue_timeout_ms=250", 1));
}

// §12.7.6 "A task whose SUBMIT has no `queue_timeout_ms` takes the broker's queue-timeout
// setting (§1.4; 0, the default, bounds nothing)."
TEST_CASE("SPEC 12.7.6: the broker's --queue-timeout-ms applies when SUBMIT names none", "[spec]") {
  auto cfg = test_config();
  cfg.queue_timeout_ms = 150;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  auto own = task_of("own");
  own.queue_timeout_ms = 60'000;
  submit_ok(coord, task_of("default"));
  submit_ok(coord, own);
  CHECK(next_event(coord, "default", "failed", 5000ms).body ==
        reason_body("no worker took the task within queue_timeout_ms=150", 0));
  join(w, "w", role::collector);
  CHECK(next_a<codec::task_start>(w).task_id == "own");  // still queued
}
