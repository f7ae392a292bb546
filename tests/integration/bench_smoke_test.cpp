// Integration: runs of the bench harness, so it cannot rot unnoticed: it starts its
// processes, finishes with status 0, prints its table and writes a JSON report with every
// expected row. It never looks at a timing. [bench-smoke] is the default suite's, seconds
// long: one trial of each kind of row, the scale and journal scenarios, and the message
// without valgrind. [bench] is the bench suite's (meson test --setup bench --suite bench):
// `--quick` whole, the CURVE rows and the callgrind cost, a few minutes on a busy machine.
// When Debian's python3-flask and python3-requests are installed (scripts/setup.sh installs
// them), the HTTP baseline of `--quick` must have run too: an http series and ratio on every
// row that has one.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/local_etcd.hpp"
#include "support/child.hpp"
#include "support/support.hpp"

using namespace rlbus::test;

namespace {

std::string env(const char* name) {
  return binary_from_env(name);
}

// Whether the HTTP baseline can run here: the Python the bench uses imports flask and requests.
bool http_baseline_possible() {
  return std::system("/usr/bin/python3 -c 'import flask, requests' >/dev/null 2>&1") == 0;
}

// The JSON report a run wrote to `path`, parsed; the file is removed.
nlohmann::json take_report(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  auto report = nlohmann::json::parse(in, nullptr, false);
  std::remove(path.c_str());
  REQUIRE_FALSE(report.is_discarded());
  return report;
}

// What a run of `all` covers: the payload sizes of its latency rows, its collector counts and
// its large payloads, as the flags and the report name them.
struct shape {
  std::vector<std::string> args;
  int trials;
  bool http;
  std::vector<const char*> sizes, collectors, large;
};

// Runs `rlbus-bench all` with `s.args`; checks its table and that its report has every row of
// the shape and no other, each with a number per trial beside its baselines.
void check_all(const shape& s) {
  const auto json_path = "/tmp/rlbus-bench-smoke-" + std::to_string(::getpid()) + ".json";
  std::vector<std::string> args{"all",    "--quick", "--broker", env("RLBUS_BROKER_BIN"),
                                "--json", json_path};
  args.insert(args.end(), s.args.begin(), s.args.end());
  const auto [status, out] = run_to_end(env("RLBUS_BENCH_BIN"), args, std::chrono::seconds(90));
  INFO(out);
  REQUIRE(status == 0);
  CHECK_THAT(out, Catch::Contains("scenario") && Catch::Contains("r/proxy"));

  const auto report = take_report(json_path);
  CHECK(report.at("schema") == "rlbus-bench/1");
  CHECK(report.at("machine").at("nproc").get<int>() > 0);
  const int trials = report.at("settings").at("trials").get<int>();
  CHECK(trials == s.trials);
  const bool http = s.http;
  INFO("HTTP baseline expected: " << http);
  CHECK(report.at("settings").at("http").get<bool>() == http);
  if (http) CHECK_THAT(out, Catch::Contains("r/http"));

  std::set<std::string> seen;
  for (const auto& row : report.at("rows")) {
    const auto key = row.at("scenario").get<std::string>() + " | " +
                     row.at("variant").get<std::string>() + " | " +
                     row.at("metric").get<std::string>();
    INFO(key);
    seen.insert(key);
    for (const char* series : {"rlbus", "proxy", "direct", "http"}) {
      if (row.at(series).is_null()) continue;  // e.g. the direct path has no middle process
      CHECK(row.at(series).at("median").is_number());
      for (const auto& v : row.at(series).at("trials")) CHECK(v.is_number());
    }
    CHECK(row.at("rlbus").at("trials").size() == static_cast<std::size_t>(trials));
    CHECK(row.at("proxy").is_object());
    CHECK(row.at("ratio_proxy").is_number());
    // The HTTP baseline has a value beside each latency, events/s and items/s row (not beside
    // the middle process's CPU time, nor the large-payload rows' MB/s).
    const auto metric = row.at("metric").get<std::string>();
    if (http && metric.rfind("cpu", 0) != 0 && metric != "MB/s") {
      CHECK(row.at("http").is_object());
      CHECK(row.at("http").at("trials").size() == static_cast<std::size_t>(trials));
      CHECK(row.at("ratio_http").is_number());
    } else {
      CHECK(row.at("http").is_null());
      CHECK(row.at("ratio_http").is_null());
    }
    if (metric == "events/s" || metric == "items/s" || metric == "MB/s") {
      // Windowed far below the broker's queue: every event must arrive, in sequence.
      CHECK(row.at("lost") == 0);
      CHECK(row.at("gaps") == 0);
    }
  }
  std::set<std::string> expected;
  for (const char* size : s.sizes)
    for (const char* client : {"wire", "sdk"})
      for (const char* metric : {"median us", "p99 us"})
        expected.insert(std::string("latency | step ") + size + ", " + client + " | " + metric);
  for (const char* n : s.collectors) {
    for (const char* client : {"wire", "sdk"})
      for (const char* metric : {"events/s", "cpu us/ev"})
        expected.insert(std::string("throughput | ") + n + ", " + client + " | " + metric);
    for (const char* metric : {"items/s", "cpu us/item"})
      expected.insert(std::string("throughput | ") + n + ", sdk batched | " + metric);
  }
  for (const char* size : s.large)
    for (const char* client : {"wire", "sdk"})
      for (const char* metric : {"MB/s", "cpu us/ev"})
        expected.insert(std::string("throughput | ") + size + " payload, " + client + " | " +
                        metric);
  CHECK(seen == expected);
}

}  // namespace

