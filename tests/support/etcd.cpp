// See etcd.hpp.
#include "support/etcd.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "cluster/etcd.hpp"

namespace rlbus::test {

namespace {

constexpr const char* etcd_binary = "/usr/bin/etcd";

// A port nothing listens on now (the kernel's pick for a socket bound to port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("no free port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

bool etcd_server::available() {
  return ::access(etcd_binary, X_OK) == 0;
}

etcd_server::etcd_server() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "rlbus-etcd-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  url_ = "http://127.0.0.1:" + std::to_string(free_port());
  peer_url_ = "http://127.0.0.1:" + std::to_string(free_port());
  start();
}

etcd_server::~etcd_server() {
  proc_.reset();  // SIGKILL and reap
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void etcd_server::start() {
  const int log =
      ::open((dir_ + "/etcd.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log < 0) throw std::runtime_error("cannot write " + dir_ + "/etcd.log");
  util::spawn_options o;
  o.stdout_fd = log;
  o.stderr_fd = log;
  o.reset_signals = true;
  // Short raft timers: a one-member etcd elects itself at once, and takes leases of 1 s.
  proc_ = std::make_unique<util::subprocess>(
      etcd_binary,
      std::vector<std::string>{"--name", "rlbus-test", "--data-dir", dir_ + "/data",
                               "--listen-client-urls", url_, "--advertise-client-urls", url_,
                               "--listen-peer-urls", peer_url_, "--initial-advertise-peer-urls",
                               peer_url_, "--initial-cluster", "rlbus-test=" + peer_url_,
                               "--heartbeat-interval", "50", "--election-timeout", "500"},
      o);
  ::close(log);
  cluster::etcd_client c({url_}, std::chrono::milliseconds(1000));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    try {
      (void)c.get("/rlbus-test/ready");
      return;
    } catch (const std::exception&) {
    }
    if (!proc_->running() || proc_->poll_exit() || std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("etcd did not start:\n" + log_tail());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void etcd_server::kill() {
  if (!proc_) return;
  proc_->signal(SIGKILL);
  (void)proc_->wait_exit(std::chrono::seconds(30));
}

std::string etcd_server::log_tail() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream all;
  all << in.rdbuf();
  const auto s = all.str();
  return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
}

}  // namespace rlbus::test
