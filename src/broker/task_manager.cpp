// See task_manager.hpp for the model. Handlers check who may say what (owner, holder,
// attempt, state) before they change anything, so a refused message leaves no trace.
#include "broker/task_manager.hpp"

#include <algorithm>
#include <span>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "codec/codec.hpp"
#include "codec/event_bodies.hpp"
#include "codec/field_writer.hpp"
#include "codec/map_writer.hpp"
#include "util/log.hpp"

namespace rlbus::broker {

namespace {

// A DATA_ACK goes out after this many relayed indexed DATA, or this many bytes of them,
// whichever comes first: what a worker keeps for a resend stays well within its bound.
constexpr std::uint64_t data_ack_every = 32;
constexpr std::size_t data_ack_bytes = std::size_t{1} << 20;
// A journal record allows this many more seqs of a stream at a time (§14): at most that many
// seqs that were never used are reported lost after a crash.
constexpr std::uint64_t seq_reserve = 64;

bool ends_task(std::string_view event) {
  return event == "finished" || event == "failed" || event == "cancelled";
}

std::size_t slot(rlbus::role kind) {
  return kind == rlbus::role::learner ? 1 : 0;
}

bool fits(const rlbus::resources& have, const rlbus::resources& need) {
  return std::all_of(need.begin(), need.end(), [&](const auto& n) {
    const auto it = have.find(n.first);
    return it != have.end() && it->second >= n.second;
  });
}

refusal refuse(codec::error_code code, std::string reason) {
  const bool late =
      code == codec::error_code::unknown_task || code == codec::error_code::stale_attempt;
  return {code, std::move(reason), late};
}

// Reasons built from a peer's own text stay within the reason limit of the messages and
// events they end up in.
std::string clip(std::string s) {
  if (s.size() > codec::max_reason_length) s.resize(codec::max_reason_length);
  return s;
}

// The worker's own account of a failure (TASK_FAILED `result`), byte for byte, when it gave one.
std::optional<std::string_view> view_of(const codec::blob* result) {
  if (result == nullptr) return std::nullopt;
  return std::string_view(*result);
}

}  // namespace

task_manager::task_manager(const config& cfg, task_sink& sink)
    : cfg_(cfg),
      sink_(sink),
      policies_(cfg.policy_max_ids, cfg.policy_max_bytes),
      quarantine_(cfg.quarantine_after, std::chrono::milliseconds(cfg.quarantine_ms),
                  cfg.max_peers) {}

void task_manager::peer_joined(const std::string& id, rlbus::role role, const rlbus::resources& res,
                               std::uint64_t serial, util::time_point now) {
  if (role == rlbus::role::coordinator) return;
  workers_[id] = worker_info{role, res, serial, ""};
  // A worker back under an id in quarantine (a restarted process) waits it out.
  if (!quarantine_.held(id)) free_[slot(role)].emplace(serial, id);
  try_assign(now);
}

void task_manager::peer_resources(const std::string& id, const rlbus::resources& res,
                                  util::time_point now) {
  const auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.resources = res;
  try_assign(now);  // a queued task may fit now
}

void task_manager::peer_resumed(const std::string& id) {
  const auto w = workers_.find(id);
  if (w == workers_.end() || w->second.task.empty()) return;
  auto& t = tasks_.at(w->second.task);
  // What went down with the old connection is sent again by the worker on its own; this
  // only tells it how much of that it can skip.
  if (t.st == state::running || t.st == state::closing) send_data_ack(t, false);
  // A TASK_CLOSE may have gone down with it too: said again, or the attempt would wait for
  // its close timeout (§12.11.7).
  if (t.st == state::closing) sink_.send_to(id, codec::task_close{t.id, t.attempt});
}

void task_manager::peer_gone(const std::string& id, rlbus::role role, util::time_point now,
                             bool orderly) {
  if (role == rlbus::role::coordinator) {
    const auto owned = static_cast<std::size_t>(std::count_if(
        tasks_.begin(), tasks_.end(), [&](const auto& kv) { return kv.second.owner == id; }));
    const auto s = streams_.find(id);
    const bool unacked =
        s != streams_.end() && s->second.windowed && s->second.seq > s->second.acked;
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
  const auto it = workers_.find(id);
  if (it == workers_.end()) return;
  const std::string task_id = it->second.task;
  const auto worker_role = it->second.role;
  const bool leaving = it->second.leaving;
  free_[slot(worker_role)].erase(it->second.serial);
  workers_.erase(it);
  if (!task_id.empty()) {
    const auto reason = fmt::format("worker {} {}", id, leaving ? "left" : "lost");
    end_attempt(tasks_.at(task_id), reason, now);
    // a crash-looping worker is caught too; one that said it was leaving is not failing
    if (!leaving) ended_badly(id, worker_role, reason, now);
  }
  try_assign(now);
}

std::optional<std::uint64_t> task_manager::adopt(const std::string& id) {
  const auto o = orphans_.find(id);
  if (o == orphans_.end()) return std::nullopt;
  orphans_.erase(o);
  ++counts_.adoptions;
  const auto& s = streams_[id];
  spdlog::info("coordinator {}: the new session adopts its tasks; the stream goes on after {}", id,
               s.acked);
  return s.acked;
}

void task_manager::drop_coordinator(const std::string& id, util::time_point now) {
  orphans_.erase(id);
  if (const auto it = streams_.find(id); it != streams_.end()) {
    ring_total_ -= it->second.ring_bytes;
    streams_.erase(it);  // first: the tasks below go without handing out credit
  }
  if (journal_ != nullptr) journal_->stream_dropped(id);
  std::vector<std::string> owned;
  for (const auto& [task_id, t] : tasks_)
    if (t.owner == id) owned.push_back(task_id);
  for (const auto& task_id : owned) {
    auto& t = tasks_.at(task_id);
    if (!t.worker.empty()) {
      sink_.send_to(t.worker, codec::task_abort{t.id, t.attempt, "its coordinator is gone"});
      free_worker(t.worker);
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
  const auto w = workers_.find(from);
  if (w == workers_.end()) return std::nullopt;
  if (!w->second.leaving)
    spdlog::info("worker {} is leaving (its task may take {} ms more)", from, l.deadline_ms);
  w->second.leaving = true;
  free_[slot(w->second.role)].erase(w->second.serial);
  if (w->second.task.empty()) return std::nullopt;
  auto& t = tasks_.at(w->second.task);
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
  if (tasks_.count(s.task_id) != 0)
    return answer(false, codec::error_code::duplicate_task,
                  fmt::format("task '{}' is already live", s.task_id), 0);
  if (queue_.size() >= cfg_.max_queue)
    return answer(false, codec::error_code::queue_full,
                  fmt::format("the queue holds its maximum of {} tasks", cfg_.max_queue), 0);
  if (auto& owned = owned_[from]; owned >= cfg_.max_tasks_per_coordinator) {
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
  t.order = ++next_order_;
  t.submitted_at = now;
  t.queued_at = now;
  queue_.emplace(t.order, t.id);
  if (journal_ != nullptr) journal_->submitted(journal_task_of(t));  // before SUBMITTED says so
  const auto id = t.id;
  ++owned_[from];
  arm_queue_timeout(tasks_.emplace(id, std::move(t)).first->second, now);
  ++counts_.queued;
  answer(true, codec::error_code::goodbye, "", queue_.size() - 1);
  try_assign(now);
  return std::nullopt;
}

task_manager::task* task_manager::owned_task(const std::string& coordinator,
                                             const std::string& task_id,
                                             std::optional<refusal>& why) {
  const auto it = tasks_.find(task_id);
  if (it == tasks_.end() || it->second.owner != coordinator) {
    why =
        refuse(codec::error_code::unknown_task, fmt::format("no live task '{}' of yours", task_id));
    return nullptr;
  }
  return &it->second;
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
    free_worker(t->worker);
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

// An event of `t`'s attempt at the head of its owner's stream, written once as the bytes
// it travels as (its body by `write_body`, `reserve` bytes expected), then sent as the stream
// allows and published.
template <class Body>
void task_manager::emit_with(task& t, std::string_view event, std::size_t reserve,
                             Body&& write_body, std::string_view detail, std::uint32_t items) {
  auto& s = streams_[t.owner];
  if (!t.event_fields.of(t.attempt, t.worker))
    t.event_fields = codec::event_fixed(t.id, t.attempt, t.worker);
  auto wire = codec::event_head(t.event_fields, ++s.seq, event, reserve);
  const auto head = wire.size();
  write_body(wire);
  const auto body_bytes = wire.size() - head;
  const auto ring_before = s.ring_bytes;
  s.push({s.seq, util::shared_frame(std::move(wire)), body_bytes, items, ends_task(event)});
  const auto& made = s.ring.back();
  if (journal_ != nullptr) {  // written before the event can leave (§14)
    if (s.seq > s.reserved) {
      s.reserved = s.seq + seq_reserve;
      journal_->reserved(t.owner, s.reserved);
    }
    if (made.ends) journal_->end_event(t.owner, made.wire.view());
  }
  if (!s.windowed) {  // v1: sent as made; an undeliverable one leaves a gap (§12.8.2)
    sink_.send_encoded(t.owner, codec::msg_type::task_event, made.wire);
    s.next = s.seq + 1;
    s.sent_max = s.seq;
  }
  if (event == "data") s.max_data_bytes = std::max(s.max_data_bytes, body_bytes);
  // The ring is bounded in events and in bytes (payloads can be large).
  s.trim(cfg_.stream_ring, cfg_.stream_ring_bytes);
  ring_total_ = ring_total_ - ring_before + s.ring_bytes;
  // Past the pool, a stream holding more than its share gives up its oldest events (a
  // replay reports them lost): coordinators that never acknowledge cannot hold it all.
  while (over_ring_share(s) && s.ring.size() > 1) {
    ring_total_ -= s.ring.front().body_bytes;
    s.pop_front();
    ++counts_.ring_budget_drops;
  }
  pump(t.owner, s);
  auto& topic = topic_;  // reused: no allocation per event
  topic.clear();
  topic.append("task.").append(t.owner).append(".").append(event);
  // Nobody subscribed: the event still takes its seq (SPEC §2.5) but its body is not built.
  if (!sink_.wanted(topic)) return sink_.publish(topic, std::monostate{});
  sink_.publish(topic,
                codec::task_status{t.id, t.kind, t.attempt, t.worker, clip(std::string(detail))});
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

task_manager::task* task_manager::held_task(const std::string& from, std::string_view task_id,
                                            std::uint32_t attempt, std::optional<refusal>& why) {
  const auto it = tasks_.find(task_id);
  if (it == tasks_.end()) {
    why = refuse(codec::error_code::unknown_task, fmt::format("you hold no task '{}'", task_id));
    return nullptr;
  }
  task& t = it->second;
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

// An item of the attempt's indexed sequence, DATA or INFO (§12.11.4, §12.11.10): a
// duplicate or one past the next is dropped (true), and what is left must have credit.
bool task_manager::dropped_by_index(task& t, const std::optional<std::uint64_t>& index) {
  if (!index) return false;
  // Already relayed: a resend after a reconnect. Dropped without a word, and it uses no
  // credit, so resending can never be refused 414 (§12.11.5).
  if (*index <= t.data_relayed) {
    ++counts_.data_duplicates;
    return true;
  }
  return past_next(t, *index);
}

std::optional<refusal> task_manager::out_of_credit(const task& t) {
  if (!t.credited || t.data_accepted < t.data_limit) return std::nullopt;
  return refuse(codec::error_code::no_credit,
                fmt::format("task '{}': attempt {} was granted {} DATA and sent them all; wait "
                            "for DATA_CREDIT",
                            t.id, t.attempt, t.data_limit));
}

// Relayed items (`last`: the index of the last, when they are indexed): counted against
// the credit, confirmed now and then (so the worker can let go of what it keeps for a
// resend), and, when credited, maybe the attempt's top-up.
void task_manager::relayed(task& t, std::optional<std::uint64_t> last, std::uint64_t items,
                           std::size_t bytes) {
  if (last) {
    t.data_relayed = *last;
    t.out_of_order = 0;
    t.ack_pending += items;
    t.ack_pending_bytes += bytes;
    if (t.ack_pending >= data_ack_every || t.ack_pending_bytes >= data_ack_bytes)
      send_data_ack(t, false);
  }
  // More items leave the others' room as it was (the backlog grew by what this attempt's
  // unused credit shrank), so only this attempt can have come due for a top-up.
  if (t.credited) {
    auto& s = streams_[t.owner];
    if ((t.data_limit - t.data_accepted) * 2 <= chunk_of(s)) grant(s, nullptr);
  }
}

// DATA, read in place: its fields go into the event as they came, copied once, into the
// bytes the event travels as.
std::optional<refusal> task_manager::on_data(const std::string& from, rlbus::role role,
                                             const codec::data_view& d, util::time_point now) {
  if (role == rlbus::role::coordinator)
    return refuse(codec::error_code::unknown_type, "a coordinator does not run tasks");
  std::optional<refusal> why;
  task* held = held_task(from, d.task_id, d.attempt, why);
  if (held == nullptr) return why;
  task& t = *held;
  // An indexed DATA that crosses TASK_CLOSE was emitted before the worker saw it, maybe
  // sent again after a reconnect: relaying it keeps the attempt's data whole (§12.11.4).
  const bool open = t.st == state::running || (t.st == state::closing && d.index);
  if (!open || t.kind != rlbus::role::collector)
    return wrong_state(t, "DATA belongs to a running collector task");
  if (dropped_by_index(t, d.index)) return std::nullopt;
  if (auto no = out_of_credit(t)) return no;
  ++t.data_accepted;
  if (t.st == state::running) set_deadline(t, now + t.step_timeout);  // closing: it stands
  const auto size = d.meta.size() + (d.payload ? d.payload->size() : 0);
  codec::event_body::data body{d.data_id, d.buffer_id, d.meta, std::nullopt, d.policy_version};
  if (d.payload) body.payload = *d.payload;
  emit(t, body, d.data_id);
  relayed(t, d.index, 1, size);
  return std::nullopt;
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
      ++t.data_accepted;
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
    emit(t, codec::event_body::learn_info{l->buffer_id, l->body});
    relayed(t, l->index, 1, l->body.size());
  } else if (auto* r = std::get_if<codec::task_result>(&m)) {
    if (t.st != state::closing) return wrong("RESULT answers TASK_CLOSE");
    duration_.observe(now - t.started_at);
    emit_verbatim<codec::event_body::finished>(t, r->result);
    ++counts_.finished;
    quarantine_.succeeded(from);
    free_worker(from);
    erase_task(t.id);
    try_assign(now);
  } else if (const auto* f = std::get_if<codec::task_failed>(&m)) {
    free_worker(from);
    const auto reason = clip("worker reported: " + f->reason);
    const auto kind = t.kind;
    end_attempt(t, reason, now, f->result ? &*f->result : nullptr);
    ended_badly(from, kind, reason, now);
    try_assign(now);
  }
  return std::nullopt;
}

// A collector dropped DATA first..last before the broker confirmed them (§12.11.6). Those
// the broker relayed meanwhile are no loss; the rest are reported to the coordinator, in
// their place in the stream, and count as used credit, as they did on the worker.
std::optional<refusal> task_manager::on_data_lost(task& t, const codec::data_lost& l,
                                                  util::time_point now) {
  if (t.st != state::running && t.st != state::closing) {
    auto r = refuse(codec::error_code::wrong_state,
                    fmt::format("task '{}': DATA_LOST belongs to a running task", t.id));
    r.late = t.st == state::closing;
    return r;
  }
  if (l.last < l.first)
    return refuse(
        codec::error_code::bad_index,
        fmt::format("task '{}': DATA_LOST from {} to {} is backwards", t.id, l.first, l.last));
  if (past_next(t, l.first)) return std::nullopt;     // as for a DATA
  if (l.last <= t.data_relayed) return std::nullopt;  // all of them got here after all
  const auto first = t.data_relayed + 1;
  const auto count = l.last - t.data_relayed;
  if (t.credited && count > t.data_limit - t.data_accepted)
    return refuse(codec::error_code::bad_index,
                  fmt::format("task '{}': DATA_LOST up to {} goes past the attempt's credit of {}",
                              t.id, l.last, t.data_limit));
  t.data_relayed = l.last;
  t.out_of_order = 0;
  t.data_accepted += count;
  counts_.data_lost += count;
  if (t.st == state::running) set_deadline(t, now + t.step_timeout);
  spdlog::warn("task {} attempt {}: its collector lost DATA {}..{}", t.id, t.attempt, first,
               l.last);
  emit(t, codec::event_body::data_lost{first, l.last}, fmt::format("{}..{}", first, l.last));
  if (t.credited) grant(streams_[t.owner], nullptr);
  return std::nullopt;
}

// Consecutive indexed DATA in one message (§12.12.3), judged as its items would be one by
// one: duplicates at its front are dropped, the new items use credit and leave as one
// `data_batch`, spliced from the batch's bytes.
std::optional<refusal> task_manager::on_data_batch(task& t, const codec::data_batch& b,
                                                   util::time_point now) {
  if ((t.st != state::running && t.st != state::closing) || t.kind != rlbus::role::collector) {
    auto r = refuse(codec::error_code::wrong_state,
                    fmt::format("task '{}': DATA_BATCH belongs to a running collector task", t.id));
    r.late = t.st == state::closing;
    return r;
  }
  const auto items = codec::split_items(b.items);
  const std::uint64_t n = items.size();
  const auto last = b.first_index + n - 1;  // first_index <= 2^63: no overflow
  if (last <= t.data_relayed) {
    counts_.data_duplicates += n;
    return std::nullopt;
  }
  if (past_next(t, b.first_index)) {
    counts_.data_out_of_order += n - 1;  // past_next counted one
    return std::nullopt;
  }
  const auto skip = t.data_relayed + 1 - b.first_index;  // duplicates at the front
  const auto fresh = n - skip;
  if (t.credited && fresh > t.data_limit - t.data_accepted)
    return refuse(codec::error_code::no_credit,
                  fmt::format("task '{}': attempt {} was granted {} DATA and has sent {}; a batch "
                              "of {} more goes past it: wait for DATA_CREDIT",
                              t.id, t.attempt, t.data_limit, t.data_accepted, fresh));
  counts_.data_duplicates += skip;
  t.data_accepted += fresh;
  if (t.st == state::running) set_deadline(t, now + t.step_timeout);
  const auto first = t.data_relayed + 1;
  const std::span<const std::string_view> fresh_items(items.data() + skip, fresh);
  std::size_t bytes = 0;
  auto& s = streams_[t.owner];
  for (const auto item : fresh_items) {
    bytes += item.size();
    // A unit of credit costs what the stream's largest item does (§12.12.3).
    s.max_data_bytes = std::max(s.max_data_bytes, item.size());
  }
  emit(t, codec::event_body::data_batch{first, fresh_items}, fmt::format("{}..{}", first, last),
       static_cast<std::uint32_t>(fresh));
  relayed(t, last, fresh, bytes);
  return std::nullopt;
}

// Past the next index: those before it went missing on the way. Dropped, and the worker is
// asked to send again from the first missing one; once per gap and then every 64th, so a
// worker that keeps sending cannot make the broker answer each message.
bool task_manager::past_next(task& t, std::uint64_t index) {
  if (index - 1 <= t.data_relayed) return false;
  ++counts_.data_out_of_order;
  if (t.out_of_order++ % 64 == 0) send_data_ack(t, true);
  return true;
}

void task_manager::send_data_ack(task& t, bool resend) {
  t.ack_pending = 0;
  t.ack_pending_bytes = 0;
  sink_.send_to(t.worker, codec::data_ack{t.id, t.attempt, t.data_relayed, resend});
}

// ---- assignment, deadlines, attempts ---------------------------------------------------

void task_manager::try_assign(util::time_point now) {
  if (closed_) return;  // draining: nothing new starts
  for (auto q = queue_.begin(); q != queue_.end();) {
    if (free_[0].empty() && free_[1].empty()) return;
    auto& t = tasks_.at(q->second);
    auto& pool = free_[slot(t.kind)];
    // A re-queued task avoids the worker its last attempt ended on, unless no other fits.
    auto pick = pool.end();
    for (auto w = pool.begin(); w != pool.end(); ++w) {
      if (!fits(workers_.at(w->second).resources, t.requirements)) continue;
      if (pick == pool.end()) pick = w;
      if (w->second != t.last_worker) {
        pick = w;
        break;
      }
    }
    if (pick == pool.end()) {
      ++q;  // nobody fits this one now; later tasks may still fit someone
      continue;
    }
    const std::string worker_id = pick->second;
    pool.erase(pick);
    q = queue_.erase(q);
    start_attempt(t, workers_.at(worker_id), worker_id, now);
  }
}

void task_manager::start_attempt(task& t, worker_info& w, const std::string& worker_id,
                                 util::time_point now) {
  ++t.attempt;
  assignment_.observe(now - t.queued_at);
  t.started_at = now;
  if (journal_ != nullptr) journal_->started(t.id, t.attempt, worker_id);
  t.worker = worker_id;
  t.st = state::starting;
  t.request_id.reset();
  t.data_relayed = 0;
  t.ack_pending = 0;
  t.ack_pending_bytes = 0;
  t.out_of_order = 0;
  w.task = t.id;
  t.attempt_end = now + t.task_timeout;
  t.leave_end = false;
  ++t.generation;  // the queue timeout, if any, no longer applies
  t.scheduled.reset();
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
  auto& s = streams_[t.owner];
  if (t.kind == rlbus::role::collector && s.windowed) {
    t.credited = true;
    t.data_accepted = 0;
    t.data_limit = 0;
    s.credited.insert(t.id);
    grant(s, &t);
  }
  sink_.send_to(worker_id, start);
}

void task_manager::set_deadline(task& t, util::time_point due) {
  t.deadline = std::min(due, t.attempt_end);
  if (t.scheduled && *t.scheduled <= t.deadline) return;  // the check due then looks again
  ++t.generation;
  t.scheduled = t.deadline;
  checks_.push({t.deadline, t.id, t.generation});
}

void task_manager::arm_queue_timeout(task& t, util::time_point now) {
  if (t.queue_timeout.count() == 0) return;
  ++t.generation;
  t.deadline = now + t.queue_timeout;
  t.scheduled = t.deadline;
  checks_.push({t.deadline, t.id, t.generation});
}

void task_manager::free_worker(const std::string& worker_id) {
  const auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  it->second.task.clear();
  if (!quarantine_.held(worker_id) && !it->second.leaving && !it->second.drained)
    free_[slot(it->second.role)].emplace(it->second.serial, worker_id);
}

void task_manager::ended_badly(const std::string& worker_id, rlbus::role role,
                               const std::string& reason, util::time_point now) {
  const auto q = quarantine_.failed(worker_id, now);
  if (!q) return;
  const util::log_scope log({.worker = worker_id});
  spdlog::warn("worker {} quarantined for {} ms: {} attempts in a row ended badly, the last: {}",
               worker_id, q->length.count(), q->failures, reason);
  if (const auto w = workers_.find(worker_id); w != workers_.end())
    free_[slot(w->second.role)].erase(w->second.serial);  // if it was free: it is not now
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
  ++t.generation;  // no deadline while queued
  t.scheduled.reset();
  if (t.attempt < t.max_attempts) {
    spdlog::warn("task {} attempt {} ended ({}): re-queued", t.id, t.attempt, reason);
    if (journal_ != nullptr) journal_->requeued(t.id, t.attempt);
    emit(t, codec::event_body::requeued{{reason, t.attempt, view_of(result)}}, reason);
    t.last_worker = std::move(t.worker);
    t.worker.clear();
    t.st = state::queued;
    queue_.emplace(t.order, t.id);  // its original place: ahead of later submissions
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
    emit(t, codec::event_body::failed{{reason, t.attempt, view_of(result)}}, reason);
    erase_task(t.id);
  }
}

void task_manager::on_timers(util::time_point now) {
  bool freed = false;
  while (!checks_.empty() && checks_.top().due <= now) {
    const auto c = checks_.top();
    checks_.pop();
    const auto it = tasks_.find(c.task_id);
    if (it == tasks_.end() || it->second.generation != c.generation) continue;
    task& t = it->second;
    if (t.st == state::queued) {
      // No worker took it within its queue timeout: it fails like a task out of attempts,
      // naming the attempt that ended last (0: none) and no worker (§12.7.6).
      t.scheduled.reset();
      const util::log_scope log({.task = t.id, .coordinator = t.owner});
      const auto reason = fmt::format("no worker took the task within queue_timeout_ms={}",
                                      t.queue_timeout.count());
      spdlog::warn("task {} failed: {}", t.id, reason);
      ++counts_.failed;
      emit(t, codec::event_body::failed{{reason, t.attempt}}, reason);
      erase_task(t.id);
      continue;
    }
    if (t.deadline > now) {  // progress since: look again at the real deadline
      t.scheduled = t.deadline;
      checks_.push({t.deadline, t.id, t.generation});
      continue;
    }
    if (t.st == state::running && t.credited && t.data_accepted >= t.data_limit &&
        t.deadline < t.attempt_end) {
      // Its collector waits for credit: held back by the coordinator's window, not silent.
      t.deadline = std::min(now + t.step_timeout, t.attempt_end);
      t.scheduled = t.deadline;
      checks_.push({t.deadline, t.id, t.generation});
      continue;
    }
    t.scheduled.reset();
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
      free_worker(worker);
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
  for (const auto& id : quarantine_.released(now)) {
    spdlog::info("worker {}: quarantine over", id);
    const auto w = workers_.find(id);
    if (w != workers_.end() && w->second.task.empty() && !w->second.leaving && !w->second.drained) {
      free_[slot(w->second.role)].emplace(w->second.serial, id);
      freed = true;
    }
  }
  if (freed) try_assign(now);
}

void task_manager::close_queue(const std::string& reason) {
  if (closed_) return;
  closed_ = reason;
  std::vector<std::string> queued;
  for (const auto& [order, id] : queue_) queued.push_back(id);
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
    free_worker(t.worker);
  }
  emit(t, codec::event_body::cancelled{reason, t.attempt}, reason);
  ++counts_.cancelled;
  erase_task(t.id);
}

std::optional<util::time_point> task_manager::next_deadline() const {
  auto next = quarantine_.next_release();
  if (!checks_.empty() && (!next || checks_.top().due < *next)) next = checks_.top().due;
  for (const auto& [id, due] : orphans_)
    if (!next || due < *next) next = due;
  return next;
}

void task_manager::erase_task(const std::string& id) {
  const auto it = tasks_.find(id);
  if (it == tasks_.end()) return;
  if (journal_ != nullptr) journal_->ended(id);  // first: `id` may be the task's own
  uncredit(it->second);
  queue_.erase(it->second.order);
  if (const auto o = owned_.find(it->second.owner); o != owned_.end() && --o->second == 0)
    owned_.erase(o);
  tasks_.erase(it);
}

template <class Body>
void task_manager::emit(task& t, const Body& body, std::string_view detail, std::uint32_t items) {
  emit_with(
      t, Body::event, codec::size_hint(body),
      [&](codec::blob& wire) { codec::append_fields(wire, body); }, detail, items);
}

template <class Body>
void task_manager::emit_verbatim(task& t, std::string_view body) {
  emit_with(
      t, Body::event, body.size(), [&](codec::blob& wire) { wire.append(body); }, {}, 1);
}

// ---- replay and flow control (§12.9) ---------------------------------------------------

void task_manager::pump_streams() {
  for (auto& [owner, s] : streams_)
    if (s.windowed && s.next <= s.seq) pump(owner, s);
}

std::optional<refusal> task_manager::on_replay(const std::string& from, const codec::replay& r) {
  auto& s = streams_[from];
  if (auto no = s.replay(r.from_seq)) return no;
  ++counts_.replays;
  if (journal_ != nullptr) journal_->acked(from, s.acked);
  pump(from, s);
  grant(s, nullptr);
  return std::nullopt;
}

std::optional<refusal> task_manager::on_ack(const std::string& from, const codec::ack& a) {
  auto& s = streams_[from];
  const auto before = s.acked;
  if (auto no = s.ack(a.seq)) return no;
  if (journal_ != nullptr && s.acked != before) journal_->acked(from, s.acked);
  pump(from, s);
  grant(s, nullptr);
  return std::nullopt;
}

// Tops up the data credit of the stream's collector attempts out of the window's room: the
// unacknowledged events plus all credit not yet used stay within stream-window, and their
// bytes (a unit of credit costing the largest data event so far) within half the ring's byte
// bound. A chunk is the window shared by twice the credited attempts; an attempt is topped up
// once it has used half its chunk. `announce` gets DATA_CREDIT even when nothing changed.
void task_manager::grant(stream& s, const task* announce) {
  if (!s.windowed || s.credited.empty()) return;
  const auto window = static_cast<std::uint64_t>(cfg_.stream_window);
  const std::uint64_t chunk = chunk_of(s);
  // Unused credit counts against the window up to each attempt's current chunk. An attempt
  // granted a bigger chunk while it shared the window with fewer others cannot be asked to
  // give it back; counting all of it would let a few idle attempts starve the rest for good.
  std::uint64_t outstanding = 0;
  for (const auto& id : s.credited) {
    const auto& t = tasks_.at(id);
    outstanding += std::min(t.data_limit - t.data_accepted, chunk);
  }
  const std::uint64_t backlog = s.unacked_items();
  const std::size_t byte_budget = cfg_.stream_ring_bytes / 2;
  for (const auto& id : s.credited) {
    auto& t = tasks_.at(id);
    const auto left = t.data_limit - t.data_accepted;
    std::uint64_t add = 0;
    if (left * 2 <= chunk) {
      std::uint64_t room = backlog + outstanding < window ? window - backlog - outstanding : 0;
      const auto unacked = s.unacked_bytes();
      if (unacked >= byte_budget || over_ring_share(s)) {
        room = 0;
      } else if (s.max_data_bytes > 0) {
        const std::uint64_t fit = (byte_budget - unacked) / s.max_data_bytes;
        room = std::min(room, fit > outstanding ? fit - outstanding : 0);
      }
      add = std::min(chunk - left, room);
    }
    if (add > 0) {
      t.data_limit += add;
      outstanding += add;
    }
    if (add > 0 || &t == announce)
      sink_.send_to(t.worker, codec::data_credit{t.id, t.attempt, t.data_limit});
  }
}

std::uint64_t task_manager::chunk_of(const stream& s) const {
  const auto window = static_cast<std::uint64_t>(cfg_.stream_window);
  return std::max<std::uint64_t>(1, window / (2 * std::max<std::size_t>(1, s.credited.size())));
}

// The attempt ends: its unused credit goes back to the window, for the stream's others.
void task_manager::uncredit(task& t) {
  if (!t.credited) return;
  t.credited = false;
  t.data_accepted = 0;
  t.data_limit = 0;
  const auto it = streams_.find(t.owner);
  if (it == streams_.end()) return;
  it->second.credited.erase(t.id);
  grant(it->second, nullptr);
}

task_counts task_manager::counts() const {
  task_counts c = counts_;
  c.queued = queue_.size();
  c.running = tasks_.size() - queue_.size();
  c.quarantined = quarantine_.active();
  c.quarantines = quarantine_.total();
  c.orphaned = orphans_.size();
  c.ring_bytes = ring_total_;
  return c;
}

// ---- durability (§14) --------------------------------------------------------------------

journal_task task_manager::journal_task_of(const task& t) {
  journal_task j;
  j.owner = t.owner;
  j.order = t.order;
  j.submit.task_id = t.id;
  j.submit.kind = t.kind;
  j.submit.task_info = t.task_info;
  j.submit.requirements = t.requirements;
  j.submit.policy_id = t.policy_id;
  const auto ms = [](std::chrono::milliseconds d) { return static_cast<std::uint32_t>(d.count()); };
  j.start_timeout_ms = ms(t.start_timeout);
  j.step_timeout_ms = ms(t.step_timeout);
  j.close_timeout_ms = ms(t.close_timeout);
  j.task_timeout_ms = ms(t.task_timeout);
  j.queue_timeout_ms = ms(t.queue_timeout);
  j.max_attempts = t.max_attempts;
  j.attempt = t.attempt;
  j.running = t.st != state::queued;
  j.worker = t.worker.empty() ? t.last_worker : t.worker;
  return j;
}

void task_manager::write_snapshot(journal& j) const {
  for (const auto& [id, p] : policies_.all())
    j.policy(p.publisher, codec::policy{id, p.version, p.ref, p.params});
  for (const auto& [owner, s] : streams_) {
    j.reserved(owner, std::max(s.reserved, s.seq));
    if (s.windowed) j.acked(owner, s.acked);
    for (const auto& h : s.ring)
      if (h.seq > s.acked && h.ends) j.end_event(owner, h.wire.view());
  }
  std::map<std::uint64_t, const task*> in_order;
  for (const auto& [id, t] : tasks_) in_order.emplace(t.order, &t);
  for (const auto& [order, t] : in_order) {
    const auto jt = journal_task_of(*t);
    j.submitted(jt);
    if (jt.attempt > 0) j.started(jt.submit.task_id, jt.attempt, jt.worker);
    if (jt.attempt > 0 && !jt.running) j.requeued(jt.submit.task_id, jt.attempt);
  }
}

void task_manager::restore(const journal_state& js, util::time_point now) {
  for (const auto& p : js.policies) (void)policies_.publish(p.publisher, codec::policy(p.latest));
  // Streams first: the restart's own events below are numbered after what came before.
  for (const auto& [owner, st] : js.streams) {
    auto& s = streams_[owner];
    s.seq = st.head;
    s.reserved = st.head;
    s.sent_max = st.head;  // any of them may have reached the coordinator
    s.windowed = st.windowed;
    s.acked = std::min(st.acked, st.head);
    s.next = s.acked + 1;
    // The ring holds the kept ends at their seqs and, between them, placeholders for the
    // events nobody kept: a replay reports those lost. Before the first kept end, the ring's
    // front does the same (STREAM_GAP), without placeholders.
    std::uint64_t first = st.head + 1;
    for (const auto& e : st.ends)
      if (e.seq > s.acked) first = std::min(first, e.seq);
    first = std::max(first, st.head >= cfg_.stream_ring ? st.head - cfg_.stream_ring + 1 : 1);
    auto end = st.ends.begin();
    for (auto seq = first; seq <= st.head; ++seq) {
      while (end != st.ends.end() && end->seq < seq) ++end;
      if (end != st.ends.end() && end->seq == seq) {
        s.push({seq, util::shared_frame(codec::encode_body(codec::message{*end})), end->body.size(),
                1, true});
      } else {
        s.push({seq});  // a placeholder
      }
    }
    ring_total_ += s.ring_bytes;
    // What the ring holds at or below acked counts as acknowledged, as it does in a live run.
    const auto acked = s.acked;
    s.acked = 0;
    s.set_acked(acked);
  }
  for (const auto& jt : js.tasks) {
    task t;
    t.id = jt.submit.task_id;
    t.owner = jt.owner;
    t.kind = jt.submit.kind;
    t.task_info = jt.submit.task_info;
    t.requirements = jt.submit.requirements;
    t.policy_id = jt.submit.policy_id;
    t.start_timeout = std::chrono::milliseconds(jt.start_timeout_ms);
    t.step_timeout = std::chrono::milliseconds(jt.step_timeout_ms);
    t.close_timeout = std::chrono::milliseconds(jt.close_timeout_ms);
    t.task_timeout = std::chrono::milliseconds(jt.task_timeout_ms);
    t.queue_timeout = std::chrono::milliseconds(jt.queue_timeout_ms);
    t.max_attempts = jt.max_attempts;
    t.attempt = jt.attempt;
    t.last_worker = jt.worker;
    t.order = jt.order;
    next_order_ = std::max(next_order_, t.order);
    ++owned_[t.owner];
    auto& held = tasks_.emplace(t.id, std::move(t)).first->second;
    if (jt.running) {
      // The attempt ended with the broker that ran it. The restart is not the task's fault:
      // it does not use up an attempt (within the protocol's 1000).
      const std::string reason = "broker restarted";
      if (held.attempt >= 1000) {
        ++counts_.failed;
        emit(held, codec::event_body::failed{{reason, held.attempt}}, reason);
        erase_task(held.id);
        continue;
      }
      held.max_attempts = std::max(held.max_attempts, held.attempt + 1);
      held.worker = jt.worker;  // the event names the worker it ran on
      emit(held, codec::event_body::requeued{{reason, held.attempt}}, reason);
      held.worker.clear();
      ++counts_.requeued;
    }
    queue_.emplace(held.order, held.id);
    held.submitted_at = now;  // as far as this broker knows
    held.queued_at = now;
    arm_queue_timeout(held, now);
  }
  // Nobody is connected yet: every coordinator's work waits for a new session of its id.
  std::set<std::string> owners;
  for (const auto& [owner, s] : streams_) owners.insert(owner);
  for (const auto& [id, t] : tasks_) owners.insert(t.owner);
  for (const auto& owner : owners) {
    if (cfg_.coordinator_grace_ms == 0) {
      drop_coordinator(owner, now);
    } else {
      orphans_[owner] = now + std::chrono::milliseconds(cfg_.coordinator_grace_ms);
    }
  }
  spdlog::info(
      "restored {} tasks ({} queued, {} re-queued after the restart), {} policies, {} "
      "coordinator streams",
      tasks_.size(), tasks_.size() - counts_.requeued, counts_.requeued, js.policies.size(),
      streams_.size());
}

// ---- what an operator sees and steers (SPEC §16) -------------------------------------

namespace {
std::string_view state_name(int st) {
  static constexpr std::string_view names[] = {"queued", "starting", "running", "closing"};
  return names[st];
}
}  // namespace

std::pair<std::vector<task_manager::task_view>, std::size_t> task_manager::list_tasks(
    std::string_view state, std::optional<rlbus::role> kind, std::string_view coordinator,
    std::size_t limit, std::uint64_t offset) const {
  std::vector<const task*> order;
  order.reserve(tasks_.size());
  for (const auto& [order_key, id] : queue_) order.push_back(&tasks_.at(id));
  std::vector<const task*> others;
  for (const auto& [id, t] : tasks_)
    if (t.st != state::queued) others.push_back(&t);
  std::sort(others.begin(), others.end(),
            [](const task* a, const task* b) { return a->order < b->order; });
  order.insert(order.end(), others.begin(), others.end());
  std::vector<task_view> out;
  std::size_t total = 0;
  for (const task* t : order) {
    const auto name = state_name(static_cast<int>(t->st));
    if ((!state.empty() && name != state) || (kind && t->kind != *kind) ||
        (!coordinator.empty() && t->owner != coordinator))
      continue;
    if (total++ < offset) continue;
    if (out.size() < limit)
      out.push_back({t->id, t->kind, name, t->attempt, t->worker, t->owner, t->submitted_at});
  }
  return {std::move(out), total};
}

std::optional<task_manager::worker_view> task_manager::worker_state(const std::string& id) const {
  const auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  const auto& w = it->second;
  worker_view v{w.task, 0, quarantine_.held(id), w.leaving, w.drained};
  if (!w.task.empty()) v.attempt = tasks_.at(w.task).attempt;
  return v;
}

std::vector<task_manager::stream_view> task_manager::list_streams() const {
  std::vector<stream_view> out;
  for (const auto& [owner, s] : streams_)
    out.push_back({owner, s.seq, s.acked, s.windowed, s.ring.size()});
  std::sort(out.begin(), out.end(), [](const stream_view& a, const stream_view& b) {
    return a.coordinator < b.coordinator;
  });
  return out;
}

std::vector<std::pair<std::string, std::uint64_t>> task_manager::queued_by_shape() const {
  std::map<std::string, std::uint64_t> shapes;
  for (const auto& [order, id] : queue_) {
    std::string shape;
    for (const auto& [name, amount] : tasks_.at(id).requirements)
      shape += fmt::format("{}{}={}", shape.empty() ? "" : ",", name, amount);
    ++shapes[shape];
  }
  return {shapes.begin(), shapes.end()};
}

std::vector<std::pair<std::string, std::uint64_t>> task_manager::policy_versions() const {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  for (const auto& [id, p] : policies_.all()) out.emplace_back(id, p.version);
  std::sort(out.begin(), out.end());
  return out;
}

bool task_manager::set_drained(const std::string& id, bool drained, util::time_point now) {
  const auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  auto& w = it->second;
  if (w.drained == drained) return true;
  w.drained = drained;
  spdlog::info("worker {} {} by an operator{}", id, drained ? "drained" : "undrained",
               drained && !w.task.empty() ? fmt::format(" (its task {} runs on)", w.task) : "");
  if (drained) {
    free_[slot(w.role)].erase(w.serial);
  } else if (w.task.empty() && !w.leaving && !quarantine_.held(id)) {
    free_[slot(w.role)].emplace(w.serial, id);
    try_assign(now);
  }
  return true;
}

std::optional<std::string> task_manager::take_back(const std::string& id, const std::string& reason,
                                                   util::time_point now) {
  const auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  const std::string task_id = it->second.task;
  // No new task for it while the session lasts (the caller ends it next).
  it->second.drained = true;
  free_[slot(it->second.role)].erase(it->second.serial);
  if (task_id.empty()) return task_id;
  auto& t = tasks_.at(task_id);
  const util::log_scope log(
      {.task = t.id, .attempt = t.attempt, .worker = id, .coordinator = t.owner});
  sink_.send_to(id, codec::task_abort{t.id, t.attempt, reason});
  it->second.task.clear();
  end_attempt(t, reason, now);
  try_assign(now);
  return task_id;
}

}  // namespace rlbus::broker