// The default suite's smoke: one trial of one shape of each row, in seconds.
TEST_CASE("rlbus-bench all runs one trial of each kind of row and writes a report that parses",
          "[bench-smoke]") {
  check_all({{"--trials", "1", "--no-http", "--payloads", "64", "--collectors", "1",
              "--large-payloads", "65536"},
             1,
             false,
             {"64 B"},
             {"1 collector"},
             {"64 KiB"}});
}

// The bench suite's: `--quick` as it is, every row and the HTTP baseline (~25 s alone).
TEST_CASE("rlbus-bench --quick runs and writes a report that parses", "[bench]") {
  check_all({{},
             2,
             http_baseline_possible(),
             {"64 B", "4 KiB"},
             {"1 collector", "4 collectors", "16 collectors"},
             {"64 KiB", "1024 KiB"}});
}

TEST_CASE("rlbus-bench scale --quick runs and reports the scale rows", "[bench-smoke]") {
  const auto json_path = "/tmp/rlbus-bench-scale-smoke-" + std::to_string(::getpid()) + ".json";
  const auto [status, out] = run_to_end(env("RLBUS_BENCH_BIN"),
                                        {"scale", "--quick", "--workers", "10", "--trials", "1",
                                         "--broker", env("RLBUS_BROKER_BIN"), "--json", json_path},
                                        std::chrono::seconds(60));
  INFO(out);
  REQUIRE(status == 0);
  CHECK_THAT(out, Catch::Contains("idle 10 workers"));

  const auto report = take_report(json_path);
  std::set<std::string> seen;
  for (const auto& row : report.at("rows")) {
    REQUIRE(row.at("scenario") == "scale");
    const auto metric = row.at("metric").get<std::string>();
    INFO(row.at("variant").get<std::string>() << " | " << metric);
    seen.insert(row.at("variant").get<std::string>() + " | " + metric);
    CHECK(row.at("rlbus").at("trials").size() == 1);
    // Memory per worker can round to nothing for 10 workers; CPU and times cannot.
    if (metric.rfind("KB/", 0) == 0) {
      CHECK(row.at("rlbus").at("median").is_number());
      CHECK(row.at("direct").at("median").is_number());
    } else if (metric == "ms") {
      CHECK(row.at("rlbus").at("median").get<double>() > 0);
      CHECK(row.at("direct").is_null());
      CHECK(row.at("params").at("bound_ms").get<int>() > 0);
    } else {
      CHECK(row.at("rlbus").at("median").get<double>() > 0);
      CHECK(row.at("direct").at("median").get<double>() > 0);
      CHECK(row.at("params").at("heartbeats").at(0).get<int>() > 0);
    }
  }
  const std::set<std::string> expected{"idle 10 workers | KB/w join", "idle 10 workers | KB/worker",
                                       "idle 10 workers | CPU %", "idle 10 workers | us/hb",
                                       "death, bound 300 ms | ms"};
  CHECK(seen == expected);
}

TEST_CASE("rlbus-bench journal --quick reports each fsync policy beside no journal",
          "[bench-smoke]") {
  const auto json_path = "/tmp/rlbus-bench-journal-smoke-" + std::to_string(::getpid()) + ".json";
  const auto [status, out] = run_to_end(env("RLBUS_BENCH_BIN"),
                                        {"journal", "--quick", "--trials", "1", "--trial-ms", "100",
                                         "--broker", env("RLBUS_BROKER_BIN"), "--json", json_path},
                                        std::chrono::seconds(180));
  INFO(out);
  REQUIRE(status == 0);
  const auto report = take_report(json_path);
  std::set<std::string> policies;
  bool standby = false;  // a row with a standby in sync, when etcd is installed
  for (const auto& row : report.at("rows")) {
    REQUIRE(row.at("scenario") == "journal");
    standby = standby || row.at("params").value("standby", false);
    CHECK(row.at("metric") == "tasks/s");
    CHECK(row.at("rlbus").at("median").get<double>() > 0);
    CHECK(row.at("direct").at("median").get<double>() > 0);
    CHECK(row.at("lost").get<int>() == 0);
    policies.insert(row.at("params").at("fsync").get<std::string>());
  }
  CHECK(policies == std::set<std::string>{"none", "batch", "always"});
  CHECK(standby == (::access("/usr/bin/etcd", X_OK) == 0));
}

