// Integration: `rlbus-demo run` as a user runs it: the real broker, learner and collector
// processes over tcp train cart-pole to its solved threshold, survive a collector killed in
// the middle of a task, stop everything on Ctrl-C, and say so clearly when the port is taken.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cluster/local_etcd.hpp"
#include "support/child.hpp"
#include "support/support.hpp"

using namespace rlbus::test;

namespace {

std::string demo_bin() {
  return binary_from_env("RLBUS_DEMO_BIN");
}

// The number on the summary line that starts with `label` (-1 if there is none). Parsed by
// hand: std::regex trips GCC's maybe-uninitialized warning in sanitizer builds.
long summary_number(const std::string& out, const std::string& label) {
  const auto at = out.find("\n" + label + ":");
  if (at == std::string::npos) return -1;
  std::istringstream rest(out.substr(at + label.size() + 2));
  long n = -1;
  rest >> n;
  return rest ? n : -1;
}

// The pids the launcher lists at start ("  collector-1  pid 1234"), and those of brokers it
// started again ("broker a started again as pid 1234").
std::vector<int> child_pids(const std::string& out) {
  std::vector<int> pids;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string name, pid_word;
    int pid = 0;
    if (const auto again = line.find("started again as pid "); again != std::string::npos) {
      pids.push_back(std::atoi(line.c_str() + again + 21));
      continue;
    }
    if (line.rfind("  ", 0) != 0 || !(words >> name >> pid_word >> pid) || pid_word != "pid")
      continue;
    const bool worker = name.rfind("learner-", 0) == 0 || name.rfind("collector-", 0) == 0;
    if (name.rfind("broker", 0) == 0 || name == "etcd" || worker) pids.push_back(pid);
  }
  return pids;
}

