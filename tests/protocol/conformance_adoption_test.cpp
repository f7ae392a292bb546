// Conformance, SPEC §12.5.8 and §4.2.1: a coordinator that vanishes without DISCONNECT leaves
// its tasks and stream for a new session of its id to adopt. Run against the real broker over
// tcp with raw DEALERs; each test quotes the clause it checks ("..." marks a cut), and every
// wait has a deadline.
#include <catch2/catch.hpp>

#include <string>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using codec::error_code;

namespace {

// Sets up coordinator `c` (windowed, long heartbeat), then lets its session expire: a repeated
// HELLO re-agrees a 20 ms heartbeat (a 60 ms window) and the peer goes silent.
void vanish(raw_peer& c, const std::string& id) {
  c.send(codec::hello{role::coordinator, id, 20, {}, std::nullopt});
  REQUIRE(next_a<codec::welcome>(c).resumed);
  CHECK(next_a<codec::disconnect>(c, 5000ms).code == code_of(error_code::expired));
}

broker::config with_grace(std::uint32_t ms) {
  auto cfg = test_config();
  cfg.coordinator_grace_ms = ms;
  return cfg;
}

}  // namespace

// §12.5.8 "When it ends otherwise (expiry, DISCONNECT 429) ... its tasks and its stream are
// orphaned for coordinator-grace ... During the grace nothing changes for the tasks ... A HELLO
// that begins a new session with the same id and the role coordinator during the grace adopts
// them: the new session owns the tasks and continues the stream with the same numbering ... and
// its WELCOME carries `stream_acked`"
TEST_CASE("SPEC 12.5.8: a vanished coordinator's tasks run on, and a new session adopts them",
          "[spec]") {
  broker_with b(with_grace(60'000));
  raw_peer a(b.ctx, b.router), w(b.ctx, b.router);
  join(a, "crd", role::coordinator);
  join(w, "w", role::learner);                     // a windowed stream gives no learner credit
  a.send(codec::replay{1});                        // windowed
  start_task(a, w, task_of("t1", role::learner));  // seq 1 assigned, 2 started
  submit_ok(a, task_of("t2", role::learner, {{"gpu", 1}}));  // queued: nobody fits
  a.send(codec::ack{1});                                     // only `assigned` processed
  vanish(a, "crd");

  // The holder is not told anything; its task goes on and its steps are still made.
  w.send(codec::learn_info{"t1", 1, "buf", codec::empty_map_blob});  // seq 3, held
  expect_quiet(w);
  CHECK(b.broker.get().snapshot().coordinators_orphaned == 1);

  raw_peer again(b.ctx, b.router);  // a new process: no token
  again.send(codec::hello{role::coordinator, "crd", 30'000, {}, std::nullopt});
  const auto welcome = next_a<codec::welcome>(again);
  CHECK_FALSE(welcome.resumed);
  REQUIRE(welcome.stream_acked);
  CHECK(*welcome.stream_acked == 1);
  again.send(codec::replay{*welcome.stream_acked + 1});
  CHECK(next_event(again, "t1", "started").seq == 2);
  CHECK(next_event(again, "t1", "learn_info").seq == 3);
  // The tasks are the new session's: it steers them, and their ids are still taken.
  again.send(codec::finish{"t1"});
  next_a<codec::task_close>(w);
  w.send(codec::task_result{"t1", 1, codec::empty_map_blob});
  CHECK(next_event(again, "t1", "finished").seq == 4);
  again.send(codec::cancel{"t2"});
  CHECK(next_event(again, "t2", "cancelled").seq == 5);
  const auto s = b.broker.get().snapshot();
  CHECK(s.coordinator_adoptions == 1);
  CHECK(s.coordinators_orphaned == 0);
  CHECK(s.tasks_finished == 1);
}

// §12.5.8 "3. When the grace runs out without an adoption, the orphan ends as a DISCONNECT does
// ... every holder gets TASK_ABORT with `reason` = `its coordinator is gone` ... the tasks are
// forgotten and their ids are free, and the coordinator's stream is dropped"
TEST_CASE("SPEC 12.5.8: when the grace runs out, the orphan's tasks end", "[spec]") {
  broker_with b(with_grace(200));
  raw_peer a(b.ctx, b.router), w(b.ctx, b.router);
  join(a, "crd", role::coordinator);
  join(w, "w", role::collector);
  start_task(a, w, task_of("t1"));
  vanish(a, "crd");
  const auto abort = next_a<codec::task_abort>(w, 5000ms);
  CHECK(abort.task_id == "t1");
  CHECK(abort.reason == "its coordinator is gone");
  raw_peer again(b.ctx, b.router);
  const auto welcome = join(again, "crd", role::coordinator);
  CHECK_FALSE(welcome.stream_acked);  // nothing adopted: a new stream
  submit_ok(again, task_of("t1"));    // the id is free
  CHECK(next_event(again, "t1", "assigned").seq == 1);
  CHECK(b.broker.get().snapshot().coordinator_adoptions == 0);
}

// §12.5.8 "When a coordinator's session ends because it said DISCONNECT (it is done), the broker
// SHALL cancel every live task that coordinator owns at once" ... "orphaned ... when that is not 0
// and there is something to keep (a live task, or an event the coordinator has not
// acknowledged)"
TEST_CASE("SPEC 12.5.8: no orphan after DISCONNECT, with no grace, or with nothing to keep",
          "[spec]") {
  SECTION("DISCONNECT") {
    broker_with b(with_grace(60'000));
    raw_peer a(b.ctx, b.router), w(b.ctx, b.router);
    join(a, "crd", role::coordinator);
    join(w, "w", role::collector);
    start_task(a, w, task_of("t1"));
    a.send(codec::disconnect{200, "done"});
    CHECK(next_a<codec::task_abort>(w).reason == "its coordinator is gone");
    CHECK(b.broker.get().snapshot().coordinators_orphaned == 0);
  }
  SECTION("a grace of 0") {
    broker_with b(with_grace(0));
    raw_peer a(b.ctx, b.router), w(b.ctx, b.router);
    join(a, "crd", role::coordinator);
    join(w, "w", role::collector);
    start_task(a, w, task_of("t1"));
    vanish(a, "crd");
    CHECK(next_a<codec::task_abort>(w).reason == "its coordinator is gone");
  }
  SECTION("everything acknowledged, no task") {
    broker_with b(with_grace(60'000));
    raw_peer a(b.ctx, b.router), w(b.ctx, b.router);
    join(a, "crd", role::coordinator);
    join(w, "w", role::learner);
    a.send(codec::replay{1});
    start_task(a, w, task_of("t1", role::learner));
    a.send(codec::cancel{"t1"});
    CHECK(next_event(a, "t1", "cancelled").seq == 3);
    a.send(codec::ack{3});
    vanish(a, "crd");
    raw_peer again(b.ctx, b.router);
    CHECK_FALSE(join(again, "crd", role::coordinator).stream_acked);
    CHECK(b.broker.get().snapshot().coordinator_adoptions == 0);
  }
}

// §12.5.8 "This holds whether the HELLO carries an expired token or none ... (A live session still
// holds its id against every HELLO without its token, §8.6, so a restarted process is admitted
// once the old session has expired.)"
TEST_CASE("SPEC 12.5.8: an expired token adopts too; a live session still holds its id", "[spec]") {
  broker_with b(with_grace(60'000));
  raw_peer a(b.ctx, b.router), w(b.ctx, b.router);
  const auto token = join(a, "crd", role::coordinator).session;
  join(w, "w", role::collector);
  start_task(a, w, task_of("t1"));
  raw_peer early(b.ctx, b.router);  // a restarted process, while the old session lives
  early.send(codec::hello{role::coordinator, "crd", 30'000, {}, std::nullopt});
  next_error(early, error_code::duplicate_id, ref(type_hello));
  vanish(a, "crd");
  raw_peer again(b.ctx, b.router);
  again.send(codec::hello{role::coordinator, "crd", 30'000, {}, token});
  const auto welcome = next_a<codec::welcome>(again);
  CHECK_FALSE(welcome.resumed);  // a new session: the old one expired
  CHECK(welcome.session != token);
  REQUIRE(welcome.stream_acked);
  CHECK(*welcome.stream_acked == 0);  // a plain stream: nothing was acknowledged
}
