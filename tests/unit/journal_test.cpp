// The broker's journal (SPEC §14): records read back as written, a torn last record skipped
// and reported, damage in the middle refused with its offset, compaction, garbage never
// crashing the reader; and a task manager started from a journal written by another, as
// after a crash: tasks, attempts and fencing, policies, the stream and its adoption.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "broker/journal.hpp"
#include "broker/task_manager.hpp"
#include "codec/map_writer.hpp"
#include "support/fake_sink.hpp"

using namespace rlbus;
using namespace std::chrono_literals;
using broker::journal;
using broker::journal_error;
using broker::journal_task;

namespace {

/// A journal path of its own, removed with the test.
struct scratch {
  std::string path =
      "/tmp/rlbus-journal-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++);
  ~scratch() {
    ::unlink(path.c_str());
    ::unlink((path + ".tmp").c_str());
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  [[nodiscard]] std::string read() const {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
  void write(const std::string& data) const {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << data;
  }
};

journal open(const scratch& s, broker::fsync_policy fsync = broker::fsync_policy::none) {
  return journal(s.path, fsync, codec::decode_limits{});
}

journal_task task(const std::string& id, const std::string& owner, std::uint64_t order) {
  journal_task t;
  t.owner = owner;
  t.order = order;
  t.submit.task_id = id;
  t.submit.kind = role::collector;
  t.submit.task_info = codec::map_writer(1).str("env", "cartpole").done();
  t.start_timeout_ms = 100;
  t.step_timeout_ms = 1000;
  t.close_timeout_ms = 200;
  t.task_timeout_ms = 60'000;
  t.max_attempts = 2;
  return t;
}

codec::task_event end_of(const std::string& id, std::uint64_t seq) {
  return codec::task_event{seq, id, 1, "finished", "w", codec::map_writer(1).uint("n", 7).done()};
}

}  // namespace

TEST_CASE("journal: what was written is what a restart reads", "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    CHECK(j.loaded().records == 0);
    j.submitted(task("t1", "coord", 1));
    j.submitted(task("t2", "coord", 2));
    j.submitted(task("t3", "coord", 3));
    j.started("t1", 1, "w1");
    j.started("t2", 1, "w2");
    j.requeued("t2", 1);
    j.ended("t3");
    j.policy("learner", codec::policy{"pi", 2, std::nullopt, std::string("\x01\x02")});
    j.policy("learner", codec::policy{"pi", 3, std::string("s3://pi/3"), std::nullopt});
    j.reserved("coord", 64);
    j.end_event("coord", end_of("t3", 5));
    j.end_event("coord", end_of("t4", 9));
    j.acked("coord", 6);  // t3's end is acknowledged, t4's is not
    j.reserved("other", 64);
    j.stream_dropped("other");
    j.flush();
  }
  auto j = open(s);
  const auto& st = j.loaded();
  CHECK(st.torn.empty());
  CHECK(st.records == 15);
  REQUIRE(st.tasks.size() == 2);
  CHECK(st.tasks[0].submit.task_id == "t1");
  CHECK(st.tasks[0].attempt == 1);
  CHECK(st.tasks[0].running);
  CHECK(st.tasks[0].worker == "w1");
  CHECK(st.tasks[0].submit.task_info == task("t1", "coord", 1).submit.task_info);
  CHECK(st.tasks[0].step_timeout_ms == 1000);
  CHECK(st.tasks[1].submit.task_id == "t2");
  CHECK_FALSE(st.tasks[1].running);
  REQUIRE(st.policies.size() == 1);
  CHECK(st.policies[0].latest.version == 3);
  CHECK(st.policies[0].latest.ref == "s3://pi/3");
  CHECK(st.policies[0].publisher == "learner");
  REQUIRE(st.streams.count("coord") == 1);
  CHECK(st.streams.count("other") == 0);
  const auto& c = st.streams.at("coord");
  CHECK(c.head == 64);
  CHECK(c.acked == 6);
  CHECK(c.windowed);
  REQUIRE(c.ends.size() == 1);
  CHECK(c.ends[0] == end_of("t4", 9));
}

TEST_CASE("journal: a torn last record is skipped and reported", "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    j.submitted(task("t1", "coord", 1));
    j.submitted(task("t2", "coord", 2));
  }
  const auto whole = s.read();
  auto bad_sum = whole;
  bad_sum.back() = static_cast<char>(bad_sum.back() ^ 0x5A);
  struct tail {
    const char* what;
    std::string data;
    std::size_t tasks;  // kept: the records before the torn one
  };
  const tail tails[] = {{"cut short", whole.substr(0, whole.size() - 3), 1},
                        {"half a header", whole + std::string("\x10\x00\x00", 3), 2},
                        {"a checksum that fails", bad_sum, 1}};
  for (const auto& t : tails) {
    INFO(t.what);
    s.write(t.data);
    auto j = open(s);
    CHECK_FALSE(j.loaded().torn.empty());
    REQUIRE(j.loaded().tasks.size() == t.tasks);
    CHECK(j.loaded().tasks[0].submit.task_id == "t1");
  }
}

