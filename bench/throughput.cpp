// Scenario 2, pipelined throughput: N collectors (1, 4, 16), each holding one running task,
// stream DATA to the broker, which turns each into a TASK_EVENT `data` for the one
// coordinator that owns the tasks. Counted as received by that coordinator, with the
// events lost (sent - received) and the jumps in the stream's seq.
//
// Beside it, in rotation, the same frames from the same N DEALERs through a zmq_proxy to
// one receiving DEALER, and straight into one ROUTER. All senders are paced by one window
// (at most `window` events sent and not yet received, well below the broker's 100 000
// message queue), so a loss is the broker's doing, not an overrun the bench provoked.
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "baselines.hpp"
#include "http.hpp"
#include "rlbus/coordinator.hpp"
#include "rlbus/worker.hpp"
#include "scenario.hpp"
#include "wire.hpp"

namespace rlbus::bench {

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

constexpr std::uint32_t long_timeout_ms = 86'400'000;
// How long a sender whose window is full sleeps before looking again: short for the one
// protocol-level sender thread; longer for the SDK handlers, of which there are up to 16,
// so that their waiting does not starve the threads doing the work on two CPUs.
constexpr auto window_wait = 50us;
constexpr auto sdk_window_wait = 1ms;
constexpr auto stall_limit = 3s;  // no progress this long: the rest counts as lost

struct trial {
  double rate = 0;         // events per second, first send to last receipt
  std::uint64_t lost = 0;  // sent and never received
  std::uint64_t gaps = 0;  // seq jumps in the coordinator's stream
  double cpu_us = 0;       // CPU of the middle process per event (0: none)
};

// Waits until `c` has `count` more than `base` or stops moving; fills rate and lost.
trial finish(flow_counter& c, std::uint64_t base, std::uint64_t count, clock::time_point t0) {
  auto seen = c.received.load() - base;
  auto last_move = clock::now();
  while (seen < count) {
    std::this_thread::sleep_for(1ms);
    const auto now_seen = c.received.load() - base;
    if (now_seen != seen) {
      seen = now_seen;
      last_move = clock::now();
    } else if (clock::now() - last_move > stall_limit) {
      break;
    }
  }
  trial t;
  const auto t_last = clock::time_point(clock::duration(c.last_ns.load()));
  const double secs = std::chrono::duration<double>(t_last - t0).count();
  t.rate = secs > 0 ? static_cast<double>(seen) / secs : 0.0;
  t.lost = count - seen;
  return t;
}

// Sends `count` messages round-robin over `socks` (socks[i] sends msgs[i]), never more
// than `window` ahead of what `c` has received.
trial pump(const std::vector<zmq::socket_t*>& socks, const std::vector<frames>& msgs,
           std::uint64_t count, std::uint64_t window, flow_counter& c) {
  const auto base = c.received.load();
  const auto t0 = clock::now();
  const auto n = socks.size();
  for (std::uint64_t i = 0; i < count; ++i) {
    while (i - (c.received.load(std::memory_order_acquire) - base) >= window)
      std::this_thread::sleep_for(window_wait);
    auto& sock = *socks[i % n];
    const auto& f = msgs[i % n];
    sock.send(zmq::buffer(f.header), zmq::send_flags::sndmore);
    sock.send(zmq::buffer(f.body), zmq::send_flags::none);
  }
  return finish(c, base, count, t0);
}

// The coordinator's receive loop for the protocol-level run: counts TASK_EVENTs and checks
// that their seq grows by exactly one (the broker's own loss signal, SPEC §12.8).
void coordinator_loop(zmq::socket_t& sock, std::uint64_t last_seq, flow_counter& c,
                      const std::atomic<bool>& stop) {
  sock.set(zmq::sockopt::rcvtimeo, 50);
  zmq::message_t head;
  zmq::message_t body;
  while (!stop.load(std::memory_order_relaxed)) {
    if (!sock.recv(head, zmq::recv_flags::none)) continue;
    if (head.more()) (void)sock.recv(body, zmq::recv_flags::none);
    while (body.more()) (void)sock.recv(body, zmq::recv_flags::none);
    const auto h = codec::parse_header(head.to_string_view());
    // CAPACITY: collectors of the SDK rows joining the same broker, nothing unexpected.
    if (h && h->type == static_cast<std::uint8_t>(codec::msg_type::capacity)) continue;
    auto seq = peek_seq(body.to_string_view());
    if (!h || h->type != static_cast<std::uint8_t>(codec::msg_type::task_event) || !seq) {
      c.unexpected.fetch_add(1);
      continue;
    }
    if (*seq > last_seq + 1) c.gaps.fetch_add(*seq - last_seq - 1);
    last_seq = *seq;
    c.tick();
  }
}

codec::submit collector_task(const std::string& id, const std::string& resource) {
  codec::submit t;
  t.task_id = id;
  t.kind = rlbus::role::collector;
  t.requirements = {{resource, 1}};
  t.start_timeout_ms = t.step_timeout_ms = t.close_timeout_ms = t.task_timeout_ms = long_timeout_ms;
  return t;
}

// The SDK collectors' handlers and the main thread meet here: each trial bumps
// `generation`, and every handler emits its share of the events under the shared window.
struct sdk_job {
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
  std::uint64_t generation = 0;
  std::vector<std::uint64_t> share;
  std::uint64_t base = 0;
  std::atomic<std::uint64_t> sent{0};
};

rlbus::task_handlers sdk_collector(sdk_job& job, std::size_t index, const std::string& payload,
                                   std::uint64_t window, flow_counter& c) {
  rlbus::task_handlers h;
  h.run = [&job, index, &payload, window, &c](rlbus::task_handle& t) {
    {
      std::lock_guard lock(job.mu);
      ++job.running;
    }
    job.cv.notify_all();
    std::uint64_t seen = 0;
    while (!t.stop_requested()) {
      std::uint64_t count = 0;
      std::uint64_t base = 0;
      {
        std::unique_lock lock(job.mu);
        if (!job.cv.wait_for(lock, 20ms, [&] { return job.generation != seen; })) continue;
        seen = job.generation;
        count = job.share[index];
        base = job.base;
      }
      for (std::uint64_t i = 0; i < count; ++i) {
        while (job.sent.load() - (c.received.load(std::memory_order_acquire) - base) >= window) {
          if (t.stop_requested()) return;
          std::this_thread::sleep_for(sdk_window_wait);
        }
        job.sent.fetch_add(1);
        if (!t.emit_data("d", "bench", codec::empty_map_blob, payload)) return;
      }
    }
  };
  return h;
}

// Items per trial of the batched SDK row, against the others' events: batched items flow
// several times faster, and a trial should last about as long as the others.
constexpr std::uint64_t batched_factor = 5;

// N SDK collectors and the SDK coordinator that owns their tasks, on tasks that need
// `resource` (so each group's tasks go to its own collectors).
struct sdk_group {
  sdk_job job;
  flow_counter flow;
  // Declared in this order so the coordinator stops first: the broker then cancels its
  // tasks and the collectors wind down without their tasks being re-queued.
  std::vector<std::unique_ptr<rlbus::worker>> workers;
  std::optional<rlbus::coordinator> coord;

