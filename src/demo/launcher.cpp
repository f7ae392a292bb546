// The launcher's life in order: find the broker, start it and wait for its "listening"
// line, start the workers, train while watching the children (and killing one on request),
// then stop workers, broker and coordinator, and print the summary.
#include "demo/launcher.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

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

std::string stamp(clock::time_point started) {
  return fmt::format("[{:6.1f}s]", std::chrono::duration<double>(clock::now() - started).count());
}

// Reads the broker's log from its pipe on a thread of its own: finds the line that says it
// listens (and where), keeps the last lines for an error message, and passes warnings on
// (a peer expired, a task re-queued) while `forward` is set.
class broker_log {
 public:
  broker_log(int fd, console& out, clock::time_point started)
      : fd_(fd), out_(out), started_(started), thread_([this] { read_loop(); }) {}
  ~broker_log() { thread_.join(); }  // ends at EOF: stop the broker first
  broker_log(const broker_log&) = delete;
  broker_log& operator=(const broker_log&) = delete;

  /// True once the broker said it listens; false if it exited or `timeout` passed first.
  bool wait_ready(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    changed_.wait_for(lock, timeout, [&] { return ready_ || eof_; });
    return ready_;
  }
  std::string router() {
    std::lock_guard lock(mu_);
    return router_;
  }
  std::string events() {
    std::lock_guard lock(mu_);
    return events_;
  }
  std::string last_line() {
    std::lock_guard lock(mu_);
    return last_;
  }
  void forward(bool on) { forward_ = on; }

 private:
  void read_loop() {
    std::string pending;
    char buf[4096];
    while (true) {
      const auto n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      pending.append(buf, static_cast<std::size_t>(n));
      std::size_t eol;
      while ((eol = pending.find('\n')) != std::string::npos) {
        on_line(pending.substr(0, eol));
        pending.erase(0, eol + 1);
      }
    }
    std::lock_guard lock(mu_);
    eof_ = true;
    changed_.notify_all();
  }

  // Lines look like "2024-05-01T10:00:00.123 warn peer ... expired ...".
  void on_line(const std::string& line) {
    const auto level_at = line.find(' ');
    const auto text_at = level_at == std::string::npos ? level_at : line.find(' ', level_at + 1);
    const std::string level =
        text_at == std::string::npos ? "" : line.substr(level_at + 1, text_at - level_at - 1);
    const std::string text = text_at == std::string::npos ? line : line.substr(text_at + 1);
    std::lock_guard lock(mu_);
    last_ = text;
    if (!ready_ && text.rfind("rlbus broker", 0) == 0) {
      router_ = word_after(text, "router");
      events_ = word_after(text, "events");
      ready_ = true;
      changed_.notify_all();
    } else if (forward_ &&
               (level == "warning" || level == "warn" || level == "error" || level == "critical")) {
      out_.line(fmt::format("{} broker: {}", stamp(started_), text));
    }
  }

  static std::string word_after(const std::string& text, const std::string& key) {
    const auto at = text.find(" " + key + " ");
    if (at == std::string::npos) return {};
    const auto from = at + key.size() + 2;
    return text.substr(from, text.find(' ', from) - from);
  }

  int fd_;
  console& out_;
  clock::time_point started_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool ready_ = false, eof_ = false;
  std::string router_, events_, last_;
  std::atomic<bool> forward_{false};
  std::thread thread_;  // last: starts once everything above exists
};

// The broker and the reader of its log; the log's thread ends once the process is gone.
struct broker_child {
  std::unique_ptr<process> proc;
  std::unique_ptr<broker_log> log;
};

broker_child spawn_broker(const std::string& path, const std::vector<std::string>& args,
                          console& out, clock::time_point started) {
  broker_child b;
  b.proc = std::make_unique<process>("broker", path, args, /*capture_output=*/true);
  b.log = std::make_unique<broker_log>(b.proc->output_fd(), out, started);
  return b;
}

