// The launcher's life in order: find the broker, start it (or a group of two, see
// brokers.hpp), start the workers, train while watching the children (and killing one on
// request), then stop workers, brokers and coordinator, and print the summary.
#include "demo/launcher.hpp"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "demo/brokers.hpp"
#include "demo/console.hpp"
#include "demo/processes.hpp"

namespace rlbus::demo {

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_stop = 0;

extern "C" void on_stop_signal(int /*sig*/) {
  g_stop = 1;
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

// The summary's line on a takeover: when the leader was killed, how long until its successor
// led and until the coordinator heard of a task from it, and how many tasks ran again.
std::string describe_takeover(const takeover_record& tk,
                              std::optional<clock::time_point> first_event, std::uint64_t requeued,
                              clock::time_point started) {
  const auto secs = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  std::string line = fmt::format("takeover:        broker {} killed at {:.1f} s; ", tk.killed,
                                 secs(tk.killed_at - started));
  if (!tk.leading_at) return line + fmt::format("broker {} never led", tk.successor);
  line += fmt::format("broker {} led {:.2f} s later", tk.successor,
                      secs(*tk.leading_at - tk.killed_at));
  if (first_event)
    line += fmt::format(", first task event from it {:.2f} s after the kill",
                        secs(*first_event - tk.killed_at));
  return line + fmt::format("; {} tasks re-run", requeued);
}

struct worker_child {
  std::string id;
  rlbus::role role;
  std::unique_ptr<process> proc;  // null while it waits to be respawned
  std::optional<clock::time_point> respawn_at;
};

std::unique_ptr<process> spawn_worker(const std::string& self, rlbus::role r, const std::string& id,
                                      const std::string& endpoint,
                                      std::chrono::milliseconds heartbeat) {
  return std::make_unique<process>(
      id, self,
      std::vector<std::string>{std::string(to_string(r)), "--id", id, "--endpoint", endpoint,
                               "--heartbeat-ms", std::to_string(heartbeat.count())});
}

// The broker to run: the one named, else the one next to this binary (installed, both are in
// bin/), else the build tree's. Names every place tried when none holds one.
std::string find_broker(const std::string& named) {
  if (!named.empty()) return named;
  const auto here = own_directory();
  std::string beside = here + "/rlbus-broker";
  if (::access(beside.c_str(), X_OK) == 0) return beside;
  std::string built = here + "/" RLBUS_DEMO_BROKER_IN_BUILD;  // set by examples/demo/meson.build
  if (::access(built.c_str(), X_OK) == 0) return built;
  return beside + " or " + built;
}

}  // namespace

int run_demo(launch_options o) {
  const auto started = clock::now();
  o.training.started = started;
  console out;
  console err(stderr);  // why it failed, apart from the progress
  install_signal_handlers();

  const std::string self = own_path();
  const std::string broker_path = find_broker(o.broker_path);
  if (self.empty() || ::access(broker_path.c_str(), X_OK) != 0) {
    err.line(fmt::format("rlbus-demo: no broker binary at {} (build it, or name it with --broker)",
                         broker_path));
    return exit_start_failed;
  }

  // ---- the broker (or a group of two), each with a journal ----
  std::unique_ptr<broker_set> brokers;
  try {
    brokers = std::make_unique<broker_set>(
        broker_options{broker_path, o.port, o.liveness, o.kill_leader_at.has_value()}, out,
        started);
  } catch (const std::exception& e) {
    err.line(fmt::format("rlbus-demo: {}", e.what()));
    return exit_start_failed;
  }
  o.training.endpoint = brokers->endpoint();
  brokers->forward(true);
  out.line(fmt::format(
      "rlbus demo: a learner and {} collectors train a linear policy on cart-pole (CartPole-v1, "
      "solved at mean return >= 475 over 100 episodes), all through the broker{}",
      o.collectors, o.kill_leader_at ? "s of a group" : ""));
  for (const auto& line : brokers->describe()) out.line(line);

  // ---- the workers: this binary again, as separate processes ----
  std::vector<worker_child> workers;
  workers.push_back({"learner-0", rlbus::role::learner, nullptr, std::nullopt});
  for (std::uint32_t k = 1; k <= o.collectors; ++k)
    workers.push_back(
        {fmt::format("collector-{}", k), rlbus::role::collector, nullptr, std::nullopt});
  for (auto& w : workers) {
    w.proc = spawn_worker(self, w.role, w.id, o.training.endpoint, o.training.heartbeat);
    out.line(fmt::format("  {:<12} pid {}", w.id, w.proc->pid()));
  }
  const auto expiry = o.liveness * o.training.heartbeat;
  out.line(fmt::format(
      "  (to see a lost worker's task re-queued, kill a collector: kill -9 <its pid>; the broker "
      "notices within ~{} ms)",
      expiry.count()));

  // ---- training: this process is the coordinator ----
  training_state result = training_state::running;
  bool interrupted = false;
  bool start_failed = false;
  std::string fatal;
  {
    std::unique_ptr<trainer> t;
    try {
      t = std::make_unique<trainer>(o.training, out);
      t->start(10s);
    } catch (const std::exception& e) {
      fatal = e.what();
      start_failed = true;
    }
    bool killed = false;
    bool broker_killed = false;
    bool leader_killed = false;
    trainer_counts before_takeover;
    std::optional<std::uint64_t> events_at_leading;  // once the successor leads
    std::optional<clock::time_point> first_event_after;
    while (t && fatal.empty()) {
      result = t->poll(50ms);
      if (result != training_state::running) break;
      if (g_stop != 0) {
        interrupted = true;
        break;
      }
      if (auto why = brokers->tend()) {
        fatal = std::move(*why);
        break;
      }
      if (o.kill_broker_at && !broker_killed && t->iteration() >= *o.kill_broker_at) {
        broker_killed = true;
        try {
          const auto what = brokers->kill_and_restart();
          out.line(
              fmt::format("{} chaos: {} (iteration {})", stamp(started), what, t->iteration()));
        } catch (const std::exception& e) {
          fatal = std::string("the broker did not start again on its journal: ") + e.what();
          break;
        }
      }
      // Killed only once the standby holds all the leader accepted: before, no broker would
      // be allowed to lead.
      if (o.kill_leader_at && !leader_killed && t->iteration() >= *o.kill_leader_at &&
          brokers->standby_in_sync()) {
        leader_killed = true;
        before_takeover = t->counts();
        const auto iteration = t->iteration();
        out.line(fmt::format("{} chaos: {} (iteration {})", stamp(started), brokers->kill_leader(),
                             iteration));
      }
      if (const auto tk = brokers->takeover(); tk && tk->leading_at && !first_event_after) {
        if (t->counts().events > events_at_leading.value_or(UINT64_MAX))
          first_event_after = clock::now();
        else if (!events_at_leading)
          events_at_leading = t->counts().events;
      }
      for (auto& w : workers) {
        if (!w.proc) {
          if (w.respawn_at && clock::now() >= *w.respawn_at) {
            w.proc = spawn_worker(self, w.role, w.id, o.training.endpoint, o.training.heartbeat);
            w.respawn_at.reset();
            out.line(fmt::format("{} respawned {} as pid {}", stamp(started), w.id, w.proc->pid()));
          }
          continue;
        }
        const auto st = w.proc->poll_exit();
        if (!st) continue;
        if (w.role == rlbus::role::learner) {
          fatal = fmt::format("{} (pid {}) {}", w.id, w.proc->pid(), describe_exit(*st));
          break;
        }
        out.line(fmt::format("{} {} (pid {}) {}", stamp(started), w.id, w.proc->pid(),
                             describe_exit(*st)));
        w.proc.reset();
        if (o.respawn) {
          // Under the same id, once the broker has expired the old session: until then a
          // HELLO with that id is refused as a duplicate (and retried), which is only noise.
          w.respawn_at = clock::now() + expiry + 250ms;
          out.line(fmt::format("{} {} will be respawned once the broker has expired it",
                               stamp(started), w.id));
        }
      }
      std::erase_if(workers, [](const worker_child& w) { return !w.proc && !w.respawn_at; });
      if (!fatal.empty()) break;

      if (o.kill_collector_at && !killed && t->iteration() >= *o.kill_collector_at) {
        if (const auto busy = t->find_busy_collector()) {
          for (auto& w : workers) {
            if (w.id != busy->collector || !w.proc) continue;
            w.proc->signal(SIGKILL);
            killed = true;
            out.line(fmt::format(
                "{} chaos: SIGKILL {} (pid {}) while it runs {}; expect the broker to expire it "
                "and re-queue the task",
                stamp(started), w.id, w.proc->pid(), busy->task_id));
          }
        }
      }
    }
    if (o.kill_collector_at && !killed && result == training_state::solved)
      out.line(fmt::format("{} chaos: solved before iteration {}; nothing was killed",
                           stamp(started), *o.kill_collector_at));
    if (o.kill_broker_at && !broker_killed && result == training_state::solved)
      out.line(fmt::format("{} chaos: solved before iteration {}; the broker was not killed",
                           stamp(started), *o.kill_broker_at));
    if (o.kill_leader_at && !leader_killed && result == training_state::solved)
      out.line(fmt::format("{} chaos: solved before iteration {}; the leader was not killed",
                           stamp(started), *o.kill_leader_at));

    // ---- linger: the run's processes stay up, idle, for a look at the web view ----
    if (t && fatal.empty() && !interrupted && o.linger.count() > 0) {
      out.line(fmt::format(
          "{} training ended; everything stays up for {} s (--linger): the web view above shows "
          "the run; Ctrl-C ends the wait",
          stamp(started), o.linger.count()));
      const auto until = clock::now() + o.linger;
      while (g_stop == 0 && clock::now() < until) {
        if (auto why = brokers->tend()) {
          err.line("rlbus-demo: " + *why);
          break;
        }
        std::this_thread::sleep_for(100ms);
      }
    }

    // ---- stop, in order: coordinator, workers, broker ----
    brokers->forward(false);
    if (t) t->stop();
    for (auto& w : workers)
      if (w.proc) w.proc->stop(3s);
    brokers->stop(5s);
    if (t) t->print_summary(interrupted ? training_state::running : result);
    if (const auto tk = brokers->takeover(); tk && t)
      out.line(describe_takeover(*tk, first_event_after,
                                 t->counts().requeued - before_takeover.requeued, started));
  }

  if (!fatal.empty()) {
    err.line("rlbus-demo: " + fatal);
    return start_failed ? exit_start_failed : exit_not_solved;
  }
  if (interrupted) {
    err.line("rlbus-demo: interrupted; everything stopped");
    return exit_interrupted;
  }
  switch (result) {
    case training_state::solved:
      return exit_solved;
    case training_state::out_of_iterations:
      err.line(fmt::format("rlbus-demo: not solved within {} iterations (--max-iterations)",
                           o.training.max_iterations));
      break;
    case training_state::out_of_time:
      err.line(fmt::format("rlbus-demo: not solved within {} s (--time-limit)",
                           o.training.time_limit.count()));
      break;
    default:
      err.line("rlbus-demo: training failed");
      break;
  }
  return exit_not_solved;
}

}  // namespace rlbus::demo
