// The broker's journal (SPEC §14): records read back as written, a torn last record skipped
// and reported, damage in the middle refused with its offset, compaction, garbage never
// crashing the reader; and a task manager started from a journal written by another, as
// after a crash: tasks, attempts and fencing, policies, the stream and its adoption.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include <fmt/format.h>

#include "broker/durability/journal.hpp"
#include "broker/tasks/task_manager.hpp"
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
    for (const auto* suffix : {"", ".tmp", ".lock", ".torn"}) ::unlink((path + suffix).c_str());
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  [[nodiscard]] std::string read(const char* suffix = "") const {
    std::ifstream f(path + suffix, std::ios::binary);
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

journal_task journal_task_of(const std::string& id, const std::string& owner, std::uint64_t order) {
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
    j.submitted(journal_task_of("t1", "coord", 1));
    j.submitted(journal_task_of("t2", "coord", 2));
    j.submitted(journal_task_of("t3", "coord", 3));
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
  CHECK(st.tasks[0].submit.task_info == journal_task_of("t1", "coord", 1).submit.task_info);
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

TEST_CASE("journal: a torn last record is skipped, reported and kept aside", "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    j.submitted(journal_task_of("t1", "coord", 1));
    j.submitted(journal_task_of("t2", "coord", 2));
  }
  const auto whole = s.read();
  struct tail {
    const char* what;
    std::string data;
    std::size_t tasks;  // kept: the records before the torn one
  };
  const tail tails[] = {{"cut short", whole.substr(0, whole.size() - 3), 1},
                        {"half a header", whole + std::string("\x10\x00\x00", 3), 2},
                        {"zeros a file system gave", whole + std::string(4096, '\0'), 2}};
  for (const auto& t : tails) {
    INFO(t.what);
    s.write(t.data);
    auto j = open(s);
    CHECK_FALSE(j.loaded().torn.empty());
    REQUIRE(j.loaded().tasks.size() == t.tasks);
    CHECK(j.loaded().tasks[0].submit.task_id == "t1");
    CHECK(j.loaded().torn_kept == s.path + ".torn");
    CHECK(s.read(".torn") == t.data);  // what it could not read is not thrown away
  }
}

TEST_CASE("journal: a last record that fails its checksum is damage, not a torn tail",
          "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    j.submitted(journal_task_of("t1", "coord", 1));
    j.submitted(journal_task_of("t2", "coord", 2));
  }
  auto bad_sum = s.read();
  bad_sum.back() = static_cast<char>(bad_sum.back() ^ 0x5A);  // whole length, wrong bytes
  s.write(bad_sum);
  CHECK_THROWS_WITH(open(s),
                    Catch::Contains("fails its checksum") && Catch::Contains("truncate -s"));
}

TEST_CASE("journal: a length damaged to run past the end is damage when whole records follow",
          "[unit][journal]") {
  scratch s;
  std::size_t second = 0;  // where the second record starts
  {
    auto j = open(s);
    j.submitted(journal_task_of("t0", "coord", 0));
    j.flush();
    second = s.read().size();
    for (std::uint64_t i = 1; i < 20; ++i)
      j.submitted(journal_task_of("t" + std::to_string(i), "coord", i));
  }
  auto bad = s.read();
  bad[second + 3] = 0x01;  // the length's high byte: 16 MiB more, past the end of the file
  s.write(bad);
  CHECK_THROWS_WITH(open(s), Catch::Contains(fmt::format("byte {}", second)) &&
                                 Catch::Contains("past the end") && Catch::Contains("damaged"));
  CHECK(s.read() == bad);  // nothing was rewritten
}

// The property of SPEC §14.6: whatever one changed byte or one cut does to a journal, the load
// either refuses, naming the record that holds the damage, or gives exactly the state of every
// whole record before it: never fewer tasks, never a record it could not read thrown away.
TEST_CASE("journal: every one-byte change and every cut is refused or loses nothing intact",
          "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    for (std::uint64_t i = 1; i <= 20; ++i)
      j.submitted(journal_task_of("t" + std::to_string(i), "coord", i));
    for (const auto* id : {"t2", "t5", "t9"}) j.started(id, 1, "w");
    j.requeued("t5", 1);
    j.end_event("coord", end_of("t9", 4));  // ends t9 by itself
    j.ended("t7");
    j.reserved("coord", 64);
  }
  const auto good = s.read();
  // Where each record starts, and the state a load of the whole records before it gives.
  std::vector<std::size_t> starts;
  for (std::size_t p = 8; p < good.size();) {
    starts.push_back(p);
    std::uint32_t len = 0;
    for (int i = 3; i >= 0; --i) len = (len << 8U) | static_cast<std::uint8_t>(good[p + i]);
    p += 8 + len;
  }
  starts.push_back(good.size());
  using summary = std::vector<std::pair<std::string, bool>>;  // task, running
  const auto summarize = [](const broker::journal_state& st) {
    summary out;
    for (const auto& t : st.tasks) out.emplace_back(t.submit.task_id, t.running);
    return out;
  };
  std::vector<summary> before;  // before[k]: the records before record k, whole
  for (const auto start : starts) {
    s.write(good.substr(0, start));
    before.push_back(summarize(open(s).loaded()));
  }
  REQUIRE(before.back().size() == 18);  // t7 and t9 have ended
  const auto record_of = [&](std::size_t at) {
    return static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), at) -
                                    starts.begin()) -
           1;
  };
  std::size_t cases = 0, refused = 0, torn = 0;
  // A cut is what a crash leaves: it is never refused.
  const auto judge = [&](const std::string& data, std::size_t damaged_record, bool cut) {
    ++cases;
    s.write(data);
    try {
      auto j = open(s);
      const auto& st = j.loaded();
      // Records up to the damaged one are whole; that one at most is skipped, as torn.
      const auto got = summarize(st);
      if (st.torn.empty()) {
        REQUIRE(got == before[record_of(data.size())]);
      } else {
        ++torn;
        // Skipped as torn: only the last record, so no whole record after it was dropped.
        REQUIRE((cut || damaged_record + 2 == starts.size()));
        REQUIRE(got == before[damaged_record]);
        REQUIRE(s.read(".torn") == data);
      }
    } catch (const journal_error& e) {
      ++refused;
      INFO(e.what());
      REQUIRE_FALSE(cut);
      REQUIRE_THAT(e.what(), Catch::Contains(fmt::format("byte {} ", starts[damaged_record])));
    }
  };
  for (std::size_t at = 8; at < good.size(); ++at) {
    for (const auto change : {0x01, 0x80, 0xFF}) {
      auto data = good;
      data[at] = static_cast<char>(data[at] ^ change);
      INFO("byte " << at << " ^ " << change);
      judge(data, record_of(at), false);
    }
    INFO("cut at " << at);
    judge(good.substr(0, at), record_of(at), true);
  }
  WARN(cases << " cases: " << refused << " refused, " << torn << " torn");
  CHECK(cases == 4 * (good.size() - 8));
  CHECK(refused > 0);
  CHECK(torn >= good.size() - 8 - (starts.size() - 1));  // every cut inside a record at least
}

