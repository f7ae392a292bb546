// The demo's user data on the bus, as msgpack maps: what a collector or learner task is told
// (task_info), what a collector reports per direction (data meta), the batch a learner gets
// and the learn info it sends back. Encoders are total; decoders take bytes from other
// processes, so they decode under limits and return nullopt for anything malformed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "demo/cartpole.hpp"
#include "demo/messages.hpp"

namespace rlbus::demo {

/// One version of the policy as it travels: the version and its parameters in
/// params_to_bytes form (see policy_channel.hpp for how it travels).
struct policy_release {
  std::uint64_t version = 0;
  std::string params;
  bool operator==(const policy_release&) const = default;
};

/// A collector task: run the directions [first_direction, first_direction + direction_count)
/// of the policy version it is handed. The search settings let it rebuild that version's
/// work item (version_work in learner.hpp) from the policy alone.
struct collector_task {
  std::uint64_t seed = 0;  // the run's seed
  float sigma = 0;
  std::uint32_t max_steps = cartpole::max_episode_steps;
  std::uint32_t first_direction = 0;
  std::uint32_t direction_count = 0;
  std::uint32_t episode_cost_ms = 0;  // simulated environment cost per episode
  bool operator==(const collector_task&) const = default;
};

/// The learner task: the run's random-search settings.
struct learner_task {
  std::uint64_t seed = 0;
  std::uint32_t directions = 0;
  std::uint32_t top_directions = 0;
  float sigma = 0;
  float step_size = 0;
  std::uint32_t max_steps = cartpole::max_episode_steps;
  std::uint32_t eval_episodes = cartpole::solved_episodes;
  bool operator==(const learner_task&) const = default;
};

/// One data item: both sides of one direction, run by `collector`.
struct direction_result {
  std::string collector;
  episode_result plus;
  episode_result minus;
  bool operator==(const direction_result&) const = default;
};

/// A learner's batch: every result of one policy version.
struct result_batch {
  std::uint64_t policy_version = 0;
  std::vector<episode_result> results;
  bool operator==(const result_batch&) const = default;
};

/// What the learner reports once per iteration (iteration 0: the initial policy).
struct learn_report {
  std::uint64_t iteration = 0;       // updates so far
  std::uint64_t policy_version = 0;  // the version just published
  double batch_mean = 0;             // returns of the batch behind the update
  double batch_max = 0;
  double eval_mean = 0;  // the new policy, on fresh evaluation episodes
  double eval_min = 0;
  double eval_max = 0;
  std::uint32_t eval_episodes = 0;
  std::uint64_t episodes = 0;    // learning episodes accepted so far (collectors')
  std::uint64_t eval_total = 0;  // evaluation episodes run so far
  bool learner_done = false;     // the new policy meets the solved threshold
  bool operator==(const learn_report&) const = default;
};

std::string encode(const collector_task& t);
std::string encode(const learner_task& t);
std::string encode(const direction_result& r);
std::string encode(const result_batch& b);
std::string encode(const learn_report& r);

std::optional<collector_task> decode_collector_task(std::string_view bytes);
std::optional<learner_task> decode_learner_task(std::string_view bytes);
std::optional<direction_result> decode_direction_result(std::string_view bytes);
std::optional<result_batch> decode_result_batch(std::string_view bytes);
std::optional<learn_report> decode_learn_report(std::string_view bytes);

/// The direction result inside a coordinator's data event ({data_id, buffer_id, meta, ...}:
/// the meta is the collector's encoded direction_result).
std::optional<direction_result> direction_result_from_data(std::string_view data_event);

/// The `policy_version` a data event carries (the bus's version of the policy the collector
/// ran, SPEC §13.4.4), nullopt when it carries none.
std::optional<std::uint64_t> policy_version_from_data(std::string_view data_event);

/// {"collector_done": true, "episodes": n}: the info that ends a collector task, and its
/// result.
std::string collector_done(std::uint64_t episodes);

}  // namespace rlbus::demo
