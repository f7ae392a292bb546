// Conformance, SPEC §12: task messages, the task state machine, assignment, timeouts and
// attempts, and the coordinator's stream, run against the real broker over tcp with raw
// DEALERs playing a coordinator and its workers. Each test is named after the clause it checks
// and quotes it verbatim ("..." marks a cut). Timeouts are set short per SUBMIT or per broker,
// and every wait has a deadline.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using namespace std::string_literals;
using codec::error_code;

namespace {

/// An array, likewise: [int8 5, float64 2.0].
std::string odd_array() {
  return "\x92\xd0\x05"s + float64(2.0);
}

}  // namespace

// ---- §12.1 Overview -------------------------------------------------------------------------

// §12.1.2 "a worker MUST put in every message about a task the attempt of the TASK_START it is
// running. The broker SHALL accept a worker message only for the task's current attempt
// (§12.4.2)."
TEST_CASE_METHOD(fixture, "SPEC 12.1.2: a worker message counts only at the task's current attempt",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  auto s = task_of("t");
  s.max_attempts = 2;
  CHECK(start_task(coord, w, s).attempt == 1);
  w.send(codec::task_failed{"t", 1, "handler raised"});
  next_event(coord, "t", "requeued");
  // The only worker runs the next attempt too; only its number tells the two apart.
  const auto second = next_a<codec::task_start>(w);
  CHECK(second.attempt == 2);
  next_event(coord, "t", "assigned");
  refused(w, codec::started{"t", 1}, error_code::stale_attempt);
  w.send(codec::started{"t", 2});
  CHECK(next_event(coord, "t", "started").attempt == 2);
}

// §12.1.3 "Task messages travel on the ROUTER endpoint and obey §3, §5 and §10 like every other
// message: before WELCOME they are refused with 403 (§8.2), and one that only the broker sends
// is refused with 404 (§3.5.2). ... A coordinator message (SUBMIT, FINISH, CANCEL, DATA_REPLY)
// from a worker, or a worker message from a coordinator, SHALL be refused with ERROR 404 like a
// type not meant for the sender"
TEST_CASE_METHOD(fixture, "SPEC 12.1.3: task messages obey the session rules and the roles",
                 "[spec]") {
  raw_peer stranger(ctx, router), coord(ctx, router), w(ctx, router);
  refused(stranger, task_of("t"), error_code::not_ready);
  refused(stranger, codec::started{"t", 1}, error_code::not_ready);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::learner);
  // Coordinator messages from a worker.
  refused(w, task_of("t"), error_code::unknown_type);
  refused(w, codec::finish{"t"}, error_code::unknown_type);
  refused(w, codec::cancel{"t", "no"}, error_code::unknown_type);
  refused(w, codec::data_reply{"t", 1, codec::nil_blob}, error_code::unknown_type);
  // Worker messages from a coordinator.
  refused(coord, codec::started{"t", 1}, error_code::unknown_type);
  refused(coord, codec::data_ready{"t", 1, "d", "b", codec::empty_map_blob, std::nullopt},
          error_code::unknown_type);
  refused(coord, codec::info{"t", 1, codec::empty_map_blob}, error_code::unknown_type);
  refused(coord, codec::get_data{"t", 1, 1, "b", 1, 0}, error_code::unknown_type);
  refused(coord, codec::learn_info{"t", 1, "b", codec::empty_map_blob}, error_code::unknown_type);
  refused(coord, codec::task_result{"t", 1, codec::empty_map_blob}, error_code::unknown_type);
  refused(coord, codec::task_failed{"t", 1, "x"}, error_code::unknown_type);
  // Messages only the broker sends, from either.
  refused(coord, codec::submitted{"t", true, 0, "", 0}, error_code::unknown_type);
  refused(coord, codec::task_event{1, "t", 0, "info", "", codec::empty_map_blob},
          error_code::unknown_type);
  refused(w, codec::task_start{"t", 1, role::learner, codec::empty_map_blob},
          error_code::unknown_type);
  refused(w, codec::task_close{"t", 1}, error_code::unknown_type);
  refused(w, codec::learn{"t", 1, 1, codec::nil_blob}, error_code::unknown_type);
  refused(w, codec::no_data{"t", 1, 1, 10}, error_code::unknown_type);
  refused(w, codec::task_abort{"t", 1, "x"}, error_code::unknown_type);
  // None of it created a task: the id is free.
  CHECK(submit_ok(coord, task_of("t", role::learner)).queued == 0);
  CHECK(next_a<codec::task_start>(w).task_id == "t");
}

// ---- §12.2 Field rules ------------------------------------------------------------------------

// §12.2.1 "`task_id` follows the peer id rule (§4.1.2): 1 to 128 characters of
// `A-Z a-z 0-9 . _ : @ / -`."
TEST_CASE_METHOD(fixture, "SPEC 12.2.1: task ids follow the peer id rule", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  for (const auto& bad : {""s, "bad id!"s, std::string(129, 'x'), "caf\xc3\xa9"s}) {
    INFO("task id '" << bad << "'");
    refused(coord, task_of(bad), error_code::bad_field);
  }
  refused(coord, codec::finish{"no such"}, error_code::bad_field);
  refused(w, codec::started{"sp ace", 1}, error_code::bad_field);
  submit_ok(coord, task_of(std::string(128, 'x'), role::learner));
  submit_ok(coord, task_of("AZ.az_09:@/-", role::learner));
}

// §12.2.2 "`attempt` is a uint 1..1000 in every message between broker and worker (§12.1.2);
// `max_attempts` in SUBMIT has the same range."
TEST_CASE_METHOD(fixture, "SPEC 12.2.2: attempts and max_attempts are 1..1000", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::learner);
  refused(w, codec::started{"t", 0}, error_code::bad_field);
  refused(w, codec::started{"t", 1001}, error_code::bad_field);
  refused(w, codec::task_failed{"t", 0, "x"}, error_code::bad_field);
  auto s = task_of("t");  // a collector task: the learner never takes it
  for (const std::uint32_t bad : {0U, 1001U}) {
    s.max_attempts = bad;
    refused(coord, s, error_code::bad_field);
  }
  s.max_attempts = 1000;
  submit_ok(coord, s);
  // In range, so the field checks pass and the task rules answer (§12.7.5).
  refused(w, codec::started{"t", 1000}, error_code::unknown_task);
}

// §12.2.3 "`task_info`, `meta`, `info` and `result` MUST be maps; any other value, nil included,
// is refused with 402. `data` and `body` MAY be any value; nil there is a value, not an absent
// field."
TEST_CASE_METHOD(fixture, "SPEC 12.2.3: user data is a map where the spec says so", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), l(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  for (const auto& bad : {codec::nil_blob, "\x91\x01"s, "\xa1x"s}) {
    auto s = task_of("t");
    s.task_info = bad;
    refused(coord, s, error_code::bad_field);
  }
  refused(w, codec::data_ready{"t", 1, "d", "b", codec::nil_blob, std::nullopt},
          error_code::bad_field);
  refused(w, codec::info{"t", 1, "\x91\x01"s}, error_code::bad_field);
  refused(w, codec::task_result{"t", 1, codec::nil_blob}, error_code::bad_field);
  refused(l, codec::learn_info{"t", 1, "b", "\x05"s}, error_code::bad_field);
  // `data` may be anything, nil included.
  const auto start = start_task(coord, l, task_of("lt", role::learner));
  std::uint64_t request = 0;
  for (const auto& data : {"\x05"s, odd_array(), "\xa3yes"s}) {
    l.send(codec::get_data{"lt", start.attempt, ++request, "b", 8, 0});
    next_event(coord, "lt", "data_request");
    coord.send(codec::data_reply{"lt", request, data});
    const auto learn = next_a<codec::learn>(l);
    CHECK(learn.request_id == request);
    CHECK(learn.data == data);
  }
  l.send(codec::get_data{"lt", start.attempt, ++request, "b", 8, 0});
  next_event(coord, "lt", "data_request");
  coord.send(codec::data_reply{"lt", request, codec::nil_blob});
  CHECK(next_a<codec::no_data>(l).request_id == request);
}

// §12.2.3 "User data MUST be forwarded byte for byte: whenever the broker passes user data on
// (`task_info` from SUBMIT to TASK_START, `data` from DATA_REPLY to LEARN, a worker's user data
// in a TASK_EVENT `body`), it SHALL send exactly the bytes it received, never decoded and
// re-encoded, so a whole float64 stays float64 and a map keeps its order."
TEST_CASE_METHOD(fixture, "SPEC 12.2.3: user data is forwarded byte for byte", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), l(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  const auto odd = odd_map();
  const auto body_of = [](const std::string& raw, std::uint8_t type) {
    auto m = codec::decode_body(type, raw);
    REQUIRE(m);
    return std::move(m).value();
  };

  auto s = task_of("ct");
  s.task_info = odd;
  submit_ok(coord, s);
  const auto start_raw = next_body(w, type_task_start);
  CHECK(contains(start_raw, odd));
  CHECK(std::get<codec::task_start>(body_of(start_raw, type_task_start)).task_info == odd);
  next_event(coord, "ct", "assigned");
  w.send(codec::started{"ct", 1});
  next_event(coord, "ct", "started");
  w.send(codec::data_ready{"ct", 1, "d0", "b", odd, std::nullopt});
  CHECK(contains(next_body(coord, type_task_event), odd));
  w.send(codec::info{"ct", 1, odd});
  const auto info_raw = next_body(coord, type_task_event);
  CHECK(std::get<codec::task_event>(body_of(info_raw, type_task_event)).body == odd);
  coord.send(codec::finish{"ct"});
  next_a<codec::task_close>(w);
  w.send(codec::task_result{"ct", 1, odd});
  const auto done_raw = next_body(coord, type_task_event);
  CHECK(std::get<codec::task_event>(body_of(done_raw, type_task_event)).body == odd);

  auto ls = task_of("lt", role::learner);
  ls.task_info = odd;
  submit_ok(coord, ls);
  CHECK(contains(next_body(l, type_task_start), odd));
  next_event(coord, "lt", "assigned");
  l.send(codec::started{"lt", 1});
  next_event(coord, "lt", "started");
  l.send(codec::get_data{"lt", 1, 7, "b", 8, 0});
  next_event(coord, "lt", "data_request");
  coord.send(codec::data_reply{"lt", 7, odd_array()});
  const auto learn_raw = next_body(l, type_learn);
  CHECK(contains(learn_raw, odd_array()));
  CHECK(std::get<codec::learn>(body_of(learn_raw, type_learn)).data == odd_array());
  l.send(codec::learn_info{"lt", 1, "b", odd});
  CHECK(contains(next_body(coord, type_task_event), odd));
}

// §12.2.4 "`start_timeout_ms`, `step_timeout_ms`, `close_timeout_ms` and `task_timeout_ms` are
// optional uints 1..86400000 (one day), in milliseconds."
TEST_CASE_METHOD(fixture, "SPEC 12.2.4: timeouts are 1..86400000 ms", "[spec]") {
  raw_peer coord(ctx, router);
  join(coord, "coord", role::coordinator);
  using field = std::optional<std::uint32_t> codec::submit::*;
  for (const field f : {&codec::submit::start_timeout_ms, &codec::submit::step_timeout_ms,
                        &codec::submit::close_timeout_ms, &codec::submit::task_timeout_ms}) {
    for (const std::uint32_t bad : {0U, 86'400'001U}) {
      auto s = task_of("t");
      s.*f = bad;
      refused(coord, s, error_code::bad_field);
    }
  }
  auto s = task_of("t1");
  s.start_timeout_ms = s.step_timeout_ms = s.close_timeout_ms = s.task_timeout_ms = 86'400'000;
  submit_ok(coord, s);
  s.task_id = "t2";
  s.start_timeout_ms = s.step_timeout_ms = s.close_timeout_ms = s.task_timeout_ms = 1;
  submit_ok(coord, s);
}