// A journal of the broker's own, in a directory of its own, gone with the demo.
class scratch_dir {
 public:
  scratch_dir() {
    std::string tmpl = "/tmp/rlbus-demo-XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~scratch_dir() {
    if (path_.empty()) return;
    for (const char* name : {"/broker.journal", "/broker.journal.tmp"})
      ::unlink((path_ + name).c_str());
    ::rmdir(path_.c_str());
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

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

}  // namespace

int run_demo(launch_options o) {
  const auto started = clock::now();
  o.training.started = started;
  console out;
  console err(stderr);  // why it failed, apart from the progress
  install_signal_handlers();

  const std::string self = own_path();
  const std::string broker_path =
      o.broker_path.empty() ? own_directory() + "/rlbus-broker" : o.broker_path;
  if (self.empty() || ::access(broker_path.c_str(), X_OK) != 0) {
    err.line(fmt::format("rlbus-demo: no broker binary at {} (build it, or name it with --broker)",
                         broker_path));
    return exit_start_failed;
  }

  // ---- the broker, with a journal: killed, it starts again where it was ----
  const scratch_dir scratch;
  if (scratch.path().empty()) {
    err.line("rlbus-demo: cannot make a directory for the broker's journal under /tmp");
    return exit_start_failed;
  }
  const std::string journal = scratch.path() + "/broker.journal";
  std::vector<std::string> broker_args{"--router",        fmt::format("tcp://127.0.0.1:{}", o.port),
                                       "--events",        "tcp://127.0.0.1:0",
                                       "--liveness",      std::to_string(o.liveness),
                                       "--heartbeat-min", "50",
                                       "--journal",       journal,
                                       "--log-level",     "info"};
  auto b = spawn_broker(broker_path, broker_args, out, started);
  if (!b.log->wait_ready(10s)) {
    const auto st = b.proc->wait_exit(2s);
    err.line(fmt::format("rlbus-demo: the broker did not start on {}: {}", broker_args[1],
                         b.log->last_line().empty() ? "no output" : b.log->last_line()));
    if (st) err.line(fmt::format("rlbus-demo: the broker {}", describe_exit(*st)));
    if (o.port != 0)
      err.line(
          fmt::format("rlbus-demo: is port {} in use? Choose another with --port (0: any "
                      "free port).",
                      o.port));
    b.proc->stop(2s);
    return exit_start_failed;
  }
  o.training.endpoint = b.log->router();
  broker_args[1] = o.training.endpoint;  // a restart binds the port the first start got
  b.log->forward(true);
  out.line(fmt::format(
      "rlbus demo: a learner and {} collectors train a linear policy on cart-pole (CartPole-v1, "
      "solved at mean return >= 475 over 100 episodes), all through the broker",
      o.collectors));
  out.line(fmt::format("  broker       pid {:<7} router {}  events {}", b.proc->pid(),
                       o.training.endpoint, b.log->events()));

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
    while (t && fatal.empty()) {
      result = t->poll(50ms);
      if (result != training_state::running) break;
      if (g_stop != 0) {
        interrupted = true;
        break;
      }
      if (const auto st = b.proc->poll_exit()) {
        fatal = "the broker " + describe_exit(*st);
        break;
      }
      if (o.kill_broker_at && !broker_killed && t->iteration() >= *o.kill_broker_at) {
        broker_killed = true;
        const auto old_pid = b.proc->pid();
        b.proc->signal(SIGKILL);
        (void)b.proc->wait_exit(5s);
        b.log.reset();  // its pipe is at its end
        b = spawn_broker(broker_path, broker_args, out, started);
        if (!b.log->wait_ready(10s)) {
          fatal = "the broker did not start again on its journal: " + b.log->last_line();
          break;
        }
        b.log->forward(true);
        out.line(fmt::format(
            "{} chaos: SIGKILL the broker (pid {}) at iteration {}; started again as pid {} on "
            "its journal: expect its tasks back and the running ones re-queued",
            stamp(started), old_pid, t->iteration(), b.proc->pid()));
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

    // ---- stop, in order: coordinator, workers, broker ----
    b.log->forward(false);
    if (t) t->stop();
    for (auto& w : workers)
      if (w.proc) w.proc->stop(3s);
    b.proc->stop(5s);
    if (t) t->print_summary(interrupted ? training_state::running : result);
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
