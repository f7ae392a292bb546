// The lock that ties a broker to the life of one run. Every process of the run holds a shared
// flock on one file (a forked child shares its parent's; a process started otherwise takes
// its own); the kernel drops a process's hold however it ends, SIGKILL included. The broker
// watches the file: once it can take the lock exclusively, no process of the run is left.
#pragma once

#include <string>

namespace rlbus::util {

class run_lock_watch {
 public:
  /// Opens `path` (it must exist). Throws std::system_error naming the path when it cannot.
  explicit run_lock_watch(const std::string& path);
  ~run_lock_watch();
  run_lock_watch(const run_lock_watch&) = delete;
  run_lock_watch& operator=(const run_lock_watch&) = delete;

  /// True once no process holds the lock (this one then holds it exclusively, so a process
  /// that comes later cannot join a run whose broker is going). Never blocks.
  [[nodiscard]] bool released();

 private:
  int fd_ = -1;
  bool released_ = false;
};

}  // namespace rlbus::util
