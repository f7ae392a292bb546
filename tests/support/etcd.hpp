// A real etcd for the tests of the cluster: Debian's etcd-server, one member on free loopback
// ports, its data in a fresh directory, its output in a log file there. Tests that need it
// say so and pass when the binary is missing (the test command installs it).
#pragma once

#include <memory>
#include <string>

#include "util/subprocess.hpp"

namespace rlbus::test {

class etcd_server {
 public:
  /// Whether etcd is installed.
  static bool available();
  /// Starts etcd and waits until it answers (throws std::runtime_error if it does not
  /// within 60 s, with the end of its log).
  etcd_server();
  ~etcd_server();
  etcd_server(const etcd_server&) = delete;
  etcd_server& operator=(const etcd_server&) = delete;

  /// Its client URL, e.g. http://127.0.0.1:41234.
  [[nodiscard]] const std::string& url() const noexcept { return url_; }
  /// SIGKILL, and waits for the process to be gone.
  void kill();
  /// Starts it again on the same ports and data (after kill()).
  void start();
  [[nodiscard]] std::string log_tail() const;

 private:
  std::string dir_, url_, peer_url_;
  std::unique_ptr<util::subprocess> proc_;
};

}  // namespace rlbus::test
