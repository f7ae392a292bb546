// What the task manager's own files share (task_manager.cpp, task_stream.cpp,
// task_journal.cpp, task_ops.cpp): how a refusal is made, how a reason is kept within its
// limit, how a failure's own account goes into an event's body, and which free pool a worker kind
// uses. Not for use outside the task manager.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "broker/refusal.hpp"
#include "codec/codec.hpp"

namespace rlbus::broker::task_helpers {

/// The free pool of a worker kind: collectors 0, learners 1.
inline std::size_t slot(rlbus::role kind) {
  return kind == rlbus::role::learner ? 1 : 0;
}

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
