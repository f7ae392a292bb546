// A child process for tests that drive the real binaries: spawn with arguments, read its
// combined stdout/stderr line by line, signal it, and wait for its exit with a deadline.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "util/subprocess.hpp"

namespace rlbus::test {

class child {
 public:
  /// Starts `path` with `args`; throws std::runtime_error if it cannot (a failed exec is
  /// exit status 127).
  child(const std::string& path, const std::vector<std::string>& args);
  ~child() = default;  // kills the process if it still runs
  child(const child&) = delete;
  child& operator=(const child&) = delete;

  /// Reads output until a line contains `needle`; returns that line (nullopt on timeout/EOF).
  std::optional<std::string> wait_for_line(const std::string& needle,
                                           std::chrono::milliseconds timeout);
  /// Everything read so far.
  [[nodiscard]] const std::string& output() const { return out_; }
  void signal(int sig) { proc_.signal(sig); }
  [[nodiscard]] pid_t pid() const noexcept { return proc_.pid(); }
  /// Exit status (or 128 + signal) within `timeout`, nullopt if it is still running.
  std::optional<int> wait(std::chrono::milliseconds timeout);

 private:
  bool read_some(std::chrono::milliseconds timeout);
  util::subprocess proc_;
  std::string out_;
  std::size_t scanned_ = 0;
};

/// Runs a command to completion (with a deadline) and returns {exit status, output}.
std::pair<int, std::string> run_to_end(
    const std::string& path, const std::vector<std::string>& args,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace rlbus::test
