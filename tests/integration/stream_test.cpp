// Integration: the coordinator's stream is lossless end to end (SPEC §12.9). A coordinator cut
// off from the broker while its collectors keep producing gets every event exactly once after
// it reconnects, and a coordinator slower than its collectors holds them back instead of
// losing their data. Both SDKs, the real broker, every wait with a deadline.
#include <catch2/catch.hpp>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "codec/codec.hpp"
#include "rlbus/coordinator.hpp"
#include "rlbus/worker.hpp"
#include "support/link.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {

/// A collector: beats 1 s apart, so a loaded machine (or a sanitizer) that starves it for a few
/// hundred ms does not end its session and re-run its task; the tests here are about the
/// stream, and the ones that cut a link set their own beat.
worker_options collector_at(const std::string& endpoint, const std::string& id) {
  worker_options o;
  o.endpoint = endpoint;
  o.id = id;
  o.role = role::collector;
  o.heartbeat = 1000ms;
  return o;
}

/// Whether the broker's counters come to say `finished` tasks finished (within 10 s). They
/// are handed over at the end of the loop's turn that sent a task's end: its coordinator can
/// hear of the end first, so the counters are waited for, never read at once.
bool counters_settle(broker::server_thread& b, std::uint64_t finished) {
  return wait_until([&] { return b.get().snapshot().tasks_finished == finished; }, 10s);
}

task_spec collector_task(const std::string& id) {
  task_spec t;
  t.task_id = id;
  t.kind = role::collector;
  return t;
}

/// Data ids per task, in the order the coordinator's callback saw them.
struct data_log {
  std::mutex mu;
  std::map<std::string, std::vector<int>> by_task;
  std::size_t total = 0;
  std::set<std::string> finished;

  void add(const std::string& task_id, const std::string& data_id) {
    std::lock_guard lock(mu);
    by_task[task_id].push_back(std::stoi(data_id.substr(data_id.rfind('-') + 1)));
    ++total;
  }
  std::size_t size() {
    std::lock_guard lock(mu);
    return total;
  }
  bool done(std::size_t tasks) {
    std::lock_guard lock(mu);
    return finished.size() == tasks;
  }
  /// Every one of 0..n-1 exactly once, in order.
  void check_exactly_once(const std::string& task_id, int n) {
    std::lock_guard lock(mu);
    std::vector<int> want(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) want[static_cast<std::size_t>(i)] = i;
    INFO("task " << task_id);
    CHECK(by_task[task_id] == want);
  }
};

coordinator_callbacks logging(data_log& log, std::atomic<std::uint64_t>& lost) {
  coordinator_callbacks cb;
  cb.deal_with_collector_send_data = [&log](const std::string& task_id, const std::string&,
                                            const std::string& data_id,
                                            const std::string&) { log.add(task_id, data_id); };
  cb.deal_with_collector_finish_task = [&log](const std::string& task_id, const std::string&) {
    std::lock_guard lock(log.mu);
    log.finished.insert(task_id);
  };
  cb.on_stream_lost = [&lost](std::uint64_t first, std::uint64_t last) {
    lost += last - first + 1;
  };
  return cb;
}

}  // namespace

