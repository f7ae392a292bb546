// See wake_pipe.hpp.
#include "util/wake_pipe.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace rlbus::util {

wake_pipe::wake_pipe() {
  if (::pipe2(fds_, O_NONBLOCK | O_CLOEXEC) != 0)
    throw std::system_error(errno, std::generic_category(), "pipe2");
}

wake_pipe::~wake_pipe() {
  ::close(fds_[0]);
  ::close(fds_[1]);
}

void wake_pipe::notify() const noexcept {
  const char byte = 1;
  // A full pipe already guarantees a wake-up, so EAGAIN is fine to ignore.
  [[maybe_unused]] const auto n = ::write(fds_[1], &byte, 1);
}

void wake_pipe::drain() const noexcept {
  char buf[64];
  while (::read(fds_[0], buf, sizeof buf) > 0) {
  }
}

}  // namespace rlbus::util
