// Conformance, SPEC §16: operations. An operator's OPS, sent from a connection without a
// session, against the real broker over tcp with raw DEALERs; each result is read as JSON.
// Each test is named after the clause it checks; every wait has a deadline.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using codec::error_code;
using json = nlohmann::json;

namespace {

inline constexpr std::uint8_t type_ops = 0x50;

codec::ops op(std::string verb, std::uint64_t id = 7) {
  codec::ops o;
  o.request_id = id;
  o.verb = std::move(verb);
  return o;
}

// Sends `o` from `p`; the very next message must be its OPS_REPLY: its result, as JSON.
json ask(raw_peer& p, const codec::ops& o) {
  p.send(o);
  const auto r = next_a<codec::ops_reply>(p);
  CHECK(r.request_id == o.request_id);
  CHECK(r.verb == o.verb);
  return json::from_msgpack(r.result);
}

codec::error refused(raw_peer& p, const codec::ops& o, error_code code) {
  p.send(o);
  return next_error(p, code, ref(type_ops));
}

}  // namespace

// §16.1 "OPS is the one message besides HELLO that a connection without a session may send"
// §16.5 "`status`: `version` (str, the broker's release), `epoch` (as in WELCOME, §4.2.1),
// `settings` (map of setting key to its value as text: the settings that differ from their
// defaults, §1.4)"
TEST_CASE_METHOD(fixture, "SPEC 16.1, 16.5: status answers a connection without a session",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), ctl(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w0", role::collector);
  submit_ok(coord, task_of("t0"));
  next_event(coord, "t0", "assigned");
  submit_ok(coord, task_of("t1"));
  const auto s = ask(ctl, op("status", 41));
  CHECK(s.at("uptime_ms").get<std::uint64_t>() < 60'000);
  CHECK(s.at("draining") == false);
  CHECK(s.at("peers") == json({{"collector", 1}, {"learner", 0}, {"coordinator", 1}, {"bus", 0}}));
  CHECK(s.at("tasks") == json({{"queued", 1}, {"running", 1}}));
  CHECK(s.at("queue_depth") == 1);
  CHECK(s.at("counters").at("messages_in").get<std::uint64_t>() >= 4);
  REQUIRE(s.at("streams").size() == 1);
  CHECK(s.at("streams")[0].at("coordinator") == "coord");
  CHECK(s.at("streams")[0].at("seq").get<std::uint64_t>() >= 1);
  CHECK(s.at("changes").empty());
  CHECK_FALSE(s.at("version").get<std::string>().empty());
  CHECK(s.at("epoch") == broker.get().epoch());
  // The settings that are not their defaults, as text, and no other.
  CHECK(s.at("settings").at("status-interval") == "20");
  CHECK(s.at("settings").at("drain-ms") == "0");
  CHECK_FALSE(s.at("settings").contains("tasks.max-attempts"));
  // Operations leave no session behind and no trace in any stream.
  CHECK(broker.get().snapshot().peers == 2);
  expect_quiet(coord);
}

// §16.5 "`counters` (map of counter name to uint: ... `data_duplicates`, `data_out_of_order`
// (§12.11.4), `data_lost` ...)": the counts of §12.11.4's dropped DATA, as an operator sees them.
TEST_CASE_METHOD(fixture, "SPEC 16.5: status counts duplicate and out-of-order DATA", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), ctl(ctx, router);
  running(coord, w);
  const auto before = ask(ctl, op("status")).at("counters");
  CHECK(before.at("data_out_of_order") == 0);
  CHECK(before.at("data_duplicates") == 0);
  w.send(indexed_data(1));
  next_event(coord, "t", "data");
  w.send(indexed_data(1));                                         // a duplicate
  for (std::uint64_t i = 3; i <= 4; ++i) w.send(indexed_data(i));  // 2 went missing
  CHECK(next_a<codec::data_ack>(w).resend);
  const auto after = ask(ctl, op("status", 8)).at("counters");
  CHECK(after.at("data_duplicates") == 1);
  CHECK(after.at("data_out_of_order") == 2);
  CHECK(after.at("data_out_of_order") == broker.get().snapshot().data_out_of_order);
}

