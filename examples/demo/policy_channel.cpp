// The policy travels by the broker's policy fan-out (SPEC §13): the learner publishes each
// version once, the broker holds the latest and hands it to every collector task that names
// the policy when the task starts. Demo versions count from 0, the bus's from 1.
#include "demo/policy_channel.hpp"

#include <string>
#include <utility>

namespace rlbus::demo {

namespace {
std::uint64_t on_bus(std::uint64_t demo_version) {
  return demo_version + 1;
}
}  // namespace

void announce_policy(rlbus::task_handle& t, learn_report& report, policy_release release) {
  // The learn info sent after this only says which version is out (its policy_version).
  report.policy_version = release.version;
  t.publish_policy(std::string(policy_id), on_bus(release.version), std::move(release.params));
}

std::optional<policy_release> announced_policy(const learn_report& report) {
  return policy_release{report.policy_version, {}};
}

void attach_policy(rlbus::task_spec& spec, collector_task& /*task*/,
                   const policy_release& /*release*/) {
  // The broker attaches its latest version when the task starts: as the learner publishes
  // before it reports, that is the announced version or, after a re-queue, a newer one.
  spec.policy_id = std::string(policy_id);
}

std::optional<std::uint64_t> collected_with(const std::string& data_event) {
  const auto v = policy_version_from_data(data_event);
  if (!v || *v == 0) return std::nullopt;
  return *v - 1;
}

std::optional<policy_release> task_policy(const rlbus::task_handle& t,
                                          const collector_task& /*task*/) {
  return latest_policy(t);
}

std::optional<policy_release> latest_policy(const rlbus::task_handle& t) {
  const auto& p = t.policy();
  if (!p || !p->params || p->version == 0) return std::nullopt;
  return policy_release{p->version - 1, *p->params};
}

}  // namespace rlbus::demo
