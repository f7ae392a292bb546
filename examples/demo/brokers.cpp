// See brokers.hpp. Each broker's output goes to a pipe that a thread of its own reads: it
// finds where the broker serves, when it leads and who is in sync with it, keeps the last
// line for an error message, and passes warnings (and elections) on while asked to.
#include "demo/brokers.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "cluster/local_etcd.hpp"
#include "demo/processes.hpp"
#include "util/free_port.hpp"

namespace rlbus::demo {

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

std::string word_after(const std::string& text, const std::string& key) {
  const auto at = text.find(" " + key + " ");
  if (at == std::string::npos) return {};
  const auto from = at + key.size() + 2;
  return text.substr(from, text.find(' ', from) - from);
}

// One broker's log. Lines look like "2024-05-01T10:00:00.123 warning peer ... expired ...";
// a broker of a group also prints "rlbus-broker standing by: ..." once it has started.
class broker_log {
 public:
  broker_log(std::string name, int fd, console& out, clock::time_point started)
      : name_(std::move(name)), fd_(fd), out_(out), started_(started), thread_([this] {
          read_loop();
        }) {}
  ~broker_log() { thread_.join(); }  // ends at EOF: stop the broker first
  broker_log(const broker_log&) = delete;
  broker_log& operator=(const broker_log&) = delete;

