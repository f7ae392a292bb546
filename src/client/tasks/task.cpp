// task_handle: what a worker's handler calls, and the shared task state behind it (see
// client/tasks/task_state.hpp). Every member may be called from any thread.
#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "client/tasks/task_state.hpp"
#include "codec/codec.hpp"

namespace rlbus {

namespace client::detail {
std::optional<std::string> why_refused(const codec::message& m, std::uint64_t max_message) {
  const auto body = codec::encode_body(m);
  if (max_message != 0 && body.size() > max_message)
    return fmt::format("{} bytes, more than the broker's max-message of {}", body.size(),
                       max_message);
  const auto decoded = codec::decode_body(static_cast<std::uint8_t>(codec::type_of(m)), body);
  if (!decoded) return decoded.error().reason;
  return std::nullopt;
}
}  // namespace client::detail

namespace {
constexpr std::chrono::milliseconds max_no_data_wait{2000};  // the longest NO_DATA hint obeyed

void check_sendable(const codec::message& m, std::uint64_t max_message, std::string_view what) {
  if (auto why = client::detail::why_refused(m, max_message))
    throw std::invalid_argument(fmt::format("{}: {}", what, *why));
}

// The same verdict for a DATA, from its parts (the hot path: no encoding twice). The size
// bound counts every field at its widest, so it refuses at most a few dozen bytes early.
void check_data(const codec::data_ready& d, std::uint64_t max_message) {
  const auto refuse = [](const std::string& why) {
    throw std::invalid_argument("emit_data: " + why);
  };
  constexpr std::size_t max_text = 256;
  if (d.data_id.size() > max_text) refuse("field 'data_id': longer than 256 bytes");
  if (d.buffer_id.size() > max_text) refuse("field 'buffer_id': longer than 256 bytes");
  if (auto e = codec::check_user_map(d.meta, codec::rule::max_relayed_nesting))
    refuse("field 'meta': " + e->reason);
  const std::size_t payload = d.payload ? d.payload->size() : 0;
  if (payload > codec::decode_limits{}.max_bin)
    refuse(fmt::format("field 'payload': longer than {} bytes", codec::decode_limits{}.max_bin));
  // map header, keys, and each value's header at its widest; task_id is at most 130 bytes
  constexpr std::size_t fixed = 1 + 68 + 130 + 9 + 3 + 3 + 5 + 9 + 9;
  const auto size = fixed + d.data_id.size() + d.buffer_id.size() + d.meta.size() + payload;
  if (max_message != 0 && size > max_message)
    refuse(
        fmt::format("about {} bytes, more than the broker's max-message of {}", size, max_message));
}
}  // namespace

// ---- the shared state (the core's lock held unless said) ----

bool task_handle::owner::live(const task_handle& h) const {
  return task && task->task_id == h.id_ && task->attempt == h.attempt_ && !aborted && !stopping;
}

void task_handle::owner::post_outcome(codec::message m) {
  {
    std::lock_guard lock(io.mu());
    last_outcome = m;
    io.outbox().push_back(std::move(m));
  }
  io.wake();
}

void task_handle::owner::leave_locked(std::chrono::milliseconds deadline) {
  const auto by = util::clock::now() + deadline;
  if (!leave_by || by < *leave_by) leave_by = by;
  post_leaving_locked();
}

void task_handle::owner::post_leaving_locked() {
  if (!leave_by) return;
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(*leave_by - util::clock::now());
  io.outbox().push_back(codec::leaving{
      static_cast<std::uint32_t>(std::clamp<std::int64_t>(left.count(), 0, 86'400'000))});
}

void task_handle::owner::resend_decisions() {
  if (task && !aborted) {
    io.outbox().push_front(codec::started{task->task_id, task->attempt});
  } else if (last_outcome) {
    io.outbox().push_front(*last_outcome);
  }
  io.wake();
}

bool task_handle::owner::post_item(const task_handle& h,
                                   const std::function<codec::message(std::uint64_t index)>& make) {
  bool wake_needed = false;
  {
    std::unique_lock lock(io.mu());
    const auto key = std::make_pair(h.id_, h.attempt_);
    const auto has_credit = [&] {
      const auto it = credit.find(key);
      return it == credit.end() || data_sent < it->second;
    };
    if (live(h) && !has_credit()) {
      ++credit_waits;
      changed.wait(lock, [&] { return !live(h) || close_requested || has_credit(); });
    }
    if (!live(h) || !has_credit() || io.outbox_full()) return false;
    auto m = make(data_sent + 1);
    ++data_sent;
    io.queue(std::move(m), wake_needed);
  }
  if (wake_needed) io.wake();
  return true;
}

// ---- the handle ----

bool task_handle::stop_requested() const {
  std::lock_guard lock(owner_.io.mu());
  return !owner_.live(*this) || owner_.close_requested;
}

bool task_handle::aborted() const {
  std::lock_guard lock(owner_.io.mu());
  return owner_.aborted;
}

bool task_handle::live() const {
  std::lock_guard lock(owner_.io.mu());
  return owner_.live(*this);
}

bool task_handle::emit_data(std::string data_id, std::string buffer_id, std::string meta_msgpack,
                            std::optional<std::string> payload) {
  // Numbered, so that the broker relays it once however often it is sent (§12.11).
  return owner_.post_item(*this, [&](std::uint64_t index) {
    codec::data_ready d{id_,
                        attempt_,
                        std::move(data_id),
                        std::move(buffer_id),
                        std::move(meta_msgpack),
                        std::move(payload)};
    if (owner_.policy) d.policy_version = owner_.policy->version;  // mu held
    d.index = index;
    check_data(d, owner_.max_message);
    return codec::message{std::move(d)};
  });
}

std::optional<rlbus::policy> task_handle::policy() const {
  std::lock_guard lock(owner_.io.mu());
  // The attempt's own latest while it is current; the one it started with once it is over.
  if (owner_.task && owner_.task->task_id == id_ && owner_.task->attempt == attempt_)
    return owner_.policy;
  return policy_;
}

bool task_handle::keep_alive() {
  {
    // Once TASK_CLOSE came the broker only waits for RESULT: a TASK_ALIVE would be refused.
    std::lock_guard lock(owner_.io.mu());
    if (!owner_.live(*this) || owner_.close_requested) return false;
  }
  return owner_.post(codec::task_alive{id_, attempt_});
}

bool task_handle::emit_info(std::string info_msgpack) {
  codec::info m{id_, attempt_, std::move(info_msgpack)};
  check_sendable(m, max_message(), "emit_info");
  // An item of the DATA sequence (§12.11.10): numbered, credited, kept and sent again like a
  // DATA, so an INFO that says the collector is done survives a broken connection.
  return owner_.post_item(*this, [&](std::uint64_t index) {
    m.index = index;
    return codec::message{std::move(m)};
  });
}

bool task_handle::emit_learn_info(std::string buffer_id, std::string info_msgpack) {
  codec::learn_info m{id_, attempt_, std::move(buffer_id), std::move(info_msgpack)};
  check_sendable(m, max_message(), "emit_learn_info");
  // Numbered within the attempt, kept and sent again like a collector's DATA (§12.11.10); a
  // learner has no credit, so this never waits.
  return owner_.post_item(*this, [&](std::uint64_t index) {
    m.index = index;
    return codec::message{std::move(m)};
  });
}

std::uint64_t task_handle::max_message() const {
  std::lock_guard lock(owner_.io.mu());
  return owner_.max_message;
}

bool task_handle::publish_policy(std::string policy_id, std::uint64_t version, std::string params) {
  return live() &&
         owner_.post(codec::policy{std::move(policy_id), version, std::nullopt, std::move(params)});
}

bool task_handle::publish_policy_ref(std::string policy_id, std::uint64_t version,
                                     std::string ref) {
  return live() &&
         owner_.post(codec::policy{std::move(policy_id), version, std::move(ref), std::nullopt});
}

std::optional<std::string> task_handle::get_data(const std::string& buffer_id,
                                                 std::uint32_t batch_size,
                                                 std::uint64_t cur_learner_iter,
                                                 std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::uint64_t request = 0;
    {
      std::lock_guard lock(owner_.io.mu());
      if (!owner_.live(*this) || owner_.close_requested) return std::nullopt;
      request = ++owner_.next_request;
    }
    if (!owner_.post(
            codec::get_data{id_, attempt_, request, buffer_id, batch_size, cur_learner_iter}))
      return std::nullopt;
    std::unique_lock lock(owner_.io.mu());
    const bool answered = owner_.changed.wait_until(lock, deadline, [&] {
      return owner_.replies.count(request) != 0 || !owner_.live(*this) || owner_.close_requested;
    });
    if (!answered || owner_.replies.count(request) == 0) return std::nullopt;
    auto reply = std::move(owner_.replies.at(request));
    owner_.replies.erase(request);
    if (auto* l = std::get_if<codec::learn>(&reply)) return std::move(l->data);
    // "Not enough data yet": wait what NO_DATA says (the coordinator's backoff, or the
    // broker's setting), within a cap and never past our own deadline.
    const auto wait = std::min(max_no_data_wait,
                               std::chrono::milliseconds(std::get<codec::no_data>(reply).retry_ms));
    owner_.changed.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + wait),
                              [&] { return !owner_.live(*this) || owner_.close_requested; });
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
  }
}

}  // namespace rlbus
