// Integration: the rlbus-broker binary as a user runs it: flags, logged endpoints, serving
// a worker, and a clean exit 0 on SIGTERM/SIGINT that tells peers DISCONNECT.
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "rlbus/coordinator.hpp"
#include "rlbus/worker.hpp"
#include "support/child.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {

struct endpoints {
  std::string router, events;
};

endpoints started(child& c) {
  const auto line = c.wait_for_line("rlbus broker", 10s);
  INFO(c.output());
  REQUIRE(line);
  // "... router ENDPOINT events ENDPOINT (epoch ...)"
  const auto word_after = [&](const std::string& key) {
    const auto at = line->find(key + " ");
    REQUIRE(at != std::string::npos);
    const auto from = at + key.size() + 1;
    return line->substr(from, line->find(' ', from) - from);
  };
  return {word_after("router"), word_after("events")};
}

}  // namespace

TEST_CASE("--help documents every flag", "[binary]") {
  const auto [status, out] = run_to_end(broker_bin(), {"--help"});
  CHECK(status == 0);
  for (const char* flag : {"--router",
                           "--events",
                           "--liveness",
                           "--heartbeat-min",
                           "--heartbeat-max",
                           "--status-interval",
                           "--max-message",
                           "--max-peers",
                           "--max-faults",
                           "--shutdown-linger",
                           "--drain-ms",
                           "--log-level",
                           "--max-queue",
                           "--start-timeout",
                           "--step-timeout",
                           "--close-timeout",
                           "--task-timeout",
                           "--max-attempts",
                           "--no-data-retry",
                           "--stream-ring",
                           "--stream-ring-bytes",
                           "--stream-window",
                           "--queue-timeout-ms",
                           "--coordinator-grace",
                           "--journal",
                           "--journal-fsync",
                           "--curve-key",
                           "--allowlist",
                           "--insecure",
                           "--max-connections",
                           "--max-connections-per-address",
                           "--handshake-timeout",
                           "--max-collectors",
                           "--max-learners",
                           "--max-coordinators",
                           "--max-tasks-per-coordinator",
                           "keygen"})
    CHECK_THAT(out, Catch::Contains(flag));
  // Each task default is documented with its value.
  for (const char* value : {"10000", "60000", "30000", "3600000", "65536", "67108864"})
    CHECK_THAT(out, Catch::Contains(value));
  CHECK_THAT(out, Catch::Contains("second signal"));
}

TEST_CASE("task settings out of range exit 2 naming the flag", "[binary]") {
  const std::vector<std::vector<std::string>> bad{{"--max-attempts", "0"},
                                                  {"--max-attempts", "1001"},
                                                  {"--step-timeout", "0"},
                                                  {"--task-timeout", "86400001"},
                                                  {"--drain-ms", "86400001"},
                                                  {"--drain-ms", "-1"},
                                                  {"--max-queue", "0"},
                                                  {"--stream-ring", "15"},
                                                  {"--stream-ring-bytes", "10"},
                                                  {"--no-data-retry", "86400001"},
                                                  {"--start-timeout", "soon"},
                                                  {"--status-interval", "9"},
                                                  {"--status-interval", "86400001"},
                                                  {"--max-faults", "0"},
                                                  {"--max-faults", "1000001"},
                                                  {"--max-peers", "0"},
                                                  {"--max-peers", "10000001"},
                                                  {"--shutdown-linger", "86400001"},
                                                  {"--shutdown-linger", "-1"},
                                                  {"--stream-window", "0"},
                                                  {"--queue-timeout-ms", "86400001"}};
  for (const auto& args : bad) {
    INFO(args[0] << " " << args[1]);
    const auto [status, out] = run_to_end(broker_bin(), args);
    CHECK(status == 2);
    CHECK_THAT(out, Catch::Contains(args[0]));
  }
}

// SPEC §1.4: the stream window is 1 to half the stream ring, and by default follows a ring
// too small for the usual 1024.
TEST_CASE("--stream-window is checked against the ring and follows a small one", "[binary]") {
  auto [status, out] = run_to_end(broker_bin(), {"--stream-ring", "16", "--stream-window", "9"});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("--stream-window"));
  CHECK_THAT(out, Catch::Contains("1..8"));
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, std::vector<std::string>{"--stream-window", "8"}}) {
    std::vector<std::string> args{"--router",          "tcp://127.0.0.1:0", "--events",
                                  "tcp://127.0.0.1:0", "--stream-ring",     "16"};
    args.insert(args.end(), extra.begin(), extra.end());
    child broker(broker_bin(), args);
    INFO(broker.output());
    REQUIRE(broker.wait_for_line("rlbus-broker listening", 10s));
    broker.signal(SIGTERM);
    const auto code = broker.wait(10s);
    REQUIRE(code);
    CHECK(*code == 0);
  }
}

