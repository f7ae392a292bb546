// See child.hpp.
#include "support/child.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace rlbus::test {

child::child(const std::string& path, const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(path.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int rc = posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  fd_ = fds[0];
  if (rc != 0) {
    ::close(fd_);
    throw std::runtime_error("cannot start " + path);
  }
}

child::~child() {
  if (!status_) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  ::close(fd_);
}

bool child::read_some(std::chrono::milliseconds timeout) {
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
  char buf[4096];
  const auto n = ::read(fd_, buf, sizeof buf);
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

void child::signal(int sig) {
  ::kill(pid_, sig);
}

std::optional<int> child::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!status_) {
    int st = 0;
    const auto r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    read_some(std::chrono::milliseconds(5));  // keep the pipe drained
  }
  while (read_some(std::chrono::milliseconds(0))) {
  }
  return status_;
}

std::pair<int, std::string> run_to_end(const std::string& path,
                                       const std::vector<std::string>& args,
                                       std::chrono::milliseconds timeout) {
  child c(path, args);
  const auto st = c.wait(timeout);
  return {st.value_or(-1), c.output()};
}

}  // namespace rlbus::test