// §16.5 "`data_items` (the items of collected data relayed: a DATA is one, a DATA_BATCH each
// of its new items), `data_lag_items` and `data_lag_versions` (of those items that name a
// `policy_version`, §13.4.4, while the broker holds a version of their task's policy: how many,
// and by how many versions in all they trailed that newest version when they came)"
TEST_CASE_METHOD(fixture, "SPEC 16.5: status counts collected items and how far they trail",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), l(ctx, router), ctl(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(l, "l", role::learner);
  for (std::uint64_t v = 1; v <= 3; ++v)
    l.send(codec::policy{"pi", v, std::nullopt, std::string("p")});
  expect_quiet(l);
  auto with = task_of("t");
  with.policy_id = "pi";
  start_task(coord, w, with);
  auto d = indexed_data(1);
  d.policy_version = 1;  // two behind
  w.send(d);
  next_event(coord, "t", "data");
  codec::items_writer items;
  for (const std::optional<std::uint64_t> v : {std::optional<std::uint64_t>{3}, {2}, {}})
    items.add(codec::data_item{"i", "b", codec::empty_map_blob, std::nullopt, v});
  w.send(codec::data_batch{"t", 1, 2, items.done()});
  next_event(coord, "t", "data_batch");
  // A task without a policy: its items count, their versions trail nothing the broker holds.
  raw_peer w2(ctx, router);
  join(w2, "w2", role::collector);
  start_task(coord, w2, task_of("plain"));
  codec::data_ready plain{"plain", 1, "x", "b", codec::empty_map_blob, std::nullopt};
  plain.policy_version = 1;
  w2.send(plain);
  next_event(coord, "plain", "data");
  const auto c = ask(ctl, op("status")).at("counters");
  CHECK(c.at("data_items") == 5);
  CHECK(c.at("data_lag_items") == 3);     // v1, v3 and v2 of "pi"
  CHECK(c.at("data_lag_versions") == 3);  // 2 + 0 + 1
}

TEST_CASE_METHOD(fixture, "SPEC 16.5: workers lists each worker session with its task", "[spec]") {
  raw_peer coord(ctx, router), w0(ctx, router), w1(ctx, router), l0(ctx, router), ctl(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w0, "w0", role::collector, {{"gpu", 1}});
  join(w1, "w1", role::collector);
  join(l0, "l0", role::learner);
  submit_ok(coord, task_of("t0"));
  const auto start = next_a<codec::task_start>(w0);  // the earliest joined gets it
  const auto all = ask(ctl, op("workers"));
  CHECK(all.at("total") == 3);
  REQUIRE(all.at("workers").size() == 3);
  const auto& first = all.at("workers")[0];
  CHECK(first.at("id") == "w0");
  CHECK(first.at("role") == "collector");
  CHECK(first.at("resources") == json({{"gpu", 1}}));
  CHECK(first.at("task") == "t0");
  CHECK(first.at("attempt") == start.attempt);
  CHECK(first.at("quarantined") == false);
  CHECK(first.at("drained") == false);
  CHECK(all.at("workers")[1].at("task") == "");
  CHECK(all.at("workers")[2].at("id") == "l0");
  auto learners = op("workers");
  learners.kind = rlbus::role::learner;
  CHECK(ask(ctl, learners).at("total") == 1);
  auto one = op("workers");
  one.limit = 1;
  const auto cut = ask(ctl, one);
  CHECK(cut.at("workers").size() == 1);
  CHECK(cut.at("total") == 3);
}

