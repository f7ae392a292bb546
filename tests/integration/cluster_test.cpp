// The cluster's building blocks against a real etcd: the client of its API, and the elector
// that makes one broker of a group the leader and fences it by its lease.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include <unistd.h>

#include "cluster/elector.hpp"
#include "cluster/etcd.hpp"
#include "cluster/local_etcd.hpp"
#include "codec/model.hpp"
#include "rlbus/coordinator.hpp"
#include "rlbus/worker.hpp"
#include "support/child.hpp"
#include "support/support.hpp"
#include "util/free_port.hpp"

using namespace std::chrono_literals;
using rlbus::cluster::elector;
using rlbus::cluster::elector_config;
using rlbus::cluster::etcd_client;
using rlbus::test::child;
using etcd_server = rlbus::cluster::local_etcd;
using rlbus::test::raw_peer;

namespace {

#define NEED_ETCD()                                                          \
  if (!etcd_server::available()) {                                           \
    SUCCEED("etcd is not installed (apt-get install etcd-server): skipped"); \
    return;                                                                  \
  }

elector_config member(const etcd_server& e, const std::string& name) {
  elector_config c{{e.url()}, "g", name, fmt::format("tcp://{}:7235", name)};
  c.lease_ttl = 2s;
  return c;
}

}  // namespace

TEST_CASE("etcd client: leases, create-if-absent, compare-and-set, prefixes", "[cluster]") {
  NEED_ETCD();
  etcd_server e;
  etcd_client c({"http://127.0.0.1:1", e.url()}, 2000ms);  // the first one answers nothing
  CHECK_FALSE(c.get("/k").has_value());
  const auto lease = c.grant(30);
  CHECK(lease.ttl_s >= 30);
  std::optional<rlbus::cluster::etcd_kv> now;
  REQUIRE(c.create("/k", std::string("v\0\xff", 3), lease.id, &now));
  CHECK(c.endpoint() == e.url());
  REQUIRE(now);
  CHECK(now->value == std::string("v\0\xff", 3));
  CHECK(now->lease == lease.id);
  const auto first = now->create_revision;
  CHECK_FALSE(c.create("/k", "other", 0, &now));  // exists: left as it is, and shown
  REQUIRE(now);
  CHECK(now->value == std::string("v\0\xff", 3));
  CHECK_FALSE(c.replace("/k", "x", 0, now->mod_revision - 1));
  CHECK(c.replace("/k", "x", lease.id, now->mod_revision));
  CHECK(c.get("/k")->value == "x");
  CHECK(c.create("/k/a", "1", 0));
  CHECK(c.create("/k/b", "2", 0));
  CHECK(c.create("/l", "3", 0));
  const auto under = c.get_prefix("/k/");
  REQUIRE(under.size() == 2);
  CHECK(under[0].key == "/k/a");
  CHECK(under[1].value == "2");
  CHECK(c.keep_alive(lease.id) > 0);
  c.revoke(lease.id);  // its keys go with it
  CHECK_FALSE(c.get("/k").has_value());
  CHECK(c.keep_alive(lease.id) == 0);
  c.revoke(lease.id);  // again: not an error
  CHECK_FALSE(c.erase("/k/a", first));
  CHECK(c.erase("/k/a", c.get("/k/a")->create_revision));
  CHECK_THROWS_AS(etcd_client({"tcp://127.0.0.1:2379"}, 1000ms), std::invalid_argument);
  etcd_client nowhere({"http://127.0.0.1:1"}, 500ms);
  CHECK_THROWS_AS(nowhere.get("/k"), rlbus::cluster::etcd_unavailable);
}

