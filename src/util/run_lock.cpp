// See run_lock.hpp.
#include "util/run_lock.hpp"

#include <cerrno>
#include <system_error>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace rlbus::util {

run_lock_watch::run_lock_watch(const std::string& path)
    : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "run lock " + path);
}

run_lock_watch::~run_lock_watch() {
  if (fd_ >= 0) ::close(fd_);
}

bool run_lock_watch::released() {
  if (!released_) released_ = ::flock(fd_, LOCK_EX | LOCK_NB) == 0;
  return released_;
}

}  // namespace rlbus::util