TEST_CASE("a coordinator cut off while events keep coming gets every one exactly once",
          "[stream]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  cuttable_link link(ctx, b.get().router_endpoint());
  data_log log;
  std::atomic<std::uint64_t> lost{0};
  coordinator_options co;
  co.endpoint = link.endpoint();
  co.heartbeat = 50ms;
  co.reconnect_min = 10ms;
  co.reconnect_max = 50ms;
  coordinator coord(co, logging(log, lost));
  REQUIRE(coord.wait_for(connection_state::ready, 5s));

  // The collector talks to the broker directly: only the coordinator is cut off. It makes 100
  // items, 200 more once the cut is made, and the last 100 once the coordinator is back.
  constexpr int items = 400;
  std::atomic<int> phase{1};
  std::atomic<bool> emit_failed{false};  // checked on the test's thread: Catch2 is not thread-safe
  task_handlers h;
  h.run = [&](task_handle& t) {
    for (int i = 0; i < items; ++i) {
      if (i == 100) wait_until([&] { return phase >= 2; }, 10s);
      if (i == 300) wait_until([&] { return phase >= 3; }, 10s);
      if (!t.emit_data("d-" + std::to_string(i), "buffer-0", flag_map("eval_flag", false)))
        emit_failed = true;
    }
    t.emit_info(flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  worker w(collector_at(b.get().router_endpoint(), "collector-0"), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  REQUIRE(coord.submit(collector_task("collect"))->accepted);

  REQUIRE(wait_until([&] { return log.size() == 100; }, 10s));
  const auto replays_before = coord.stream_replays();
  link.cut_existing();  // silently: neither side is told
  phase = 2;
  // The coordinator notices the silence, reconnects through the link, resumes its session and
  // asks for what it missed.
  REQUIRE(wait_until([&] { return coord.stream_replays() > replays_before; }, 10s));
  REQUIRE(coord.wait_for(connection_state::ready, 5s));
  phase = 3;
  REQUIRE(wait_until([&] { return log.done(1); }, 20s));

  CHECK_FALSE(emit_failed);
  log.check_exactly_once("collect", items);
  CHECK(lost == 0);
  CHECK(coord.stream_gaps() == 0);
  CHECK(coord.open_tasks() == 0);
  CHECK(counters_settle(b, 1));
  const auto s = b.get().snapshot();
  CHECK(s.stream_resent > 0);  // what went down with the cut connection came again
  CHECK(s.stream_lost == 0);
}

TEST_CASE("a coordinator process that vanished is succeeded by a new one that adopts its task",
          "[stream]") {
  broker::server_thread b(test_config());  // the default coordinator grace
  zmq::context_t ctx;
  cuttable_link link(ctx, b.get().router_endpoint());
  constexpr int items = 200;
  std::atomic<int> phase{1};
  task_handlers h;
  h.run = [&](task_handle& t) {
    for (int i = 0; i < items; ++i) {
      if (i == 100) wait_until([&] { return phase >= 2; }, 20s);
      t.emit_data("d-" + std::to_string(i), "buffer-0", flag_map("eval_flag", false));
    }
    t.emit_info(flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  worker w(collector_at(b.get().router_endpoint(), "collector-0"), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));

  data_log first_log, second_log;
  std::atomic<std::uint64_t> lost{0};
  coordinator_options co;
  co.id = "trainer";
  co.heartbeat = 200ms;  // its session expires 600 ms after it went silent
  co.reconnect_min = 10ms;
  co.reconnect_max = 50ms;
  {
    co.endpoint = link.endpoint();
    coordinator first(co, logging(first_log, lost));
    REQUIRE(first.wait_for(connection_state::ready, 5s));
    REQUIRE(first.submit(collector_task("collect"))->accepted);
    REQUIRE(wait_until([&] { return first_log.size() == 100; }, 10s));
    link.cut_existing();  // its goodbye below never arrives: to the broker it just vanished
  }
  std::atomic<int> cancelled{0};
  auto callbacks = logging(second_log, lost);
  callbacks.on_task_cancelled = [&](const std::string&, const std::string&) { ++cancelled; };
  co.endpoint = b.get().router_endpoint();
  // Only the old session had to expire fast. The new one beats every second: under
  // ThreadSanitizer beside a build, a stall of the test process past 600 ms expired it too,
  // and it adopted its own tasks a second time.
  co.heartbeat = 1s;
  coordinator second(co, std::move(callbacks));  // refused (409) until the old session expired
  REQUIRE(second.wait_for(connection_state::ready, 10s));
  phase = 2;
  REQUIRE(wait_until([&] { return second_log.done(1); }, 20s));

  // The new process went on after what the old one acknowledged: no gap. What comes again is
  // what the old one handled after its last ACK that reached the broker (the cut may have
  // taken the last ones).
  std::vector<int> got;
  {
    std::lock_guard lock(second_log.mu);
    got = second_log.by_task["collect"];
  }
  REQUIRE_FALSE(got.empty());
  CHECK(got.front() <= 100);
  std::vector<int> want;
  for (int i = got.front(); i < items; ++i) want.push_back(i);
  CHECK(got == want);
  CHECK(lost == 0);
  CHECK(cancelled == 0);
  CHECK(second.stream_gaps() == 0);
  CHECK(wait_until([&] { return b.get().snapshot().tasks_finished == 1; }, 5s));
  const auto s = b.get().snapshot();
  CHECK(s.coordinator_adoptions == 1);
  CHECK(s.tasks_requeued == 0);
}

TEST_CASE("a slow coordinator holds its collectors back and loses nothing", "[stream]") {
  auto cfg = test_config();
  cfg.stream_window = 16;
  broker::server_thread b(cfg);
  const auto ep = b.get().router_endpoint();
  data_log log;
  std::atomic<std::uint64_t> lost{0};
  // The callback blocks at the first data item until the test lets it go, then stays slow.
  std::atomic<bool> gate_open{false};
  std::atomic<int> seen{0};
  auto cb = logging(log, lost);
  auto record = cb.deal_with_collector_send_data;
  cb.deal_with_collector_send_data = [&, record](const std::string& task_id, const std::string& buf,
                                                 const std::string& data_id,
                                                 const std::string& data) {
    wait_until([&] { return gate_open.load(); }, 20s);
    if (++seen % 25 == 0) std::this_thread::sleep_for(2ms);
    record(task_id, buf, data_id, data);
  };
  coordinator_options co;
  co.endpoint = ep;
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));

  constexpr int items = 200;
  std::atomic<int> emitted{0};
  std::atomic<bool> emit_failed{false};
  task_handlers h;
  h.run = [&](task_handle& t) {
    for (int i = 0; i < items; ++i) {
      if (t.emit_data(t.id() + "-" + std::to_string(i), "buffer-0", flag_map("eval_flag", false)))
        ++emitted;
      else
        emit_failed = true;
    }
    t.emit_info(flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  worker c0(collector_at(ep, "collector-0"), h), c1(collector_at(ep, "collector-1"), h);
  REQUIRE(c0.wait_for(connection_state::ready, 5s));
  REQUIRE(c1.wait_for(connection_state::ready, 5s));
  REQUIRE(coord.submit(collector_task("fast-0"))->accepted);
  REQUIRE(coord.submit(collector_task("fast-1"))->accepted);

  // Both collectors run into the window and wait; what they emitted fits it: the window of 16
  // plus the lifecycle events (assigned, started) the coordinator processed before it blocked.
  REQUIRE(wait_until([&] { return c0.credit_waits() > 0 && c1.credit_waits() > 0; }, 10s));
  CHECK(emitted <= 16 + 4);
  CHECK(log.size() == 0);
  gate_open = true;
  REQUIRE(wait_until([&] { return log.done(2); }, 30s));

  CHECK_FALSE(emit_failed);
  log.check_exactly_once("fast-0", items);
  log.check_exactly_once("fast-1", items);
  CHECK(lost == 0);
  CHECK(coord.stream_gaps() == 0);
  CHECK(counters_settle(b, 2));
  const auto s = b.get().snapshot();
  CHECK(s.faults == 0);  // no DATA past its credit, no bad ACK
  CHECK(s.stream_lost == 0);
}

// Credit granted while few collectors shared the window cannot be taken back; it must not
// starve the collectors that joined later (SPEC §12.9.10). Sixteen collectors, each sending
// a short burst per round, every round delivered in full.
// Items are told apart by their ids: should a collector be taken for lost on a loaded machine,
// its task's next attempt sends its rounds again, and those count once.
TEST_CASE("collectors that join a busy stream get credit too", "[stream]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  std::mutex mu;
  std::set<std::string> seen;
  const auto got = [&] {
    std::lock_guard lock(mu);
    return static_cast<int>(seen.size());
  };
  coordinator_callbacks cb;
  cb.deal_with_collector_send_data = [&](const std::string& task, const std::string&,
                                         const std::string& data_id, const std::string&) {
    std::lock_guard lock(mu);
    seen.insert(task + "/" + data_id);
  };
  coordinator_options co;
  co.endpoint = ep;
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));
  std::atomic<int> go{0};
  task_handlers h;
  h.run = [&](task_handle& t) {
    int done = 0;
    while (!t.stop_requested()) {
      if (go.load() > done) {
        ++done;
        for (int i = 0; i < 13; ++i)
          t.emit_data(std::to_string(done) + "." + std::to_string(i), "b", flag_map("x", false));
      }
      std::this_thread::sleep_for(1ms);
    }
  };
  std::vector<std::unique_ptr<worker>> ws;
  for (int i = 0; i < 16; ++i)
    ws.push_back(std::make_unique<worker>(collector_at(ep, "c" + std::to_string(i)), h));
  for (auto& w : ws) REQUIRE(w->wait_for(connection_state::ready, 5s));
  for (int i = 0; i < 16; ++i)
    REQUIRE(coord.submit(collector_task("t" + std::to_string(i)))->accepted);
  for (int round = 1; round <= 10; ++round) {
    go = round;
    const bool ok = wait_until([&] { return got() == 16 * 13 * round; }, 10s);
    INFO("round " << round << ": " << got() << " items of " << 16 * 13 * round);
    REQUIRE(ok);
  }
}

// ---- reliable data across a collector's reconnect (SPEC §12.11) ---------------------------

namespace {

/// A collector task of `items` DATA ("d-0" ...): the first `before` while connected, the next
/// up to `resume_at` once `phase` reaches 2 (the link is cut), the rest once it reaches 3 (the
/// worker is back).
task_handlers phased(int items, int before, int resume_at, std::atomic<int>& phase,
                     std::atomic<bool>& emit_failed) {
  task_handlers h;
  h.run = [=, &phase, &emit_failed](task_handle& t) {
    for (int i = 0; i < items; ++i) {
      if (i == before) wait_until([&] { return phase >= 2; }, 20s);
      if (i == resume_at) wait_until([&] { return phase >= 3; }, 20s);
      if (!t.emit_data("d-" + std::to_string(i), "buffer-0", flag_map("eval_flag", false)))
        emit_failed = true;
    }
    t.emit_info(flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  return h;
}

/// A collector behind `link`, quick to notice the cut and to come back: it resumes its session
/// well within the broker's liveness window (one heartbeat of margin).
worker_options cut_collector(const cuttable_link& link, std::size_t max_unconfirmed) {
  auto o = collector_at(link.endpoint(), "collector-0");
  o.heartbeat = 200ms;
  o.reconnect_min = 10ms;
  o.reconnect_max = 50ms;
  o.max_unconfirmed_data = max_unconfirmed;
  return o;
}

/// Takes a `phased` collector of 200 / 350 through a cut: its first 200 DATA arrive, the
/// link is cut under the next 150, and the rest follow once it has resumed its session.
void through_a_cut(data_log& log, cuttable_link& link, const worker& w, std::atomic<int>& phase) {
  REQUIRE(wait_until([&] { return log.size() == 200; }, 10s));
  link.cut_existing();  // the next 150 DATA go into a connection that drops them
  phase = 2;
  // The worker notices the silence, reconnects through the link and resumes its session.
  REQUIRE(wait_until([&] { return w.welcomes() >= 2; }, 10s));
  phase = 3;
  REQUIRE(wait_until([&] { return log.done(1); }, 20s));
}

struct lost_ranges {
  std::mutex mu;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;  // DATA indexes: 1 = "d-0"
};

}  // namespace

TEST_CASE("a collector cut off mid-stream gets every DATA through exactly once", "[stream]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  cuttable_link link(ctx, b.get().router_endpoint());
  data_log log;
  std::atomic<std::uint64_t> lost{0};
  lost_ranges reported;
  auto cb = logging(log, lost);
  cb.on_data_lost = [&](const std::string&, std::uint32_t, std::uint64_t first,
                        std::uint64_t last) {
    std::lock_guard lock(reported.mu);
    reported.ranges.emplace_back(first, last);
  };
  coordinator_options co;
  co.endpoint = b.get().router_endpoint();  // only the collector goes through the link
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));

  constexpr int items = 500;
  std::atomic<int> phase{1};
  std::atomic<bool> emit_failed{false};
  worker w(cut_collector(link, 4096), phased(items, 200, 350, phase, emit_failed));
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  const auto token = w.session();
  REQUIRE(coord.submit(collector_task("collect"))->accepted);

  through_a_cut(log, link, w, phase);

  CHECK_FALSE(emit_failed);
  CHECK(w.session() == token);  // resumed: the same attempt went on
  log.check_exactly_once("collect", items);
  CHECK(coord.data_lost() == 0);
  CHECK(reported.ranges.empty());
  CHECK(w.data_dropped() == 0);
  CHECK(w.data_resent() > 0);  // what went into the cut connection came again
  CHECK(counters_settle(b, 1));
  const auto s = b.get().snapshot();
  CHECK(s.data_lost == 0);
  CHECK(s.tasks_requeued == 0);
}

TEST_CASE("DATA a collector cannot keep across a cut is reported lost, not skipped silently",
          "[stream]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  cuttable_link link(ctx, b.get().router_endpoint());
  data_log log;
  std::atomic<std::uint64_t> lost{0};
  lost_ranges reported;
  auto cb = logging(log, lost);
  cb.on_data_lost = [&](const std::string& task_id, std::uint32_t attempt, std::uint64_t first,
                        std::uint64_t last) {
    std::lock_guard lock(reported.mu);
    if (task_id == "collect" && attempt == 1) reported.ranges.emplace_back(first, last);
  };
  coordinator_options co;
  co.endpoint = b.get().router_endpoint();
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));

  // It keeps 16 unconfirmed DATA at most, and emits 150 into the cut connection.
  constexpr int items = 500;
  std::atomic<int> phase{1};
  std::atomic<bool> emit_failed{false};
  worker w(cut_collector(link, 16), phased(items, 200, 350, phase, emit_failed));
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  const auto token = w.session();
  REQUIRE(coord.submit(collector_task("collect"))->accepted);

  through_a_cut(log, link, w, phase);

  CHECK_FALSE(emit_failed);
  CHECK(w.session() == token);
  CHECK(w.data_dropped() > 0);
  // Every DATA either arrived, once and in order, or was reported lost: no silent hole.
  std::vector<int> got;
  {
    std::lock_guard lock(log.mu);
    got = log.by_task["collect"];
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  {
    std::lock_guard lock(reported.mu);
    ranges = reported.ranges;
  }
  REQUIRE_FALSE(ranges.empty());
  std::uint64_t reported_lost = 0;
  for (const auto& [first, last] : ranges) reported_lost += last - first + 1;
  CHECK(coord.data_lost() == reported_lost);
  CHECK(b.get().snapshot().data_lost == reported_lost);
  std::vector<int> want;
  std::size_t next_range = 0;
  for (int i = 0; i < items; ++i) {
    const auto index = static_cast<std::uint64_t>(i) + 1;
    while (next_range < ranges.size() && ranges[next_range].second < index) ++next_range;
    const bool in_lost = next_range < ranges.size() && ranges[next_range].first <= index;
    if (!in_lost) want.push_back(i);
  }
  CHECK(got == want);
  CHECK(got.size() + reported_lost == static_cast<std::size_t>(items));
  CHECK(got.size() >= 200 + 150);  // all from before the cut and after the resumption
}

// ---- what decides an attempt, across a worker's reconnect (SPEC §12.5.3, §12.11.8) ----------

namespace {

/// A broker, a cuttable link for the worker, and a raw coordinator connected directly.
struct cut_world {
  broker::server_thread b{test_config()};
  zmq::context_t ctx;
  cuttable_link link{ctx, b.get().router_endpoint()};
  raw_peer coord{ctx, b.get().router_endpoint()};
  cut_world() { coord.introduce("coord", role::coordinator, 30'000); }
  /// One attempt only: an attempt lost to the cut would fail the task.
  void submit(const std::string& id, role kind) {
    codec::submit s;
    s.task_id = id;
    s.kind = kind;
    s.max_attempts = 1;
    coord.send(s);
  }
};

}  // namespace

TEST_CASE("a STARTED or a RESULT lost in a cut link is sent again and costs no attempt",
          "[stream]") {
  cut_world wld;
  auto& link = wld.link;  // references, not a structured binding: lambdas capture them
  auto& coord = wld.coord;
  std::atomic<int> cuts{0};
  task_handlers h;
  // Each cut swallows what comes next on the old connection: the STARTED (when the run begins
  // before it left) and then, for sure, the RESULT.
  h.run = [&](task_handle& t) {
    link.cut_existing();
    ++cuts;
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  h.close = [&](task_handle&) {
    link.cut_existing();
    ++cuts;
    return flag_map("done", true);
  };
  worker w(cut_collector(link, 4096), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  wld.submit("t", role::collector);
  std::vector<std::string> events;
  const auto until = [&](const std::string& name) {
    while (true) {
      const auto m = coord.recv(10s);
      REQUIRE(m);
      if (const auto* e = std::get_if<codec::task_event>(&*m)) {
        events.push_back(e->event);
        if (e->event == name) return *e;
      }
    }
  };
  until("started");
  coord.send(codec::finish{"t"});
  const auto finished = until("finished");
  CHECK(finished.attempt == 1);
  CHECK(cuts == 2);
  // Back after the cut that swallowed the RESULT, on the same session (the resend can beat
  // the count of its WELCOME). The first cut needs a new connection only when the STARTED
  // was still on the old one: under load it has often left by then.
  CHECK(wait_until([&] { return w.welcomes() >= 2; }, 5s));
  CHECK(events == std::vector<std::string>{"assigned", "started", "finished"});
  // The event leaves before the broker's loop stores its counters.
  CHECK(wait_until([&] { return wld.b.get().snapshot().tasks_finished == 1; }, 5s));
}

TEST_CASE("an INFO lost in a cut link is sent again: a collector's 'done' survives it",
          "[stream]") {
  cut_world wld;
  auto& link = wld.link;  // references, not a structured binding: lambdas capture them
  auto& coord = wld.coord;
  task_handlers h;
  h.run = [&](task_handle& t) {
    t.emit_data("d-0", "buffer-0", flag_map("eval_flag", false));
    link.cut_existing();  // the INFO goes into a connection that drops it
    t.emit_info(flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  worker w(cut_collector(link, 4096), h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  wld.submit("t", role::collector);
  std::vector<std::string> events;
  while (true) {
    const auto m = coord.recv(10s);
    REQUIRE(m);  // without the resend the INFO never comes, and nothing else does either
    if (const auto* e = std::get_if<codec::task_event>(&*m)) {
      events.push_back(e->event);
      if (e->event == "info") coord.send(codec::finish{"t"});
      if (e->event == "finished") break;
    }
  }
  CHECK(events == std::vector<std::string>{"assigned", "started", "data", "info", "finished"});
  CHECK(wait_until([&] { return w.welcomes() >= 2; }, 5s));
}

TEST_CASE("a LEARN_INFO lost in a cut link is sent again, once", "[stream]") {
  cut_world wld;
  auto& link = wld.link;  // references, not a structured binding: lambdas capture them
  auto& coord = wld.coord;
  task_handlers h;
  h.run = [&](task_handle& t) {
    t.emit_learn_info("buffer-0", flag_map("first", true));
    link.cut_existing();  // the next one goes into a connection that drops it
    t.emit_learn_info("buffer-0", flag_map("second", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  auto o = cut_collector(link, 4096);
  o.role = role::learner;
  o.id = "learner-0";
  worker w(o, h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  wld.submit("L", role::learner);
  std::vector<std::string> infos;
  while (infos.size() < 2) {
    const auto m = coord.recv(10s);
    REQUIRE(m);  // without the resend the second never comes
    if (const auto* e = std::get_if<codec::task_event>(&*m); e && e->event == "learn_info")
      infos.push_back(e->body);
  }
  CHECK(infos[0].find("first") != std::string::npos);
  CHECK(infos[1].find("second") != std::string::npos);
  // And no third: the broker dropped the duplicate, if one came. A HEARTBEAT's answer comes
  // after anything the broker had made before it read the HEARTBEAT.
  coord.send(codec::heartbeat{});
  const auto next = coord.recv(5s);
  REQUIRE(next);
  CHECK(std::holds_alternative<codec::heartbeat>(*next));
  CHECK(wait_until([&] { return w.welcomes() >= 2; }, 5s));
}

// ---- batched data (SPEC §12.12) -----------------------------------------------------------

// §12.12.5: DATA that wait together in the worker's outbox leave as DATA_BATCH; §12.12.6: the
// coordinator hands each item on as the `data` it stands for. A collector that emits as fast
// as it can (its handler outruns its I/O thread) batches by itself; one told not to sends every
// DATA alone; the coordinator's callback sees the same items, each once and in order, with
// the same bytes, either way.
TEST_CASE("a collector that outruns its socket batches its DATA; the callbacks see each item",
          "[stream]") {
  const bool batching = GENERATE(true, false);
  INFO("batch_data " << batching);
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  data_log log;
  std::atomic<std::uint64_t> lost{0};
  auto cb = logging(log, lost);
  std::mutex mu;
  std::vector<std::string> bodies;        // what the callback got as the data, every 1000th
  std::atomic<bool> other_buffer{false};  // checked here: Catch2 asserts on this thread only
  auto record = cb.deal_with_collector_send_data;
  cb.deal_with_collector_send_data = [&, record](const std::string& task_id, const std::string& buf,
                                                 const std::string& data_id,
                                                 const std::string& data) {
    if (buf != "buffer-0") other_buffer = true;
    if (std::stoi(data_id.substr(2)) % 1000 == 0) {
      std::lock_guard lock(mu);
      bodies.push_back(data);
    }
    record(task_id, buf, data_id, data);
  };
  coordinator_options co;
  co.endpoint = ep;
  coordinator coord(co, cb);
  REQUIRE(coord.wait_for(connection_state::ready, 5s));

  constexpr int items = 20'000;
  std::atomic<bool> emit_failed{false};
  task_handlers h;
  h.run = [&](task_handle& t) {
    for (int i = 0; i < items; ++i)
      if (!t.emit_data("d-" + std::to_string(i), "buffer-0", flag_map("eval_flag", i % 2 == 0),
                       std::string(16, static_cast<char>('a' + i % 26))))
        emit_failed = true;
    t.emit_info(flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  auto o = collector_at(ep, "collector-0");
  o.batch_data = batching;
  worker w(o, h);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  REQUIRE(coord.submit(collector_task("fast"))->accepted);
  REQUIRE(wait_until([&] { return log.done(1); }, 60s));

  CHECK_FALSE(emit_failed);
  CHECK_FALSE(other_buffer);
  log.check_exactly_once("fast", items);
  CHECK(lost == 0);
  CHECK(coord.stream_gaps() == 0);
  {
    // Each item's data is the body a `data` event would carry: its fields, payload included.
    std::lock_guard lock(mu);
    REQUIRE(bodies.size() == items / 1000);
    for (std::size_t k = 0; k < bodies.size(); ++k) {
      codec::data_item want{
          "d-" + std::to_string(k * 1000), "buffer-0", flag_map("eval_flag", true),
          std::string(16, static_cast<char>('a' + (k * 1000) % 26)), std::nullopt};
      codec::items_writer one;
      one.add(want);
      CHECK(bodies[k] == one.done().bytes.substr(1));  // the item, without its array's header
    }
  }
  INFO(w.data_batches() << " batches carried " << w.data_batched() << " DATA");
  if (batching) {
    CHECK(w.data_batches() > 0);
    CHECK(w.data_batched() > w.data_batches());
  } else {
    CHECK(w.data_batches() == 0);
  }
  CHECK(counters_settle(b, 1));
  CHECK(b.get().snapshot().faults == 0);
}
