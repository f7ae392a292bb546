// What the scenarios share: the run's settings, the processes in the middle of every path
// (the broker, the zmq proxy, the echo server: each a child process, started fresh for each
// group of rows), and the A B C A B C ... trial rotation.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "process.hpp"
#include "report.hpp"

namespace rlbus::bench {

struct settings {
  int trials = 5;
  int rounds = 2000;                 // latency: round trips per trial
  std::uint64_t messages = 200'000;  // throughput: events per trial
  std::uint64_t window = 10'000;     // throughput: most events in flight
  std::vector<std::size_t> payloads{64, 4096};
  std::vector<int> collectors{1, 4, 16};
  std::size_t data_payload = 64;  // throughput: DATA payload bytes
  // throughput: payload sizes of the large-payload rows (MB/s), after the collector rows
  std::vector<std::size_t> large_payloads{64 * 1024, 1024 * 1024};
  bool quick = false;               // --quick: the large-payload rows move less
  bool sdk = true;                  // also run the SDK rows
  bool http = true;                 // run the HTTP baseline (bench/http_baseline.py) if it can
  int http_rounds = 500;            // HTTP latency: task steps per trial
  std::uint64_t http_steps = 2000;  // HTTP throughput: task steps per trial
  std::string python = "/usr/bin/python3";
  std::string http_script;
  // scenario 3 (scale)
  std::vector<int> scale_workers{10, 100, 1000};  // idle workers per row
  std::uint32_t heartbeat_ms = 1000;              // the interval the idle workers ask for
  double idle_s = 5;                              // the idle window measured per trial
  std::uint32_t death_heartbeat_ms = 100;         // the victim's interval (death -> re-assign)

  cpu_list cpus;  // pin every process to these (empty: unpinned)
  std::string broker_bin;
  std::string self_bin;
  std::string log_dir;
  bool keep_logs = false;          // the log folder outlives the run (--keep-logs)
  std::uint64_t cost_base = 3000;  // cost: messages (and task steps) of the short run, N1
  // scenario 5 (journal)
  std::uint32_t journal_trial_ms = 2000;  // task lifecycles run for this long per trial
  // scenario 7 (takeover)
  int takeover_kills = 20;  // leaders killed (and, beside them, lone brokers restarted)
};

/// The middle of each path, as child processes: the real broker, and (optionally) the
/// zmq_proxy and echo baselines. Stopped on destruction.
class middle_boxes {
 public:
  /// `broker_args` are added to the broker's command line.
  middle_boxes(const settings& s, bool proxy, bool echo,
               const std::vector<std::string>& broker_args = {});
  std::string router;       // the broker's ROUTER endpoint
  std::string proxy_front;  // where the proxy's clients connect
  std::string proxy_back;   // where the proxy's far end connects
  std::string echo;         // the echo server's ROUTER
  [[nodiscard]] pid_t broker_pid() const { return broker_->pid(); }
  [[nodiscard]] pid_t proxy_pid() const { return proxy_ ? proxy_->pid() : -1; }

 private:
  std::unique_ptr<child_process> broker_, proxy_, echo_;
};

/// A fresh log file for a child process in the run's log folder.
std::string log_file(const settings& s, const std::string& name);

/// CPU time (user + system, every thread) a process has used so far, in nanoseconds.
std::uint64_t process_cpu_ns(pid_t pid);

/// Resident memory of a process (VmRSS) in KiB; 0 when it cannot be read.
std::uint64_t process_rss_kb(pid_t pid);

/// Microseconds between two steady_clock points.
inline double micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

/// "64 B", "4 KiB".
std::string size_label(std::size_t bytes);

/// One progress line on stderr ("latency 64 B: trial 2/5").
void fmt_progress(const std::string& label, int trial, int trials);

/// Runs every variant once as a warm-up (not recorded), then `trials` times in rotation,
/// so slow drift of a shared machine falls on all of them alike. Results by variant name.
template <class T>
std::map<std::string, std::vector<T>> interleave(
    int trials, const std::vector<std::pair<std::string, std::function<T(bool warmup)>>>& variants,
    const std::string& label) {
  std::map<std::string, std::vector<T>> out;
  for (const auto& [name, fn] : variants) (void)fn(true);
  for (int t = 0; t < trials; ++t) {
    fmt_progress(label, t + 1, trials);
    for (const auto& [name, fn] : variants) out[name].push_back(fn(false));
  }
  return out;
}

/// Reports on stderr that the HTTP baseline failed during `label` (its column stays empty
/// for that group; the rest of the run goes on).
void http_failed(const std::string& label, const std::string& why);

class http_baseline;

/// Scenario 1: a learner's data request through the broker and back, one at a time. With
/// `http`, DI-engine's HTTP shape runs in the same rotation.
std::vector<row> run_latency(const settings& s, http_baseline* http);
/// Scenario 2: collectors streaming DATA to one coordinator, pipelined with a window. With
/// `http`, DI-engine's HTTP shape runs in the same rotation.
std::vector<row> run_throughput(const settings& s, http_baseline* http);
/// Scenario 4: instructions of each middle process per message under valgrind's callgrind,
/// from two runs of N1 (`cost_base`) and N2 (`messages`, `rounds`) messages. Throws
/// std::runtime_error when a run fails.
std::vector<row> run_cost(const settings& s);
/// "" when valgrind and callgrind_annotate are on PATH, else which of them is missing.
std::string cost_tools_missing();

/// Scenario 3: idle heartbeating workers (broker CPU and memory per worker beside a bare
/// ROUTER answering the same heartbeats), and the time from a worker's death to its task's
/// re-assignment.
std::vector<row> run_scale(const settings& s);

/// Scenario 5: task lifecycles per second with the journal under each fsync policy, beside
/// the same broker without a journal.
std::vector<row> run_journal(const settings& s);
/// Scenario 6: task step latency and data events/s with CURVE on, beside plain.
std::vector<row> run_curve(const settings& s);
/// Scenario 7: from a leader's SIGKILL to the first task and the first coordinator event
/// from its successor, beside a lone broker restarted on its journal; and the task step
/// latency with a standby, beside the broker alone. Throws when etcd is not installed.
std::vector<row> run_takeover(const settings& s);

}  // namespace rlbus::bench
