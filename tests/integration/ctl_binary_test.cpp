// Integration: rlbus-ctl against the real broker binary, every verb, as an operator runs it:
// the human tables, --json, and the exit codes (0 done, 1 no answer, 2 usage, 3 refused).
#include <catch2/catch.hpp>

#include <csignal>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "broker/core/settings.hpp"
#include "support/child.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;
using json = nlohmann::json;

namespace {

// The broker binary on free ports, stopped with SIGTERM at the end.
struct running_broker {
  child proc;
  std::string router;
  explicit running_broker(std::vector<std::string> extra = {})
      : proc(binary_from_env("RLBUS_BROKER_BIN"), with_ports(std::move(extra))) {
    const auto line = proc.wait_for_line("rlbus-broker listening", 10s);
    INFO(proc.output());
    REQUIRE(line);
    const auto from = line->find("router=") + 7;
    router = line->substr(from, line->find(' ', from) - from);
  }
  ~running_broker() {
    proc.signal(SIGTERM);
    (void)proc.wait(10s);
  }
  static std::vector<std::string> with_ports(std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                                 "--drain-ms", "0"});
    return extra;
  }
  running_broker(const running_broker&) = delete;
  running_broker& operator=(const running_broker&) = delete;
};

std::pair<int, std::string> ctl(const running_broker& b, std::vector<std::string> args) {
  // A broker on a busy machine may take a while to answer: it is its answer that is tested.
  args.insert(args.begin(), {"--broker", b.router, "--timeout", "30000"});
  return run_to_end(binary_from_env("RLBUS_CTL_BIN"), args);
}

json ctl_json(const running_broker& b, std::vector<std::string> args) {
  args.insert(args.begin(), "--json");
  const auto [status, out] = ctl(b, args);
  INFO(out);
  REQUIRE(status == 0);
  return json::parse(out);
}

}  // namespace

TEST_CASE("rlbus-ctl shows status, workers and tasks of the running broker", "[binary][ctl]") {
  running_broker b;
  zmq::context_t ctx;
  raw_peer coord(ctx, b.router), w(ctx, b.router);
  coord.introduce("coord", role::coordinator, 30'000);
  w.introduce("collector-7", role::collector, 30'000);
  codec::submit s;
  s.task_id = "t-run";
  coord.send(s);
  REQUIRE(w.recv_a<codec::task_start>());
  s.task_id = "t-queued";
  s.kind = role::learner;  // no learner: it waits
  coord.send(s);
  REQUIRE(wait_until([&] { return ctl_json(b, {"status"}).at("queue_depth") == 1; }));

  const auto status = ctl_json(b, {"status"});
  CHECK(status.at("peers").at("collector") == 1);
  CHECK(status.at("peers").at("coordinator") == 1);
  CHECK(status.at("tasks").at("running") == 1);
  const auto [code, human] = ctl(b, {"status"});
  CHECK(code == 0);
  CHECK_THAT(human, Catch::Contains("1 collectors, 0 learners, 1 coordinators"));
  CHECK_THAT(human, Catch::Contains("1 queued, 1 running"));

  const auto workers = ctl_json(b, {"workers"});
  REQUIRE(workers.at("workers").size() == 1);
  CHECK(workers.at("workers")[0].at("task") == "t-run");
  const auto [wcode, wtable] = ctl(b, {"workers"});
  CHECK(wcode == 0);
  CHECK_THAT(wtable, Catch::Contains("WORKER") && Catch::Contains("collector-7") &&
                         Catch::Contains("t-run"));

  const auto queued = ctl_json(b, {"tasks", "--state", "queued"});
  REQUIRE(queued.at("tasks").size() == 1);
  CHECK(queued.at("tasks")[0].at("id") == "t-queued");
  const auto [tcode, ttable] = ctl(b, {"tasks", "--kind", "collector"});
  CHECK(tcode == 0);
  CHECK_THAT(ttable, Catch::Contains("t-run") && Catch::Contains("starting") &&
                         !Catch::Contains("t-queued"));
}

TEST_CASE("rlbus-ctl drains, undrains and evicts a worker and sets a limit", "[binary][ctl]") {
  running_broker b;
  zmq::context_t ctx;
  raw_peer coord(ctx, b.router), w(ctx, b.router);
  coord.introduce("coord", role::coordinator, 30'000);
  w.introduce("w", role::collector, 30'000);
  auto [code, out] = ctl(b, {"drain", "w"});
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("worker w drained"));
  codec::submit s;
  s.task_id = "t0";
  coord.send(s);
  CHECK_FALSE(w.recv_a<codec::task_start>(300ms));  // drained: nothing comes
  std::tie(code, out) = ctl(b, {"undrain", "w"});
  CHECK(code == 0);
  REQUIRE(w.recv_a<codec::task_start>());  // undrained: the waiting task comes
  std::tie(code, out) = ctl(b, {"evict", "w"});
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("its task t0 was handed back"));
  CHECK(w.recv_a<codec::task_abort>());
  const auto bye = w.recv_a<codec::disconnect>();
  REQUIRE(bye);
  CHECK(bye->code == 433);
  CHECK(ctl_json(b, {"workers"}).at("total") == 0);

  std::tie(code, out) = ctl(b, {"set", "tasks.max-queue", "5"});
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("tasks.max-queue = 5 (was 10000)"));
  const auto changes = ctl_json(b, {"status"}).at("changes");
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].at("value") == "5");
}

