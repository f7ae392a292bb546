// Child processes of the demo's launcher: the broker, the learner and the collectors. Each
// runs in a process group of its own, so a terminal's Ctrl-C reaches only the launcher,
// which then stops them in order; and each dies with the launcher (PR_SET_PDEATHSIG), so
// none outlives it even when the launcher is killed outright.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace rlbus::demo {

class process {
 public:
  /// Starts `path` with `args` (argv[0] is `path`). With `capture_output` its stdout and
  /// stderr go to a pipe (output_fd()); otherwise it shares the launcher's. Throws
  /// std::runtime_error if the process cannot be created; an exec failure shows up as exit
  /// status 127. Call from the thread that lives as long as the child should: the death
  /// signal fires when the thread that forked it ends.
  process(std::string name, const std::string& path, const std::vector<std::string>& args,
          bool capture_output = false);
  /// Kills (SIGKILL) and reaps the process if it still runs.
  ~process();
  process(process&& other) noexcept;
  process& operator=(process&&) = delete;
  process(const process&) = delete;
  process& operator=(const process&) = delete;

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  /// The read end of the output pipe, -1 without capture_output. Owned by this object.
  [[nodiscard]] int output_fd() const noexcept { return out_fd_; }
  [[nodiscard]] bool running() const noexcept { return !status_; }

  void signal(int sig) const;
  /// Reaps the process if it has exited; its wait status, nullopt while it runs.
  std::optional<int> poll_exit();
  /// Waits up to `timeout` for the process to exit.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  /// SIGTERM, up to `grace` to exit, then SIGKILL; returns the wait status.
  int stop(std::chrono::milliseconds grace);

 private:
  std::string name_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::optional<int> status_;
};

/// "exited with status N" or "killed by SIGKILL" for a wait status.
std::string describe_exit(int wait_status);

/// The directory holding the running executable ("" if it cannot be told).
std::string own_directory();
/// The running executable's path (/proc/self/exe), for re-executing it as a worker.
std::string own_path();

}  // namespace rlbus::demo
