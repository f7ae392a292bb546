// Task manager: assignment, queueing, both task kinds' flows, timeouts at every step,
// attempts and fencing, lost workers, coordinator isolation, and the coordinator's stream:
// replay from the ring, lost events, the window and data credit. Driven with a fake clock and a
// fake sink, so every timeout is exact and nothing depends on scheduling.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "broker/tasks/task_manager.hpp"
#include "codec/codec.hpp"
#include "codec/map_writer.hpp"
#include "support/fake_sink.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace std::chrono_literals;
using broker::task_manager;
using test::fake_sink;
using test::range;

namespace {

struct fixture {
  broker::config cfg;
  fake_sink sink;
  util::time_point now = util::clock::now();
  std::unique_ptr<task_manager> tm;
  std::uint64_t serial = 0;

  fixture() {
    cfg.start_timeout_ms = 100;
    cfg.step_timeout_ms = 1000;
    cfg.close_timeout_ms = 200;
    cfg.task_timeout_ms = 60'000;
    cfg.max_attempts = 2;
    cfg.max_queue = 4;
    tm = std::make_unique<task_manager>(cfg, sink);
  }
  void join(const std::string& id, role r, rlbus::resources res = {}) {
    tm->peer_joined(id, r, res, ++serial, now);
  }
  std::optional<broker::refusal> say(const std::string& from, role r, codec::message m) {
    return tm->handle(from, r, std::move(m), now);
  }
  void ok(const std::string& from, role r, codec::message m) {
    const auto refused = say(from, r, std::move(m));
    INFO((refused ? refused->reason : ""));
    REQUIRE_FALSE(refused);
  }
  codec::submitted submit(const std::string& coord, const std::string& task_id, role kind,
                          rlbus::resources need = {}) {
    ok(coord, role::coordinator,
       codec::submit{task_id, kind, codec::empty_map_blob, std::move(need), {}, {}, {}, {}, {}});
    return sink.take_first<codec::submitted>(coord);
  }
  void advance(std::chrono::milliseconds d) {
    now += d;
    tm->on_timers(now);
  }
};

}  // namespace

TEST_CASE_METHOD(fixture, "a submitted task goes to a free worker of its kind", "[unit][tasks]") {
  join("c0", role::collector);
  join("l0", role::learner);
  const auto s = submit("coord", "t1", role::learner);
  CHECK(s.accepted);
  CHECK(s.queued == 0);
  const auto start = sink.take<codec::task_start>("l0");
  CHECK(start.task_id == "t1");
  CHECK(start.attempt == 1);
  CHECK(start.kind == role::learner);
  const auto e = sink.event("coord", "assigned");
  CHECK(e.worker_id == "l0");
  CHECK(e.seq == 1);
  CHECK(sink.empty("c0"));
}

TEST_CASE_METHOD(fixture, "tasks wait in FIFO order until a fitting worker is free",
                 "[unit][tasks]") {
  CHECK(submit("coord", "gpu-task", role::collector, {{"gpu", 1}}).queued == 0);
  CHECK(submit("coord", "cpu-task", role::collector).queued == 1);
  CHECK(tm->counts().queued == 2);
  join("cpu-only", role::collector, {{"cpu", 8}});
  // the GPU task does not fit, so it does not block the CPU task behind it
  CHECK(sink.take<codec::task_start>("cpu-only").task_id == "cpu-task");
  join("gpu-box", role::collector, {{"gpu", 2}});
  CHECK(sink.take<codec::task_start>("gpu-box").task_id == "gpu-task");
  CHECK(tm->counts().queued == 0);
  CHECK(tm->counts().running == 2);
}

TEST_CASE_METHOD(fixture, "among fitting workers the earliest joined is chosen", "[unit][tasks]") {
  join("w-a", role::collector, {{"cpu", 1}});
  join("w-b", role::collector, {{"cpu", 4}});
  join("w-c", role::collector, {{"cpu", 4}});
  submit("coord", "t", role::collector, {{"cpu", 2}});
  CHECK(sink.take<codec::task_start>("w-b").task_id == "t");
}

TEST_CASE_METHOD(fixture, "the queue is bounded and task ids are unique", "[unit][tasks]") {
  for (int i = 0; i < 4; ++i)
    CHECK(submit("coord", "q" + std::to_string(i), role::learner).accepted);
  auto full = submit("coord", "q4", role::learner);
  CHECK_FALSE(full.accepted);
  CHECK(full.code == 412);
  auto dup = submit("coord", "q0", role::learner);
  CHECK_FALSE(dup.accepted);
  CHECK(dup.code == 411);
  const auto r =
      say("coord", role::coordinator,
          codec::submit{"bad", role::coordinator, codec::empty_map_blob, {}, {}, {}, {}, {}, {}});
  REQUIRE(r);
  CHECK(r->code == codec::error_code::bad_field);
}

TEST_CASE_METHOD(fixture, "a collector task runs start -> data -> info -> finish -> result",
                 "[unit][tasks]") {
  join("c0", role::collector);
  submit("coord", "ct", role::collector);
  sink.take<codec::task_start>("c0");
  sink.event("coord", "assigned");
  ok("c0", role::collector, codec::started{"ct", 1});
  sink.event("coord", "started");
  for (int i = 0; i < 20; ++i) {
    ok("c0", role::collector,
       codec::data_ready{"ct", 1, "d" + std::to_string(i), "buf", codec::empty_map_blob,
                         std::nullopt});
    const auto e = sink.event("coord", "data");
    CHECK(e.seq == static_cast<std::uint64_t>(3 + i));
  }
  ok("c0", role::collector, codec::info{"ct", 1, codec::empty_map_blob});
  sink.event("coord", "info");
  ok("coord", role::coordinator, codec::finish{"ct"});
  CHECK(sink.take<codec::task_close>("c0").attempt == 1);
  ok("c0", role::collector, codec::task_result{"ct", 1, codec::empty_map_blob});
  sink.event("coord", "finished");
  CHECK(tm->counts().finished == 1);
  CHECK(tm->counts().running == 0);
  // the worker is free again
  submit("coord", "ct2", role::collector);
  CHECK(sink.take<codec::task_start>("c0").task_id == "ct2");
}