TEST_CASE("rlbus-bench takeover --quick times a leader's SIGKILL beside a restart",
          "[bench-smoke]") {
  if (!rlbus::cluster::local_etcd::available()) {
    WARN("skipped: etcd is not installed (apt-get install etcd-server)");
    return;
  }
  const auto json_path = "/tmp/rlbus-bench-takeover-smoke-" + std::to_string(::getpid()) + ".json";
  const auto [status, out] =
      run_to_end(env("RLBUS_BENCH_BIN"),
                 {"takeover", "--quick", "--kills", "1", "--trials", "1", "--rounds", "20",
                  "--broker", env("RLBUS_BROKER_BIN"), "--json", json_path},
                 std::chrono::seconds(180));
  INFO(out);
  REQUIRE(status == 0);
  const auto report = take_report(json_path);
  std::set<std::string> metrics;
  std::set<int> leases;
  for (const auto& row : report.at("rows")) {
    REQUIRE(row.at("scenario") == "takeover");
    metrics.insert(row.at("metric").get<std::string>());
    if (row.at("metric") == "ms") leases.insert(row.at("params").at("lease_ms").get<int>());
    // Each a time measured from an event: never zero, and a takeover is no instant.
    CHECK(row.at("rlbus").at("median").get<double>() > 0);
    CHECK(row.at("direct").at("median").get<double>() > 0);
  }
  CHECK(report.at("rows").size() == 5);  // two times for each lease, and the step
  CHECK(metrics == std::set<std::string>{"ms", "median us"});
  CHECK(leases == std::set<int>{1000, 2000});
}

TEST_CASE("rlbus-bench curve --quick reports CURVE's step latency and data events beside plain",
          "[bench]") {
  const auto json_path = "/tmp/rlbus-bench-curve-smoke-" + std::to_string(::getpid()) + ".json";
  const auto [status, out] = run_to_end(env("RLBUS_BENCH_BIN"),
                                        {"curve", "--quick", "--trials", "1", "--broker",
                                         env("RLBUS_BROKER_BIN"), "--json", json_path},
                                        std::chrono::seconds(60));
  INFO(out);
  REQUIRE(status == 0);
  const auto report = take_report(json_path);
  std::set<std::string> metrics;
  for (const auto& row : report.at("rows")) {
    REQUIRE(row.at("scenario") == "curve");
    CHECK(row.at("rlbus").at("median").get<double>() > 0);
    CHECK(row.at("direct").at("median").get<double>() > 0);
    metrics.insert(row.at("metric").get<std::string>());
  }
  CHECK(metrics == std::set<std::string>{"median us", "events/s"});
}

#ifndef RLBUS_SANITIZED_BUILD  // valgrind cannot run a sanitizer build of the broker
// Scenario 4 (`cost`) runs each middle process under valgrind: its quick form (a thousand
// messages, ~10-30 s) checks that every middle runs, exits and leaves a callgrind count the
// harness reads. The figures themselves are not judged, only that they are there.
TEST_CASE("rlbus-bench cost --quick counts instructions for the broker and both baselines",
          "[bench]") {
  {
    INFO("valgrind is not installed (scripts/setup.sh installs it)");
    REQUIRE(std::system("valgrind --version >/dev/null 2>&1") == 0);
  }
  const auto json_path = "/tmp/rlbus-bench-cost-smoke-" + std::to_string(::getpid()) + ".json";
  const auto [status, out] =
      run_to_end(env("RLBUS_BENCH_BIN"),
                 {"cost", "--quick", "--broker", env("RLBUS_BROKER_BIN"), "--json", json_path},
                 std::chrono::seconds(240));
  INFO(out);
  REQUIRE(status == 0);
  const auto report = take_report(json_path);
  std::set<std::string> seen;
  for (const auto& row : report.at("rows")) {
    REQUIRE(row.at("scenario") == "cost");
    seen.insert(row.at("metric").get<std::string>());
    INFO(row.dump());
    for (const char* who : {"rlbus", "proxy", "direct"})
      CHECK(row.at(who).at("median").get<double>() > 0);
    CHECK_FALSE(row.at("params").at("top_self").empty());
  }
  CHECK(seen == std::set<std::string>{"instr/msg", "instr/step"});
}
#endif

// Without valgrind, `cost` says what to install and exits 2.
TEST_CASE("rlbus-bench cost without valgrind says what to install", "[bench-smoke]") {
  const auto [status, out] =
      run_to_end("/usr/bin/env",
                 {"PATH=/nonexistent", env("RLBUS_BENCH_BIN"), "cost", "--broker",
                  env("RLBUS_BROKER_BIN"), "--json", "/nonexistent/cost.json"},
                 std::chrono::seconds(10));
  INFO(out);
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("apt-get install valgrind"));
}
