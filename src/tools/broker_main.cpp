// rlbus-broker: the broker binary. Flags -> config, signals -> request_stop(), errors at
// start-up -> a clear message and a non-zero exit code (2: usage or config, 1: cannot bind).
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include <pthread.h>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <zmq.hpp>

#include "broker/server.hpp"
#include "util/curve_keys.hpp"

namespace {

// Signals are taken by one thread of their own (sigwait), blocked everywhere else: the broker
// loop and libzmq's threads are never interrupted, and the handler may call anything.
// SIGINT/SIGTERM stop (drain, then at once), SIGHUP reloads the allowlist, SIGUSR1 (sent by
// main itself) ends the thread.
class signal_thread {
 public:
  signal_thread() {
    sigemptyset(&set_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&set_, sig);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any other thread exists
    signal(SIGPIPE, SIG_IGN);
  }
  void serve(rlbus::broker::server& server) {
    thread_ = std::thread([this, &server] {
      while (true) {
        int sig = 0;
        if (sigwait(&set_, &sig) != 0) continue;
        if (sig == SIGUSR1) return;
        if (sig == SIGHUP)
          server.request_reload();
        else
          server.request_stop();
      }
    });
  }
  ~signal_thread() { stop(); }
  /// Ends the thread; the server it was given may then go.
  void stop() {
    if (thread_.joinable()) {
      pthread_kill(thread_.native_handle(), SIGUSR1);
      thread_.join();
    }
  }

 private:
  sigset_t set_{};
  std::thread thread_;
};

// rlbus-broker keygen STEM: a fresh CURVE key pair in STEM.key (0600) and STEM.pub.
int keygen(const std::string& stem) {
  try {
    const auto pair = rlbus::util::make_curve_pair();
    rlbus::util::write_curve_pair(stem, pair);
    std::printf("wrote %s.key (secret, mode 0600) and %s.pub\npublic key: %s\n", stem.c_str(),
                stem.c_str(), pair.public_key.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlbus-broker keygen: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  constexpr std::uint32_t day_ms = 86'400'000;  // the longest time any setting may name
  rlbus::broker::config cfg;
  std::string log_level = "info";

  CLI::App app{
      "rlbus-broker: message bus for distributed reinforcement learning.\n"
      "Workers (collectors, learners) and coordinators connect to the ROUTER endpoint;\n"
      "events (workers joined/lost, broker heartbeat) are published on the events endpoint.\n"
      "Stops on SIGINT/SIGTERM with a drain: no new sessions or tasks, queued tasks are\n"
      "cancelled, running tasks get up to --drain-ms to end on their own (a second signal\n"
      "stops at once); then what is left is aborted, every peer is told DISCONNECT, exit 0.\n"
      "SIGHUP reads the allowlist again (so does a change of its file).\n"
      "Times are in milliseconds. `rlbus-broker keygen STEM` makes a CURVE key pair."};
  app.get_formatter()->column_width(34);
  app.add_option("--router", cfg.router_endpoint,
                 "ROUTER endpoint for peers (tcp://HOST:PORT, ipc://PATH; port 0 or * = any free)")
      ->capture_default_str();
  app.add_option("--events", cfg.events_endpoint, "PUB endpoint for events")->capture_default_str();
  app.add_option("--liveness", cfg.liveness,
                 "a peer silent for liveness x its heartbeat interval is expired")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--heartbeat-min", cfg.heartbeat_min_ms,
                 "smallest heartbeat interval (ms) a peer may use; faster requests are clamped")
      ->capture_default_str();
  app.add_option("--heartbeat-max", cfg.heartbeat_max_ms,
                 "largest heartbeat interval (ms) a peer may use")
      ->capture_default_str();
  app.add_option("--status-interval", cfg.status_interval_ms,
                 "period (ms) of the broker.heartbeat event (10..86400000)")
      ->capture_default_str()
      ->check(CLI::Range(10U, day_ms));
  app.add_option("--max-message", cfg.max_message,
                 "largest inbound frame in bytes; a peer sending more is disconnected")
      ->capture_default_str();
  app.add_option("--max-peers", cfg.max_peers,
                 "most sessions at once (1..10000000); more HELLOs get BUSY")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{10'000'000}));
  app.add_option("--max-faults", cfg.max_faults,
                 "bad messages a peer may send before it is disconnected (1..1000000)")
      ->capture_default_str()
      ->check(CLI::Range(1U, 1'000'000U));
  app.add_option("--shutdown-linger", cfg.shutdown_linger_ms,
                 "ms to let final DISCONNECTs leave at shutdown (0..86400000)")
      ->capture_default_str()
      ->check(CLI::Range(0U, day_ms));
  app.add_option("--drain-ms", cfg.drain_ms,
                 "on the first SIGINT/SIGTERM, ms that running tasks get to end on their own "
                 "before they are aborted (0 = stop at once)")
      ->capture_default_str()
      ->check(CLI::Range(0U, day_ms));

