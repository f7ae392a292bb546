// The broker's HTTP endpoint, on a port of its own and a thread of its own: /metrics (the
// Prometheus exposition of a fresh snapshot), /healthz (the process answers) and /readyz
// (the broker is bound and serving, and not draining). It only reads the broker's counters,
// which are atomics, so it never waits for the broker loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "broker/ops/metrics.hpp"

namespace rlbus::broker {

class http_endpoint {
 public:
  /// Listens on `address`:`port` (0: any free port) and serves `snapshot()`; throws
  /// std::runtime_error naming the address when it cannot listen.
  http_endpoint(const std::string& address, std::uint32_t port,
                const std::function<stats()>& snapshot);
  ~http_endpoint();
  http_endpoint(const http_endpoint&) = delete;
  http_endpoint& operator=(const http_endpoint&) = delete;
  /// "http://ADDRESS:PORT", the port as bound.
  [[nodiscard]] std::string url() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace rlbus::broker
