// Scenario 1, task step latency: one learner data request at a time, through the broker
// and back: GET_DATA -> broker -> TASK_EVENT data_request -> coordinator -> DATA_REPLY
// (carrying the payload) -> broker -> LEARN. Four hops, the broker crossed twice.
//
// Beside it, in the same run and in rotation: a DEALER -> zmq_proxy -> DEALER echo (four
// hops, the proxy crossed twice: the floor for any broker) and a DEALER <-> ROUTER echo
// (two hops). The middle of every path is a process of its own; the ends are threads of
// the bench, each with its own ZeroMQ context (so its own I/O thread, as a process has).
#include <condition_variable>
#include <mutex>
#include <stdexcept>

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

struct trial {
  double median = 0;
  double p99 = 0;
};

trial summarize(const std::vector<double>& samples) {
  return {median(samples), quantile(samples, 0.99)};
}

constexpr std::uint32_t long_timeout_ms = 86'400'000;  // tasks outlive any bench run

codec::submit learner_task(const std::string& id, const std::string& resource) {
  codec::submit t;
  t.task_id = id;
  t.kind = rlbus::role::learner;
  t.requirements = {{resource, 1}};
  t.start_timeout_ms = t.step_timeout_ms = t.close_timeout_ms = t.task_timeout_ms = long_timeout_ms;
  return t;
}

// Round trips of a bare ZeroMQ echo path: send the two frames, wait for them to return.
std::vector<double> ping(zmq::socket_t& sock, const frames& f, int rounds) {
  sock.set(zmq::sockopt::rcvtimeo, 5000);
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(rounds));
  zmq::message_t reply;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = clock::now();
    sock.send(zmq::buffer(f.header), zmq::send_flags::sndmore);
    sock.send(zmq::buffer(f.body), zmq::send_flags::none);
    do {
      if (!sock.recv(reply, zmq::recv_flags::none))
        throw std::runtime_error("an echo did not come back within 5 s");
    } while (reply.more());
    samples.push_back(micros(clock::now() - t0));
  }
  return samples;
}

// The SDK learner's handler and the bench's main thread meet here: the main thread asks for
// `rounds` timed get_data() calls, the handler thread makes them and hands back the times.
struct sdk_job {
  std::mutex mu;
  std::condition_variable cv;
  bool running = false;
  bool pending = false;
  bool failed = false;
  int rounds = 0;
  std::vector<double> samples;
};

rlbus::task_handlers sdk_learner(sdk_job& job) {
  rlbus::task_handlers h;
  h.run = [&job](rlbus::task_handle& t) {
    {
      std::lock_guard lock(job.mu);
      job.running = true;
    }
    job.cv.notify_all();
    std::uint64_t iter = 0;
    while (!t.stop_requested()) {
      int rounds = 0;
      {
        std::unique_lock lock(job.mu);
        if (!job.cv.wait_for(lock, 20ms, [&] { return job.pending; })) continue;
        rounds = job.rounds;
      }
      std::vector<double> samples;
      bool failed = false;
      for (int i = 0; i < rounds && !failed; ++i) {
        const auto t0 = clock::now();
        failed = !t.get_data("bench", 1, iter++, 5s);
        samples.push_back(micros(clock::now() - t0));
      }
      {
        std::lock_guard lock(job.mu);
        job.samples = std::move(samples);
        job.failed = failed;
        job.pending = false;
      }
      job.cv.notify_all();
    }
  };
  return h;
}

