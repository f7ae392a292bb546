// Integration: the worker SDK's task handlers against the real broker, with a raw
// coordinator: collector and learner flows, a handler that throws, and a cancel.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rlbus/worker.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {

worker_options opts(const std::string& endpoint, const std::string& id, role r) {
  worker_options o;
  o.endpoint = endpoint;
  o.id = id;
  o.role = r;
  o.heartbeat = 100ms;
  return o;
}

// Blocks the handler until the broker asks to stop (the way a collector loop would poll).
void wait_for_stop(const task_handle& t) {
  REQUIRE(wait_until([&] { return t.stop_requested(); }, 5000ms));
}

codec::submit flagged_task(const std::string& id, role kind) {
  return codec::submit{id, kind, flag_map("eval_flag", false), {}, {}, {}, {}, {}, {}};
}

}  // namespace

TEST_CASE("a collector's handlers stream data and return a result", "[worker-tasks]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  raw_peer coord(ctx, b.get().router_endpoint());
  coord.introduce("coordinator", role::coordinator, 5000);
  task_handlers h;
  h.run = [](task_handle& t) {
    CHECK(t.info() == flag_map("eval_flag", false));  // task_info arrives byte for byte
    for (int i = 0; i < 20; ++i)
      REQUIRE(t.emit_data("d" + std::to_string(i), "buffer-0", flag_map("done", false)));
    REQUIRE(t.emit_info(flag_map("collector_done", true)));
    wait_for_stop(t);
  };
  h.close = [](task_handle&) { return flag_map("collector_done", true); };
  worker w(opts(b.get().router_endpoint(), "collector-0", role::collector), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));

  coord.send(flagged_task("ct", role::collector));
  std::vector<codec::task_event> seen;
  until_event(coord, "info", &seen);
  std::vector<std::string> expected;
  for (int i = 0; i < 20; ++i) expected.push_back("d" + std::to_string(i));
  CHECK(data_ids(seen) == expected);  // each once, in order, batched or not
  coord.send(codec::finish{"ct"});
  const auto done = until_event(coord, "finished");
  CHECK(done.body == flag_map("collector_done", true));
  // The broker stores its counters right after the step it has just told the coordinator of.
  CHECK(wait_until([&] { return b.get().snapshot().tasks_finished == 1; }));
}