TEST_CASE("elector: one leader at a time, and a later leader has a larger epoch", "[cluster]") {
  NEED_ETCD();
  etcd_server e;
  auto a = std::make_unique<elector>(member(e, "a"));
  REQUIRE(rlbus::test::wait_until([&] { return a->leads(); }, 20s));
  const auto first = a->epoch();
  CHECK(first > 0);
  elector b(member(e, "b"));
  REQUIRE(rlbus::test::wait_until([&] { return b.leader().member == "a"; }, 20s));
  CHECK(b.leader().advertise == "tcp://a:7235");
  CHECK(b.leader().epoch == first);
  CHECK_FALSE(b.leads());
  CHECK(a->leads());

  a.reset();  // a stops: it gives its lease back, and b need not wait for it to run out
  REQUIRE(rlbus::test::wait_until([&] { return b.leads(); }, 20s));
  CHECK(b.epoch() > first);
  CHECK(b.leader().member == "b");

  // Settings that cannot work are refused.
  auto bad = member(e, "c");
  bad.margin = 2000ms;
  CHECK_THROWS_AS(elector(bad), std::invalid_argument);
  bad = member(e, "c");
  bad.etcd = {"localhost:2379"};
  CHECK_THROWS_AS(elector(bad), std::invalid_argument);
}

TEST_CASE("elector: a leader that cannot renew stops serving before its lease can end",
          "[cluster]") {
  NEED_ETCD();
  etcd_server e;
  elector a(member(e, "a"));
  REQUIRE(rlbus::test::wait_until([&] { return a.leads(); }, 20s));
  const auto first = a.epoch();
  // etcd dies: a's serving time is no longer moved on; it ends by itself, no later than the
  // lease (which etcd counts from the last renewal it got, after a asked for it).
  e.kill();
  const auto killed = std::chrono::steady_clock::now();
  CHECK(a.serving_until() <= killed + 2s);
  REQUIRE(rlbus::test::wait_until([&] { return !a.leads(); }, 10s));
  CHECK_FALSE(a.etcd_reachable());
  // etcd back: the old lease may still be there (etcd gives leases their full time again
  // after a restart); either it runs out or a finds its key gone, and a leads again, under a
  // new epoch.
  e.start();
  REQUIRE(rlbus::test::wait_until([&] { return a.leads(); }, 30s));
  CHECK(a.epoch() > first);
}