// The metrics' histograms: queued -> assigned for each attempt, start -> RESULT for each
// finished attempt, by the broker's clock.
TEST_CASE_METHOD(fixture, "the assignment latency and the task duration are measured",
                 "[unit][tasks]") {
  submit("coord", "wait", role::collector);  // queued: no collector yet
  now += 250ms;
  join("c0", role::collector);  // assigned 250 ms after it was queued
  sink.take<codec::task_start>("c0");
  ok("c0", role::collector, codec::started{"wait", 1});
  now += 2s;
  ok("coord", role::coordinator, codec::finish{"wait"});
  ok("c0", role::collector, codec::task_result{"wait", 1, codec::empty_map_blob});
  const auto latency = tm->assignment_latency().counts();
  CHECK(latency.count == 1);
  CHECK(latency.at_most[4] == 0);  // <= 0.1 s
  CHECK(latency.at_most[5] == 1);  // <= 0.5 s
  CHECK(latency.sum_seconds == Approx(0.25));
  const auto duration = tm->task_duration().counts();
  CHECK(duration.count == 1);
  CHECK(duration.at_most[6] == 0);  // <= 1 s
  CHECK(duration.at_most[7] == 1);  // <= 5 s
  CHECK(duration.sum_seconds == Approx(2.0));
}

TEST_CASE_METHOD(fixture, "queued tasks are counted by the resources they require",
                 "[unit][tasks]") {
  submit("coord", "a", role::collector, {{"gpu", 1}});
  submit("coord", "b", role::collector, {{"gpu", 1}});
  submit("coord", "c", role::collector, {{"cpu", 2}, {"gpu", 1}});
  submit("coord", "d", role::learner);
  using shapes = std::vector<std::pair<std::string, std::uint64_t>>;
  CHECK(tm->queued_by_shape() == shapes{{"", 1}, {"cpu=2,gpu=1", 1}, {"gpu=1", 2}});
  join("c0", role::collector, {{"gpu", 1}});  // takes "a": one gpu=1 is left
  CHECK(tm->queued_by_shape() == shapes{{"", 1}, {"cpu=2,gpu=1", 1}, {"gpu=1", 1}});
}

TEST_CASE_METHOD(fixture, "a learner task asks for data, waits for it, learns and finishes",
                 "[unit][tasks]") {
  join("l0", role::learner);
  submit("coord", "lt", role::learner);
  sink.take<codec::task_start>("l0");
  ok("l0", role::learner, codec::started{"lt", 1});
  ok("l0", role::learner, codec::get_data{"lt", 1, 1, "buf", 32, 0});
  sink.event("coord", "assigned");
  sink.event("coord", "started");
  sink.event("coord", "data_request");
  ok("coord", role::coordinator, codec::data_reply{"lt", 1, codec::nil_blob});
  const auto wait = sink.take<codec::no_data>("l0");
  CHECK(wait.request_id == 1);
  CHECK(wait.retry_ms == cfg.no_data_retry_ms);
  // a second reply to an answered request is refused
  const auto again = say("coord", role::coordinator, codec::data_reply{"lt", 1, codec::nil_blob});
  REQUIRE(again);
  CHECK(again->code == codec::error_code::wrong_state);
  for (std::uint64_t step = 0; step < 5; ++step) {
    ok("l0", role::learner, codec::get_data{"lt", 1, 2 + step, "buf", 32, step});
    sink.event("coord", "data_request");
    ok("coord", role::coordinator, codec::data_reply{"lt", 2 + step, codec::empty_map_blob});
    CHECK(sink.take<codec::learn>("l0").request_id == 2 + step);
    ok("l0", role::learner, codec::learn_info{"lt", 1, "buf", codec::empty_map_blob});
    sink.event("coord", "learn_info");
  }
  ok("coord", role::coordinator, codec::finish{"lt"});
  sink.take<codec::task_close>("l0");
  ok("l0", role::learner, codec::task_result{"lt", 1, codec::empty_map_blob});
  sink.event("coord", "finished");
}

TEST_CASE_METHOD(fixture, "every step has a timeout that ends the attempt", "[unit][tasks]") {
  join("w1", role::collector);
  join("w2", role::collector);
  cfg.max_attempts = 3;
  SECTION("start") {
    submit("coord", "t", role::collector);
    sink.take<codec::task_start>("w1");
    advance(99ms);
    CHECK(sink.empty("w1"));
    advance(1ms);
    CHECK(sink.take<codec::task_abort>("w1").reason == "start timeout");
  }
  SECTION("step") {
    submit("coord", "t", role::collector);
    sink.take<codec::task_start>("w1");
    ok("w1", role::collector, codec::started{"t", 1});
    advance(900ms);
    ok("w1", role::collector, codec::info{"t", 1, codec::empty_map_blob});  // progress resets it
    advance(900ms);
    CHECK(sink.empty("w1"));
    advance(100ms);
    CHECK(sink.take<codec::task_abort>("w1").reason == "step timeout");
  }
  SECTION("close") {
    submit("coord", "t", role::collector);
    sink.take<codec::task_start>("w1");
    ok("w1", role::collector, codec::started{"t", 1});
    ok("coord", role::coordinator, codec::finish{"t"});
    sink.take<codec::task_close>("w1");
    advance(200ms);
    CHECK(sink.take<codec::task_abort>("w1").reason == "close timeout");
  }
  // in every case the task went back to the queue and on to the next free worker
  const auto restart = sink.take<codec::task_start>("w2");
  CHECK(restart.attempt == 2);
  CHECK(tm->counts().requeued == 1);
}

