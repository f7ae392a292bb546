// A self-pipe that wakes a thread blocked in zmq::poll: another thread, or a signal handler,
// calls notify(); the owning loop polls read_fd() and calls drain(). notify() is
// async-signal-safe, so SIGTERM can stop the broker loop without any other machinery.
#pragma once

namespace rlbus::util {

class wake_pipe {
 public:
  /// Opens the pipe (non-blocking, close-on-exec). Throws std::system_error on failure.
  wake_pipe();
  ~wake_pipe();
  wake_pipe(const wake_pipe&) = delete;
  wake_pipe& operator=(const wake_pipe&) = delete;

  /// Wakes the poller. Thread-safe and async-signal-safe; never blocks.
  void notify() const noexcept;
  /// Empties the pipe; call from the polling thread after read_fd() became readable.
  void drain() const noexcept;
  [[nodiscard]] int read_fd() const noexcept { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
};

}  // namespace rlbus::util