TEST_CASE("journal: damage with records after it stops the start, naming where",
          "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    j.submitted(task("t1", "coord", 1));
    j.submitted(task("t2", "coord", 2));
  }
  auto bad = s.read();
  bad[8 + 8 + 3] = static_cast<char>(bad[8 + 8 + 3] ^ 0x01);  // in the first record's body
  s.write(bad);
  CHECK_THROWS_WITH(open(s), Catch::Contains("byte 8") && Catch::Contains("damaged"));
  s.write("not a journal at all");
  CHECK_THROWS_WITH(open(s), Catch::Contains("not an rlbus journal"));
}

TEST_CASE("journal: compaction keeps the live state and drops the history", "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    for (std::uint64_t i = 1; i <= 2000; ++i) {
      j.submitted(task("t" + std::to_string(i), "coord", i));
      j.ended("t" + std::to_string(i));
    }
    j.submitted(task("keep", "coord", 2001));
    const auto before = s.read().size();
    j.compact([](journal& out) { out.submitted(task("keep", "coord", 2001)); });
    CHECK(s.read().size() * 50 < before);
    CHECK(j.stats().compactions == 1);
    j.started("keep", 1, "w");  // appends go on, into the new file
  }
  auto j = open(s);
  REQUIRE(j.loaded().tasks.size() == 1);
  CHECK(j.loaded().tasks[0].submit.task_id == "keep");
  CHECK(j.loaded().tasks[0].running);
}

TEST_CASE("journal: garbage after the signature never crashes the reader", "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    j.submitted(task("t1", "coord", 1));
    j.end_event("coord", end_of("t1", 3));
  }
  const auto good = s.read();
  std::mt19937 rng(20261201);
  int refused = 0, read = 0;
  for (int round = 0; round < 300; ++round) {
    auto data = good;
    const auto flips = 1 + rng() % 4;
    for (unsigned k = 0; k < flips; ++k) {
      const auto at = 8 + rng() % (data.size() - 8);
      data[at] = static_cast<char>(rng());
    }
    if (rng() % 3 == 0) data.resize(8 + rng() % (data.size() - 8));
    s.write(data);
    try {
      auto j = open(s);
      ++read;  // whatever it kept passed its checksum and the decoder
    } catch (const journal_error&) {
      ++refused;
    }
  }
  CHECK(read + refused == 300);
  CHECK(refused > 0);
}

// ---- a task manager started from the journal of another (SPEC §14.4, §14.5) ----

namespace {

struct world {
  broker::config cfg;
  test::fake_sink sink;
  util::time_point now = util::clock::now();
  std::unique_ptr<broker::task_manager> tm;
  std::uint64_t serial = 0;

  world() {
    cfg.start_timeout_ms = 1000;
    cfg.max_attempts = 1;
    tm = std::make_unique<broker::task_manager>(cfg, sink);
  }
  void ok(const std::string& from, role r, codec::message m) {
    const auto refused = tm->handle(from, r, std::move(m), now);
    INFO((refused ? refused->reason : ""));
    REQUIRE_FALSE(refused);
  }
};

}  // namespace