TEST_CASE_METHOD(fixture, "past max attempts a task fails with an event", "[unit][tasks]") {
  join("w1", role::collector);
  submit("coord", "t", role::collector);
  sink.take<codec::task_start>("w1");
  advance(100ms);  // attempt 1: start timeout, re-queued, goes to w1 again
  sink.take<codec::task_abort>("w1");
  CHECK(sink.take<codec::task_start>("w1").attempt == 2);
  advance(100ms);  // attempt 2 of 2
  sink.take<codec::task_abort>("w1");
  sink.event("coord", "assigned");
  sink.event("coord", "requeued");
  sink.event("coord", "assigned");
  const auto failed = sink.event("coord", "failed");
  CHECK(failed.attempt == 2);
  CHECK(tm->counts().failed == 1);
  CHECK(tm->counts().queued == 0);
  CHECK(tm->counts().running == 0);
}

TEST_CASE_METHOD(fixture, "a result from an ended attempt is refused as stale", "[unit][tasks]") {
  join("slow", role::collector);
  submit("coord", "t", role::collector);
  sink.take<codec::task_start>("slow");
  advance(100ms);  // start timeout: attempt 1 ends
  join("fresh", role::collector);
  // "slow" is free again and first in line, so attempt 2 goes to it; make it busy first
  (void)sink.take<codec::task_abort>("slow");
  const auto s2 = sink.take<codec::task_start>("slow");
  CHECK(s2.attempt == 2);
  const auto r = say("slow", role::collector, codec::started{"t", 1});
  REQUIRE(r);
  CHECK(r->code == codec::error_code::stale_attempt);
  CHECK(tm->counts().stale == 1);
  ok("slow", role::collector, codec::started{"t", 2});
}

TEST_CASE_METHOD(fixture, "a worker that died mid-task has its task re-assigned", "[unit][tasks]") {
  join("doomed", role::collector);
  join("spare", role::collector);
  submit("coord", "t", role::collector);
  sink.take<codec::task_start>("doomed");
  ok("doomed", role::collector, codec::started{"t", 1});
  tm->peer_gone("doomed", role::collector, now);
  const auto s = sink.take<codec::task_start>("spare");
  CHECK(s.attempt == 2);
  sink.event("coord", "assigned");
  sink.event("coord", "started");
  const auto rq = sink.event("coord", "requeued");
  CHECK(rq.worker_id == "doomed");
  ok("spare", role::collector, codec::started{"t", 2});
  ok("coord", role::coordinator, codec::finish{"t"});
  sink.take<codec::task_close>("spare");
  ok("spare", role::collector, codec::task_result{"t", 2, codec::empty_map_blob});
  CHECK(tm->counts().finished == 1);
  // the dead worker's late message (it came back with the same id) is stale or unknown
  join("doomed", role::collector);
  CHECK(say("doomed", role::collector, codec::task_result{"t", 1, codec::empty_map_blob}));
}

TEST_CASE_METHOD(fixture, "a worker cannot report on a task it does not hold", "[unit][tasks]") {
  join("holder", role::collector);
  join("intruder", role::collector);
  submit("coord", "t", role::collector);
  sink.take<codec::task_start>("holder");
  const auto r =
      say("intruder", role::collector, codec::task_result{"t", 1, codec::empty_map_blob});
  REQUIRE(r);
  CHECK(r->code == codec::error_code::unknown_task);
  const auto r2 = say("intruder", role::collector, codec::started{"nope", 1});
  REQUIRE(r2);
  CHECK(r2->code == codec::error_code::unknown_task);
  CHECK(tm->counts().running == 1);
}

TEST_CASE_METHOD(fixture, "steps out of order are refused without changing anything",
                 "[unit][tasks]") {
  join("w", role::collector);
  submit("coord", "t", role::collector);
  sink.take<codec::task_start>("w");
  const auto early = say("w", role::collector, codec::task_result{"t", 1, codec::empty_map_blob});
  REQUIRE(early);
  CHECK(early->code == codec::error_code::wrong_state);
  const auto finish_early = say("coord", role::coordinator, codec::finish{"t"});
  REQUIRE(finish_early);
  CHECK(finish_early->code == codec::error_code::wrong_state);
  const auto learner_msg = say("w", role::collector, codec::get_data{"t", 1, 1, "b", 1, 0});
  REQUIRE(learner_msg);
  ok("w", role::collector, codec::started{"t", 1});
}

TEST_CASE_METHOD(fixture, "coordinators see and control only their own tasks", "[unit][tasks]") {
  join("w", role::collector);
  submit("alice", "a-task", role::collector);
  sink.take<codec::task_start>("w");
  ok("w", role::collector, codec::started{"a-task", 1});
  const auto r = say("bob", role::coordinator, codec::finish{"a-task"});
  REQUIRE(r);
  CHECK(r->code == codec::error_code::unknown_task);
  REQUIRE(say("bob", role::coordinator, codec::cancel{"a-task", "mine now"}));
  CHECK(sink.empty("bob"));
  sink.event("alice", "assigned");
  sink.event("alice", "started");
  for (const auto& t : sink.topics) CHECK(t.rfind("task.alice.", 0) == 0);
}