TEST_CASE("journal: a journaled end ends its task though the record that erases it is missing",
          "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    j.submitted(journal_task_of("t1", "coord", 1));
    j.started("t1", 1, "w");
    j.end_event("coord", end_of("t1", 3));           // the broker was killed before ended("t1")
    j.submitted(journal_task_of("t1", "coord", 2));  // the same id, submitted again after its end
    j.submitted(journal_task_of("t2", "coord", 3));
    j.started("t2", 1, "w");
    j.end_event("other", end_of("t2", 5));  // another coordinator's task of that name: not it
  }
  auto j = open(s);
  const auto& st = j.loaded();
  REQUIRE(st.tasks.size() == 2);
  CHECK(st.tasks[0].submit.task_id == "t1");
  CHECK_FALSE(st.tasks[0].running);  // the second t1, not yet begun
  CHECK(st.tasks[1].submit.task_id == "t2");
  REQUIRE(st.streams.at("coord").ends.size() == 1);  // still delivered to its coordinator
}

TEST_CASE("journal: one broker per journal, across compactions", "[unit][journal]") {
  scratch s;
  auto first = open(s);
  first.submitted(journal_task_of("t1", "coord", 1));
  CHECK_THROWS_AS(open(s), broker::journal_in_use);
  CHECK_THROWS_WITH(open(s), Catch::Contains("another broker") &&
                                 Catch::Contains(fmt::format("process {}", ::getpid())));
  first.compact([](journal& out) { out.submitted(journal_task_of("t1", "coord", 1)); });
  CHECK_THROWS_AS(open(s), broker::journal_in_use);  // the lock is not the journal's inode
}

TEST_CASE("journal: the same file under another name is refused too", "[unit][journal]") {
  scratch s;
  const auto link = s.path + ".symlink";
  const auto hard = s.path + ".hardlink";
  const auto done = [&] {
    for (const auto& p : {link, hard, hard + ".lock"}) ::unlink(p.c_str());
  };
  auto first = open(s);
  first.submitted(journal_task_of("t1", "coord", 1));
  first.flush();
  REQUIRE(::symlink(s.path.c_str(), link.c_str()) == 0);
  REQUIRE(::link(s.path.c_str(), hard.c_str()) == 0);
  const auto by = [](const std::string& p) {
    return journal(p, broker::fsync_policy::none, codec::decode_limits{});
  };
  CHECK_THROWS_AS(by(link), broker::journal_in_use);
  CHECK_THROWS_WITH(by(hard), Catch::Contains("under another name"));
  // After a compaction the live journal is a new file: a hard link made to it now is refused
  first.compact([](journal& out) { out.submitted(journal_task_of("t1", "coord", 1)); });
  ::unlink(hard.c_str());
  REQUIRE(::link(s.path.c_str(), hard.c_str()) == 0);
  CHECK_THROWS_AS(by(hard), broker::journal_in_use);
  CHECK_THROWS_AS(by(link), broker::journal_in_use);
  done();
}

TEST_CASE("journal: a file that holds part of the signature only is taken as empty",
          "[unit][journal]") {
  scratch s;
  s.write("RLBU");
  {
    auto j = open(s);
    CHECK(j.loaded().short_signature);
    CHECK(j.loaded().tasks.empty());
    j.submitted(journal_task_of("t1", "coord", 1));
  }
  {
    auto j = open(s);  // and it is a journal from then on
    REQUIRE(j.loaded().tasks.size() == 1);
    CHECK(j.loaded().torn.empty());
  }
  s.write("RLBX");  // not the start of ours: somebody else's file
  CHECK_THROWS_WITH(open(s), Catch::Contains("not an rlbus journal"));
}

TEST_CASE("journal: compaction keeps the live state and drops the history", "[unit][journal]") {
  scratch s;
  {
    auto j = open(s);
    for (std::uint64_t i = 1; i <= 2000; ++i) {
      j.submitted(journal_task_of("t" + std::to_string(i), "coord", i));
      j.ended("t" + std::to_string(i));
    }
    j.submitted(journal_task_of("keep", "coord", 2001));
    const auto before = s.read().size();
    j.compact([](journal& out) { out.submitted(journal_task_of("keep", "coord", 2001)); });
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
    j.submitted(journal_task_of("t1", "coord", 1));
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
