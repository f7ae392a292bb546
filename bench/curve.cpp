// Scenario 6, CURVE's cost: the same broker, plain and with CURVE on (every connection
// encrypted, every key checked against an allowlist), in rotation, a fresh broker per trial.
// Two figures per trial: the task step latency of scenario 1 (GET_DATA -> data_request ->
// DATA_REPLY -> LEARN, one at a time, 64 B) and data events/s of scenario 2's shape (wire-level
// collectors sending DATA, at most --window in flight, relayed to one coordinator).
#include <atomic>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "baselines.hpp"
#include "scenario.hpp"
#include "util/curve_keys.hpp"
#include "wire.hpp"

namespace rlbus::bench {

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

constexpr int collectors = 4;
constexpr std::size_t step_payload = 64;
constexpr std::uint32_t long_ms = 86'400'000;

struct trial_result {
  double step_us = 0;  // median of the trial's round trips
  double events_per_s = 0;
  std::uint64_t lost = 0;  // data sent and never relayed
};

codec::submit long_task(const std::string& id, rlbus::role kind, const std::string& resource) {
  codec::submit t;
  t.task_id = id;
  t.kind = kind;
  t.requirements = {{resource, 1}};
  t.start_timeout_ms = t.step_timeout_ms = t.close_timeout_ms = t.task_timeout_ms = long_ms;
  return t;
}

trial_result run_trial(const settings& s, const std::vector<std::string>& broker_args,
                       const rlbus::curve_keys* keys, bool warmup, int trial) {
  middle_boxes mb(s, false, false, broker_args);
  zmq::context_t coord_ctx(1), peers_ctx(1);
  wire_peer coord(coord_ctx, mb.router, keys);
  coord.hello(rlbus::role::coordinator, "bench-curve-coord");
  wire_peer learner(peers_ctx, mb.router, keys);
  learner.hello(rlbus::role::learner, "bench-curve-learner", {{"wire", 1}});
  coord.send(long_task(fmt::format("learn-{}", trial), rlbus::role::learner, "wire"));
  (void)coord.expect<codec::submitted>("SUBMITTED");
  const auto start = learner.expect<codec::task_start>("TASK_START");
  learner.send(codec::started{start.task_id, start.attempt});
  while (coord.expect<codec::task_event>("the started event").event != "started") {
  }

  // Task steps: the coordinator answers data requests on its own thread.
  const auto data = bin_blob(step_payload);
  trial_result out;
  {
    socket_thread answer;
    answer.start([&](const std::atomic<bool>& stop) {
      while (!stop.load(std::memory_order_relaxed)) {
        const auto m = coord.recv(50ms);
        const auto* e = m ? std::get_if<codec::task_event>(&*m) : nullptr;
        if (e == nullptr || e->event != "data_request") continue;
        coord.send(
            codec::data_reply{e->task_id, map_uint(e->body, "request_id").value_or(0), data});
      }
    });
    std::vector<double> samples;
    const int rounds = warmup ? std::max(10, s.rounds / 10) : s.rounds;
    for (std::uint64_t r = 1; r <= static_cast<std::uint64_t>(rounds); ++r) {
      const auto t0 = clock::now();
      learner.send(codec::get_data{start.task_id, start.attempt, r, "bench", 1, r});
      while (true) {
        auto m = learner.recv(5s);
        if (!m) throw std::runtime_error("no LEARN within 5 s");
        if (const auto* l = std::get_if<codec::learn>(&*m); l && l->request_id == r) break;
      }
      samples.push_back(micros(clock::now() - t0));
    }
    out.step_us = median(samples);
  }

  // Data events: each collector sends its share of DATA at once; the coordinator counts the
  // data events relayed to it.
  std::vector<std::unique_ptr<wire_peer>> peers;
  std::vector<codec::task_start> starts;
  for (int k = 0; k < collectors; ++k) {
    peers.push_back(std::make_unique<wire_peer>(peers_ctx, mb.router, keys));
    peers.back()->hello(rlbus::role::collector, fmt::format("bench-curve-c{}", k),
                        {{fmt::format("c{}", k), 1}});
    coord.send(long_task(fmt::format("collect-{}-{}", trial, k), rlbus::role::collector,
                         fmt::format("c{}", k)));
    starts.push_back(peers.back()->expect<codec::task_start>("TASK_START"));
    peers.back()->send(codec::started{starts.back().task_id, starts.back().attempt});
  }
  const std::uint64_t per = (warmup ? s.messages / 10 : s.messages) / collectors;
  std::uint64_t started = 0;
  while (started < static_cast<std::uint64_t>(collectors))
    if (const auto m = coord.recv(5s); !m)
      throw std::runtime_error("the collectors' tasks did not start");
    else if (const auto* e = std::get_if<codec::task_event>(&*m); e && e->event == "started")
      ++started;
  // At most --window events in flight (sent, not yet seen by the coordinator), as in scenario
  // 2: the broker drops what a coordinator's queue cannot take, and the row would measure that.
  std::atomic<std::uint64_t> sent{0}, seen{0};
  std::vector<std::unique_ptr<socket_thread>> senders;
  const auto t0 = clock::now();
  for (int k = 0; k < collectors; ++k) {
    senders.push_back(std::make_unique<socket_thread>());
    senders.back()->start([&, k](const std::atomic<bool>&) {
      const auto& st = starts[static_cast<std::size_t>(k)];
      const auto f = encode(codec::data_ready{st.task_id, st.attempt, "d", "buf",
                                              codec::empty_map_blob, bin_blob(s.data_payload)});
      for (std::uint64_t i = 0; i < per; ++i) {
        while (sent.load(std::memory_order_relaxed) - seen.load(std::memory_order_relaxed) >=
               s.window)
          std::this_thread::yield();
        sent.fetch_add(1, std::memory_order_relaxed);
        peers[static_cast<std::size_t>(k)]->send(f);
      }
    });
  }
  std::uint64_t got = 0;
  auto last = t0;
  while (got < per * collectors) {
    const auto m = coord.recv(5s);
    if (!m) break;
    if (const auto* e = std::get_if<codec::task_event>(&*m); e && e->event == "data") {
      seen.store(++got, std::memory_order_relaxed);
      last = clock::now();
    }
  }
  for (auto& t : senders) t->stop();
  const auto seconds = std::chrono::duration<double>(last - t0).count();
  out.events_per_s = seconds > 0 ? static_cast<double>(got) / seconds : 0;
  out.lost = per * collectors - got;
  return out;
}

}  // namespace

