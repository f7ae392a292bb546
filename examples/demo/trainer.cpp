// See trainer.hpp. Callbacks (the coordinator's callback thread) only record what arrived
// and wake the owner thread; submitting happens on the owner thread, because the SDK's
// submit() waits for the broker and must not run inside a callback.
#include "demo/trainer.hpp"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "demo/batch_buffer.hpp"
#include "demo/cartpole.hpp"
#include "demo/policy_channel.hpp"
#include "demo/wire.hpp"

namespace rlbus::demo {

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

constexpr const char* learner_task_id = "learner-task";
constexpr std::chrono::seconds learner_close_wait{3};

}  // namespace

// Everything the callbacks touch, under one lock.
struct trainer::state {
  explicit state(std::uint32_t directions) : buffer(directions) {}

  std::mutex mu;
  std::condition_variable changed;

  batch_buffer buffer;
  std::optional<learn_report> last_report;
  std::optional<policy_release> latest;  // the newest policy the learner announced
  std::uint64_t submitted_version = 0;   // collector tasks exist for versions below this
  bool any_submitted = false;
  std::optional<clock::time_point> solved_at;
  std::string failure;

  // Collector tasks: which version, who runs it (from its data), how far it got.
  struct task_record {
    std::uint64_t version = 0;
    std::uint32_t first_direction = 0, direction_count = 0;
    std::string collector;
    std::uint32_t data = 0;
    bool finished = false;
  };
  std::map<std::string, task_record> tasks;
  std::vector<std::string> to_resubmit;  // failed for good: run the slice again

  std::uint64_t events = 0, data_items = 0, bad_data = 0;
  // Policy lag of each data item on arrival: versions between the one it was collected with
  // and the newest the learner had announced.
  std::uint64_t on_latest = 0, behind = 0, max_lag = 0;
  std::uint64_t tasks_submitted = 0, tasks_finished = 0, requeued = 0, failed = 0;
  bool learner_finished = false;
};

trainer::trainer(trainer_options opts, console& out)
    : opts_(std::move(opts)), out_(out), st_(std::make_unique<state>(opts_.directions)) {
  if (opts_.directions == 0) throw std::invalid_argument("directions must be > 0");
  if (opts_.top_directions == 0 || opts_.top_directions > opts_.directions)
    throw std::invalid_argument("top directions must be in [1, directions]");
  if (opts_.directions_per_task == 0)
    throw std::invalid_argument("directions per task must be > 0");

  rlbus::coordinator_callbacks cb;
  auto& s = *st_;
  cb.deal_with_collector_send_data = [&s](const std::string& task_id, const std::string&,
                                          const std::string&, const std::string& data) {
    const auto r = direction_result_from_data(data);
    std::lock_guard lock(s.mu);
    ++s.events;
    ++s.data_items;
    if (const auto v = collected_with(data); v && s.latest) {
      const auto lag = s.latest->version > *v ? s.latest->version - *v : 0;
      ++(lag == 0 ? s.on_latest : s.behind);
      s.max_lag = std::max(s.max_lag, lag);
    }
    if (!r) {
      ++s.bad_data;
      return;
    }
    s.buffer.add(r->plus);
    s.buffer.add(r->minus);
    if (const auto it = s.tasks.find(task_id); it != s.tasks.end()) {
      it->second.collector = r->collector;
      ++it->second.data;
    }
    s.changed.notify_all();
  };
  cb.deal_with_collector_finish_task = [&s](const std::string& task_id, const std::string&) {
    std::lock_guard lock(s.mu);
    ++s.events;
    ++s.tasks_finished;
    if (const auto it = s.tasks.find(task_id); it != s.tasks.end()) it->second.finished = true;
  };
  cb.deal_with_learner_get_data = [&s](const std::string&, const std::string&, std::uint32_t,
                                       std::uint64_t version) -> std::optional<std::string> {
    std::lock_guard lock(s.mu);
    ++s.events;
    auto batch = s.buffer.batch(version);
    if (!batch) return std::nullopt;
    return encode(result_batch{version, std::move(*batch)});
  };
  // Every learn info passes the judge, the last one (learner_done) included, while
  // deal_with_learner_send_info never sees that last one: so reports are read here.
  cb.deal_with_learner_judge_finish = [this, &s](const std::string&, const std::string& info) {
    const auto report = decode_learn_report(info);
    std::lock_guard lock(s.mu);
    ++s.events;
    if (!report) {
      s.failure = "the learner sent a learn info that is not a demo report";
      s.changed.notify_all();
      return false;
    }
    if (auto release = announced_policy(*report)) {
      s.buffer.forget_before(release->version);
      s.latest = std::move(release);
    }
    s.last_report = *report;
    if (report->learner_done && !s.solved_at) s.solved_at = clock::now();
    const double elapsed = seconds_since(opts_.started);
    out_.line(fmt::format(
        "[{:6.1f}s] iter {:3}  policy v{:<3} reward mean {:5.1f} max {:3.0f}  tasks {:3} done "
        "{} requeued  data {:4}  events {:5} ({:.0f}/s)",
        elapsed, report->iteration, report->policy_version, report->eval_mean, report->eval_max,
        s.tasks_finished, s.requeued, s.data_items, s.events,
        static_cast<double>(s.events) / std::max(elapsed, 1e-3)));
    s.changed.notify_all();
    return report->learner_done;
  };
  cb.deal_with_learner_finish_task = [&s](const std::string&, const std::string&) {
    std::lock_guard lock(s.mu);
    ++s.events;
    s.learner_finished = true;
    s.changed.notify_all();
  };
  cb.on_task_requeued = [this, &s](const std::string& task_id, std::uint32_t attempt,
                                   const std::string& reason,
                                   const std::optional<std::string>& /*result*/) {
    std::lock_guard lock(s.mu);
    ++s.events;
    ++s.requeued;
    std::string who;
    if (const auto it = s.tasks.find(task_id); it != s.tasks.end() && !it->second.collector.empty())
      who = fmt::format(" (it ran on {})", it->second.collector);
    out_.line(fmt::format("[{:6.1f}s] task {}{} re-queued: attempt {} ended: {}",
                          seconds_since(opts_.started), task_id, who, attempt, reason));
  };
  cb.on_task_failed = [this, &s](const std::string& task_id, const std::string& reason,
                                 const std::optional<std::string>& /*result*/) {
    std::lock_guard lock(s.mu);
    ++s.events;
    ++s.failed;
    out_.line(fmt::format("[{:6.1f}s] task {} failed: {}", seconds_since(opts_.started), task_id,
                          reason));
    if (task_id == learner_task_id) {
      s.failure = "the learner task failed: " + reason;
    } else if (const auto it = s.tasks.find(task_id);
               it != s.tasks.end() && s.latest && it->second.version == s.latest->version) {
      s.to_resubmit.push_back(task_id);  // its results are still needed
    }
    s.changed.notify_all();
  };

  rlbus::coordinator_options co;
  co.endpoint = opts_.endpoint;
  co.id = "demo-coordinator";
  co.heartbeat = opts_.heartbeat;
  coord_ = std::make_unique<rlbus::coordinator>(co, std::move(cb));
}