  // Task defaults (SPEC §12.7): a SUBMIT that names its own timeouts or attempts wins.
  const auto tasks = "Tasks";
  app.add_option("--max-queue", cfg.max_queue,
                 "most tasks waiting for a worker; a SUBMIT past it is refused (412 QUEUE_FULL)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{100'000'000}))
      ->group(tasks);
  app.add_option("--start-timeout", cfg.start_timeout_ms,
                 "ms a worker has to answer TASK_START with STARTED")
      ->capture_default_str()
      ->check(CLI::Range(1U, day_ms))
      ->group(tasks);
  app.add_option("--step-timeout", cfg.step_timeout_ms,
                 "longest ms a running task may go without progress from its worker")
      ->capture_default_str()
      ->check(CLI::Range(1U, day_ms))
      ->group(tasks);
  app.add_option("--close-timeout", cfg.close_timeout_ms,
                 "ms a worker has to answer TASK_CLOSE with its RESULT")
      ->capture_default_str()
      ->check(CLI::Range(1U, day_ms))
      ->group(tasks);
  app.add_option("--task-timeout", cfg.task_timeout_ms,
                 "longest ms one attempt of a task may take, start to result")
      ->capture_default_str()
      ->check(CLI::Range(1U, day_ms))
      ->group(tasks);
  app.add_option("--max-attempts", cfg.max_attempts,
                 "attempts a task gets before it fails (a lost worker or a timeout ends one)")
      ->capture_default_str()
      ->check(CLI::Range(1U, 1000U))
      ->group(tasks);
  app.add_option("--queue-timeout-ms", cfg.queue_timeout_ms,
                 "ms a task may wait in the queue for a worker, each time it is queued, before "
                 "it fails, when its SUBMIT does not say (0 = wait as long as it takes)")
      ->capture_default_str()
      ->check(CLI::Range(0U, day_ms))
      ->group(tasks);
  app.add_option("--quarantine-after", cfg.quarantine_after,
                 "attempts in a row a worker may end badly (failed, timed out, gone while "
                 "holding one) before it gets no task for a while (0 = never)")
      ->capture_default_str()
      ->check(CLI::Range(0U, 1000U))
      ->group(tasks);
  app.add_option("--quarantine-ms", cfg.quarantine_ms,
                 "ms a quarantined worker gets no task; doubled for each further quarantine in "
                 "a row, up to 8 times")
      ->capture_default_str()
      ->check(CLI::Range(1U, day_ms))
      ->group(tasks);
  app.add_option("--no-data-retry", cfg.no_data_retry_ms,
                 "ms a learner is told to wait (NO_DATA) before asking its coordinator again")
      ->capture_default_str()
      ->check(CLI::Range(0U, day_ms))
      ->group(tasks);
  app.add_option("--stream-ring", cfg.stream_ring,
                 "task events kept per coordinator for replay (at least 16)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{16}, std::size_t{100'000'000}))
      ->group(tasks);
  app.add_option("--stream-ring-bytes", cfg.stream_ring_bytes,
                 "bytes of task event bodies kept per coordinator for replay (at least 1024)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1024}, std::size_t{1} << 40U))
      ->group(tasks);
  auto* window =
      app.add_option("--stream-window", cfg.stream_window,
                     "most task events in flight, not yet acknowledged, to a coordinator that "
                     "acknowledges; 1 to half of --stream-ring (default: 1024, or half the ring "
                     "when that is smaller)")
          ->check(CLI::Range(std::size_t{1}, std::size_t{50'000'000}))
          ->group(tasks);
  app.add_option("--coordinator-grace", cfg.coordinator_grace_ms,
                 "ms the tasks and stream of a coordinator that vanished (expired, not said "
                 "DISCONNECT) are kept for a new process with its id to adopt (0 = cancel them "
                 "at once)")
      ->capture_default_str()
      ->check(CLI::Range(0U, day_ms))
      ->group(tasks);
  const auto* durability = "Durability";
  app.add_option("--journal", cfg.journal_path,
                 "file where the broker records the tasks, policies and stream positions it "
                 "accepted; started on the same file after a crash, it takes them up again "
                 "(default: none, everything is lost with the process)")
      ->group(durability);
  std::string fsync = std::string(to_string(cfg.journal_fsync));
  app.add_option("--journal-fsync", fsync,
                 "when journal writes are forced to disk: always (each one), batch (every 100 "
                 "ms) or none (a broker crash loses nothing, a machine crash may)")
      ->capture_default_str()
      ->check(CLI::IsMember({"always", "batch", "none"}))
      ->group(durability);
  const auto* security = "Security and limits";
  app.add_option("--curve-key", cfg.curve_key_path,
                 "the broker's CURVE key pair (a .key file from keygen): both sockets encrypt, "
                 "and only keys in --allowlist get in (default: plain, no CURVE)")
      ->group(security);
  app.add_option("--allowlist", cfg.allowlist_path,
                 "TOML file of the public keys let in, each with its roles and optional id "
                 "patterns; required with --curve-key; reloaded on SIGHUP or when it changes")
      ->group(security);
  app.add_flag("--insecure", cfg.insecure,
               "allow binding an address other machines can reach without CURVE (anyone who "
               "reaches it can join as any peer)")
      ->group(security);
  app.add_option("--max-connections", cfg.max_connections,
                 "most connections at once on both sockets; more are refused at the handshake")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{10'000'000}))
      ->group(security);
  app.add_option("--max-connections-per-address", cfg.max_connections_per_address,
                 "most connections at once from one source address")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{10'000'000}))
      ->group(security);
  app.add_option("--handshake-timeout", cfg.handshake_timeout_ms,
                 "ms a new connection has to finish the ZeroMQ handshake before it is dropped")
      ->capture_default_str()
      ->check(CLI::Range(100U, day_ms))
      ->group(security);
  app.add_option("--max-collectors", cfg.max_collectors,
                 "most collector sessions at once; more HELLOs get BUSY")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{10'000'000}))
      ->group(security);
  app.add_option("--max-learners", cfg.max_learners,
                 "most learner sessions at once; more HELLOs get BUSY")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{10'000'000}))
      ->group(security);
  app.add_option("--max-coordinators", cfg.max_coordinators,
                 "most coordinator sessions at once; more HELLOs get BUSY")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{10'000'000}))
      ->group(security);
  app.add_option("--max-tasks-per-coordinator", cfg.max_tasks_per_coordinator,
                 "most live tasks (queued or running) of one coordinator; a SUBMIT past it is "
                 "refused (416 TOO_MANY_TASKS)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{100'000'000}))
      ->group(security);
  std::string keygen_stem;
  auto* keygen_cmd = app.add_subcommand(
      "keygen",
      "write a new CURVE key pair: STEM.key (public and secret key, mode 0600; never "
      "overwritten) and STEM.pub (public key, for allowlists and peers), then exit");
  keygen_cmd->add_option("stem", keygen_stem, "path without extension, e.g. keys/broker")
      ->required();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (keygen_cmd->parsed()) return keygen(keygen_stem);
  // The window's default follows a small ring, so every ring size the flag allows works
  // without naming a window as well.
  if (window->count() == 0) cfg.stream_window = std::min<std::size_t>(1024, cfg.stream_ring / 2);
  cfg.journal_fsync = *rlbus::broker::parse_fsync_policy(fsync);  // checked by the flag

  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  signal_thread signals;  // first: every thread made later inherits the blocked signals
  try {
    zmq::context_t ctx(1);
    rlbus::broker::server server(ctx, cfg);
    signals.serve(server);
    struct stop_signals {  // destroyed before `server`
      signal_thread& s;
      ~stop_signals() { s.stop(); }
    } stop_first{signals};
    // One line for whoever started the broker to read the endpoints from (SPEC §1.4.1): a
    // port 0 or * is resolved to the one bound. Written once signals stop the broker cleanly.
    std::printf("rlbus-broker listening router=%s events=%s\n", server.router_endpoint().c_str(),
                server.events_endpoint().c_str());
    std::fflush(stdout);
    server.run();
    return 0;
  } catch (const std::invalid_argument& e) {
    spdlog::critical("bad configuration: {}", e.what());
    return 2;
  } catch (const zmq::error_t& e) {
    spdlog::critical("cannot start: {} (is another broker using the endpoint?)", e.what());
    return 1;
  } catch (const rlbus::broker::journal_error& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
}
