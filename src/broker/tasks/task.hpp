// One task as the broker holds it (SPEC §12): what its coordinator submitted, where it stands
// (queued -> starting -> running -> closing), its current attempt and the deadlines of its
// step. The task manager moves it along; the task store keeps it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "broker/tasks/attempt_data.hpp"
#include "broker/tasks/task_schedule.hpp"
#include "codec/codec.hpp"
#include "codec/map_writer.hpp"
#include "codec/messages.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

enum class task_state { queued, starting, running, closing };

struct task {
  std::string id;
  std::string owner;  // coordinator id
  rlbus::role kind = rlbus::role::collector;
  codec::blob task_info;
  rlbus::resources requirements;
  std::optional<std::string> policy_id;
  std::chrono::milliseconds start_timeout{}, step_timeout{}, close_timeout{}, task_timeout{};
  std::chrono::milliseconds queue_timeout{};  // 0: waits in the queue without a bound
  std::uint32_t max_attempts = 1;
  std::uint32_t attempt = 0;  // the current (or last) attempt; 0 before the first
  task_state st = task_state::queued;
  std::string worker;
  std::string last_worker;                  // who ran the attempt that ended (avoided next time)
  std::uint64_t order = 0;                  // FIFO key, kept across re-queues
  std::optional<std::uint64_t> request_id;  // a learner's request awaiting DATA_REPLY
  util::time_point deadline{};              // of the current step, bounded by attempt_end
  util::time_point attempt_end{};
  bool leave_end = false;     // attempt_end is its worker's LEAVING deadline (§12.6.10)
  task_schedule::slot timer;  // when `deadline` is looked at (a check may come early)
  // The current attempt's data credit (§12.9.9), held by a collector attempt begun while
  // its owner's stream was windowed, and its indexed sequence (reliable data, §12.11).
  attempt_data data;
  codec::event_fixed event_fields;  // of the attempt's TASK_EVENTs, encoded once
  util::time_point submitted_at{};  // when its SUBMIT came
  util::time_point queued_at{};     // when it was last queued
  util::time_point started_at{};    // when its current attempt began
};

}  // namespace rlbus::broker
