// Integration: the coordinator SDK and the worker SDK through the real broker, running
// DI-engine's own coordinator test scenario with the seed's callback names.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlbus/coordinator.hpp"
#include "rlbus/worker.hpp"
#include "support/link.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {

worker_options wopts(const std::string& endpoint, const std::string& id, role r) {
  worker_options o;
  o.endpoint = endpoint;
  o.id = id;
  o.role = r;
  o.heartbeat = 100ms;
  return o;
}

task_spec spec(const std::string& id, role kind) {
  task_spec t;
  t.task_id = id;
  t.kind = kind;
  return t;
}

// A stub collector: 20 data items per task, then collector_done.
task_handlers stub_collector() {
  task_handlers h;
  h.run = [](task_handle& t) {
    for (int i = 0; i < 20; ++i)
      t.emit_data(t.id() + "-d" + std::to_string(i), "buffer-0", flag_map("eval_flag", false));
    t.emit_info(flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  h.close = [](task_handle&) { return flag_map("collector_done", true); };
  return h;
}

// A stub learner: learns until the coordinator closes it; says learner_done on its 5th info.
task_handlers stub_learner() {
  task_handlers h;
  h.run = [](task_handle& t) {
    for (std::uint64_t iter = 0; !t.stop_requested(); ++iter) {
      if (!t.get_data("buffer-0", 4, iter, 5000ms)) continue;
      t.emit_learn_info("buffer-0", flag_map("learner_done", iter + 1 >= 5));
    }
  };
  return h;
}

}  // namespace

TEST_CASE("DI-engine's coordinator scenario with both SDKs and the seed's callbacks",
          "[coordinator]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  worker c0(wopts(ep, "collector-0", role::collector), stub_collector());
  worker c1(wopts(ep, "collector-1", role::collector), stub_collector());
  worker l0(wopts(ep, "learner-0", role::learner), stub_learner());

  std::mutex mu;
  std::multiset<std::string> buffer;  // the "replay buffer": data ids per task
  std::set<std::string> finished;
  std::atomic<int> infos{0};
  std::atomic<int> not_yet{0};
  coordinator_callbacks cb;
  cb.deal_with_collector_send_data = [&](const std::string& task_id, const std::string& buffer_id,
                                         const std::string& data_id, const std::string&) {
    CHECK(buffer_id == "buffer-0");
    CHECK(data_id.rfind(task_id, 0) == 0);
    std::lock_guard lock(mu);
    buffer.insert(task_id);
  };
  cb.deal_with_collector_finish_task = [&](const std::string& task_id, const std::string& result) {
    CHECK(result == flag_map("collector_done", true));
    std::lock_guard lock(mu);
    finished.insert(task_id);
  };
  cb.deal_with_learner_get_data = [&](const std::string&, const std::string&, std::uint32_t batch,
                                      std::uint64_t) -> std::optional<std::string> {
    std::lock_guard lock(mu);
    if (buffer.size() < batch) {
      ++not_yet;
      return std::nullopt;  // the seed slept 1, 3, 5 ... s here; rlbus retries in ms
    }
    return flag_map("batch", true);
  };
  cb.deal_with_learner_send_info = [&](const std::string&, const std::string&, const std::string&) {
    ++infos;
  };
  cb.deal_with_learner_finish_task = [&](const std::string& task_id, const std::string&) {
    std::lock_guard lock(mu);
    finished.insert(task_id);
  };
  coordinator_options co;
  co.endpoint = ep;
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));
  REQUIRE(l0.wait_for(connection_state::ready, 5s));

  // The learner starts first, while the buffer is still empty.
  const auto lt = coord.submit(spec("learner_task_0", role::learner));
  REQUIRE(lt);
  CHECK(lt->accepted);
  for (const auto* id : {"collector_task_0", "collector_task_1"}) {
    const auto r = coord.submit(spec(id, role::collector));
    REQUIRE(r);
    CHECK(r->accepted);
  }
  REQUIRE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return finished.size() == 3;
      },
      15s));
  CHECK(buffer.count("collector_task_0") == 20);
  CHECK(buffer.count("collector_task_1") == 20);
  CHECK(infos == 4);  // the 5th learn info says learner_done: it closes the task instead
  CHECK(coord.open_tasks() == 0);
  CHECK(coord.stream_gaps() == 0);
  // The broker hands its counters over at the end of the turn that sent the last task's end:
  // the coordinator can hear of it first.
  CHECK(wait_until([&] { return b.get().snapshot().tasks_finished == 3; }, 10s));
  const auto s = b.get().snapshot();
  CHECK(s.tasks_queued == 0);
  CHECK(s.tasks_running == 0);
}