std::vector<row> run_curve(const settings& s) {
  // One key for every bench peer, allowed every role; the broker's pair beside it.
  const auto broker = util::make_curve_pair();
  const auto peer = util::make_curve_pair();
  const auto stem = s.log_dir + "/curve-broker";
  util::write_curve_pair(stem, broker);
  const auto allow = s.log_dir + "/curve-allow.toml";
  std::ofstream(allow) << fmt::format(
      "[[key]]\nname = \"bench\"\npublic-key = \"{}\"\nroles = [\"collector\", \"learner\", "
      "\"coordinator\"]\n",
      peer.public_key);
  const rlbus::curve_keys keys{peer.public_key, peer.secret_key, broker.public_key};
  const std::vector<std::string> curve_args{"--curve-key", stem + ".key", "--allowlist", allow};

  int n = 0;
  std::uint64_t lost = 0;
  const auto variant = [&](bool curve) {
    return [&, curve](bool warmup) {
      const auto r = run_trial(s, curve ? curve_args : std::vector<std::string>{},
                               curve ? &keys : nullptr, warmup, ++n);
      if (!warmup) lost += r.lost;
      return r;
    };
  };
  using entry = std::pair<std::string, std::function<trial_result(bool)>>;
  auto results = interleave<trial_result>(
      s.trials, std::vector<entry>{{"plain", variant(false)}, {"curve", variant(true)}}, "curve");
  const auto pick = [&](const std::string& v, double trial_result::*field) {
    std::vector<double> out;
    for (const auto& t : results[v]) out.push_back(t.*field);
    return out;
  };
  std::vector<row> rows;
  row step;
  step.scenario = "curve";
  step.variant = fmt::format("step {}, CURVE", size_label(step_payload));
  step.metric = "median us";
  step.rlbus = pick("curve", &trial_result::step_us);
  step.direct = pick("plain", &trial_result::step_us);
  step.params = {{"payload_bytes", step_payload}, {"rounds", s.rounds}};
  rows.push_back(std::move(step));
  row events;
  events.scenario = "curve";
  events.variant = fmt::format("data {} coll., CURVE", collectors);
  events.metric = "events/s";
  events.higher_is_better = true;
  events.rlbus = pick("curve", &trial_result::events_per_s);
  events.direct = pick("plain", &trial_result::events_per_s);
  events.lost = lost;
  events.params = {
      {"collectors", collectors}, {"messages", s.messages}, {"data_payload", s.data_payload}};
  rows.push_back(std::move(events));
  return rows;
}

}  // namespace rlbus::bench
