// The task manager's lifecycle (see task_manager.hpp for the model): sessions that join and
// go, what coordinators, learners and workers say of their tasks, assignment, deadlines and
// the end of attempts. Handlers check who may say what (owner, holder, attempt, state)
// before they change anything, so a refused message leaves no trace.
#include "broker/tasks/task_manager.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "broker/tasks/task_helpers.hpp"
#include "codec/codec.hpp"
#include "codec/messages.hpp"
#include "util/log.hpp"

namespace rlbus::broker {

using task_helpers::clip;
using task_helpers::refuse;
using task_helpers::view_of;

task_manager::task_manager(const config& cfg, task_sink& sink)
    : cfg_(cfg),
      sink_(sink),
      workers_(cfg.quarantine_after, std::chrono::milliseconds(cfg.quarantine_ms), cfg.max_peers),
      policies_(cfg.policy_max_ids, cfg.policy_max_bytes),
      streams_(cfg, sink, counts_) {}

void task_manager::peer_joined(const std::string& id, rlbus::role role, const rlbus::resources& res,
                               std::uint64_t serial, util::time_point now) {
  if (role == rlbus::role::coordinator) return;
  // A worker back under an id in quarantine (a restarted process) waits it out.
  workers_.join(id, role, res, serial);
  try_assign(now);
}

void task_manager::peer_resources(const std::string& id, const rlbus::resources& res,
                                  util::time_point now) {
  if (workers_.set_resources(id, res)) try_assign(now);  // a queued task may fit now
}

void task_manager::peer_resumed(const std::string& id) {
  if (auto* s = streams_.find(id)) {
    // What went down with the old connection is the coordinator's to ask for: an event sent
    // before its REPLAY would come again with it (§12.9.7).
    s->awaiting_resume = s->windowed;
    return;
  }
  const auto* w = workers_.find(id);
  if (w == nullptr || w->task.empty()) return;
  auto& t = tasks_.at(w->task);
  // What went down with the old connection is sent again by the worker on its own; this
  // only tells it how much of that it can skip.
  if (t.st == state::running || t.st == state::closing) send_data_ack(t, false);
  // So may the last DATA_CREDIT: a worker that used what it knew of would wait for ever.
  if (t.data.credited()) tell_credit(t);
  // A TASK_CLOSE may have gone down with it too: said again, or the attempt would wait for
  // its close timeout (§12.11.7).
  if (t.st == state::closing) sink_.send_to(id, codec::task_close{t.id, t.attempt});
}

void task_manager::peer_gone(const std::string& id, rlbus::role role, util::time_point now,
                             bool orderly) {
  if (role == rlbus::role::coordinator) {
    const auto owned = tasks_.owned_by(id);
    const auto* s = streams_.find(id);
    const bool unacked = s != nullptr && s->windowed && s->seq > s->acked;
    if (!orderly && cfg_.coordinator_grace_ms > 0 && (owned > 0 || unacked)) {
      // It may only have crashed: a new process with its id may take its work over.
      orphans_[id] = now + std::chrono::milliseconds(cfg_.coordinator_grace_ms);
      spdlog::warn(
          "coordinator {} vanished: its {} tasks and its stream are kept {} ms for a "
          "new session of {} to adopt",
          id, owned, cfg_.coordinator_grace_ms, id);
      return;
    }
    drop_coordinator(id, now);
    return;
  }
  const auto w = workers_.leave(id);
  if (!w) return;
  if (!w->task.empty()) {
    const auto reason = fmt::format("worker {} {}", id, w->leaving ? "left" : "lost");
    end_attempt(tasks_.at(w->task), reason, now);
    // a crash-looping worker is caught too; one that said it was leaving is not failing
    if (!w->leaving) ended_badly(id, w->role, reason, now);
  }
  try_assign(now);
}

std::optional<std::uint64_t> task_manager::adopt(const std::string& id) {
  const auto o = orphans_.find(id);
  if (o == orphans_.end()) return std::nullopt;
  orphans_.erase(o);
  ++counts_.adoptions;
  auto& s = streams_.of(id);
  s.awaiting_resume = s.windowed;  // until the new session's REPLAY says from where
  spdlog::info("coordinator {}: the new session adopts its tasks; the stream goes on after {}", id,
               s.acked);
  return s.acked;
}

void task_manager::drop_coordinator(const std::string& id, util::time_point now) {
  orphans_.erase(id);
  streams_.drop(id);  // first: the tasks below go without handing out credit
  if (journal_ != nullptr) journal_->stream_dropped(id);
  std::vector<std::string> owned;
  for (const auto& [task_id, t] : tasks_)
    if (t.owner == id) owned.push_back(task_id);
  for (const auto& task_id : owned) {
    auto& t = tasks_.at(task_id);
    if (!t.worker.empty()) {
      sink_.send_to(t.worker, codec::task_abort{t.id, t.attempt, "its coordinator is gone"});
      workers_.release(t.worker);
    }
    ++counts_.cancelled;
    erase_task(task_id);
  }
  if (!owned.empty()) {
    spdlog::warn("coordinator {} gone: cancelled its {} tasks", id, owned.size());
    try_assign(now);
  }
}

std::optional<refusal> task_manager::handle(const std::string& from, rlbus::role role,
                                            codec::message&& m, util::time_point now) {
  const bool from_coordinator = role == rlbus::role::coordinator;
  if (std::holds_alternative<codec::submitted>(m) || std::holds_alternative<codec::task_event>(m) ||
      std::holds_alternative<codec::stream_gap>(m) ||
      std::holds_alternative<codec::data_credit>(m) || std::holds_alternative<codec::data_ack>(m) ||
      std::holds_alternative<codec::policy_update>(m))
    return refuse(
        codec::error_code::unknown_type,
        fmt::format("{} is sent by the broker, never to it",
                    codec::type_name(static_cast<std::uint8_t>(codec::type_of(m))).value_or("?")));
  if (const auto* r = std::get_if<codec::replay>(&m))
    return from_coordinator ? on_replay(from, *r)
                            : refuse(codec::error_code::unknown_type,
                                     "only coordinators have a stream to replay");
  if (const auto* a = std::get_if<codec::ack>(&m))
    return from_coordinator ? on_ack(from, *a)
                            : refuse(codec::error_code::unknown_type,
                                     "only coordinators have a stream to acknowledge");
  if (auto* s = std::get_if<codec::submit>(&m))
    return from_coordinator
               ? on_submit(from, std::move(*s), now)
               : refuse(codec::error_code::unknown_type, "only coordinators submit tasks");
  if (const auto* f = std::get_if<codec::finish>(&m))
    return from_coordinator
               ? on_finish(from, *f, now)
               : refuse(codec::error_code::unknown_type, "only coordinators finish tasks");
  if (const auto* c = std::get_if<codec::cancel>(&m))
    return from_coordinator
               ? on_cancel(from, *c, now)
               : refuse(codec::error_code::unknown_type, "only coordinators cancel tasks");
  if (auto* r = std::get_if<codec::data_reply>(&m))
    return from_coordinator
               ? on_data_reply(from, std::move(*r))
               : refuse(codec::error_code::unknown_type, "only coordinators answer data requests");
  if (auto* p = std::get_if<codec::policy>(&m))
    return role == rlbus::role::learner
               ? on_policy(from, std::move(*p))
               : refuse(codec::error_code::unknown_type, "only learners publish policies");
  if (const auto* d = std::get_if<codec::data_ready>(&m))
    return on_data(from, role, codec::view_of(*d), now);
  if (from_coordinator)
    return refuse(codec::error_code::unknown_type, "a coordinator does not run tasks");
  if (const auto* l = std::get_if<codec::leaving>(&m)) return on_leaving(from, *l, now);
  return on_worker_message(from, std::move(m), now);
}

// The worker will go away (§12.6.10): no new task for it, and the attempt it holds ends by
// the deadline it gave at the latest. Answered with nothing.
std::optional<refusal> task_manager::on_leaving(const std::string& from, const codec::leaving& l,
                                                util::time_point now) {
  const auto* w = workers_.find(from);
  if (w == nullptr) return std::nullopt;
  if (!w->leaving)
    spdlog::info("worker {} is leaving (its task may take {} ms more)", from, l.deadline_ms);
  workers_.set_leaving(from);
  if (w->task.empty()) return std::nullopt;
  auto& t = tasks_.at(w->task);
  const auto by = now + std::chrono::milliseconds(l.deadline_ms);
  if (by < t.attempt_end) {
    t.attempt_end = by;
    t.leave_end = true;
    set_deadline(t, t.deadline);  // every deadline is capped by the attempt's end
  }
  return std::nullopt;
}

// ---- learner side ------------------------------------------------------------------------

std::optional<refusal> task_manager::on_policy(const std::string& from, codec::policy&& p) {
  codec::policy_status status{p.policy_id, p.version, from, p.params ? p.params->size() : 0};
  if (auto refused = policies_.publish(from, std::move(p))) return refused;
  if (journal_ != nullptr) {
    const auto* held = policies_.latest(status.policy_id);
    journal_->policy(from, codec::policy{status.policy_id, held->version, held->ref, held->params});
  }
  spdlog::debug("policy {} version {} from {}", status.policy_id, status.version, from);
  const auto topic = "policy." + status.policy_id;
  // Attempts that run this policy hear of the new version now, not only at their next start.
  if (const stored_policy* held = policies_.latest(status.policy_id)) {
    for (const auto& [id, t] : tasks_) {
      if (t.policy_id != status.policy_id || t.worker.empty() ||
          (t.st != state::starting && t.st != state::running))
        continue;
      sink_.send_to(t.worker, codec::policy_update{t.id, t.attempt, status.policy_id, held->version,
                                                   held->ref, held->params});
    }
  }
  sink_.publish(topic, std::move(status));
  return std::nullopt;
}

// ---- coordinator side ------------------------------------------------------------------

std::optional<refusal> task_manager::on_submit(const std::string& from, codec::submit&& s,
                                               util::time_point now) {
  const auto answer = [&](bool ok, codec::error_code code, std::string reason,
                          std::uint64_t queued) {
    sink_.send_to(from, codec::submitted{s.task_id, ok,
                                         ok ? std::uint16_t{0} : static_cast<std::uint16_t>(code),
                                         std::move(reason), queued});
    return std::nullopt;
  };
  if (s.kind == rlbus::role::coordinator)
    return refuse(codec::error_code::bad_field, "field 'kind': collector or learner");
  if (closed_)
    return answer(false, codec::error_code::busy,
                  "the broker is shutting down and accepts no new tasks; submit again to the "
                  "next broker",
                  0);
  if (tasks_.contains(s.task_id))
    return answer(false, codec::error_code::duplicate_task,
                  fmt::format("task '{}' is already live", s.task_id), 0);
  if (tasks_.queued() >= cfg_.max_queue)
    return answer(false, codec::error_code::queue_full,
                  fmt::format("the queue holds its maximum of {} tasks", cfg_.max_queue), 0);
  if (tasks_.owned_by(from) >= cfg_.max_tasks_per_coordinator) {
    ++counts_.task_limit;
    return answer(false, codec::error_code::too_many_tasks,
                  fmt::format("you hold the maximum of {} live tasks a coordinator may have",
                              cfg_.max_tasks_per_coordinator),
                  0);
  }
  const auto ms = [](std::optional<std::uint32_t> v, std::uint32_t def) {
    return std::chrono::milliseconds(v.value_or(def));
  };
  task t;
  t.id = s.task_id;
  t.owner = from;
  t.kind = s.kind;
  t.task_info = std::move(s.task_info);
  t.requirements = std::move(s.requirements);
  t.policy_id = std::move(s.policy_id);
  t.start_timeout = ms(s.start_timeout_ms, cfg_.start_timeout_ms);
  t.step_timeout = ms(s.step_timeout_ms, cfg_.step_timeout_ms);
  t.close_timeout = ms(s.close_timeout_ms, cfg_.close_timeout_ms);
  t.task_timeout = ms(s.task_timeout_ms, cfg_.task_timeout_ms);
  t.max_attempts = s.max_attempts.value_or(cfg_.max_attempts);
  t.queue_timeout = ms(s.queue_timeout_ms, cfg_.queue_timeout_ms);
  t.submitted_at = now;
  t.queued_at = now;
  auto& added = tasks_.add(std::move(t));
  if (journal_ != nullptr) journal_->submitted(journal_task_of(added));  // before SUBMITTED says so
  arm_queue_timeout(added, now);
  ++counts_.queued;
  answer(true, codec::error_code::goodbye, "", tasks_.queued() - 1);
  try_assign(now);
  return std::nullopt;
}

task* task_manager::owned_task(const std::string& coordinator, const std::string& task_id,
                               std::optional<refusal>& why) {
  task* t = tasks_.find(task_id);
  if (t == nullptr || t->owner != coordinator) {
    why =
        refuse(codec::error_code::unknown_task, fmt::format("no live task '{}' of yours", task_id));
    return nullptr;
  }
  return t;
}

std::optional<refusal> task_manager::on_finish(const std::string& from, const codec::finish& f,
                                               util::time_point now) {
  std::optional<refusal> why;
  task* t = owned_task(from, f.task_id, why);
  if (t == nullptr) return why;
  if (t->st != state::running)
    return refuse(
        codec::error_code::wrong_state,
        fmt::format("task '{}' is not running: only a running task can be finished", t->id));
  t->st = state::closing;
  set_deadline(*t, now + t->close_timeout);
  sink_.send_to(t->worker, codec::task_close{t->id, t->attempt});
  return std::nullopt;
}

std::optional<refusal> task_manager::on_cancel(const std::string& from, const codec::cancel& c,
                                               util::time_point now) {
  std::optional<refusal> why;
  task* t = owned_task(from, c.task_id, why);
  if (t == nullptr) return why;
  if (!t->worker.empty()) {
    sink_.send_to(t->worker, codec::task_abort{t->id, t->attempt, clip("cancelled: " + c.reason)});
    workers_.release(t->worker);
  }
  emit(*t, codec::event_body::cancelled{c.reason, t->attempt}, c.reason);
  ++counts_.cancelled;
  erase_task(c.task_id);
  try_assign(now);
  return std::nullopt;
}

std::optional<refusal> task_manager::on_data_reply(const std::string& from, codec::data_reply&& r) {
  std::optional<refusal> why;
  task* t = owned_task(from, r.task_id, why);
  if (t == nullptr) return why;
  if (t->st != state::running || t->request_id != r.request_id) {
    auto why = refuse(codec::error_code::wrong_state,
                      fmt::format("task '{}' has no open data request {}", t->id, r.request_id));
    why.late = true;  // the request was answered, replaced or ended before this reply came
    return why;
  }
  t->request_id.reset();
  if (r.data == codec::nil_blob) {
    // The coordinator knows best when it may have data: its hint wins over the setting.
    sink_.send_to(t->worker, codec::no_data{t->id, t->attempt, r.request_id,
                                            r.retry_ms.value_or(cfg_.no_data_retry_ms)});
  } else {
    sink_.send_to(t->worker, codec::learn{t->id, t->attempt, r.request_id, std::move(r.data)});
  }
  return std::nullopt;
}

// ---- worker side -----------------------------------------------------------------------

namespace {
template <class M>
const std::string& task_id_of(const M& m) {
  return m.task_id;
}
template <class M>
std::uint32_t attempt_of(const M& m) {
  return m.attempt;
}
}  // namespace

task* task_manager::held_task(const std::string& from, std::string_view task_id,
                              std::uint32_t attempt, std::optional<refusal>& why) {
  task* found = tasks_.find(task_id);
  if (found == nullptr) {
    why = refuse(codec::error_code::unknown_task, fmt::format("you hold no task '{}'", task_id));
    return nullptr;
  }
  task& t = *found;
  // Fencing (§12.7.5): an earlier attempt is stale whoever names it; the current one is
  // stale only for the worker it ended on while the task waits to be assigned again. A
  // worker that ran an earlier attempt and names the one now running elsewhere holds
  // nothing: 406, like any stranger.
  const bool current = t.worker == from && attempt == t.attempt;
  const bool ended = attempt < t.attempt ||
                     (attempt == t.attempt && t.st == state::queued && t.last_worker == from);
  if (!current && !ended) {
    why = refuse(codec::error_code::unknown_task, fmt::format("you hold no task '{}'", task_id));
    return nullptr;
  }
  if (ended) {
    ++counts_.stale;
    why = refuse(codec::error_code::stale_attempt,
                 fmt::format("attempt {} of task '{}' has ended (current attempt {})", attempt,
                             t.id, t.attempt));
    return nullptr;
  }
  return &t;
}

// Progress that crosses a TASK_CLOSE in flight is a race, not a fault (a STARTED is not
// progress: `late_if_closing` false).
refusal task_manager::wrong_state(const task& t, std::string_view what, bool late_if_closing) {
  auto r = refuse(codec::error_code::wrong_state, fmt::format("task '{}': {}", t.id, what));
  r.late = late_if_closing && t.st == state::closing;
  return r;
}

std::optional<refusal> task_manager::on_worker_message(const std::string& from, codec::message&& m,
                                                       util::time_point now) {
  const std::string* task_id = nullptr;
  std::uint32_t attempt = 0;
  std::visit(
      [&](auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, codec::started> || std::is_same_v<T, codec::info> ||
                      std::is_same_v<T, codec::get_data> || std::is_same_v<T, codec::learn_info> ||
                      std::is_same_v<T, codec::task_result> ||
                      std::is_same_v<T, codec::task_failed> ||
                      std::is_same_v<T, codec::task_alive> || std::is_same_v<T, codec::data_lost> ||
                      std::is_same_v<T, codec::data_batch>) {
          task_id = &task_id_of(v);
          attempt = attempt_of(v);
        }
      },
      m);
  if (task_id == nullptr)
    return refuse(
        codec::error_code::unknown_type,
        fmt::format("{} is sent by the broker, never to it",
                    codec::type_name(static_cast<std::uint8_t>(codec::type_of(m))).value_or("?")));
  std::optional<refusal> why;
  task* held = held_task(from, *task_id, attempt, why);
  if (held == nullptr) return why;
  task& t = *held;
  const util::log_scope log(
      {.task = t.id, .attempt = t.attempt, .worker = t.worker, .coordinator = t.owner});
  const auto wrong = [&](std::string_view what) {
    return wrong_state(t, what, !std::holds_alternative<codec::started>(m));
  };
  const auto progress = [&] { set_deadline(t, now + t.step_timeout); };

