// See child.hpp.
#include "support/child.hpp"

#include <poll.h>
#include <unistd.h>

namespace rlbus::test {

child::child(const std::string& path, const std::vector<std::string>& args)
    : proc_(path, args, {.capture_output = true}) {}

bool child::read_some(std::chrono::milliseconds timeout) {
  pollfd p{proc_.output_fd(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
  char buf[4096];
  const auto n = ::read(proc_.output_fd(), buf, sizeof buf);
  if (n <= 0) return false;
  out_.append(buf, static_cast<std::size_t>(n));
  return true;
}

std::optional<std::string> child::wait_for_line(const std::string& needle,
                                                std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::size_t eol;
    while ((eol = out_.find('\n', scanned_)) != std::string::npos) {
      auto line = out_.substr(scanned_, eol - scanned_);
      scanned_ = eol + 1;
      if (line.find(needle) != std::string::npos) return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !read_some(left)) return std::nullopt;
  }
}

std::optional<int> child::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<int> st;
  while (!(st = proc_.poll_exit())) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    read_some(std::chrono::milliseconds(5));  // keep the pipe drained
  }
  while (read_some(std::chrono::milliseconds(0))) {
  }
  return util::exit_code(*st);
}

std::pair<int, std::string> run_to_end(const std::string& path,
                                       const std::vector<std::string>& args,
                                       std::chrono::milliseconds timeout) {
  child c(path, args);
  const auto st = c.wait(timeout);
  return {st.value_or(-1), c.output()};
}

}  // namespace rlbus::test
