// rlbus::worker: a session driven by one I/O thread, a handler thread for the user's task
// code, and between them a mutex-guarded outbox (handler -> I/O, with a wake-up) and the
// current task's state (I/O -> handler, with a condition variable). See
// include/rlbus/worker.hpp for the contract.
#include "rlbus/worker.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <signal.h>  // sigaction

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "client/io_loop.hpp"
#include "client/session.hpp"
#include "codec/codec.hpp"
#include "util/poll.hpp"
#include "util/wake_pipe.hpp"

namespace rlbus {

std::string_view to_string(connection_state s) noexcept {
  switch (s) {
    case connection_state::connecting:
      return "connecting";
    case connection_state::ready:
      return "ready";
    case connection_state::refused:
      return "refused";
    case connection_state::stopped:
      return "stopped";
  }
  return "unknown";
}

namespace {
constexpr std::size_t max_outbox = 100'000;                  // messages waiting for the I/O thread
constexpr std::chrono::milliseconds max_no_data_wait{2000};  // the longest NO_DATA hint obeyed
constexpr std::size_t max_credit_entries = 16;               // attempts whose DATA_CREDIT is kept
// A DATA_BATCH holds at most this many bytes of items (§12.12.5); an item's keys and headers
// are counted at item_overhead.
constexpr std::size_t max_batch_bytes = 64 * 1024;
constexpr std::size_t item_overhead = 48;

// SIGTERM for workers with leave_on_sigterm: the handler only notes it and wakes their I/O
// loops through one pipe that is never drained, so every loop that still watches it wakes.
std::atomic<bool> g_sigterm{false};
std::once_flag g_sigterm_once;
util::wake_pipe* g_sigterm_pipe = nullptr;  // made once, kept for the life of the process

void on_sigterm(int /*sig*/) {
  g_sigterm.store(true);
  g_sigterm_pipe->notify();  // async-signal-safe: one write()
}

void watch_sigterm() {
  std::call_once(g_sigterm_once, [] {
    g_sigterm_pipe = new util::wake_pipe();  // NOLINT(cppcoreguidelines-owning-memory)
    struct sigaction sa {};
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGTERM, &sa, nullptr);
  });
}

// Why the broker would refuse `m` (its body does not decode under the limits, a field breaks
// its rule, the body is past max-message, which would also cost the connection), or
// nullopt. A refused DATA would hold back every later one of its attempt (§12.11.4), so the
// user's data is checked here, where the caller can be told.
std::optional<std::string> why_refused(const codec::message& m, std::uint64_t max_message) {
  const auto body = codec::encode_body(m);
  if (max_message != 0 && body.size() > max_message)
    return fmt::format("{} bytes, more than the broker's max-message of {}", body.size(),
                       max_message);
  const auto decoded = codec::decode_body(static_cast<std::uint8_t>(codec::type_of(m)), body);
  if (!decoded) return decoded.error().reason;
  return std::nullopt;
}

void check_sendable(const codec::message& m, std::uint64_t max_message, std::string_view what) {
  if (auto why = why_refused(m, max_message))
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

// Everything the handler thread and the I/O thread share; guarded by `mu`.
struct task_handle::owner {
  std::mutex mu;
  std::condition_variable changed;
  util::wake_pipe wake;  // tells the I/O thread the outbox has something
  std::deque<codec::message> outbox;

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
  // TASK_START), and the DATA the current attempt has sent. No limit: no credit applies.
  std::map<std::pair<std::string, std::uint32_t>, std::uint64_t> credit;
  std::uint64_t data_sent = 0;  // DATA, INFO, LEARN_INFO: the index of the last (§12.11.10)
  std::uint64_t credit_waits = 0;

  // Reliable data (SPEC §12.11) for the attempt whose DATA are kept (data_attempt 0: none).
  // Its numbered items (DATA and INFO, or LEARN_INFO, §12.11.10) wait in the outbox until sent,
  // then in `kept`, in index order, until the broker confirms them (DATA_ACK `relayed`, kept in
  // `confirmed`). `kept` is bounded: past the bound the oldest go, up to `dropped_upto`; the
  // next resend declares those the broker may lack with DATA_LOST, and the broker reports the
  // ones it never got to the coordinator.
  std::string data_task;
  std::uint32_t data_attempt = 0;
  std::uint64_t confirmed = 0;
  std::uint64_t dropped_upto = 0;
  std::deque<codec::message> kept;  // each a data_ready, info or learn_info, with its index
  std::size_t kept_bytes = 0;
  std::uint64_t max_message = 0;  // the broker's, from its last WELCOME (0: not known yet)
  // leave(): when the held task must end by (said again after each WELCOME, §12.6.10)
  std::optional<util::time_point> leave_by;
  // leave(): the sooner deadline wins (mu held)
  void leave_locked(std::chrono::milliseconds deadline) {
    const auto by = util::clock::now() + deadline;
    if (!leave_by || by < *leave_by) leave_by = by;
    post_leaving_locked();
  }
  void post_leaving_locked() {
    if (!leave_by) return;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(*leave_by - util::clock::now());
    outbox.push_back(codec::leaving{
        static_cast<std::uint32_t>(std::clamp<std::int64_t>(left.count(), 0, 86'400'000))});
  }
  std::size_t max_items = 4096;
  std::size_t max_bytes = std::size_t{16} << 20;
  std::uint64_t data_dropped = 0;
  std::uint64_t data_resent = 0;
  std::uint64_t data_batches = 0;  // DATA_BATCH sent, and the DATA in them
  std::uint64_t data_batched = 0;

  static std::size_t size_of(const codec::message& m) {
    if (const auto* i = std::get_if<codec::info>(&m)) return i->body.size();
    if (const auto* l = std::get_if<codec::learn_info>(&m))
      return l->buffer_id.size() + l->body.size();
    const auto& d = std::get<codec::data_ready>(m);
    return d.data_id.size() + d.buffer_id.size() + d.meta.size() +
           (d.payload ? d.payload->size() : 0);
  }
  // The index of a DATA, INFO or LEARN_INFO of ours, numbered and of the attempt whose items
  // are kept.
  std::optional<std::uint64_t> kept_index(const codec::message& m) const {
    if (const auto* d = std::get_if<codec::data_ready>(&m))
      return d->index && ours(d->task_id, d->attempt) ? d->index : std::nullopt;
    if (const auto* i = std::get_if<codec::info>(&m))
      return i->index && ours(i->task_id, i->attempt) ? i->index : std::nullopt;
    if (const auto* l = std::get_if<codec::learn_info>(&m))
      return l->index && ours(l->task_id, l->attempt) ? l->index : std::nullopt;
    return std::nullopt;
  }
  bool ours(const std::string& id, std::uint32_t attempt) const {
    return data_attempt != 0 && attempt == data_attempt && id == data_task;
  }
  void track(const std::string& id, std::uint32_t attempt) {
    data_task = id;
    data_attempt = attempt;
    confirmed = 0;
    dropped_upto = 0;
    kept.clear();
    kept_bytes = 0;
  }
  // The broker may lack anything sent and not confirmed: send it all again, after a DATA_LOST
  // for what was dropped, ahead of what waits in the outbox (mu held). Unsent DATA are all
  // newer than kept ones, so the broker still gets them in index order.
  void resend() {
    data_resent += kept.size();
    while (!kept.empty()) {
      outbox.push_front(std::move(kept.back()));
      kept.pop_back();
    }
    kept_bytes = 0;
    if (dropped_upto > confirmed)
      outbox.push_front(codec::data_lost{data_task, data_attempt, confirmed + 1, dropped_upto});
    wake.notify();
  }
  void confirm(std::uint64_t relayed) {
    confirmed = std::max(confirmed, relayed);
    while (!kept.empty() && *kept_index(kept.front()) <= confirmed) {
      kept_bytes -= size_of(kept.front());
      kept.pop_front();
    }
  }
  // False for an outbox item not worth sending any more: the broker confirmed it (mu held).
  bool worth_sending(const codec::message& m) const {
    if (const auto index = kept_index(m)) return *index > confirmed;
    if (const auto* l = std::get_if<codec::data_lost>(&m))
      return !(ours(l->task_id, l->attempt) && l->last <= confirmed);
    return true;
  }
  // A DATA just sent is kept until confirmed, within the bound (mu held). Most of what the
  // bound drops has arrived long ago; only a resend finds out what has not.
  void sent(codec::message&& m) {
    if (!kept_index(m)) return;
    kept_bytes += size_of(m);
    kept.push_back(std::move(m));
    while (kept.size() > max_items || (kept_bytes > max_bytes && kept.size() > 1)) {
      dropped_upto = *kept_index(kept.front());
      kept_bytes -= size_of(kept.front());
      kept.pop_front();
      ++data_dropped;
    }
  }

  // The I/O thread is woken only when the outbox was empty: otherwise a wake-up is on its way,
  // or the I/O thread is about to flush, or it waits for the socket to take more.
  bool post(codec::message m) {
    bool first = false;
    {
      std::lock_guard lock(mu);
      if (outbox.size() >= max_outbox) return false;
      first = outbox.empty();
      outbox.push_back(std::move(m));
    }
    if (first) wake.notify();
    return true;
  }
  // The RESULT or TASK_FAILED that ends an attempt: also kept, to go again after a resumption
  // in case the old connection took it down (SPEC §12.11.8), until the next TASK_START.
  void post_outcome(codec::message m) {
    {
      std::lock_guard lock(mu);
      last_outcome = m;
      outbox.push_back(std::move(m));
    }
    wake.notify();
  }
  std::optional<codec::message> last_outcome;
  // After a resumption the broker may lack what decides an attempt: the STARTED of the one held
  // (a repeat is dropped, §12.5.3) or the outcome of the last one. First in the outbox, so the
  // STARTED goes ahead of any DATA sent again (mu held).
  void resend_decisions() {
    if (task && !aborted) {
      outbox.push_front(codec::started{task->task_id, task->attempt});
    } else if (last_outcome) {
      outbox.push_front(*last_outcome);
    }
    wake.notify();
  }
  // Sends the attempt's next item of its numbered sequence (DATA, INFO, LEARN_INFO, §12.11.10),
  // made by `make` from its index. Past its credit the broker would refuse it: this waits for
  // more, which comes as the coordinator works through its stream (the broker then keeps the
  // step deadline open). False, with nothing sent, when the attempt is over or closes without
  // credit, or the outbox is full; what `make` throws leaves the sequence as it was.
  bool post_item(const task_handle& h,
                 const std::function<codec::message(std::uint64_t index)>& make) {
    bool first = false;
    {
      std::unique_lock lock(mu);
      const auto key = std::make_pair(h.id_, h.attempt_);
      const auto has_credit = [&] {
        const auto it = credit.find(key);
        return it == credit.end() || data_sent < it->second;
      };
      if (live(h) && !has_credit()) {
        ++credit_waits;
        changed.wait(lock, [&] { return !live(h) || close_requested || has_credit(); });
      }
      if (!live(h) || !has_credit() || outbox.size() >= max_outbox) return false;
      auto m = make(data_sent + 1);
      ++data_sent;
      first = outbox.empty();
      outbox.push_back(std::move(m));
    }
    if (first) wake.notify();  // as post() says
    return true;
  }
  // True while `h`'s attempt is the current one and not over.
  bool live(const task_handle& h) const {
    return task && task->task_id == h.id_ && task->attempt == h.attempt_ && !aborted && !stopping;
  }
};

bool task_handle::stop_requested() const {
  std::lock_guard lock(owner_.mu);
  return !owner_.live(*this) || owner_.close_requested;
}

bool task_handle::aborted() const {
  std::lock_guard lock(owner_.mu);
  return owner_.aborted;
}

bool task_handle::live() const {
  std::lock_guard lock(owner_.mu);
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
  std::lock_guard lock(owner_.mu);
  // The attempt's own latest while it is current; the one it started with once it is over.
  if (owner_.task && owner_.task->task_id == id_ && owner_.task->attempt == attempt_)
    return owner_.policy;
  return policy_;
}

bool task_handle::keep_alive() {
  {
    // Once TASK_CLOSE came the broker only waits for RESULT: a TASK_ALIVE would be refused.
    std::lock_guard lock(owner_.mu);
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
  std::lock_guard lock(owner_.mu);
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

std::optional<std::string> task_handle::get_data(std::string buffer_id, std::uint32_t batch_size,
                                                 std::uint64_t cur_learner_iter,
                                                 std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::uint64_t request = 0;
    {
      std::lock_guard lock(owner_.mu);
      if (!owner_.live(*this) || owner_.close_requested) return std::nullopt;
      request = ++owner_.next_request;
    }
    if (!owner_.post(
            codec::get_data{id_, attempt_, request, buffer_id, batch_size, cur_learner_iter}))
      return std::nullopt;
    std::unique_lock lock(owner_.mu);
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

struct worker::impl {
  impl(worker_options o, task_handlers h) : opts(std::move(o)), handlers(std::move(h)), ctx(1) {
    if (opts.role != role::collector && opts.role != role::learner)
      throw std::invalid_argument("a worker's role is collector or learner");
    client::detail::validate(to_session_options(opts));
    if (opts.max_unconfirmed_data < 1)
      throw std::invalid_argument("max_unconfirmed_data must be at least 1");
    tasks.max_items = opts.max_unconfirmed_data;
    tasks.max_bytes = opts.max_unconfirmed_bytes;
    if (opts.leave_on_sigterm) {
      if (opts.leave_on_sigterm->count() < 0 || *opts.leave_on_sigterm > std::chrono::hours(24))
        throw std::invalid_argument("leave_on_sigterm: the deadline must be 0..24 h");
      watch_sigterm();  // before the I/O thread polls its pipe
    }
    io_thread = std::thread([this] { io_loop(); });
    handler_thread = std::thread([this] { handler_loop(); });
  }

  static client::detail::session_options to_session_options(const worker_options& o) {
    return {o.endpoint,      o.role,          o.id,   o.resources, o.heartbeat,
            o.reconnect_min, o.reconnect_max, o.curve};
  }

  // ---- I/O thread: owns the session and its socket ----
  void io_loop() {
    client::detail::session s(
        ctx, to_session_options(opts),
        [this](connection_state st, std::uint64_t t, const std::string& detail) {
          std::lock_guard lock(mu);
          if (st == connection_state::ready && state != st) ++welcomes;
          // Any refusal is kept, but not the note that comes with a welcome.
          const bool welcomed = st == connection_state::ready && state != st;
          if (!welcomed && !detail.empty()) last_error = detail;
          state = st;
          token = t;
          changed.notify_all();
        },
        [this](codec::message&& m) { on_task_message(std::move(m)); });
    client::detail::io_hooks hooks{
        [this](client::detail::session& ss) { return flush_outbox(ss); }};
    if (opts.leave_on_sigterm) {  // watched until SIGTERM made it leave
      hooks.extra_fd = g_sigterm_pipe->read_fd();
      hooks.on_extra = [this] {
        if (!g_sigterm.load()) return true;
        spdlog::info("{}: SIGTERM: leaving (the task may take {} ms more)", opts.id,
                     opts.leave_on_sigterm->count());
        std::lock_guard lock(tasks.mu);
        tasks.leave_locked(*opts.leave_on_sigterm);
        return false;
      };
    }
    client::detail::run_io_loop(s, tasks.wake, stopping, std::move(hooks));
  }

  // Sends what the handler thread queued, in order, while the session is ready; the rest
  // waits for the next wake-up (a reconnect in between keeps it). Consecutive DATA that wait
  // together leave as one DATA_BATCH (§12.12.5): batching happens exactly when data comes
  // faster than it leaves. True when the socket took everything it was offered.
  bool flush_outbox(client::detail::session& s) {
    std::lock_guard lock(tasks.mu);
    while (!tasks.outbox.empty()) {
      const bool worth = tasks.worth_sending(tasks.outbox.front());
      if (worth) {
        if (const auto n = opts.batch_data ? batchable() : 0; n > 1) {
          if (!s.send_ready(batch_of(n))) return s.state() != connection_state::ready;
          ++tasks.data_batches;
          tasks.data_batched += n;
          for (std::size_t i = 0; i < n; ++i) {
            tasks.sent(std::move(tasks.outbox.front()));
            tasks.outbox.pop_front();
          }
          continue;
        }
        if (!s.send_ready(tasks.outbox.front())) return s.state() != connection_state::ready;
      }
      auto m = std::move(tasks.outbox.front());
      tasks.outbox.pop_front();
      if (worth) tasks.sent(std::move(m));
    }
    return true;
  }

  // How many DATA at the front of the outbox can share one DATA_BATCH: consecutive indexes of
  // one attempt, within the batch bounds, each meta shallow enough for a batch (mu held).
  std::size_t batchable() const {
    // Well inside the broker's max-message, whatever it is (the WELCOME said).
    const auto batch_bound = tasks.max_message == 0
                                 ? max_batch_bytes
                                 : std::min<std::size_t>(max_batch_bytes, tasks.max_message / 2);
    std::size_t n = 0;
    std::size_t bytes = 0;
    const codec::data_ready* prev = nullptr;
    for (const auto& m : tasks.outbox) {
      const auto* d = std::get_if<codec::data_ready>(&m);
      if (d == nullptr || !d->index || n == codec::max_batch_items) break;
      if (prev != nullptr && (*d->index != *prev->index + 1 || d->attempt != prev->attempt ||
                              d->task_id != prev->task_id))
        break;
      const auto size = task_handle::owner::size_of(m) + item_overhead;
      if (bytes + size > batch_bound ||
          (d->meta.size() > codec::rule::max_batched_nesting &&  // a level takes a byte
           codec::nesting_of(d->meta) > codec::rule::max_batched_nesting))
        break;
      bytes += size;
      prev = d;
      ++n;
    }
    return n;
  }

  // The first n DATA of the outbox as one DATA_BATCH (mu held).
  codec::message batch_of(std::size_t n) {
    const auto& first = std::get<codec::data_ready>(tasks.outbox.front());
    for (std::size_t i = 0; i < n; ++i) items.add(std::get<codec::data_ready>(tasks.outbox[i]));
    return codec::data_batch{first.task_id, first.attempt, *first.index, items.done()};
  }

  void on_task_message(codec::message&& m) {
    std::optional<rlbus::policy> updated;
    std::string task_id;
    std::uint32_t attempt = 0;
    if (const auto* u = std::get_if<codec::policy_update>(&m)) {
      task_id = u->task_id;
      attempt = u->attempt;
    }
    on_task_message_locked(std::move(m), updated);
    // Outside the lock: the callback may call the task's members.
    if (updated && handlers.on_policy) handlers.on_policy(task_id, attempt, *updated);
  }

  // `updated`: set to the new policy when a POLICY_UPDATE for the current attempt brings one.
  void on_task_message_locked(codec::message&& m, std::optional<rlbus::policy>& updated) {
    std::lock_guard lock(tasks.mu);
    const auto current = [&](const std::string& id, std::uint32_t attempt) {
      return tasks.task && tasks.task->task_id == id && tasks.task->attempt == attempt;
    };
    if (const auto* w = std::get_if<codec::welcome>(&m)) {
      tasks.max_message = w->max_message;
      tasks.post_leaving_locked();  // a new session, or a resumed one that may have missed it
      // A resumed session: whatever the old connection still held is gone, so everything not
      // confirmed goes again. A new session: the broker ended our attempt, nothing to resend.
      if (w->resumed) {
        if (tasks.data_attempt != 0) tasks.resend();
        tasks.resend_decisions();
      } else {
        // The broker (restarted, or it expired us) holds no attempt of ours: the handler of
        // the one we ran is told to stop, and the next TASK_START waits for it.
        if (tasks.task && !tasks.aborted) {
          spdlog::warn("{}: task {} attempt {} ended: the broker began a new session", opts.id,
                       tasks.task->task_id, tasks.task->attempt);
          tasks.aborted = true;
        }
        tasks.track("", 0);
        tasks.last_outcome.reset();
      }
    } else if (const auto* ack = std::get_if<codec::data_ack>(&m)) {
      if (tasks.ours(ack->task_id, ack->attempt)) {
        tasks.confirm(ack->relayed);
        if (ack->resend) tasks.resend();
      }
    } else if (auto* start = std::get_if<codec::task_start>(&m)) {
      // The broker frees a worker when it aborts its task, so the next task may come while
      // the aborted handler still winds down: it waits its turn (the start timeout covers it).
      const bool winding_down = tasks.task && tasks.aborted && !tasks.next_task;
      if (!handlers.run || (tasks.task && !winding_down)) {
        tasks.outbox.push_back(
            codec::task_failed{start->task_id, start->attempt,
                               handlers.run ? "worker is busy" : "worker runs no tasks"});
        return;
      }
      if (winding_down) {
        tasks.next_task = std::move(*start);
      } else {
        begin(std::move(*start));
      }
    } else if (auto* u = std::get_if<codec::policy_update>(&m)) {
      // Versions only grow; one that is not newer (a reordering) changes nothing.
      if (current(u->task_id, u->attempt) && (!tasks.policy || tasks.policy->id != u->policy_id ||
                                              tasks.policy->version < u->policy_version)) {
        tasks.policy = rlbus::policy{std::move(u->policy_id), u->policy_version,
                                     std::move(u->policy_ref), std::move(u->policy_params)};
        updated = tasks.policy;
      }
    } else if (const auto* c = std::get_if<codec::task_close>(&m)) {
      if (current(c->task_id, c->attempt)) tasks.close_requested = true;
    } else if (const auto* a = std::get_if<codec::task_abort>(&m)) {
      if (current(a->task_id, a->attempt)) {
        spdlog::warn("{}: task {} attempt {} aborted: {}", opts.id, a->task_id, a->attempt,
                     a->reason);
        tasks.aborted = true;
        // The broker accepts nothing more of this attempt: nothing left to resend.
        if (tasks.ours(a->task_id, a->attempt)) tasks.track("", 0);
      }
    } else if (auto* l = std::get_if<codec::learn>(&m)) {
      if (current(l->task_id, l->attempt)) tasks.replies.emplace(l->request_id, std::move(m));
    } else if (auto* n = std::get_if<codec::no_data>(&m)) {
      if (current(n->task_id, n->attempt)) tasks.replies.emplace(n->request_id, std::move(m));
    } else if (const auto* dc = std::get_if<codec::data_credit>(&m)) {
      auto& limit = tasks.credit[{dc->task_id, dc->attempt}];
      limit = std::max(limit, dc->limit);  // a running total: an older one says nothing new
      // Credit of attempts that never ran (refused as busy) must not pile up.
      while (tasks.credit.size() > max_credit_entries) {
        auto victim = tasks.credit.begin();
        if (tasks.task && victim->first == std::make_pair(tasks.task->task_id, tasks.task->attempt))
          ++victim;
        tasks.credit.erase(victim);
      }
    }
    tasks.changed.notify_all();
  }

  // Makes `start` the current task and tells the broker (tasks.mu held).
  void begin(codec::task_start&& start) {
    tasks.outbox.push_back(codec::started{start.task_id, start.attempt});
    tasks.last_outcome.reset();  // the broker has moved on: it freed us
    tasks.policy.reset();
    if (start.policy_id && start.policy_version)
      tasks.policy = rlbus::policy{*start.policy_id, *start.policy_version, start.policy_ref,
                                   start.policy_params};
    tasks.task = std::move(start);
    tasks.data_sent = 0;
    tasks.track(tasks.task->task_id, tasks.task->attempt);
    tasks.close_requested = false;
    tasks.aborted = false;
    tasks.replies.clear();
    tasks.wake.notify();
  }

  // ---- handler thread: runs the user's code, one task at a time ----
  void handler_loop() {
    while (true) {
      std::optional<codec::task_start> start;
      {
        std::unique_lock lock(tasks.mu);
        tasks.changed.wait(lock, [&] { return tasks.stopping || tasks.task.has_value(); });
        if (tasks.stopping) return;
        start = tasks.task;
      }
      std::optional<rlbus::policy> p;
      if (start->policy_id && start->policy_version)
        p = rlbus::policy{*start->policy_id, *start->policy_version, start->policy_ref,
                          start->policy_params};
      task_handle h(tasks, start->task_id, start->attempt, std::move(start->task_info),
                    std::move(p));
      std::optional<std::string> failure;
      std::optional<std::string> failure_result;
      try {
        handlers.run(h);
      } catch (const task_failure& e) {
        failure = e.what();
        failure_result = e.result();
      } catch (const std::exception& e) {
        failure = e.what();
      } catch (...) {
        failure = "unknown exception";
      }
      std::optional<std::string> result;
      if (!failure) {
        std::unique_lock lock(tasks.mu);
        tasks.changed.wait(
            lock, [&] { return tasks.stopping || tasks.aborted || tasks.close_requested; });
        if (tasks.close_requested && !tasks.aborted && !tasks.stopping) {
          lock.unlock();
          try {
            result = handlers.close ? handlers.close(h) : codec::empty_map_blob;
          } catch (const task_failure& e) {
            failure = e.what();
            failure_result = e.result();
          } catch (const std::exception& e) {
            failure = e.what();
          }
        }
      }
      {
        // Free the slot before the broker hears the outcome: it assigns the next task as
        // soon as it does.
        std::lock_guard lock(tasks.mu);
        tasks.credit.erase({h.id(), h.attempt()});
        tasks.task.reset();
        tasks.replies.clear();
        if (tasks.next_task) {
          begin(std::move(*tasks.next_task));
          tasks.next_task.reset();
        }
      }
      const auto max_message = h.max_message();
      if (result) {
        codec::task_result r{h.id(), h.attempt(), std::move(*result)};
        if (auto why = why_refused(r, max_message)) {
          failure = "the close handler's result cannot travel: " + *why;
        } else {
          tasks.post_outcome(std::move(r));
        }
      }
      if (failure) {
        spdlog::warn("{}: task {} failed: {}", opts.id, h.id(), *failure);
        codec::task_failed f{h.id(), h.attempt(), failure->substr(0, 1000),
                             std::move(failure_result)};
        // A result the broker would refuse is left out: the failure itself still travels.
        if (f.result) {
          if (auto why = why_refused(f, max_message)) {
            spdlog::warn("{}: task {}: the failure's result is left out: {}", opts.id, h.id(),
                         *why);
            f.result.reset();
          }
        }
        tasks.post_outcome(std::move(f));
      }
    }
  }

  void stop() {
    if (!io_thread.joinable()) return;
    {
      std::lock_guard lock(tasks.mu);
      tasks.stopping = true;
      tasks.changed.notify_all();
    }
    handler_thread.join();  // a handler still running must notice stop_requested()
    stopping.store(true, std::memory_order_relaxed);
    tasks.wake.notify();
    io_thread.join();
  }

  worker_options opts;
  task_handlers handlers;
  zmq::context_t ctx;
  task_handle::owner tasks;
  codec::items_writer items;  // the I/O thread's, reused for every DATA_BATCH
  std::atomic<bool> stopping{false};
  mutable std::mutex mu;
  mutable std::condition_variable changed;
  connection_state state = connection_state::connecting;
  std::uint64_t token = 0;
  std::uint64_t welcomes = 0;
  std::string last_error;
  std::thread io_thread;
  std::thread handler_thread;
};

worker::worker(worker_options opts, task_handlers handlers)
    : impl_(std::make_unique<impl>(std::move(opts), std::move(handlers))) {}
worker::~worker() {
  stop();
}
worker::worker(worker&&) noexcept = default;
worker& worker::operator=(worker&& other) noexcept {
  if (this != &other) {
    stop();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

connection_state worker::state() const {
  std::lock_guard lock(impl_->mu);
  return impl_->state;
}

bool worker::wait_for(connection_state s, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mu);
  return impl_->changed.wait_for(lock, timeout, [&] { return impl_->state == s; });
}

std::uint64_t worker::session() const {
  std::lock_guard lock(impl_->mu);
  return impl_->token;
}

std::uint64_t worker::welcomes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->welcomes;
}

std::uint64_t worker::credit_waits() const {
  std::lock_guard lock(impl_->tasks.mu);
  return impl_->tasks.credit_waits;
}

std::uint64_t worker::data_dropped() const {
  std::lock_guard lock(impl_->tasks.mu);
  return impl_->tasks.data_dropped;
}

std::uint64_t worker::data_batches() const {
  std::lock_guard lock(impl_->tasks.mu);
  return impl_->tasks.data_batches;
}

std::uint64_t worker::data_batched() const {
  std::lock_guard lock(impl_->tasks.mu);
  return impl_->tasks.data_batched;
}

std::uint64_t worker::data_resent() const {
  std::lock_guard lock(impl_->tasks.mu);
  return impl_->tasks.data_resent;
}

std::string worker::last_error() const {
  std::lock_guard lock(impl_->mu);
  return impl_->last_error;
}

const worker_options& worker::options() const {
  return impl_->opts;
}

bool worker::leave(std::chrono::milliseconds deadline) {
  if (deadline.count() < 0 || deadline > std::chrono::hours(24))
    throw std::invalid_argument("leave: the deadline must be 0..24 h");
  {
    std::lock_guard lock(impl_->tasks.mu);
    if (impl_->tasks.stopping) return false;
    impl_->tasks.leave_locked(deadline);
  }
  impl_->tasks.wake.notify();
  return true;
}

bool worker::leaving() const {
  std::lock_guard lock(impl_->tasks.mu);
  return impl_->tasks.leave_by.has_value();
}

void worker::stop() {
  if (impl_) impl_->stop();
}

}  // namespace rlbus
