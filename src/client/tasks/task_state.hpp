// What a worker's handler thread (through its task_handle) and its I/O thread share about the
// task the worker holds: the attempt, its policy, close and abort, the learner's pending
// replies, data credit, the reliable-data buffer and leave(). Everything here is guarded by
// the core's lock; `changed` wakes handler-side waits when the I/O thread changes something.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "client/core/core.hpp"
#include "client/tasks/unconfirmed.hpp"
#include "codec/messages.hpp"
#include "rlbus/worker.hpp"
#include "util/clock.hpp"

namespace rlbus {

namespace client::detail {
/// Why the broker would refuse `m` (its body does not decode under the limits, a field breaks
/// its rule, the body is past max-message, which would also cost the connection), or nullopt.
std::optional<std::string> why_refused(const codec::message& m, std::uint64_t max_message);
}  // namespace client::detail

struct task_handle::owner {
  owner(client::detail::core& c, std::size_t max_unconfirmed, std::size_t max_unconfirmed_bytes)
      : io(c), unconfirmed(max_unconfirmed, max_unconfirmed_bytes) {}

  client::detail::core& io;  // its mu() guards all that follows
  std::condition_variable changed;

  // the current task (one at a time), and one that arrived while an aborted one winds down
  std::optional<codec::task_start> task;
  std::optional<codec::task_start> next_task;
  // The latest policy version known to the current attempt: its TASK_START's, then each
  // newer POLICY_UPDATE's (SPEC §13.4.6).
  std::optional<rlbus::policy> policy;
  bool close_requested = false;
  bool aborted = false;
  bool stopping = false;
  std::uint64_t next_request = 0;
  std::map<std::uint64_t, codec::message> replies;  // LEARN / NO_DATA by request id
  // Data credit (SPEC §12.9.9): the DATA_CREDIT limits by attempt (one comes before its
  // TASK_START), and the items the current attempt has sent. No limit: no credit applies.
  std::map<std::pair<std::string, std::uint32_t>, std::uint64_t> credit;
  std::uint64_t data_sent = 0;  // DATA, INFO, LEARN_INFO: the index of the last (§12.11.10)
  std::uint64_t credit_waits = 0;
  // Reliable data (SPEC §12.11) for the attempt whose items are kept.
  client::detail::unconfirmed_data unconfirmed;
  std::uint64_t max_message = 0;  // the broker's, from its last WELCOME (0: not known yet)
  // leave(): when the held task must end by (said again after each WELCOME, §12.6.10)
  std::optional<util::time_point> leave_by;
  // The RESULT or TASK_FAILED that ended the last attempt, kept until the next TASK_START.
  std::optional<codec::message> last_outcome;
  std::uint64_t data_batches = 0;  // DATA_BATCH sent, and the DATA in them
  std::uint64_t data_batched = 0;

  /// True while `h`'s attempt is the current one and not over.
  [[nodiscard]] bool live(const task_handle& h) const;
  /// Queues `m` for the broker (lock not held); false when the outbox is full.
  bool post(codec::message m) { return io.post(std::move(m)); }
  /// Queues the RESULT or TASK_FAILED that ends an attempt, and keeps it: it goes again after
  /// a resumption in case the old connection took it down (SPEC §12.11.8).
  void post_outcome(codec::message m);
  /// leave(): the sooner deadline wins (lock held).
  void leave_locked(std::chrono::milliseconds deadline);
  /// Queues LEAVING with what is left of leave()'s deadline, if any (lock held).
  void post_leaving_locked();
  /// After a resumption the broker may lack what decides an attempt: the STARTED of the one
  /// held (a repeat is dropped, §12.5.3) or the outcome of the last one. First in the outbox,
  /// so the STARTED goes ahead of any DATA sent again (lock held).
  void resend_decisions();
  /// Sends the attempt's next item of its numbered sequence (DATA, INFO, LEARN_INFO,
  /// §12.11.10), made by `make` from its index. Past its credit the broker would refuse it:
  /// this waits for more, which comes as the coordinator works through its stream. False, with
  /// nothing sent, when the attempt is over or closes without credit, or the outbox is full;
  /// what `make` throws leaves the sequence as it was.
  bool post_item(const task_handle& h,
                 const std::function<codec::message(std::uint64_t index)>& make);
};

}  // namespace rlbus