TEST_CASE("a refused submit says why", "[coordinator]") {
  broker::server_thread b(test_config());
  coordinator_options co;
  co.endpoint = b.get().router_endpoint();
  coordinator coord(co, {});
  REQUIRE(coord.wait_for(connection_state::ready, 5s));
  REQUIRE(coord.submit(spec("same", role::collector))->accepted);
  const auto dup = coord.submit(spec("same", role::collector));
  REQUIRE(dup);
  CHECK_FALSE(dup->accepted);
  CHECK(dup->code == 411);
  CHECK_THAT(dup->reason, Catch::Contains("same"));
}

TEST_CASE("a task's kind is a worker's: coordinator and bus are refused at once", "[coordinator]") {
  broker::server_thread b(test_config());
  coordinator_options co;
  co.endpoint = b.get().router_endpoint();
  coordinator coord(co, {});
  REQUIRE(coord.wait_for(connection_state::ready, 5s));
  CHECK_THROWS_AS(coord.submit(spec("c", role::coordinator)), std::invalid_argument);
  CHECK_THROWS_AS(coord.submit(spec("n", role::bus)), std::invalid_argument);
  CHECK(coord.submit(spec("l", role::learner))->accepted);
}

TEST_CASE("an attempt that fails is reported and the task re-run", "[coordinator]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  std::atomic<int> requeued{0};
  std::atomic<bool> done{false};
  coordinator_callbacks cb;
  cb.on_task_requeued = [&](const std::string& task_id, std::uint32_t attempt,
                            const std::string& reason, const std::optional<std::string>& result) {
    CHECK(task_id == "flaky");
    CHECK(attempt == 1);
    CHECK_THAT(reason, Catch::Contains("env crashed"));
    CHECK_FALSE(result);  // a plain exception carries no result
    ++requeued;
  };
  cb.deal_with_collector_finish_task = [&](const std::string&, const std::string&) { done = true; };
  coordinator_options co;
  co.endpoint = ep;
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));
  std::atomic<int> runs{0};
  auto h = stub_collector();
  auto inner = h.run;
  h.run = [&, inner](task_handle& t) {
    if (++runs == 1) throw std::runtime_error("env crashed");
    inner(t);
  };
  worker w(wopts(ep, "collector-0", role::collector), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  REQUIRE(coord.submit(spec("flaky", role::collector))->accepted);
  REQUIRE(wait_until([&] { return done.load(); }, 10s));
  CHECK(requeued == 1);
  CHECK(runs == 2);
}

// SPEC §12.3.18: a handler that throws rlbus::task_failure with a result has that map reach
// the coordinator's on_task_requeued and on_task_failed, byte for byte.
TEST_CASE("a task_failure's result reaches the coordinator's callbacks", "[coordinator]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  const auto account = flag_map("diverged", true);
  std::mutex mu;
  std::vector<std::optional<std::string>> requeued, failed;
  coordinator_callbacks cb;
  cb.on_task_requeued = [&](const std::string&, std::uint32_t, const std::string& reason,
                            const std::optional<std::string>& result) {
    CHECK_THAT(reason, Catch::Contains("loss is NaN"));
    std::lock_guard lock(mu);
    requeued.push_back(result);
  };
  cb.on_task_failed = [&](const std::string&, const std::string& reason,
                          const std::optional<std::string>& result) {
    CHECK_THAT(reason, Catch::Contains("loss is NaN"));
    std::lock_guard lock(mu);
    failed.push_back(result);
  };
  coordinator_options co;
  co.endpoint = ep;
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));
  task_handlers h;
  h.run = [&](task_handle&) { throw task_failure("loss is NaN", account); };
  worker w(wopts(ep, "learner-0", role::learner), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  auto t = spec("diverges", role::learner);
  t.max_attempts = 2;
  REQUIRE(coord.submit(t)->accepted);
  REQUIRE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return !failed.empty();
      },
      10s));
  std::lock_guard lock(mu);
  REQUIRE(requeued.size() == 1);
  CHECK(requeued[0] == account);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0] == account);
}

