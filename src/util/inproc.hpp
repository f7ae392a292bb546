// Names for inproc endpoints (socket monitors) that are never used twice in a process. A name
// made from an object's address is not: a broker of a group makes a new server, often at the
// old one's address, and libzmq unbinds the old socket's monitor endpoint only once that
// socket's teardown is done; a new monitor under the same name would hear nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace rlbus::util {

/// "inproc://rlbus.WHAT.N", N counting up across the process.
inline std::string unique_inproc(std::string_view what) {
  static std::atomic<std::uint64_t> next{0};
  return fmt::format("inproc://rlbus.{}.{}", what, ++next);
}

}  // namespace rlbus::util