TEST_CASE_METHOD(fixture, "a coordinator that leaves takes its tasks with it", "[unit][tasks]") {
  join("w", role::collector);
  submit("coord", "t1", role::collector);
  submit("coord", "t2", role::collector);
  sink.take<codec::task_start>("w");
  tm->peer_gone("coord", role::coordinator, now);
  CHECK(sink.take<codec::task_abort>("w").task_id == "t1");
  CHECK(tm->counts().queued == 0);
  CHECK(tm->counts().running == 0);
  CHECK(tm->counts().cancelled == 2);
}

TEST_CASE_METHOD(fixture, "cancel stops a running task and frees its worker", "[unit][tasks]") {
  join("w", role::collector);
  submit("coord", "t", role::collector);
  sink.take<codec::task_start>("w");
  ok("coord", role::coordinator, codec::cancel{"t", "enough"});
  CHECK(sink.take<codec::task_abort>("w").reason == "cancelled: enough");
  submit("coord", "t-next", role::collector);
  CHECK(sink.take<codec::task_start>("w").task_id == "t-next");
}

TEST_CASE_METHOD(fixture, "reasons made from a peer's text fit the reason limit", "[unit][tasks]") {
  join("w", role::collector);
  submit("coord", "t", role::collector);
  sink.take<codec::task_start>("w");
  ok("coord", role::coordinator, codec::cancel{"t", std::string(3000, 'r')});
  const auto abort = sink.take<codec::task_abort>("w");
  CHECK(abort.reason.size() == codec::max_reason_length);
  CHECK(abort.reason.rfind("cancelled: ", 0) == 0);
}

TEST_CASE_METHOD(fixture, "re-announced resources count for the next assignment", "[unit][tasks]") {
  join("w", role::learner, {{"gpu", 0}});
  submit("coord", "needs-gpu", role::learner, {{"gpu", 1}});
  CHECK(sink.empty("w"));
  tm->peer_resources("w", {{"gpu", 1}}, now);
  CHECK(sink.take<codec::task_start>("w").task_id == "needs-gpu");
}

TEST_CASE_METHOD(fixture, "a closed queue takes no tasks, cancels waiting ones and aborts the rest",
                 "[unit][tasks]") {
  join("c0", role::collector);
  submit("coord", "running", role::collector);
  sink.take<codec::task_start>("c0");
  sink.event("coord", "assigned");
  CHECK(submit("coord", "waiting", role::collector).queued == 0);
  tm->close_queue("closing");
  const auto waiting = sink.event("coord", "cancelled");
  CHECK(waiting.task_id == "waiting");
  CHECK(tm->live() == 1);
  const auto refused = submit("coord", "late", role::collector);
  CHECK_FALSE(refused.accepted);
  CHECK(refused.code == 503);
  // A free worker gets nothing while closed.
  join("c1", role::collector);
  CHECK(sink.empty("c1"));
  CHECK(tm->abort_all("over") == 1);
  const auto abort = sink.take<codec::task_abort>("c0");
  CHECK(abort.reason == "over");
  const auto running = sink.event("coord", "cancelled");
  CHECK(running.task_id == "running");
  CHECK(running.worker_id == "c0");
  CHECK(tm->live() == 0);
  CHECK(tm->counts().cancelled == 2);
}

// ---- the coordinator's stream: replay, window, data credit (SPEC §12.9) ----------------

namespace {

/// Every message queued for `peer`, taken.
std::vector<codec::message> drain(fake_sink& sink, const std::string& peer) {
  auto& q = sink.inbox[peer];
  std::vector<codec::message> out(std::make_move_iterator(q.begin()),
                                  std::make_move_iterator(q.end()));
  q.clear();
  return out;
}

std::vector<std::uint64_t> seqs(const std::vector<codec::message>& ms) {
  std::vector<std::uint64_t> out;
  for (const auto& m : ms)
    if (const auto* e = std::get_if<codec::task_event>(&m)) out.push_back(e->seq);
  return out;
}

codec::info info_of(std::uint32_t n) {
  msgpack::sbuffer b;
  msgpack::packer pk(b);
  pk.pack_map(1).pack("n").pack(n);
  return codec::info{"t", 1, std::string(b.data(), b.size())};
}

}  // namespace

TEST_CASE_METHOD(fixture, "a REPLAY resends the ring's events byte for byte", "[unit][tasks]") {
  join("w", role::collector);
  submit("coord", "t", role::collector);
  ok("w", role::collector, codec::started{"t", 1});
  for (std::uint32_t i = 0; i < 8; ++i) ok("w", role::collector, info_of(i));
  const auto first = drain(sink, "coord");  // SUBMITTED, then events 1..10 as made
  REQUIRE(seqs(first) == range(1, 10));
  ok("coord", role::coordinator, codec::replay{4});
  const auto again = drain(sink, "coord");
  REQUIRE(seqs(again) == range(4, 10));
  for (const auto& m : again) {
    const auto& e = std::get<codec::task_event>(m);
    const auto original = std::find_if(first.begin(), first.end(), [&](const codec::message& o) {
      const auto* oe = std::get_if<codec::task_event>(&o);
      return oe != nullptr && oe->seq == e.seq;
    });
    REQUIRE(original != first.end());
    CHECK(codec::encode_body(m) == codec::encode_body(*original));
  }
  CHECK(tm->counts().replays == 1);
  CHECK(tm->counts().resent == 7);
  // head + 1 asks for nothing old; past it is refused.
  ok("coord", role::coordinator, codec::replay{11});
  CHECK(sink.empty("coord"));
  const auto bad = say("coord", role::coordinator, codec::replay{12});
  REQUIRE(bad);
  CHECK(bad->code == codec::error_code::bad_seq);
  CHECK_FALSE(bad->late);
}

