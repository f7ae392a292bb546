// The task manager's durability (SPEC §14): a task as a journal record, the live state
// written as the records of a compacted journal, and what a journal held taken up again
// when the broker starts. What the task manager records as it goes is in its other files.
#include <algorithm>
#include <map>
#include <set>

#include <spdlog/spdlog.h>

#include "broker/tasks/task_helpers.hpp"
#include "broker/tasks/task_manager.hpp"
#include "codec/codec.hpp"
#include "codec/messages.hpp"

namespace rlbus::broker {

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
  for (const auto& [owner, s] : streams_.all()) {
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
    auto& s = streams_.of(owner);
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
    auto& held = tasks_.restore(std::move(t));
    if (jt.running) {
      // The attempt ended with the broker that ran it. The restart is not the task's fault:
      // it does not use up an attempt (within the protocol's 1000).
      const std::string reason = "broker restarted";
      if (held.attempt >= 1000) {
        ++counts_.failed;
        emit(held, codec::event_body::failed{reason, held.attempt}, reason);
        erase_task(held.id);
        continue;
      }
      held.max_attempts = std::max(held.max_attempts, held.attempt + 1);
      held.worker = jt.worker;  // the event names the worker it ran on
      emit(held, codec::event_body::requeued{reason, held.attempt}, reason);
      held.worker.clear();
      ++counts_.requeued;
    }
    tasks_.requeue(held);
    held.submitted_at = now;  // as far as this broker knows
    held.queued_at = now;
    arm_queue_timeout(held, now);
  }
  streams_.recount();
  // Nobody is connected yet: every coordinator's work waits for a new session of its id.
  std::set<std::string> owners;
  for (const auto& [owner, s] : streams_.all()) owners.insert(owner);
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

}  // namespace rlbus::broker