trainer::~trainer() {
  stop();
}

void trainer::start(std::chrono::milliseconds timeout) {
  if (!coord_->wait_for(rlbus::connection_state::ready, timeout))
    throw std::runtime_error("the coordinator could not reach the broker at " + opts_.endpoint);
  learner_task lt;
  lt.seed = opts_.seed;
  lt.directions = opts_.directions;
  lt.top_directions = opts_.top_directions;
  lt.sigma = opts_.sigma;
  lt.step_size = opts_.step_size;
  rlbus::task_spec spec;
  spec.task_id = learner_task_id;
  spec.kind = rlbus::role::learner;
  spec.task_info = encode(lt);
  // One attempt for the whole run, as long as it lives (it asks for data every ~100 ms, which
  // keeps it alive). Another attempt (its worker was lost, the broker restarted) is handed the
  // latest policy version and goes on from there.
  spec.step_timeout_ms = 30'000;
  spec.max_attempts = 3;
  spec.policy_id = std::string(policy_id);
  spec.task_timeout_ms = static_cast<std::uint32_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(opts_.time_limit).count() + 60'000);
  const auto r = coord_->submit(spec, timeout);
  if (!r) throw std::runtime_error("the broker did not answer the learner task's submit");
  if (!r->accepted) throw std::runtime_error("the broker refused the learner task: " + r->reason);
}

training_state trainer::poll(std::chrono::milliseconds wait) {
  auto& s = *st_;
  std::vector<rlbus::task_spec> specs;
  {
    std::unique_lock lock(s.mu);
    // A new version needs its tasks, unless the run is already solved.
    const auto new_version = [&] {
      return !s.solved_at && s.latest &&
             (!s.any_submitted || s.latest->version >= s.submitted_version);
    };
    s.changed.wait_for(lock, wait, [&] {
      return !s.failure.empty() || s.learner_finished || !s.to_resubmit.empty() || new_version();
    });
    if (!s.failure.empty()) return training_state::failed;
    // Solved once the learner said so; its task's close (the result) is waited for briefly,
    // only so that the summary can count it.
    if (s.solved_at && (s.learner_finished || clock::now() - *s.solved_at > learner_close_wait))
      return training_state::solved;
    if (s.solved_at) return training_state::running;
    if (s.last_report && s.last_report->iteration >= opts_.max_iterations)
      return training_state::out_of_iterations;
    if (clock::now() - opts_.started >= opts_.time_limit) return training_state::out_of_time;

    // The slices of a new version, and again those of the current one whose task failed.
    const auto make = [&](std::string id, std::uint32_t first, std::uint32_t count) {
      collector_task task;
      task.seed = opts_.seed;
      task.sigma = opts_.sigma;
      task.first_direction = first;
      task.direction_count = count;
      task.episode_cost_ms = opts_.episode_cost_ms;
      rlbus::task_spec spec;
      spec.task_id = std::move(id);
      spec.kind = rlbus::role::collector;
      spec.step_timeout_ms = 10'000;
      attach_policy(spec, task, *s.latest);
      spec.task_info = encode(task);
      s.tasks[spec.task_id] = {s.latest->version, first, count, {}, 0, false};
      specs.push_back(std::move(spec));
    };
    for (const auto& id : s.to_resubmit) {
      const auto old = s.tasks.at(id);
      make(fmt::format("{}-again{}", id, s.failed), old.first_direction, old.direction_count);
    }
    s.to_resubmit.clear();
    if (new_version()) {
      const std::uint64_t v = s.latest->version;
      std::uint32_t slice = 0;
      for (std::uint32_t first = 0; first < opts_.directions;
           first += opts_.directions_per_task, ++slice)
        make(fmt::format("collect-v{}-s{}", v, slice), first,
             std::min(opts_.directions_per_task, opts_.directions - first));
      s.submitted_version = v + 1;
      s.any_submitted = true;
    }
  }
  for (const auto& spec : specs) {
    const auto r = coord_->submit(spec);
    std::lock_guard lock(s.mu);
    if (!r || !r->accepted) {
      s.failure = fmt::format("the broker did not take task {}: {}", spec.task_id,
                              r ? r->reason : "no answer");
      return training_state::failed;
    }
    ++s.tasks_submitted;
  }
  return training_state::running;
}

