// The door (broker/core/gatekeeper.hpp) in plain mode, driven by hand: a ROUTER whose connections
// it counts, read only when the test says so. ZeroMQ names a message's connection only by its
// descriptor, which the kernel gives to the next connection once the first is closed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "broker/core/config.hpp"
#include "broker/core/gatekeeper.hpp"
#include "broker/core/server.hpp"
#include "broker/group/standby_door.hpp"
#include "support/support.hpp"

using namespace std::chrono_literals;
using rlbus::broker::gatekeeper;

namespace {

struct door {
  zmq::context_t ctx;
  rlbus::broker::config cfg;
  std::optional<gatekeeper> gate;
  zmq::socket_t router{ctx, zmq::socket_type::router};
  std::string port;
  explicit door(std::size_t per_address) {
    cfg.max_connections_per_address = per_address;
    gate.emplace(ctx, cfg);
    (void)gate->secure(router, rlbus::broker::zap_domain_router);
    router.set(zmq::sockopt::linger, 0);
    router.bind("tcp://127.0.0.1:*");
    const std::string ep = router.get(zmq::sockopt::last_endpoint);
    port = ep.substr(ep.rfind(':') + 1);
  }
  ~door() { gate->release(0); }
  /// Reads the monitors until `ok` holds (or 10 s after the call).
  bool wait(const std::function<bool()>& ok) {
    return rlbus::test::wait_until([&] {
      gate->on_readable();
      return ok();
    });
  }
  /// Waits for a message, without reading it (its connection stays unread).
  bool readable() {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    return zmq::poll(&item, 1, 10s) == 1;
  }
  /// Reads one message: its body and the descriptor it came on.
  std::pair<std::string, int> take() {
    zmq::message_t id, body;
    REQUIRE(router.recv(id));
    REQUIRE(router.recv(body));
    return {body.to_string(), body.get(ZMQ_SRCFD)};
  }
};

/// A TCP socket of the test's own, bound to `source` (an address of the loopback net): its
/// descriptor is taken now and stays the test's until it closes it.
int tcp_socket(const char* source) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &a.sin_addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

void tcp_connect(int fd, const std::string& port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(port)));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
}

/// Speaks for a DEALER over ZMTP 3.0 with the NULL mechanism, by hand: greeting, READY and
/// one message of `body` (under 256 bytes). libzmq must have read the whole greeting before
/// the READY comes, so the READY waits for the other side's (its answer to the greeting).
void zmtp_say(int fd, const std::string& body) {
  std::string greeting(64, '\0');
  greeting[0] = '\xff';
  greeting[9] = '\x7f';
  greeting[10] = 3;  // version 3.0
  greeting.replace(12, 4, "NULL");
  REQUIRE(::send(fd, greeting.data(), greeting.size(), MSG_NOSIGNAL) == 64);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string in;
  while (in.size() < 66 || in.size() < 66U + static_cast<unsigned char>(in[65])) {
    std::array<char, 256> buf{};
    const auto n = ::recv(fd, buf.data(), buf.size(), 0);
    REQUIRE(n > 0);
    in.append(buf.data(), static_cast<std::size_t>(n));
  }
  const std::string ready = std::string("\x05READY\x0bSocket-Type\0\0\0\x06", 22) + "DEALER";
  std::string out;
  out += '\x04';  // a short command
  out += static_cast<char>(ready.size());
  out += ready;
  out += '\0';  // a short message, the last frame
  out += static_cast<char>(body.size());
  out += body;
  REQUIRE(::send(fd, out.data(), out.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(out.size()));
}

zmq::socket_t dealer(zmq::context_t& ctx, const std::string& endpoint) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::reconnect_ivl, 50);
  s.connect(endpoint);
  return s;
}

}  // namespace

