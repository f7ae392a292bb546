// See group.hpp.
#include "group.hpp"

#include <signal.h>

#include <filesystem>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "cluster/local_etcd.hpp"
#include "util/free_port.hpp"

namespace rlbus::bench {

namespace {

constexpr auto start_timeout = std::chrono::seconds(30);

}  // namespace

std::string etcd_missing() {
  return cluster::local_etcd::available() ? "" : "etcd (apt-get install etcd-server)";
}

broker_group::broker_group(const settings& s, const std::string& tag,
                           const std::vector<std::string>& extra)
    : s_(s), dir_(fmt::format("{}/group-{}", s.log_dir, tag)), extra_(extra) {
  std::filesystem::create_directories(dir_);
  const int client = util::free_tcp_port(), peer = util::free_tcp_port();
  etcd_url_ = fmt::format("http://127.0.0.1:{}", client);
  const auto peer_url = fmt::format("http://127.0.0.1:{}", peer);
  etcd_ = std::make_unique<child_process>(
      std::vector<std::string>{cluster::local_etcd::find_binary(), "--data-dir",
                               fmt::format("{}/etcd", dir_), "--listen-client-urls", etcd_url_,
                               "--advertise-client-urls", etcd_url_, "--listen-peer-urls", peer_url,
                               "--initial-advertise-peer-urls", peer_url, "--initial-cluster",
                               fmt::format("default={}", peer_url),
                               // etcd grants no lease shorter than 1.5 election timeouts
                               // (rounded up to whole seconds): 500 ms lets a group ask for 1 s
                               "--heartbeat-interval", "50", "--election-timeout", "500"},
      log_file(s, "etcd"), s.cpus);
  etcd_->wait_for_line("ready to serve client requests", start_timeout);
  members_[0].name.assign(1, 'a');
  members_[1].name.assign(1, 'b');
  for (auto& m : members_) m.router = fmt::format("tcp://127.0.0.1:{}", util::free_tcp_port());
  start(members_[0]);
  members_[0].proc->wait_for_line("rlbus broker", start_timeout);
  start(members_[1]);
  members_[0].proc->wait_for_line("in sync now: a, b", start_timeout);
}

broker_group::~broker_group() = default;

void broker_group::start(member& m) {
  std::vector<std::string> argv{s_.broker_bin,
                                "--router",
                                m.router,
                                "--events",
                                "tcp://127.0.0.1:0",
                                "--advertise",
                                m.router,
                                "--cluster-etcd",
                                etcd_url_,
                                "--cluster-name",
                                "bench",
                                "--cluster-member",
                                m.name,
                                "--journal",
                                fmt::format("{}/journal-{}", dir_, m.name),
                                "--shutdown-linger",
                                "100",
                                "--log-level",
                                "info"};
  argv.insert(argv.end(), extra_.begin(), extra_.end());
  m.proc.reset();
  m.proc = std::make_unique<child_process>(argv, log_file(s_, fmt::format("broker-{}", m.name)),
                                           s_.cpus);
}

std::string broker_group::endpoints() const {
  return fmt::format("{},{}", members_[leader_].router, members_[1 - leader_].router);
}

std::string broker_group::leader_router() const {
  return members_[leader_].router;
}

void broker_group::kill_leader() {
  auto& m = members_[leader_];
  ::kill(m.proc->pid(), SIGKILL);
  (void)m.proc->stop(std::chrono::seconds(5));  // reaps it
  leader_ = 1 - leader_;
}

void broker_group::rejoin() {
  auto& back = members_[1 - leader_];
  start(back);
  // The new leader logs who is in sync (itself first) once the member holds its journal.
  members_[leader_].proc->wait_for_line(
      fmt::format("in sync now: {}, {}", members_[leader_].name, back.name), start_timeout);
}

}  // namespace rlbus::bench