TEST_CASE_METHOD(fixture, "a REPLAY past the ring is told what was lost, then goes on",
                 "[unit][tasks]") {
  cfg.stream_ring = 16;
  cfg.stream_window = 8;
  join("w", role::collector);
  submit("coord", "t", role::collector);
  ok("w", role::collector, codec::started{"t", 1});
  for (std::uint32_t i = 0; i < 28; ++i) ok("w", role::collector, info_of(i));  // seq 3..30
  drain(sink, "coord");
  ok("coord", role::coordinator, codec::replay{1});  // the ring holds 15..30
  auto got = drain(sink, "coord");
  REQUIRE_FALSE(got.empty());
  const auto* gap = std::get_if<codec::stream_gap>(&got.front());
  REQUIRE(gap != nullptr);
  CHECK(gap->first == 1);
  CHECK(gap->last == 14);
  got.erase(got.begin());
  // The lost events count as acknowledged: a whole window of held ones follows at once.
  CHECK(seqs(got) == range(15, 22));
  CHECK(tm->counts().lost == 14);
  ok("coord", role::coordinator, codec::ack{22});
  CHECK(seqs(drain(sink, "coord")) == range(23, 30));
}

TEST_CASE_METHOD(fixture, "a windowed stream holds events past the window until ACKs come",
                 "[unit][tasks]") {
  cfg.stream_window = 4;
  join("w", role::collector);
  submit("coord", "t", role::collector);  // begun while the stream is plain: no credit
  ok("w", role::collector, codec::started{"t", 1});
  CHECK(seqs(drain(sink, "coord")) == range(1, 2));
  ok("coord", role::coordinator, codec::ack{2});
  for (std::uint32_t i = 0; i < 10; ++i) ok("w", role::collector, info_of(i));  // seq 3..12
  CHECK(seqs(drain(sink, "coord")) == range(3, 6));
  ok("coord", role::coordinator, codec::ack{4});
  CHECK(seqs(drain(sink, "coord")) == range(7, 8));
  ok("coord", role::coordinator, codec::ack{3});  // older: says nothing new
  CHECK(sink.empty("coord"));
  // The connection goes: what cannot be sent is held, not dropped.
  sink.unreachable.insert("coord");
  ok("coord", role::coordinator, codec::ack{8});
  sink.unreachable.clear();
  CHECK(sink.empty("coord"));
  ok("coord", role::coordinator, codec::ack{8});
  CHECK(seqs(drain(sink, "coord")) == range(9, 12));
  const auto bad = say("coord", role::coordinator, codec::ack{13});
  REQUIRE(bad);
  CHECK(bad->code == codec::error_code::bad_seq);
  // Only coordinators have a stream; only the broker sends STREAM_GAP and DATA_CREDIT.
  for (const codec::message& m : {codec::message{codec::replay{1}}, codec::message{codec::ack{0}},
                                  codec::message{codec::data_credit{"t", 1, 5}}}) {
    const auto r = say("w", role::collector, m);
    REQUIRE(r);
    CHECK(r->code == codec::error_code::unknown_type);
  }
  const auto r = say("coord", role::coordinator, codec::stream_gap{1, 2});
  REQUIRE(r);
  CHECK(r->code == codec::error_code::unknown_type);
}

TEST_CASE_METHOD(fixture, "a plain stream's collectors get no data credit", "[unit][tasks]") {
  join("w", role::collector);
  submit("coord", "t", role::collector);
  CHECK(std::holds_alternative<codec::task_start>(drain(sink, "w").front()));
  ok("w", role::collector, codec::started{"t", 1});
  for (int i = 0; i < 3000; ++i)
    ok("w", role::collector,
       codec::data_ready{"t", 1, "d", "b", codec::empty_map_blob, std::nullopt});
  CHECK(sink.empty("w"));
}

TEST_CASE_METHOD(fixture, "data credit keeps a collector within its coordinator's window",
                 "[unit][tasks]") {
  cfg.stream_window = 8;
  join("w", role::collector);
  ok("coord", role::coordinator, codec::replay{1});  // windowed from the start
  submit("coord", "t", role::collector);
  auto to_worker = drain(sink, "w");
  REQUIRE(to_worker.size() == 2);  // DATA_CREDIT comes before TASK_START
  const auto credit = std::get<codec::data_credit>(to_worker[0]);
  CHECK(credit.task_id == "t");
  CHECK(credit.attempt == 1);
  CHECK(std::holds_alternative<codec::task_start>(to_worker[1]));
  std::uint64_t limit = credit.limit;
  ok("w", role::collector, codec::started{"t", 1});
  const auto data = [](std::uint64_t i) {
    return codec::data_ready{"t",         1, "d" + std::to_string(i), "b", codec::empty_map_blob,
                             std::nullopt};
  };
  // Send until the credit runs out: the events made (assigned, started, data) never exceed
  // the window while the coordinator acknowledges nothing.
  std::uint64_t sent = 0;
  while (true) {
    for (const auto& m : drain(sink, "w")) limit = std::get<codec::data_credit>(m).limit;
    const auto r = say("w", role::collector, data(sent));
    if (r) {
      CHECK(r->code == codec::error_code::no_credit);
      CHECK_FALSE(r->late);
      break;
    }
    ++sent;
    REQUIRE(sent <= 8);
  }
  CHECK(sent == limit);
  CHECK(2 + sent <= 8);
  CHECK(seqs(drain(sink, "coord")).size() == 2 + sent);
  // Held back is not silent: the step deadline does not end the attempt ...
  advance(std::chrono::milliseconds(cfg.step_timeout_ms * 5));
  CHECK(tm->counts().requeued == 0);
  CHECK(sink.empty("w"));
  // ... and as the coordinator catches up, more credit comes.
  ok("coord", role::coordinator, codec::ack{2 + sent});
  const auto more = drain(sink, "w");
  REQUIRE(more.size() == 1);
  CHECK(std::get<codec::data_credit>(more[0]).limit > limit);
  ok("w", role::collector, data(sent));
  CHECK(seqs(drain(sink, "coord")) == std::vector<std::uint64_t>{3 + sent});
  // Used up again, the attempt is still bounded by the task timeout.
  for (int i = 0; i < 20 && !say("w", role::collector, data(++sent)); ++i) {
  }
  drain(sink, "w");
  for (int i = 0; i < 100 && sink.empty("w"); ++i)
    advance(std::chrono::milliseconds(cfg.step_timeout_ms));
  CHECK(sink.take<codec::task_abort>("w").reason == "task timeout");
}

