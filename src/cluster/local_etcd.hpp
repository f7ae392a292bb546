// A throwaway etcd for one run: Debian's etcd-server as a child process, one member on free
// loopback ports, its data in a fresh directory (removed at the end), its output in a log
// file there. The demo's group of brokers and the tests of the cluster start one; nothing
// of a real deployment does.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "util/subprocess.hpp"

namespace rlbus::cluster {

class local_etcd {
 public:
  /// The etcd binary on PATH, or /usr/bin/etcd; "" when neither is there.
  static std::string find_binary();
  /// Whether etcd is installed.
  static bool available() { return !find_binary().empty(); }

  /// Starts etcd and waits until it answers; throws std::runtime_error (with the end of its
  /// log) if it is not installed, or does not answer within `start_timeout`. With
  /// `death_signal`, it gets that signal when the thread that started it ends.
  explicit local_etcd(std::chrono::seconds start_timeout = std::chrono::seconds(60),
                      int death_signal = 0);
  ~local_etcd();
  local_etcd(const local_etcd&) = delete;
  local_etcd& operator=(const local_etcd&) = delete;

  /// Its client URL, e.g. http://127.0.0.1:41234.
  [[nodiscard]] const std::string& url() const noexcept { return url_; }
  [[nodiscard]] pid_t pid() const noexcept { return proc_ ? proc_->pid() : 0; }
  /// SIGKILL, and waits for the process to be gone.
  void kill();
  /// Starts it again on the same ports and data (after kill()).
  void start();
  [[nodiscard]] std::string log_tail() const;

 private:
  std::string binary_, dir_, url_, peer_url_;
  std::chrono::seconds start_timeout_;
  int death_signal_;
  std::unique_ptr<util::subprocess> proc_;
};

}  // namespace rlbus::cluster
