// What a peer is and what it has: its role and the resources a worker announces. The SDK
// and the wire share this vocabulary (SPEC.md §4.1), so it is defined once, here; the codec
// and the broker reach it through src/codec/vocabulary.hpp. Plain values, no sockets.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace rlbus {

/// What a peer is to the broker. The wire spelling is the lower-case name (SPEC.md §4.1).
/// `bus`: a node of the topic bus (SPEC.md §17), which takes no tasks.
enum class role { collector, learner, coordinator, bus };

/// The wire spelling of a role ("collector", "learner", "coordinator", "bus").
std::string_view to_string(role r) noexcept;

/// Parses a wire spelling; nullopt for anything else (case-sensitive).
std::optional<role> parse_role(std::string_view text) noexcept;

/// Resources a worker announces (e.g. {"cpu": 4, "gpu": 1, "memory_gb": 16}).
/// Values are non-negative finite numbers; keys are sorted, so encoding is canonical.
using resources = std::map<std::string, double, std::less<>>;

}  // namespace rlbus