  sdk_group(const std::string& router, const std::string& resource, int n, bool batch,
            const std::string& payload, std::uint64_t window) {
    const auto un = static_cast<std::size_t>(n);
    job.share.resize(un);
    rlbus::coordinator_callbacks cb;
    cb.deal_with_collector_send_data = [this](const std::string&, const std::string&,
                                              const std::string&,
                                              const std::string&) { flow.tick(); };
    coord.emplace(rlbus::coordinator_options{router, "bench-" + resource + "-coord"},
                  std::move(cb));
    for (std::size_t i = 0; i < un; ++i) {
      rlbus::worker_options wo;
      wo.endpoint = router;
      wo.role = rlbus::role::collector;
      wo.id = fmt::format("bench-{}-c{}", resource, i);
      wo.resources = {{resource, 1}};
      wo.batch_data = batch;
      workers.push_back(
          std::make_unique<rlbus::worker>(wo, sdk_collector(job, i, payload, window, flow)));
    }
    if (!coord->wait_for(rlbus::connection_state::ready, 10s))
      throw std::runtime_error("the SDK coordinator did not connect");
    for (auto& w : workers)
      if (!w->wait_for(rlbus::connection_state::ready, 10s))
        throw std::runtime_error("an SDK collector did not connect");
    for (std::size_t i = 0; i < un; ++i) {
      const auto r = coord->submit(
          spec_of(collector_task(fmt::format("{}-collect-{}", resource, i), resource)));
      if (!r || !r->accepted) throw std::runtime_error("the SDK coordinator's task was refused");
    }
    std::unique_lock lock(job.mu);
    if (!job.cv.wait_for(lock, 10s, [&] { return job.running == n; }))
      throw std::runtime_error("the SDK collectors' tasks did not start");
  }
  sdk_group(const sdk_group&) = delete;
  sdk_group& operator=(const sdk_group&) = delete;

