// The learner's side of the demo: Augmented Random Search (Mania, Guy & Recht 2018, V1-t).
// One work item of antithetic perturbation pairs per policy version; results arrive in any
// order from any collector, and the last one moves the mean along the best directions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "demo/cartpole.hpp"
#include "demo/messages.hpp"

namespace rlbus::demo {

/// Settings of a training run. With the defaults, 2000 seeds tried solved CartPole-v1 after
/// 5 updates on average and 13 at worst (fewer directions need more versions and have a long
/// tail: 8 pairs averaged 10 and took 100 for some seeds).
struct learner_config {
  std::uint64_t seed = 1;            // every noise and episode seed of the run derives from it
  std::uint32_t directions = 32;     // perturbation pairs per version (2x episodes)
  std::uint32_t top_directions = 8;  // pairs the update uses: the best by max(r+, r-)
  float sigma = 0.1F;                // perturbation scale
  float step_size = 0.03F;           // ARS's alpha, in units of the return-normalised step
  std::uint32_t max_steps = cartpole::max_episode_steps;
  std::vector<float> initial_params;  // empty: all zeros
  std::uint64_t initial_version = 0;  // the version initial_params are (a run taken over)

  /// Throws std::invalid_argument naming the first bad setting.
  void validate() const;
};

/// What a submitted result did.
enum class submit_status {
  accepted,   // recorded; the batch is still incomplete
  updated,    // recorded, it completed the batch, and the learner moved to the next version
  stale,      // for another policy version (late, or from the future): dropped
  duplicate,  // this (direction, sign) is already in: dropped (a re-issued part, say)
  invalid,    // direction out of range, sign not +-1, return or steps outside [0, cap]: dropped
};

/// The batch behind the latest update.
struct update_stats {
  std::uint64_t policy_version = 0;  // the version whose perturbations were run
  double mean_return = 0;            // over all 2 x directions episodes
  double max_return = 0;
  std::uint64_t steps = 0;  // environment steps in the batch
  bool moved = false;       // false when every return was equal: nothing to learn from
};

/// Owns the mean parameters and the batch in flight. Single-threaded: one thread submits.
class learner {
 public:
  /// Throws std::invalid_argument if `cfg` is invalid (see learner_config::validate).
  explicit learner(learner_config cfg);

  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }
  [[nodiscard]] const std::vector<float>& params() const noexcept { return params_; }
  /// The whole batch for the current version (all directions); stable until the next update.
  [[nodiscard]] const work_item& work() const noexcept { return work_; }

  /// Records one result; the last one of a batch triggers the update. Never throws on bad
  /// input: results come from other processes, so a bad one is reported and dropped.
  submit_status submit(const episode_result& r);

  /// Results still missing for the current version.
  [[nodiscard]] std::uint32_t missing() const noexcept {
    return 2 * config_.directions - received_;
  }
  /// The latest update, or nullopt before the first.
  [[nodiscard]] const std::optional<update_stats>& last_update() const noexcept { return last_; }
  /// Episodes and environment steps accepted over the whole run.
  [[nodiscard]] std::uint64_t total_episodes() const noexcept { return total_episodes_; }
  [[nodiscard]] std::uint64_t total_steps() const noexcept { return total_steps_; }

 private:
  void begin_version();
  void update();

  learner_config config_;
  std::uint64_t version_ = 0;
  std::vector<float> params_;
  work_item work_;
  // Per direction, the return of each side once it has arrived.
  std::vector<std::optional<double>> returns_plus_;
  std::vector<std::optional<double>> returns_minus_;
  std::uint64_t batch_steps_ = 0;
  std::uint32_t received_ = 0;
  std::optional<update_stats> last_;
  std::uint64_t total_episodes_ = 0;
  std::uint64_t total_steps_ = 0;
};

/// The whole work item of `version` in a run seeded with `run_seed`: its noise and start-state
/// seeds derive from (run_seed, version) alone, so whoever knows the run's settings and holds
/// a version's parameters (a collector handed a policy) rebuilds exactly what the learner drew.
work_item version_work(std::uint64_t run_seed, std::uint64_t version, std::vector<float> params,
                       float sigma, std::uint32_t directions, std::uint32_t max_steps);

/// Cuts `item` into at most `parts` (>= 1) items over disjoint, contiguous direction ranges
/// that together cover it, sizes differing by at most one; one per collector.
std::vector<work_item> split_work(const work_item& item, std::uint32_t parts);

}  // namespace rlbus::demo