  if (std::holds_alternative<codec::started>(m)) {
    // A repeat, sent again after a resumption (§12.5.3): nothing to do, nothing to say.
    if (t.st == state::running || t.st == state::closing) return std::nullopt;
    if (t.st != state::starting) return wrong("STARTED belongs to a starting attempt");
    t.st = state::running;
    progress();
    emit(t, codec::event_body::started{});
  } else if (const auto* b = std::get_if<codec::data_batch>(&m)) {
    return on_data_batch(t, *b, now);
  } else if (std::holds_alternative<codec::task_alive>(m)) {
    // The worker is busy, not gone: its start or step deadline moves a full timeout on. The
    // task timeout still caps it (set_deadline), and nothing is emitted (§12.3.19).
    if (t.st == state::starting) {
      set_deadline(t, now + t.start_timeout);
    } else if (t.st == state::running) {
      progress();
    } else {
      return wrong("TASK_ALIVE keeps a starting or running attempt alive, not a closing one");
    }
  } else if (const auto* dl = std::get_if<codec::data_lost>(&m)) {
    return on_data_lost(t, *dl, now);
  } else if (auto* i = std::get_if<codec::info>(&m)) {
    // Numbered, it is an item of the DATA sequence, judged as one (§12.11.10).
    const bool open = t.st == state::running || (t.st == state::closing && i->index);
    if (!open || t.kind != rlbus::role::collector)
      return wrong("INFO belongs to a running collector task");
    if (dropped_by_index(t, i->index)) return std::nullopt;
    if (i->index) {
      if (auto no = out_of_credit(t)) return no;
      t.data.accept();
    }
    if (t.st == state::running) progress();
    emit_verbatim<codec::event_body::info>(t, i->body);
    relayed(t, i->index, 1, i->body.size());
  } else if (const auto* g = std::get_if<codec::get_data>(&m)) {
    if (t.st != state::running || t.kind != rlbus::role::learner)
      return wrong("GET_DATA belongs to a running learner task");
    progress();
    t.request_id = g->request_id;
    emit(t, codec::event_body::data_request{g->request_id, g->buffer_id, g->batch_size,
                                            g->cur_learner_iter});
  } else if (auto* l = std::get_if<codec::learn_info>(&m)) {
    // Numbered, it is an item of the learner attempt's sequence (§12.11.10).
    const bool open = t.st == state::running || (t.st == state::closing && l->index);
    if (!open || t.kind != rlbus::role::learner)
      return wrong("LEARN_INFO belongs to a running learner task");
    if (dropped_by_index(t, l->index)) return std::nullopt;
    if (t.st == state::running) progress();
    emit(t, codec::event_body::learn_info{l->buffer_id, l->info});
    relayed(t, l->index, 1, l->info.size());
  } else if (auto* r = std::get_if<codec::task_result>(&m)) {
    if (t.st != state::closing) return wrong("RESULT answers TASK_CLOSE");
    duration_.observe(now - t.started_at);
    emit_verbatim<codec::event_body::finished>(t, r->result);
    ++counts_.finished;
    workers_.succeeded(from);
    workers_.release(from);
    erase_task(t.id);
    try_assign(now);
  } else if (const auto* f = std::get_if<codec::task_failed>(&m)) {
    workers_.release(from);
    const auto reason = clip("worker reported: " + f->reason);
    const auto kind = t.kind;
    end_attempt(t, reason, now, f->result ? &*f->result : nullptr);
    ended_badly(from, kind, reason, now);
    try_assign(now);
  }
  return std::nullopt;
}