// §12.2.5 "`kind` is a str matched like `role` in HELLO (§4.1.1): `collector` or `learner` ...
// Any other value, `coordinator` included, is refused with 402." "`requirements` follows the
// resources rule (§4.1.4) ... an absent field reads as the empty map." "`reason` is a str of
// 0..1024 bytes ... `data_id` and `buffer_id` strs of 0..256 bytes" "`payload` is an optional
// msgpack bin (a str is refused with 402)."
TEST_CASE_METHOD(fixture, "SPEC 12.2.5: kind, requirements, texts and payload", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  refused(coord, task_of("t", role::coordinator), error_code::bad_field);
  const auto submit_kind = [](std::string_view kind) {
    return packed([&](packer& pk) {
      pk.pack_map(3);
      pk.pack("task_id").pack("t");
      pk.pack("kind").pack(kind);
      pk.pack("task_info").pack_map(0);
    });
  };
  for (const auto* kind : {"Collector", "trainer", ""}) {
    coord.send_frames({header(1, type_submit), submit_kind(kind)});
    next_error(coord, error_code::bad_field, ref(type_submit));
  }
  refused(coord, task_of("t", role::collector, {{"gpu", -1}}), error_code::bad_field);
  refused(coord, codec::cancel{"t", std::string(1025, 'r')}, error_code::bad_field);
  refused(w, codec::data_ready{"t", 1, std::string(257, 'd'), "b", codec::empty_map_blob, {}},
          error_code::bad_field);
  refused(w, codec::data_ready{"t", 1, "d", std::string(257, 'b'), codec::empty_map_blob, {}},
          error_code::bad_field);
  w.send_frames({header(1, type_data), packed([](packer& pk) {
                   pk.pack_map(6);
                   pk.pack("task_id").pack("t");
                   pk.pack("attempt").pack(1);
                   pk.pack("data_id").pack("d");
                   pk.pack("buffer_id").pack("b");
                   pk.pack("meta").pack_map(0);
                   pk.pack("payload").pack("not bin");
                 })});
  next_error(w, error_code::bad_field, ref(type_data));
  // Without `requirements` (read as the empty map) the task fits a worker with no resources.
  coord.send_frames({header(1, type_submit), submit_kind("collector")});
  CHECK(next_a<codec::submitted>(coord).accepted);
  CHECK(next_a<codec::task_start>(w).task_id == "t");
}

// ---- §12.3 Messages ---------------------------------------------------------------------------

// §12.3.1 "The broker SHALL answer every SUBMIT that it does not refuse with ERROR (§3.6) with
// exactly one SUBMITTED, without waiting for the task to be assigned."
TEST_CASE_METHOD(fixture, "SPEC 12.3.1: every SUBMIT gets exactly one SUBMITTED at once",
                 "[spec]") {
  raw_peer coord(ctx, router);
  join(coord, "coord", role::coordinator);
  for (std::uint64_t i = 0; i < 3; ++i) {  // nobody can run them
    const auto a = submit_ok(coord, task_of("t" + std::to_string(i)));
    CHECK(a.queued == i);
  }
  coord.send(task_of("t0"));
  CHECK(next_a<codec::submitted>(coord).code == code_of(error_code::duplicate_task));
  expect_quiet(coord);  // one answer each, nothing else
  raw_peer w(ctx, router);
  join(w, "w", role::collector);
  next_event(coord, "t0", "assigned");  // assignment brings an event, not another SUBMITTED
  expect_quiet(coord);
}

// ---- §12.4 Error codes ------------------------------------------------------------------------

// §12.4 "The checks of this section are rules of the message (§3.6): they follow the field
// checks, and the broker SHALL apply them in the order given and answer the first that fails."
TEST_CASE("SPEC 12.4: the task checks apply in order", "[spec]") {
  auto cfg = test_config();
  cfg.max_queue = 1;
  broker_with b(cfg);
  raw_peer a(b.ctx, b.router), other(b.ctx, b.router), w1(b.ctx, b.router), w2(b.ctx, b.router);
  join(a, "a", role::coordinator);
  join(other, "other", role::coordinator);
  join(w1, "w1", role::collector);
  join(w2, "w2", role::collector);
  auto s = task_of("t");
  s.max_attempts = 2;
  submit_ok(a, s);  // t is starting on w1: FINISH would be out of order for its owner too
  next_a<codec::task_start>(w1);
  next_event(a, "t", "assigned");
  refused(other, codec::finish{"t"}, error_code::unknown_task);  // 406 before 408
  // Field checks first: a malformed attempt is 402 whatever the task.
  refused(w1, codec::started{"t", 0}, error_code::bad_field);
  w1.send(codec::task_failed{"t", 1, "x"});
  next_event(a, "t", "requeued");
  next_a<codec::task_start>(w2);  // attempt 2, avoiding w1
  next_event(a, "t", "assigned");
  // DATA on attempt 1 would also be out of order (attempt 2 is starting): 407 before 408.
  refused(w1, codec::data_ready{"t", 1, "d", "b", codec::empty_map_blob, {}},
          error_code::stale_attempt);
  // A full queue and a live id: 411 before 412.
  submit_ok(a, task_of("waits", role::learner));
  a.send(task_of("t"));
  CHECK(next_a<codec::submitted>(a).code == code_of(error_code::duplicate_task));
  a.send(task_of("new"));
  CHECK(next_a<codec::submitted>(a).code == code_of(error_code::queue_full));
}

// §12.4.1 "A task message other than SUBMIT that names a task the sender does not hold SHALL be
// refused with ERROR 406. A coordinator holds the live tasks it submitted; a task of another
// coordinator SHALL be answered exactly as a task that does not exist. A worker message is
// refused with 406 when its task is not live, when it names an attempt later than the task's
// current one, or when it names the current attempt and that attempt neither is assigned to the
// sender nor ended on it (§12.7.5)." §12.1.4 "it SHOULD name the task in `reason`"
TEST_CASE_METHOD(fixture, "SPEC 12.4.1: a task the sender does not hold gets ERROR 406", "[spec]") {
  raw_peer a(ctx, router), b(ctx, router), w1(ctx, router), w2(ctx, router);
  join(a, "a", role::coordinator);
  join(b, "b", role::coordinator);
  join(w1, "w1", role::collector);
  join(w2, "w2", role::collector);
  const std::string id = "task-of-a";
  start_task(a, w1, task_of(id));
  const auto theirs = refused(b, codec::finish{id}, error_code::unknown_task);
  CHECK(contains(theirs.reason, id));
  refused(b, codec::cancel{id, "not mine"}, error_code::unknown_task);
  refused(b, codec::data_reply{id, 1, codec::nil_blob}, error_code::unknown_task);
  refused(a, codec::finish{"nothing"}, error_code::unknown_task);
  refused(w2, codec::info{id, 1, codec::empty_map_blob}, error_code::unknown_task);  // not its
  refused(w1, codec::info{id, 2, codec::empty_map_blob}, error_code::unknown_task);  // later
  a.send(codec::cancel{id, "done"});
  next_event(a, id, "cancelled");
  next_a<codec::task_abort>(w1);
  refused(w1, codec::info{id, 1, codec::empty_map_blob}, error_code::unknown_task);  // not live
  // Another coordinator's task was answered exactly as one that does not exist.
  const auto none = refused(b, codec::finish{id}, error_code::unknown_task);
  CHECK(none == theirs);
  a.send(codec::data_reply{"nothing", 1, codec::nil_blob});
  CHECK(contains(next_error(a, error_code::unknown_task, ref(type_data_reply)).reason, "nothing"));
}

// §12.4.2 "A worker message about a live task whose `attempt` is earlier than the task's current
// one, or names an attempt that ended on the sender while the task waits to be assigned again,
// SHALL be refused with ERROR 407 and counted as stale (§12.7.5)."
TEST_CASE_METHOD(fixture, "SPEC 12.4.2: an ended attempt gets ERROR 407 and is counted as stale",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  auto s = task_of("t");
  s.max_attempts = 2;
  start_task(coord, w, s);
  w.send(codec::task_failed{"t", 1, "x"});
  next_event(coord, "t", "requeued");
  CHECK(next_a<codec::task_start>(w).attempt == 2);
  const auto stale =
      refused(w, codec::info{"t", 1, codec::empty_map_blob}, error_code::stale_attempt);
  CHECK(contains(stale.reason, "'t'"));
  refused(w, codec::task_result{"t", 1, codec::empty_map_blob}, error_code::stale_attempt);
  CHECK(wait_until([&] { return broker.get().snapshot().stale_messages == 2; }));
}

// §12.4.3 "A message about a task the sender holds (from a worker: at the task's current attempt)
// that comes out of order for the task's state (§12.5), for example DATA before STARTED, SHALL be
// refused with ERROR 408."
TEST_CASE_METHOD(fixture, "SPEC 12.4.3: a message out of order gets ERROR 408", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  start_task(coord, w, task_of("t"));
  refused(w, codec::get_data{"t", 1, 1, "b", 1, 0}, error_code::wrong_state);  // a collector task
  refused(coord, codec::data_reply{"t", 1, codec::nil_blob}, error_code::wrong_state);
  // Nothing moved: the task still runs.
  w.send(codec::info{"t", 1, codec::empty_map_blob});
  next_event(coord, "t", "info");
}

// §12.4.4 "A SUBMIT whose `task_id` names a live task SHALL be answered with SUBMITTED,
// `accepted` = false, `code` = 411 and `queued` = 0; the live task is not affected. Task ids form
// one namespace for the whole broker, and an id becomes free again when its task ends"
TEST_CASE_METHOD(fixture, "SPEC 12.4.4: a live task id gets SUBMITTED 411", "[spec]") {
  raw_peer a(ctx, router), b(ctx, router);
  join(a, "a", role::coordinator);
  join(b, "b", role::coordinator);
  auto s = task_of("t");
  s.task_info = odd_map();
  submit_ok(a, s);  // queued: no worker yet
  const auto check_duplicate = [](raw_peer& c) {
    auto dup = task_of("t", role::learner);
    c.send(dup);
    const auto r = next_a<codec::submitted>(c);
    CHECK(r.task_id == "t");
    CHECK_FALSE(r.accepted);
    CHECK(r.code == code_of(error_code::duplicate_task));
    CHECK(r.queued == 0);
    CHECK_FALSE(r.reason.empty());
  };
  check_duplicate(a);
  check_duplicate(b);  // one namespace for all coordinators
  raw_peer w(ctx, router);
  join(w, "w", role::collector);
  const auto start = next_a<codec::task_start>(w);  // the original task, unaffected
  CHECK(start.kind == role::collector);
  CHECK(start.task_info == odd_map());
  next_event(a, "t", "assigned");
  check_duplicate(a);  // starting is live too
  w.send(codec::started{"t", 1});
  next_event(a, "t", "started");
  a.send(codec::finish{"t"});
  next_a<codec::task_close>(w);
  w.send(codec::task_result{"t", 1, codec::empty_map_blob});
  next_event(a, "t", "finished");
  submit_ok(b, task_of("t"));  // free again once it ended
}

