// One place that writes the demo's output: whole lines, one writer at a time, flushed at
// once, because the coordinator's callback thread and the launcher's loop both report.
#pragma once

#include <cstdio>
#include <mutex>
#include <string_view>

namespace rlbus::demo {

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