  // One trial: `total` items shared among the collectors.
  trial run(std::uint64_t total) {
    const auto un = workers.size();
    const auto gaps0 = coord->stream_gaps();
    const auto base = flow.received.load();
    clock::time_point t0;
    {
      std::lock_guard lock(job.mu);
      for (std::size_t i = 0; i < un; ++i) job.share[i] = total / un + (i < total % un ? 1 : 0);
      job.base = base;
      job.sent.store(0);
      ++job.generation;
      t0 = clock::now();
    }
    job.cv.notify_all();
    auto t = finish(flow, base, total, t0);
    t.gaps = coord->stream_gaps() - gaps0;
    return t;
  }
};

// `large`: the large-payload rows (one collector, MB/s, a broker whose max-message takes a
// 1 MiB payload, no batched or HTTP column).
std::vector<row> throughput_rows(const settings& s, int n, http_baseline* http,
                                 bool large = false) {
  const auto label = large ? fmt::format("throughput {} B payloads", s.data_payload)
                           : fmt::format("throughput {} collector{}", n, n == 1 ? "" : "s");
  const auto count = s.messages;
  middle_boxes mb(
      s, true, false,
      large ? std::vector<std::string>{"--max-message", "4194304"} : std::vector<std::string>{});
  const std::string payload(s.data_payload, 'x');
  const auto un = static_cast<std::size_t>(n);

  // rlbus, protocol-level: N collectors on one sending context, one coordinator.
  zmq::context_t coord_ctx(1);
  zmq::context_t send_ctx(1);
  wire_peer coord(coord_ctx, mb.router);
  coord.hello(rlbus::role::coordinator, "bench-coord");
  std::vector<std::unique_ptr<wire_peer>> collectors;
  for (std::size_t i = 0; i < un; ++i) {
    collectors.push_back(std::make_unique<wire_peer>(send_ctx, mb.router));
    collectors.back()->hello(rlbus::role::collector, fmt::format("bench-c{}", i), {{"wire", 1}});
  }
  for (std::size_t i = 0; i < un; ++i) {
    coord.send(collector_task(fmt::format("wire-collect-{}", i), "wire"));
    if (!coord.expect<codec::submitted>("SUBMITTED").accepted)
      throw std::runtime_error("the broker refused a collector task");
  }
  std::vector<frames> data;
  std::vector<zmq::socket_t*> wire_socks;
  for (auto& c : collectors) {
    const auto start = c->expect<codec::task_start>("TASK_START");
    c->send(codec::started{start.task_id, start.attempt});
    data.push_back(encode(codec::data_ready{start.task_id, start.attempt, "d", "bench",
                                            codec::empty_map_blob, payload}));
    wire_socks.push_back(&c->socket());
  }
  for (int started = 0; started < n;)
    if (coord.expect<codec::task_event>("the started events").event == "started") ++started;
  flow_counter wire_flow;
  socket_thread coord_thread;
  const auto first_seq = coord.last_seq();
  coord_thread.start([&](const std::atomic<bool>& stop) {
    coordinator_loop(coord.socket(), first_seq, wire_flow, stop);
  });

  // The baselines: the same frames from N DEALERs, through the proxy or straight in.
  zmq::context_t proxy_send_ctx(1);
  zmq::context_t proxy_sink_ctx(1);
  auto proxy_sink = make_socket(proxy_sink_ctx, zmq::socket_type::dealer);
  proxy_sink.connect(mb.proxy_back);
  flow_counter proxy_flow;
  socket_thread proxy_sink_thread;
  proxy_sink_thread.start(
      [&](const std::atomic<bool>& stop) { sink_loop(proxy_sink, proxy_flow, stop); });
  zmq::context_t direct_send_ctx(1);
  zmq::context_t direct_sink_ctx(1);
  auto direct_sink = make_socket(direct_sink_ctx, zmq::socket_type::router);
  direct_sink.bind("tcp://127.0.0.1:*");
  const auto direct_ep = direct_sink.get(zmq::sockopt::last_endpoint);
  flow_counter direct_flow;
  socket_thread direct_sink_thread;
  direct_sink_thread.start(
      [&](const std::atomic<bool>& stop) { sink_loop(direct_sink, direct_flow, stop); });
  std::vector<zmq::socket_t> proxy_senders, direct_senders;
  for (std::size_t i = 0; i < un; ++i) {
    proxy_senders.push_back(make_socket(proxy_send_ctx, zmq::socket_type::dealer));
    proxy_senders.back().connect(mb.proxy_front);
    direct_senders.push_back(make_socket(direct_send_ctx, zmq::socket_type::dealer));
    direct_senders.back().connect(direct_ep);
  }
  std::vector<zmq::socket_t*> proxy_socks, direct_socks;
  for (std::size_t i = 0; i < un; ++i) {
    proxy_socks.push_back(&proxy_senders[i]);
    direct_socks.push_back(&direct_senders[i]);
  }

  // rlbus through the SDK: N workers (an I/O and a handler thread each) and a coordinator
  // whose callback thread counts. Two groups on the same broker: `sdk` sends every DATA
  // alone (batch_data off: the SDK's per-message path), `batched` lets the SDK batch DATA
  // that wait together (its default), and counts items.
  std::vector<std::unique_ptr<sdk_group>> groups;
  if (s.sdk) {
    groups.push_back(std::make_unique<sdk_group>(mb.router, "sdk", n, false, payload, s.window));
    if (!large)
      groups.push_back(std::make_unique<sdk_group>(mb.router, "sdkb", n, true, payload, s.window));
  }
  // The CPU time the middle process (broker or proxy) spent per event received, around
  // one trial.
  const auto with_cpu = [](pid_t pid, std::uint64_t c, auto&& run) {
    const auto cpu0 = process_cpu_ns(pid);
    trial t = run();
    const auto got = c - t.lost;
    if (got > 0)
      t.cpu_us =
          static_cast<double>(process_cpu_ns(pid) - cpu0) / 1000.0 / static_cast<double>(got);
    return t;
  };
  const auto warm = std::max<std::uint64_t>(100, count / 10);
  const auto wire = [&](bool w) {
    const auto c = w ? warm : count;
    const auto gaps0 = wire_flow.gaps.load();
    auto t = with_cpu(mb.broker_pid(), c,
                      [&] { return pump(wire_socks, data, c, s.window, wire_flow); });
    t.gaps = wire_flow.gaps.load() - gaps0;
    return t;
  };
  const auto proxy = [&](bool w) {
    const auto c = w ? warm : count;
    return with_cpu(mb.proxy_pid(), c,
                    [&] { return pump(proxy_socks, data, c, s.window, proxy_flow); });
  };
  const auto direct = [&](bool w) {
    return pump(direct_socks, data, w ? warm : count, s.window, direct_flow);
  };
  // The HTTP baseline (DI-engine's shape): N coordinator threads, each one task step at a
  // time, the payload in the results (processes started once per run). A failure empties
  // this group's column; it never stops the run.
  std::string http_error;
  const auto http_warm = std::max<std::uint64_t>(un, s.http_steps / 10);
  const auto http_run = [&](bool w) {
    trial t;
    if (!http_error.empty()) return t;
    try {
      t.rate = http->throughput(s.data_payload, n, w ? http_warm : s.http_steps);
    } catch (const std::exception& e) {
      http_error = e.what();
    }
    return t;
  };
  using variant = std::pair<std::string, std::function<trial(bool)>>;
  std::vector<variant> variants{{"wire", wire}, {"proxy", proxy}, {"direct", direct}};
  if (s.sdk) {
    variants.emplace_back("sdk", [&](bool w) {
      const auto c = w ? warm : count;
      return with_cpu(mb.broker_pid(), c, [&] { return groups[0]->run(c); });
    });
    // Batched: more items per trial, so a trial lasts about as long as the others.
    if (!large)
      variants.emplace_back("sdk batched", [&](bool w) {
        const auto c = (w ? warm : count) * batched_factor;
        return with_cpu(mb.broker_pid(), c, [&] { return groups[1]->run(c); });
      });
  }
  if (http != nullptr) variants.emplace_back("http", http_run);
  auto res = interleave<trial>(s.trials, variants, label);
  if (!http_error.empty()) http_failed(label, http_error);
  const bool http_ok = http != nullptr && http_error.empty();
  if (wire_flow.unexpected.load() != 0)
    std::fprintf(stderr, "rlbus-bench: the coordinator got %llu messages that were not events\n",
                 static_cast<unsigned long long>(wire_flow.unexpected.load()));

  const auto pick = [&](const std::string& v, auto field) {
    std::vector<double> out;
    for (const auto& t : res[v]) out.push_back(static_cast<double>(t.*field));
    return out;
  };
  std::uint64_t reconnects = 0;  // SDK collectors that gave up on the broker and reconnected
  for (const auto& g : groups)
    for (const auto& w : g->workers) reconnects += w->welcomes() - 1;
  const auto total = [&](const std::string& v, std::uint64_t trial::*field) {
    std::uint64_t sum = 0;
    for (const auto& t : res[v]) sum += t.*field;
    return sum;
  };
  std::vector<row> rows;
  for (const std::string client : {"wire", "sdk", "sdk batched"}) {
    if (res.count(client) == 0) continue;
    const bool batched = client == "sdk batched";
    const auto variant = large ? fmt::format("{} KiB payload, {}", s.data_payload / 1024, client)
                               : fmt::format("{} collector{}, {}", n, n == 1 ? "" : "s", client);
    nlohmann::json params{{"collectors", n},
                          {"payload_bytes", s.data_payload},
                          {"messages", batched ? count * batched_factor : count},
                          {"window", s.window},
                          {"client", client},
                          {"proxy_lost", total("proxy", &trial::lost)},
                          {"direct_lost", total("direct", &trial::lost)},
                          {"lost_trials", pick(client, &trial::lost)}};
    if (client != "wire") params["sdk_reconnects"] = reconnects;
    if (batched) {
      // What the batching did: DATA_BATCH messages and the DATA they carried, over the run.
      std::uint64_t batches = 0, in_batches = 0;
      for (const auto& w : groups[1]->workers) {
        batches += w->data_batches();
        in_batches += w->data_batched();
      }
      params["data_batches"] = batches;
      params["data_in_batches"] = in_batches;
      params["note"] = "rlbus column: data items/s; proxy and direct: messages/s";
    }
    if (http_ok) {
      params["http_steps"] = s.http_steps;
      params["http_threads"] = n;
    }
    row r;
    r.scenario = "throughput";
    r.variant = variant;
    r.metric = large ? "MB/s" : batched ? "items/s" : "events/s";
    r.higher_is_better = true;
    r.rlbus = pick(client, &trial::rate);
    r.proxy = pick("proxy", &trial::rate);
    r.direct = pick("direct", &trial::rate);
    if (large)  // payload bytes delivered per second, in MB (10^6 bytes)
      for (auto* v : {&r.rlbus, &r.proxy, &r.direct})
        for (auto& x : *v) x *= static_cast<double>(s.data_payload) / 1e6;
    if (http_ok) r.http = pick("http", &trial::rate);
    r.lost = total(client, &trial::lost);
    r.gaps = total(client, &trial::gaps);
    r.params = params;
    rows.push_back(r);
    // The middle process's CPU time per event: the broker's beside the proxy's (the direct
    // path has no middle process).
    row cpu;
    cpu.scenario = "throughput";
    cpu.variant = variant;
    cpu.metric = batched ? "cpu us/item" : "cpu us/ev";
    cpu.rlbus = pick(client, &trial::cpu_us);
    cpu.proxy = pick("proxy", &trial::cpu_us);
    cpu.params = params;
    rows.push_back(std::move(cpu));
  }
  return rows;
}

}  // namespace

std::vector<row> run_throughput(const settings& s, http_baseline* http) {
  std::vector<row> rows;
  for (const auto n : s.collectors) {
    auto r = throughput_rows(s, n, http);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  // Large payloads: the same path with 64 KiB and 1 MiB payloads, about 512 MiB a trial
  // (--quick: 1/64 of it), at most 32 MiB in flight.
  for (const auto size : s.large_payloads) {
    settings big = s;
    big.data_payload = size;
    const std::uint64_t budget = s.quick ? (8U << 20U) : (512U << 20U);
    big.messages = std::max<std::uint64_t>(16, budget / size);
    big.window = std::clamp<std::uint64_t>((32U << 20U) / size, 4, s.window);
    auto r = throughput_rows(big, 1, nullptr, true);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

}  // namespace rlbus::bench
