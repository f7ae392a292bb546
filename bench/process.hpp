// The processes a bench run starts: the real broker binary and the bench's own baseline
// servers (re-executed with a hidden subcommand), each a child that dies with the bench
// (PR_SET_PDEATHSIG), optionally pinned to CPUs, its output kept in a log file.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "util/subprocess.hpp"

namespace rlbus::bench {

/// CPUs to pin to (empty: leave the scheduler free).
using cpu_list = std::vector<int>;

/// Parses "0", "0,1" or "0-1"; throws std::invalid_argument on anything else.
cpu_list parse_cpus(const std::string& text);

/// Pins the calling thread (and every thread it starts afterwards) to `cpus`. Throws
/// std::runtime_error when the kernel refuses.
void pin_self(const cpu_list& cpus);

/// Raises this process's soft RLIMIT_NOFILE to its hard limit (children inherit it) and
/// returns the resulting soft limit.
std::uint64_t raise_fd_limit();

/// This executable's path (/proc/self/exe resolved).
std::string self_path();

class child_process {
 public:
  /// Forks and executes argv[0] with `argv`, stdout and stderr appended to `log_path`,
  /// pinned to `cpus` when not empty. The child gets SIGKILL if the bench's main thread
  /// dies, so call this from the main thread only. Throws std::runtime_error.
  /// With `with_stdin`, the child's standard input is a socket the bench writes lines to
  /// (send_line); otherwise it inherits the bench's.
  child_process(std::vector<std::string> argv, std::string log_path, const cpu_list& cpus,
                bool with_stdin = false);
  /// stop(). The log file stays (the bench removes its log folder after a clean run).
  ~child_process();
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  /// Waits until a line of the log contains `needle` and returns it. Throws
  /// std::runtime_error (with the log) when the child exits or `timeout` passes first.
  std::string wait_for_line(const std::string& needle, std::chrono::milliseconds timeout);
  /// SIGTERM, up to `grace` to exit, then SIGKILL. Idempotent. Returns the exit status
  /// (128 + signal when killed). A child under valgrind needs far longer than 3 s: it writes
  /// its profile only after the program has shut down, at valgrind's speed.
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(3));
  /// Writes `line` and a newline to the child's standard input (with_stdin only). Returns
  /// false when the child is gone or has no such input (never raises SIGPIPE).
  bool send_line(const std::string& line);
  [[nodiscard]] pid_t pid() const noexcept { return proc_.pid(); }
  [[nodiscard]] const std::string& log_path() const noexcept { return log_path_; }
  /// Everything the child wrote so far.
  [[nodiscard]] std::string log() const;

 private:
  std::string name_;
  std::string log_path_;
  int stdin_fd_ = -1;  // the bench's end of the child's standard input (set as proc_ starts)
  util::subprocess proc_;
};

/// The word after "`key` " in `line` (e.g. the endpoint after "router "); "" when absent.
std::string word_after(const std::string& line, const std::string& key);

}  // namespace rlbus::bench
