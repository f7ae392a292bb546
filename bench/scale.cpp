// Scenario 3, scale: N connected, heartbeating, otherwise idle workers (10, 100, 1000, and
// 10 000 where the machine allows) on one broker, beside a bare ZeroMQ ROUTER (the bench's
// echo server) answering the same heartbeats from the same number of DEALERs. Measured on
// the middle process: its CPU share and CPU per heartbeat exchange over an idle window,
// and its resident memory per worker. Then, on a broker with a short heartbeat, the time
// from a worker's death (SIGKILL of its process) to its task's TASK_START on another worker.
//
// Every trial starts its middle process and its swarm afresh, so a trial's memory figure is
// not inflated by what an earlier trial left in the allocator; rlbus and the bare ROUTER
// alternate trial by trial (no warm-up round: each trial is its own cold start anyway, and
// at 10 000 workers a warm-up would cost as much as a trial).
#include <signal.h>

#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "baselines.hpp"
#include "scenario.hpp"
#include "wire.hpp"

namespace rlbus::bench {

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

constexpr auto start_timeout = 15s;
constexpr std::uint32_t liveness = 3;  // the broker's default, passed explicitly
constexpr std::uint32_t long_timeout_ms = 86'400'000;

struct idle_trial {
  double kb_joined = 0;          // RSS growth per worker once all are welcomed and have heartbeated
  double kb_idle = 0;            // the same after the idle window
  double cpu_pct = 0;            // the middle's CPU time / wall time over the idle window, in %
  double us_per_hb = 0;          // the middle's CPU time per heartbeat sent in the window
  std::uint64_t heartbeats = 0;  // heartbeats the swarm sent in the window
  std::uint64_t answered = 0;    // answers the swarm read in the window
  std::uint64_t disconnected = 0;  // DISCONNECT / ERROR the swarm got over the whole trial
};

struct swarm_totals {
  std::uint64_t sent = 0, answered = 0, blocked = 0, disconnected = 0;
};

std::uint64_t number_after(const std::string& line, const std::string& key) {
  const auto w = word_after(line, key);
  return w.empty() ? 0 : std::stoull(w);
}

// One or more swarm processes holding `workers` DEALERs between them: a process holds two
// descriptors per worker (its TCP connection and its socket's mailbox), so above about half
// the descriptor limit the workers are split over several processes.
class swarm_group {
 public:
  swarm_group(const settings& s, const std::string& endpoint, int workers,
              std::uint32_t heartbeat_ms, bool bare, bool accept_tasks, const std::string& prefix,
              std::uint64_t fd_limit) {
    const auto per = std::max<std::uint64_t>(1, (fd_limit - 64) / 2);
    const auto procs = static_cast<int>((static_cast<std::uint64_t>(workers) + per - 1) / per);
    for (int p = 0; p < procs; ++p) {
      const int share = workers / procs + (p < workers % procs ? 1 : 0);
      std::vector<std::string> argv{s.self_bin,       "swarm",
                                    "--connect",      endpoint,
                                    "--workers",      std::to_string(share),
                                    "--heartbeat-ms", std::to_string(heartbeat_ms),
                                    "--id-prefix",    fmt::format("{}{}-", prefix, p)};
      if (bare) argv.emplace_back("--bare");
      if (accept_tasks) argv.emplace_back("--accept-tasks");
      procs_.push_back(std::make_unique<child_process>(argv, log_file(s, "swarm"), s.cpus, true));
    }
    // Connecting takes a while at 10 000 (each HELLO is a session to set up and log).
    const auto limit = std::chrono::milliseconds(60'000 + 20 * workers);
    for (auto& p : procs_) (void)p->wait_for_line("rlbus-bench swarm: welcomed", limit);
  }
  [[nodiscard]] pid_t pid(std::size_t i) const { return procs_.at(i)->pid(); }

  /// The counters of every swarm process, summed.
  swarm_totals report() {
    const auto tag = fmt::format("report {} ", ++asked_);
    for (auto& p : procs_)
      if (!p->send_line(tag)) throw std::runtime_error("a swarm process is gone:\n" + p->log());
    swarm_totals t;
    for (auto& p : procs_) {
      const auto line = p->wait_for_line("rlbus-bench swarm: " + tag, 10s);
      t.sent += number_after(line, "sent");
      t.answered += number_after(line, "answered");
      t.blocked += number_after(line, "blocked");
      t.disconnected += number_after(line, "disconnected");
    }
    return t;
  }

 private:
  std::vector<std::unique_ptr<child_process>> procs_;
  int asked_ = 0;
};

// The broker as the scale scenario needs it: workers may ask for any interval from
// `min_hb_ms` up, the bench's own protocol-level peers may stay silent (600 s).
std::unique_ptr<child_process> start_broker(const settings& s, std::uint32_t min_hb_ms,
                                            std::string& endpoint) {
  auto b = std::make_unique<child_process>(
      std::vector<std::string>{s.broker_bin, "--router", "tcp://127.0.0.1:0", "--events",
                               "tcp://127.0.0.1:0", "--heartbeat-min", std::to_string(min_hb_ms),
                               "--heartbeat-max", "600000", "--liveness", std::to_string(liveness),
                               "--shutdown-linger", "100", "--log-level", "info"},
      log_file(s, "broker"), s.cpus);
  endpoint = word_after(b->wait_for_line("rlbus broker", start_timeout), "router");
  return b;
}

idle_trial idle_run(const settings& s, int n, bool bare, std::uint64_t fd_limit) {
  std::unique_ptr<child_process> middle;
  std::string endpoint;
  if (bare) {
    middle = std::make_unique<child_process>(
        std::vector<std::string>{s.self_bin, "echo", "--bind", "tcp://127.0.0.1:*"},
        log_file(s, "echo"), s.cpus);
    endpoint = word_after(middle->wait_for_line("rlbus-bench echo:", start_timeout), "router");
  } else {
    middle = start_broker(s, std::min<std::uint32_t>(100, s.heartbeat_ms), endpoint);
  }
  const auto pid = middle->pid();
  // What the middle holds bound and ready, before anyone connects.
  const auto rss0 = process_rss_kb(pid);
  swarm_group swarm(s, endpoint, n, s.heartbeat_ms, bare, false, "idle", fd_limit);
  // The window starts once every worker has sent a heartbeat, so it sees the steady state
  // and none of the HELLOs.
  const auto first_round = clock::now() + std::chrono::milliseconds(5 * s.heartbeat_ms) + 10s;
  auto before = swarm.report();
  while (before.sent < static_cast<std::uint64_t>(n)) {
    if (clock::now() > first_round)
      throw std::runtime_error(
          fmt::format("the swarm sent only {} of {} first heartbeats", before.sent, n));
    std::this_thread::sleep_for(std::chrono::milliseconds(s.heartbeat_ms / 10 + 1));
    before = swarm.report();
  }
  const auto rss_joined = process_rss_kb(pid);
  const auto cpu0 = process_cpu_ns(pid);
  const auto t0 = clock::now();
  // The idle window itself: nothing to wait for, the swarm heartbeats on its own clock.
  std::this_thread::sleep_for(std::chrono::duration<double>(s.idle_s));
  const auto cpu1 = process_cpu_ns(pid);
  const auto t1 = clock::now();
  const auto after = swarm.report();
  const auto rss1 = process_rss_kb(pid);
  if (rss_joined == 0 || rss1 == 0)
    throw std::runtime_error("the middle process died during the idle window:\n" + middle->log());

  idle_trial t;
  const auto dn = static_cast<double>(n);
  t.kb_joined = (static_cast<double>(rss_joined) - static_cast<double>(rss0)) / dn;
  t.kb_idle = (static_cast<double>(rss1) - static_cast<double>(rss0)) / dn;
  const auto cpu_ns = static_cast<double>(cpu1 - cpu0);
  const auto wall_ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
  t.cpu_pct = 100.0 * cpu_ns / wall_ns;
  t.heartbeats = after.sent - before.sent;
  t.answered = after.answered - before.answered;
  t.disconnected = after.disconnected;
  if (t.heartbeats > 0) t.us_per_hb = cpu_ns / 1000.0 / static_cast<double>(t.heartbeats);
  // Workers the broker gave up on no longer heartbeat: the window would measure fewer workers
  // than the row says, so such a trial is an error, not a number.
  if (after.disconnected > 0)
    throw std::runtime_error(fmt::format(
        "scale {} workers ({}): the middle sent {} DISCONNECT/ERROR to the swarm (logs in {})", n,
        bare ? "bare" : "rlbus", after.disconnected, s.log_dir));
  if (after.blocked > 0)
    std::fprintf(stderr,
                 "rlbus-bench: scale %d workers (%s): %llu heartbeats found their socket's queue "
                 "full\n",
                 n, bare ? "bare" : "rlbus", static_cast<unsigned long long>(after.blocked));
  return t;
}

codec::submit death_task(const std::string& id) {
  codec::submit t;
  t.task_id = id;
  t.kind = rlbus::role::collector;
  t.start_timeout_ms = t.step_timeout_ms = t.close_timeout_ms = t.task_timeout_ms = long_timeout_ms;
  t.max_attempts = 3;
  return t;
}

// One worker death: a victim process (a swarm of one that takes tasks) holds the running
// task; a standby worker waits. SIGKILL the victim and time until the standby's TASK_START
// for the task's next attempt. The broker learns of the death by the victim's silence
// (liveness x heartbeat), so that product is the bound printed beside it.
double death_run(const settings& s, const std::string& endpoint, zmq::context_t& ctx,
                 wire_peer& coord, int trial, std::uint64_t fd_limit) {
  const auto task_id = fmt::format("death-{}", trial);
  // The victim joins first, so it is first in serial order and gets the task (SPEC §12.6.2).
  swarm_group victim(s, endpoint, 1, s.death_heartbeat_ms, false, true,
                     fmt::format("victim{}-", trial), fd_limit);
  wire_peer standby(ctx, endpoint);
  standby.hello(rlbus::role::collector, fmt::format("standby-{}", trial));
  coord.send(death_task(task_id));
  if (!coord.expect<codec::submitted>("SUBMITTED").accepted)
    throw std::runtime_error("the broker refused the death scenario's task");
  // Running on the victim: its STARTED has reached the broker.
  const auto deadline = clock::now() + 10s;
  while (true) {
    const auto e = coord.expect<codec::task_event>("the task's started event", 10s);
    if (e.task_id == task_id && e.event == "started") break;
    if (clock::now() > deadline) throw std::runtime_error("the victim never started its task");
  }
  const auto t0 = clock::now();
  ::kill(victim.pid(0), SIGKILL);
  const auto bound = std::chrono::milliseconds(liveness * s.death_heartbeat_ms);
  const auto start =
      standby.expect<codec::task_start>("TASK_START for the re-assigned task", 10s + 3 * bound);
  const auto t1 = clock::now();
  if (start.task_id != task_id || start.attempt != 2)
    throw std::runtime_error(fmt::format("the standby got {} attempt {}, not {} attempt 2",
                                         start.task_id, start.attempt, task_id));
  // Leave nothing behind for the next trial: the task goes, the standby says goodbye.
  coord.send(codec::cancel{task_id, "bench trial over"});
  standby.send(codec::disconnect{200, "bench trial over"});
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

row make_row(const std::string& variant, const std::string& metric, std::vector<double> rlbus,
             std::vector<double> bare, nlohmann::json params) {
  row r;
  r.scenario = "scale";
  r.variant = variant;
  r.metric = metric;
  r.rlbus = std::move(rlbus);
  r.direct = std::move(bare);
  r.params = std::move(params);
  return r;
}

}  // namespace

std::vector<row> run_scale(const settings& s) {
  // Both middles hold one descriptor per worker, the swarms two; children inherit the limit.
  const auto fd_limit = raise_fd_limit();
  std::vector<row> rows;
  for (const int n : s.scale_workers) {
    if (fd_limit < static_cast<std::uint64_t>(n) + 256)
      throw std::runtime_error(fmt::format(
          "{} workers need more than {} file descriptors in the broker; the limit is {} "
          "(raise it with ulimit -n / limits.conf)",
          n, n + 256, fd_limit));
    const auto label = fmt::format("scale {} workers", n);
    using variant = std::pair<std::string, std::function<idle_trial(bool)>>;
    const auto run = [&, n](bool bare) {
      return [&, n, bare](bool warmup) {
        return warmup ? idle_trial{} : idle_run(s, n, bare, fd_limit);
      };
    };
    auto res = interleave<idle_trial>(
        s.trials, {variant{"rlbus", run(false)}, variant{"bare", run(true)}}, label);
    const auto pick = [&](const std::string& v, double idle_trial::*field) {
      std::vector<double> out;
      for (const auto& t : res[v]) out.push_back(t.*field);
      return out;
    };
    const auto counts = [&](const std::string& v, std::uint64_t idle_trial::*field) {
      std::vector<std::uint64_t> out;
      for (const auto& t : res[v]) out.push_back(t.*field);
      return out;
    };
    const nlohmann::json params{{"workers", n},
                                {"heartbeat_ms", s.heartbeat_ms},
                                {"idle_s", s.idle_s},
                                {"heartbeats", counts("rlbus", &idle_trial::heartbeats)},
                                {"answered", counts("rlbus", &idle_trial::answered)},
                                {"disconnected", counts("rlbus", &idle_trial::disconnected)},
                                {"bare_heartbeats", counts("bare", &idle_trial::heartbeats)},
                                {"bare_answered", counts("bare", &idle_trial::answered)}};
    const auto variant_name = fmt::format("idle {} workers", n);
    rows.push_back(make_row(variant_name, "KB/w join", pick("rlbus", &idle_trial::kb_joined),
                            pick("bare", &idle_trial::kb_joined), params));
    rows.push_back(make_row(variant_name, "KB/worker", pick("rlbus", &idle_trial::kb_idle),
                            pick("bare", &idle_trial::kb_idle), params));
    rows.push_back(make_row(variant_name, "CPU %", pick("rlbus", &idle_trial::cpu_pct),
                            pick("bare", &idle_trial::cpu_pct), params));
    rows.push_back(make_row(variant_name, "us/hb", pick("rlbus", &idle_trial::us_per_hb),
                            pick("bare", &idle_trial::us_per_hb), params));
  }

  // Death to re-assignment, on one broker for all trials (each trial's workers are new).
  std::string endpoint;
  auto broker = start_broker(s, std::min<std::uint32_t>(100, s.death_heartbeat_ms), endpoint);
  zmq::context_t ctx(1);
  wire_peer coord(ctx, endpoint);
  coord.hello(rlbus::role::coordinator, "bench-death-coord");
  std::vector<double> ms;
  const auto label = fmt::format("scale worker death, heartbeat {} ms", s.death_heartbeat_ms);
  for (int t = 0; t < s.trials; ++t) {
    fmt_progress(label, t + 1, s.trials);
    ms.push_back(death_run(s, endpoint, ctx, coord, t, fd_limit));
  }
  const auto bound_ms = liveness * s.death_heartbeat_ms;
  rows.push_back(make_row(
      fmt::format("death, bound {} ms", bound_ms), "ms", std::move(ms), {},
      {{"heartbeat_ms", s.death_heartbeat_ms}, {"liveness", liveness}, {"bound_ms", bound_ms}}));
  return rows;
}

}  // namespace rlbus::bench
