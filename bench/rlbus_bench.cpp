// rlbus-bench: measures rlbus beside bare ZeroMQ in one run on one machine and reports
// medians and ratios, as a fixed-format table (stdout) and JSON (bench/results/latest.json).
// It starts what it needs: the real rlbus-broker binary, and itself again (hidden
// subcommands `proxy` and `echo`) for the baselines' middle processes. See bench/README.md.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "baselines.hpp"
#include "bus_rows.hpp"
#include "http.hpp"
#include "process.hpp"
#include "report.hpp"
#include "scenario.hpp"

#ifndef RLBUS_SOURCE_DIR
#define RLBUS_SOURCE_DIR ""
#endif

namespace {

using namespace rlbus::bench;

template <class T>
std::vector<T> parse_list(const std::string& text, const char* what) {
  std::vector<T> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      const auto v = std::stoll(item, &used);
      if (used != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(static_cast<T>(v));
    } catch (const std::logic_error&) {
      throw std::invalid_argument(std::string("bad ") + what + " list '" + text + "'");
    }
  }
  if (out.empty()) throw std::invalid_argument(std::string("empty ") + what + " list");
  return out;
}

// --broker, else $RLBUS_BROKER_BIN, else the broker built beside this binary.
std::string find_broker(const std::string& flag, const std::string& self) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("RLBUS_BROKER_BIN"); env != nullptr && *env != '\0') return env;
  const auto built =
      std::filesystem::path(self).parent_path().parent_path() / "src" / "rlbus-broker";
  return built.lexically_normal().string();
}

// --http-script, else $RLBUS_BENCH_HTTP_SCRIPT, else bench/http_baseline.py in the source tree.
std::string find_http_script(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("RLBUS_BENCH_HTTP_SCRIPT"); env != nullptr && *env != '\0')
    return env;
  return std::string(RLBUS_SOURCE_DIR) + "/bench/http_baseline.py";
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// `rlbus-bench python [ARGS]` and `rlbus-bench bus [ARGS]`: rows that come from a script of
// bench/ (python_bench.py: the Python SDK's; bus_baselines.py: the topic bus's beside Redis
// and pyzmq), which needs the Python package and runs this binary itself for its C++ rows.
// ARGS go to it unchanged; it is told where this build is.
int run_script_rows(const std::string& python, const std::string& script,
                    const std::vector<std::string>& args) {
  const auto build = std::filesystem::path(self_path()).parent_path().parent_path();
  std::vector<std::string> words = {python, std::string(RLBUS_SOURCE_DIR) + "/bench/" + script,
                                    "--build", build.lexically_normal().string()};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execv(python.c_str(), argv.data());
  std::fprintf(stderr, "rlbus-bench: cannot run %s: %s\n", python.c_str(), std::strerror(errno));
  return 1;
}