// SPEC §1.4: one machine-readable line names the bound endpoints, a port 0 resolved.
TEST_CASE("the broker prints the endpoints it bound on one line", "[binary]") {
  child broker(broker_bin(), {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                              "--status-interval", "50"});
  const auto line = broker.wait_for_line("rlbus-broker listening ", 10s);
  INFO(broker.output());
  REQUIRE(line);
  const auto value_of = [&](const std::string& key) {
    const auto at = line->find(" " + key + "=");
    REQUIRE(at != std::string::npos);
    const auto from = at + key.size() + 2;
    const auto end = line->find_first_of(" \r\n", from);
    return line->substr(from, end == std::string::npos ? std::string::npos : end - from);
  };
  const auto router = value_of("router");
  const auto events_ep = value_of("events");
  CHECK(router.rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK(router != "tcp://127.0.0.1:0");
  CHECK(events_ep.rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK(events_ep != router);
  zmq::context_t ctx;
  event_listener events(ctx, events_ep);
  raw_peer p(ctx, router);
  p.send(codec::hello{role::collector, "by-line", 30'000, {}, {}});
  REQUIRE(p.recv_a<codec::welcome>());
  CHECK(events.next("broker.heartbeat"));
  broker.signal(SIGTERM);
  const auto code = broker.wait(10s);
  REQUIRE(code);
  CHECK(*code == 0);
}

TEST_CASE("bad flags and settings exit 2 with a message", "[binary]") {
  auto [status, out] = run_to_end(broker_bin(), {"--no-such-flag"});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("no-such-flag"));
  std::tie(status, out) =
      run_to_end(broker_bin(), {"--heartbeat-min", "5000", "--heartbeat-max", "100"});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("heartbeat"));
}

TEST_CASE("an endpoint in use exits 1 with a message", "[binary]") {
  zmq::context_t ctx;
  zmq::socket_t squatter(ctx, zmq::socket_type::router);
  squatter.bind("tcp://127.0.0.1:*");
  const auto taken = squatter.get(zmq::sockopt::last_endpoint);
  const auto [status, out] =
      run_to_end(broker_bin(), {"--router", taken, "--events", "tcp://127.0.0.1:0"});
  CHECK(status == 1);
  CHECK_THAT(out, Catch::Contains("cannot start"));
}

TEST_CASE("the broker binary serves workers and stops cleanly on SIGTERM", "[binary]") {
  child broker(broker_bin(), {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                              "--heartbeat-min", "10", "--status-interval", "50"});
  const auto ep = started(broker);
  CHECK(ep.router.find(":0") == std::string::npos);  // the real port is logged

  zmq::context_t ctx;
  event_listener events(ctx, ep.events);
  worker_options o;
  o.endpoint = ep.router;
  o.id = "collector-bin";
  // It must hear the broker's goodbye, not its silence while it stops.
  o.heartbeat = 1000ms;
  o.reconnect_min = 5000ms;  // so the state after shutdown stays observable
  o.reconnect_max = 5000ms;
  worker w(o);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  REQUIRE(broker.wait_for_line("collector-bin (collector) joined", 5s));

  broker.signal(SIGTERM);
  const auto status = broker.wait(10s);
  INFO(broker.output());
  REQUIRE(status);
  CHECK(*status == 0);
  CHECK(events.next("broker.stopping"));
  REQUIRE(wait_until([&] { return w.last_error().find("503") != std::string::npos; }));
  CHECK(w.state() == connection_state::reconnecting);
  CHECK_THAT(broker.output(), Catch::Contains("broker stopped"));
}

TEST_CASE("a SIGTERM while the broker starts stops it once it has started", "[binary]") {
  // The broker is held in its start by its ROUTER endpoint, taken by another socket (it tries
  // again for 2 s); a SIGTERM that comes then must not be forgotten once it serves.
  for (int attempt = 0;; ++attempt) {
    zmq::context_t ctx;
    auto squatter = std::make_optional<zmq::socket_t>(ctx, zmq::socket_type::router);
    squatter->bind("tcp://127.0.0.1:*");
    const auto taken = squatter->get(zmq::sockopt::last_endpoint);
    child broker(broker_bin(), {"--router", taken, "--events", "tcp://127.0.0.1:0"});
    // Its signals are taken by a thread of its own, made before anything else: once it has
    // one, it is starting.
    const auto task_dir = fmt::format("/proc/{}/task", broker.pid());
    REQUIRE(wait_until(
        [&] {
          std::error_code ec;
          const auto threads = std::distance(std::filesystem::directory_iterator(task_dir, ec),
                                             std::filesystem::directory_iterator());
          return !ec && threads > 1;
        },
        10s));
    broker.signal(SIGTERM);
    squatter.reset();  // the endpoint is free: the broker binds it and starts
    const auto status = broker.wait(30s);
    INFO(broker.output());
    REQUIRE(status);
    if (*status == 1 && attempt < 5 &&
        broker.output().find("Address already in use") != std::string::npos)
      continue;  // the 2 s ran out before the endpoint was freed (a very busy machine)
    CHECK(*status == 0);
    CHECK_THAT(broker.output(), Catch::Contains("broker stopped"));
    break;
  }
}

TEST_CASE("SIGINT stops the broker binary with exit status 0", "[binary]") {
  child broker(broker_bin(), {"--router", "ipc:///tmp/rlbus-bin-" + std::to_string(::getpid()),
                              "--events", "tcp://127.0.0.1:0", "--log-level", "info"});
  started(broker);
  broker.signal(SIGINT);
  const auto status = broker.wait(10s);
  REQUIRE(status);
  CHECK(*status == 0);
}

namespace {

/// A raw peer introduced with a heartbeat long enough not to expire during the test.
void join_as(raw_peer& p, const std::string& id, role r) {
  p.send(codec::hello{r, id, 30'000, {}, {}});
  REQUIRE(p.recv_a<codec::welcome>());
}

/// SUBMITs a collector task that the free `worker` takes, and starts it there.
void run_on(raw_peer& coord, raw_peer& worker, const std::string& task_id) {
  codec::submit s;
  s.task_id = task_id;
  coord.send(s);
  const auto ack = coord.recv_a<codec::submitted>();
  REQUIRE(ack);
  REQUIRE(ack->accepted);
  const auto start = worker.recv_a<codec::task_start>();
  REQUIRE(start);
  REQUIRE(start->task_id == task_id);
  worker.send(codec::started{task_id, start->attempt});
  CHECK(until_event(coord, "started").task_id == task_id);
}

}  // namespace

// SPEC §11: on SIGTERM the binary drains. One task finishes during the drain and its
// coordinator sees it finish; the other never ends and is aborted when the drain runs out;
// then every peer is told DISCONNECT 503 and the process exits 0.
TEST_CASE("SIGTERM drains: a running task may finish, a stuck one is aborted, exit 0", "[binary]") {
  constexpr auto drain = 1500ms;
  child broker(broker_bin(), {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                              "--drain-ms", std::to_string(drain.count())});
  const auto ep = started(broker);
  zmq::context_t ctx;
  raw_peer coord(ctx, ep.router), fast(ctx, ep.router), stuck(ctx, ep.router);
  join_as(coord, "coord", role::coordinator);
  join_as(fast, "fast", role::collector);
  join_as(stuck, "stuck", role::collector);
  run_on(coord, fast, "finishes");
  run_on(coord, stuck, "never-ends");

  const auto signalled = std::chrono::steady_clock::now();
  broker.signal(SIGTERM);
  REQUIRE(broker.wait_for_line("stopping: draining for at most 1500 ms", 5s));
  // Closed to new work ...
  raw_peer late(ctx, ep.router);
  late.send(codec::hello{role::collector, "late", 30'000, {}, {}});
  const auto refused = late.recv_a<codec::error>();
  REQUIRE(refused);
  CHECK(refused->code == 503);
  codec::submit more;
  more.task_id = "more";
  coord.send(more);
  const auto busy = coord.recv_a<codec::submitted>();
  REQUIRE(busy);
  CHECK_FALSE(busy->accepted);
  CHECK(busy->code == 503);
  // ... but the running task goes on to its end.
  fast.send(codec::info{"finishes", 1, flag_map("collector_done", true)});
  CHECK(until_event(coord, "info").task_id == "finishes");
  coord.send(codec::finish{"finishes"});
  REQUIRE(fast.recv_a<codec::task_close>());
  fast.send(codec::task_result{"finishes", 1, flag_map("collector_done", true)});
  CHECK(until_event(coord, "finished").task_id == "finishes");

  // The other one is aborted when the drain runs out.
  const auto abort = stuck.recv_a<codec::task_abort>(drain + 5s);
  REQUIRE(abort);
  CHECK(abort->task_id == "never-ends");
  CHECK_THAT(abort->reason, Catch::Contains("drain of 1500 ms ran out"));
  CHECK(until_event(coord, "cancelled").task_id == "never-ends");
  for (auto* p : {&coord, &fast, &stuck}) {
    const auto d = p->recv_a<codec::disconnect>();
    REQUIRE(d);
    CHECK(d->code == 503);
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      signalled + drain + 5s - std::chrono::steady_clock::now());
  const auto status = broker.wait(std::max(left, 1ms));
  INFO(broker.output());
  REQUIRE(status);  // within the drain and a margin
  CHECK(*status == 0);
  CHECK_THAT(broker.output(), Catch::Contains("aborted 1 tasks still running"));
}

TEST_CASE("a second SIGINT during the drain stops the binary at once", "[binary]") {
  child broker(broker_bin(), {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                              "--drain-ms", "600000"});
  const auto ep = started(broker);
  zmq::context_t ctx;
  raw_peer coord(ctx, ep.router), w(ctx, ep.router);
  join_as(coord, "coord", role::coordinator);
  join_as(w, "w", role::collector);
  run_on(coord, w, "long");
  broker.signal(SIGINT);
  REQUIRE(broker.wait_for_line("stopping: draining", 5s));
  broker.signal(SIGINT);
  const auto abort = w.recv_a<codec::task_abort>(5s);
  REQUIRE(abort);
  CHECK_THAT(abort->reason, Catch::Contains("stopped again"));
  const auto status = broker.wait(10s);
  INFO(broker.output());
  REQUIRE(status);
  CHECK(*status == 0);
}

namespace {

// An environment variable for the children started while it lives.
struct env_var {
  std::string name;
  env_var(std::string n, const std::string& value) : name(std::move(n)) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~env_var() { ::unsetenv(name.c_str()); }
  env_var(const env_var&) = delete;
  env_var& operator=(const env_var&) = delete;
};

// A file in a fresh directory, removed with it.
struct temp_file {
  std::filesystem::path dir;
  std::string path;
  explicit temp_file(const std::string& text, const std::string& name = "broker.toml") {
    char pattern[] = "/tmp/rlbus-binary-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    dir = pattern;
    path = (dir / name).string();
    std::ofstream(path) << text;
  }
  ~temp_file() { std::filesystem::remove_all(dir); }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
};

// What --print-config says with `args`: exit 0 and the TOML text.
std::string printed_config(std::vector<std::string> args) {
  args.emplace_back("--print-config");
  const auto [status, out] = run_to_end(broker_bin(), args);
  INFO(out);
  REQUIRE(status == 0);
  return out;
}

}  // namespace

// A setting comes from, strongest first: its flag, its RLBUS_BROKER_ variable, the config
// file, the default; --print-config shows which won.
TEST_CASE("flags beat the environment, which beats the config file", "[binary]") {
  temp_file file("liveness = 4\n[tasks]\nmax-queue = 42\nstep-timeout = 1500\nmax-attempts = 9\n");
  const env_var queue("RLBUS_BROKER_MAX_QUEUE", "55");
  const env_var attempts("RLBUS_BROKER_MAX_ATTEMPTS", "7");
  const auto out = printed_config({"--config", file.path, "--max-attempts", "8"});
  CHECK_THAT(out, Catch::Contains("\nliveness = 4\n"));           // the file
  CHECK_THAT(out, Catch::Contains("\nstep-timeout = 1500\n"));    // the file
  CHECK_THAT(out, Catch::Contains("\nmax-queue = 55\n"));         // the environment over the file
  CHECK_THAT(out, Catch::Contains("\nmax-attempts = 8\n"));       // the flag over both
  CHECK_THAT(out, Catch::Contains("\nclose-timeout = 30000\n"));  // nobody: the default
  // The file's name may come from the environment too.
  const env_var config("RLBUS_BROKER_CONFIG", file.path);
  CHECK_THAT(printed_config({}), Catch::Contains("\nliveness = 4\n"));
}

TEST_CASE("--print-config prints a config file that gives the same configuration", "[binary]") {
  const auto first = printed_config({"--router", "tcp://127.0.0.1:7300", "--journal-fsync",
                                     "always", "--stream-ring", "64", "--insecure"});
  CHECK_THAT(first, Catch::Contains("stream-window = 32"));  // the window followed the ring
  temp_file file(first);
  CHECK(printed_config({"--config", file.path}) == first);
}

TEST_CASE("a config file that cannot be used stops the broker with exit 2, saying why",
          "[binary]") {
  const std::vector<std::pair<std::string, std::string>> bad{
      {"[tasks]\nmax-queue = 0\n", "line 2: tasks.max-queue = 0: 0 is outside"},
      {"[tasks]\nmax-qeue = 3\n", "tasks.max-qeue = 3: unknown key"},
      {"max-attempts = 3\n", "did you mean tasks.max-attempts?"},
      {"router = 7\n", "router = 7: expected a string"},
      {"[tasks\n", "line 1"},
      // Checked as a whole as well: the window against the ring.
      {"[tasks]\nstream-ring = 16\nstream-window = 9\n", "1..8"}};
  for (const auto& [text, why] : bad) {
    INFO(text);
    temp_file file(text);
    const auto [status, out] = run_to_end(broker_bin(), {"--config", file.path});
    CHECK(status == 2);
    CHECK_THAT(out, Catch::Contains(why));
  }
  const auto [status, out] = run_to_end(broker_bin(), {"--config", "/nonexistent/broker.toml"});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("/nonexistent/broker.toml"));
  // A bad value in the environment is refused like a bad flag, naming it.
  const env_var queue("RLBUS_BROKER_MAX_QUEUE", "lots");
  const auto [env_status, env_out] = run_to_end(broker_bin(), {"--print-config"});
  CHECK(env_status == 2);
  CHECK_THAT(env_out, Catch::Contains("--max-queue"));
  CHECK_THAT(env_out, Catch::Contains("lots"));
}

// docs/configuration.md is the binary's own reference page: it cannot drift from the code.
TEST_CASE("the configuration reference in docs/ is what the binary prints", "[binary]") {
  const auto [status, out] = run_to_end(broker_bin(), {"--print-reference"});
  REQUIRE(status == 0);
  const char* protocol = std::getenv("RLBUS_PROTOCOL_DIR");
  REQUIRE(protocol != nullptr);
  std::ifstream in(std::filesystem::path(protocol).parent_path() / "docs" / "configuration.md");
  REQUIRE(in.good());
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO("regenerate it: build/src/rlbus-broker --print-reference > docs/configuration.md");
  CHECK(page == out);
}

// --log-format json: every line is one JSON object (ts, level, msg), and a line about a peer
// or a task names it in fields of its own.
TEST_CASE("JSON log lines name the task and the peers they are about", "[binary]") {
  child broker(broker_bin(), {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                              "--log-format", "json", "--log-level", "debug"});
  const auto line = broker.wait_for_line("rlbus-broker listening", 10s);
  INFO(broker.output());
  REQUIRE(line);
  const auto from = line->find("router=") + 7;
  const auto router = line->substr(from, line->find(' ', from) - from);
  {
    coordinator_options co;
    co.endpoint = router;
    co.id = "coord-json";
    coordinator coord(co, coordinator_callbacks{});
    REQUIRE(coord.wait_for(connection_state::ready, 5s));
    task_spec spec;
    spec.task_id = "t-json";
    spec.kind = role::learner;  // no learner here: it times out in the queue
    spec.queue_timeout_ms = 50;
    REQUIRE(coord.submit(spec));
    REQUIRE(broker.wait_for_line("t-json failed", 10s));
  }
  broker.signal(SIGTERM);
  REQUIRE(broker.wait(10s));
  std::size_t lines = 0;
  bool joined = false, failed = false;
  std::istringstream out(broker.output());
  for (std::string text; std::getline(out, text);) {
    if (text.rfind("rlbus-broker listening", 0) == 0) continue;  // the one plain line
    INFO(text);
    const auto j = nlohmann::json::parse(text);  // throws: not JSON
    ++lines;
    CHECK(j.at("ts").get<std::string>().size() == 24);  // 2026-12-02T07:00:00.000Z
    CHECK(j.contains("level"));
    const auto msg = j.at("msg").get<std::string>();
    if (msg.find("coord-json (coordinator) joined") != std::string::npos) {
      joined = true;
      CHECK(j.at("coordinator") == "coord-json");
    }
    if (msg.find("task t-json failed") != std::string::npos) {
      failed = true;
      CHECK(j.at("task") == "t-json");
      CHECK(j.at("coordinator") == "coord-json");
    }
  }
  CHECK(lines >= 4);
  CHECK(joined);
  CHECK(failed);
}