// SPEC §12.7.6: a task_spec's queue_timeout_ms travels in SUBMIT; a task nobody takes fails.
TEST_CASE("a task no worker takes within its queue timeout is reported failed", "[coordinator]") {
  broker::server_thread b(test_config());
  std::mutex mu;
  std::string failed_reason;
  coordinator_callbacks cb;
  cb.on_task_failed = [&](const std::string& task_id, const std::string& reason,
                          const std::optional<std::string>& result) {
    CHECK(task_id == "unwanted");
    CHECK_FALSE(result);
    std::lock_guard lock(mu);
    failed_reason = reason;
  };
  coordinator_options co;
  co.endpoint = b.get().router_endpoint();
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));
  auto t = spec("unwanted", role::learner);
  t.queue_timeout_ms = 150;
  REQUIRE(coord.submit(t)->accepted);
  REQUIRE(wait_until([&] {
    std::lock_guard lock(mu);
    return !failed_reason.empty();
  }));
  CHECK(failed_reason == "no worker took the task within queue_timeout_ms=150");
  CHECK(coord.open_tasks() == 0);
}

// SPEC §12.5.10: "no data yet" goes out with retry_ms 10, doubled per further nil in a row up
// to 1000; data given starts it over.
TEST_CASE("the coordinator backs a learner off while it has no data", "[coordinator]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  std::atomic<int> asked{0};
  coordinator_callbacks cb;
  cb.deal_with_learner_get_data = [&](const std::string&, const std::string&, std::uint32_t,
                                      std::uint64_t) -> std::optional<std::string> {
    if (++asked == 5) return flag_map("batch", true);
    return std::nullopt;
  };
  coordinator_options co;
  co.endpoint = ep;
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));
  zmq::context_t ctx;
  raw_peer l(ctx, ep);
  l.introduce("learner-0", role::learner, 5000);
  REQUIRE(coord.submit(spec("lt", role::learner))->accepted);
  const auto start = l.recv_a<codec::task_start>();
  REQUIRE(start);
  l.send(codec::started{"lt", start->attempt});
  std::vector<std::uint32_t> waits;
  for (std::uint64_t req = 1; req <= 14; ++req) {
    l.send(codec::get_data{"lt", start->attempt, req, "b", 1, 0});
    const auto m = l.recv(3000ms);
    REQUIRE(m);
    if (const auto* n = std::get_if<codec::no_data>(&*m)) {
      CHECK(n->request_id == req);
      waits.push_back(n->retry_ms);
    } else {
      REQUIRE(std::holds_alternative<codec::learn>(*m));
      waits.push_back(0);  // the batch
    }
  }
  CHECK(waits ==
        std::vector<std::uint32_t>{10, 20, 40, 80, 0, 10, 20, 40, 80, 160, 320, 640, 1000, 1000});
}

namespace {

// The uint under `key` in the msgpack map `m`, or nullopt.
std::optional<std::uint64_t> uint_field(const std::string& m, std::string_view key) {
  const auto oh = msgpack::unpack(m.data(), m.size());
  const auto& o = oh.get();
  if (o.type != msgpack::type::MAP) return std::nullopt;
  for (std::uint32_t i = 0; i < o.via.map.size; ++i)
    if (o.via.map.ptr[i].key.as<std::string_view>() == key &&
        o.via.map.ptr[i].val.type == msgpack::type::POSITIVE_INTEGER)
      return o.via.map.ptr[i].val.via.u64;
  return std::nullopt;
}

}  // namespace

