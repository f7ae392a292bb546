// See process.hpp. The children are util::subprocess, which can ask for PR_SET_PDEATHSIG and
// set their CPU affinity before they execute the program.
#include "process.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace rlbus::bench {

cpu_list parse_cpus(const std::string& text) {
  cpu_list out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const auto dash = part.find('-');
    try {
      std::size_t used = 0;
      const int lo = std::stoi(part.substr(0, dash), &used);
      if (used != part.substr(0, dash).size()) throw std::invalid_argument(part);
      const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) throw std::invalid_argument(part);
      for (int c = lo; c <= hi; ++c) out.push_back(c);
    } catch (const std::logic_error&) {
      throw std::invalid_argument("bad CPU list '" + text + "' (use e.g. 0 or 0,1 or 0-1)");
    }
  }
  if (out.empty()) throw std::invalid_argument("empty CPU list");
  return out;
}

void pin_self(const cpu_list& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int c : cpus) CPU_SET(c, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0)
    throw std::runtime_error(std::string("sched_setaffinity: ") + std::strerror(errno));
}

std::uint64_t raise_fd_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return lim.rlim_cur;
}

std::string self_path() {
  auto path = util::own_path();
  if (path.empty()) throw std::runtime_error("cannot resolve /proc/self/exe");
  return path;
}

namespace {

// Starts the child with its output appended to `log_path`; `stdin_fd` gets the bench's end of
// its standard input (with_stdin).
util::subprocess start(std::vector<std::string> argv, const std::string& log_path,
                       const cpu_list& cpus, bool with_stdin, int& stdin_fd) {
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("cannot create " + log_path);
  // A socket pair rather than a pipe: send(MSG_NOSIGNAL) to a dead child fails instead of
  // raising SIGPIPE in the bench. Both ends close on exec; the child gets its end as fd 0.
  int in_pair[2] = {-1, -1};
  if (with_stdin && ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_pair) != 0) {
    ::close(log_fd);
    throw std::runtime_error("socketpair failed: " + std::string(std::strerror(errno)));
  }
  util::spawn_options o;
  o.stdin_fd = in_pair[1];
  o.stdout_fd = log_fd;
  o.stderr_fd = log_fd;
  o.death_signal = SIGKILL;  // dies with the bench's main thread
  o.cpus = cpus;
  const auto close_child_ends = [&] {
    ::close(log_fd);
    if (in_pair[1] >= 0) ::close(in_pair[1]);
  };
  try {
    util::subprocess proc(std::move(argv), o);
    close_child_ends();
    stdin_fd = in_pair[0];
    return proc;
  } catch (...) {
    close_child_ends();
    if (in_pair[0] >= 0) ::close(in_pair[0]);
    throw;
  }
}

}  // namespace

child_process::child_process(std::vector<std::string> argv, std::string log_path,
                             const cpu_list& cpus, bool with_stdin)
    : name_(argv.at(0)),
      log_path_(std::move(log_path)),
      proc_(start(std::move(argv), log_path_, cpus, with_stdin, stdin_fd_)) {}

child_process::~child_process() {
  stop();
}

bool child_process::send_line(const std::string& line) {
  if (stdin_fd_ < 0) return false;
  const std::string text = line + "\n";
  std::size_t sent = 0;
  while (sent < text.size()) {
    const auto n = ::send(stdin_fd_, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

int child_process::stop(std::chrono::milliseconds grace) {
  if (stdin_fd_ >= 0) {
    ::close(stdin_fd_);
    stdin_fd_ = -1;
  }
  return util::exit_code(proc_.stop(grace));
}

std::string child_process::log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string child_process::wait_for_line(const std::string& needle,
                                         std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::stringstream ss(log());
    std::string line;
    while (std::getline(ss, line))
      if (line.find(needle) != std::string::npos) return line;
    if (const auto st = proc_.poll_exit())
      throw std::runtime_error(name_ + " exited with status " +
                               std::to_string(util::exit_code(*st)) + " before saying '" + needle +
                               "':\n" + log());
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error(name_ + " did not say '" + needle + "' in time:\n" + log());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string word_after(const std::string& line, const std::string& key) {
  const auto at = line.find(key + " ");
  if (at == std::string::npos) return "";
  const auto from = at + key.size() + 1;
  const auto end = line.find(' ', from);
  return line.substr(from, end == std::string::npos ? std::string::npos : end - from);
}

}  // namespace rlbus::bench
