// What the task manager's own files share (task_manager.cpp, task_stream.cpp,
// task_journal.cpp, task_ops.cpp): how a refusal is made, how a reason is kept within its
// limit, and how a failure's own account goes into an event's body. Not for use outside the task
// manager.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "broker/core/peer_table.hpp"
#include "broker/core/refusal.hpp"
#include "codec/codec.hpp"

namespace rlbus::broker::task_helpers {

inline refusal refuse(codec::error_code code, std::string reason) {
  const bool late =
      code == codec::error_code::unknown_task || code == codec::error_code::stale_attempt;
  return {code, std::move(reason), late};
}

/// Reasons built from a peer's own text stay within the reason limit of the messages and
/// events they end up in.
inline std::string clip(std::string s) {
  if (s.size() > codec::max_reason_length) s.resize(codec::max_reason_length);
  return s;
}

/// The worker's own account of a failure (TASK_FAILED `result`), when it gave one, as the
/// view an event body holds.
inline std::optional<std::string_view> view_of(const codec::blob* result) {
  if (result == nullptr) return std::nullopt;
  return std::string_view(*result);
}

}  // namespace rlbus::broker::task_helpers