// ---- assignment, deadlines, attempts ---------------------------------------------------

void task_manager::try_assign(util::time_point now) {
  if (closed_) return;  // draining: nothing new starts
  auto& queue = tasks_.waiting();
  for (auto q = queue.begin(); q != queue.end() && workers_.any_free();) {
    auto& t = tasks_.at(q->second);
    // A re-queued task avoids the worker its last attempt ended on, unless no other fits.
    const auto worker_id = workers_.assign(t.kind, t.requirements, t.last_worker, t.id);
    if (!worker_id) {
      ++q;  // nobody fits this one now; later tasks may still fit someone
      continue;
    }
    q = tasks_.dequeue(q);
    start_attempt(t, *worker_id, now);
  }
}

void task_manager::start_attempt(task& t, const std::string& worker_id, util::time_point now) {
  ++t.attempt;
  assignment_.observe(now - t.queued_at);
  t.started_at = now;
  if (journal_ != nullptr) journal_->started(t.id, t.attempt, worker_id);
  t.worker = worker_id;
  t.st = state::starting;
  t.request_id.reset();
  t.data.begin();
  t.attempt_end = now + t.task_timeout;
  t.leave_end = false;
  task_schedule::clear(t.timer);  // the queue timeout, if any, no longer applies
  set_deadline(t, now + t.start_timeout);
  const util::log_scope log(
      {.task = t.id, .attempt = t.attempt, .worker = t.worker, .coordinator = t.owner});
  spdlog::debug("task {} attempt {} -> {}", t.id, t.attempt, worker_id);
  codec::task_start start{t.id, t.attempt, t.kind, t.task_info};
  const stored_policy* p = t.policy_id ? policies_.latest(*t.policy_id) : nullptr;
  if (p != nullptr) {
    start.policy_id = t.policy_id;
    start.policy_version = p->version;
    start.policy_ref = p->ref;
    start.policy_params = p->params;
  }
  // The coordinator learns which version each attempt runs, so it can measure policy lag.
  codec::event_body::assigned assigned;
  if (p != nullptr) assigned.policy_version = p->version;
  emit(t, assigned, worker_id);
  // A collector of a windowed stream learns its credit before its task, so its first DATA
  // already knows the limit (§12.9.9).
  auto& s = streams_.of(t.owner);
  if (t.kind == rlbus::role::collector && s.windowed) {
    t.data.begin_credit();
    s.credited.insert(t.id);
    grant(s, &t);
  }
  sink_.send_to(worker_id, start);
}