TEST_CASE("a learner's get_data waits through 'not yet' and learns", "[worker-tasks]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  raw_peer coord(ctx, b.get().router_endpoint());
  coord.introduce("coordinator", role::coordinator, 5000);
  std::atomic<int> learned{0};
  task_handlers h;
  h.run = [&](task_handle& t) {
    for (std::uint64_t iter = 0; iter < 5; ++iter) {
      const auto batch = t.get_data("buffer-0", 32, iter, 5000ms);
      REQUIRE(batch);
      ++learned;
      REQUIRE(t.emit_learn_info("buffer-0", flag_map("learner_done", iter == 4)));
    }
    wait_for_stop(t);
  };
  worker w(opts(b.get().router_endpoint(), "learner-0", role::learner), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  coord.send(flagged_task("lt", role::learner));
  int nils = 0;
  int infos = 0;
  while (infos < 5) {
    auto e = coord.recv_a<codec::task_event>(5000ms);
    REQUIRE(e);
    if (e->event == "data_request") {
      auto fields = msgpack::unpack(e->body.data(), e->body.size());
      const auto req = fields.get().via.map.ptr[0].val.as<std::uint64_t>();
      const bool not_yet = nils < 2;  // twice "none yet" before the buffer fills
      nils += not_yet ? 1 : 0;
      coord.send(codec::data_reply{"lt", req, not_yet ? codec::nil_blob : flag_map("batch", true)});
    } else if (e->event == "learn_info") {
      ++infos;
    }
  }
  CHECK(learned == 5);
  coord.send(codec::finish{"lt"});
  until_event(coord, "finished");
}

TEST_CASE("a handler that throws fails the attempt, and the task fails past max attempts",
          "[worker-tasks]") {
  auto cfg = test_config();
  cfg.max_attempts = 2;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  raw_peer coord(ctx, b.get().router_endpoint());
  coord.introduce("coordinator", role::coordinator, 5000);
  std::atomic<int> runs{0};
  task_handlers h;
  h.run = [&](task_handle&) {
    ++runs;
    throw std::runtime_error("environment crashed");
  };
  worker w(opts(b.get().router_endpoint(), "collector-bad", role::collector), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  coord.send(flagged_task("doomed", role::collector));
  const auto requeued = until_event(coord, "requeued");
  CHECK(requeued.body.find("environment crashed") != std::string::npos);
  const auto failed = until_event(coord, "failed");
  CHECK(failed.attempt == 2);
  CHECK(runs == 2);
}

TEST_CASE("a cancelled task stops its handler and the worker takes the next one",
          "[worker-tasks]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  raw_peer coord(ctx, b.get().router_endpoint());
  coord.introduce("coordinator", role::coordinator, 5000);
  std::atomic<int> stopped_by_abort{0};
  task_handlers h;
  h.run = [&](task_handle& t) {
    wait_for_stop(t);
    if (t.aborted()) ++stopped_by_abort;
  };
  worker w(opts(b.get().router_endpoint(), "collector-0", role::collector), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  coord.send(flagged_task("first", role::collector));
  until_event(coord, "started");
  coord.send(codec::cancel{"first", "changed my mind"});
  coord.send(flagged_task("second", role::collector));
  const auto s = until_event(coord, "started");
  CHECK(s.task_id == "second");
  CHECK(stopped_by_abort == 1);
}

// SPEC §12.3.19: a handler busy for longer than the step timeout, with nothing to report,
// keeps its attempt with keep_alive(); once the broker asks to close, keep_alive() sends
// nothing and says so.
TEST_CASE("keep_alive carries a handler past its step timeout", "[worker-tasks]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  raw_peer coord(ctx, b.get().router_endpoint());
  coord.introduce("coordinator", role::coordinator, 5000);
  std::atomic<bool> alive_after_close{true};
  task_handlers h;
  h.run = [&](task_handle& t) {
    const auto t0 = std::chrono::steady_clock::now();
    // Four step timeouts of work without any DATA or INFO.
    while (std::chrono::steady_clock::now() - t0 < 800ms) {
      REQUIRE(t.keep_alive());
      std::this_thread::sleep_for(40ms);  // the "work"
    }
    REQUIRE(t.emit_info(flag_map("collector_done", true)));
    wait_for_stop(t);
    alive_after_close = t.keep_alive();
  };
  worker w(opts(b.get().router_endpoint(), "collector-0", role::collector), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  auto s = flagged_task("busy", role::collector);
  s.step_timeout_ms = 200;
  s.max_attempts = 1;
  coord.send(s);
  std::vector<codec::task_event> seen;
  until_event(coord, "info", &seen);
  for (const auto& e : seen) CHECK(e.event != "failed");
  coord.send(codec::finish{"busy"});
  until_event(coord, "finished");
  CHECK_FALSE(alive_after_close);
}

// SPEC §12.5.10: the learner waits what NO_DATA says before it asks again, at most 2 s, and
// never past its own timeout.
TEST_CASE("get_data waits the NO_DATA hint, within its own timeout", "[worker-tasks]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  raw_peer coord(ctx, b.get().router_endpoint());
  coord.introduce("coordinator", role::coordinator, 5000);
  std::atomic<bool> short_wait_gave_up{false};
  std::atomic<bool> got_batch{false};
  task_handlers h;
  h.run = [&](task_handle& t) {
    // The coordinator says "in 5 s": a 300 ms timeout ends the wait first.
    const auto t0 = std::chrono::steady_clock::now();
    short_wait_gave_up =
        !t.get_data("b", 1, 0, 300ms) && std::chrono::steady_clock::now() - t0 < 2000ms;
    got_batch = t.get_data("b", 1, 1, 5000ms).has_value();
    wait_for_stop(t);
  };
  worker w(opts(b.get().router_endpoint(), "learner-0", role::learner), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  coord.send(flagged_task("lt", role::learner));
  const auto request_of = [&] {
    const auto e = until_event(coord, "data_request");
    auto fields = msgpack::unpack(e.body.data(), e.body.size());
    return fields.get().via.map.ptr[0].val.as<std::uint64_t>();
  };
  codec::data_reply later{"lt", request_of(), codec::nil_blob};
  later.retry_ms = 5000;
  coord.send(later);
  // The next request comes from the second get_data; answered "in 300 ms".
  codec::data_reply soon{"lt", request_of(), codec::nil_blob};
  soon.retry_ms = 300;
  coord.send(soon);
  const auto answered = std::chrono::steady_clock::now();
  const auto again = request_of();
  CHECK(std::chrono::steady_clock::now() - answered >= 300ms - 20ms);
  coord.send(codec::data_reply{"lt", again, flag_map("batch", true)});
  REQUIRE(wait_until([&] { return got_batch.load(); }));
  CHECK(short_wait_gave_up);
  coord.send(codec::finish{"lt"});
  until_event(coord, "finished");
}

// SPEC §13.4.6: a running task learns of a newer policy version through on_policy and its
// policy(), and tags its data with it.
TEST_CASE("a running task sees a newer policy version", "[worker-tasks]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  raw_peer coord(ctx, b.get().router_endpoint()), l(ctx, b.get().router_endpoint());
  coord.introduce("coordinator", role::coordinator, 5000);
  l.introduce("learner-0", role::learner, 5000);
  // The handlers run on the worker's threads: they note what they saw, and this thread
  // asserts it (Catch2 asserts on one thread only).
  std::atomic<std::uint64_t> told{0};
  std::atomic<std::uint64_t> seen{0};
  std::atomic<bool> told_other_task{false}, policy_at_start{false}, emitted{false};
  task_handlers h;
  h.on_policy = [&](const std::string& task_id, std::uint32_t, const rlbus::policy& p) {
    if (task_id != "ct") told_other_task = true;
    told = p.version;
  };
  std::atomic<bool> looked{false};
  h.run = [&](task_handle& t) {
    policy_at_start = t.policy().has_value();  // none published when it started
    looked = true;
    if (wait_until([&] { return t.policy().has_value(); })) seen = t.policy()->version;
    emitted = t.emit_data("d0", "b", flag_map("done", false));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  worker w(opts(b.get().router_endpoint(), "collector-0", role::collector), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  auto s = flagged_task("ct", role::collector);
  s.policy_id = "pi";
  coord.send(s);
  until_event(coord, "started");
  // Published once the handler has looked: its thread may start after STARTED went out.
  REQUIRE(wait_until([&] { return looked.load(); }));
  l.send(codec::policy{"pi", 7, "/ckpt/7", std::nullopt});
  const auto data = until_event(coord, "data");
  CHECK_FALSE(policy_at_start);
  // The handler notes emit_data's answer once it returns, which may be after the broker
  // relayed the data (seen under ASan).
  CHECK(wait_until([&] { return emitted.load(); }));
  CHECK_FALSE(told_other_task);
  CHECK(seen == 7);
  CHECK(wait_until([&] { return told.load() == 7; }));  // on_policy runs on a thread of its own
  auto fields = msgpack::unpack(data.body.data(), data.body.size());
  const auto& m = fields.get().via.map;
  CHECK(std::string_view(m.ptr[m.size - 1].key.via.str.ptr, m.ptr[m.size - 1].key.via.str.size) ==
        "policy_version");
  CHECK(m.ptr[m.size - 1].val.as<std::uint64_t>() == 7);
  coord.send(codec::finish{"ct"});
  until_event(coord, "finished");
}

namespace {

/// What `fn` threw as std::invalid_argument ("" when it returned).
template <class F>
std::string refusal(F&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("user data the broker would refuse throws in the handler and costs nothing",
          "[worker-tasks]") {
  auto cfg = test_config();
  cfg.max_message = 8192;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  raw_peer coord(ctx, b.get().router_endpoint());
  coord.introduce("coordinator", role::coordinator, 5000);
  std::mutex mu;
  std::vector<std::string> refused;
  std::atomic<bool> sent_ok{false};
  task_handlers h;
  h.run = [&](task_handle& t) {
    std::vector<std::string> r{
        // one level more than a data event can carry (SPEC 12.2.3.1)
        refusal([&] { t.emit_data("deep", "b", nested_map(15)); }),
        refusal([&] { t.emit_data("not-a-map", "b", "\x01"); }),
        refusal([&] { t.emit_data("big", "b", "\x80", std::string(9000, 'x')); }),
        refusal([&] { t.emit_info(nested_map(16)); }),  // 17 levels with the INFO's own map
    };
    sent_ok =
        t.emit_data("ok", "b", nested_map(14)) && t.emit_info(flag_map("collector_done", true));
    {
      std::lock_guard lock(mu);
      refused = std::move(r);
    }
    wait_for_stop(t);
  };
  h.close = [](task_handle&) { return nested_map(16); };  // a result that cannot travel
  worker w(opts(b.get().router_endpoint(), "collector-0", role::collector), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));

  coord.send(codec::submit{"ct", role::collector, codec::empty_map_blob, {}, {}, {}, {}, {}, 1});
  std::vector<codec::task_event> seen;
  until_event(coord, "info", &seen);
  // The info can reach the coordinator before the handler has noted what it saw.
  REQUIRE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return !refused.empty();
      },
      5s));
  CHECK(sent_ok);
  {
    std::lock_guard lock(mu);
    REQUIRE(refused.size() == 4);
    CHECK(refused[0].find("emit_data: field 'meta': nests 15 levels") == 0);
    CHECK(refused[1].find("emit_data: field 'meta': expected a map") == 0);
    CHECK(refused[2].find("more than the broker's max-message of 8192") != std::string::npos);
    CHECK(refused[3].find("emit_info: msgpack nesting too deep") == 0);
  }
  // Only what could travel did, and the data index did not skip: "ok" is DATA 1.
  std::vector<std::string> data;
  for (const auto& e : seen)
    if (e.event == "data") data.push_back(e.body);
  REQUIRE(data.size() == 1);
  CHECK(data[0].find(nested_map(14)) != std::string::npos);
  coord.send(codec::finish{"ct"});
  const auto failed = until_event(coord, "failed");
  CHECK(failed.body.find("the close handler's result cannot travel") != std::string::npos);
  CHECK(b.get().snapshot().faults == 0);  // the broker refused nothing
}

namespace {

/// A broker, a raw coordinator and a collector handler that runs until stopped and notes
/// whether it was aborted: the setting of the leaving tests.
struct leaving_setup {
  broker::server_thread b{test_config()};
  zmq::context_t ctx;
  raw_peer coord{ctx, b.get().router_endpoint()};
  std::atomic<bool> aborted{false};
  task_handlers h;
  leaving_setup() {
    coord.introduce("coordinator", role::coordinator, 5000);
    h.run = [this](task_handle& t) {
      wait_for_stop(t);
      aborted = t.aborted();
    };
  }
  void submit() {
    coord.send(codec::submit{"ct", role::collector, codec::empty_map_blob, {}, {}, {}, {}, {}, 2});
  }
  /// The task comes back to the queue, saying its worker is leaving; its handler was aborted.
  void expect_handed_back() {
    const auto requeued = until_event(coord, "requeued");
    CHECK(requeued.body.find("worker collector-0 leaving") != std::string::npos);
    CHECK(wait_until([&] { return aborted.load(); }));
  }
};

}  // namespace

TEST_CASE("a leaving worker's task is handed back by its deadline", "[worker-tasks]") {
  leaving_setup s;
  worker w(opts(s.b.get().router_endpoint(), "collector-0", role::collector), s.h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  s.submit();
  until_event(s.coord, "assigned");
  CHECK_THROWS_AS(w.leave(std::chrono::hours(25)), std::invalid_argument);
  CHECK_FALSE(w.leaving());
  REQUIRE(w.leave(200ms));
  CHECK(w.leaving());
  s.expect_handed_back();
  // the task waits for another worker: this one is leaving
  worker other(opts(s.b.get().router_endpoint(), "collector-1", role::collector), s.h);
  const auto again = until_event(s.coord, "assigned");
  CHECK(again.worker_id == "collector-1");
}

// The SIGTERM it handles is this test process's own: the handler only notes the signal, and
// no other test makes a worker with leave_on_sigterm.
TEST_CASE("leave_on_sigterm: SIGTERM makes the worker leave, and the process goes on",
          "[worker-tasks]") {
  leaving_setup s;
  auto o = opts(s.b.get().router_endpoint(), "collector-0", role::collector);
  o.leave_on_sigterm = 100ms;
  worker w(o, s.h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  s.submit();
  until_event(s.coord, "started");
  CHECK_FALSE(w.leaving());
  REQUIRE(::raise(SIGTERM) == 0);
  CHECK(wait_until([&] { return w.leaving(); }));
  s.expect_handed_back();
  CHECK(w.state() == connection_state::ready);  // still connected: it stops when its owner says
}