std::uint64_t trainer::iteration() const {
  std::lock_guard lock(st_->mu);
  return st_->last_report ? st_->last_report->iteration : 0;
}

std::optional<busy_collector> trainer::find_busy_collector() const {
  std::lock_guard lock(st_->mu);
  if (!st_->latest) return std::nullopt;
  // Of the current version's tasks under way, the one with the most left to do, so the
  // kill lands well before it could finish.
  const state::task_record* best = nullptr;
  std::string best_id;
  for (const auto& [id, t] : st_->tasks) {
    if (t.version != st_->latest->version || t.finished || t.collector.empty()) continue;
    if (t.data >= t.direction_count) continue;  // reported everything: about to finish
    if (best == nullptr || t.direction_count - t.data > best->direction_count - best->data) {
      best = &t;
      best_id = id;
    }
  }
  if (best == nullptr) return std::nullopt;
  return busy_collector{best->collector, best_id};
}

trainer_counts trainer::counts() const {
  std::lock_guard lock(st_->mu);
  return {st_->events, st_->requeued};
}

void trainer::stop() {
  if (coord_) coord_->stop();
}

void trainer::print_summary(training_state result) const {
  auto& s = *st_;
  std::lock_guard lock(s.mu);
  const double wall =
      std::chrono::duration<double>(s.solved_at.value_or(clock::now()) - opts_.started).count();
  const auto& r = s.last_report;
  const char* verdict = "not solved";
  switch (result) {
    case training_state::solved:
      verdict = "solved";
      break;
    case training_state::out_of_iterations:
      verdict = "not solved: out of iterations";
      break;
    case training_state::out_of_time:
      verdict = "not solved: out of time";
      break;
    case training_state::failed:
      verdict = "not solved: training failed";
      break;
    case training_state::running:
      verdict = "not solved: stopped";
      break;
  }
  out_.line("");
  out_.line("== rlbus demo summary ==");
  out_.line(fmt::format("result:          {}", verdict));
  if (r)
    out_.line(fmt::format(
        "final policy:    v{}, eval mean {:.1f} (min {:.0f}, max {:.0f}) over {} episodes; "
        "solved means >= {:.0f}",
        r->policy_version, r->eval_mean, r->eval_min, r->eval_max, r->eval_episodes,
        cartpole::solved_mean_return));
  out_.line(fmt::format("iterations:      {}", r ? r->iteration : 0));
  out_.line(fmt::format("wall time:       {:.1f} s", wall));
  out_.line(fmt::format("episodes:        {} run by collectors ({} learned from), {} evaluation",
                        2 * (s.data_items - s.bad_data), r ? r->episodes : 0,
                        r ? r->eval_total : 0));
  out_.line(
      fmt::format("tasks:           {} collector tasks submitted, {} finished; learner task {}",
                  s.tasks_submitted, s.tasks_finished, s.learner_finished ? "finished" : "open"));
  out_.line(fmt::format("requeued tasks:  {}", s.requeued));
  out_.line(fmt::format("failed tasks:    {}", s.failed));
  out_.line(fmt::format("data items:      {} (results dropped: {} stale, {} duplicate, {} bad)",
                        s.data_items, s.buffer.stale(), s.buffer.duplicates(),
                        s.buffer.invalid() + 2 * s.bad_data));
  out_.line(
      fmt::format("policy lag:      {} items collected with the newest version, {} with "
                  "an older one (at most {} behind)",
                  s.on_latest, s.behind, s.max_lag));
  out_.line(fmt::format("task events:     {} ({:.0f}/s)", s.events,
                        static_cast<double>(s.events) / std::max(wall, 1e-3)));
  if (!s.failure.empty()) out_.line("failure:         " + s.failure);
}

}  // namespace rlbus::demo
