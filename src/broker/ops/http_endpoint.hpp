// The broker's HTTP endpoint, on a port of its own and a thread of its own: /metrics (the
// Prometheus exposition of a fresh snapshot), /healthz (the process answers), /readyz (the
// broker is bound and serving, and not draining) and, when given its sources, the web view
// (web_view.hpp). /metrics and the probes only read the broker's counters, which are
// atomics, so they never wait for the broker loop; the web view asks the loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "broker/ops/metrics.hpp"
#include "broker/ops/web_view.hpp"

namespace rlbus::broker {

class http_endpoint {
 public:
  /// Listens on `address`:`port` (0: any free port) and serves `snapshot()`; throws
  /// std::runtime_error naming the address when it cannot listen.
  /// With `web.ask`, it serves the web view too; `access` guards the view (and /metrics
  /// when it says so).
  http_endpoint(const std::string& address, std::uint32_t port,
                const std::function<stats()>& snapshot, const web_sources& web = {},
                const web_access& access = {});
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