// §12.4.5 "A SUBMIT that would take the broker's queue of tasks waiting for a worker past its
// bound (§12.6) SHALL be answered with SUBMITTED, `accepted` = false, `code` = 412 and `queued`
// = 0. No task is created and the id stays free"
TEST_CASE("SPEC 12.4.5: a full queue gets SUBMITTED 412", "[spec]") {
  auto cfg = test_config();
  cfg.max_queue = 2;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  submit_ok(coord, task_of("a"));
  submit_ok(coord, task_of("b"));
  coord.send(task_of("c"));
  const auto r = next_a<codec::submitted>(coord);
  CHECK(r.task_id == "c");
  CHECK_FALSE(r.accepted);
  CHECK(r.code == code_of(error_code::queue_full));
  CHECK(r.queued == 0);
  CHECK_FALSE(r.reason.empty());
  refused(coord, codec::cancel{"c", "exists?"}, error_code::unknown_task);  // never created
  raw_peer w(b.ctx, b.router);
  join(w, "w", role::collector);
  CHECK(next_a<codec::task_start>(w).task_id == "a");  // the queue has room again
  next_event(coord, "a", "assigned");
  CHECK(submit_ok(coord, task_of("c")).queued == 1);  // the same id, accepted now
}

// §12.4.6 "A SUBMIT refused with SUBMITTED (411, 412) was well-formed: it is not a fault (§10)."
TEST_CASE("SPEC 12.4.6: SUBMITs refused with SUBMITTED are not faults", "[spec]") {
  auto cfg = test_config();
  cfg.max_queue = 1;
  cfg.max_faults = 1;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  submit_ok(coord, task_of("a"));
  for (int i = 0; i < 5; ++i) {
    coord.send(task_of("a"));
    CHECK(next_a<codec::submitted>(coord).code == code_of(error_code::duplicate_task));
    coord.send(task_of("b"));
    CHECK(next_a<codec::submitted>(coord).code == code_of(error_code::queue_full));
  }
  expect_quiet(coord);  // still in session with max-faults 1
  CHECK(b.broker.get().snapshot().faults == 0);
}

// ---- §12.5 Task state machine -----------------------------------------------------------------

// §12.5.1 "A live task SHALL be in exactly one of four states ... A task ends **finished**,
// **failed** or **cancelled**. These are not states the broker keeps: a task that reaches one
// SHALL be forgotten at once, and its id is free again (§12.4.4)."
TEST_CASE_METHOD(fixture, "SPEC 12.5.1: a task that ends is forgotten and its id is free",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  const auto forgotten = [&](const std::string& id) {
    refused(coord, codec::cancel{id, "gone?"}, error_code::unknown_task);
    refused(w, codec::info{id, 1, codec::empty_map_blob}, error_code::unknown_task);
  };
  auto s = task_of("t");
  s.max_attempts = 1;
  // finished
  start_task(coord, w, s);
  coord.send(codec::finish{"t"});
  next_a<codec::task_close>(w);
  w.send(codec::task_result{"t", 1, codec::empty_map_blob});
  next_event(coord, "t", "finished");
  forgotten("t");
  // failed
  start_task(coord, w, s);
  w.send(codec::task_failed{"t", 1, "x"});
  next_event(coord, "t", "failed");
  forgotten("t");
  // cancelled
  start_task(coord, w, s);
  coord.send(codec::cancel{"t", "enough"});
  next_event(coord, "t", "cancelled");
  next_a<codec::task_abort>(w);
  forgotten("t");
  CHECK(wait_until([&] {
    const auto st = broker.get().snapshot();
    return st.tasks_queued == 0 && st.tasks_running == 0;
  }));
}

// §12.5.2 "The broker SHALL move a task only as this table says, and on each transition SHALL send
// what the table lists and emit the listed TASK_EVENT on the owner's stream (§12.8); a row without
// an event emits none."
TEST_CASE_METHOD(fixture, "SPEC 12.5.2: collector and learner tasks move as the table says",
                 "[spec]") {
  raw_peer coord(ctx, router);
  join(coord, "coord", role::coordinator);
  // (none) -> queued: SUBMITTED, no event.
  CHECK(submit_ok(coord, task_of("c")).queued == 0);
  expect_quiet(coord);
  // queued -> starting: TASK_START with attempt 1, `assigned`.
  raw_peer w(ctx, router);
  join(w, "w", role::collector);
  const auto start = next_a<codec::task_start>(w);
  CHECK(start.task_id == "c");
  CHECK(start.attempt == 1);
  CHECK(next_event(coord, "c", "assigned").attempt == 1);
  // starting -> running, and running's own steps.
  w.send(codec::started{"c", 1});
  next_event(coord, "c", "started");
  w.send(codec::data_ready{"c", 1, "d0", "b", codec::empty_map_blob, std::nullopt});
  next_event(coord, "c", "data");
  w.send(codec::info{"c", 1, codec::empty_map_blob});
  next_event(coord, "c", "info");
  // running -> closing: TASK_CLOSE, no event.
  coord.send(codec::finish{"c"});
  const auto close = next_a<codec::task_close>(w);
  CHECK(close.task_id == "c");
  CHECK(close.attempt == 1);
  expect_quiet(coord);
  // closing -> finished: `finished`, nothing to the worker.
  w.send(codec::task_result{"c", 1, codec::empty_map_blob});
  next_event(coord, "c", "finished");
  expect_quiet(w);

  raw_peer l(ctx, router);
  join(l, "l", role::learner);
  start_task(coord, l, task_of("L", role::learner));
  l.send(codec::get_data{"L", 1, 4, "b", 16, 0});
  next_event(coord, "L", "data_request");
  coord.send(codec::data_reply{"L", 4, codec::empty_map_blob});  // LEARN, no event
  CHECK(next_a<codec::learn>(l).request_id == 4);
  expect_quiet(coord);
  l.send(codec::learn_info{"L", 1, "b", codec::empty_map_blob});
  next_event(coord, "L", "learn_info");
  coord.send(codec::finish{"L"});
  next_a<codec::task_close>(l);
  l.send(codec::task_result{"L", 1, codec::empty_map_blob});
  next_event(coord, "L", "finished");
  expect_quiet(coord);
  expect_quiet(l);
}

// §12.5.3 "FINISH, CANCEL and DATA_REPLY SHALL be accepted only from the task's owner, and
// STARTED, DATA, INFO, GET_DATA, LEARN_INFO, RESULT and TASK_FAILED only from its holder at its
// current attempt ... A message that passes these checks SHALL be refused with ERROR 408
// (§12.4.3) unless the task's state is one this table accepts it in ... A STARTED for the current
// attempt while it is running or closing is a repeat ... The broker SHALL drop a repeat: no
// event, no ERROR, the deadline unchanged."
TEST_CASE("SPEC 12.5.3: each message is accepted only in its states", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 1000;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), other(b.ctx, b.router), w(b.ctx, b.router), l(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(other, "other", role::coordinator);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  const auto empty = codec::empty_map_blob;
  auto s = task_of("c");
  s.max_attempts = 1;
  submit_ok(coord, s);
  next_a<codec::task_start>(w);
  next_event(coord, "c", "assigned");
  // starting: only STARTED (and TASK_FAILED, CANCEL).
  refused(w, codec::data_ready{"c", 1, "d", "b", empty, {}}, error_code::wrong_state);
  refused(w, codec::info{"c", 1, empty}, error_code::wrong_state);
  refused(w, codec::task_result{"c", 1, empty}, error_code::wrong_state);
  refused(coord, codec::finish{"c"}, error_code::wrong_state);
  refused(coord, codec::data_reply{"c", 1, codec::nil_blob}, error_code::wrong_state);
  refused(other, codec::finish{"c"}, error_code::unknown_task);  // the owner only
  w.send(codec::started{"c", 1});
  next_event(coord, "c", "started");
  // running, a collector task. A STARTED again is a repeat: dropped without a word.
  w.send(codec::started{"c", 1});
  expect_quiet(w);
  refused(w, codec::get_data{"c", 1, 1, "b", 1, 0}, error_code::wrong_state);
  refused(w, codec::learn_info{"c", 1, "b", empty}, error_code::wrong_state);
  refused(w, codec::task_result{"c", 1, empty}, error_code::wrong_state);
  w.send(codec::info{"c", 1, empty});
  next_event(coord, "c", "info");
  coord.send(codec::finish{"c"});
  next_a<codec::task_close>(w);
  // closing: RESULT or TASK_FAILED; no progress, no second FINISH.
  refused(coord, codec::finish{"c"}, error_code::wrong_state);
  refused(w, codec::data_ready{"c", 1, "d", "b", empty, {}}, error_code::wrong_state);
  refused(w, codec::info{"c", 1, empty}, error_code::wrong_state);
  w.send(codec::started{"c", 1});  // a repeat, as while running
  expect_quiet(w);
  w.send(codec::task_failed{"c", 1, "failed while closing"});
  next_event(coord, "c", "failed");

  // running, a learner task: no collector messages.
  auto ls = task_of("L", role::learner);
  ls.max_attempts = 1;
  start_task(coord, l, ls);
  refused(l, codec::data_ready{"L", 1, "d", "b", empty, {}}, error_code::wrong_state);
  refused(l, codec::info{"L", 1, empty}, error_code::wrong_state);
  l.send(codec::learn_info{"L", 1, "b", empty});
  next_event(coord, "L", "learn_info");
  coord.send(codec::finish{"L"});
  next_a<codec::task_close>(l);
  refused(l, codec::get_data{"L", 1, 1, "b", 1, 0}, error_code::wrong_state);
  refused(l, codec::learn_info{"L", 1, "b", empty}, error_code::wrong_state);
  l.send(codec::task_result{"L", 1, empty});
  next_event(coord, "L", "finished");

  // TASK_FAILED is accepted in starting as well.
  submit_ok(coord, s);
  next_a<codec::task_start>(w);
  next_event(coord, "c", "assigned");
  w.send(codec::task_failed{"c", 1, "could not start"});
  next_event(coord, "c", "failed");
}

