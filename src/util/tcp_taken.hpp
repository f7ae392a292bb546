// How many bytes a process has taken off a TCP connection so far: what the kernel received
// in order, less what still waits in its receive queue. For a ZeroMQ socket's connection that
// is what libzmq has read and holds (or has handed on), which the broker checks against what
// it has been handed as whole messages (SPEC §10.5).
#pragma once

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstdint>
#include <optional>

namespace rlbus::util {

/// Nothing for a descriptor that is not a TCP connection (IPC) or is gone.
inline std::optional<std::uint64_t> tcp_taken(int fd) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return std::nullopt;
  // Kernels before 4.1 do not fill the counter in: nothing to go by.
  if (len < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received)
    return std::nullopt;
  int queued = 0;
  if (::ioctl(fd, FIONREAD, &queued) != 0 || queued < 0) return std::nullopt;
  const auto received = static_cast<std::uint64_t>(info.tcpi_bytes_received);
  const auto waiting = static_cast<std::uint64_t>(queued);
  return received > waiting ? received - waiting : 0;
}

}  // namespace rlbus::util
