// What an operator sees of the task manager and steers (SPEC §16), as OPS and the metrics
// ask it: its counts, the live tasks, a worker's state, the streams, the queue by resource
// shape and the policies' versions; a worker drained, undrained or its task taken back.
#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "broker/tasks/task_helpers.hpp"
#include "broker/tasks/task_manager.hpp"
#include "util/log.hpp"

namespace rlbus::broker {

task_counts task_manager::counts() const {
  task_counts c = counts_;
  c.queued = tasks_.queued();
  c.running = tasks_.size() - tasks_.queued();
  c.quarantined = workers_.quarantines_on();
  c.quarantines = workers_.quarantines_begun();
  c.orphaned = orphans_.size();
  c.ring_bytes = streams_.ring_bytes();
  return c;
}

namespace {
std::string_view state_name(int st) {
  static constexpr std::string_view names[] = {"queued", "starting", "running", "closing"};
  return names[st];
}
}  // namespace

std::pair<std::vector<task_manager::task_view>, std::size_t> task_manager::list_tasks(
    std::string_view state, std::optional<rlbus::role> kind, std::string_view coordinator,
    std::size_t limit, std::uint64_t offset) const {
  std::vector<const task*> order;
  order.reserve(tasks_.size());
  for (const auto& [order_key, id] : tasks_.waiting()) order.push_back(&tasks_.at(id));
  std::vector<const task*> others;
  for (const auto& [id, t] : tasks_)
    if (t.st != state::queued) others.push_back(&t);
  std::sort(others.begin(), others.end(),
            [](const task* a, const task* b) { return a->order < b->order; });
  order.insert(order.end(), others.begin(), others.end());
  std::vector<task_view> out;
  std::size_t total = 0;
  for (const task* t : order) {
    const auto name = state_name(static_cast<int>(t->st));
    if ((!state.empty() && name != state) || (kind && t->kind != *kind) ||
        (!coordinator.empty() && t->owner != coordinator))
      continue;
    if (total++ < offset) continue;
    if (out.size() < limit)
      out.push_back({t->id, t->kind, name, t->attempt, t->worker, t->owner, t->submitted_at,
                     t->st == state::queued ? util::time_point{} : t->started_at, t->requirements});
  }
  return {std::move(out), total};
}

std::optional<task_manager::worker_view> task_manager::worker_state(const std::string& id) const {
  const auto* w = workers_.find(id);
  if (w == nullptr) return std::nullopt;
  worker_view v{w->task, 0, workers_.quarantined(id), w->leaving, w->drained};
  if (!w->task.empty()) v.attempt = tasks_.at(w->task).attempt;
  return v;
}

std::vector<task_manager::stream_view> task_manager::list_streams() const {
  std::vector<stream_view> out;
  for (const auto& [owner, s] : streams_.all())
    out.push_back({owner, s.seq, s.acked, s.windowed, s.ring.size()});
  std::sort(out.begin(), out.end(), [](const stream_view& a, const stream_view& b) {
    return a.coordinator < b.coordinator;
  });
  return out;
}

std::vector<std::pair<std::string, std::uint64_t>> task_manager::queued_by_shape() const {
  std::map<std::string, std::uint64_t> shapes;
  for (const auto& [order, id] : tasks_.waiting()) {
    std::string shape;
    for (const auto& [name, amount] : tasks_.at(id).requirements)
      shape += fmt::format("{}{}={}", shape.empty() ? "" : ",", name, amount);
    ++shapes[shape];
  }
  return {shapes.begin(), shapes.end()};
}

std::vector<std::pair<std::string, std::uint64_t>> task_manager::policy_versions() const {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  for (const auto& [id, p] : policies_.all()) out.emplace_back(id, p.version);
  std::sort(out.begin(), out.end());
  return out;
}

bool task_manager::set_drained(const std::string& id, bool drained, util::time_point now) {
  const auto* w = workers_.find(id);
  if (w == nullptr) return false;
  if (w->drained == drained) return true;
  workers_.set_drained(id, drained);
  spdlog::info("worker {} {} by an operator{}", id, drained ? "drained" : "undrained",
               drained && !w->task.empty() ? fmt::format(" (its task {} runs on)", w->task) : "");
  if (!drained) try_assign(now);  // it may be free again
  return true;
}

std::optional<std::string> task_manager::take_back(const std::string& id, const std::string& reason,
                                                   util::time_point now) {
  const auto* w = workers_.find(id);
  if (w == nullptr) return std::nullopt;
  const std::string task_id = w->task;
  // No new task for it while the session lasts (the caller ends it next).
  workers_.set_drained(id, true);
  if (task_id.empty()) return task_id;
  auto& t = tasks_.at(task_id);
  const util::log_scope log(
      {.task = t.id, .attempt = t.attempt, .worker = id, .coordinator = t.owner});
  sink_.send_to(id, codec::task_abort{t.id, t.attempt, reason});
  workers_.release(id);
  end_attempt(t, reason, now);
  try_assign(now);
  return task_id;
}

}  // namespace rlbus::broker
