// The workers the task manager may give tasks to (SPEC §12.6): each worker session with its
// kind, resources and the task it holds, and, per kind, the free ones in the order they
// joined. A worker is free when it holds no task, has not said LEAVING, is not drained by an
// operator and is not in quarantine (§12.6.9): the pool keeps that one rule in one place,
// place(), and the task manager only says what happened. It picks the worker for a task too:
// the first free one of its kind whose resources fit, avoiding the worker its last attempt
// ended on while another fits. Single-threaded, like the task manager that owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

#include "broker/core/peer_table.hpp"
#include "broker/tasks/quarantine.hpp"
#include "rlbus/types.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

struct worker_info {
  rlbus::role role = rlbus::role::collector;
  rlbus::resources resources;
  std::uint64_t serial = 0;  // its session's, in the order sessions began
  std::string task;          // "" = free
  bool leaving = false;      // it sent LEAVING: no new task for this session (§12.6.10)
  bool drained = false;      // an operator said so: no new task for this session (§16.5)
};

class worker_pool {
 public:
  /// Quarantine (§12.6.9): `after` bad endings in a row (0: never), for `period` at first.
  worker_pool(std::uint32_t after, std::chrono::milliseconds period, std::size_t max_ids);

  /// A worker session began: free, unless its id is in quarantine (a restarted process).
  void join(const std::string& id, rlbus::role role, const rlbus::resources& res,
            std::uint64_t serial);
  /// The session ended: what the pool knew of it, or nullopt when it knew nothing.
  std::optional<worker_info> leave(const std::string& id);
  [[nodiscard]] const worker_info* find(const std::string& id) const;
  /// A worker re-announced its resources; false when `id` is no worker.
  bool set_resources(const std::string& id, const rlbus::resources& res);
  /// It said LEAVING: no new task for this session.
  void set_leaving(const std::string& id);
  /// An operator drains or undrains it; false when `id` is no worker.
  bool set_drained(const std::string& id, bool drained);
  /// Its task is over: it is free again unless something else holds it back.
  void release(const std::string& id);

  [[nodiscard]] bool any_free() const noexcept { return !free_[0].empty() || !free_[1].empty(); }
  /// A free worker of `kind` whose resources cover `need`, preferring any other to `avoid`;
  /// it now holds `task_id`. Nullopt when none fits.
  std::optional<std::string> assign(rlbus::role kind, const rlbus::resources& need,
                                    const std::string& avoid, const std::string& task_id);

  // ---- quarantine ----
  /// An attempt on `id` ended through the worker: the quarantine this begins, if any.
  std::optional<quarantine::begun> failed(const std::string& id, util::time_point now);
  /// `id` delivered a RESULT.
  void succeeded(const std::string& id) { quarantine_.succeeded(id); }
  /// Ends the quarantines due by `now`; true when a worker became free by it.
  bool end_quarantines(util::time_point now);
  [[nodiscard]] std::optional<util::time_point> next_release() const {
    return quarantine_.next_release();
  }
  [[nodiscard]] bool quarantined(const std::string& id) const { return quarantine_.held(id); }
  [[nodiscard]] std::size_t quarantines_on() const noexcept { return quarantine_.active(); }
  [[nodiscard]] std::uint64_t quarantines_begun() const noexcept { return quarantine_.total(); }

 private:
  /// Puts `id` in its kind's free pool or takes it out, as its state says.
  void place(const std::string& id, const worker_info& w);

  std::unordered_map<std::string, worker_info> workers_;
  std::map<std::uint64_t, std::string> free_[2];  // per kind (collector, learner): serial -> id
  class quarantine quarantine_;
};

}  // namespace rlbus::broker
