// See scenario.hpp: starting the middle boxes and the small helpers the scenarios share.
#include "scenario.hpp"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace rlbus::bench {

std::string log_file(const settings& s, const std::string& name) {
  static std::atomic<int> n{0};
  return s.log_dir + "/" + fmt::format("{:02d}-{}.log", n++, name);
}

namespace {

constexpr std::chrono::seconds start_timeout{15};

}  // namespace

middle_boxes::middle_boxes(const settings& s, bool proxy, bool echo,
                           const std::vector<std::string>& broker_args) {
  // A heartbeat bound of 10 minutes lets the bench's raw peers stay silent between trials;
  // the broker logs at info so its start-up line names the port it bound.
  std::vector<std::string> argv{s.broker_bin,
                                "--router",
                                "tcp://127.0.0.1:0",
                                "--events",
                                "tcp://127.0.0.1:0",
                                "--heartbeat-max",
                                "600000",
                                "--shutdown-linger",
                                "100",
                                "--log-level",
                                "info"};
  argv.insert(argv.end(), broker_args.begin(), broker_args.end());
  broker_ = std::make_unique<child_process>(argv, log_file(s, "broker"), s.cpus);
  router = word_after(broker_->wait_for_line("rlbus broker", start_timeout), "router");
  if (proxy) {
    proxy_ = std::make_unique<child_process>(
        std::vector<std::string>{s.self_bin, "proxy", "--front", "tcp://127.0.0.1:*", "--back",
                                 "tcp://127.0.0.1:*"},
        log_file(s, "proxy"), s.cpus);
    const auto line = proxy_->wait_for_line("rlbus-bench proxy:", start_timeout);
    proxy_front = word_after(line, "front");
    proxy_back = word_after(line, "back");
  }
  if (echo) {
    echo_ = std::make_unique<child_process>(
        std::vector<std::string>{s.self_bin, "echo", "--bind", "tcp://127.0.0.1:*"},
        log_file(s, "echo"), s.cpus);
    this->echo = word_after(echo_->wait_for_line("rlbus-bench echo:", start_timeout), "router");
  }
}

std::uint64_t process_cpu_ns(pid_t pid) {
  // The first field of each thread's schedstat is its time on a CPU in nanoseconds; the
  // broker's and the proxy's ZeroMQ I/O threads are part of their cost.
  std::uint64_t total = 0;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(t.path() / "schedstat");
    std::uint64_t ns = 0;
    if (in >> ns) total += ns;
  }
  return total;
}

std::uint64_t process_rss_kb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      std::uint64_t kb = 0;
      in >> kb;
      return kb;
    }
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

std::string size_label(std::size_t bytes) {
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes / 1024);
  return fmt::format("{} B", bytes);
}

void http_failed(const std::string& label, const std::string& why) {
  std::fprintf(stderr, "rlbus-bench: %s: the HTTP baseline failed, no http column here: %s\n",
               label.c_str(), why.c_str());
}

void fmt_progress(const std::string& label, int trial, int trials) {
  std::fprintf(stderr, "rlbus-bench: %s: trial %d/%d\n", label.c_str(), trial, trials);
}

}  // namespace rlbus::bench