TEST_CASE_METHOD(fixture, "SPEC 16.5: tasks lists live tasks in queue order, filtered", "[spec]") {
  raw_peer c1(ctx, router), c2(ctx, router), w(ctx, router), ctl(ctx, router);
  join(c1, "c1", role::coordinator);
  join(c2, "c2", role::coordinator);
  join(w, "w", role::collector);
  submit_ok(c1, task_of("run"));
  next_a<codec::task_start>(w);
  next_event(c1, "run", "assigned");
  submit_ok(c1, task_of("q1"));
  submit_ok(c2, task_of("q2", role::learner));
  const auto all = ask(ctl, op("tasks"));
  CHECK(all.at("total") == 3);
  REQUIRE(all.at("tasks").size() == 3);
  CHECK(all.at("tasks")[0].at("id") == "q1");  // the queued first, in queue order
  CHECK(all.at("tasks")[1].at("id") == "q2");
  CHECK(all.at("tasks")[2].at("id") == "run");
  CHECK(all.at("tasks")[2].at("state") == "starting");
  CHECK(all.at("tasks")[2].at("worker") == "w");
  CHECK(all.at("tasks")[2].at("attempt") == 1);
  CHECK(all.at("tasks")[0].at("coordinator") == "c1");
  auto queued = op("tasks");
  queued.state = "queued";
  CHECK(ask(ctl, queued).at("total") == 2);
  auto of_c2 = op("tasks");
  of_c2.coordinator = "c2";
  const auto c2_tasks = ask(ctl, of_c2);
  REQUIRE(c2_tasks.at("tasks").size() == 1);
  CHECK(c2_tasks.at("tasks")[0].at("kind") == "learner");
  auto collectors_queued = op("tasks");
  collectors_queued.kind = rlbus::role::collector;
  collectors_queued.state = "queued";
  collectors_queued.limit = 1;
  const auto r = ask(ctl, collectors_queued);
  CHECK(r.at("total") == 1);
  CHECK(r.at("tasks")[0].at("id") == "q1");
}

// §16.5 "`attempt_ms` (since its current attempt began, 0 when queued), `requirements` ...;
// and `ended`, the last 64 attempts that ended, whatever the filters, oldest first: `id`,
// `kind`, `how` ..., `attempt`, `worker` ..., `coordinator`, `reason` ..., `age_ms`"
TEST_CASE_METHOD(fixture, "SPEC 16.5: tasks says what each needs and which attempts ended",
                 "[spec]") {
  raw_peer c(ctx, router), w(ctx, router), ctl(ctx, router);
  join(c, "c", role::coordinator);
  join(w, "w", role::collector, {{"cpu", 2}});
  submit_ok(c, task_of("needs-gpu", role::collector, {{"gpu", 1}}));
  submit_ok(c, task_of("runs"));
  next_a<codec::task_start>(w);
  next_event(c, "runs", "assigned");
  const auto live = ask(ctl, op("tasks"));
  REQUIRE(live.at("tasks").size() == 2);
  CHECK(live.at("tasks")[0].at("id") == "needs-gpu");
  CHECK(live.at("tasks")[0].at("requirements") == json({{"gpu", 1}}));
  CHECK(live.at("tasks")[0].at("attempt_ms") == 0);  // queued
  CHECK(live.at("tasks")[1].at("requirements") == json::object());
  CHECK(live.at("ended").empty());
  // One attempt ends badly and is re-queued, another task is cancelled by its owner.
  w.send(codec::task_failed{"runs", 1, "the env crashed"});
  next_event(c, "runs", "requeued");
  next_event(c, "runs", "assigned");  // the one worker there is takes it again
  c.send(codec::cancel{"needs-gpu", "not needed"});
  next_event(c, "needs-gpu", "cancelled");
  auto queued = op("tasks");
  queued.state = "running";  // the filters choose the live tasks, not what ended
  const auto after = ask(ctl, queued);
  REQUIRE(after.at("ended").size() == 2);
  const auto& first = after.at("ended")[0];
  CHECK(first.at("id") == "runs");
  CHECK(first.at("how") == "requeued");
  CHECK(first.at("attempt") == 1);
  CHECK(first.at("worker") == "w");
  CHECK(first.at("coordinator") == "c");
  CHECK_THAT(first.at("reason").get<std::string>(), Catch::Contains("the env crashed"));
  CHECK(after.at("ended")[1].at("id") == "needs-gpu");
  CHECK(after.at("ended")[1].at("how") == "cancelled");
  CHECK(after.at("ended")[1].at("worker") == "");
  CHECK(after.at("ended")[1].at("reason") == "not needed");
}