TEST_CASE("rlbus-ctl's exit status says what went wrong", "[binary][ctl]") {
  running_broker b;
  // 3: the broker refused, and says why.
  auto [code, out] = ctl(b, {"evict", "nobody"});
  CHECK(code == 3);
  CHECK_THAT(out, Catch::Contains("432 NO_SUCH_PEER") && Catch::Contains("nobody"));
  std::tie(code, out) = ctl(b, {"set", "router", "tcp://127.0.0.1:1"});
  CHECK(code == 3);
  CHECK_THAT(out, Catch::Contains("cannot change while the broker runs"));
  // 2: bad usage, never sent.
  std::tie(code, out) = ctl(b, {});
  CHECK(code == 2);
  std::tie(code, out) = ctl(b, {"tasks", "--state", "done"});
  CHECK(code == 2);
  // 1: nobody answers.
  std::tie(code, out) = run_to_end(binary_from_env("RLBUS_CTL_BIN"),
                                   {"--broker", "tcp://127.0.0.1:1", "--timeout", "200", "status"});
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("no answer within 200 ms"));
  // 2: an endpoint ZeroMQ cannot take, said as that (it was an abort).
  std::tie(code, out) =
      run_to_end(binary_from_env("RLBUS_CTL_BIN"), {"--broker", "nonsense", "status"});
  CHECK(code == 2);
  CHECK_THAT(out, Catch::Contains("bad endpoint 'nonsense'"));
}

TEST_CASE("rlbus-ctl takes its global options after the verb too", "[binary][ctl]") {
  running_broker b;
  const auto [code, out] =
      run_to_end(binary_from_env("RLBUS_CTL_BIN"),
                 {"status", "--json", "--broker", b.router, "--timeout", "5000"});
  INFO(out);
  REQUIRE(code == 0);
  CHECK(json::parse(out).contains("uptime_ms"));
}

