#include "broker/tasks/worker_pool.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace rlbus::broker {

namespace {

bool fits(const rlbus::resources& have, const rlbus::resources& need) {
  return std::all_of(need.begin(), need.end(), [&](const auto& n) {
    const auto it = have.find(n.first);
    return it != have.end() && it->second >= n.second;
  });
}

}  // namespace

worker_pool::worker_pool(std::uint32_t after, std::chrono::milliseconds period, std::size_t max_ids)
    : quarantine_(after, period, max_ids) {}

void worker_pool::place(const std::string& id, const worker_info& w) {
  auto& pool = free_[worker_slot(w.role)];
  if (w.task.empty() && !w.leaving && !w.drained && !quarantine_.held(id))
    pool.emplace(w.serial, id);
  else
    pool.erase(w.serial);
}

void worker_pool::join(const std::string& id, rlbus::role role, const rlbus::resources& res,
                       std::uint64_t serial) {
  if (const auto old = workers_.find(id); old != workers_.end())
    free_[worker_slot(old->second.role)].erase(old->second.serial);
  auto& w = workers_[id] = worker_info{role, res, serial, "", false, false};
  place(id, w);
}

std::optional<worker_info> worker_pool::leave(const std::string& id) {
  const auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  auto w = std::move(it->second);
  workers_.erase(it);
  free_[worker_slot(w.role)].erase(w.serial);
  return w;
}

const worker_info* worker_pool::find(const std::string& id) const {
  const auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

bool worker_pool::set_resources(const std::string& id, const rlbus::resources& res) {
  const auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  it->second.resources = res;
  return true;
}

void worker_pool::set_leaving(const std::string& id) {
  const auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.leaving = true;
  place(id, it->second);
}

bool worker_pool::set_drained(const std::string& id, bool drained) {
  const auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  it->second.drained = drained;
  place(id, it->second);
  return true;
}

void worker_pool::release(const std::string& id) {
  const auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.task.clear();
  place(id, it->second);
}

std::optional<std::string> worker_pool::assign(rlbus::role kind, const rlbus::resources& need,
                                               const std::string& avoid,
                                               const std::string& task_id) {
  auto& pool = free_[worker_slot(kind)];
  auto pick = pool.end();
  for (auto w = pool.begin(); w != pool.end(); ++w) {
    if (!fits(workers_.at(w->second).resources, need)) continue;
    if (pick == pool.end()) pick = w;
    if (w->second != avoid) {
      pick = w;
      break;
    }
  }
  if (pick == pool.end()) return std::nullopt;
  std::string id = pick->second;
  pool.erase(pick);
  workers_.at(id).task = task_id;
  return id;
}

std::optional<quarantine::begun> worker_pool::failed(const std::string& id, util::time_point now) {
  auto q = quarantine_.failed(id, now);
  if (q)
    if (const auto it = workers_.find(id); it != workers_.end()) place(id, it->second);
  return q;
}

bool worker_pool::end_quarantines(util::time_point now) {
  bool freed = false;
  for (const auto& id : quarantine_.released(now)) {
    spdlog::info("worker {}: quarantine over", id);
    const auto it = workers_.find(id);
    if (it == workers_.end()) continue;
    place(id, it->second);
    if (free_[worker_slot(it->second.role)].count(it->second.serial) != 0) freed = true;
  }
  return freed;
}

}  // namespace rlbus::broker
