// fork + exec with the settings a supervised child needs. Between fork and exec the child
// runs only async-signal-safe calls (the launcher has threads by then): everything it needs
// is prepared before the fork.
#include "demo/processes.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace rlbus::demo {

process::process(std::string name, const std::string& path, const std::vector<std::string>& args,
                 bool capture_output)
    : name_(std::move(name)) {
  std::vector<std::string> argv_store{path};
  argv_store.insert(argv_store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_store) argv.push_back(a.data());
  argv.push_back(nullptr);

  int fds[2] = {-1, -1};
  if (capture_output && ::pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("cannot start {}: pipe: {}", name_, std::strerror(errno)));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    if (capture_output) {
      ::close(fds[0]);
      ::close(fds[1]);
    }
    throw std::runtime_error(fmt::format("cannot start {}: fork: {}", name_, std::strerror(errno)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
    // The launcher may block or ignore signals; exec keeps both, so start clean.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    if (capture_output) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
    }
    ::execv(argv[0], argv.data());
    static constexpr char msg[] = "rlbus-demo: exec failed\n";
    [[maybe_unused]] const auto n = ::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  pid_ = pid;
  if (capture_output) {
    ::close(fds[1]);
    out_fd_ = fds[0];
  }
}

process::process(process&& other) noexcept
    : name_(std::move(other.name_)),
      pid_(other.pid_),
      out_fd_(other.out_fd_),
      status_(other.status_) {
  other.pid_ = -1;
  other.out_fd_ = -1;
}

process::~process() {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

void process::signal(int sig) const {
  if (pid_ > 0 && !status_) ::kill(pid_, sig);
}

std::optional<int> process::poll_exit() {
  if (!status_ && pid_ > 0) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) status_ = st;
  }
  return status_;
}

std::optional<int> process::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!poll_exit() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return status_;
}

int process::stop(std::chrono::milliseconds grace) {
  signal(SIGTERM);
  if (const auto st = wait_exit(grace)) return *st;
  signal(SIGKILL);
  return wait_exit(std::chrono::seconds(5)).value_or(0);
}

std::string describe_exit(int st) {
  if (WIFEXITED(st)) return fmt::format("exited with status {}", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    const char* name = sigabbrev_np(WTERMSIG(st));
    return name != nullptr ? fmt::format("killed by SIG{}", name)
                           : fmt::format("killed by signal {}", WTERMSIG(st));
  }
  return fmt::format("ended (wait status {})", st);
}

std::string own_path() {
  char buf[4096];
  const auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

std::string own_directory() {
  const auto self = own_path();
  const auto slash = self.rfind('/');
  return slash == std::string::npos ? std::string() : self.substr(0, slash);
}

}  // namespace rlbus::demo
