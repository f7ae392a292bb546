// The clocks rlbus uses: a monotonic one for every deadline, and wall-clock milliseconds
// only for timestamps that leave the process (event ts_ms).
#pragma once

#include <chrono>
#include <cstdint>

namespace rlbus::util {

using clock = std::chrono::steady_clock;
using time_point = clock::time_point;
using std::chrono::milliseconds;

/// Milliseconds since the Unix epoch, for timestamps in events and logs.
inline std::uint64_t wall_ms() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

/// Milliseconds from `now` until `deadline`, rounded up, at least 0: a poll timeout that
/// never wakes early and never spins.
inline long poll_timeout_ms(time_point now, time_point deadline) noexcept {
  if (deadline <= now) return 0;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
  return static_cast<long>((us + 999) / 1000);
}

}  // namespace rlbus::util
