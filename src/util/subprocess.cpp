// See subprocess.hpp. fork() + execv() rather than posix_spawn(): only a forked child can
// ask for PR_SET_PDEATHSIG, join a process group of its own and set its CPU affinity before
// it executes the program. Between fork and exec the child runs async-signal-safe calls only
// (the parent has threads by then): everything it needs is prepared before the fork.
#include "util/subprocess.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <thread>

#include <fmt/format.h>

namespace rlbus::util {

namespace {

constexpr auto poll_interval = std::chrono::milliseconds(2);

// In the child: makes `from` the descriptor `to`, which exec keeps open.
void redirect(int from, int to) noexcept {
  if (from < 0) return;
  if (from == to)
    ::fcntl(to, F_SETFD, 0);  // dup2 onto itself would leave close-on-exec set
  else
    ::dup2(from, to);
}

std::vector<std::string> command(const std::string& path, const std::vector<std::string>& args) {
  std::vector<std::string> argv{path};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

}  // namespace

subprocess::subprocess(std::vector<std::string> argv, const spawn_options& o) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const std::string failed =
      std::string(program_invocation_short_name) + ": cannot execute " + argv.at(0) + "\n";
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int c : o.cpus) CPU_SET(c, &set);
  const bool pin = !o.cpus.empty();
  int out[2] = {-1, -1};
  if (o.capture_output && ::pipe2(out, O_CLOEXEC) != 0)
    throw std::system_error(errno, std::generic_category(), "pipe for " + argv[0]);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (o.new_process_group) ::setpgid(0, 0);
    if (o.death_signal != 0) {
      ::prctl(PR_SET_PDEATHSIG, o.death_signal);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    }
    if (pin && ::sched_setaffinity(0, sizeof set, &set) != 0) ::_exit(126);
    if (o.reset_signals) {
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
    }
    redirect(o.stdin_fd, 0);
    redirect(o.capture_output ? out[1] : o.stdout_fd, 1);
    redirect(o.capture_output ? out[1] : o.stderr_fd, 2);
    ::execv(args[0], args.data());
    [[maybe_unused]] const auto n = ::write(2, failed.data(), failed.size());
    ::_exit(127);
  }
  const int fork_errno = errno;
  if (o.capture_output) ::close(out[1]);
  if (pid < 0) {
    if (o.capture_output) ::close(out[0]);
    throw std::system_error(fork_errno, std::generic_category(), "fork for " + argv[0]);
  }
  pid_ = pid;
  out_fd_ = out[0];
}

subprocess::subprocess(const std::string& path, const std::vector<std::string>& args,
                       const spawn_options& options)
    : subprocess(command(path, args), options) {}

subprocess::subprocess(subprocess&& other) noexcept
    : pid_(other.pid_), out_fd_(other.out_fd_), status_(other.status_) {
  other.pid_ = -1;
  other.out_fd_ = -1;
}

subprocess::~subprocess() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

void subprocess::signal(int sig) const {
  if (running()) ::kill(pid_, sig);
}

std::optional<int> subprocess::poll_exit() {
  if (running()) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) status_ = st;
  }
  return status_;
}

std::optional<int> subprocess::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!poll_exit() && pid_ > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(poll_interval);
  return status_;
}

int subprocess::stop(std::chrono::milliseconds grace) {
  signal(SIGTERM);
  if (const auto st = wait_exit(grace)) return *st;
  if (pid_ <= 0) return 0;
  signal(SIGKILL);
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  status_ = st;
  return st;
}

int exit_code(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
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

}  // namespace rlbus::util
