// How a new policy version travels from the learner to the collectors, one small function
// per side and nothing else anywhere.
//
// It uses the broker's policy fan-out (SPEC §13): the learner calls publish_policy before it
// sends the learn info that announces the version, the coordinator names the policy in each
// collector task's task_spec, and a collector reads task_handle::policy(), the latest version
// the broker held when its task started. Data items carry that version (the SDK tags them).
#pragma once

#include <optional>
#include <string_view>

#include "demo/wire.hpp"
#include "rlbus/coordinator.hpp"
#include "rlbus/worker.hpp"

namespace rlbus::demo {

/// The policy's name on the bus (for fan-out).
inline constexpr std::string_view policy_id = "cartpole-linear";

/// Learner: makes `release` the version collectors get from now on. `report` is the learn
/// info about to be sent for it.
void announce_policy(rlbus::task_handle& t, learn_report& report, policy_release release);

/// Coordinator: the release a learn report announced (nullopt if it announced none).
std::optional<policy_release> announced_policy(const learn_report& report);

/// Coordinator: makes the collector task about to be submitted run `release`.
void attach_policy(rlbus::task_spec& spec, collector_task& task, const policy_release& release);

/// Coordinator: the version a data item was collected with (nullopt: it names none).
std::optional<std::uint64_t> collected_with(const std::string& data_event);

/// Collector: the policy its task runs (nullopt: the task carries none, a coordinator bug).
std::optional<policy_release> task_policy(const rlbus::task_handle& t, const collector_task& task);

/// Learner: the latest version published before its task started (nullopt: none yet), to go
/// on from when the task runs again (another attempt, after a restart of the broker).
std::optional<policy_release> latest_policy(const rlbus::task_handle& t);

}  // namespace rlbus::demo