TEST_CASE_METHOD(fixture, "credit is shared by a stream's collectors and returned when one ends",
                 "[unit][tasks]") {
  cfg.stream_window = 8;
  join("w1", role::collector);
  join("w2", role::collector);
  ok("coord", role::coordinator, codec::ack{0});
  submit("coord", "a", role::collector);
  submit("coord", "b", role::collector);
  const auto limit_of = [&](const std::string& w) {
    std::uint64_t limit = 0;
    for (const auto& m : drain(sink, w))
      if (const auto* c = std::get_if<codec::data_credit>(&m)) limit = std::max(limit, c->limit);
    return limit;
  };
  const auto a = limit_of("w1");
  const auto b = limit_of("w2");
  CHECK(a >= 1);
  CHECK(b >= 1);
  CHECK(2 + a + b <= 8);  // two assigned events plus the credit fit the window
  // b is cancelled: its unused credit goes back, and a gets it once it has used its own.
  ok("coord", role::coordinator, codec::cancel{"b", "enough"});
  ok("w1", role::collector, codec::started{"a", 1});
  for (std::uint64_t i = 0; i < a; ++i)
    ok("w1", role::collector,
       codec::data_ready{"a", 1, "d", "b", codec::empty_map_blob, std::nullopt});
  ok("coord", role::coordinator, codec::ack{4 + a});  // assigned x2, cancelled, started, data
  CHECK(limit_of("w1") > a);
}

// A worker cannot ask for credit: one that used what it knows of waits for DATA_CREDIT, so a
// DATA_CREDIT its connection did not take (full, or gone with a reconnect) is told again.
TEST_CASE_METHOD(fixture, "credit that did not reach its worker is told again", "[unit][tasks]") {
  cfg.stream_window = 8;
  join("w", role::collector);
  ok("coord", role::coordinator, codec::replay{1});
  submit("coord", "t", role::collector);
  auto start = drain(sink, "w");
  REQUIRE(start.size() == 2);
  const auto first = std::get<codec::data_credit>(start[0]).limit;
  REQUIRE(first >= 1);
  ok("w", role::collector, codec::started{"t", 1});
  for (std::uint64_t i = 0; i < first; ++i)
    ok("w", role::collector,
       codec::data_ready{"t", 1, "d", "b", codec::empty_map_blob, std::nullopt});
  drain(sink, "w");
  // The coordinator catches up while the worker's connection takes nothing: the top-up is
  // granted but does not go out.
  sink.unreachable.insert("w");
  ok("coord", role::coordinator, codec::ack{2 + first});
  CHECK(sink.empty("w"));
  sink.unreachable.clear();
  // The next tick tells it, once.
  tm->pump_streams();
  auto told = drain(sink, "w");
  REQUIRE(told.size() == 1);
  const auto granted = std::get<codec::data_credit>(told[0]).limit;
  CHECK(granted > first);
  tm->pump_streams();
  CHECK(sink.empty("w"));
  // Told, but a reconnect may have taken it: a resumed session hears it again.
  tm->peer_resumed("w");
  bool credit_again = false;
  for (const auto& m : drain(sink, "w"))
    if (const auto* c = std::get_if<codec::data_credit>(&m)) credit_again = c->limit == granted;
  CHECK(credit_again);
  ok("w", role::collector,
     codec::data_ready{"t", 1, "d", "b", codec::empty_map_blob, std::nullopt});
}

// ---- reliable data (SPEC §12.11) -------------------------------------------------------

namespace {

codec::data_ready indexed(std::uint64_t index, std::uint32_t attempt = 1) {
  codec::data_ready d{"t",         attempt, "d" + std::to_string(index), "b", codec::empty_map_blob,
                      std::nullopt};
  d.index = index;
  return d;
}

/// The data_ids of the `data` events queued for `coord`, taken with everything else queued.
std::vector<std::string> data_ids(fake_sink& sink, const std::string& coord) {
  std::vector<std::string> out;
  for (const auto& m : drain(sink, coord)) {
    const auto* e = std::get_if<codec::task_event>(&m);
    if (e == nullptr || e->event != "data") continue;
    const auto at = e->body.find(
        "\xa7"
        "data_id");
    REQUIRE(at != std::string::npos);
    // data_id is a fixstr right after its key: its length byte, then the text.
    const auto len = static_cast<std::size_t>(static_cast<unsigned char>(e->body[at + 8]) & 0x1f);
    out.push_back(e->body.substr(at + 9, len));
  }
  return out;
}

}  // namespace

