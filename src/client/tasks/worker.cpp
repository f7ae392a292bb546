// rlbus::worker: a role on the client core (client/core/core.hpp). The core's I/O thread hands it
// the broker's task messages, which change the shared task state (client/tasks/task_state.hpp);
// the handler thread runs the user's code on a task_handle (client/tasks/task.cpp), whose reports
// wait in the core's outbox until flushed here, batched (client/tasks/batching.hpp) and kept until
// confirmed (client/tasks/unconfirmed.hpp). See include/rlbus/worker.hpp for the contract.
#include "rlbus/worker.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <signal.h>  // sigaction

#include <spdlog/spdlog.h>

#include "client/core/core.hpp"
#include "client/tasks/batching.hpp"
#include "client/tasks/task_state.hpp"
#include "codec/codec.hpp"
#include "util/wake_pipe.hpp"

namespace rlbus {

namespace {
constexpr std::size_t max_outbox = 100'000;     // messages waiting for the I/O thread
constexpr std::size_t max_credit_entries = 16;  // attempts whose DATA_CREDIT is kept

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

}  // namespace

struct worker::impl {
  impl(worker_options o, task_handlers h)
      : opts(std::move(o)),
        handlers(std::move(h)),
        io(checked(opts), max_outbox),
        tasks(io, opts.max_unconfirmed_data, opts.max_unconfirmed_bytes) {
    if (opts.leave_on_sigterm) watch_sigterm();  // before the I/O thread polls its pipe
    client::detail::core::role_hooks hooks{
        [this](codec::message&& m) { on_task_message(std::move(m)); },
        [this](client::detail::session& s) { return flush_outbox(s); }};
    if (opts.leave_on_sigterm) {  // watched until SIGTERM made it leave
      hooks.extra_fd = g_sigterm_pipe->read_fd();
      hooks.on_extra = [this] {
        if (!g_sigterm.load()) return true;
        spdlog::info("{}: SIGTERM: leaving (the task may take {} ms more)", opts.id,
                     opts.leave_on_sigterm->count());
        // On the I/O thread, which flushes next: no wake-up needed.
        std::lock_guard lock(io.mu());
        tasks.leave_locked(*opts.leave_on_sigterm);
        return false;
      };
    }
    io.start(std::move(hooks));
    handler_thread = std::thread([this] { handler_loop(); });
  }
  ~impl() { stop(); }
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  // The session's options from the worker's, once the worker's own are checked (throws
  // std::invalid_argument naming the bad one).
  static client::detail::session_options checked(const worker_options& o) {
    if (o.role != role::collector && o.role != role::learner)
      throw std::invalid_argument("a worker's role is collector or learner");
    client::detail::session_options so{o.endpoint,      o.role,      o.id,
                                       o.resources,     o.heartbeat, o.reconnect_min,
                                       o.reconnect_max, o.curve};
    client::detail::validate(so);
    if (o.max_unconfirmed_data < 1)
      throw std::invalid_argument("max_unconfirmed_data must be at least 1");
    if (o.leave_on_sigterm &&
        (o.leave_on_sigterm->count() < 0 || *o.leave_on_sigterm > std::chrono::hours(24)))
      throw std::invalid_argument("leave_on_sigterm: the deadline must be 0..24 h");
    return so;
  }

