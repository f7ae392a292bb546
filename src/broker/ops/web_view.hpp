// The web view on the broker's HTTP endpoint: one page (/) that shows the broker live, its
// files (/assets/...), and the JSON it reads: /api/view (the read-only OPS verbs' replies,
// asked of the broker's loop, one page of each table), /api/series (the last 15 minutes
// of the counters) and /api/cluster (the broker's group as etcd holds it, for a broker of a
// group). Read-only: nothing here changes the broker.
//
// Who may look: with a token set, the page and its JSON ask for it ('Authorization: Bearer
// TOKEN', or ?token=TOKEN), compared in constant time. A token is required when CURVE is on
// or the endpoint is reachable from other machines; without one there, the view is refused
// and says why. The files under /assets/ hold nothing of the broker and are served to anyone.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "broker/ops/series.hpp"
#include "codec/protocol.hpp"

namespace httplib {
class Server;
struct Request;
}  // namespace httplib

namespace rlbus::broker {

struct web_access {
  std::string token;            // "" none
  bool token_required = false;  // CURVE on, or reachable from other machines
  bool token_for_metrics = false;
  /// Whether `req` may see what the token guards (constant time in the token).
  [[nodiscard]] bool admits(const httplib::Request& req) const;
};

struct web_sources {
  /// The loop's replies to read-only OPS verbs (server::ask); nullopt: it did not answer.
  std::function<std::optional<std::vector<codec::blob>>(std::vector<codec::ops>,
                                                        std::chrono::milliseconds)>
      ask;
  /// The samples after a Unix time in ms (metrics::recent()).
  std::function<std::vector<series::sample>(std::int64_t)> recent;
  /// The broker's group as etcd holds it, as JSON text (cluster::group_watch); none: the
  /// broker is not of a group.
  std::function<std::string()> cluster;
};

/// Serves the view on `http`.
void add_web_view(httplib::Server& http, const web_sources& sources, const web_access& access);

/// The token in the first line of the file at `path`; throws std::runtime_error naming the
/// file when it cannot be read or holds no token.
std::string read_token_file(const std::string& path);

}  // namespace rlbus::broker