TEST_CASE("rlbus-ctl lists more tasks than a page and status stays readable after many sets",
          "[binary][ctl]") {
  running_broker b({"--log-level", "error"});  // not a line per set: nobody reads them here
  zmq::context_t ctx;
  raw_peer coord(ctx, b.router), op(ctx, b.router);
  coord.introduce("coord", role::coordinator, 30'000);
  constexpr int n = 1100;  // past a page (1000) and past the decoder's 1024 array entries
  for (int i = 0; i < n; ++i) {
    codec::submit s;
    s.task_id = "t" + std::to_string(i);
    coord.send(s);
  }
  for (int i = 0; i < n; ++i) REQUIRE(coord.recv_a<codec::submitted>());
  const auto listed = ctl_json(b, {"tasks", "--limit", "2000"});
  CHECK(listed.at("total") == n);
  REQUIRE(listed.at("tasks").size() == n);
  CHECK(listed.at("tasks").at(0).at("id") == "t0");
  CHECK(listed.at("tasks").at(n - 1).at("id") == "t" + std::to_string(n - 1));
  CHECK(ctl_json(b, {"tasks", "--limit", "1050"}).at("tasks").size() == 1050);

  codec::ops set;
  set.verb = "set";
  set.key = "tasks.max-queue";
  for (int i = 0; i < n; ++i) {  // each set is remembered, but not all of them in status
    set.request_id = static_cast<std::uint64_t>(i) + 1;
    set.value = std::to_string(20'000 + i);
    op.send(set);
    REQUIRE(op.recv_a<codec::ops_reply>());
  }
  const auto status = ctl_json(b, {"status"});
  CHECK(status.at("changes_total") == n);
  REQUIRE(status.at("changes").size() == 64);
  CHECK(status.at("changes").back().at("value") == std::to_string(20'000 + n - 1));
}

TEST_CASE("rlbus-ctl watch refreshes status and workers", "[binary][ctl]") {
  running_broker b;
  const auto [code, out] = ctl(b, {"--json", "watch", "--interval", "100", "--count", "3"});
  CHECK(code == 0);
  std::istringstream lines(out);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    INFO(line);
    const auto j = json::parse(line);
    CHECK(j.at("status").contains("uptime_ms"));
    CHECK(j.at("workers").contains("total"));
    ++n;
  }
  CHECK(n == 3);
  const auto [hcode, human] = ctl(b, {"watch", "--interval", "100", "--count", "1"});
  CHECK(hcode == 0);
  CHECK_THAT(human, Catch::Contains("\x1b[H\x1b[2J") && Catch::Contains("WORKER"));
}

// The settings rlbus-ctl offers to set are the broker's live ones, from the same table.
TEST_CASE("rlbus-ctl set lists the settings that may change at run time", "[binary][ctl]") {
  const auto [code, out] = run_to_end(binary_from_env("RLBUS_CTL_BIN"), {"set", "--help"});
  CHECK(code == 0);
  const auto keys = broker::live_setting_keys();
  CHECK(keys.size() >= 10);
  for (const auto& k : keys) CHECK_THAT(out, Catch::Contains(k));
  for (const auto& s : broker::settings())
    if (!s.live) CHECK_THAT(out, !Catch::Contains(" " + s.key() + ","));
}

TEST_CASE("rlbus-ctl topics shows the bus's topics and the nodes that lag", "[binary][ctl]") {
  running_broker b;
  zmq::context_t ctx;
  raw_peer pub(ctx, b.router), slow(ctx, b.router);
  pub.introduce("learner-node", role::bus, 30'000);
  slow.introduce("collector-node", role::bus, 30'000);
  slow.send(codec::subscribe{1, "model_exchanger", false, false, false});
  REQUIRE(slow.recv_a<codec::subscribed>());
  for (std::uint64_t i = 1; i <= 3; ++i) pub.send(codec::publish{i, "model_exchanger"}, "w");
  pub.send(codec::publish{4, "task.finish"}, "");
  // Nothing is acknowledged: the subscriber lags by three deliveries.
  REQUIRE(wait_until([&] {
    const auto r = ctl_json(b, {"topics"});
    return r.at("nodes").size() == 2 && r.at("nodes")[0].at("queued") == 3;
  }));
  const auto r = ctl_json(b, {"topics"});
  CHECK(r.at("topics")[0].at("topic") == "model_exchanger");  // the busiest first
  CHECK(r.at("topics")[0].at("messages") == 3);
  CHECK(r.at("topics")[0].at("subscribers") == 1);
  CHECK(r.at("topics_total") == 2);
  CHECK(r.at("nodes")[0].at("id") == "collector-node");  // the laggiest first
  CHECK(r.at("nodes")[1].at("published") == 4);
  const auto [code, table] = ctl(b, {"topics", "--limit", "1"});
  CHECK(code == 0);
  CHECK_THAT(table, Catch::Contains("TOPIC") && Catch::Contains("model_exchanger") &&
                        Catch::Contains("collector-node") && Catch::Contains("(1 of 2 topics"));
  const auto status = ctl_json(b, {"status"});
  CHECK(status.at("peers").at("bus") == 2);
  CHECK(status.at("bus").at("published") == 4);
}