void task_manager::set_deadline(task& t, util::time_point due) {
  t.deadline = std::min(due, t.attempt_end);
  schedule_.no_later_than(t.timer, t.id, t.deadline);
}

void task_manager::arm_queue_timeout(task& t, util::time_point now) {
  if (t.queue_timeout.count() == 0) return;
  t.deadline = now + t.queue_timeout;
  schedule_.exactly(t.timer, t.id, t.deadline);
}

void task_manager::ended_badly(const std::string& worker_id, rlbus::role role,
                               const std::string& reason, util::time_point now) {
  const auto q = workers_.failed(worker_id, now);  // out of its pool if it begins
  if (!q) return;
  const util::log_scope log({.worker = worker_id});
  spdlog::warn("worker {} quarantined for {} ms: {} attempts in a row ended badly, the last: {}",
               worker_id, q->length.count(), q->failures, reason);
  sink_.publish(codec::topic::worker_quarantined,
                codec::worker_quarantine{worker_id, role, q->failures,
                                         static_cast<std::uint64_t>(q->length.count()), reason});
}

// The attempt is over (its worker, if any, already freed or gone): re-queue or fail. The
// event still names the worker the attempt ran on.
void task_manager::end_attempt(task& t, const std::string& reason, util::time_point now,
                               const codec::blob* result) {
  const util::log_scope log(
      {.task = t.id, .attempt = t.attempt, .worker = t.worker, .coordinator = t.owner});
  uncredit(t);
  t.request_id.reset();
  task_schedule::clear(t.timer);  // no deadline while queued
  if (t.attempt < t.max_attempts) {
    spdlog::warn("task {} attempt {} ended ({}): re-queued", t.id, t.attempt, reason);
    if (journal_ != nullptr) journal_->requeued(t.id, t.attempt);
    emit(t, codec::event_body::requeued{reason, t.attempt, view_of(result)}, reason);
    t.last_worker = std::move(t.worker);
    t.worker.clear();
    t.st = state::queued;
    tasks_.requeue(t);  // its original place: ahead of later submissions
    t.queued_at = now;
    ++counts_.requeued;
    if (closed_) {
      cancel(t, *closed_);  // draining: it will not be assigned again
    } else {
      arm_queue_timeout(t, now);  // the clock starts again with each wait
    }
  } else {
    spdlog::warn("task {} failed after {} attempts: {}", t.id, t.attempt, reason);
    ++counts_.failed;
    emit(t, codec::event_body::failed{reason, t.attempt, view_of(result)}, reason);
    erase_task(t.id);
  }
}

