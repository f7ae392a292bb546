// Worker quarantine (SPEC §12.6.9): a worker whose attempts keep ending badly (its handler
// fails, it times out, its session ends while it holds a task) is given no task for a while,
// so a crash-looping or broken worker cannot burn through the attempts of every queued task.
//
// Kept per worker id, not per session: a worker process that restarts under the same id
// keeps its count. A RESULT clears it; attempts the worker did not end (a cancel, its
// coordinator's end, a drain) leave it as it is. Single-threaded, like the task manager
// that owns it; it decides, the task manager applies (the free pools, the events).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "util/clock.hpp"

namespace rlbus::broker {

class quarantine {
 public:
  /// `after` failures in a row quarantine a worker (0: never); the first quarantine lasts
  /// `period`, each further one in a row twice the last, up to 8 x `period`. At most
  /// `max_ids` worker ids are remembered.
  quarantine(std::uint32_t after, std::chrono::milliseconds period, std::size_t max_ids);

  struct begun {
    std::chrono::milliseconds length;
    std::uint32_t failures;
  };
  /// An attempt on `id` ended through the worker. Returns the quarantine this begins, if
  /// the failure makes `after` in a row (the count then starts again).
  std::optional<begun> failed(const std::string& id, util::time_point now);
  /// `id` delivered a RESULT: its count and its back-off start over.
  void succeeded(const std::string& id);
  /// Whether `id` is in quarantine: it may not be given a task until released() says so.
  [[nodiscard]] bool held(const std::string& id) const;
  /// When the next quarantine ends, if any is on.
  [[nodiscard]] std::optional<util::time_point> next_release() const;
  /// The ids whose quarantine has ended by `now` (each once).
  std::vector<std::string> released(util::time_point now);
  /// Quarantines on (until released() hands them back), and all begun since the start.
  [[nodiscard]] std::size_t active() const noexcept { return releases_.size(); }
  [[nodiscard]] std::uint64_t total() const noexcept { return total_; }

 private:
  struct record {
    std::uint32_t failures = 0;  // in a row, since the last RESULT or quarantine
    std::uint32_t streak = 0;    // quarantines in a row without a RESULT between
    std::optional<util::time_point> until;
  };
  void make_room();
  void forget(std::unordered_map<std::string, record>::iterator it);

  std::uint32_t after_;
  std::chrono::milliseconds period_;
  std::size_t max_ids_;
  std::unordered_map<std::string, record> ids_;
  std::set<std::pair<util::time_point, std::string>> releases_;  // the quarantines on, by end
  std::uint64_t total_ = 0;
};

}  // namespace rlbus::broker
