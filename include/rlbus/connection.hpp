// Where an SDK client's connection to the broker stands: the one state machine every role
// (rlbus::worker, rlbus::coordinator) shares, with the same names as the Python client's.
#pragma once

#include <string_view>

namespace rlbus {

enum class connection_state {
  connecting,    // no session yet: the first attempt, before any WELCOME
  ready,         // the broker welcomed this client and heartbeats flow
  reconnecting,  // welcomed before, the connection was lost: retrying (with backoff)
  refused,       // the broker refused the client for good (see last_error()); no more retries
  stopped,       // stop() ran, or the destructor
};

/// "connecting", "ready", "reconnecting", "refused" or "stopped".
std::string_view to_string(connection_state s) noexcept;

}  // namespace rlbus