// §16.5 drain: "the worker gets no new task from now on; the task it holds, if any, runs to
// its end"
TEST_CASE_METHOD(fixture, "SPEC 16.5: a drained worker gets no new task until undrained",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), ctl(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  submit_ok(coord, task_of("t0"));
  next_a<codec::task_start>(w);
  next_event(coord, "t0", "assigned");
  auto drain = op("drain");
  drain.worker = "w";
  const auto d = ask(ctl, drain);
  CHECK(d.at("worker") == "w");
  CHECK(d.at("task") == "t0");
  // Its task runs on to its end...
  w.send(codec::started{"t0", 1});
  next_event(coord, "t0", "started");
  coord.send(codec::finish{"t0"});
  next_a<codec::task_close>(w);
  w.send(codec::task_result{"t0", 1, codec::empty_map_blob});
  next_event(coord, "t0", "finished");
  // ...but no new one comes.
  submit_ok(coord, task_of("t1"));
  expect_quiet(w);
  auto workers = ask(ctl, op("workers"));
  CHECK(workers.at("workers")[0].at("drained") == true);
  auto undrain = op("undrain");
  undrain.worker = "w";
  CHECK(ask(ctl, undrain).at("worker") == "w");
  CHECK(next_a<codec::task_start>(w).task_id == "t1");
}

// §16.5 evict: "the worker's task, if any, ends as a failed attempt would ... TASK_ABORT ...
// DISCONNECT 433 (EVICTED) and the events of an expiry"
TEST_CASE_METHOD(fixture, "SPEC 16.5: evict hands the task back and ends the session", "[spec]") {
  raw_events events(ctx, broker.get().events_endpoint());
  raw_peer coord(ctx, router), w(ctx, router), ctl(ctx, router);
  join(coord, "coord", role::coordinator);
  // Joined again until the subscription is seen to work (a SUB misses what comes before).
  REQUIRE(wait_until([&] {
    raw_peer probe(ctx, router);
    join(probe, "probe", role::learner);
    probe.send(codec::disconnect{200, "probe"});
    return events.next("worker.joined", "probe", 200ms).has_value();
  }));
  join(w, "w", role::collector);
  submit_ok(coord, task_of("t0"));
  next_a<codec::task_start>(w);
  next_event(coord, "t0", "assigned");
  auto evict = op("evict");
  evict.worker = "w";
  const auto r = ask(ctl, evict);
  CHECK(r.at("task") == "t0");
  const auto abort = next_a<codec::task_abort>(w);
  CHECK(abort.task_id == "t0");
  CHECK_THAT(abort.reason, Catch::Contains("evicted by an operator"));
  const auto d = next_a<codec::disconnect>(w);
  CHECK(d.code == code_of(error_code::evicted));
  const auto e = next_event(coord, "t0", "requeued");
  CHECK(e.worker_id == "w");
  CHECK(events.next("worker.lost", "w"));
  CHECK(wait_until([&] { return broker.get().snapshot().peers == 1; }));  // the coordinator
  // A worker may come back, as a new session, and the task goes to it again.
  raw_peer again(ctx, router);
  join(again, "w", role::collector);
  CHECK(next_a<codec::task_start>(again).attempt == 2);
}

