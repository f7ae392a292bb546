// See loop_queries.hpp.
#include "broker/ops/loop_queries.hpp"

namespace rlbus::broker {

std::optional<std::vector<codec::blob>> loop_queries::ask(std::vector<codec::ops> questions,
                                                          std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto q = std::make_shared<question>();
  q->ops = std::move(questions);
  {
    const std::lock_guard hold(mu_);
    if (closed_ || waiting_.size() >= max_waiting_) return std::nullopt;
    waiting_.push_back(q);
  }
  wake_();
  std::unique_lock hold(mu_);
  if (!answered_.wait_until(hold, deadline, [&] { return q->answered || closed_; }))
    return std::nullopt;
  if (!q->answered) return std::nullopt;
  return std::move(q->answers);
}

void loop_queries::serve(const answer_fn& answer) {
  std::deque<std::shared_ptr<question>> asked;
  {
    const std::lock_guard hold(mu_);
    if (waiting_.empty()) return;
    asked.swap(waiting_);
  }
  // Answered outside the lock: an asker that gave up meanwhile is answered into the void.
  for (const auto& q : asked) {
    std::vector<codec::blob> answers;
    answers.reserve(q->ops.size());
    for (const auto& op : q->ops) answers.push_back(answer(op));
    const std::lock_guard hold(mu_);
    q->answers = std::move(answers);
    q->answered = true;
  }
  answered_.notify_all();
}

void loop_queries::close() {
  {
    const std::lock_guard hold(mu_);
    closed_ = true;
    waiting_.clear();
  }
  answered_.notify_all();
}

std::size_t loop_queries::waiting() const {
  const std::lock_guard hold(mu_);
  return waiting_.size();
}

}  // namespace rlbus::broker