TEST_CASE("a learner's new policy reaches collectors through the broker", "[coordinator]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();

  // The learner publishes version 1, waits for a batch collected with it, then publishes
  // version 2 and says it is done.
  task_handlers learner;
  learner.run = [](task_handle& t) {
    REQUIRE(t.publish_policy("pi", 1, "params-1"));
    t.emit_learn_info("b", flag_map("learner_done", false));
    while (!t.stop_requested()) {
      if (!t.get_data("b", 1, 1, 5000ms)) continue;
      REQUIRE(t.publish_policy("pi", 2, "params-2"));
      t.publish_policy("pi", 1, "params-1-again");  // stale: refused, the learner is told
      t.emit_learn_info("b", flag_map("learner_done", true));
      break;
    }
  };
  // Collectors report the params they were started with as the data id.
  task_handlers collector;
  collector.run = [](task_handle& t) {
    const auto& p = t.policy();
    t.emit_data(p ? *p->params : "none", "b", flag_map("eval_flag", false));
    t.emit_info(flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };

  std::mutex mu;
  std::vector<std::pair<std::string, std::optional<std::uint64_t>>> data;  // data id, version
  std::atomic<int> infos{0};
  std::atomic<bool> learner_done{false};
  coordinator_callbacks cb;
  cb.deal_with_collector_send_data = [&](const std::string&, const std::string&,
                                         const std::string& data_id, const std::string& d) {
    std::lock_guard lock(mu);
    data.emplace_back(data_id, uint_field(d, "policy_version"));
  };
  cb.deal_with_learner_get_data = [&](const std::string&, const std::string&, std::uint32_t,
                                      std::uint64_t) -> std::optional<std::string> {
    std::lock_guard lock(mu);
    if (data.size() < 2) return std::nullopt;  // wait for the item collected with version 1
    return flag_map("batch", true);
  };
  cb.deal_with_learner_send_info = [&](const std::string&, const std::string&, const std::string&) {
    ++infos;
  };
  cb.deal_with_learner_finish_task = [&](const std::string&, const std::string&) {
    learner_done = true;
  };
  coordinator_options co;
  co.endpoint = ep;
  coordinator coord(co, cb);
  worker l(wopts(ep, "learner-0", role::learner), learner);
  worker c(wopts(ep, "collector-0", role::collector), collector);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));

  // A collector task before any version exists runs without a policy.
  auto first = spec("before", role::collector);
  first.policy_id = "pi";
  REQUIRE(coord.submit(first)->accepted);
  REQUIRE(wait_until([&] { return coord.open_tasks() == 0; }, 10s));
  REQUIRE(coord.submit(spec("learner", role::learner))->accepted);
  REQUIRE(wait_until([&] { return infos.load() == 1; }, 10s));
  auto second = spec("v1", role::collector);
  second.policy_id = "pi";
  REQUIRE(coord.submit(second)->accepted);
  REQUIRE(wait_until([&] { return learner_done.load(); }, 10s));
  auto third = spec("v2", role::collector);
  third.policy_id = "pi";
  REQUIRE(coord.submit(third)->accepted);
  REQUIRE(wait_until([&] { return coord.open_tasks() == 0; }, 10s));

  CHECK_THAT(l.last_error(), Catch::Contains("STALE_POLICY"));
  std::lock_guard lock(mu);
  REQUIRE(data.size() == 3);
  CHECK(data[0] == std::pair<std::string, std::optional<std::uint64_t>>{"none", std::nullopt});
  CHECK(data[1] == std::pair<std::string, std::optional<std::uint64_t>>{"params-1", 1});
  CHECK(data[2] == std::pair<std::string, std::optional<std::uint64_t>>{"params-2", 2});
}

