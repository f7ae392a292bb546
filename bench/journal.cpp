// Scenario 5, the journal's cost: whole task lifecycles per second through the broker with a
// journal (--journal) under each fsync policy, beside the same broker without one, in the same
// rotation. A lifecycle is what the journal writes for: SUBMIT -> TASK_START -> STARTED ->
// FINISH -> TASK_CLOSE -> RESULT -> finished, each task recorded when it is accepted, begun
// and ended. The coordinator keeps a window of tasks in flight to a few wire-level
// collectors, for a fixed time per trial; the journal is a file in the bench's log folder, so
// the figures are those of that folder's file system (named in the row).
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>

#include "baselines.hpp"
#include "group.hpp"
#include "process.hpp"
#include "scenario.hpp"
#include "wire.hpp"

namespace rlbus::bench {

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

constexpr int collectors = 4;
constexpr std::uint64_t in_flight = 4 * collectors;  // tasks submitted and not finished

struct trial_result {
  double tasks_per_s = 0;
  std::uint64_t unfinished = 0;  // submitted, never finished
};

// A wire-level collector: STARTED for every TASK_START, RESULT for every TASK_CLOSE.
void collector_loop(wire_peer& w, const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) {
    const auto m = w.recv(20ms);
    if (!m) continue;
    if (const auto* s = std::get_if<codec::task_start>(&*m)) {
      w.send(codec::started{s->task_id, s->attempt});
    } else if (const auto* c = std::get_if<codec::task_close>(&*m)) {
      w.send(codec::task_result{c->task_id, c->attempt, codec::empty_map_blob});
    }
  }
}

trial_result lifecycles(const std::string& router, std::chrono::milliseconds length, int trial) {
  zmq::context_t ctx(1);
  wire_peer coord(ctx, router);
  coord.hello(rlbus::role::coordinator, "bench-journal-coord");
  std::vector<std::unique_ptr<wire_peer>> peers;
  std::vector<std::unique_ptr<socket_thread>> threads;
  for (int k = 0; k < collectors; ++k) {
    peers.push_back(std::make_unique<wire_peer>(ctx, router));
    peers.back()->hello(rlbus::role::collector, fmt::format("bench-journal-c{}", k));
  }
  for (auto& p : peers) {
    threads.push_back(std::make_unique<socket_thread>());
    threads.back()->start([&w = *p](const std::atomic<bool>& stop) { collector_loop(w, stop); });
  }
  std::uint64_t submitted = 0, finished = 0;
  const auto submit_one = [&] {
    codec::submit t;
    t.task_id = fmt::format("j{}-{}", trial, ++submitted);
    t.kind = rlbus::role::collector;
    coord.send(t);
  };
  const auto t0 = clock::now();
  const auto end = t0 + length;
  auto last = t0;
  for (std::uint64_t i = 0; i < in_flight; ++i) submit_one();
  // After the deadline nothing more is submitted; what is in flight is waited for.
  while (finished < submitted) {
    const auto m = coord.recv(5s);
    if (!m) break;  // the rest never finished: counted below
    if (const auto* e = std::get_if<codec::task_event>(&*m)) {
      if (e->event == "started") {
        coord.send(codec::finish{e->task_id});
      } else if (e->event == "finished") {
        ++finished;
        last = clock::now();
        if (last < end) submit_one();
      }
    } else if (const auto* r = std::get_if<codec::submitted>(&*m); r && !r->accepted) {
      throw std::runtime_error("the broker refused a bench task: " + r->reason);
    }
  }
  for (auto& t : threads) t->stop();
  const auto seconds = std::chrono::duration<double>(last - t0).count();
  return {seconds > 0 ? static_cast<double>(finished) / seconds : 0, submitted - finished};
}

trial_result lifecycles(const settings& s, const std::vector<std::string>& broker_args,
                        std::chrono::milliseconds length, int trial) {
  middle_boxes mb(s, false, false, broker_args);
  return lifecycles(mb.router, length, trial);
}

std::string fs_type(const std::string& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) return "?";
  switch (static_cast<unsigned long>(st.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x01021994:
      return "tmpfs";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x794C7630:
      return "overlayfs";
    default:
      return fmt::format("fs 0x{:x}", static_cast<unsigned long>(st.f_type));
  }
}

}  // namespace

std::vector<row> run_journal(const settings& s) {
  const auto length = std::chrono::milliseconds(s.journal_trial_ms);
  const auto where = fs_type(s.log_dir);
  int n = 0;
  std::uint64_t unfinished = 0;
  // "": no journal. Each trial writes a journal of its own, so none restores another's.
  const auto variant = [&](std::string fsync) {
    return [&, fsync](bool warmup) {
      std::vector<std::string> args;
      if (!fsync.empty())
        args = {"--journal", fmt::format("{}/journal-{}-{}", s.log_dir, fsync, n + 1),
                "--journal-fsync", fsync};
      const auto r = lifecycles(s, args, warmup ? length / 4 : length, ++n);
      if (!warmup) unfinished += r.unfinished;
      return r.tasks_per_s;
    };
  };
  using entry = std::pair<std::string, std::function<double(bool)>>;
  std::vector<entry> variants{{"none", variant("")},
                              {"fsync none", variant("none")},
                              {"fsync batch", variant("batch")},
                              {"fsync always", variant("always")}};
  // The same journal with a standby in sync, which every answer waits for (SPEC §14.10).
  const bool with_standby = etcd_missing().empty();
  if (with_standby)
    variants.emplace_back("fsync batch, standby", [&](bool warmup) {
      const broker_group group(s, std::to_string(++n),
                               {"--journal-fsync", "batch", "--heartbeat-max", "600000"});
      const auto r = lifecycles(group.leader_router(), warmup ? length / 4 : length, n);
      if (!warmup) unfinished += r.unfinished;
      return r.tasks_per_s;
    });
  else
    std::fprintf(stderr, "journal: etcd is not installed: no row with a standby\n");
  auto results = interleave<double>(s.trials, variants, "journal");
  std::vector<row> rows;
  for (const char* policy : {"none", "batch", "always"}) {
    row r;
    r.scenario = "journal";
    r.variant = fmt::format("fsync {}, {}", policy, where);
    r.metric = "tasks/s";
    r.higher_is_better = true;
    r.rlbus = results[fmt::format("fsync {}", policy)];
    r.direct = results["none"];
    r.lost = unfinished;
    r.params = {{"fsync", policy},
                {"filesystem", where},
                {"collectors", collectors},
                {"in_flight", in_flight},
                {"trial_ms", s.journal_trial_ms}};
    rows.push_back(std::move(r));
  }
  if (with_standby) {
    row r;
    r.scenario = "journal";
    r.variant = fmt::format("fsync batch+standby, {}", where);
    r.metric = "tasks/s";
    r.higher_is_better = true;
    r.rlbus = results["fsync batch, standby"];
    r.direct = results["fsync batch"];  // the same broker alone
    r.lost = unfinished;
    r.params = {{"fsync", "batch"},       {"standby", true},
                {"filesystem", where},    {"collectors", collectors},
                {"in_flight", in_flight}, {"trial_ms", s.journal_trial_ms}};
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace rlbus::bench
