// The HTTP baseline: DI-engine's coordinator shape (a Flask worker, a `requests` coordinator
// that POSTs a task per step and waits for its result to be PUT back), run by
// bench/http_baseline.py as two child processes. The bench talks to the coordinator process
// by lines on its standard input and reads one JSON result line per command from its output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "process.hpp"

namespace rlbus::bench {

struct settings;

/// The worker and coordinator processes, started once per run. Stopped on destruction.
class http_baseline {
 public:
  struct latency_result {
    double median_us = 0;
    double p99_us = 0;
  };
  /// Starts both processes and waits until both serve. Throws std::runtime_error saying why
  /// not (no python, no script, flask or requests missing, a process that died).
  explicit http_baseline(const settings& s);
  /// `steps` task steps one at a time, the payload in the task. Throws on any failure.
  latency_result latency(std::size_t payload, int steps);
  /// `steps` task steps from `threads` concurrent coordinator threads, the payload in the
  /// results; steps per second. Throws on any failure.
  double throughput(std::size_t payload, int threads, std::uint64_t steps);
  [[nodiscard]] pid_t worker_pid() const { return worker_->pid(); }

 private:
  std::string command(const std::string& cmd, std::chrono::milliseconds timeout);
  std::unique_ptr<child_process> worker_, coordinator_;
  std::string worker_url_;
  int next_id_ = 0;
};

}  // namespace rlbus::bench