  // Sends what the handler thread queued, in order, while the session is ready; the rest
  // waits for the next wake-up (a reconnect in between keeps it). Consecutive DATA that wait
  // together leave as one DATA_BATCH (§12.12.5): batching happens exactly when data comes
  // faster than it leaves. True when the socket took everything it was offered.
  bool flush_outbox(client::detail::session& s) {  // the core's lock held
    auto& outbox = io.outbox();
    auto& kept = tasks.unconfirmed;
    while (!outbox.empty()) {
      const bool worth = kept.worth_sending(outbox.front());
      if (worth) {
        const auto n = opts.batch_data ? batcher.batchable(outbox, tasks.max_message) : 0;
        if (n > 1) {
          if (!s.send_ready(batcher.batch_of(outbox, n)))
            return s.state() != connection_state::ready;
          ++tasks.data_batches;
          tasks.data_batched += n;
          for (std::size_t i = 0; i < n; ++i) {
            kept.sent(std::move(outbox.front()));
            outbox.pop_front();
          }
          continue;
        }
        if (!s.send_ready(outbox.front())) return s.state() != connection_state::ready;
      }
      auto m = std::move(outbox.front());
      outbox.pop_front();
      if (worth) kept.sent(std::move(m));
    }
    return true;
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
    std::lock_guard lock(io.mu());
    const auto current = [&](const std::string& id, std::uint32_t attempt) {
      return tasks.task && tasks.task->task_id == id && tasks.task->attempt == attempt;
    };
    if (const auto* w = std::get_if<codec::welcome>(&m)) {
      tasks.max_message = w->max_message;
      tasks.post_leaving_locked();  // a new session, or a resumed one that may have missed it
      // A resumed session: whatever the old connection still held is gone, so everything not
      // confirmed goes again. A new session: the broker ended our attempt, nothing to resend.
      if (w->resumed) {
        if (tasks.unconfirmed.tracking()) resend();
        tasks.resend_decisions();
      } else {
        // The broker (restarted, or it expired us) holds no attempt of ours: the handler of
        // the one we ran is told to stop, and the next TASK_START waits for it.
        if (tasks.task && !tasks.aborted) {
          spdlog::warn("{}: task {} attempt {} ended: the broker began a new session", opts.id,
                       tasks.task->task_id, tasks.task->attempt);
          tasks.aborted = true;
        }
        tasks.unconfirmed.forget();
        tasks.last_outcome.reset();
      }
    } else if (const auto* ack = std::get_if<codec::data_ack>(&m)) {
      if (tasks.unconfirmed.ours(ack->task_id, ack->attempt)) {
        tasks.unconfirmed.confirm(ack->relayed);
        if (ack->resend) resend();
      }
    } else if (auto* start = std::get_if<codec::task_start>(&m)) {
      // The broker frees a worker when it aborts its task, so the next task may come while
      // the aborted handler still winds down: it waits its turn (the start timeout covers it).
      const bool winding_down = tasks.task && tasks.aborted && !tasks.next_task;
      if (!handlers.run || (tasks.task && !winding_down)) {
        io.outbox().push_back(
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
        if (tasks.unconfirmed.ours(a->task_id, a->attempt)) tasks.unconfirmed.forget();
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

  // Makes `start` the current task and tells the broker (the core's lock held).
  void begin(codec::task_start&& start) {
    io.outbox().push_back(codec::started{start.task_id, start.attempt});
    tasks.last_outcome.reset();  // the broker has moved on: it freed us
    tasks.policy.reset();
    if (start.policy_id && start.policy_version)
      tasks.policy = rlbus::policy{*start.policy_id, *start.policy_version, start.policy_ref,
                                   start.policy_params};
    tasks.task = std::move(start);
    tasks.data_sent = 0;
    tasks.unconfirmed.track(tasks.task->task_id, tasks.task->attempt);
    tasks.close_requested = false;
    tasks.aborted = false;
    tasks.replies.clear();
    io.wake();
  }

  // ---- handler thread: runs the user's code, one task at a time ----
  void handler_loop() {
    while (true) {
      std::optional<codec::task_start> start;
      {
        std::unique_lock lock(io.mu());
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
        std::unique_lock lock(io.mu());
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
        std::lock_guard lock(io.mu());
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
        if (auto why = client::detail::why_refused(r, max_message)) {
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
          if (auto why = client::detail::why_refused(f, max_message)) {
            spdlog::warn("{}: task {}: the failure's result is left out: {}", opts.id, h.id(),
                         *why);
            f.result.reset();
          }
        }
        tasks.post_outcome(std::move(f));
      }
    }
  }

  // Everything sent and not confirmed goes again (the core's lock held).
  void resend() {
    tasks.unconfirmed.resend(io.outbox());
    io.wake();
  }

  void stop() {
    if (!handler_thread.joinable()) return;
    {
      std::lock_guard lock(io.mu());
      tasks.stopping = true;
      tasks.changed.notify_all();
    }
    handler_thread.join();  // a handler still running must notice stop_requested()
    io.stop();
  }

  worker_options opts;
  task_handlers handlers;
  client::detail::core io;
  task_handle::owner tasks;
  client::detail::data_batcher batcher;  // the I/O thread's
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
  return impl_->io.state();
}

bool worker::wait_for(connection_state s, std::chrono::milliseconds timeout) const {
  return impl_->io.wait_for(s, timeout);
}

std::uint64_t worker::session() const {
  return impl_->io.token();
}

std::uint64_t worker::welcomes() const {
  return impl_->io.welcomes();
}

std::uint64_t worker::credit_waits() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->tasks.credit_waits;
}

std::uint64_t worker::data_dropped() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->tasks.unconfirmed.dropped();
}

std::uint64_t worker::data_batches() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->tasks.data_batches;
}

std::uint64_t worker::data_batched() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->tasks.data_batched;
}

std::uint64_t worker::data_resent() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->tasks.unconfirmed.resent();
}

std::string worker::last_error() const {
  return impl_->io.last_error();
}

const worker_options& worker::options() const {
  return impl_->opts;
}

bool worker::leave(std::chrono::milliseconds deadline) {
  if (deadline.count() < 0 || deadline > std::chrono::hours(24))
    throw std::invalid_argument("leave: the deadline must be 0..24 h");
  {
    std::lock_guard lock(impl_->io.mu());
    if (impl_->tasks.stopping) return false;
    impl_->tasks.leave_locked(deadline);
  }
  impl_->io.wake();
  return true;
}

bool worker::leaving() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->tasks.leave_by.has_value();
}

void worker::stop() {
  if (impl_) impl_->stop();
}

}  // namespace rlbus
