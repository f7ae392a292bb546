// What the task manager's own files share (task_manager.cpp, task_stream.cpp,
// task_journal.cpp, task_ops.cpp): how a refusal is made, how a reason is kept within its
// limit and put in an event's body, and which free pool a worker kind uses. Not for use
// outside the task manager.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "broker/refusal.hpp"
#include "codec/codec.hpp"
#include "codec/map_writer.hpp"

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

inline codec::blob reason_body(std::string_view reason, std::uint32_t attempt,
                               const codec::blob* result = nullptr) {
  if (result == nullptr)
    return codec::map_writer(2).str("reason", reason).uint("attempt", attempt).done();
  // The worker's own account of the failure (TASK_FAILED `result`), byte for byte.
  return codec::map_writer(3, 32 + reason.size() + result->size())
      .str("reason", reason)
      .uint("attempt", attempt)
      .raw("result", *result)
      .done();
}

}  // namespace rlbus::broker::task_helpers