// §12.5.4 "A refused task message SHALL change nothing: the task's state, its deadline (§12.7),
// its data request (§12.5.9) and the owner's stream (§12.8) stay as they were, and nothing is
// sent but the ERROR."
TEST_CASE("SPEC 12.5.4: a refused task message changes nothing", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 1000;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router), l(b.ctx, b.router), l2(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  join(l2, "l2", role::learner);
  auto s = task_of("t");
  s.max_attempts = 1;
  s.step_timeout_ms = 300;
  submit_ok(coord, s);
  next_a<codec::task_start>(w);
  const auto assigned = next_event(coord, "t", "assigned");
  // State and stream: a refused FINISH leaves the task starting and emits nothing.
  refused(coord, codec::finish{"t"}, error_code::wrong_state);
  expect_quiet(w);
  const auto t0 = std::chrono::steady_clock::now();
  w.send(codec::started{"t", 1});
  CHECK(next_event(coord, "t", "started").seq == assigned.seq + 1);
  // Deadline: refused messages from the holder never move the step deadline.
  std::optional<codec::task_abort> abort;
  while (!abort && since(t0) < 5000ms) {
    w.send(codec::get_data{"t", 1, 1, "b", 1, 0});  // 408 every time: a collector task
    for (auto m = w.recv(20ms); m && !abort; m = w.recv(1ms)) {
      if (auto* a = std::get_if<codec::task_abort>(&*m)) abort = *a;
      if (auto* e = std::get_if<codec::error>(&*m))
        CHECK(e->code == code_of(error_code::wrong_state));
    }
  }
  REQUIRE(abort);
  CHECK(abort->reason == "step timeout");
  CHECK(since(t0) >= 300ms);
  next_event(coord, "t", "failed");
  // Data request: one refused GET_DATA from a worker that does not hold the task leaves the open
  // request in place.
  start_task(coord, l, task_of("L", role::learner));
  l.send(codec::get_data{"L", 1, 5, "b", 8, 0});
  next_event(coord, "L", "data_request");
  refused(l2, codec::get_data{"L", 1, 6, "b", 8, 0}, error_code::unknown_task);
  coord.send(codec::data_reply{"L", 5, codec::nil_blob});
  CHECK(next_a<codec::no_data>(l).request_id == 5);
}

// §12.5.5 "A task message refused with 406 or 407, a DATA, INFO, GET_DATA or LEARN_INFO refused
// with 408 because its task is closing, and a DATA_REPLY refused with 408 SHALL be answered with
// ERROR and counted in the broker's count of faults, but they SHALL NOT count against the sender's
// session (§10.2) and never lead to DISCONNECT 429 (§10.3) ... Every other refusal of a task
// message (402, 404, GET_DATA about a collector task ...) is a fault of §10 like any other."
TEST_CASE("SPEC 12.5.5: 406 and 407 are counted but are no strike against the session", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 2;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  auto s = task_of("t");
  s.max_attempts = 2;
  start_task(coord, w, s);
  w.send(codec::task_failed{"t", 1, "x"});
  next_event(coord, "t", "requeued");
  CHECK(next_a<codec::task_start>(w).attempt == 2);
  next_event(coord, "t", "assigned");
  for (int i = 0; i < 3; ++i) {
    refused(w, codec::info{"t", 1, codec::empty_map_blob}, error_code::stale_attempt);
    refused(w, codec::info{"nope", 1, codec::empty_map_blob}, error_code::unknown_task);
    refused(coord, codec::finish{"nope"}, error_code::unknown_task);
  }
  expect_quiet(w);  // both sessions go on past max-faults 2
  expect_quiet(coord);
  CHECK(b.broker.get().snapshot().faults == 9);
  w.send(codec::started{"t", 2});
  next_event(coord, "t", "started");
  const codec::get_data wrong_kind{"t", 2, 1, "b", 1, 0};  // a collector task
  refused(w, wrong_kind, error_code::wrong_state);         // a strike
  refused(w, wrong_kind, error_code::wrong_state);         // and out
  CHECK(next_a<codec::disconnect>(w).code == code_of(error_code::too_many_faults));
  CHECK(b.broker.get().snapshot().faults == 11);
  next_event(coord, "t", "failed");  // its session ended, and with it the last attempt
}

// §12.5.5 (as above): progress still in flight when TASK_CLOSE arrives is no strike.
TEST_CASE("SPEC 12.5.5: progress racing a close is refused but is no strike", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 2;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  start_task(coord, w, task_of("t"));
  coord.send(codec::finish{"t"});
  next_a<codec::task_close>(w);
  for (int i = 0; i < 5; ++i)  // a collector loop that has not seen TASK_CLOSE yet
    refused(w, codec::data_ready{"t", 1, "late", "b", codec::empty_map_blob, std::nullopt},
            error_code::wrong_state);
  refused(coord, codec::data_reply{"t", 1, codec::nil_blob}, error_code::wrong_state);
  expect_quiet(w);  // still in session past max-faults 2
  w.send(codec::task_result{"t", 1, codec::empty_map_blob});
  next_event(coord, "t", "finished");
}

// §12.5.6 "Every TASK_EVENT SHALL carry the task's attempt number as `attempt` and the worker of
// that attempt as `worker_id`, at the moment of the step: for `requeued` and `failed` the attempt
// that ended and the worker it ran on; for `cancelled` the current attempt and its holder or, for
// a queued task, the attempt that ended last (0 if there was none) and an empty `worker_id`.
// `body` SHALL be: ..." (the table) "The maps the broker composes have exactly the keys listed,
// in that order"
TEST_CASE_METHOD(fixture, "SPEC 12.5.6: every event names its attempt and worker and has its body",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), l(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  const auto meta = odd_map();
  const auto is = [&](const codec::task_event& e, std::uint32_t attempt, const std::string& worker,
                      const std::string& body) {
    INFO("event " << e.event);
    CHECK(e.attempt == attempt);
    CHECK(e.worker_id == worker);
    CHECK(e.body == body);
  };
  auto s = task_of("c");
  s.max_attempts = 2;
  submit_ok(coord, s);
  next_a<codec::task_start>(w);
  is(next_event(coord, "c", "assigned"), 1, "w", codec::empty_map_blob);
  w.send(codec::started{"c", 1});
  is(next_event(coord, "c", "started"), 1, "w", codec::empty_map_blob);
  w.send(codec::data_ready{"c", 1, "d1", "buf", meta, std::nullopt});
  is(next_event(coord, "c", "data"), 1, "w", packed([](packer& pk) {
                                               pk.pack_map(3);
                                               pk.pack("data_id").pack("d1");
                                               pk.pack("buffer_id").pack("buf");
                                               pk.pack("meta");
                                             }) + meta);
  const std::string payload("\x00\x01\xff", 3);
  w.send(codec::data_ready{"c", 1, "d2", "buf", meta, payload});
  is(next_event(coord, "c", "data"), 1, "w",
     packed([](packer& pk) {
       pk.pack_map(4);
       pk.pack("data_id").pack("d2");
       pk.pack("buffer_id").pack("buf");
       pk.pack("meta");
     }) + meta +
         packed([&](packer& pk) {
           pk.pack("payload");
           pk.pack_bin(3);
           pk.pack_bin_body(payload.data(), 3);
         }));
  w.send(codec::info{"c", 1, meta});
  is(next_event(coord, "c", "info"), 1, "w", meta);
  w.send(codec::task_failed{"c", 1, "bad env"});
  is(next_event(coord, "c", "requeued"), 1, "w", reason_body("worker reported: bad env", 1));
  next_a<codec::task_start>(w);
  is(next_event(coord, "c", "assigned"), 2, "w", codec::empty_map_blob);
  w.send(codec::started{"c", 2});
  next_event(coord, "c", "started");
  coord.send(codec::finish{"c"});
  next_a<codec::task_close>(w);
  w.send(codec::task_result{"c", 2, meta});
  is(next_event(coord, "c", "finished"), 2, "w", meta);

  auto f = task_of("f");
  f.max_attempts = 1;
  start_task(coord, w, f);
  w.send(codec::task_failed{"f", 1, "again"});
  is(next_event(coord, "f", "failed"), 1, "w", reason_body("worker reported: again", 1));

  start_task(coord, l, task_of("L", role::learner));
  l.send(codec::get_data{"L", 1, 300, "buf", 64, 70000});
  is(next_event(coord, "L", "data_request"), 1, "l", packed([](packer& pk) {
       pk.pack_map(4);
       pk.pack("request_id").pack(300);
       pk.pack("buffer_id").pack("buf");
       pk.pack("batch_size").pack(64);
       pk.pack("cur_learner_iter").pack(70000);
     }));
  l.send(codec::learn_info{"L", 1, "buf", meta});
  is(next_event(coord, "L", "learn_info"), 1, "l", packed([](packer& pk) {
                                                     pk.pack_map(2);
                                                     pk.pack("buffer_id").pack("buf");
                                                     pk.pack("info");
                                                   }) + meta);
  coord.send(codec::cancel{"L", "stop"});  // cancelled while running: its attempt and holder
  next_a<codec::task_abort>(l);
  is(next_event(coord, "L", "cancelled"), 1, "l", reason_body("stop", 1));

  submit_ok(coord, task_of("never", role::collector, {{"gpu", 1}}));  // nobody fits
  coord.send(codec::cancel{"never", "no gpu"});
  is(next_event(coord, "never", "cancelled"), 0, "", reason_body("no gpu", 0));

  // Queued again after an attempt: the attempt that ended last, and no worker.
  raw_peer v(ctx, router);
  join(v, "v", role::learner, {{"gpu", 1}});
  auto q = task_of("q", role::learner, {{"gpu", 1}});
  q.max_attempts = 3;
  start_task(coord, v, q);
  v.send(codec::disconnect{200, "bye"});
  is(next_event(coord, "q", "requeued"), 1, "v", reason_body("worker v lost", 1));
  coord.send(codec::cancel{"q", "no gpu left"});
  is(next_event(coord, "q", "cancelled"), 1, "", reason_body("no gpu left", 1));
}

// §12.5.7 "CANCEL from the owner SHALL end the task in whatever state it is. If it has a holder,
// the broker sends it TASK_ABORT for the current attempt with `reason` = `cancelled: ` followed by
// the CANCEL's reason, and the holder is free at once (§12.6.2), without waiting for the worker.
// The broker then emits `cancelled` and forgets the task; its id is free."
TEST_CASE_METHOD(fixture, "SPEC 12.5.7: CANCEL ends a task in any state", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  // queued
  submit_ok(coord, task_of("q", role::collector, {{"gpu", 1}}));
  coord.send(codec::cancel{"q", "r0"});
  next_event(coord, "q", "cancelled");
  expect_quiet(w);                       // nobody held it
  submit_ok(coord, task_of("waiting"));  // will take the worker each time it is freed
  next_a<codec::task_start>(w);
  next_event(coord, "waiting", "assigned");
  const auto abort_and_free = [&](const std::string& id, const std::string& reason,
                                  std::uint32_t attempt) {
    coord.send(codec::cancel{id, reason});
    const auto a = next_a<codec::task_abort>(w);
    CHECK(a.task_id == id);
    CHECK(a.attempt == attempt);
    CHECK(a.reason == "cancelled: " + reason);
    CHECK(next_event(coord, id, "cancelled").worker_id == "w");
  };
  // starting ("waiting" was starting); the worker is free at once and takes the next task.
  submit_ok(coord, task_of("s"));
  abort_and_free("waiting", "r1", 1);
  CHECK(next_a<codec::task_start>(w).task_id == "s");
  next_event(coord, "s", "assigned");
  // running
  w.send(codec::started{"s", 1});
  next_event(coord, "s", "started");
  submit_ok(coord, task_of("c"));
  abort_and_free("s", "r2", 1);
  CHECK(next_a<codec::task_start>(w).task_id == "c");
  next_event(coord, "c", "assigned");
  // closing
  w.send(codec::started{"c", 1});
  next_event(coord, "c", "started");
  coord.send(codec::finish{"c"});
  next_a<codec::task_close>(w);
  abort_and_free("c", "r3", 1);
  for (const auto* id : {"q", "waiting", "s", "c"}) {
    submit_ok(coord, task_of(id, role::learner));  // every id is free again
  }
}