TEST_CASE_METHOD(fixture, "indexed DATA is relayed once and in order; a gap asks for a resend",
                 "[unit][tasks]") {
  join("w", role::collector);
  submit("coord", "t", role::collector);
  drain(sink, "w");
  ok("w", role::collector, codec::started{"t", 1});
  drain(sink, "coord");
  ok("w", role::collector, indexed(1));
  ok("w", role::collector, indexed(1));  // a duplicate: dropped, not refused
  ok("w", role::collector, indexed(3));  // 2 went missing
  ok("w", role::collector, indexed(4));
  CHECK(data_ids(sink, "coord") == std::vector<std::string>{"d1"});
  const auto ack = sink.take<codec::data_ack>("w");
  CHECK(ack.relayed == 1);
  CHECK(ack.resend);
  CHECK(sink.empty("w"));  // once per gap
  for (std::uint64_t i = 2; i <= 4; ++i) ok("w", role::collector, indexed(i));
  CHECK(data_ids(sink, "coord") == std::vector<std::string>{"d2", "d3", "d4"});
  const auto c = tm->counts();
  CHECK(c.data_duplicates == 1);
  CHECK(c.data_out_of_order == 2);
  // Duplicates are not progress: the step deadline still runs from the last relayed DATA.
  advance(std::chrono::milliseconds(cfg.step_timeout_ms / 2));
  ok("w", role::collector, indexed(4));
  advance(std::chrono::milliseconds(cfg.step_timeout_ms / 2));
  CHECK(sink.take<codec::task_abort>("w").reason == "step timeout");
}

TEST_CASE_METHOD(fixture, "the broker confirms relayed DATA every 32 and on a resumption",
                 "[unit][tasks]") {
  join("w", role::collector);
  submit("coord", "t", role::collector);
  drain(sink, "w");
  tm->peer_resumed("w");  // starting: no DATA yet, nothing to confirm
  CHECK(sink.empty("w"));
  ok("w", role::collector, codec::started{"t", 1});
  for (std::uint64_t i = 1; i <= 70; ++i) ok("w", role::collector, indexed(i));
  const auto acks = drain(sink, "w");
  REQUIRE(acks.size() == 2);
  CHECK(std::get<codec::data_ack>(acks[0]).relayed == 32);
  CHECK(std::get<codec::data_ack>(acks[1]).relayed == 64);
  CHECK_FALSE(std::get<codec::data_ack>(acks[1]).resend);
  tm->peer_resumed("w");
  const auto resumed = sink.take<codec::data_ack>("w");
  CHECK(resumed.relayed == 70);
  CHECK_FALSE(resumed.resend);
  // A worker without a task is told nothing.
  join("l", role::learner);
  tm->peer_resumed("l");
  CHECK(sink.empty("l"));
  // Closing: the TASK_CLOSE that may have gone down with the old connection comes again.
  ok("coord", role::coordinator, codec::finish{"t"});
  CHECK(sink.take<codec::task_close>("w").attempt == 1);
  tm->peer_resumed("w");
  CHECK(sink.take<codec::data_ack>("w").relayed == 70);
  const auto again = sink.take<codec::task_close>("w");
  CHECK(again.task_id == "t");
  CHECK(again.attempt == 1);
}

TEST_CASE_METHOD(fixture, "DATA a collector declares lost is reported once, in its place",
                 "[unit][tasks]") {
  join("w", role::collector);
  submit("coord", "t", role::collector);
  drain(sink, "w");
  ok("w", role::collector, codec::started{"t", 1});
  drain(sink, "coord");
  for (std::uint64_t i = 1; i <= 2; ++i) ok("w", role::collector, indexed(i));
  ok("w", role::collector, codec::data_lost{"t", 1, 1, 5});  // 1 and 2 got here
  ok("w", role::collector, codec::data_lost{"t", 1, 3, 4});  // already recorded
  ok("w", role::collector, indexed(6));
  auto events = drain(sink, "coord");
  REQUIRE(events.size() == 4);
  const auto& lost = std::get<codec::task_event>(events[2]);
  CHECK(lost.event == "data_lost");
  CHECK(lost.body == codec::map_writer(2).uint("first_index", 3).uint("last_index", 5).done());
  CHECK(std::get<codec::task_event>(events[3]).event == "data");
  CHECK(tm->counts().data_lost == 3);
  CHECK(std::find(sink.topics.begin(), sink.topics.end(), "task.coord.data_lost") !=
        sink.topics.end());
  // Backwards is a fault.
  const auto r = say("w", role::collector, codec::data_lost{"t", 1, 9, 8});
  REQUIRE(r);
  CHECK(r->code == codec::error_code::bad_index);
  CHECK_FALSE(r->late);
  // After TASK_CLOSE indexed DATA and DATA_LOST still count; plain DATA does not.
  ok("coord", role::coordinator, codec::finish{"t"});
  ok("w", role::collector, indexed(7));
  ok("w", role::collector, codec::data_lost{"t", 1, 8, 8});
  auto plain = indexed(9);
  plain.index.reset();
  const auto late = say("w", role::collector, plain);
  REQUIRE(late);
  CHECK(late->code == codec::error_code::wrong_state);
  CHECK(late->late);
  events = drain(sink, "coord");
  REQUIRE(events.size() == 2);
  CHECK(std::get<codec::task_event>(events[0]).event == "data");
  CHECK(std::get<codec::task_event>(events[1]).event == "data_lost");
}

