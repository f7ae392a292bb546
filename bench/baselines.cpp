// See baselines.hpp. The loops are as plain as ZeroMQ allows (blocking recv with a short
// timeout only to notice a stop), since they set the floor the broker is compared with.
#include "baselines.hpp"

#include <array>
#include <cstdio>

namespace rlbus::bench {

namespace {

constexpr int idle_check_ms = 50;  // how often a blocked loop looks at its stop flag
constexpr std::size_t max_frames = 4;

// Receives one whole message into `frames`; 0 when nothing came within the timeout.
std::size_t recv_message(zmq::socket_t& sock, std::array<zmq::message_t, max_frames>& frames) {
  std::size_t n = 0;
  zmq::message_t extra;
  if (!sock.recv(frames[0], zmq::recv_flags::none)) return 0;
  n = 1;
  bool more = frames[0].more();
  while (more) {
    zmq::message_t& dst = n < max_frames ? frames[n] : extra;
    (void)sock.recv(dst, zmq::recv_flags::none);
    more = dst.more();
    if (n < max_frames) ++n;
  }
  return n;
}

void send_back(zmq::socket_t& sock, std::array<zmq::message_t, max_frames>& frames, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    sock.send(frames[i], i + 1 < n ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

}  // namespace

zmq::socket_t make_socket(zmq::context_t& ctx, zmq::socket_type type) {
  zmq::socket_t s(ctx, type);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndhwm, 100'000);
  s.set(zmq::sockopt::rcvhwm, 100'000);
  return s;
}

int run_proxy_server(const std::string& front, const std::string& back) {
  zmq::context_t ctx(1);
  auto f = make_socket(ctx, zmq::socket_type::router);
  auto b = make_socket(ctx, zmq::socket_type::dealer);
  f.bind(front);
  b.bind(back);
  std::printf("rlbus-bench proxy: front %s back %s\n", f.get(zmq::sockopt::last_endpoint).c_str(),
              b.get(zmq::sockopt::last_endpoint).c_str());
  std::fflush(stdout);
  zmq::proxy(f, b);  // returns only when the context ends; SIGTERM ends the process first
  return 0;
}

int run_echo_server(const std::string& bind) {
  zmq::context_t ctx(1);
  auto r = make_socket(ctx, zmq::socket_type::router);
  r.bind(bind);
  std::printf("rlbus-bench echo: router %s\n", r.get(zmq::sockopt::last_endpoint).c_str());
  std::fflush(stdout);
  std::array<zmq::message_t, max_frames> frames;
  while (true) {
    const auto n = recv_message(r, frames);
    if (n > 0) send_back(r, frames, n);
  }
}

void echo_loop(zmq::socket_t& sock, const std::atomic<bool>& stop) {
  sock.set(zmq::sockopt::rcvtimeo, idle_check_ms);
  std::array<zmq::message_t, max_frames> frames;
  while (!stop.load(std::memory_order_relaxed)) {
    const auto n = recv_message(sock, frames);
    if (n > 0) send_back(sock, frames, n);
  }
}

void sink_loop(zmq::socket_t& sock, flow_counter& c, const std::atomic<bool>& stop) {
  sock.set(zmq::sockopt::rcvtimeo, idle_check_ms);
  std::array<zmq::message_t, max_frames> frames;
  while (!stop.load(std::memory_order_relaxed)) {
    if (recv_message(sock, frames) > 0) c.tick();
  }
}

}  // namespace rlbus::bench