TEST_CASE("journal: a broker started on a crashed one's journal takes its work up",
          "[unit][journal]") {
  scratch s;
  std::uint64_t finished_seq = 0;
  {
    world before;
    auto j = open(s);
    before.tm->attach(&j);
    before.tm->peer_joined("w", role::collector, {}, ++before.serial, before.now);
    before.tm->peer_joined("l", role::learner, {}, ++before.serial, before.now);
    before.ok("coord", role::coordinator, codec::replay{1});  // windowed
    for (const auto* id : {"run", "done", "wait"}) {
      codec::submit sub;
      sub.task_id = id;
      sub.kind = std::string(id) == "done" ? role::learner : role::collector;
      before.ok("coord", role::coordinator, std::move(sub));
    }
    before.ok("w", role::collector, codec::started{"run", 1});
    before.ok("l", role::learner, codec::started{"done", 1});
    before.ok("coord", role::coordinator, codec::finish{"done"});
    before.ok("l", role::learner, codec::task_result{"done", 1, codec::empty_map_blob});
    before.ok("coord", role::coordinator, codec::ack{2});
    before.ok("learner", role::learner, codec::policy{"pi", 4, std::string("ref-4"), std::nullopt});
    for (auto& m : before.sink.inbox["coord"])
      if (auto* e = std::get_if<codec::task_event>(&m); e && e->event == "finished")
        finished_seq = e->seq;
    REQUIRE(finished_seq > 2);
    before.tm->attach(nullptr);  // the crash: nothing more reaches the file
  }
  world after;
  auto j = open(s);
  after.sink.unreachable.insert("coord");  // nobody is connected to a broker just started
  after.tm->restore(j.loaded(), after.now);
  CHECK(after.tm->counts().queued == 2);  // "run" (its attempt ended) and "wait"
  CHECK(after.tm->counts().orphaned == 1);

  // The coordinator's new session adopts; its replay reports the events nobody kept, gives the
  // kept end at its seq, then says which attempt the restart ended.
  const auto acked = after.tm->adopt("coord");
  REQUIRE(acked);
  CHECK(*acked == 2);
  after.sink.unreachable.clear();
  after.ok("coord", role::coordinator, codec::replay{3});
  bool saw_finished = false, saw_requeued = false;
  std::uint64_t lost = 0, next = 3;
  auto& to_coord = after.sink.inbox["coord"];
  while (!to_coord.empty()) {
    auto m = std::move(to_coord.front());
    to_coord.pop_front();
    if (auto* g = std::get_if<codec::stream_gap>(&m)) {
      CHECK(g->first == next);
      lost += g->last - g->first + 1;
      next = g->last + 1;
    } else if (auto* e = std::get_if<codec::task_event>(&m)) {
      CHECK(e->seq == next);
      ++next;
      if (e->event == "finished") {
        CHECK(e->task_id == "done");
        CHECK(e->seq == finished_seq);
        saw_finished = true;
      }
      if (e->event == "requeued") {
        CHECK(e->task_id == "run");
        CHECK(e->attempt == 1);
        CHECK(e->worker_id == "w");
        CHECK_THAT(e->body, Catch::Contains("broker restarted"));
        saw_requeued = true;
      }
    }
  }
  CHECK(saw_finished);
  CHECK(saw_requeued);
  CHECK(lost > 0);  // "run"'s started, and the seqs allotted but never used

  // The old attempt is fenced; the next one has the next number, and the policy is held.
  after.tm->peer_joined("w", role::collector, {}, ++after.serial, after.now);
  const auto start = after.sink.take_first<codec::task_start>("w");
  CHECK(start.task_id == "run");
  CHECK(start.attempt == 2);  // max attempts was 1: the restart did not use it up
  CHECK(after.tm->handle("w", role::collector, codec::started{"run", 1}, after.now).has_value());
  after.ok("w", role::collector, codec::started{"run", 2});
  codec::submit with_policy;
  with_policy.task_id = "pol";
  with_policy.kind = role::learner;
  with_policy.policy_id = "pi";
  after.ok("coord", role::coordinator, std::move(with_policy));
  after.tm->peer_joined("l", role::learner, {}, ++after.serial, after.now);
  const auto lstart = after.sink.take<codec::task_start>("l");
  CHECK(lstart.task_id == "pol");
  CHECK(lstart.policy_version == 4);
}
