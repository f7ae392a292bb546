// See config.hpp.
#include "broker/core/config.hpp"

#include <utility>

namespace rlbus::broker {

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
