// See local_etcd.hpp.
#include "cluster/local_etcd.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "cluster/etcd.hpp"
#include "util/free_port.hpp"

namespace rlbus::cluster {

std::string local_etcd::find_binary() {
  const char* env_path = std::getenv("PATH");
  std::string path = env_path != nullptr ? env_path : "";
  path += ":/usr/bin";
  std::size_t from = 0;
  while (from <= path.size()) {
    auto to = path.find(':', from);
    if (to == std::string::npos) to = path.size();
    if (to > from) {
      auto candidate = path.substr(from, to - from) + "/etcd";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    from = to + 1;
  }
  return {};
}

local_etcd::local_etcd(std::chrono::seconds start_timeout, int death_signal)
    : binary_(find_binary()), start_timeout_(start_timeout), death_signal_(death_signal) {
  if (binary_.empty())
    throw std::runtime_error("etcd is not installed (apt-get install etcd-server)");
  std::string tmpl = (std::filesystem::temp_directory_path() / "rlbus-etcd-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  url_ = "http://127.0.0.1:" + std::to_string(util::free_tcp_port());
  peer_url_ = "http://127.0.0.1:" + std::to_string(util::free_tcp_port());
  try {
    start();
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    throw;
  }
}

local_etcd::~local_etcd() {
  proc_.reset();  // SIGKILL and reap
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void local_etcd::start() {
  const int log =
      ::open((dir_ + "/etcd.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log < 0) throw std::runtime_error("cannot write " + dir_ + "/etcd.log");
  util::spawn_options o;
  o.stdout_fd = log;
  o.stderr_fd = log;
  o.reset_signals = true;
  o.death_signal = death_signal_;
  // Short raft timers: a one-member etcd elects itself at once, and takes leases of 1 s.
  proc_ = std::make_unique<util::subprocess>(
      binary_,
      std::vector<std::string>{"--name", "rlbus-local", "--data-dir", dir_ + "/data",
                               "--listen-client-urls", url_, "--advertise-client-urls", url_,
                               "--listen-peer-urls", peer_url_, "--initial-advertise-peer-urls",
                               peer_url_, "--initial-cluster", "rlbus-local=" + peer_url_,
                               "--heartbeat-interval", "50", "--election-timeout", "500"},
      o);
  ::close(log);
  cluster::etcd_client c({url_}, std::chrono::milliseconds(1000));
  // (read below, after the try: clang-tidy 14's analyzer loses it there)
  // NOLINTNEXTLINE(clang-analyzer-deadcode.DeadStores)
  const auto deadline = std::chrono::steady_clock::now() + start_timeout_;
  while (true) {
    try {
      (void)c.get("/rlbus-local/ready");
      return;
    } catch (const std::exception&) {
    }
    if (!proc_->running() || proc_->poll_exit() || std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("etcd did not start:\n" + log_tail());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void local_etcd::kill() {
  if (!proc_) return;
  proc_->signal(SIGKILL);
  (void)proc_->wait_exit(std::chrono::seconds(30));
}

std::string local_etcd::log_tail() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream all;
  all << in.rdbuf();
  const auto s = all.str();
  return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
}

}  // namespace rlbus::cluster
