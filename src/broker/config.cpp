// See config.hpp.
#include "broker/config.hpp"

#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace rlbus::broker {

namespace {
void require(bool ok, std::string_view what) {
  if (!ok) throw std::invalid_argument(std::string(what));
}
}  // namespace

void config::validate() const {
  require(!router_endpoint.empty(), "router endpoint must not be empty");
  require(!events_endpoint.empty(), "events endpoint must not be empty");
  require(liveness >= 1 && liveness <= 1000, "liveness must be 1..1000");
  require(heartbeat_min_ms >= codec::min_heartbeat_ms,
          fmt::format("heartbeat minimum must be at least {} ms", codec::min_heartbeat_ms));
  require(heartbeat_max_ms <= codec::max_heartbeat_ms,
          fmt::format("heartbeat maximum must be at most {} ms", codec::max_heartbeat_ms));
  require(heartbeat_min_ms <= heartbeat_max_ms, "heartbeat minimum must not exceed the maximum");
  require(status_interval_ms >= 10 && status_interval_ms <= 86'400'000,
          "status interval must be 10..86400000 ms");
  require(max_message >= 1024, "max message must be at least 1024 bytes");
  require(max_peers >= 1 && max_peers <= 10'000'000, "max peers must be 1..10000000");
  require(max_faults >= 1 && max_faults <= 1'000'000, "max faults must be 1..1000000");
  require(shutdown_linger_ms <= 86'400'000, "shutdown linger must be at most 86400000 ms");
  require(max_queue >= 1, "max queue must be at least 1");
  require(max_attempts >= 1 && max_attempts <= 1000, "max attempts must be 1..1000");
  const std::pair<std::uint32_t, std::string_view> timeouts[] = {{start_timeout_ms, "start"},
                                                                 {step_timeout_ms, "step"},
                                                                 {close_timeout_ms, "close"},
                                                                 {task_timeout_ms, "task"}};
  for (const auto& [ms, name] : timeouts)
    require(ms >= 1 && ms <= 86'400'000,
            fmt::format("{} timeout must be 1..86400000 ms (one day)", name));
  require(stream_ring >= 16, "stream ring must hold at least 16 events");
  require(policy_max_ids >= 1, "the broker must hold at least one policy");
  require(policy_max_bytes <= limits.max_bin,
          "inline policy params cannot exceed the decoder's bin limit");
  require(stream_ring_bytes >= 1024, "stream ring bytes must be at least 1024");
  require(no_data_retry_ms <= 86'400'000, "no-data retry must be at most 86400000 ms");
  require(drain_ms <= 86'400'000, "drain must be at most 86400000 ms");
  require(quarantine_after <= 1000, "quarantine-after must be 0 (never) or 1..1000 failures");
  require(quarantine_ms >= 1 && quarantine_ms <= 86'400'000, "quarantine must be 1..86400000 ms");
  require(coordinator_grace_ms <= 86'400'000,
          "coordinator grace must be 0 (none) or 1..86400000 ms");
  require(queue_timeout_ms <= 86'400'000, "queue timeout must be 0 (none) or 1..86400000 ms");
  // The held events of a full window must fit the ring with room to spare.
  require(stream_window >= 1 && stream_window <= stream_ring / 2,
          fmt::format("stream window (--stream-window) is {} but must be 1..{}, half the stream "
                      "ring (--stream-ring {})",
                      stream_window, stream_ring / 2, stream_ring));
  // Security (SPEC §15): fail closed. CURVE without an allowlist would let any key in.
  require(curve_key_path.empty() == allowlist_path.empty(),
          curve_key_path.empty()
              ? "--allowlist needs --curve-key: without CURVE a peer's key is unknown"
              : "--curve-key needs --allowlist: CURVE admits only the keys it lists");
  if (curve_key_path.empty() && !insecure) {
    for (const auto* ep : {&router_endpoint, &events_endpoint})
      require(loopback_endpoint(*ep),
              fmt::format("{} is reachable from other machines, and without CURVE anyone who "
                          "reaches it can join as any peer: turn CURVE on (--curve-key, "
                          "--allowlist) or say --insecure",
                          *ep));
  }
  require(max_connections >= 1, "max connections must be at least 1");
  require(max_connections_per_address >= 1, "max connections per address must be at least 1");
  require(handshake_timeout_ms >= 100 && handshake_timeout_ms <= 86'400'000,
          "handshake timeout must be 100..86400000 ms");
  require(max_collectors >= 1 && max_learners >= 1 && max_coordinators >= 1,
          "each role must be allowed at least one session");
  require(max_tasks_per_coordinator >= 1, "max tasks per coordinator must be at least 1");
}

bool loopback_endpoint(std::string_view ep) {
  if (ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0) return true;
  if (ep.rfind("tcp://", 0) != 0) return false;
  ep.remove_prefix(6);
  const auto host = ep.substr(0, ep.rfind(':'));
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]";
}

std::optional<fsync_policy> parse_fsync_policy(std::string_view s) {
  if (s == "always") return fsync_policy::always;
  if (s == "batch") return fsync_policy::batch;
  if (s == "none") return fsync_policy::none;
  return std::nullopt;
}

std::string_view to_string(fsync_policy p) {
  switch (p) {
    case fsync_policy::always:
      return "always";
    case fsync_policy::batch:
      return "batch";
    case fsync_policy::none:
      return "none";
  }
  return "?";
}

std::string normalize_endpoint(std::string endpoint) {
  if (endpoint.rfind("tcp://", 0) == 0 && endpoint.size() > 2 &&
      endpoint.compare(endpoint.size() - 2, 2, ":0") == 0)
    endpoint.replace(endpoint.size() - 1, 1, "*");
  return endpoint;
}

}  // namespace rlbus::broker