// bench/plot.py JSON DIR: PNGs with gnuplot (or matplotlib). Returns its exit status.
int draw_plots(const std::string& python, const std::string& json_path, const std::string& dir) {
  const auto script = std::string(RLBUS_SOURCE_DIR) + "/bench/plot.py";
  const auto cmd = shell_quoted(python) + " " + shell_quoted(script) + " " +
                   shell_quoted(json_path) + " " + shell_quoted(dir) + " 1>&2";
  const int st = std::system(cmd.c_str());
  return st == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Everything after `python` or `bus` belongs to the script, --help included.
  if (argc >= 2 && (std::string(argv[1]) == "python" || std::string(argv[1]) == "bus"))
    return run_script_rows("/usr/bin/python3",
                           std::string(argv[1]) == "bus" ? "bus_baselines.py" : "python_bench.py",
                           std::vector<std::string>(argv + 2, argv + argc));
  CLI::App app{
      "rlbus-bench: rlbus beside bare ZeroMQ, in one run on one machine.\n"
      "Starts the real broker and its baselines (a zmq_proxy, an echo server, and DI-engine's\n"
      "HTTP request-per-task shape in Python) as child processes, interleaves their trials,\n"
      "and prints medians and rlbus/baseline ratios.\n"
      "Scenarios: latency (a learner's data request through the broker and back) and\n"
      "throughput (collectors streaming data events to one coordinator); on their own,\n"
      "scale (idle heartbeating workers; a worker's death to its task's re-assignment),\n"
      "cost (instructions per message under valgrind's callgrind), journal (task\n"
      "lifecycles per second with the journal under each fsync policy), curve (task step\n"
      "latency and data events/s with CURVE on, beside plain) and takeover (a group's leader\n"
      "SIGKILLed: time to its successor's first task and event, beside a restart)."};
  app.get_formatter()->column_width(30);
  app.fallthrough();
  app.require_subcommand(0, 1);

  settings s;
  bool quick = false;
  bool pin = false;
  std::string cpus = "0";
  std::string json_path = "bench/results/latest.json";
  std::string broker_flag;
  std::string payloads = "64,4096";
  std::string collectors = "1,4,16";
  std::string large_payloads = "65536,1048576";
  bool no_sdk = false;
  bool no_http = false;
  std::string http_script_flag;
  std::string plot_dir;
  bool keep_logs = false;
  bool verbose = false;
  app.add_option("--trials", s.trials, "trials per variant (rotated A B C A B C ...)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--rounds", s.rounds, "latency: round trips per trial")
      ->capture_default_str()
      ->check(CLI::Range(1, 10'000'000));
  app.add_option("--messages", s.messages, "throughput: events per trial")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000'000));
  app.add_option("--window", s.window,
                 "throughput: most events sent and not yet received (the broker queues 100000)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000'000));
  app.add_option("--payloads", payloads, "latency: payload sizes in bytes")->capture_default_str();
  app.add_option("--collectors", collectors, "throughput: collector counts")->capture_default_str();
  app.add_option("--large-payloads", large_payloads,
                 "throughput: payload sizes (bytes, at most 1048576) of the MB/s rows; 0: none")
      ->capture_default_str();
  app.add_option("--data-payload", s.data_payload, "throughput: DATA payload bytes")
      ->capture_default_str()
      ->check(CLI::Range(0, 1'000'000));
  app.add_option("--cost-base", s.cost_base,
                 "cost: messages and task steps of the short run (N1), subtracted from the long "
                 "run's (--messages, --rounds)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000'000));
  app.add_flag("--quick", quick,
               "a tiny run (2 trials, 50 round trips, 2000 events, 10/32 HTTP steps, scale: 1 s "
               "idle) that checks the harness, not the numbers");
  app.add_flag("--pin", pin, "pin the bench and every child process to --cpus");
  app.add_option("--cpus", cpus, "CPUs for --pin (e.g. 0, 0-1)")->capture_default_str();
  app.add_flag("--no-sdk", no_sdk, "skip the SDK rows");
  app.add_flag("--no-http", no_http, "skip the HTTP baseline (Flask + requests)");
  app.add_option("--http-rounds", s.http_rounds, "HTTP baseline latency: task steps per trial")
      ->capture_default_str()
      ->check(CLI::Range(1, 10'000'000));
  app.add_option("--http-steps", s.http_steps, "HTTP baseline throughput: task steps per trial")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000'000));
  app.add_option("--python", s.python, "the Python for the HTTP baseline (Debian's, with flask)")
      ->capture_default_str();
  app.add_option("--http-script", http_script_flag,
                 "bench/http_baseline.py (default: $RLBUS_BENCH_HTTP_SCRIPT, else the source "
                 "tree's)");
  app.add_option("--plot", plot_dir,
                 "also draw PNG plots of the report into DIR (bench/plot.py: gnuplot, else "
                 "matplotlib)");
  app.add_flag("--verbose", verbose,
               "show the SDK's log (reconnects, aborted tasks at teardown) on stderr");
  app.add_flag("--keep-logs", keep_logs,
               "keep the children's logs (broker, proxy, echo) in /tmp/rlbus-bench-*");
  app.add_option("--json", json_path, "where to write the JSON report")->capture_default_str();
  app.add_option("--broker", broker_flag,
                 "the rlbus-broker binary (default: $RLBUS_BROKER_BIN, else ../src/rlbus-broker "
                 "beside this binary)");

  auto* all = app.add_subcommand("all", "latency and throughput (the default; not scale)");
  auto* latency = app.add_subcommand("latency", "scenario 1: task step latency");
  auto* throughput = app.add_subcommand("throughput", "scenario 2: pipelined throughput");
  auto* scale = app.add_subcommand(
      "scale",
      "scenario 3: idle heartbeating workers beside a bare ROUTER; death to re-assignment");
  std::string scale_workers = "10,100,1000";
  scale->add_option("--workers", scale_workers, "idle worker counts (up to 100000)")
      ->capture_default_str();
  scale->add_option("--heartbeat-ms", s.heartbeat_ms, "the heartbeat interval the workers ask for")
      ->capture_default_str()
      ->check(CLI::Range(10, 600'000));
  scale->add_option("--idle-s", s.idle_s, "seconds of idle measurement per trial")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  scale
      ->add_option("--death-heartbeat-ms", s.death_heartbeat_ms,
                   "the victim's heartbeat interval when timing death to re-assignment")
      ->capture_default_str()
      ->check(CLI::Range(10, 60'000));
  swarm_options swarm;
  auto* swarm_cmd = app.add_subcommand("swarm", "scale: many idle heartbeating workers");
  swarm_cmd->group("");
  swarm_cmd->add_option("--connect", swarm.endpoint)->required();
  swarm_cmd->add_option("--workers", swarm.workers)->check(CLI::Range(1, 1'000'000));
  swarm_cmd->add_option("--heartbeat-ms", swarm.heartbeat_ms)->check(CLI::Range(10, 600'000));
  swarm_cmd->add_option("--id-prefix", swarm.id_prefix);
  swarm_cmd->add_flag("--bare", swarm.bare);
  swarm_cmd->add_flag("--accept-tasks", swarm.accept_tasks);
  auto* cost = app.add_subcommand(
      "cost",
      "scenario 4: instructions per message of the broker, the proxy and the echo server "
      "under valgrind's callgrind (not part of `all`; defaults: 1 trial, --messages 13000, "
      "--rounds 5000, --window 1000)");
  std::string front = "tcp://127.0.0.1:*";
  std::string back = "tcp://127.0.0.1:*";
  std::string echo_bind = "tcp://127.0.0.1:*";
  auto* proxy_cmd = app.add_subcommand("proxy", "baseline: zmq_proxy ROUTER/DEALER");
  proxy_cmd->group("");  // hidden: the bench starts it itself
  proxy_cmd->add_option("--front", front);
  proxy_cmd->add_option("--back", back);
  auto* echo_cmd = app.add_subcommand("echo", "baseline: ROUTER echo server");
  echo_cmd->group("");
  echo_cmd->add_option("--bind", echo_bind);
  auto* journal = app.add_subcommand(
      "journal",
      "scenario 5: task lifecycles per second with the journal under each fsync policy, beside "
      "the broker without one");
  journal->add_option("--trial-ms", s.journal_trial_ms, "how long each trial runs tasks")
      ->capture_default_str()
      ->check(CLI::Range(50U, 600'000U));
  auto* curve = app.add_subcommand(
      "curve",
      "scenario 6: task step latency and data events/s with CURVE on, beside the same broker "
      "plain");
  auto* takeover = app.add_subcommand(
      "takeover",
      "scenario 7: a group's leader SIGKILLed under load: time to the first task and the first "
      "coordinator event from its successor, beside a lone broker restarted on its journal; "
      "task step latency with a standby, beside the broker alone (needs etcd-server)");
  takeover->add_option("--kills", s.takeover_kills, "leaders to kill (and lone brokers to restart)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  auto* python_cmd = app.add_subcommand(
      "python",
      "the Python SDK's rows (latency, data items/s) beside a bare pyzmq loop, the C++ SDK and "
      "HTTP; the rest of the line goes to bench/python_bench.py (e.g. `python --quick`, "
      "`python --help`)");
  (void)python_cmd;  // listed for --help; main() hands `python ...` to the script first
  auto* bus_cmd = app.add_subcommand(
      "bus",
      "the topic bus from Python and C++ beside DI-engine's Redis queue shape, bare pyzmq "
      "PUB/SUB and a pyzmq forwarder; the rest of the line goes to bench/bus_baselines.py "
      "(e.g. `bus --quick`, `bus --help`)");
  (void)bus_cmd;
  bus_rows_options bus_rows;
  auto* bus_rows_cmd = app.add_subcommand("bus-rows", "bus: the C++ SDK's rows");
  bus_rows_cmd->group("");  // hidden: bench/bus_baselines.py runs it
  bus_rows_cmd->add_option("--endpoint", bus_rows.endpoint)->required();
  bus_rows_cmd->add_option("--trials", bus_rows.trials)->check(CLI::Range(1, 1000));
  bus_rows_cmd->add_option("--round-trips", bus_rows.round_trips)->check(CLI::Range(1, 10'000'000));
  bus_rows_cmd->add_option("--count", bus_rows.count)->check(CLI::Range(4, 1'000'000'000));
  bus_rows_cmd->add_option("--mib-count", bus_rows.mib_count)->check(CLI::Range(1, 100'000));
  bus_rows_cmd->add_option("--big", bus_rows.big);
  bus_rows_cmd->add_option("--slow-rate", bus_rows.slow_rate)->check(CLI::Range(1.0, 1e7));
  bus_rows_cmd->add_option("--slow-seconds", bus_rows.slow_seconds)
      ->check(CLI::Range(0.01, 3600.0));
  bus_rows_cmd->add_option("--slow-size", bus_rows.slow_size)->check(CLI::Range(12, 1 << 30));
  (void)all;

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  try {
    if (proxy_cmd->parsed()) return run_proxy_server(front, back);
    if (echo_cmd->parsed()) return run_echo_server(echo_bind);
    if (swarm_cmd->parsed()) return run_swarm(swarm);
    if (bus_rows_cmd->parsed()) {
      spdlog::set_default_logger(spdlog::stderr_color_mt("rlbus"));
      spdlog::set_level(spdlog::level::err);
      return run_bus_rows(bus_rows);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlbus-bench: %s\n", e.what());
    return 1;
  }

  // The SDK logs through spdlog; keep stdout for the table. Its reconnects are counted in
  // the report anyway (sdk_reconnects), so its log is shown only on request.
  spdlog::set_default_logger(spdlog::stderr_color_mt("rlbus"));
  spdlog::set_level(verbose ? spdlog::level::info : spdlog::level::err);

  const bool run_scale_rows = scale->parsed();
  const bool run_cost_rows = cost->parsed();
  const bool run_journal_rows = journal->parsed();
  const bool run_curve_rows = curve->parsed();
  const bool run_takeover_rows = takeover->parsed();
  const bool on_its_own =
      run_scale_rows || run_cost_rows || run_journal_rows || run_curve_rows || run_takeover_rows;
  const bool run_latency_rows = !throughput->parsed() && !on_its_own;
  const bool run_throughput_rows = !latency->parsed() && !on_its_own;
  try {
    s.payloads = parse_list<std::size_t>(payloads, "payload");
    s.collectors = parse_list<int>(collectors, "collector");
    s.large_payloads.clear();
    if (large_payloads != "0")
      s.large_payloads = parse_list<std::size_t>(large_payloads, "payload");
    for (const auto p : s.large_payloads)
      if (p > 1'048'576)
        throw std::invalid_argument("a payload is at most 1048576 bytes, not " + std::to_string(p));
    s.scale_workers = parse_list<int>(scale_workers, "worker");
    for (const auto n : s.scale_workers)
      if (n > 100'000)
        throw std::invalid_argument("at most 100000 workers, not " + std::to_string(n));
    if (pin) s.cpus = parse_cpus(cpus);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "rlbus-bench: %s\n", e.what());
    return 2;
  }
  if (run_cost_rows) {
    // Callgrind counts the same instructions each time, so one trial says nearly all; its
    // runs are ~50x slower than native ones, so fewer messages than the throughput's.
    if (app.count("--trials") == 0) s.trials = 1;
    if (app.count("--messages") == 0) s.messages = quick ? 1200 : 13'000;
    if (app.count("--rounds") == 0) s.rounds = quick ? 600 : 5000;
    if (app.count("--cost-base") == 0 && quick) s.cost_base = 200;
    if (app.count("--window") == 0) s.window = 1000;
    if (const auto missing = cost_tools_missing(); !missing.empty()) {
      std::fprintf(stderr,
                   "rlbus-bench: cost runs the middle processes under valgrind's callgrind, "
                   "and cannot find %s on PATH: apt-get install valgrind\n",
                   missing.c_str());
      return 2;
    }
    if (s.messages <= s.cost_base || static_cast<std::uint64_t>(s.rounds) <= s.cost_base) {
      std::fprintf(stderr,
                   "rlbus-bench: cost needs --messages (%llu) and --rounds (%d) above "
                   "--cost-base (%llu)\n",
                   static_cast<unsigned long long>(s.messages), s.rounds,
                   static_cast<unsigned long long>(s.cost_base));
      return 2;
    }
  } else if (quick) {
    s.quick = true;
    if (app.count("--trials") == 0) s.trials = 2;
    if (app.count("--rounds") == 0) s.rounds = 50;
    if (app.count("--messages") == 0) s.messages = 2000;
    if (app.count("--http-rounds") == 0) s.http_rounds = 10;
    if (app.count("--http-steps") == 0) s.http_steps = 32;
    if (scale->count("--idle-s") == 0) s.idle_s = 1;
    if (journal->count("--trial-ms") == 0) s.journal_trial_ms = 300;
    if (takeover->count("--kills") == 0) s.takeover_kills = 2;
  } else if (run_scale_rows && app.count("--trials") == 0) {
    // A scale trial starts a broker and N workers from nothing: fewer trials by default.
    s.trials = 3;
  }
  s.sdk = !no_sdk;
  // Scale and cost have no HTTP baseline: do not start its processes for nothing.
  s.http = !no_http && !on_its_own;
  s.keep_logs = keep_logs;
  s.http_script = find_http_script(http_script_flag);

  s.self_bin = self_path();
  s.broker_bin = find_broker(broker_flag, s.self_bin);
  if (::access(s.broker_bin.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "rlbus-bench: no broker binary at %s (use --broker or RLBUS_BROKER_BIN)\n",
                 s.broker_bin.c_str());
    return 2;
  }
  if (!s.cpus.empty()) pin_self(s.cpus);  // before any thread: they all inherit it

  std::string dir_template = "/tmp/rlbus-bench-XXXXXX";
  if (::mkdtemp(dir_template.data()) == nullptr) {
    std::fprintf(stderr, "rlbus-bench: cannot create a log folder under /tmp\n");
    return 1;
  }
  s.log_dir = dir_template;

  // The HTTP baseline's two processes, started once for the whole run (from the main thread,
  // so they die with the bench). Missing python, flask or requests: said plainly, skipped.
  std::unique_ptr<http_baseline> http;
  if (s.http) {
    try {
      http = std::make_unique<http_baseline>(s);
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "rlbus-bench: skipping the HTTP baseline (no http column): %s\n"
                   "rlbus-bench: it needs %s with Debian's python3-flask and python3-requests "
                   "(apt-get install python3-flask python3-requests)\n",
                   e.what(), s.python.c_str());
      s.http = false;
    }
  }

  auto facts = collect_facts(RLBUS_SOURCE_DIR);
  for (int i = 0; i < argc; ++i) facts.command += (i ? " " : "") + std::string(argv[i]);
  for (const auto c : s.cpus) facts.pinned += (facts.pinned.empty() ? "" : ",") + std::to_string(c);
  facts.settings = {{"trials", s.trials},
                    {"rounds", s.rounds},
                    {"messages", s.messages},
                    {"window", s.window},
                    {"payloads", s.payloads},
                    {"collectors", s.collectors},
                    {"data_payload", s.data_payload},
                    {"sdk", s.sdk},
                    {"http", s.http},
                    {"http_rounds", s.http_rounds},
                    {"http_steps", s.http_steps},
                    {"quick", quick},
                    {"scale_workers", s.scale_workers},
                    {"heartbeat_ms", s.heartbeat_ms},
                    {"idle_s", s.idle_s},
                    {"death_heartbeat_ms", s.death_heartbeat_ms},
                    {"cost_base", s.cost_base},
                    {"journal_trial_ms", s.journal_trial_ms},
                    {"takeover_kills", s.takeover_kills},
                    {"broker", s.broker_bin}};

  std::vector<row> rows;
  try {
    if (run_latency_rows) {
      auto r = run_latency(s, http.get());
      rows.insert(rows.end(), r.begin(), r.end());
    }
    if (run_throughput_rows) {
      auto r = run_throughput(s, http.get());
      rows.insert(rows.end(), r.begin(), r.end());
    }
    if (run_scale_rows) {
      auto r = run_scale(s);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    if (run_cost_rows) {
      auto r = run_cost(s);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    if (run_journal_rows) {
      auto r = run_journal(s);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    if (run_curve_rows) {
      auto r = run_curve(s);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    if (run_takeover_rows) {
      auto r = run_takeover(s);
      rows.insert(rows.end(), r.begin(), r.end());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlbus-bench: %s\n(child logs kept in %s)\n", e.what(), s.log_dir.c_str());
    return 1;
  }
  facts.load_after = load_average();
  std::fputs(format_table(facts, rows).c_str(), stdout);
  std::fflush(stdout);
  try {
    write_json(json_path, to_json(facts, rows));
    std::fprintf(stderr, "rlbus-bench: wrote %s\n", json_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlbus-bench: %s\n", e.what());
    return 1;
  }
  int status = 0;
  if (!plot_dir.empty()) {
    status = draw_plots(s.python, json_path, plot_dir);
    if (status != 0)
      std::fprintf(stderr, "rlbus-bench: no plots drawn (see above); the report is in %s\n",
                   json_path.c_str());
  }
  if (keep_logs) {
    std::fprintf(stderr, "rlbus-bench: child logs in %s\n", s.log_dir.c_str());
  } else {
    std::error_code ec;
    std::filesystem::remove_all(s.log_dir, ec);
  }
  return status;
}