// SPEC §12.10.7: the seed's deal_with_increase_collector / deal_with_decrease_collector, called
// once per collector that joins or goes, so a coordinator's own tally matches the broker's.
TEST_CASE("the seed's capacity callbacks count collectors joining, leaving and dying",
          "[coordinator]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  worker early(wopts(ep, "collector-early", role::collector), stub_collector());
  REQUIRE(early.wait_for(connection_state::ready, 5s));

  std::atomic<int> tally{0};  // what a DI-engine coordinator keeps with the seed's callbacks
  std::atomic<int> increases{0}, decreases{0};
  std::mutex mu;
  std::vector<std::string> reports;
  coordinator_callbacks cb;
  cb.deal_with_increase_collector = [&] {
    ++tally;
    ++increases;
  };
  cb.deal_with_decrease_collector = [&] {
    --tally;
    ++decreases;
  };
  cb.on_capacity = [&](role kind, const std::string& change, const std::string& worker_id,
                       std::uint64_t count) {
    std::lock_guard lock(mu);
    reports.push_back(std::string(to_string(kind)) + " " + change + " " + worker_id + " " +
                      std::to_string(count));
  };
  coordinator_options co;
  co.endpoint = ep;
  co.heartbeat = 100ms;
  coordinator coord(co, cb);
  // A collector that was there first is counted from the snapshot.
  REQUIRE(wait_until([&] { return coord.collectors() == 1 && tally == 1; }));

  worker c1(wopts(ep, "collector-1", role::collector), stub_collector());
  worker c2(wopts(ep, "collector-2", role::collector), stub_collector());
  worker l0(wopts(ep, "learner-0", role::learner), stub_learner());
  REQUIRE(wait_until([&] { return coord.collectors() == 3 && coord.learners() == 1; }));
  CHECK(tally == 3);

  // A collector that dies (silent, expired by the broker) and one that leaves.
  zmq::context_t ctx;
  auto killed = std::make_unique<raw_peer>(ctx, ep);
  killed->introduce("collector-killed", role::collector, 100);
  REQUIRE(wait_until([&] { return coord.collectors() == 4; }));
  CHECK(tally == 4);
  killed.reset();  // no DISCONNECT, no more heartbeats: the broker expires it
  REQUIRE(wait_until([&] { return coord.collectors() == 3; }));
  CHECK(tally == 3);
  c2.stop();
  REQUIRE(wait_until([&] { return coord.collectors() == 2; }));
  CHECK(tally == 2);
  CHECK(increases == 4);
  CHECK(decreases == 2);
  CHECK(coord.learners() == 1);  // learners are reported, but not to the collector callbacks

  std::lock_guard lock(mu);
  REQUIRE(reports.size() == 8);
  CHECK(reports.front() == "collector snapshot  1");
  CHECK(std::count(reports.begin(), reports.end(), "learner increase learner-0 1") == 1);
  CHECK(std::count(reports.begin(), reports.end(), "collector increase collector-killed 4") == 1);
  CHECK(reports[reports.size() - 2] == "collector decrease collector-killed 3");
  CHECK(reports.back() == "collector decrease collector-2 2");
}

TEST_CASE("a coordinator's judge closes an attempt with one FINISH however many final infos come",
          "[coordinator]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  task_handlers h;
  h.run = [](task_handle& t) {
    for (int i = 0; i < 5; ++i) t.emit_info(flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  worker w(wopts(ep, "collector-0", role::collector), h);
  std::atomic<int> finished{0};
  std::atomic<int> judged{0};
  coordinator_callbacks cb;
  cb.deal_with_collector_judge_finish = [&](const std::string&, const std::string&) {
    ++judged;
    return true;  // every one of the five says "done"
  };
  cb.deal_with_collector_finish_task = [&](const std::string&, const std::string&) { ++finished; };
  coordinator_options co;
  co.endpoint = ep;
  coordinator c(co, cb);
  REQUIRE(c.wait_for(connection_state::ready, 5s));
  REQUIRE(c.submit(spec("collect", role::collector))->accepted);
  REQUIRE(wait_until([&] { return finished == 1; }, 10s));
  CHECK(judged == 5);
  // A second FINISH for a closing task would be refused, and counted against the coordinator.
  CHECK(b.get().snapshot().faults == 0);
  CHECK(c.last_error().empty());
  CHECK(c.welcomes() == 1);
  CHECK(c.session() != 0);
}

TEST_CASE("coordinator::finish closes a running task whose judge never says done",
          "[coordinator]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  std::atomic<bool> running{false};
  task_handlers h;
  h.run = [&](task_handle& t) {
    running = true;
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  h.close = [](task_handle&) { return flag_map("closed_early", true); };
  worker w(wopts(ep, "collector-0", role::collector), h);
  std::mutex mu;
  std::string result;
  coordinator_callbacks cb;
  cb.deal_with_collector_finish_task = [&](const std::string&, const std::string& r) {
    std::lock_guard lock(mu);
    result = r;
  };
  coordinator_options co;
  co.endpoint = ep;
  coordinator c(co, cb);
  REQUIRE(c.wait_for(connection_state::ready, 5s));
  REQUIRE(c.submit(spec("collect", role::collector))->accepted);
  REQUIRE(wait_until([&] { return running.load(); }, 10s));
  c.finish("collect");
  REQUIRE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return !result.empty();
      },
      10s));
  CHECK(result == flag_map("closed_early", true));
  CHECK(c.open_tasks() == 0);
}