TEST_CASE("gatekeeper: what a cut connection said is never taken for a later connection's",
          "[gatekeeper]") {
  door d(1);
  auto a = dealer(d.ctx, "tcp://127.0.0.1:" + d.port);  // holds 127.0.0.1's one connection
  a.send(zmq::str_buffer("a"));
  REQUIRE(d.readable());
  const auto [a_body, a_fd] = d.take();
  CHECK(a_body == "a");
  CHECK_FALSE(d.gate->cut_off(a_fd));

  // c's own descriptor is taken before b's connection: the kernel then gives the next
  // accepted connection the lowest free descriptor, which is b's on the door's side.
  const int c = tcp_socket("127.0.0.2");
  // b is past the limit: it said something before the door read of it, and is cut. Its own
  // descriptor stays open, so that only the door's side of it is freed.
  const int b = tcp_socket("127.0.0.1");
  tcp_connect(b, d.port);
  zmtp_say(b, "b");
  REQUIRE(d.readable());
  REQUIRE(d.wait([&] { return d.gate->counts().refused_address == 1; }));
  REQUIRE(d.wait([&] { return d.gate->counts().connections == 1; }));  // b's end is read

  // c comes from another address (within its limit), on b's old descriptor, while b's message
  // still waits: c is cut too, and nothing b said passes for c's.
  tcp_connect(c, d.port);
  REQUIRE(d.wait([&] { return d.gate->counts().bounced == 1; }));
  const auto [b_body, b_fd] = d.take();
  CHECK(b_body == "b");
  CHECK(d.gate->cut_off(b_fd));
  ::close(b);
  ::close(c);

  // Once the ROUTER is read to the end, a connection from c's address is served (it says "e"
  // until one arrives: what it said on a connection that was cut meanwhile is gone with it).
  auto e = dealer(d.ctx, "tcp://127.0.0.2:0;127.0.0.1:" + d.port);
  zmq::message_t rest;
  while (d.router.recv(rest, zmq::recv_flags::dontwait)) {
  }
  d.gate->router_drained();
  int turn = 0;
  REQUIRE(rlbus::test::wait_until(
      [&] {
        if (turn++ % 50 == 0) (void)e.send(zmq::str_buffer("e"), zmq::send_flags::dontwait);
        d.gate->on_readable();
        zmq::message_t id, body;
        if (!d.router.recv(id, zmq::recv_flags::dontwait)) {
          d.gate->router_drained();
          return false;
        }
        REQUIRE(d.router.recv(body));
        return body.to_string() == "e" && !d.gate->cut_off(body.get(ZMQ_SRCFD));
      },
      10s));
  CHECK(d.gate->counts().refused_address == 1);
}

namespace {

/// Peers that connect, say something and go, again and again, from threads of their own
/// (and a context of their own), until destroyed.
class churn {
 public:
  explicit churn(const std::string& endpoint) {
    for (int t = 0; t < 4; ++t)
      threads_.emplace_back([this, endpoint] {
        zmq::context_t peers;
        while (!done_) {
          auto d = dealer(peers, endpoint);
          d.send(zmq::str_buffer("x"));
          std::this_thread::sleep_for(1ms);
        }
      });
  }
  ~churn() {
    done_ = true;
    for (auto& t : threads_) t.join();
  }
  churn(const churn&) = delete;
  churn& operator=(const churn&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::vector<std::thread> threads_;
};

/// Whether a socket of `ctx` bound now still gets a message over TCP: not when the
/// context's I/O thread is stuck.
bool context_serves(zmq::context_t& ctx) {
  zmq::context_t peers;
  zmq::socket_t r(ctx, zmq::socket_type::router);
  r.set(zmq::sockopt::linger, 0);
  r.bind("tcp://127.0.0.1:*");
  auto d = dealer(peers, r.get(zmq::sockopt::last_endpoint));
  d.send(zmq::str_buffer("hi"));
  zmq::pollitem_t item{r.handle(), 0, ZMQ_POLLIN, 0};
  return zmq::poll(&item, 1, 10s) == 1;
}

rlbus::broker::config loopback_config() {
  rlbus::broker::config cfg;
  cfg.router_endpoint = "tcp://127.0.0.1:*";
  cfg.events_endpoint = "tcp://127.0.0.1:*";
  return cfg;
}

}  // namespace

// A broker of a group closes its standby door when it leads, and its server when it stands by
// again, in the same context, while its peers keep coming: libzmq reports a closing socket's
// connections to its monitor from the I/O thread, and a report to a monitor whose reader is
// gone would block that thread for good (the broker that led next answered no HELLO).
TEST_CASE("gatekeeper: a door closed while peers come and go leaves its context serving",
          "[gatekeeper]") {
  zmq::context_t ctx;
  const auto cfg = loopback_config();
  SECTION("a standby's door") {
    for (int round = 0; round < 10; ++round) {
      std::optional<rlbus::broker::standby_door> door(std::in_place, ctx, cfg);
      {
        const churn peers(door->endpoint());
        door->serve({}, rlbus::util::clock::now() + 100ms);
        door.reset();  // while the peers still come
      }
      INFO("round " << round);
      REQUIRE(context_serves(ctx));
    }
  }
  SECTION("a leader's server") {
    for (int round = 0; round < 10; ++round) {
      std::optional<rlbus::broker::server> server(std::in_place, ctx, cfg);
      std::thread loop([&server] { server->run(); });
      {
        const churn peers(server->router_endpoint());
        std::this_thread::sleep_for(100ms);  // long enough for peers to come and go
        server->request_stop();
        loop.join();
        server.reset();  // while the peers still come
      }
      INFO("round " << round);
      REQUIRE(context_serves(ctx));
    }
  }
}