std::vector<row> latency_rows(const settings& s, std::size_t payload, http_baseline* http) {
  const auto label = "latency " + size_label(payload);
  middle_boxes mb(s, true, true);
  const auto data = bin_blob(payload);

  // rlbus, protocol-level clients: the coordinator answers data requests on a thread.
  zmq::context_t coord_ctx(1);
  zmq::context_t learner_ctx(1);
  wire_peer coord(coord_ctx, mb.router);
  coord.hello(rlbus::role::coordinator, "bench-coord");
  wire_peer learner(learner_ctx, mb.router);
  learner.hello(rlbus::role::learner, "bench-learner", {{"wire", 1}});
  coord.send(learner_task("wire-learn", "wire"));
  if (!coord.expect<codec::submitted>("SUBMITTED").accepted)
    throw std::runtime_error("the broker refused the bench's learner task");
  const auto start = learner.expect<codec::task_start>("TASK_START");
  learner.send(codec::started{start.task_id, start.attempt});
  while (coord.expect<codec::task_event>("the started event").event != "started") {
  }
  socket_thread coord_thread;
  coord_thread.start([&](const std::atomic<bool>& stop) {
    while (!stop.load(std::memory_order_relaxed)) {
      const auto m = coord.recv(50ms);
      const auto* e = m ? std::get_if<codec::task_event>(&*m) : nullptr;
      if (e == nullptr || e->event != "data_request") continue;
      const auto request = map_uint(e->body, "request_id");
      coord.send(codec::data_reply{e->task_id, request.value_or(0), data});
    }
  });
  std::uint64_t request = 0;
  const auto wire = [&](int rounds) {
    std::vector<double> samples;
    for (int i = 0; i < rounds; ++i) {
      const auto t0 = clock::now();
      learner.send(codec::get_data{start.task_id, start.attempt, ++request, "bench", 1, request});
      while (true) {
        auto m = learner.recv(5s);
        if (!m) throw std::runtime_error("no LEARN within 5 s");
        if (const auto* l = std::get_if<codec::learn>(&*m); l && l->request_id == request) break;
        if (const auto* e = std::get_if<codec::error>(&*m))
          throw std::runtime_error("the broker refused a data request: " + e->reason);
      }
      samples.push_back(micros(clock::now() - t0));
    }
    return samples;
  };

  // The bare paths carry the same payload in the same two-frame shape.
  const auto h = codec::make_header(codec::msg_type::learn);
  const frames echo_msg{std::string(h.data(), h.size()), std::string(payload, 'x')};
  zmq::context_t proxy_client_ctx(1);
  zmq::context_t proxy_far_ctx(1);
  auto proxy_client = make_socket(proxy_client_ctx, zmq::socket_type::dealer);
  proxy_client.connect(mb.proxy_front);
  auto proxy_far = make_socket(proxy_far_ctx, zmq::socket_type::dealer);
  proxy_far.connect(mb.proxy_back);
  socket_thread proxy_far_thread;
  proxy_far_thread.start([&](const std::atomic<bool>& stop) { echo_loop(proxy_far, stop); });
  zmq::context_t direct_ctx(1);
  auto direct_client = make_socket(direct_ctx, zmq::socket_type::dealer);
  direct_client.connect(mb.echo);

  // rlbus through the SDK: its I/O and handler/callback threads are part of the path.
  sdk_job job;
  // The worker is declared first so the coordinator stops first (its task is cancelled,
  // not re-queued).
  std::optional<rlbus::worker> sdk_worker;
  std::optional<rlbus::coordinator> sdk_coord;
  if (s.sdk) {
    rlbus::coordinator_callbacks cb;
    cb.deal_with_learner_get_data = [&data](const std::string&, const std::string&, std::uint32_t,
                                            std::uint64_t) -> std::optional<std::string> {
      return data;
    };
    sdk_coord.emplace(rlbus::coordinator_options{mb.router, "bench-sdk-coord"}, std::move(cb));
    rlbus::worker_options wo;
    wo.endpoint = mb.router;
    wo.role = rlbus::role::learner;
    wo.id = "bench-sdk-learner";
    wo.resources = {{"sdk", 1}};
    sdk_worker.emplace(wo, sdk_learner(job));
    if (!sdk_coord->wait_for(rlbus::connection_state::ready, 10s) ||
        !sdk_worker->wait_for(rlbus::connection_state::ready, 10s))
      throw std::runtime_error("the SDK clients did not connect");
    const auto r = sdk_coord->submit(spec_of(learner_task("sdk-learn", "sdk")));
    if (!r || !r->accepted) throw std::runtime_error("the SDK coordinator's task was refused");
    std::unique_lock lock(job.mu);
    if (!job.cv.wait_for(lock, 10s, [&] { return job.running; }))
      throw std::runtime_error("the SDK learner's task did not start");
  }
  const auto sdk = [&](int rounds) {
    std::unique_lock lock(job.mu);
    job.rounds = rounds;
    job.pending = true;
    job.cv.notify_all();
    if (!job.cv.wait_for(lock, std::chrono::seconds(30 + rounds / 100),
                         [&] { return !job.pending; }) ||
        job.failed)
      throw std::runtime_error("the SDK learner's data requests did not complete");
    return job.samples;
  };

  // The HTTP baseline (DI-engine's shape): a Flask worker and a requests coordinator, two
  // processes of their own started once per run. A failure empties this group's column; it
  // never stops the run.
  std::string http_error;
  const auto http_step = [&](int steps) {
    trial t;
    if (!http_error.empty()) return t;
    try {
      const auto r = http->latency(payload, steps);
      t = {r.median_us, r.p99_us};
    } catch (const std::exception& e) {
      http_error = e.what();
    }
    return t;
  };

  const int warm = std::max(10, s.rounds / 10);
  const int http_warm = std::max(2, s.http_rounds / 10);
  using variant = std::pair<std::string, std::function<trial(bool)>>;
  std::vector<variant> variants{
      {"wire", [&](bool w) { return summarize(wire(w ? warm : s.rounds)); }},
      {"proxy",
       [&](bool w) { return summarize(ping(proxy_client, echo_msg, w ? warm : s.rounds)); }},
      {"direct",
       [&](bool w) { return summarize(ping(direct_client, echo_msg, w ? warm : s.rounds)); }},
  };
  if (s.sdk)
    variants.emplace_back("sdk", [&](bool w) { return summarize(sdk(w ? warm : s.rounds)); });
  if (http != nullptr)
    variants.emplace_back("http", [&](bool w) { return http_step(w ? http_warm : s.http_rounds); });
  auto res = interleave<trial>(s.trials, variants, label);
  if (!http_error.empty()) http_failed(label, http_error);
  const bool http_ok = http != nullptr && http_error.empty();

  const auto pick = [&](const std::string& v, double trial::*field) {
    std::vector<double> out;
    for (const auto& t : res[v]) out.push_back(t.*field);
    return out;
  };
  std::vector<row> rows;
  for (const std::string client : {"wire", "sdk"}) {
    if (res.count(client) == 0) continue;
    for (const auto& [metric, field] :
         {std::pair{"median us", &trial::median}, std::pair{"p99 us", &trial::p99}}) {
      row r;
      r.scenario = "latency";
      r.variant = fmt::format("step {}, {}", size_label(payload), client);
      r.metric = metric;
      r.rlbus = pick(client, field);
      r.proxy = pick("proxy", field);
      r.direct = pick("direct", field);
      if (http_ok) r.http = pick("http", field);
      r.params = {{"payload_bytes", payload}, {"rounds", s.rounds}, {"client", client}};
      if (http_ok) r.params["http_rounds"] = s.http_rounds;
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

}  // namespace

std::vector<row> run_latency(const settings& s, http_baseline* http) {
  std::vector<row> rows;
  for (const auto p : s.payloads) {
    auto r = latency_rows(s, p, http);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

}  // namespace rlbus::bench
