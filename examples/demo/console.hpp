// One place that writes the demo's output: whole lines, one writer at a time, flushed at
// once, because the coordinator's callback thread and the launcher's loop both report; and the
// time stamp its lines begin with.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace rlbus::demo {

/// How long the run has gone, as its output lines begin: "[   2.3s]".
inline std::string stamp(std::chrono::steady_clock::time_point started) {
  const std::chrono::duration<double> gone = std::chrono::steady_clock::now() - started;
  return fmt::format("[{:6.1f}s]", gone.count());
}

class console {
 public:
  explicit console(std::FILE* out = stdout) : out_(out) {}
  /// Writes `text` and a newline, flushed. Thread-safe.
  void line(std::string_view text) {
    std::lock_guard lock(mu_);
    std::fwrite(text.data(), 1, text.size(), out_);
    std::fputc('\n', out_);
    std::fflush(out_);
  }

 private:
  std::mutex mu_;
  std::FILE* out_;
};

}  // namespace rlbus::demo