namespace {

// A broker of group "g" on loopback ports the test picks (a standby binds only the first),
// with the default lease of 2 s.
// With `journal`, each keeps a journal in a directory of its own, removed at the end.
struct group_broker {
  std::string router, events;
  std::filesystem::path dir;
  std::vector<std::string> args;
  std::unique_ptr<child> proc;
  group_broker(const etcd_server& e, int port, bool journal = false) {
    router = fmt::format("tcp://127.0.0.1:{}", port);
    events = fmt::format("tcp://127.0.0.1:{}", port + 1);
    args = {"--cluster-etcd", e.url(),    "--cluster-name", "g",        "--advertise",
            router,           "--router", router,           "--events", events};
    if (journal) {
      dir = std::filesystem::temp_directory_path() /
            fmt::format("rlbus-cluster-{}-{}", ::getpid(), port);
      std::filesystem::create_directories(dir);
      args.insert(args.end(), {"--journal", (dir / "journal").string()});
    }
    start();
  }
  /// Starts it (again, after it was killed: same endpoints, same journal).
  void start() {
    proc = std::make_unique<child>(rlbus::test::binary_from_env("RLBUS_BROKER_BIN"), args);
  }
  ~group_broker() {
    proc.reset();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
  group_broker(const group_broker&) = delete;
  group_broker& operator=(const group_broker&) = delete;
};

// Two ports in a row that nothing listens on now (below the ephemeral range: util/free_port.hpp).
int free_ports() {
  return rlbus::util::free_tcp_port(2);
}

// An etcd, a broker `a` that leads group "g" and a broker `b` that stands by for it.
struct led_group {
  etcd_server e;
  bool journals;
  group_broker a;
  std::unique_ptr<group_broker> b;
  // With journals, a's (and b's, with `b_journal`).
  explicit led_group(bool with_journals = false, bool b_journal = true)
      : journals(with_journals), a(e, free_ports(), with_journals) {
    INFO(a.proc->output());
    REQUIRE(a.proc->wait_for_line("rlbus-broker listening", 30s));
    b = std::make_unique<group_broker>(e, free_ports(), journals && b_journal);
    const bool follows = b->proc->wait_for_line("leads group g", 30s).has_value();
    INFO(b->proc->output());
    REQUIRE(follows);  // b knows who leads: a
    CHECK(b->proc->output().find(a.router) != std::string::npos);
  }
};

// What `rlbus-ctl --json cluster` says of group "g" (null when it fails or prints no JSON).
nlohmann::json ctl_cluster(const etcd_server& e) {
  const auto [status, out] =
      rlbus::test::run_to_end(rlbus::test::binary_from_env("RLBUS_CTL_BIN"),
                              {"--json", "cluster", "--etcd", e.url(), "--name", "g"}, 30s);
  INFO(out);
  CHECK(status == 0);
  return nlohmann::json::parse(out, nullptr, false);
}

// Sends `m` every second until a T answers, for up to 30 s: a message sent while a broker
// closes its socket is lost with it, and ZeroMQ connects again by itself.
template <class T>
std::optional<T> ask_until(raw_peer& p, const rlbus::codec::message& m) {
  std::optional<T> answer;
  (void)rlbus::test::wait_until(
      [&] {
        p.send(m);
        answer = p.recv_a<T>(1s);
        return answer.has_value();
      },
      30s);
  return answer;
}

// A collector "collector-0" on `endpoint` whose every task says it is done (after `step`) and
// runs until the coordinator closes it.
std::unique_ptr<rlbus::worker> collector(const std::string& endpoint,
                                         std::chrono::milliseconds step = 0ms) {
  rlbus::worker_options wo;
  wo.endpoint = endpoint;
  wo.id = "collector-0";
  wo.heartbeat = 100ms;
  rlbus::task_handlers h;
  h.run = [step](rlbus::task_handle& t) {
    std::this_thread::sleep_for(step);
    t.emit_info(rlbus::test::flag_map("collector_done", true));
    while (!t.stop_requested()) std::this_thread::sleep_for(1ms);
  };
  h.close = [](rlbus::task_handle&) { return rlbus::test::flag_map("collector_done", true); };
  return std::make_unique<rlbus::worker>(wo, h);
}

// A coordinator "coordinator" on `endpoint` that counts how often each of its tasks finished.
class counting_coordinator {
 public:
  explicit counting_coordinator(const std::string& endpoint) {
    rlbus::coordinator_callbacks cb;
    cb.deal_with_collector_finish_task = [this](const std::string& task_id, const std::string&) {
      const std::lock_guard<std::mutex> hold(mu_);
      ++finished_[task_id];
    };
    rlbus::coordinator_options co;
    co.endpoint = endpoint;
    co.id = "coordinator";
    co.heartbeat = 100ms;
    coord_ = std::make_unique<rlbus::coordinator>(co, cb);
    REQUIRE(coord_->wait_for(rlbus::connection_state::ready, 30s));
  }
  /// Submits a collector task; the broker must accept it. A leader answers once a standby
  /// holds the task, and an answer lost to a reconnect (a busy machine can starve a 100 ms
  /// heartbeat) is asked for again: a duplicate id then says the first SUBMIT was accepted.
  void submit(const std::string& task_id) {
    rlbus::task_spec t;
    t.task_id = task_id;
    t.kind = rlbus::role::collector;
    std::optional<rlbus::submit_result> r;
    REQUIRE(rlbus::test::wait_until(
        [&] {
          r = coord_->submit(t);
          return r.has_value();
        },
        60s));
    INFO(r->reason);
    REQUIRE((r->accepted ||
             r->code == static_cast<std::uint16_t>(rlbus::codec::error_code::duplicate_task)));
  }
  /// Waits up to `timeout` until `n` distinct tasks have finished.
  bool wait_finished(std::size_t n, std::chrono::milliseconds timeout) {
    return rlbus::test::wait_until(
        [&] {
          const std::lock_guard<std::mutex> hold(mu_);
          return finished_.size() >= n;
        },
        timeout);
  }
  std::map<std::string, int> finished() {
    const std::lock_guard<std::mutex> hold(mu_);
    return finished_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> finished_;
  std::unique_ptr<rlbus::coordinator> coord_;
};

}  // namespace

TEST_CASE("a group of brokers: one serves, and a standby serves once the leader is killed",
          "[cluster]") {
  NEED_ETCD();
  led_group g;
  auto& a = g.a;
  auto& b = *g.b;

  zmq::context_t ctx;
  raw_peer on_a(ctx, a.router);
  const auto first = on_a.introduce("w1", rlbus::role::collector, 30'000);
  REQUIRE(first.leader_epoch);  // the leader names its leadership
  // The standby serves no session: it names the leader, whatever it is sent.
  raw_peer on_b(ctx, b.router);
  for (const rlbus::codec::message& m :
       {rlbus::codec::message{rlbus::codec::hello{rlbus::role::collector, "w2", 30'000, {}, {}}},
        rlbus::codec::message{rlbus::codec::heartbeat{}}}) {
    on_b.send(m);
    const auto refusal = on_b.recv_a<rlbus::codec::error>(10s);
    REQUIRE(refusal);
    CHECK(refusal->code == 421);
    CHECK(refusal->ref_type == static_cast<std::uint8_t>(rlbus::codec::type_of(m)));
    CHECK(refusal->leader == a.router);
    CHECK(refusal->leader_epoch == first.leader_epoch);
  }

  // rlbus-ctl shows the group as etcd holds it.
  const auto view = ctl_cluster(g.e);
  REQUIRE(view.is_object());
  CHECK(view["leader"]["advertise"] == a.router);
  CHECK(view["leader"]["epoch"] == *first.leader_epoch);
  REQUIRE(view["members"].size() == 2);
  for (const auto& m : view["members"])
    CHECK(m["role"] == (m["advertise"] == a.router ? "leader" : "standby"));
  // A third broker that advertises a's endpoint is refused at start, naming why.
  const auto [status, out] = rlbus::test::run_to_end(
      rlbus::test::binary_from_env("RLBUS_BROKER_BIN"),
      {"--cluster-etcd", g.e.url(), "--cluster-name", "g", "--advertise", a.router, "--router",
       "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0"},
      30s);
  CHECK(status == 1);
  CHECK(out.find("already a member of group g") != std::string::npos);

  a.proc->signal(SIGKILL);
  const bool took_over = b.proc->wait_for_line("rlbus-broker listening", 30s).has_value();
  INFO(b.proc->output());
  INFO(a.proc->output());
  REQUIRE(took_over);
  // b serves now, under a later leadership.
  const auto answer = ask_until<rlbus::codec::welcome>(
      on_b, rlbus::codec::hello{rlbus::role::collector, "w2", 30'000, {}, {}});
  REQUIRE(answer);
  CHECK(answer->epoch != first.epoch);
  REQUIRE(answer->leader_epoch);
  CHECK(*answer->leader_epoch > *first.leader_epoch);
}

TEST_CASE("a frozen leader sends nothing once its lease may have run out, and stands by",
          "[cluster]") {
  NEED_ETCD();
  led_group g;
  auto& a = g.a;
  auto& b = *g.b;
  zmq::context_t ctx;
  raw_peer p(ctx, a.router);
  (void)p.introduce("w", rlbus::role::collector, 30'000);

  a.proc->signal(SIGSTOP);  // a's lease runs out while it cannot renew it
  REQUIRE(b.proc->wait_for_line("rlbus-broker listening", 30s));
  p.send(rlbus::codec::heartbeat{});  // reaches a's queue; a answered it at once before
  a.proc->signal(SIGCONT);
  INFO(a.proc->output());
  REQUIRE(a.proc->wait_for_line("no longer the group's leader", 30s));
  REQUIRE(a.proc->wait_for_line("leads group g", 30s));  // standing by for b
  // Nothing a sent after its lease could have run out reached p: not the HEARTBEAT's answer,
  // not a DISCONNECT.
  CHECK_FALSE(p.recv(500ms).has_value());
  // Standing by, a names the new leader to a peer whose connection came back to it.
  const auto refusal = ask_until<rlbus::codec::error>(p, rlbus::codec::heartbeat{});
  REQUIRE(refusal);
  CHECK(refusal->code == 421);
  CHECK(refusal->leader == b.router);
  // b goes: a leads again, in the same process, and serves a peer as it did the first time.
  b.proc->signal(SIGKILL);
  REQUIRE(a.proc->wait_for_line("rlbus-broker listening", 30s));
  raw_peer again(ctx, a.router);
  const auto w = again.introduce("w2", rlbus::role::collector, 30'000);
  CHECK(w.leader_epoch);
}

TEST_CASE("a group broker refuses to start without etcd or its advertised endpoint", "[cluster]") {
  const auto bin = rlbus::test::binary_from_env("RLBUS_BROKER_BIN");
  const auto [status, out] = rlbus::test::run_to_end(
      bin,
      {"--cluster-etcd", "http://127.0.0.1:1", "--advertise", "tcp://127.0.0.1:7235", "--router",
       "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0"},
      30s);
  CHECK(status == 1);
  CHECK(out.find("cannot start: group rlbus: etcd unreachable") != std::string::npos);
  const auto [status2, out2] =
      rlbus::test::run_to_end(bin, {"--cluster-etcd", "http://127.0.0.1:1"});
  CHECK(status2 == 2);
  CHECK(out2.find("--advertise") != std::string::npos);
  const auto [status3, out3] =
      rlbus::test::run_to_end(bin, {"--cluster-etcd", "http://127.0.0.1:1", "--advertise",
                                    "tcp://h:1", "--cluster-lease", "1500"});
  CHECK(status3 == 2);
  CHECK(out3.find("whole seconds") != std::string::npos);
}

TEST_CASE("the SDK's clients go to a group's leader and follow a takeover by themselves",
          "[cluster]") {
  NEED_ETCD();
  led_group g;
  auto& a = g.a;
  auto& b = *g.b;
  // The standby first: its NOT_LEADER sends them to a.
  const auto both = b.router + "," + a.router;
  const auto worker = collector(both);
  auto& w = *worker;
  std::mutex mu;
  std::set<std::string> finished;
  rlbus::coordinator_callbacks cb;
  cb.deal_with_collector_finish_task = [&](const std::string& task_id, const std::string&) {
    const std::lock_guard<std::mutex> hold(mu);
    finished.insert(task_id);
  };
  rlbus::coordinator_options co;
  co.endpoint = both;
  co.heartbeat = 100ms;
  rlbus::coordinator coord(co, cb);
  const auto done = [&](const std::string& id) {
    return rlbus::test::wait_until(
        [&] {
          const std::lock_guard<std::mutex> hold(mu);
          return finished.count(id) == 1;
        },
        30s);
  };
  const auto run = [&](const std::string& id) {
    rlbus::task_spec t;
    t.task_id = id;
    t.kind = rlbus::role::collector;
    const auto r = coord.submit(t);
    return r && r->accepted && done(id);
  };
  // rlbus-ctl, given the list, asks whichever broker leads.
  const auto ctl_status = [&] {
    return rlbus::test::run_to_end(rlbus::test::binary_from_env("RLBUS_CTL_BIN"),
                                   {"--broker", both, "--json", "status"}, 30s);
  };
  REQUIRE(w.wait_for(rlbus::connection_state::ready, 30s));
  REQUIRE(coord.wait_for(rlbus::connection_state::ready, 30s));
  CHECK(run("before"));
  const auto [status, before] = ctl_status();
  CHECK(status == 0);
  CHECK(before.find("\"uptime_ms\"") != std::string::npos);

  a.proc->signal(SIGKILL);
  REQUIRE(b.proc->wait_for_line("rlbus-broker listening", 30s));
  // Both find b by themselves, as after a restart of their broker, and work goes on there.
  REQUIRE(rlbus::test::wait_until(
      [&] {
        return w.welcomes() >= 2 && coord.welcomes() >= 2 &&
               w.state() == rlbus::connection_state::ready &&
               coord.state() == rlbus::connection_state::ready;
      },
      30s));
  CHECK(run("after"));
  const auto [status2, after] = ctl_status();
  CHECK(status2 == 0);
  CHECK(after.find("\"uptime_ms\"") != std::string::npos);  // from b: a is gone
}

TEST_CASE(
    "a leader killed or stopped under load: every task it accepted finishes once, on the "
    "standby",
    "[cluster]") {
  NEED_ETCD();
  led_group g(true);
  auto& a = g.a;
  auto& b = *g.b;
  INFO(b.proc->output());
  INFO(a.proc->output());
  // The leader waits for b, and etcd knows b holds everything: b may lead after a.
  REQUIRE(a.proc->wait_for_line(fmt::format("in sync now: {}, {}", a.router, b.router), 30s));
  // rlbus-ctl cluster shows it: b in sync, with how far it lags as the leader sees it.
  const auto view = ctl_cluster(g.e);
  REQUIRE(view.is_object());
  for (const auto& m : view["members"]) {
    CHECK(m["in_sync"] == true);
    if (m["role"] == "standby") CHECK(m.contains("lag_bytes"));
  }
  const auto both = b.router + "," + a.router;
  counting_coordinator coord(both);
  // A collector whose steps take a while: tasks are queued, running and finished at the kill.
  const auto worker = collector(both, 30ms);
  REQUIRE(worker->wait_for(rlbus::connection_state::ready, 30s));
  constexpr std::size_t tasks = 40;
  for (std::size_t i = 0; i < tasks; ++i) coord.submit(fmt::format("t{}", i));
  REQUIRE(coord.wait_finished(5, 60s));
  SECTION("SIGKILL") {
    a.proc->signal(SIGKILL);
    CHECK(a.proc->wait(30s) == 128 + SIGKILL);
  }
  SECTION("SIGTERM: it hands its tasks over instead of cancelling them, and exits cleanly") {
    a.proc->signal(SIGTERM);
    const auto status = a.proc->wait(30s);
    REQUIRE(status);
    CHECK(*status == 0);
    CHECK(a.proc->output().find(fmt::format("handing over to {} (in sync)", b.router)) !=
          std::string::npos);
  }
  const bool took_over = b.proc->wait_for_line("rlbus-broker listening", 30s).has_value();
  INFO(b.proc->output());
  INFO(a.proc->output());
  REQUIRE(took_over);
  CHECK(b.proc->output().find("taking over with the journal") != std::string::npos);
  // The coordinator and the worker find b; the coordinator adopts its tasks there, and every
  // one of them finishes: those a finished are not run again, the others run on b.
  CHECK(coord.wait_finished(tasks, 60s));
  const auto finished = coord.finished();
  CHECK(finished.size() == tasks);
  for (const auto& [id, times] : finished) {
    INFO(id);
    CHECK(times == 1);
  }
}

TEST_CASE(
    "a standby that does not hold what the leader accepted never leads: the leader does, "
    "back with its journal",
    "[cluster]") {
  NEED_ETCD();
  led_group g(true, false);  // b has no journal: it copies nothing
  auto& a = g.a;
  auto& b = *g.b;
  const auto both = b.router + "," + a.router;
  counting_coordinator coord(both);
  coord.submit("kept");
  a.proc->signal(SIGKILL);
  // b sees the leader gone and says why it does not take over.
  INFO(b.proc->output());
  REQUIRE(b.proc->wait_for_line("may not lead: it does not hold everything", 30s));
  a.start();
  const bool back = a.proc->wait_for_line("rlbus-broker listening", 30s).has_value();
  INFO(a.proc->output());
  REQUIRE(back);
  CHECK(b.proc->output().find("rlbus-broker listening") == std::string::npos);
  // a took up its own journal: the task it accepted runs.
  const auto worker = collector(both);
  CHECK(coord.wait_finished(1, 60s));
  CHECK(coord.finished() == std::map<std::string, int>{{"kept", 1}});
}

TEST_CASE(
    "etcd killed and restarted: the leader stops serving rather than risk a second leader, and "
    "the group serves again, with the tasks it accepted, once etcd is back",
    "[cluster]") {
  NEED_ETCD();
  led_group g(true);
  auto& a = g.a;
  auto& b = *g.b;
  REQUIRE(a.proc->wait_for_line(fmt::format("in sync now: {}, {}", a.router, b.router), 30s));
  const auto both = a.router + "," + b.router;
  counting_coordinator coord(both);
  coord.submit("kept");  // no collector yet: it stays queued
  g.e.kill();
  // a cannot renew its lease: it stops serving and stands by (SPEC §14.9).
  const auto stepped_down = a.proc->wait_for_line("no longer leads", 30s);
  INFO(a.proc->output());
  INFO(b.proc->output());
  REQUIRE(stepped_down);
  CHECK(stepped_down->find("its lease could not be renewed in time") != std::string::npos);
  g.e.start();
  // A leader again, a or b, on the journal both hold: the task a accepted runs and finishes.
  const auto worker = collector(both);
  const bool done = coord.wait_finished(1, 60s);
  INFO(a.proc->output());
  INFO(b.proc->output());
  CHECK(done);
  CHECK(coord.finished() == std::map<std::string, int>{{"kept", 1}});
}
