// Vocabulary shared by the rlbus SDK and the wire protocol: peer roles and resources.
// Everything here is a plain value type; nothing in this header touches a socket.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace rlbus {

/// What a peer is to the broker. The wire spelling is the lower-case name (SPEC.md §4.1).
enum class role { collector, learner, coordinator };

/// The wire spelling of a role ("collector", "learner", "coordinator").
std::string_view to_string(role r) noexcept;

/// Parses a wire spelling; nullopt for anything else (case-sensitive).
std::optional<role> parse_role(std::string_view text) noexcept;

/// Resources a worker announces (e.g. {"cpu": 4, "gpu": 1, "memory_gb": 16}).
/// Values are non-negative finite numbers; keys are sorted, so encoding is canonical.
using resources = std::map<std::string, double, std::less<>>;

/// One version of a policy as the broker hands it to a task (SPEC §13): either a reference
/// the worker resolves itself (a checkpoint path, a URL) or the parameters inline.
struct policy {
  std::string id;
  std::uint64_t version = 0;
  std::optional<std::string> ref;
  std::optional<std::string> params;
};

}  // namespace rlbus