  /// True once the broker serves peers (or, with `standby_will_do`, stands by); false if it
  /// exited or `timeout` passed first.
  bool wait_started(std::chrono::milliseconds timeout, bool standby_will_do) {
    std::unique_lock lock(mu_);
    changed_.wait_for(lock, timeout,
                      [&] { return serving_ || (standby_will_do && standing_by_) || eof_; });
    return serving_ || (standby_will_do && standing_by_);
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
  std::optional<clock::time_point> leading_at() {
    std::lock_guard lock(mu_);
    return leading_at_;
  }
  /// The members the leader last recorded in sync (empty before it says).
  std::vector<std::string> in_sync() {
    std::lock_guard lock(mu_);
    return in_sync_;
  }
  void forward(bool on, bool elections) {
    forward_ = on;
    elections_ = elections;
  }

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

  void on_line(const std::string& line) {
    std::lock_guard lock(mu_);
    if (line.rfind("rlbus-broker standing by", 0) == 0) {
      standing_by_ = true;
      changed_.notify_all();
      return;
    }
    const auto level_at = line.find(' ');
    const auto text_at = level_at == std::string::npos ? level_at : line.find(' ', level_at + 1);
    const std::string level =
        text_at == std::string::npos ? "" : line.substr(level_at + 1, text_at - level_at - 1);
    const std::string text = text_at == std::string::npos ? line : line.substr(text_at + 1);
    last_ = text;
    bool election = false;
    if (text.rfind("rlbus broker", 0) == 0) {
      router_ = word_after(text, "router");
      events_ = word_after(text, "events");
      serving_ = true;
      changed_.notify_all();
    } else if (text.rfind("leading group", 0) == 0) {
      leading_at_ = clock::now();
      election = true;
    } else if (const auto at = text.find("in sync now: "); at != std::string::npos) {
      in_sync_.clear();
      std::string rest = text.substr(at + 13);
      for (std::size_t from = 0; from < rest.size();) {
        auto to = rest.find(", ", from);
        if (to == std::string::npos) to = rest.size();
        in_sync_.push_back(rest.substr(from, to - from));
        from = to + 2;
      }
      election = true;
    } else if (text.rfind("standing by:", 0) == 0 || text.rfind("taking over", 0) == 0) {
      election = true;
    }
    if ((forward_ &&
         (level == "warning" || level == "warn" || level == "error" || level == "critical")) ||
        (forward_ && elections_ && election))
      out_.line(fmt::format("{} broker {}: {}", stamp(started_), name_, text));
  }

  std::string name_;
  int fd_;
  console& out_;
  clock::time_point started_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool serving_ = false, standing_by_ = false, eof_ = false;
  std::string router_, events_, last_;
  std::optional<clock::time_point> leading_at_;
  std::vector<std::string> in_sync_;
  std::atomic<bool> forward_{false}, elections_{false};
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace

std::string broker_set::label(const std::string& name) const {
  return o_.group ? "broker " + name : std::string("the broker");
}

struct broker_set::member {
  std::string name;
  std::uint16_t port;
  std::uint16_t web;  // its HTTP endpoint: the web view, /metrics
  std::unique_ptr<process> proc;
  std::unique_ptr<broker_log> log;  // its thread ends once the process is gone
  bool killed = false;              // on purpose: its exit is no failure
};

broker_set::broker_set(broker_options o, console& out, clock::time_point started)
    : o_(std::move(o)), out_(out), started_(started) {
  std::string tmpl = "/tmp/rlbus-demo-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw std::runtime_error("cannot make a directory for the brokers' journals under /tmp");
  scratch_ = tmpl;
  const auto port = o_.port != 0 ? o_.port : static_cast<std::uint16_t>(util::free_tcp_port());
  if (!o_.group) {
    members_.push_back(spawn("broker", port, free_web_port()));
    return;
  }
  try {
    etcd_ = std::make_unique<cluster::local_etcd>(30s, SIGKILL);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("the group's etcd did not start: ") + e.what());
  }
  members_.push_back(spawn("a", port, free_web_port()));  // alone in the group: it leads
  members_.push_back(
      spawn("b", static_cast<std::uint16_t>(util::free_tcp_port()), free_web_port()));
}

broker_set::~broker_set() {
  stop(2s);
  std::error_code ec;
  std::filesystem::remove_all(scratch_, ec);
}

std::vector<std::string> broker_set::args(const std::string& name, std::uint16_t port,
                                          std::uint16_t web) const {
  const auto router = fmt::format("tcp://127.0.0.1:{}", port);
  std::vector<std::string> a{"--router",        router,
                             "--events",        "tcp://127.0.0.1:0",
                             "--liveness",      std::to_string(o_.liveness),
                             "--heartbeat-min", "50",
                             "--journal",       fmt::format("{}/{}.journal", scratch_, name),
                             "--metrics-port",  std::to_string(web),
                             "--log-level",     "info"};
  if (o_.group) {
    for (const auto& s : {"--cluster-etcd", etcd_->url().c_str()}) a.emplace_back(s);
    for (const auto& s : {"--cluster-name", "demo", "--cluster-member"}) a.emplace_back(s);
    a.push_back(name);
    a.emplace_back("--advertise");
    a.push_back(router);
  }
  return a;
}

// The web view's port (and /metrics'): any free one, named in the opening block.
std::uint16_t broker_set::free_web_port() {
  return static_cast<std::uint16_t>(util::free_tcp_port());
}

std::unique_ptr<broker_set::member> broker_set::spawn(const std::string& name, std::uint16_t port,
                                                      std::uint16_t web) {
  auto m = std::make_unique<member>();
  m->name = name;
  m->port = port;
  m->web = web;
  m->proc = std::make_unique<process>(label(name), o_.path, args(name, port, web),
                                      /*capture_output=*/true);
  m->log = std::make_unique<broker_log>(name, m->proc->output_fd(), out_, started_);
  m->log->forward(forward_, o_.group);
  // The first broker serves; a later one of a group stands by.
  const bool standby = o_.group && !members_.empty();
  if (!m->log->wait_started(15s, standby)) {
    const auto st = m->proc->wait_exit(2s);
    auto why = fmt::format("{} did not start on tcp://127.0.0.1:{}: {}", label(name), port,
                           m->log->last_line().empty() ? "no output" : m->log->last_line());
    if (st) why += fmt::format(" (it {})", describe_exit(*st));
    if (o_.port != 0 && members_.empty())
      why += fmt::format("; is port {} in use? Choose another with --port (0: any free port)",
                         o_.port);
    m->proc->stop(2s);
    m->log.reset();
    throw std::runtime_error(why);
  }
  return m;
}

std::string broker_set::endpoint() const {
  std::string all;
  for (const auto& m : members_)
    all += fmt::format("{}tcp://127.0.0.1:{}", all.empty() ? "" : ",", m->port);
  return all;
}

std::vector<std::string> broker_set::describe() const {
  std::vector<std::string> lines;
  if (etcd_)
    lines.push_back(fmt::format("  {:<12} pid {:<7} {}", "etcd", etcd_->pid(), etcd_->url()));
  for (const auto& m : members_) {
    const auto name = o_.group ? "broker-" + m->name : std::string("broker");
    if (o_.group && m != members_.front())
      lines.push_back(fmt::format("  {:<12} pid {:<7} router tcp://127.0.0.1:{}  (standby)", name,
                                  m->proc->pid(), m->port));
    else
      lines.push_back(fmt::format("  {:<12} pid {:<7} router {}  events {}{}", name, m->proc->pid(),
                                  m->log->router(), m->log->events(),
                                  o_.group ? "  (leader)" : ""));
  }
  for (const auto& m : members_) {
    const auto name = o_.group ? "broker-" + m->name : std::string("broker");
    lines.push_back(
        fmt::format("  {:<12} web view http://127.0.0.1:{}/  (open it in a browser: "
                    "workers, tasks and rates, live)",
                    name, m->web));
  }
  return lines;
}

void broker_set::forward(bool on) {
  forward_ = on;
  for (auto& m : members_) m->log->forward(on, o_.group);
}

std::optional<std::string> broker_set::tend() {
  for (auto& m : members_) {
    if (m->killed) continue;
    if (const auto st = m->proc->poll_exit())
      return fmt::format("{} {}: {}", label(m->name), describe_exit(*st), m->log->last_line());
  }
  // The killed leader comes back as a standby once its successor leads, so that the group
  // shows a takeover rather than the old leader winning its own election again.
  if (takeover_ && !takeover_->leading_at) {
    for (auto& m : members_)
      if (m->name == takeover_->successor) takeover_->leading_at = m->log->leading_at();
    if (takeover_->leading_at) {
      for (auto& m : members_) {
        if (!m->killed) continue;
        m->log.reset();  // its pipe is at its end
        try {
          m = spawn(m->name, m->port, m->web);
        } catch (const std::exception& e) {
          return e.what();
        }
        out_.line(
            fmt::format("{} broker {} started again as pid {}: it stands by and copies {}'s "
                        "journal",
                        stamp(started_), m->name, m->proc->pid(), takeover_->successor));
      }
    }
  }
  return std::nullopt;
}

std::string broker_set::kill_and_restart() {
  auto& m = members_.front();
  const auto old_pid = m->proc->pid();
  m->proc->signal(SIGKILL);
  (void)m->proc->wait_exit(5s);
  m->log.reset();
  m = spawn(m->name, m->port, m->web);
  return fmt::format(
      "SIGKILL the broker (pid {}); started again as pid {} on its journal: "
      "expect its tasks back and the running ones re-queued",
      old_pid, m->proc->pid());
}

bool broker_set::standby_in_sync() const {
  if (!o_.group || members_.size() < 2) return false;
  const auto held = members_[0]->log->in_sync();
  return std::find(held.begin(), held.end(), members_[1]->name) != held.end();
}

std::string broker_set::kill_leader() {
  auto& leader = members_[0];
  const auto pid = leader->proc->pid();
  leader->proc->signal(SIGKILL);
  takeover_ = takeover_record{leader->name, members_[1]->name, clock::now(), std::nullopt};
  leader->killed = true;
  (void)leader->proc->wait_exit(5s);
  std::swap(members_[0], members_[1]);  // the successor first, as the one that leads
  return fmt::format(
      "SIGKILL the leader, broker {} (pid {}): broker {} holds a copy of its journal and takes "
      "over once the leader's lease in etcd runs out; peers find it by themselves",
      takeover_->killed, pid, takeover_->successor);
}

std::optional<takeover_record> broker_set::takeover() const {
  return takeover_;
}

void broker_set::stop(std::chrono::milliseconds grace) {
  for (auto& m : members_) {
    if (m->proc) m->proc->stop(grace);
    m->log.reset();
  }
  members_.clear();
  etcd_.reset();
}

}  // namespace rlbus::demo
