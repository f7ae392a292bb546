// Scenario 7, what a lost leader costs in time. A coordinator and two collectors (the C++
// SDK, default settings, given both brokers of a group) keep tasks running through a group
// of two brokers beside an etcd. With tasks running, the leader is SIGKILLed; the standby
// takes over on its copy of the journal and the killed broker comes back as the new standby;
// `takeover_kills` times. Per kill, two times from the SIGKILL:
// - to the first task running again: a collector starting attempt 2 or later of a task,
//   which only the new leader can hand out;
// - to the coordinator's first event from the new leader: the first "broker restarted"
//   re-queue, which only it sends.
// Beside them, the same two times for one broker alone, SIGKILLed and started again at once
// on its journal on the same machine: what a takeover adds to a restart. Then the task step
// latency (a learner's data request answered by the coordinator, wire level) through a
// leader with its standby, beside the same broker alone with the same journal.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include <fmt/format.h>
#include <msgpack.hpp>

#include "baselines.hpp"
#include "group.hpp"
#include "rlbus/coordinator.hpp"
#include "rlbus/worker.hpp"
#include "scenario.hpp"
#include "util/free_port.hpp"
#include "wire.hpp"

namespace rlbus::bench {

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

constexpr auto task_length = 300ms;      // a collector's task: long enough to be cut
constexpr std::size_t open_target = 4;   // tasks the coordinator keeps open
constexpr auto takeover_deadline = 60s;  // a takeover slower than this fails the scenario

// {"collector_done": true}, msgpack: a collector's info that says its task is done (the
// coordinator's default judge then finishes it).
std::string done_info() {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> pk(b);
  pk.pack_map(1);
  pk.pack("collector_done");
  pk.pack(true);
  return {b.data(), b.size()};
}

// The times of one kill, in ms from the SIGKILL.
struct kill_times {
  double first_task = 0, first_event = 0;
};

// Collectors and a coordinator on `endpoint`, and the moments that follow a kill.
class task_load {
 public:
  explicit task_load(const std::string& endpoint, const std::string& tag) {
    rlbus::coordinator_callbacks cb;
    cb.on_task_requeued = [this](const std::string&, std::uint32_t, const std::string& reason,
                                 const std::optional<std::string>&) {
      if (reason.find("broker restarted") != std::string::npos) mark(first_event_);
    };
    coord_ = std::make_unique<rlbus::coordinator>(
        rlbus::coordinator_options{endpoint, "bench-takeover-coord-" + tag}, std::move(cb));
    for (int k = 0; k < 2; ++k) {
      rlbus::worker_options wo;
      wo.endpoint = endpoint;
      wo.role = rlbus::role::collector;
      wo.id = fmt::format("bench-takeover-{}-c{}", tag, k);
      rlbus::task_handlers h;
      h.run = [this](rlbus::task_handle& t) {
        if (t.attempt() >= 2) mark(first_task_);
        ++running_;
        const auto until = clock::now() + task_length;
        while (!t.stop_requested() && clock::now() < until) std::this_thread::sleep_for(5ms);
        t.emit_info(done_info());
        while (!t.stop_requested()) std::this_thread::sleep_for(5ms);
        --running_;
      };
      workers_.push_back(std::make_unique<rlbus::worker>(wo, std::move(h)));
    }
    for (auto& w : workers_)
      if (!w->wait_for(rlbus::connection_state::ready, 30s))
        throw std::runtime_error("the takeover bench's collectors did not connect");
    if (!coord_->wait_for(rlbus::connection_state::ready, 30s))
      throw std::runtime_error("the takeover bench's coordinator did not connect");
  }

  /// Keeps tasks open until one is running at a collector.
  void until_running(std::chrono::seconds timeout) {
    const auto deadline = clock::now() + timeout;
    while (running_.load() == 0) {
      top_up();
      if (clock::now() > deadline) throw std::runtime_error("no task ran within the deadline");
      std::this_thread::sleep_for(5ms);
    }
  }

