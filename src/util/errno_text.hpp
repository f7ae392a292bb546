// What errno says, in words, for the messages of a failed system call.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

namespace rlbus::util {

inline std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace rlbus::util
