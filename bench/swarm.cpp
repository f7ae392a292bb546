// `rlbus-bench swarm`: many idle heartbeating workers in one process, for scenario 3. One
// ZeroMQ context (one I/O thread) holds every DEALER, so the swarm costs the machine as
// little as possible next to the process it measures.
//
// Each socket is serviced once per heartbeat interval, at its own slot (socket i at
// i/N of the interval), so heartbeats are spread evenly instead of arriving in bursts: at
// its slot the socket's inbox is drained (the answers to its last heartbeat, and anything
// else the broker sent) and one heartbeat goes out. Touching only the sockets that are due
// keeps the swarm's own CPU at O(N / interval) rather than polling all N sockets all the
// time, which at 10 000 sockets would take a whole CPU from the broker being measured.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "baselines.hpp"
#include "process.hpp"
#include "wire.hpp"

namespace rlbus::bench {

namespace {

using clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// HELLOs sent and not yet answered at once: enough to keep the middle busy, few enough that
// its accept backlog and the swarm's poll set stay small.
constexpr std::size_t max_pending_hellos = 256;

struct counters {
  std::uint64_t sent = 0;          // heartbeats sent
  std::uint64_t answered = 0;      // heartbeats (or echoes) received back
  std::uint64_t blocked = 0;       // heartbeats the socket would not take (queue full)
  std::uint64_t disconnected = 0;  // DISCONNECT or ERROR from the broker
  std::uint64_t tasks = 0;         // TASK_STARTs answered with STARTED
};

std::uint8_t type_of(const zmq::message_t& head) {
  const auto h = codec::parse_header(head.to_string_view());
  return h ? h->type : 0;
}

bool is(std::uint8_t t, codec::msg_type m) {
  return t == static_cast<std::uint8_t>(m);
}

// Receives one whole message (header and body, extra frames dropped); false when none waits.
bool recv_now(zmq::socket_t& sock, zmq::message_t& head, zmq::message_t& body) {
  if (!sock.recv(head, zmq::recv_flags::dontwait)) return false;
  body.rebuild();
  if (head.more()) (void)sock.recv(body, zmq::recv_flags::none);
  zmq::message_t extra;
  bool more = body.more();
  while (more) {
    (void)sock.recv(extra, zmq::recv_flags::none);
    more = extra.more();
  }
  return true;
}

void send_frames(zmq::socket_t& sock, const frames& f, counters& c) {
  if (!sock.send(zmq::buffer(f.header), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
    ++c.blocked;
    return;
  }
  (void)sock.send(zmq::buffer(f.body), zmq::send_flags::none);
}

// Everything waiting on one socket: answers are counted; a task is accepted (STARTED) when
// the swarm plays a worker that takes tasks; a DISCONNECT or ERROR is counted (the broker
// gave up on this worker, which the bench reports).
void drain(zmq::socket_t& sock, const swarm_options& o, counters& c) {
  zmq::message_t head;
  zmq::message_t body;
  while (recv_now(sock, head, body)) {
    if (o.bare) {
      ++c.answered;
      continue;
    }
    const auto t = type_of(head);
    if (is(t, codec::msg_type::heartbeat)) {
      ++c.answered;
    } else if (is(t, codec::msg_type::disconnect) || is(t, codec::msg_type::error)) {
      if (c.disconnected++ == 0)
        std::printf("rlbus-bench swarm: the broker sent %s\n",
                    is(t, codec::msg_type::error) ? "ERROR" : "DISCONNECT");
    } else if (is(t, codec::msg_type::task_start) && o.accept_tasks) {
      auto m = codec::decode_body(t, body.to_string_view());
      if (const auto* ts = m ? std::get_if<codec::task_start>(&m.value()) : nullptr) {
        send_frames(sock, encode(codec::started{ts->task_id, ts->attempt}), c);
        ++c.tasks;
        std::printf("rlbus-bench swarm: started %s attempt %u\n", ts->task_id.c_str(), ts->attempt);
        std::fflush(stdout);
      }
    }
  }
}

// Connects every socket and has each say HELLO (bare: the heartbeat frames, which the echo
// server returns), at most max_pending_hellos at a time. Returns the agreed interval (the
// asked one for the bare ROUTER), or 0 after printing why it failed. Welcoming 10 000
// workers takes the broker longer than a liveness window, so a worker already welcomed
// heartbeats on its own clock meanwhile, or the broker would rightly expire it.
std::uint32_t connect_all(zmq::context_t& ctx, std::vector<zmq::socket_t>& socks,
                          const swarm_options& o, counters& c) {
  const auto hb = encode(codec::heartbeat{});
  std::uint32_t agreed = o.heartbeat_ms;
  std::vector<std::size_t> pending;
  std::vector<clock::time_point> next_beat;  // per welcomed worker; max() while not welcomed
  std::size_t next = 0;
  std::size_t welcomed = 0;
  const auto deadline = clock::now() + std::chrono::seconds(60) + 20ms * o.workers;
  zmq::message_t head;
  zmq::message_t body;
  while (welcomed < static_cast<std::size_t>(o.workers)) {
    while (pending.size() < max_pending_hellos && next < static_cast<std::size_t>(o.workers)) {
      socks.push_back(make_socket(ctx, zmq::socket_type::dealer));
      auto& s = socks.back();
      s.connect(o.endpoint);
      if (o.bare) {
        send_frames(s, hb, c);
      } else {
        send_frames(s,
                    encode(codec::hello{rlbus::role::collector,
                                        fmt::format("{}{}", o.id_prefix, next),
                                        o.heartbeat_ms,
                                        {},
                                        std::nullopt}),
                    c);
      }
      pending.push_back(next++);
      next_beat.push_back(clock::time_point::max());
    }
    std::vector<zmq::pollitem_t> items;
    for (const auto i : pending) items.push_back({socks[i].handle(), 0, ZMQ_POLLIN, 0});
    (void)zmq::poll(items, 100ms);
    std::vector<std::size_t> still;
    for (std::size_t k = 0; k < pending.size(); ++k) {
      if ((items[k].revents & ZMQ_POLLIN) == 0 || !recv_now(socks[pending[k]], head, body)) {
        still.push_back(pending[k]);
        continue;
      }
      if (!o.bare) {
        const auto t = type_of(head);
        auto m = codec::decode_body(t, body.to_string_view());
        const auto* w = m ? std::get_if<codec::welcome>(&m.value()) : nullptr;
        if (w == nullptr) {
          const auto* e = m ? std::get_if<codec::error>(&m.value()) : nullptr;
          std::printf(
              "rlbus-bench swarm: worker %zu got no WELCOME but %s\n", pending[k],
              e ? fmt::format("ERROR {} {}", e->code, e->reason).c_str() : "another message");
          return 0;
        }
        agreed = w->heartbeat_ms;
      }
      next_beat[pending[k]] = clock::now() + std::chrono::milliseconds(agreed);
      ++welcomed;
    }
    pending.swap(still);
    const auto now = clock::now();
    for (std::size_t i = 0; i < next_beat.size(); ++i) {
      if (next_beat[i] > now) continue;
      drain(socks[i], o, c);
      send_frames(socks[i], hb, c);
      next_beat[i] = now + std::chrono::milliseconds(agreed);
    }
    if (clock::now() > deadline) {
      std::printf("rlbus-bench swarm: only %zu of %d workers welcomed in time\n", welcomed,
                  o.workers);
      return 0;
    }
  }
  return agreed;
}

}  // namespace

int run_swarm(const swarm_options& o) {
  const auto fds = raise_fd_limit();
  // Each DEALER holds a TCP connection and a mailbox descriptor.
  if (fds < 2 * static_cast<std::uint64_t>(o.workers) + 32) {
    std::printf("rlbus-bench swarm: %d workers need ~%d file descriptors, the limit is %llu\n",
                o.workers, 2 * o.workers + 32, static_cast<unsigned long long>(fds));
    return 1;
  }
  zmq::context_t ctx(1);
  ctx.set(zmq::ctxopt::max_sockets, o.workers + 16);
  std::vector<zmq::socket_t> socks;
  socks.reserve(static_cast<std::size_t>(o.workers));
  counters c;
  const auto interval_ms = connect_all(ctx, socks, o, c);
  if (interval_ms == 0) return 1;
  std::printf("rlbus-bench swarm: welcomed %d heartbeat %u ms\n", o.workers, interval_ms);
  std::fflush(stdout);

  const auto hb = encode(codec::heartbeat{});
  const auto n = socks.size();
  const auto interval =
      std::chrono::duration_cast<clock::duration>(std::chrono::milliseconds(interval_ms));
  const auto t0 = clock::now();
  std::uint64_t slot = 0;  // the k-th service overall: socket k % n, round k / n
  const auto due = [&](std::uint64_t k) {
    return t0 + interval * static_cast<std::int64_t>(k / n) +
           interval * static_cast<std::int64_t>(k % n) / static_cast<std::int64_t>(n);
  };
  std::string input;
  while (true) {
    for (auto now = clock::now(); due(slot) <= now; ++slot) {
      auto& s = socks[slot % n];
      drain(s, o, c);
      send_frames(s, hb, c);
      ++c.sent;
    }
    // Sleep until the next slot, awake for the bench's questions on standard input.
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(due(slot) - clock::now());
    pollfd in{0, POLLIN, 0};
    const int r = ::poll(&in, 1, static_cast<int>(std::max<std::int64_t>(wait.count(), 1)));
    if (r <= 0 || (in.revents & (POLLIN | POLLHUP)) == 0) continue;
    char buf[256];
    const auto got = ::read(0, buf, sizeof buf);
    if (got <= 0) return 0;  // the bench closed our input: it is done with us
    input.append(buf, static_cast<std::size_t>(got));
    for (auto nl = input.find('\n'); nl != std::string::npos; nl = input.find('\n')) {
      const auto line = input.substr(0, nl);
      input.erase(0, nl + 1);
      // "report K": the counters, tagged with K so the bench can tell answers apart.
      if (line.rfind("report ", 0) == 0) {
        std::printf(
            "rlbus-bench swarm: report %s sent %llu answered %llu blocked %llu "
            "disconnected %llu\n",
            line.substr(7).c_str(), static_cast<unsigned long long>(c.sent),
            static_cast<unsigned long long>(c.answered), static_cast<unsigned long long>(c.blocked),
            static_cast<unsigned long long>(c.disconnected));
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace rlbus::bench
