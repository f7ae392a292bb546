// See config.hpp.
#include "broker/config.hpp"

#include "broker/settings.hpp"

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
  // Each setting on its own, by the bounds of the table of settings (settings.cpp).
  for (const auto& s : settings())
    if (auto why = s.check(*this); !why.empty())
      throw std::invalid_argument(fmt::format("{} ({}): {}", s.key(), s.flag(), why));
  // Settings that bound each other.
  require(heartbeat_min_ms <= heartbeat_max_ms,
          fmt::format("heartbeat-min ({} ms) must not exceed heartbeat-max ({} ms)",
                      heartbeat_min_ms, heartbeat_max_ms));
  require(policy_max_bytes <= limits.max_bin,
          "inline policy params cannot exceed the decoder's bin limit");
  // The held events of a full window must fit the ring with room to spare.
  require(stream_window <= stream_ring / 2,
          fmt::format("tasks.stream-window (--stream-window) is {} but must be 1..{}, half the "
                      "stream ring (--stream-ring {})",
                      stream_window, stream_ring / 2, stream_ring));
  require(max_connection_bytes >= 2 * max_message,
          fmt::format("security.max-connection-bytes (--max-connection-bytes) is {} but must be "
                      "at least twice max-message ({}): a connection must be able to take the "
                      "largest message",
                      max_connection_bytes, max_message));
  require(memory_budget >= max_connection_bytes,
          fmt::format("security.memory-budget (--memory-budget) is {} but must be at least "
                      "max-connection-bytes ({})",
                      memory_budget, max_connection_bytes));
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
    require(metrics_port == 0 || loopback_host(metrics_address),
            fmt::format("metrics.address (--metrics-address) {} is reachable from other "
                        "machines, and without CURVE every other socket of the broker stays on "
                        "loopback unless told: turn CURVE on or say --insecure",
                        metrics_address));
  }
}

bool loopback_host(std::string_view host) {
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "::1" || host == "[::1]";
}

bool loopback_endpoint(std::string_view ep) {
  if (ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0) return true;
  if (ep.rfind("tcp://", 0) != 0) return false;
  ep.remove_prefix(6);
  return loopback_host(ep.substr(0, ep.rfind(':')));
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
