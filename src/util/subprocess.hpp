// Starting and supervising child processes: the one fork + exec behind the demo's launcher,
// the bench's broker and baseline servers and the tests' runs of the real binaries. Each of
// those wraps a subprocess with what it does with the output (a pipe, a log file).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace rlbus::util {

/// What the child gets between fork and exec. File descriptors stay the caller's: it
/// closes its copies after the start (open them close-on-exec; the child's 0/1/2 are not).
struct spawn_options {
  int stdin_fd = -1;   // becomes the child's standard input; -1: inherit
  int stdout_fd = -1;  // becomes its standard output; -1: inherit
  int stderr_fd = -1;  // becomes its standard error; -1: inherit
  /// Standard output and error both to a pipe instead, its read end subprocess::output_fd().
  bool capture_output = false;
  /// A process group of its own, so a terminal's Ctrl-C reaches only the parent.
  bool new_process_group = false;
  /// PR_SET_PDEATHSIG: the signal the child gets when the thread that started it ends
  /// (0: none). Start such a child from the thread that lives as long as it should.
  int death_signal = 0;
  /// CPUs to pin the child to before exec (empty: leave the scheduler free). A child the
  /// kernel refuses to pin exits with status 126.
  std::vector<int> cpus;
  /// Empties the signal mask and restores SIGPIPE, SIGINT and SIGTERM to their defaults: a
  /// parent may block or ignore them, and exec keeps both.
  bool reset_signals = false;
};

/// A child process, killed (SIGKILL) and reaped on destruction if it still runs. Wait
/// statuses are the raw ones of waitpid; exit_code() and describe_exit() read them.
class subprocess {
 public:
  /// Executes argv[0] with `argv`. Throws std::system_error when the process cannot be
  /// created; a failed exec shows up as exit status 127 (with a line on its stderr).
  subprocess(std::vector<std::string> argv, const spawn_options& options);
  /// Executes `path` with `args` (argv[0] is `path`).
  subprocess(const std::string& path, const std::vector<std::string>& args,
             const spawn_options& options);
  ~subprocess();
  subprocess(subprocess&& other) noexcept;
  subprocess& operator=(subprocess&&) = delete;
  subprocess(const subprocess&) = delete;
  subprocess& operator=(const subprocess&) = delete;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool running() const noexcept { return pid_ > 0 && !status_; }
  /// The read end of the output pipe, -1 without capture_output. Owned by this object.
  [[nodiscard]] int output_fd() const noexcept { return out_fd_; }

  /// Sends `sig` unless the process has been reaped (its pid may be another's by then).
  void signal(int sig) const;
  /// Reaps the process if it has exited; its wait status, nullopt while it runs.
  std::optional<int> poll_exit();
  /// Waits up to `timeout` for the process to exit.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  /// SIGTERM, up to `grace` to exit, then SIGKILL; returns the wait status. Idempotent.
  int stop(std::chrono::milliseconds grace);

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::optional<int> status_;
};

/// The exit status for a wait status, 128 + the signal when a signal ended the process.
int exit_code(int wait_status);

/// "exited with status N" or "killed by SIGKILL" for a wait status.
std::string describe_exit(int wait_status);

/// The running executable's path (/proc/self/exe), "" if it cannot be told.
std::string own_path();

}  // namespace rlbus::util
