// The bare ZeroMQ baselines every rlbus figure is printed beside: a ROUTER echo server
// (one hop each way) and a zmq_proxy ROUTER/DEALER forwarder (two hops each way, the floor
// for any broker), each run in a process of its own like the broker, plus the in-process
// ends they talk to (an echo DEALER behind the proxy, a counting sink).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include <zmq.hpp>

namespace rlbus::bench {

/// A socket with the options every bench socket shares: no linger, queues as deep as the
/// broker's (100 000 messages), so the three paths differ only in what sits in the middle.
zmq::socket_t make_socket(zmq::context_t& ctx, zmq::socket_type type);

/// `rlbus-bench proxy`: binds a ROUTER (front) and a DEALER (back), prints
/// "rlbus-bench proxy: front EP back EP" and forwards with zmq::proxy until killed.
int run_proxy_server(const std::string& front, const std::string& back);

/// `rlbus-bench echo`: binds a ROUTER, prints "rlbus-bench echo: router EP" and sends every
/// message back to its sender until killed.
int run_echo_server(const std::string& bind);

/// `rlbus-bench swarm`: `workers` idle DEALERs in one process, for scenario 3.
struct swarm_options {
  std::string endpoint;  // the broker's (or the bare ROUTER's) endpoint
  int workers = 1;       // DEALER sockets, one connection each
  std::uint32_t heartbeat_ms = 1000;
  bool bare = false;            // heartbeat frames only, no HELLO (for the bare echo ROUTER)
  std::string id_prefix = "w";  // worker ids: prefix + index
  bool accept_tasks = false;    // answer TASK_START with STARTED (the death scenario's victim)
};

/// Connects and welcomes every worker, prints "rlbus-bench swarm: welcomed N heartbeat MS",
/// then heartbeats each at its own slot in the interval until its standard input closes.
/// "report K" on standard input prints "rlbus-bench swarm: report K sent S answered A ...".
int run_swarm(const swarm_options& o);

/// Counts what a receiver got, for the sender's window and the trial's result. The
/// receiver thread writes, the sender reads.
struct flow_counter {
  std::atomic<std::uint64_t> received{0};
  std::atomic<std::int64_t> last_ns{0};      // steady_clock time of the latest message
  std::atomic<std::uint64_t> gaps{0};        // events missing from a numbered stream
  std::atomic<std::uint64_t> unexpected{0};  // messages that were not what was sent
  void tick() {
    last_ns.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                  std::memory_order_relaxed);
    received.fetch_add(1, std::memory_order_release);
  }
};

/// A thread that owns one socket and runs `loop` on it until stopped; joined on destruction.
class socket_thread {
 public:
  socket_thread() = default;
  ~socket_thread() { stop(); }
  socket_thread(const socket_thread&) = delete;
  socket_thread& operator=(const socket_thread&) = delete;
  /// Starts `fn(stop_flag)`; fn must return soon after the flag is set.
  template <class Fn>
  void start(Fn fn) {
    thread_ = std::thread([this, fn = std::move(fn)]() mutable { fn(stop_); });
  }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Sends every message arriving on `sock` straight back (the far end behind the proxy).
void echo_loop(zmq::socket_t& sock, const std::atomic<bool>& stop);

/// Counts every message arriving on `sock` into `c` (the sink of the throughput baselines).
void sink_loop(zmq::socket_t& sock, flow_counter& c, const std::atomic<bool>& stop);

}  // namespace rlbus::bench
