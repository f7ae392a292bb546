// The demo's worker processes: a collector runs slices of a policy version's perturbations
// and reports one data item per direction; the learner asks for whole batches, updates the
// policy, evaluates it and announces it. Both are ordinary rlbus::worker task handlers.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "rlbus/worker.hpp"

namespace rlbus::demo {

/// Where user data goes: the one buffer the demo's coordinator keeps.
inline constexpr const char* results_buffer = "cartpole-results";

/// Per-process state the handlers share between a task's run and close (one task at a
/// time, both on the worker's handler thread).
struct collector_state {
  std::string id;
  std::uint64_t episodes = 0;  // of the current task
};
struct learner_state {
  std::string last_report;  // the latest learn info (msgpack), the task's result
};

/// Handlers for a collector: task_info is a collector_task (wire.hpp). A task whose info or
/// policy cannot be read fails with the reason. `st` must outlive the worker.
rlbus::task_handlers collector_handlers(collector_state& st);

/// Handlers for the learner: task_info is a learner_task; the task runs until the
/// coordinator closes it (after a learn info with learner_done).
rlbus::task_handlers learner_handlers(learner_state& st);

struct worker_process_options {
  std::string endpoint;
  std::string id;
  std::chrono::milliseconds heartbeat{250};
};

/// Runs a collector or learner worker until SIGINT or SIGTERM (then disconnects and returns
/// 0), or until the broker refuses it for good (returns 1). Blocks those signals in the
/// calling thread first, so call it from main before any other thread starts.
int run_worker_process(rlbus::role r, const worker_process_options& opts);

}  // namespace rlbus::demo
