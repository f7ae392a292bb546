// Unpredictable 64-bit numbers from the kernel (getrandom), for session tokens and epochs:
// a token is the only proof a reconnecting peer owns its session, so it must not be
// guessable from anything the broker publishes.
#pragma once

#include <sys/random.h>

#include <cstdint>
#include <stdexcept>

namespace rlbus::util {

/// A uniformly random non-zero 64-bit number. Throws std::runtime_error if the kernel's
/// generator is unavailable (never seen on Linux >= 3.17).
inline std::uint64_t random_u64_nonzero() {
  std::uint64_t v = 0;
  while (v == 0) {
    if (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v))
      throw std::runtime_error("getrandom failed");
  }
  return v;
}

}  // namespace rlbus::util