  /// Kills with `kill` (which returns once the broker is gone), then waits for both marks.
  kill_times measure(const std::function<void()>& kill) {
    first_task_ = first_event_ = 0;
    killed_at_ = clock::now().time_since_epoch().count();
    kill();
    const auto deadline = clock::now() + takeover_deadline;
    while (first_task_.load() == 0 || first_event_.load() == 0) {
      if (clock::now() > deadline)
        throw std::runtime_error(fmt::format(
            "no {} within {} s of the kill",
            first_task_.load() == 0 ? "task ran again" : "re-queue reached the coordinator",
            takeover_deadline.count()));
      std::this_thread::sleep_for(1ms);
    }
    const auto ms = [&](std::int64_t at) {
      return std::chrono::duration<double, std::milli>(clock::duration(at - killed_at_)).count();
    };
    return {ms(first_task_.load()), ms(first_event_.load())};
  }

 private:
  void top_up() {
    while (coord_->open_tasks() < open_target) {
      rlbus::task_spec t;
      t.task_id = fmt::format("t{}", ++submitted_);
      t.kind = rlbus::role::collector;
      const auto r = coord_->submit(t, 10s);
      if (!r || !r->accepted) throw std::runtime_error("the broker did not accept a bench task");
    }
  }
  void mark(std::atomic<std::int64_t>& at) {
    if (killed_at_ == 0) return;
    std::int64_t none = 0;
    at.compare_exchange_strong(none, clock::now().time_since_epoch().count());
  }

  std::vector<std::unique_ptr<rlbus::worker>> workers_;  // stop after the coordinator
  std::unique_ptr<rlbus::coordinator> coord_;
  std::atomic<int> running_{0};
  std::atomic<std::int64_t> killed_at_{0}, first_task_{0}, first_event_{0};
  std::uint64_t submitted_ = 0;
};

// A broker alone on a journal, which the bench kills and starts again at once.
class restarted_broker {
 public:
  explicit restarted_broker(const settings& s)
      : s_(s),
        router_(fmt::format("tcp://127.0.0.1:{}", util::free_tcp_port())),
        journal_(s.log_dir + "/takeover-alone.journal") {
    start();
  }
  [[nodiscard]] const std::string& router() const { return router_; }
  void kill_and_restart() {
    ::kill(proc_->pid(), SIGKILL);
    (void)proc_->stop(5s);  // reaps it
    start();
  }

 private:
  void start() {
    proc_.reset();
    proc_ = std::make_unique<child_process>(
        std::vector<std::string>{s_.broker_bin, "--router", router_, "--events",
                                 "tcp://127.0.0.1:0", "--journal", journal_, "--shutdown-linger",
                                 "100"},
        log_file(s_, "broker-alone"), s_.cpus);
    proc_->wait_for_line("rlbus broker", 30s);
  }
  const settings& s_;
  std::string router_, journal_;
  std::unique_ptr<child_process> proc_;
};

// Median of one learner's data requests answered by the coordinator through `router`.
double step_latency_us(const std::string& router, int rounds, const std::string& tag) {
  zmq::context_t ctx(1);
  wire_peer coord(ctx, router);
  coord.hello(rlbus::role::coordinator, "bench-step-coord-" + tag);
  wire_peer learner(ctx, router);
  learner.hello(rlbus::role::learner, "bench-step-learner-" + tag, {{"step", 1}});
  codec::submit t;
  t.task_id = "step-" + tag;
  t.kind = rlbus::role::learner;
  t.requirements = {{"step", 1}};
  coord.send(t);
  if (!coord.expect<codec::submitted>("SUBMITTED").accepted)
    throw std::runtime_error("the broker refused the step task");
  const auto start = learner.expect<codec::task_start>("TASK_START");
  learner.send(codec::started{start.task_id, start.attempt});
  std::vector<double> samples;
  for (std::uint64_t request = 1; request <= static_cast<std::uint64_t>(rounds); ++request) {
    const auto t0 = clock::now();
    learner.send(codec::get_data{start.task_id, start.attempt, request, "bench", 1, request});
    while (true) {  // the coordinator's side, then the learner's answer
      const auto e = coord.expect<codec::task_event>("the data request");
      if (e.event != "data_request") continue;
      coord.send(codec::data_reply{e.task_id, request, codec::empty_map_blob});
      break;
    }
    while (learner.expect<codec::learn>("LEARN").request_id != request) {
    }
    samples.push_back(micros(clock::now() - t0));
  }
  return median(samples);
}

row time_row(const std::string& variant, const std::vector<double>& group,
             const std::vector<double>& alone, const settings& s, int lease_ms) {
  row r;
  r.scenario = "takeover";
  r.variant = variant;
  r.metric = "ms";
  r.rlbus = group;
  r.direct = alone;
  r.params = {{"kills", s.takeover_kills},
              {"max_ms", *std::max_element(group.begin(), group.end())},
              {"baseline_max_ms", *std::max_element(alone.begin(), alone.end())},
              {"baseline", "one broker SIGKILLed and started again at once on its journal"},
              {"task_ms", task_length.count()},
              {"lease_ms", lease_ms}};
  return r;
}

}  // namespace