TEST_CASE("coordinator::finish of a task not yet running closes it once its worker starts it",
          "[coordinator]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  std::mutex mu;
  std::string result;
  coordinator_callbacks cb;
  cb.deal_with_collector_finish_task = [&](const std::string&, const std::string& r) {
    std::lock_guard lock(mu);
    result = r;
  };
  coordinator_options co;
  co.endpoint = ep;
  coordinator c(co, cb);
  REQUIRE(c.wait_for(connection_state::ready, 5s));
  // No worker yet: the task waits in the queue when the coordinator asks to finish it, which
  // the broker would refuse (it closes only a running task), and count against it.
  REQUIRE(c.submit(spec("collect", role::collector))->accepted);
  c.finish("collect");
  task_handlers h;
  h.run = [](task_handle& t) {
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  h.close = [](task_handle&) { return flag_map("closed_early", true); };
  worker w(wopts(ep, "collector-0", role::collector), h);
  REQUIRE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return !result.empty();
      },
      10s));
  CHECK(result == flag_map("closed_early", true));
  CHECK(c.open_tasks() == 0);
  CHECK(b.get().snapshot().faults == 0);
}

TEST_CASE("a coordinator that adopted a learner task hands its result to the learner callback",
          "[coordinator]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  cuttable_link link(ctx, b.get().router_endpoint());
  std::atomic<bool> running{false};
  task_handlers h;
  h.run = [&](task_handle& t) {
    running = true;
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  h.close = [](task_handle&) { return flag_map("learner_done", true); };
  worker w(wopts(b.get().router_endpoint(), "learner-0", role::learner), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));

  coordinator_options co;
  co.id = "trainer";
  co.heartbeat = 200ms;  // its session expires 600 ms after it went silent
  co.reconnect_min = 10ms;
  co.reconnect_max = 50ms;
  {
    co.endpoint = link.endpoint();
    coordinator first(co, {});
    REQUIRE(first.wait_for(connection_state::ready, 5s));
    REQUIRE(first.submit(spec("learn", role::learner))->accepted);
    REQUIRE(wait_until([&] { return running.load(); }, 10s));
    link.cut_existing();  // its goodbye never arrives: to the broker it just vanished
  }
  std::atomic<int> as_learner{0}, as_collector{0};
  coordinator_callbacks cb;
  cb.deal_with_learner_finish_task = [&](const std::string&, const std::string&) { ++as_learner; };
  cb.deal_with_collector_finish_task = [&](const std::string&, const std::string&) {
    ++as_collector;
  };
  co.endpoint = b.get().router_endpoint();
  coordinator second(co, cb);  // a new process: it never saw the SUBMIT
  REQUIRE(second.wait_for(connection_state::ready, 10s));
  REQUIRE(wait_until([&] { return b.get().snapshot().coordinator_adoptions == 1; }, 10s));
  second.finish("learn");
  REQUIRE(wait_until([&] { return as_learner + as_collector == 1; }, 10s));
  CHECK(as_learner == 1);
  CHECK(as_collector == 0);
}
