// Child processes of the demo's launcher: the broker, the learner and the collectors. Each
// runs in a process group of its own, so a terminal's Ctrl-C reaches only the launcher,
// which then stops them in order; and each dies with the launcher (PR_SET_PDEATHSIG), so
// none outlives it even when the launcher is killed outright.
#pragma once

#include <string>
#include <vector>

#include "util/subprocess.hpp"

namespace rlbus::demo {

/// A util::subprocess with a name (pid(), output_fd(), signal(), poll_exit(), wait_exit(),
/// stop(): wait statuses), killed (SIGKILL) and reaped on destruction if it still runs.
class process : public util::subprocess {
 public:
  /// Starts `path` with `args` (argv[0] is `path`). With `capture_output` its stdout and
  /// stderr go to a pipe (output_fd()); otherwise it shares the launcher's. Throws
  /// std::runtime_error if the process cannot be created; an exec failure shows up as exit
  /// status 127. Call from the thread that lives as long as the child should: the death
  /// signal fires when the thread that forked it ends.
  process(std::string name, const std::string& path, const std::vector<std::string>& args,
          bool capture_output = false);

  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  std::string name_;
};

/// "exited with status N" or "killed by SIGKILL" for a wait status.
using util::describe_exit;

/// The directory holding the running executable ("" if it cannot be told).
std::string own_directory();
/// The running executable's path (/proc/self/exe), for re-executing it as a worker.
using util::own_path;

}  // namespace rlbus::demo