TEST_CASE_METHOD(fixture, "resends use no credit; declared losses use it as DATA would",
                 "[unit][tasks]") {
  cfg.stream_window = 8;
  join("w", role::collector);
  ok("coord", role::coordinator, codec::replay{1});
  submit("coord", "t", role::collector);
  const auto credit = std::get<codec::data_credit>(drain(sink, "w").front());
  REQUIRE(credit.limit == 4);
  ok("w", role::collector, codec::started{"t", 1});
  for (std::uint64_t i = 1; i <= 3; ++i) ok("w", role::collector, indexed(i));
  for (std::uint64_t i = 1; i <= 3; ++i) ok("w", role::collector, indexed(i));  // resent
  ok("w", role::collector, codec::data_lost{"t", 1, 4, 4});                     // the 4th
  // Four used (three relayed, one lost): a loss past the rest of the credit is refused.
  std::uint64_t limit = credit.limit;
  for (const auto& m : drain(sink, "w"))
    if (const auto* c = std::get_if<codec::data_credit>(&m)) limit = std::max(limit, c->limit);
  REQUIRE(limit >= 4);
  const auto r = say("w", role::collector, codec::data_lost{"t", 1, 5, limit + 1});
  REQUIRE(r);
  CHECK(r->code == codec::error_code::bad_index);
  if (limit >= 5) ok("w", role::collector, codec::data_lost{"t", 1, 5, limit});
  CHECK(tm->counts().data_duplicates == 3);
  CHECK(tm->counts().data_lost == limit - 3);
}

// §15.5: the rings of every coordinator's stream together hold at most half the memory
// budget. Coordinators that never acknowledge (v1 streams, as here, have no credit to hold
// their collectors back) each keep their own bound until the pool is full; then a ring past
// an equal share gives up its oldest events, counted, and later reports them lost.
TEST_CASE_METHOD(fixture, "the stream rings of coordinators that never ACK share half the budget",
                 "[unit][tasks]") {
  cfg.memory_budget = 256 * 1024;  // a pool of 128 KiB for the rings
  cfg.stream_ring = 100'000;
  cfg.stream_ring_bytes = 64 * 1024;  // each coordinator alone could hold 64 KiB
  cfg.max_queue = 100;
  constexpr int coordinators = 8;
  for (int i = 0; i < coordinators; ++i) {
    const auto c = "coord" + std::to_string(i), w = "w" + std::to_string(i);
    join(w, role::collector);
    REQUIRE(submit(c, "t" + std::to_string(i), role::collector).accepted);
    ok(w, role::collector, codec::started{"t" + std::to_string(i), 1});
  }
  const std::string payload(1000, 'p');
  for (int round = 0; round < 200; ++round)
    for (int i = 0; i < coordinators; ++i)
      ok("w" + std::to_string(i), role::collector,
         codec::data_ready{"t" + std::to_string(i),
                           1,
                           "d" + std::to_string(round),
                           "b",
                           codec::empty_map_blob,
                           payload,
                           {},
                           {}});
  const auto c = tm->counts();
  // 8 x 200 KB of events made; the rings hold the pool, with one event of slack per ring
  CHECK(c.ring_bytes <= cfg.memory_budget / 2 + coordinators * 1100);
  CHECK(c.ring_bytes >= cfg.memory_budget / 4);
  CHECK(c.ring_budget_drops > 0);
  // every coordinator still holds its share: none was starved by the others
  for (int i = 0; i < coordinators; ++i) {
    const auto c_id = "coord" + std::to_string(i);
    ok(c_id, role::coordinator, codec::replay{1});  // what it kept comes, the rest is a gap
    bool gap = false;
    std::size_t events = 0;
    for (auto& m : sink.inbox[c_id]) {
      gap = gap || std::holds_alternative<codec::stream_gap>(m);
      events += std::holds_alternative<codec::task_event>(m);
    }
    CHECK(gap);
    CHECK(events > 200);  // the events sent as made, and those kept sent again
  }
}

// §15.5: the queues and the rings draw from one budget. What the connections' queues hold
// (peers that never read) is not left to the rings, which give up their oldest events past it.
TEST_CASE_METHOD(fixture,
                 "the stream rings get only what the connections' queues leave of the budget",
                 "[unit][tasks]") {
  cfg.memory_budget = 256 * 1024;
  cfg.stream_ring = 100'000;
  cfg.stream_ring_bytes = 1024 * 1024;  // the budget, not this, bounds the ring
  join("w", role::collector);
  REQUIRE(submit("coord", "t", role::collector).accepted);
  ok("w", role::collector, codec::started{"t", 1});
  const std::string payload(1000, 'p');
  auto stream = [&](int from, int to) {
    for (int i = from; i < to; ++i)
      ok("w", role::collector,
         codec::data_ready{
             "t", 1, "d" + std::to_string(i), "b", codec::empty_map_blob, payload, {}, {}});
  };
  stream(0, 100);  // ~100 KB: within half the budget, all kept
  CHECK(tm->counts().ring_bytes >= 100 * 1000);
  CHECK(tm->counts().ring_budget_drops == 0);
  sink.queued = 150 * 1024;  // the queues now hold all but 42 KiB of the shared three quarters
  stream(100, 110);
  const auto c = tm->counts();
  CHECK(c.ring_bytes <= cfg.memory_budget * 3 / 4 - sink.queued + 1100);
  CHECK(c.ring_budget_drops > 0);
  sink.queued = 0;  // the queues drained: the ring may hold half the budget again
  stream(110, 160);
  CHECK(tm->counts().ring_bytes > c.ring_bytes + 40 * 1000);
}