bool gone(int pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

TEST_CASE("the demo solves cart-pole through the bus although a collector is killed mid-task",
          "[demo-binary]") {
  // Episodes twice as slow as the default, so that on a loaded machine too the kill lands
  // well before the collector could finish its task (it has 3 of 4 directions to go).
  child demo(demo_bin(),
             {"run", "--port", "0", "--kill-collector-at", "2", "--episode-cost-ms", "40",
              "--broker", binary_from_env("RLBUS_BROKER_BIN"), "--time-limit", "60"});
  const auto status = demo.wait(40s);
  const auto& out = demo.output();
  INFO(out);
  REQUIRE(status);
  CHECK(*status == 0);
  CHECK_THAT(out, Catch::Contains("result:          solved"));
  CHECK_THAT(out, Catch::Contains("chaos: SIGKILL collector-"));
  CHECK_THAT(out, Catch::Contains("re-queued"));
  CHECK(summary_number(out, "requeued tasks") >= 1);
  CHECK(summary_number(out, "failed tasks") == 0);
  CHECK(summary_number(out, "iterations") >= 2);
  // One progress line per iteration, from the initial policy on.
  CHECK_THAT(out, Catch::Contains("iter   0  policy v0"));
  CHECK_THAT(out, Catch::Contains("iter   2  policy v2"));
  for (const int pid : child_pids(out)) CHECK(wait_until([&] { return gone(pid); }, 5s));
}

TEST_CASE("the demo solves cart-pole although the broker is SIGKILLed and restarted mid-run",
          "[demo-binary]") {
  child demo(demo_bin(), {"run", "--port", "0", "--kill-broker-at", "2", "--episode-cost-ms", "40",
                          "--broker", binary_from_env("RLBUS_BROKER_BIN"), "--time-limit", "60"});
  const auto status = demo.wait(40s);
  const auto& out = demo.output();
  INFO(out);
  REQUIRE(status);
  CHECK(*status == 0);
  CHECK_THAT(out, Catch::Contains("result:          solved"));
  const auto kill = out.find("chaos: SIGKILL the broker");
  REQUIRE(kill != std::string::npos);
  // The running attempts came back from the journal, named; nothing failed; and the learner
  // went on from the version it had published instead of starting over.
  CHECK(out.find("broker restarted", kill) != std::string::npos);
  CHECK(summary_number(out, "failed tasks") == 0);
  CHECK(out.find("policy v0", kill) == std::string::npos);
  CHECK(summary_number(out, "iterations") >= 2);
  for (const int pid : child_pids(out)) CHECK(wait_until([&] { return gone(pid); }, 5s));
}

TEST_CASE("the demo solves cart-pole although the leader of its group of brokers is SIGKILLed",
          "[demo-binary]") {
  if (!rlbus::cluster::local_etcd::available()) {
    WARN("skipped: etcd is not installed (apt-get install etcd-server)");
    return;
  }
  child demo(demo_bin(), {"run", "--port", "0", "--kill-leader-at", "2", "--episode-cost-ms", "40",
                          "--broker", binary_from_env("RLBUS_BROKER_BIN"), "--time-limit", "90"});
  const auto status = demo.wait(120s);
  const auto& out = demo.output();
  INFO(out);
  REQUIRE(status);
  CHECK(*status == 0);
  CHECK_THAT(out, Catch::Contains("result:          solved"));
  const auto kill = out.find("chaos: SIGKILL the leader, broker a");
  REQUIRE(kill != std::string::npos);
  // b took over on its copy of the journal: the running attempts came back, named, nothing
  // failed, the learner went on from its version; a came back as b's standby.
  CHECK(out.find("broker b: leading group", kill) != std::string::npos);
  CHECK(out.find("broker restarted", kill) != std::string::npos);
  CHECK(out.find("broker a: standing by: b leads", kill) != std::string::npos);
  CHECK(summary_number(out, "failed tasks") == 0);
  CHECK(out.find("policy v0", kill) == std::string::npos);
  const auto takeover = out.find("\ntakeover:        broker a killed at ");
  REQUIRE(takeover != std::string::npos);
  CHECK(out.find("broker b led ", takeover) != std::string::npos);
  CHECK(out.find("tasks re-run", takeover) != std::string::npos);
  const auto pids = child_pids(out);
  CHECK(pids.size() == 8);  // etcd, a, b, a again, the learner and 3 collectors
  for (const int pid : pids) CHECK(wait_until([&] { return gone(pid); }, 5s));
}

TEST_CASE("Ctrl-C stops the demo and every process it started", "[demo-binary]") {
  // Slow collectors, so the run is surely still going when the signal comes.
  child demo(demo_bin(), {"--port", "0", "--episode-cost-ms", "200", "--broker",
                          binary_from_env("RLBUS_BROKER_BIN")});
  REQUIRE(demo.wait_for_line("iter   0", 20s));
  const auto pids = child_pids(demo.output());
  CHECK(pids.size() == 5);  // broker, learner, 3 collectors
  demo.signal(SIGINT);
  const auto status = demo.wait(15s);
  INFO(demo.output());
  REQUIRE(status);
  CHECK(*status == 130);
  CHECK_THAT(demo.output(), Catch::Contains("interrupted"));
  CHECK_THAT(demo.output(), Catch::Contains("result:          not solved"));
  for (const int pid : pids) CHECK(wait_until([&] { return gone(pid); }, 5s));
}

TEST_CASE("with --linger the run stays up to be watched, and Ctrl-C then ends it as solved",
          "[demo-binary]") {
  child demo(demo_bin(), {"--port", "0", "--linger", "120", "--broker",
                          binary_from_env("RLBUS_BROKER_BIN"), "--time-limit", "60"});
  const auto lingering = demo.wait_for_line("everything stays up for 120 s", 60s);
  INFO(demo.output());
  REQUIRE(lingering);
  // The web view's address, from the opening block; its broker still has the whole fleet
  // and the tasks the run finished.
  const auto& out = demo.output();
  const std::string marker = "web view http://127.0.0.1:";
  const auto at = out.find(marker);
  REQUIRE(at != std::string::npos);
  const int port = std::atoi(out.c_str() + at + marker.size());
  httplib::Client web("127.0.0.1", port);
  web.set_read_timeout(10, 0);
  const auto r = web.Get("/api/view");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const auto v = nlohmann::json::parse(r->body);
  CHECK(v["status"]["peers"]["collector"] == 3);
  CHECK(v["status"]["peers"]["learner"] == 1);
  CHECK(v["status"]["counters"]["tasks_finished"].get<std::uint64_t>() > 0);
  CHECK(out.find("result:") == std::string::npos);  // nothing was stopped yet
  const auto pids = child_pids(out);
  demo.signal(SIGINT);
  const auto status = demo.wait(15s);
  INFO(demo.output());
  REQUIRE(status);
  CHECK(*status == 0);
  CHECK_THAT(demo.output(), Catch::Contains("result:          solved"));
  for (const int pid : pids) CHECK(wait_until([&] { return gone(pid); }, 5s));
}

TEST_CASE("a port in use is a clear error, not a hang", "[demo-binary]") {
  zmq::context_t ctx;
  zmq::socket_t squatter(ctx, zmq::socket_type::router);
  squatter.bind("tcp://127.0.0.1:*");
  const auto taken = squatter.get(zmq::sockopt::last_endpoint);
  const auto port = taken.substr(taken.rfind(':') + 1);
  const auto [status, out] = run_to_end(
      demo_bin(), {"run", "--port", port, "--broker", binary_from_env("RLBUS_BROKER_BIN")});
  INFO(out);
  CHECK(status == 3);
  CHECK_THAT(out, Catch::Contains("the broker did not start"));
  CHECK_THAT(out, Catch::Contains("--port"));
}

TEST_CASE("the demo's flags are documented and bad ones refused", "[demo-binary]") {
  auto [status, out] = run_to_end(demo_bin(), {"--help"});
  CHECK(status == 0);
  for (const char* flag : {"--port", "--collectors", "--seed", "--max-iterations", "--time-limit",
                           "--kill-collector-at", "--kill-broker-at", "--kill-leader-at",
                           "--respawn", "--broker", "--linger"})
    CHECK_THAT(out, Catch::Contains(flag));
  std::tie(status, out) = run_to_end(demo_bin(), {"run", "--no-such-flag"});
  CHECK(status == 2);
  std::tie(status, out) = run_to_end(demo_bin(), {"--broker", "/nonexistent/rlbus-broker"});
  CHECK(status == 3);
  CHECK_THAT(out, Catch::Contains("/nonexistent/rlbus-broker"));
  std::tie(status, out) =
      run_to_end(demo_bin(), {"--kill-broker-at", "2", "--kill-leader-at", "2"});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("excludes"));
}