void task_manager::on_timers(util::time_point now) {
  bool freed = false;
  const auto slot_of = [this](const std::string& id) -> task_schedule::slot* {
    task* t = tasks_.find(id);
    return t == nullptr ? nullptr : &t->timer;
  };
  while (const auto due = schedule_.pop_due(now, slot_of)) {
    task& t = tasks_.at(*due);
    if (t.st == state::queued) {
      // No worker took it within its queue timeout: it fails like a task out of attempts,
      // naming the attempt that ended last (0: none) and no worker (§12.7.6).
      const util::log_scope log({.task = t.id, .coordinator = t.owner});
      const auto reason = fmt::format("no worker took the task within queue_timeout_ms={}",
                                      t.queue_timeout.count());
      spdlog::warn("task {} failed: {}", t.id, reason);
      ++counts_.failed;
      emit(t, codec::event_body::failed{reason, t.attempt}, reason);
      erase_task(t.id);
      continue;
    }
    if (t.deadline > now) {  // progress since: look again at the real deadline
      schedule_.exactly(t.timer, t.id, t.deadline);
      continue;
    }
    if (t.st == state::running && t.data.exhausted() && t.deadline < t.attempt_end) {
      // Its collector waits for credit: held back by the coordinator's window, not silent.
      t.deadline = std::min(now + t.step_timeout, t.attempt_end);
      schedule_.exactly(t.timer, t.id, t.deadline);
      continue;
    }
    const char* step = t.st == state::starting  ? "start"
                       : t.st == state::closing ? "close"
                                                : "step";
    const bool at_end = t.deadline == t.attempt_end && t.deadline <= now;
    const bool left = at_end && t.leave_end;  // its worker's LEAVING deadline (§12.6.10)
    const auto reason = left     ? fmt::format("worker {} leaving", t.worker)
                        : at_end ? std::string("task timeout")
                                 : fmt::format("{} timeout", step);
    const std::string worker = t.worker;
    const auto kind = t.kind;
    if (!worker.empty()) {
      sink_.send_to(worker, codec::task_abort{t.id, t.attempt, reason});
      workers_.release(worker);
    }
    end_attempt(t, reason, now);
    if (!worker.empty() && !left) ended_badly(worker, kind, reason, now);
    freed = true;
  }
  // Orphans no new session adopted within the grace: their tasks end (§12.5.8).
  while (!orphans_.empty()) {
    const auto due =
        std::min_element(orphans_.begin(), orphans_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    if (due->second > now) break;
    const std::string id = due->first;
    const util::log_scope log({.coordinator = id});
    spdlog::warn("coordinator {}: no new session adopted its tasks within {} ms", id,
                 cfg_.coordinator_grace_ms);
    drop_coordinator(id, now);
  }
  // Quarantines that have run out: their workers, if free, go back to their pools.
  if (workers_.end_quarantines(now)) freed = true;
  if (freed) try_assign(now);
}

void task_manager::close_queue(const std::string& reason) {
  if (closed_) return;
  closed_ = reason;
  std::vector<std::string> queued;
  for (const auto& [order, id] : tasks_.waiting()) queued.push_back(id);
  for (const auto& id : queued) cancel(tasks_.at(id), reason);
}

std::size_t task_manager::abort_all(const std::string& reason) {
  // In submission order, so each coordinator's stream reads like its submissions.
  std::map<std::uint64_t, std::string> live;
  for (const auto& [id, t] : tasks_) live.emplace(t.order, id);
  for (const auto& [order, id] : live) cancel(tasks_.at(id), reason);
  return live.size();
}

// Ends a task as cancelled by the broker (not by its owner): its holder, if any, is told
// TASK_ABORT and freed; the owner gets `cancelled` naming `reason`.
void task_manager::cancel(task& t, const std::string& reason) {
  if (!t.worker.empty()) {
    sink_.send_to(t.worker, codec::task_abort{t.id, t.attempt, reason});
    workers_.release(t.worker);
  }
  emit(t, codec::event_body::cancelled{reason, t.attempt}, reason);
  ++counts_.cancelled;
  erase_task(t.id);
}

std::optional<util::time_point> task_manager::next_deadline() const {
  auto next = workers_.next_release();
  if (const auto due = schedule_.next(); due && (!next || *due < *next)) next = due;
  for (const auto& [id, due] : orphans_)
    if (!next || due < *next) next = due;
  return next;
}

void task_manager::erase_task(const std::string& id) {
  task* t = tasks_.find(id);
  if (t == nullptr) return;
  if (journal_ != nullptr) journal_->ended(id);  // first: `id` may be the task's own
  uncredit(*t);
  tasks_.erase(id);
}

}  // namespace rlbus::broker
