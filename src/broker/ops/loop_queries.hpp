// Questions another thread asks the broker's loop: the read-only OPS verbs (status, workers,
// tasks, topics), answered on the loop's thread between two turns, from a const view of the
// broker, exactly as an operator's OPS is. The web view's thread asks here, so it never reads
// the broker's state itself; the loop answers what was asked since its last turn, so a page
// that is watched costs the loop one answer per question and nothing else. At most a few
// questions wait at once; an asker that is not answered in time gives up (the loop may be
// busy or stopping) and its question is answered into the void.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "codec/protocol.hpp"

namespace rlbus::broker {

class loop_queries {
 public:
  /// The loop's answer to one read-only verb (on its thread).
  using answer_fn = std::function<codec::blob(const codec::ops&)>;

  /// `wake` interrupts the loop's poll (any thread).
  explicit loop_queries(std::function<void()> wake, std::size_t max_waiting = 8)
      : wake_(std::move(wake)), max_waiting_(max_waiting) {}

  /// Any thread but the loop's: the answers to `questions`, in their order, or nullopt when
  /// the loop did not answer within `timeout` or `max_waiting` questions already wait.
  std::optional<std::vector<codec::blob>> ask(std::vector<codec::ops> questions,
                                              std::chrono::milliseconds timeout);

  /// The loop's thread: answers every question asked so far.
  void serve(const answer_fn& answer);

  /// The loop's thread, as it stops: no question is answered any more; askers give up now.
  void close();

  /// Questions asked and not answered yet (any thread).
  [[nodiscard]] std::size_t waiting() const;

 private:
  struct question {
    std::vector<codec::ops> ops;
    std::vector<codec::blob> answers;
    bool answered = false;
  };
  std::function<void()> wake_;
  const std::size_t max_waiting_;
  mutable std::mutex mu_;
  std::condition_variable answered_;
  std::deque<std::shared_ptr<question>> waiting_;
  bool closed_ = false;
};

}  // namespace rlbus::broker
