// Loopback TCP ports nothing listens on now, for local runs (the demo's group of brokers, a
// throwaway etcd, the tests' and the bench's brokers). Another process may take one before the
// caller binds it; that is unlikely, and a failed bind says so clearly.
//
// They are drawn below the kernel's range of ephemeral ports, as fixed ports (7235) are: a
// port from that range, left free while its broker restarts, can be given by the kernel to a
// peer's reconnecting socket aimed at that very port, which then connects to itself (TCP
// simultaneous open) and holds the port, so the broker cannot bind it again.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <stdexcept>

namespace rlbus::util {

namespace detail {

/// Whether loopback port `port` can be bound now.
inline bool port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("no socket for a free port");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace detail

/// The first of `count` consecutive free loopback ports, between 10000 and the start of the
/// kernel's ephemeral range (at most 30000).
inline int free_tcp_port(int count = 1) {
  int low = 32768;  // the kernel's default start of the ephemeral range
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  const int top = std::min(low, 30000) - count;
  if (top <= 10000) throw std::runtime_error("no room for ports below the ephemeral range");
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(10000, top);
  for (int tries = 0; tries < 1000; ++tries) {
    const int first = pick(rng);
    bool all = true;
    for (int p = first; all && p < first + count; ++p) all = detail::port_free(p);
    if (all) return first;
  }
  throw std::runtime_error("no free loopback port below the ephemeral range");
}

}  // namespace rlbus::util