// §16.3.1 the rules of OPS
TEST_CASE_METHOD(fixture, "SPEC 16.3.1: OPS without what its verb needs, or naming no worker",
                 "[spec]") {
  raw_peer coord(ctx, router), ctl(ctx, router);
  join(coord, "coord", role::coordinator);
  for (const auto* verb : {"drain", "undrain", "evict"}) {
    INFO(verb);
    CHECK_THAT(refused(ctl, op(verb), error_code::bad_field).reason, Catch::Contains("worker"));
    auto named = op(verb);
    named.worker = "nobody";
    CHECK_THAT(refused(ctl, named, error_code::no_such_peer).reason, Catch::Contains("nobody"));
    named.worker = "coord";  // a coordinator is not a worker
    refused(ctl, named, error_code::no_such_peer);
  }
  CHECK_THAT(refused(ctl, op("set"), error_code::bad_field).reason, Catch::Contains("key"));
  auto no_value = op("set");
  no_value.key = "tasks.max-queue";
  CHECK_THAT(refused(ctl, no_value, error_code::bad_field).reason, Catch::Contains("value"));
}

// §16.2 "A refused OPS changes nothing, and is never a fault against the sender's session"
TEST_CASE_METHOD(fixture, "SPEC 16.2: refused OPS from a session never cost it its session",
                 "[spec]") {
  raw_peer coord(ctx, router);
  join(coord, "coord", role::coordinator);
  submit_ok(coord, task_of("t1"));
  const auto limit = test_config().max_faults;
  for (std::uint32_t i = 0; i < 3 * limit; ++i) {  // past the fault limit, thrice
    auto named = op("evict", 100 + i);
    named.worker = "nobody";
    refused(coord, named, error_code::no_such_peer);
    refused(coord, op("set", 200 + i), error_code::bad_field);
  }
  // still the same session, its task still its own: a collector joining is handed it
  raw_peer w(ctx, router);
  join(w, "w", role::collector);
  CHECK(next_a<codec::task_start>(w).task_id == "t1");
  raw_peer ctl(ctx, router);
  CHECK(ask(ctl, op("status"))["peers"]["coordinator"] == 1);
}

// §16.5 set: "Keys that may change at run time ... The broker SHALL log each change"
TEST_CASE_METHOD(fixture, "SPEC 16.5: set changes a run-time setting and status shows it",
                 "[spec]") {
  raw_peer coord(ctx, router), ctl(ctx, router);
  join(coord, "coord", role::coordinator);
  auto set = op("set");
  set.key = "tasks.max-queue";
  set.value = "1";
  const auto r = ask(ctl, set);
  CHECK(r.at("key") == "tasks.max-queue");
  CHECK(r.at("value") == "1");
  CHECK(r.at("was") == std::to_string(test_config().max_queue));
  submit_ok(coord, task_of("t0"));  // no worker: it waits, and fills the queue of 1
  coord.send(task_of("t1"));
  const auto full = next_a<codec::submitted>(coord);
  CHECK_FALSE(full.accepted);
  CHECK(full.code == code_of(error_code::queue_full));
  const auto s = ask(ctl, op("status"));
  REQUIRE(s.at("changes").size() == 1);
  CHECK(s.at("changes")[0].at("key") == "tasks.max-queue");
  CHECK(s.at("changes")[0].at("value") == "1");
  // Refused, and nothing changes: not a setting, not one that may change, not a value it takes.
  for (const auto& [key, value, why] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"tasks.max-qeue", "5", "not a setting"},
           {"router", "tcp://127.0.0.1:1", "cannot change while the broker runs"},
           {"tasks.max-queue", "0", "outside"},
           {"tasks.step-timeout", "soon", "not a whole number"},
           {"heartbeat-min", "600000", "heartbeat-max"}}) {
    INFO(key << " = " << value);
    auto bad = op("set");
    bad.key = key;
    bad.value = value;
    CHECK_THAT(refused(ctl, bad, error_code::bad_field).reason, Catch::Contains(why));
  }
  CHECK(ask(ctl, op("status")).at("changes").size() == 1);
}
