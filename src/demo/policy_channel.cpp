// Today's transport: the policy inside the learn info, then inside each collector task's
// task_info (see policy_channel.hpp for the fan-out version of each function).
#include "demo/policy_channel.hpp"

#include <utility>

namespace rlbus::demo {

void announce_policy(rlbus::task_handle& /*t*/, learn_report& report, policy_release release) {
  report.policy = std::move(release);
}

std::optional<policy_release> announced_policy(const learn_report& report) {
  return report.policy;
}

void attach_policy(rlbus::task_spec& /*spec*/, collector_task& task,
                   const policy_release& release) {
  task.policy = release;
}

std::optional<policy_release> task_policy(const rlbus::task_handle& /*t*/,
                                          const collector_task& task) {
  return task.policy;
}

}  // namespace rlbus::demo