// §12.5.8 "When a coordinator's session ends (DISCONNECT, expiry, DISCONNECT 429; a resumption,
// §8.6, is no end), the broker SHALL cancel every live task that coordinator owns: each holder gets
// TASK_ABORT with `reason` = `its coordinator is gone` and is free at once, the tasks are forgotten
// and their ids are free, and the coordinator's stream is dropped (§12.8.1). No TASK_EVENT is sent
// ... and no `task.` event is published for these ends"
TEST_CASE_METHOD(fixture, "SPEC 12.5.8: a coordinator's end cancels its tasks", "[spec]") {
  event_listener events(ctx, broker.get().events_endpoint());
  raw_peer a(ctx, router), b(ctx, router), w(ctx, router);
  const auto token = join(a, "a", role::coordinator).session;
  join(b, "b", role::coordinator);
  join(w, "w", role::collector);
  start_task(a, w, task_of("a1"));
  submit_ok(a, task_of("a2", role::collector, {{"gpu", 1}}));  // queued: nobody fits
  submit_ok(b, task_of("b1"));                                 // queued behind a1's worker
  // A resumption is no end: the tasks live on, steered from the new connection.
  raw_peer a_again(ctx, router);
  a_again.send(codec::hello{role::coordinator, "a", 30'000, {}, token});
  CHECK(next_a<codec::welcome>(a_again).resumed);
  w.send(codec::info{"a1", 1, codec::empty_map_blob});
  next_event(a_again, "a1", "info");
  a_again.send(codec::disconnect{200, "done"});
  const auto abort = next_a<codec::task_abort>(w);
  CHECK(abort.task_id == "a1");
  CHECK(abort.attempt == 1);
  CHECK(abort.reason == "its coordinator is gone");
  CHECK(next_a<codec::task_start>(w).task_id == "b1");  // free at once
  next_event(b, "b1", "assigned");
  submit_ok(b, task_of("a1", role::learner));  // the ids are free
  submit_ok(b, task_of("a2", role::learner));
  REQUIRE(events.next("task.b.assigned"));
  bool left = false;
  for (const auto& e : events.seen()) {
    if (e.topic == "coordinator.left") left = true;
    if (left) CHECK(e.topic.rfind("task.a.", 0) != 0);
  }
  CHECK(left);
}

// §12.5.9 "A running learner task has at most one open data request. An accepted GET_DATA SHALL
// open request `request_id`, replacing any open one, and emit `data_request`. A DATA_REPLY from
// the owner SHALL be accepted only while the task is running and its `request_id` names the open
// request; it closes the request, and the broker SHALL then answer the holder with NO_DATA when
// `data` is nil, its `retry_ms` being the broker's no-data-retry setting (§1.4), or otherwise with
// LEARN carrying `data` byte for byte (§12.2.3); both carry the `request_id` and the current
// attempt. Any other DATA_REPLY is refused with 408 ... Every request id, 0 included, is an
// ordinary id."
TEST_CASE("SPEC 12.5.9: a learner's data requests are answered once each", "[spec]") {
  auto cfg = test_config();
  cfg.no_data_retry_ms = 77;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), l(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(l, "l", role::learner);
  const auto ask = [&](const std::string& id, std::uint32_t attempt, std::uint64_t request) {
    l.send(codec::get_data{id, attempt, request, "b", 32, 0});
    CHECK(next_event(coord, id, "data_request").attempt == attempt);
  };
  start_task(coord, l, task_of("L", role::learner));
  refused(coord, codec::data_reply{"L", 1, codec::nil_blob}, error_code::wrong_state);  // none
  ask("L", 1, 1);
  coord.send(codec::data_reply{"L", 1, codec::nil_blob});
  const auto wait = next_a<codec::no_data>(l);
  CHECK(wait.task_id == "L");
  CHECK(wait.attempt == 1);
  CHECK(wait.request_id == 1);
  CHECK(wait.retry_ms == 77);
  expect_quiet(coord);  // a DATA_REPLY emits nothing
  refused(coord, codec::data_reply{"L", 1, codec::nil_blob}, error_code::wrong_state);  // closed
  ask("L", 1, 2);
  ask("L", 1, 3);  // replaces request 2
  refused(coord, codec::data_reply{"L", 2, codec::empty_map_blob}, error_code::wrong_state);
  coord.send(codec::data_reply{"L", 3, odd_array()});
  const auto learn = next_a<codec::learn>(l);
  CHECK(learn.task_id == "L");
  CHECK(learn.attempt == 1);
  CHECK(learn.request_id == 3);
  CHECK(learn.data == odd_array());
  ask("L", 1, 0);  // 0 is an ordinary request id
  coord.send(codec::data_reply{"L", 0, codec::empty_map_blob});
  CHECK(next_a<codec::learn>(l).request_id == 0);
  ask("L", 1, 5);
  coord.send(codec::finish{"L"});
  next_a<codec::task_close>(l);
  refused(coord, codec::data_reply{"L", 5, codec::empty_map_blob}, error_code::wrong_state);
  l.send(codec::task_result{"L", 1, codec::empty_map_blob});
  next_event(coord, "L", "finished");
  // An attempt that ends drops its open request.
  auto m = task_of("M", role::learner);
  m.max_attempts = 2;
  start_task(coord, l, m);
  ask("M", 1, 9);
  l.send(codec::task_failed{"M", 1, "x"});
  next_event(coord, "M", "requeued");
  CHECK(next_a<codec::task_start>(l).attempt == 2);
  next_event(coord, "M", "assigned");
  l.send(codec::started{"M", 2});
  next_event(coord, "M", "started");
  refused(coord, codec::data_reply{"M", 9, codec::empty_map_blob}, error_code::wrong_state);
}

// ---- §12.6 Assignment and queueing ------------------------------------------------------------

// §12.6.1 "Queued tasks SHALL wait in one queue, ordered by their first submission. A task
// re-queued after an attempt (§12.7.4) SHALL return to its original place, ahead of every task
// submitted after it."
TEST_CASE_METHOD(fixture, "SPEC 12.6.1: the queue is FIFO and a re-queued task keeps its place",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  for (const auto* id : {"a", "b", "c"}) {
    auto s = task_of(id);
    s.max_attempts = 2;
    submit_ok(coord, s);
  }
  join(w, "w", role::collector);
  CHECK(next_a<codec::task_start>(w).task_id == "a");
  next_event(coord, "a", "assigned");
  coord.send(codec::cancel{"a", "next"});
  next_a<codec::task_abort>(w);
  next_event(coord, "a", "cancelled");
  CHECK(next_a<codec::task_start>(w).task_id == "b");
  next_event(coord, "b", "assigned");
  w.send(codec::task_failed{"b", 1, "x"});
  next_event(coord, "b", "requeued");
  const auto again = next_a<codec::task_start>(w);  // b again, not c
  CHECK(again.task_id == "b");
  CHECK(again.attempt == 2);
  next_event(coord, "b", "assigned");
  coord.send(codec::cancel{"b", "next"});
  next_a<codec::task_abort>(w);
  next_event(coord, "b", "cancelled");
  CHECK(next_a<codec::task_start>(w).task_id == "c");
}

// §12.6.2 "A worker holds at most one task at a time and is free when it holds none. It becomes
// free again when its attempt ends in any way: RESULT, CANCEL (§12.5.7), its owner's end
// (§12.5.8), TASK_FAILED (§12.7.4), or a timeout (§12.7.3, at the moment TASK_ABORT is sent)."
TEST_CASE_METHOD(fixture, "SPEC 12.6.2: a worker holds one task and is freed by every end",
                 "[spec]") {
  raw_peer a(ctx, router), b(ctx, router), w(ctx, router);
  join(a, "a", role::coordinator);
  join(b, "b", role::coordinator);
  for (const auto* id : {"t1", "t2", "t3", "t4", "t5"}) {
    auto s = task_of(id);
    s.max_attempts = 1;
    if (std::string(id) == "t4") s.start_timeout_ms = 100;
    submit_ok(a, s);
  }
  submit_ok(b, task_of("t6"));
  join(w, "w", role::collector);
  const auto next_start = [&](const std::string& id, bool quiet = true) {
    const auto s = next_a<codec::task_start>(w);
    CHECK(s.task_id == id);
    if (quiet) expect_quiet(w);  // one at a time: nothing else is assigned to it meanwhile
    return s;
  };
  next_start("t1");
  w.send(codec::started{"t1", 1});
  expect_quiet(w);  // STARTED is handled before FINISH comes
  a.send(codec::finish{"t1"});
  next_a<codec::task_close>(w);
  w.send(codec::task_result{"t1", 1, codec::empty_map_blob});  // RESULT
  next_start("t2");
  a.send(codec::cancel{"t2", "x"});  // CANCEL
  next_a<codec::task_abort>(w);
  next_start("t3");
  w.send(codec::task_failed{"t3", 1, "x"});  // TASK_FAILED
  next_start("t4", false);                   // its TASK_ABORT may come at any moment now
  CHECK(next_a<codec::task_abort>(w, 5000ms).reason == "start timeout");  // a timeout
  next_start("t5");
  a.send(codec::disconnect{200, "bye"});  // its owner's end
  CHECK(next_a<codec::task_abort>(w).task_id == "t5");
  next_start("t6");
}

// §12.6.3 "A task SHALL be assigned only to a worker whose role is the task's `kind` and which
// fits it: for every entry of the task's `requirements`, the worker announced a resource of that
// name whose value is not less than the requirement. Empty requirements fit every worker of the
// kind; a requirement of 0 still needs the name to be announced. Resources are compared, not
// consumed."
TEST_CASE_METHOD(fixture, "SPEC 12.6.3: a task goes only to a worker of its kind that fits it",
                 "[spec]") {
  raw_peer coord(ctx, router), l1(ctx, router), c1(ctx, router), c2(ctx, router), c3(ctx, router);
  join(coord, "coord", role::coordinator);
  join(l1, "l1", role::learner, {{"gpu", 4}, {"cpu", 64}});
  join(c1, "c1", role::collector);
  join(c2, "c2", role::collector, {{"cpu", 2}, {"gpu", 0.5}});
  join(c3, "c3", role::collector, {{"cpu", 8}});
  const auto all_quiet = [&] {
    for (auto* p : {&l1, &c1, &c2, &c3}) expect_quiet(*p);
  };
  submit_ok(coord, task_of("k1", role::collector, {{"gpu", 1}}));  // 0.5 < 1, l1 is a learner
  all_quiet();
  submit_ok(coord, task_of("k2", role::collector, {{"cpu", 2}}));  // c1 lacks cpu; 2 >= 2
  CHECK(next_a<codec::task_start>(c2).task_id == "k2");
  next_event(coord, "k2", "assigned");
  submit_ok(coord, task_of("k3", role::collector, {{"gpu", 0}}));  // c1, c3 announce no gpu
  all_quiet();
  submit_ok(coord, task_of("k4", role::collector, {{"cpu", 4}}));
  CHECK(next_a<codec::task_start>(c3).task_id == "k4");
  next_event(coord, "k4", "assigned");
  submit_ok(coord, task_of("k5"));  // empty requirements
  CHECK(next_a<codec::task_start>(c1).task_id == "k5");
  next_event(coord, "k5", "assigned");
  coord.send(codec::cancel{"k2", "make room"});
  next_a<codec::task_abort>(c2);
  next_event(coord, "k2", "cancelled");
  // c2 is free: k1 (gpu 1) still does not fit it, k3 (gpu 0) does.
  CHECK(next_a<codec::task_start>(c2).task_id == "k3");
  next_event(coord, "k3", "assigned");
  submit_ok(coord, task_of("big", role::learner, {{"gpu", 4}, {"cpu", 64}}));
  CHECK(next_a<codec::task_start>(l1).task_id == "big");
  next_event(coord, "big", "assigned");
  coord.send(codec::cancel{"big", "again"});
  next_a<codec::task_abort>(l1);
  next_event(coord, "big", "cancelled");
  submit_ok(coord, task_of("big2", role::learner, {{"gpu", 4}}));  // nothing was used up
  CHECK(next_a<codec::task_start>(l1).task_id == "big2");
  all_quiet();
}

// §12.6.4 "Whenever a task is queued or re-queued, a worker session begins or a worker becomes
// free, the broker SHALL walk the queue in order and assign each task to the first fitting free
// worker in order of serial (§12.6.2, §12.6.5). A task that fits no free worker SHALL keep its
// place and SHALL NOT block later tasks: they may be assigned before it."
TEST_CASE_METHOD(fixture, "SPEC 12.6.4: the first fitting free worker by join order, no blocking",
                 "[spec]") {
  raw_peer coord(ctx, router), w1(ctx, router), w2(ctx, router), w3(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w1, "w1", role::collector, {{"gpu", 1}});
  join(w2, "w2", role::collector, {{"gpu", 8}});
  join(w3, "w3", role::collector, {{"gpu", 8}});
  const auto runs_on = [&](raw_peer& w, const std::string& id) {
    CHECK(next_a<codec::task_start>(w).task_id == id);
    next_event(coord, id, "assigned");
  };
  const auto cancel = [&](raw_peer& w, const std::string& id) {
    coord.send(codec::cancel{id, "x"});
    next_a<codec::task_abort>(w);
    next_event(coord, id, "cancelled");
  };
  submit_ok(coord, task_of("A"));
  runs_on(w1, "A");
  submit_ok(coord, task_of("B", role::collector, {{"gpu", 8}}));
  runs_on(w2, "B");  // w2 before w3: join order
  cancel(w1, "A");
  cancel(w2, "B");
  submit_ok(coord, task_of("C"));
  runs_on(w1, "C");  // the first by serial again, not the one idle longest
  submit_ok(coord, task_of("D", role::collector, {{"gpu", 1}}));
  runs_on(w2, "D");  // the first that fits, not the best fit
  CHECK(submit_ok(coord, task_of("E", role::collector, {{"gpu", 16}})).queued == 0);
  CHECK(submit_ok(coord, task_of("F")).queued == 1);  // E is ahead of it, and does not block it
  runs_on(w3, "F");
  raw_peer w4(ctx, router);
  join(w4, "w4", role::collector, {{"gpu", 16}});
  runs_on(w4, "E");  // a session that begins is given work at once
}

// §12.6.5 "A re-queued task SHALL avoid the worker its last attempt ran on: it is assigned to the
// first fitting free worker other than that one, and to that one only when no other free worker
// fits."
TEST_CASE_METHOD(fixture, "SPEC 12.6.5: a re-queued task avoids its last worker if it can",
                 "[spec]") {
  raw_peer coord(ctx, router), w1(ctx, router), w2(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w1, "w1", role::collector);
  join(w2, "w2", role::collector);
  auto s = task_of("t");
  s.max_attempts = 4;
  start_task(coord, w1, s);
  w1.send(codec::task_failed{"t", 1, "x"});
  next_event(coord, "t", "requeued");
  CHECK(next_a<codec::task_start>(w2).attempt == 2);  // w1 is free and first, but avoided
  next_event(coord, "t", "assigned");
  expect_quiet(w1);
  w2.send(codec::task_failed{"t", 2, "x"});
  next_event(coord, "t", "requeued");
  CHECK(next_a<codec::task_start>(w1).attempt == 3);
  next_event(coord, "t", "assigned");
  expect_quiet(w2);
  w2.send(codec::disconnect{200, "bye"});  // now w1 is the only worker
  w2.send(codec::heartbeat{});             // and the broker knows it
  next_error(w2, error_code::not_ready, ref(type_heartbeat));
  w1.send(codec::task_failed{"t", 3, "x"});
  next_event(coord, "t", "requeued");
  CHECK(next_a<codec::task_start>(w1).attempt == 4);  // the only one that fits: w1 again
}

// §12.6.6 "Assigning a task SHALL increase its attempt by one, send TASK_START with the new
// attempt, the task's `kind` and its `task_info` byte for byte to the worker, move the task to
// starting, set the attempt's deadlines (§12.7.1) and emit `assigned`."
TEST_CASE_METHOD(fixture, "SPEC 12.6.6: an attempt begins with TASK_START and `assigned`",
                 "[spec]") {
  raw_peer coord(ctx, router), l(ctx, router);
  join(coord, "coord", role::coordinator);
  join(l, "l", role::learner);
  auto s = task_of("t", role::learner);
  s.task_info = odd_map();
  s.start_timeout_ms = 150;
  s.max_attempts = 2;
  const auto t0 = std::chrono::steady_clock::now();
  submit_ok(coord, s);
  for (std::uint32_t attempt = 1; attempt <= 2; ++attempt) {
    const auto start = next_a<codec::task_start>(l);
    CHECK(start.task_id == "t");
    CHECK(start.attempt == attempt);
    CHECK(start.kind == role::learner);
    CHECK(start.task_info == odd_map());
    const auto e = next_event(coord, "t", "assigned");
    CHECK(e.attempt == attempt);
    CHECK(e.worker_id == "l");
    refused(coord, codec::finish{"t"}, error_code::wrong_state);  // starting, not running
    // The start deadline is set: without STARTED the attempt ends.
    CHECK(next_a<codec::task_abort>(l, 5000ms).attempt == attempt);
    CHECK(since(t0) >= attempt * 150ms);
    next_event(coord, "t", attempt == 1 ? "requeued" : "failed");
  }
}

// §12.6.7 "After the field checks (a `kind` of `coordinator` is refused with 402, §12.2.5) the
// broker SHALL decide a SUBMIT by these rules, in order: a live task with the same id gives
// SUBMITTED 411 (§12.4.4); a queue that already holds max-queue tasks gives SUBMITTED 412
// (§12.6.8); otherwise the task is created, queued with the timeouts and attempts of §12.7.2, and
// SUBMITTED is sent with `accepted` = true, `code` = 0, an empty `reason` and `queued` = the number
// of tasks in the queue ahead of it. Assignment (§12.6.4) runs only after that, so the SUBMITTED
// of a task always precedes its `assigned` TASK_EVENT."
TEST_CASE("SPEC 12.6.7: SUBMIT is decided in order and answered before assignment", "[spec]") {
  auto cfg = test_config();
  cfg.max_queue = 1;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  const auto first = submit_ok(coord, task_of("q", role::collector, {{"gpu", 1}}));
  CHECK(first.code == 0);
  CHECK(first.reason.empty());
  CHECK(first.queued == 0);
  refused(coord, task_of("q", role::coordinator), error_code::bad_field);  // 402 before 411
  coord.send(task_of("q"));
  CHECK(next_a<codec::submitted>(coord).code == code_of(error_code::duplicate_task));
  coord.send(task_of("r"));
  CHECK(next_a<codec::submitted>(coord).code == code_of(error_code::queue_full));
  coord.send(codec::cancel{"q", "x"});
  next_event(coord, "q", "cancelled");
  coord.send(task_of("r"));
  const auto accepted = next_a<codec::submitted>(coord);  // first the answer,
  CHECK(accepted.accepted);
  CHECK(accepted.queued == 0);
  next_event(coord, "r", "assigned");  // then the assignment
  CHECK(next_a<codec::task_start>(w).task_id == "r");
}

// §12.6.8 "a SUBMIT SHALL be refused with 412 when the queue already holds max-queue tasks. The
// queue is counted before assignment is tried, so even a task that a free worker could take at
// once is refused. Tasks in starting, running or closing do not count. A re-queue (§12.7.4) is
// never refused and may take the queue past max-queue for a time."
TEST_CASE("SPEC 12.6.8: max-queue bounds waiting tasks only, and never a re-queue", "[spec]") {
  auto cfg = test_config();
  cfg.max_queue = 1;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  submit_ok(coord, task_of("n1", role::collector, {{"gpu", 1}}));  // waits for ever
  coord.send(task_of("n2"));  // w could run it at once, but the queue is full
  CHECK(next_a<codec::submitted>(coord).code == code_of(error_code::queue_full));
  expect_quiet(w);
  coord.send(codec::cancel{"n1", "x"});
  next_event(coord, "n1", "cancelled");
  auto r = task_of("r1");
  r.max_attempts = 2;
  start_task(coord, w, r);  // running: not counted
  CHECK(submit_ok(coord, task_of("n3", role::collector, {{"gpu", 1}})).queued == 0);
  w.send(codec::task_failed{"r1", 1, "x"});  // re-queued into a full queue
  next_event(coord, "r1", "requeued");
  CHECK(next_a<codec::task_start>(w).attempt == 2);
  next_event(coord, "r1", "assigned");
  coord.send(task_of("n4"));
  CHECK(next_a<codec::submitted>(coord).code == code_of(error_code::queue_full));
}

// ---- §12.7 Timeouts and attempts --------------------------------------------------------------

// §12.7.1 "An attempt SHALL have exactly one deadline at a time: - start: set when the attempt
// begins (TASK_START), start timeout later;"
TEST_CASE_METHOD(fixture, "SPEC 12.7.1: the start deadline ends an attempt without STARTED",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  auto s = task_of("t");
  s.start_timeout_ms = 150;
  s.max_attempts = 1;
  const auto t0 = std::chrono::steady_clock::now();
  submit_ok(coord, s);
  next_a<codec::task_start>(w);
  next_event(coord, "t", "assigned");
  const auto abort = next_a<codec::task_abort>(w, 5000ms);
  CHECK(since(t0) >= 150ms);
  CHECK(abort.task_id == "t");
  CHECK(abort.attempt == 1);
  CHECK(abort.reason == "start timeout");
  CHECK(next_event(coord, "t", "failed").body == reason_body("start timeout", 1));
}

// §12.7.1 "- step: set on STARTED and again on every accepted DATA, INFO, GET_DATA and LEARN_INFO,
// step timeout later. The step timeout is thus the longest a running task may stay silent. Only
// the accepted worker messages above count: a HEARTBEAT, a refused message (§12.5.4) or a message
// from the coordinator does not;"
TEST_CASE_METHOD(fixture, "SPEC 12.7.1: the step deadline is the longest silence of a running task",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), l(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  const auto step = 300ms;
  const auto run = [&](raw_peer& worker, const std::string& id, role kind) {
    auto s = task_of(id, kind);
    s.step_timeout_ms = static_cast<std::uint32_t>(step.count());
    s.max_attempts = 1;
    start_task(coord, worker, s);
    auto last = std::chrono::steady_clock::now();
    // Three step timeouts of progress, one message every 40 ms: the attempt lives on.
    for (int i = 0; since(last) < step && i < 25; ++i) {
      last = std::chrono::steady_clock::now();
      if (kind == role::collector) {
        if (i % 2 == 0)
          worker.send(codec::data_ready{id, 1, "d", "b", codec::empty_map_blob, std::nullopt});
        else
          worker.send(codec::info{id, 1, codec::empty_map_blob});
        next_event(coord, id, i % 2 == 0 ? "data" : "info");
      } else {
        if (i % 2 == 0)
          worker.send(codec::get_data{id, 1, static_cast<std::uint64_t>(i + 1), "b", 1, 0});
        else
          worker.send(codec::learn_info{id, 1, "b", codec::empty_map_blob});
        next_event(coord, id, i % 2 == 0 ? "data_request" : "learn_info");
      }
      expect_quiet(worker);               // no TASK_ABORT so far
      std::this_thread::sleep_for(40ms);  // pacing the sender, not waiting for an outcome
    }
    // Now only HEARTBEATs: they do not count.
    std::optional<codec::task_abort> abort;
    while (!abort && since(last) < 5000ms) {
      worker.send(codec::heartbeat{});
      for (auto m = worker.recv(40ms); m && !abort; m = worker.recv(1ms))
        if (auto* a = std::get_if<codec::task_abort>(&*m)) abort = *a;
    }
    REQUIRE(abort);
    CHECK(since(last) >= step);
    CHECK(abort->reason == "step timeout");
    next_event(coord, id, "failed");
  };
  run(w, "c", role::collector);
  run(l, "L", role::learner);
}

// §12.7.1 "- close: set on FINISH, close timeout later, replacing the step deadline;"
TEST_CASE_METHOD(fixture, "SPEC 12.7.1: the close deadline bounds the wait for RESULT", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  auto s = task_of("t");
  s.close_timeout_ms = 150;
  s.max_attempts = 1;
  start_task(coord, w, s);
  const auto t0 = std::chrono::steady_clock::now();
  coord.send(codec::finish{"t"});
  next_a<codec::task_close>(w);
  const auto abort = next_a<codec::task_abort>(w, 5000ms);
  CHECK(since(t0) >= 150ms);
  CHECK(abort.reason == "close timeout");
  CHECK(next_event(coord, "t", "failed").body == reason_body("close timeout", 1));
}

// §12.7.1 "- task: every deadline above SHALL be capped at the task timeout after the attempt
// began, so the task timeout bounds the whole attempt, from TASK_START to RESULT."
TEST_CASE_METHOD(fixture, "SPEC 12.7.1: the task timeout caps every deadline of an attempt",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), w2(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(w2, "w2", role::collector, {{"slot", 1}});
  auto s = task_of("busy");
  s.task_timeout_ms = 400;
  s.max_attempts = 1;
  const auto t0 = std::chrono::steady_clock::now();
  start_task(coord, w, s);
  // Progress all along does not help: the cap holds.
  std::optional<codec::task_abort> abort;
  while (!abort && since(t0) < 5000ms) {
    w.send(codec::info{"busy", 1, codec::empty_map_blob});
    for (auto m = w.recv(30ms); m && !abort; m = w.recv(1ms))
      if (auto* a = std::get_if<codec::task_abort>(&*m)) abort = *a;
  }
  REQUIRE(abort);
  CHECK(since(t0) >= 400ms);
  CHECK(abort->reason == "task timeout");
  // It caps the start deadline (10 s by default) as well.
  auto slow = task_of("slow", role::collector, {{"slot", 1}});  // for w2, w being free too
  slow.task_timeout_ms = 150;
  slow.max_attempts = 1;
  const auto t1 = std::chrono::steady_clock::now();
  coord.send(slow);
  CHECK(next_a<codec::task_start>(w2).task_id == "slow");
  CHECK(next_a<codec::task_abort>(w2, 5000ms).reason == "task timeout");
  CHECK(since(t1) >= 150ms);
}

// §12.7.2 "Each timeout of a task SHALL be its SUBMIT's field (§12.2.4) when present and
// otherwise the broker's setting (§1.4: start-timeout, step-timeout, close-timeout, task-timeout);
// `max_attempts` likewise (max-attempts)."
TEST_CASE("SPEC 12.7.2: a SUBMIT's timeouts and attempts win over the broker's settings",
          "[spec]") {
  auto cfg = test_config();
  cfg.start_timeout_ms = 150;
  cfg.max_attempts = 2;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w1(b.ctx, b.router), w2(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w1, "w1", role::collector, {{"slot", 1}});
  join(w2, "w2", role::collector, {{"slot", 2}});
  auto own = task_of("own", role::collector, {{"slot", 2}});
  own.start_timeout_ms = 60'000;
  own.max_attempts = 1;
  submit_ok(coord, own);
  next_a<codec::task_start>(w2);
  next_event(coord, "own", "assigned");
  const auto t0 = std::chrono::steady_clock::now();
  submit_ok(coord, task_of("dflt", role::collector, {{"slot", 1}}));
  for (std::uint32_t attempt = 1; attempt <= 2; ++attempt) {  // max-attempts 2
    CHECK(next_a<codec::task_start>(w1).attempt == attempt);
    next_event(coord, "dflt", "assigned");
    CHECK(next_a<codec::task_abort>(w1, 5000ms).reason == "start timeout");
    next_event(coord, "dflt", attempt == 1 ? "requeued" : "failed");
  }
  CHECK(since(t0) >= 300ms);
  expect_quiet(w2);  // "own" has outlived the broker's start timeout twice over
  expect_quiet(w1);  // and "dflt" ran exactly max-attempts attempts
  w2.send(codec::task_failed{"own", 1, "x"});
  next_event(coord, "own", "failed");  // its own max_attempts, 1
}

// §12.7.3 "When an attempt's deadline passes, the broker SHALL send its holder TASK_ABORT for that
// attempt, with `reason` = `task timeout` when the deadline was the cap and otherwise `start
// timeout`, `step timeout` or `close timeout` after the task's state (starting, running, closing);
// the holder is free at once, and the attempt ends with that reason (§12.7.4). The broker SHALL NOT
// end an attempt before its deadline"
TEST_CASE_METHOD(fixture, "SPEC 12.7.3: an expired attempt is aborted and its worker freed",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  auto s = task_of("t");
  s.step_timeout_ms = 200;
  s.max_attempts = 2;
  start_task(coord, w, s);
  submit_ok(coord, task_of("next", role::collector));
  const auto t0 = std::chrono::steady_clock::now();
  w.send(codec::info{"t", 1, codec::empty_map_blob});
  next_event(coord, "t", "info");
  const auto abort = next_a<codec::task_abort>(w, 5000ms);
  CHECK(since(t0) >= 200ms);  // never before the deadline
  CHECK(abort.task_id == "t");
  CHECK(abort.attempt == 1);
  CHECK(abort.reason == "step timeout");
  const auto requeued = next_event(coord, "t", "requeued");
  CHECK(requeued.body == reason_body("step timeout", 1));
  CHECK(requeued.worker_id == "w");
  // Free at once: the very next message is the next TASK_START (t's own next attempt: w is the
  // only worker, and t is ahead of "next" in the queue).
  const auto again = next_a<codec::task_start>(w);
  CHECK(again.task_id == "t");
  CHECK(again.attempt == 2);
}

// §12.7.4 "An attempt SHALL end when: 1. its deadline passes (§12.7.3); 2. its holder sends
// TASK_FAILED for it ...: the holder is free at once and gets no TASK_ABORT ...; 3. its holder's
// session ends ...: nothing is sent to the holder ... If the attempt's number is less than the
// task's `max_attempts`, the task SHALL be re-queued ... Otherwise the task SHALL fail: `failed` is
// emitted and the task is forgotten; its id is free."
TEST_CASE_METHOD(fixture, "SPEC 12.7.4: attempts end, re-queue, and fail after max_attempts",
                 "[spec]") {
  raw_peer coord(ctx, router), w1(ctx, router), w2(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w1, "w1", role::collector);
  join(w2, "w2", role::collector);
  auto s = task_of("t");
  s.max_attempts = 3;
  start_task(coord, w1, s);
  w1.send(codec::task_failed{"t", 1, "env crashed"});
  auto e = next_event(coord, "t", "requeued");
  CHECK(e.attempt == 1);
  CHECK(e.worker_id == "w1");
  CHECK(e.body == reason_body("worker reported: env crashed", 1));
  CHECK(next_a<codec::task_start>(w2).attempt == 2);
  next_event(coord, "t", "assigned");
  expect_quiet(w1);  // no TASK_ABORT for a TASK_FAILED
  w2.send(codec::started{"t", 2});
  next_event(coord, "t", "started");
  w2.send(codec::disconnect{200, "leaving"});
  e = next_event(coord, "t", "requeued");
  CHECK(e.attempt == 2);
  CHECK(e.worker_id == "w2");
  CHECK(e.body == reason_body("worker w2 lost", 2));
  CHECK(next_a<codec::task_start>(w1).attempt == 3);
  next_event(coord, "t", "assigned");
  w1.send(codec::task_failed{"t", 3, "again"});
  e = next_event(coord, "t", "failed");
  CHECK(e.attempt == 3);
  CHECK(e.body == reason_body("worker reported: again", 3));
  expect_quiet(w1);                               // no attempt 4
  submit_ok(coord, task_of("t", role::learner));  // forgotten, its id free
}

// §12.7.5 "A worker message about the task carrying `attempt` = a SHALL be judged in this order:
// 1. a < n: refused with 407, whoever sends it; 2. a = n, the task is queued again and the sender
// was the worker of attempt n: refused with 407; 3. a = n and the sender holds attempt n: accepted
// by fencing; the state decides (§12.5.3); 4. otherwise (a > n, or a = n from a worker that
// neither holds nor held attempt n): refused with 406. A worker message about a task that is not
// live is refused with 406. Every 407 is counted as stale."
TEST_CASE_METHOD(fixture, "SPEC 12.7.5: fencing judges a worker message by its attempt", "[spec]") {
  raw_peer coord(ctx, router), w1(ctx, router), w2(ctx, router), l(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w1, "w1", role::collector);
  join(w2, "w2", role::collector);
  join(l, "l", role::learner);
  const auto info = [](std::uint32_t attempt) {
    return codec::info{"t", attempt, codec::empty_map_blob};
  };
  auto e = task_of("e");
  e.max_attempts = 2;
  start_task(coord, w1, e);
  auto t = task_of("t");
  t.max_attempts = 3;
  submit_ok(coord, t);
  next_a<codec::task_start>(w2);
  next_event(coord, "t", "assigned");
  refused(w2, info(2), error_code::unknown_task);  // 4: a > n
  refused(w1, info(1), error_code::unknown_task);  // 4: a = n, neither holds nor held it
  w2.send(codec::started{"t", 1});                 // 3: the holder at n
  next_event(coord, "t", "started");
  // e's worker goes; e waits. Then t's attempt 1 ends on w2, and e (ahead of t) takes w2: t is
  // queued again with n = 1.
  w1.send(codec::disconnect{200, "bye"});
  next_event(coord, "e", "requeued");
  w2.send(codec::task_failed{"t", 1, "x"});
  next_event(coord, "t", "requeued");
  CHECK(next_a<codec::task_start>(w2).task_id == "e");
  next_event(coord, "e", "assigned");
  refused(w2, info(1), error_code::stale_attempt);  // 2: it ran attempt n, which ended
  refused(l, info(1), error_code::unknown_task);    // 4: it never did
  raw_peer w3(ctx, router);
  join(w3, "w3", role::collector);
  CHECK(next_a<codec::task_start>(w3).attempt == 2);
  next_event(coord, "t", "assigned");
  refused(l, info(1), error_code::stale_attempt);  // 1: a < n, whoever sends it
  refused(w2, info(1), error_code::stale_attempt);
  // 4: w2 ran attempt 1, not attempt n = 2, which runs on w3: it neither holds nor held n.
  refused(w2, info(2), error_code::unknown_task);
  refused(w2, codec::started{"t", 2}, error_code::unknown_task);
  coord.send(codec::cancel{"t", "x"});
  next_a<codec::task_abort>(w3);
  next_event(coord, "t", "cancelled");
  refused(w3, info(2), error_code::unknown_task);  // not live
  CHECK(wait_until([&] { return broker.get().snapshot().stale_messages == 3; }));
}

// ---- §12.8 The coordinator's stream ----------------------------------------------------------

// §12.8.1 "`seq` SHALL be 1 for the first TASK_EVENT of a stream and grow by exactly one per
// TASK_EVENT, across all the coordinator's tasks. Streams of different coordinators are
// independent. A stream lives as long as the coordinator's session: a resumption (§8.6) continues
// it; when the session ends the stream is dropped (§12.5.8), and a later session with the same id
// starts a new stream at 1."
TEST_CASE_METHOD(fixture, "SPEC 12.8.1: each coordinator's stream counts from 1 by one", "[spec]") {
  raw_peer a(ctx, router), b(ctx, router), w1(ctx, router), w2(ctx, router);
  const auto token = join(a, "a", role::coordinator).session;
  join(b, "b", role::coordinator);
  join(w1, "w1", role::collector);
  join(w2, "w2", role::collector);
  submit_ok(a, task_of("a1"));
  next_a<codec::task_start>(w1);
  CHECK(next_event(a, "a1", "assigned").seq == 1);
  submit_ok(b, task_of("b1"));
  next_a<codec::task_start>(w2);
  CHECK(next_event(b, "b1", "assigned").seq == 1);  // b's own stream
  w1.send(codec::started{"a1", 1});
  CHECK(next_event(a, "a1", "started").seq == 2);
  submit_ok(a, task_of("a2", role::learner));
  a.send(codec::cancel{"a2", "x"});
  CHECK(next_event(a, "a2", "cancelled").seq == 3);  // across tasks
  w1.send(codec::info{"a1", 1, codec::empty_map_blob});
  CHECK(next_event(a, "a1", "info").seq == 4);
  // A resumption continues the stream.
  raw_peer a2(ctx, router);
  a2.send(codec::hello{role::coordinator, "a", 30'000, {}, token});
  CHECK(next_a<codec::welcome>(a2).resumed);
  w1.send(codec::info{"a1", 1, codec::empty_map_blob});
  CHECK(next_event(a2, "a1", "info").seq == 5);
  // An end drops it; a new session of the same id starts again at 1.
  a2.send(codec::disconnect{200, "bye"});
  next_a<codec::task_abort>(w1);
  raw_peer a3(ctx, router);
  join(a3, "a", role::coordinator);
  submit_ok(a3, task_of("a3"));
  next_a<codec::task_start>(w1);
  CHECK(next_event(a3, "a3", "assigned").seq == 1);
  w2.send(codec::started{"b1", 1});
  CHECK(next_event(b, "b1", "started").seq == 2);
}

// §12.8.2 "A TASK_EVENT is sent like any reply (§10.4): when the owner's connection is gone or its
// queue is full it is dropped and not retried. It keeps its `seq`, so the coordinator sees the
// gap."
TEST_CASE_METHOD(fixture, "SPEC 12.8.2: an undeliverable TASK_EVENT leaves a gap in seq",
                 "[spec]") {
  auto a = std::make_unique<raw_peer>(ctx, router);
  raw_peer w(ctx, router);
  const auto token = join(*a, "a", role::coordinator).session;
  join(w, "w", role::collector);
  start_task(*a, w, task_of("t"));                     // seq 1, 2
  a.reset();                                           // the connection goes; the session stays
  w.send(codec::info{"t", 1, codec::empty_map_blob});  // seq 3, undeliverable
  expect_quiet(w);                                     // the broker has handled it
  raw_peer again(ctx, router);
  again.send(codec::hello{role::coordinator, "a", 30'000, {}, token});
  CHECK(next_a<codec::welcome>(again).resumed);
  w.send(codec::info{"t", 1, codec::empty_map_blob});
  CHECK(next_event(again, "t", "info").seq == 4);  // 3 was not retried
  expect_quiet(again);
}

// §12.8.4 "For every TASK_EVENT the broker SHALL also publish, right after sending it, an event
// (§7) on topic `task.<coordinator>.<event>`, where `<coordinator>` is the owner's id and `<event>`
// the TASK_EVENT's `event`, with body task_status (§7.5): `task_id` and the task's `kind`;
// `attempt` and `worker_id` as in the TASK_EVENT; `detail` = the worker id for `assigned`, the
// `data_id` for `data`, the `reason` for `requeued`, `failed` and `cancelled`, and empty for the
// other events. User data is never published." §7.4 (table) "`task.<coordinator>.<event>` | a
// TASK_EVENT `<event>` was sent to coordinator `<coordinator>` (§12.8.4) | task_status"
TEST_CASE_METHOD(fixture, "SPEC 12.8.4, 7.4: every TASK_EVENT is copied to the PUB as task status",
                 "[spec]") {
  raw_events raw(ctx, broker.get().events_endpoint());
  REQUIRE(raw.next("broker.heartbeat", ""));
  raw_peer coord(ctx, router), w(ctx, router), l(ctx, router);
  const std::string me = "lab.coord";  // a dot in the id: the event is after the last one
  join(coord, me, role::coordinator);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  const std::string secret = "user-data-never-published";
  const auto user = packed([&](packer& pk) {
    pk.pack_map(1);
    pk.pack("k").pack(secret);
  });
  std::vector<codec::task_event> stream;
  const auto take = [&](const std::string& id, const std::string& event) {
    stream.push_back(next_event(coord, id, event));
  };
  auto c = task_of("c");
  c.task_info = user;
  c.max_attempts = 2;
  submit_ok(coord, c);
  next_a<codec::task_start>(w);
  take("c", "assigned");
  w.send(codec::started{"c", 1});
  take("c", "started");
  w.send(codec::data_ready{"c", 1, "d-17", "b", user, secret});
  take("c", "data");
  w.send(codec::info{"c", 1, user});
  take("c", "info");
  w.send(codec::task_failed{"c", 1, "flaky"});
  take("c", "requeued");
  next_a<codec::task_start>(w);
  take("c", "assigned");
  w.send(codec::started{"c", 2});
  take("c", "started");
  coord.send(codec::finish{"c"});
  next_a<codec::task_close>(w);
  w.send(codec::task_result{"c", 2, user});
  take("c", "finished");
  auto lt = task_of("L", role::learner);
  lt.max_attempts = 1;
  submit_ok(coord, lt);
  next_a<codec::task_start>(l);
  take("L", "assigned");
  l.send(codec::started{"L", 1});
  take("L", "started");
  l.send(codec::get_data{"L", 1, 1, "b", 4, 0});
  take("L", "data_request");
  l.send(codec::learn_info{"L", 1, "b", user});
  take("L", "learn_info");
  l.send(codec::task_failed{"L", 1, "oom"});
  take("L", "failed");
  submit_ok(coord, task_of("x", role::learner));
  next_a<codec::task_start>(l);
  take("x", "assigned");
  coord.send(codec::cancel{"x", "enough"});
  next_a<codec::task_abort>(l);
  take("x", "cancelled");

  std::vector<raw_events::item> copies;
  while (copies.size() < stream.size()) {
    const auto e = raw.next(3000ms);
    REQUIRE(e);
    if (e->topic.rfind("task.", 0) == 0) copies.push_back(raw.seen().back());
  }
  for (std::size_t i = 0; i < stream.size(); ++i) {
    const auto& te = stream[i];
    const auto& pub = copies[i];
    INFO("TASK_EVENT " << te.seq << " " << te.event);
    CHECK(pub.topic == "task." + me + "." + te.event);
    const auto* st = std::get_if<codec::task_status>(&pub.event.body);
    REQUIRE(st != nullptr);
    CHECK(st->task_id == te.task_id);
    CHECK(st->kind == (te.task_id == "c" ? role::collector : role::learner));
    CHECK(st->attempt == te.attempt);
    CHECK(st->worker_id == te.worker_id);
    std::string detail;
    if (te.event == "assigned") detail = te.worker_id;
    if (te.event == "data") detail = "d-17";
    if (te.event == "requeued") detail = "worker reported: flaky";
    if (te.event == "failed") detail = "worker reported: oom";
    if (te.event == "cancelled") detail = "enough";
    CHECK(st->detail == detail);
    check_canonical(pub.body,
                    {"seq", "epoch", "ts_ms", "task_id", "kind", "attempt", "worker_id", "detail"});
    CHECK_FALSE(contains(pub.body, secret));
  }
}

// §12.3.5 "| 4 | `retry_ms` | uint | optional | 0..3600000: with nil `data`, the NO_DATA's
// `retry_ms` (§12.5.9); ignored with a batch |"; §12.5.9 "its `retry_ms` being the DATA_REPLY's
// `retry_ms` when present and otherwise the broker's no-data-retry setting (§1.4)"
TEST_CASE("SPEC 12.5.9: NO_DATA carries the DATA_REPLY's retry_ms, else the setting", "[spec]") {
  auto cfg = test_config();
  cfg.no_data_retry_ms = 33;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), l(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(l, "l", role::learner);
  start_task(coord, l, task_of("t", role::learner));
  const auto ask = [&](std::uint64_t req) {
    l.send(codec::get_data{"t", 1, req, "b", 1, 0});
    next_event(coord, "t", "data_request");
  };
  ask(1);
  codec::data_reply hinted{"t", 1, codec::nil_blob};
  hinted.retry_ms = 750;
  coord.send(hinted);
  auto n = next_a<codec::no_data>(l);
  CHECK(n.request_id == 1);
  CHECK(n.retry_ms == 750);
  ask(2);
  coord.send(codec::data_reply{"t", 2, codec::nil_blob});
  CHECK(next_a<codec::no_data>(l).retry_ms == 33);
  ask(3);
  codec::data_reply zero{"t", 3, codec::nil_blob};
  zero.retry_ms = 0;
  coord.send(zero);
  CHECK(next_a<codec::no_data>(l).retry_ms == 0);
  ask(4);
  codec::data_reply batch{"t", 4, "\x91\x01"s};
  batch.retry_ms = 500;  // ignored: there is data
  coord.send(batch);
  CHECK(next_a<codec::learn>(l).data == "\x91\x01"s);
  ask(5);
  codec::data_reply too_long{"t", 5, codec::nil_blob};
  too_long.retry_ms = 3'600'001;
  refused(coord, too_long, error_code::bad_field);
  too_long.retry_ms = 3'600'000;
  coord.send(too_long);
  CHECK(next_a<codec::no_data>(l).retry_ms == 3'600'000);
}