std::vector<row> run_takeover(const settings& s) {
  if (const auto missing = etcd_missing(); !missing.empty())
    throw std::runtime_error("the takeover scenario needs " + missing);
  // The default lease, then the shortest etcd can grant (1 s, with etcd's election timeout
  // at 500 ms), its margin a quarter of it.
  struct lease {
    int ms;
    std::vector<std::string> flags;
    std::string suffix;
    std::vector<double> task, event;
  };
  std::vector<lease> leases{
      {2000, {}, "", {}, {}},
      {1000, {"--cluster-lease", "1000", "--cluster-lease-margin", "250"}, ", lease 1 s", {}, {}}};
  for (auto& l : leases) {
    broker_group group(s, fmt::format("takeover-{}", l.ms), l.flags);
    task_load load(group.endpoints(), fmt::format("group-{}", l.ms));
    for (int k = 1; k <= s.takeover_kills; ++k) {
      fmt_progress(fmt::format("takeover: the leader killed (lease {} ms)", l.ms), k,
                   s.takeover_kills);
      load.until_running(30s);
      const auto t = load.measure([&] { group.kill_leader(); });
      l.task.push_back(t.first_task);
      l.event.push_back(t.first_event);
      group.rejoin();
    }
  }
  std::vector<double> alone_task, alone_event;
  {
    restarted_broker alone(s);
    task_load load(alone.router(), "alone");
    for (int k = 1; k <= s.takeover_kills; ++k) {
      fmt_progress("takeover: the broker alone restarted", k, s.takeover_kills);
      load.until_running(30s);
      const auto t = load.measure([&] { alone.kill_and_restart(); });
      alone_task.push_back(t.first_task);
      alone_event.push_back(t.first_event);
    }
  }
  std::vector<row> rows;
  for (const auto& l : leases) {
    rows.push_back(time_row("kill -9 to a task run" + l.suffix, l.task, alone_task, s, l.ms));
    rows.push_back(time_row("kill -9 to an event" + l.suffix, l.event, alone_event, s, l.ms));
  }

  // Step latency: the same journal settings (the defaults) with a standby and without.
  row step;
  step.scenario = "takeover";
  step.variant = "step with a standby";
  step.metric = "median us";
  step.params = {{"rounds", s.rounds}, {"baseline", "the same broker alone, same journal"}};
  for (int t = 0; t <= s.trials; ++t) {  // trial 0 warms up
    fmt_progress("takeover: step latency", t, s.trials);
    double with_standby = 0, alone = 0;
    {
      broker_group group(s, fmt::format("step-{}", t), {});
      with_standby = step_latency_us(group.leader_router(), s.rounds, "g");
    }
    {
      middle_boxes mb(s, false, false,
                      {"--journal", fmt::format("{}/step-alone-{}.journal", s.log_dir, t)});
      alone = step_latency_us(mb.router, s.rounds, "a");
    }
    if (t == 0) continue;
    step.rlbus.push_back(with_standby);
    step.direct.push_back(alone);
  }
  rows.push_back(std::move(step));
  return rows;
}

}  // namespace rlbus::bench
