// The task manager's side of a coordinator's stream (SPEC §12.8, §12.9, §12.11): events
// made and sent as the stream allows, REPLAY and ACK, data credit handed out of the window,
// and the data a collector or learner relays into the stream, judged by index and credit
// per attempt (attempt_data decides, this file sends, emits and counts).
#include <algorithm>
#include <span>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "broker/tasks/task_helpers.hpp"
#include "broker/tasks/task_manager.hpp"
#include "codec/codec.hpp"
#include "codec/field_writer.hpp"
#include "codec/messages.hpp"

namespace rlbus::broker {

using task_helpers::clip;
using task_helpers::refuse;

namespace {

// A journal record allows this many more seqs of a stream at a time (§14): at most that many
// seqs that were never used are reported lost after a crash.
constexpr std::uint64_t seq_reserve = 64;

// How many ended attempts recently_ended() keeps: what an operator looks back at.
constexpr std::size_t ended_kept = 64;

bool ends_task(std::string_view event) {
  return event == "finished" || event == "failed" || event == "cancelled";
}

}  // namespace

// ---- events ----------------------------------------------------------------------------

// An event of `t`'s attempt at the head of its owner's stream, written once as the bytes
// it travels as (its body by `write_body`, `reserve` bytes expected), then sent as the stream
// allows and published.
template <class Body>
void task_manager::emit_with(task& t, std::string_view event, std::size_t reserve,
                             Body&& write_body, std::string_view detail, std::uint32_t items) {
  auto& s = streams_.of(t.owner);
  if (!t.event_fields.of(t.attempt, t.worker))
    t.event_fields = codec::event_fixed(t.id, t.attempt, t.worker);
  const bool ends = ends_task(event);
  auto wire = codec::event_head(t.event_fields, ++s.seq, event, reserve, ends);
  const auto head = wire.size();
  write_body(wire);
  const auto body_bytes = wire.size() - head;
  if (ends) codec::event_kind(wire, t.kind);
  coordinator_stream::held made{s.seq, util::shared_frame(std::move(wire)), body_bytes, items,
                                ends};
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
  streams_.keep(t.owner, s, std::move(made));
  if (ends || event == "requeued") {
    if (ended_.size() == ended_kept) ended_.pop_front();
    ended_.push_back({t.id, t.kind, std::string(event), t.attempt, t.worker, t.owner,
                      clip(std::string(detail)), util::clock::now()});
  }
  auto& topic = topic_;  // reused: no allocation per event
  topic.clear();
  topic.append("task.").append(t.owner).append(".").append(event);
  // Nobody subscribed: the event still takes its seq (SPEC §2.5) but its body is not built.
  if (!sink_.wanted(topic)) return sink_.publish(topic, std::monostate{});
  sink_.publish(topic,
                codec::task_status{t.id, t.kind, t.attempt, t.worker, clip(std::string(detail))});
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

// Every body the task manager's files emit (task_manager.cpp, task_journal.cpp, this one).
namespace eb = codec::event_body;
template void task_manager::emit(task&, const eb::assigned&, std::string_view, std::uint32_t);
template void task_manager::emit(task&, const eb::started&, std::string_view, std::uint32_t);
template void task_manager::emit(task&, const eb::data&, std::string_view, std::uint32_t);
template void task_manager::emit(task&, const eb::data_request&, std::string_view, std::uint32_t);
template void task_manager::emit(task&, const eb::learn_info&, std::string_view, std::uint32_t);
template void task_manager::emit(task&, const eb::requeued&, std::string_view, std::uint32_t);
template void task_manager::emit(task&, const eb::failed&, std::string_view, std::uint32_t);
template void task_manager::emit(task&, const eb::cancelled&, std::string_view, std::uint32_t);
template void task_manager::emit(task&, const eb::data_lost&, std::string_view, std::uint32_t);
template void task_manager::emit(task&, const eb::data_batch&, std::string_view, std::uint32_t);
template void task_manager::emit_verbatim<eb::info>(task&, std::string_view);
template void task_manager::emit_verbatim<eb::finished>(task&, std::string_view);

// ---- reliable data (§12.11) ------------------------------------------------------------

// An item of the attempt's indexed sequence, DATA or INFO (§12.11.4, §12.11.10): a
// duplicate or one past the next is dropped (true), and what is left must have credit.
bool task_manager::dropped_by_index(task& t, const std::optional<std::uint64_t>& index) {
  if (!index) return false;
  // Already relayed: a resend after a reconnect. Dropped without a word, and it uses no
  // credit, so resending can never be refused 414 (§12.11.5).
  if (t.data.duplicate(*index)) {
    ++counts_.data_duplicates;
    return true;
  }
  return past_next(t, *index);
}

std::optional<refusal> task_manager::out_of_credit(const task& t) {
  if (t.data.may_accept()) return std::nullopt;
  return refuse(codec::error_code::no_credit,
                fmt::format("task '{}': attempt {} was granted {} DATA and sent them all; wait "
                            "for DATA_CREDIT",
                            t.id, t.attempt, t.data.limit()));
}

// Relayed items (`last`: the index of the last, when they are indexed): counted against
// the credit, confirmed now and then (so the worker can let go of what it keeps for a
// resend), and, when credited, maybe the attempt's top-up.
void task_manager::relayed(task& t, std::optional<std::uint64_t> last, std::uint64_t items,
                           std::size_t bytes) {
  if (last && t.data.relayed_up_to(*last, items, bytes)) send_data_ack(t, false);
  // More items leave the others' room as it was (the backlog grew by what this attempt's
  // unused credit shrank), so only this attempt can have come due for a top-up.
  if (t.data.credited()) {
    auto& s = streams_.of(t.owner);
    if (t.data.due_top_up(streams_.chunk(s))) grant(s, nullptr);
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
  t.data.accept();
  if (t.st == state::running) set_deadline(t, now + t.step_timeout);  // closing: it stands
  const auto size = d.meta.size() + (d.payload ? d.payload->size() : 0);
  codec::event_body::data body{d.data_id, d.buffer_id, d.meta, std::nullopt, d.policy_version};
  if (d.payload) body.payload = *d.payload;
  emit(t, body, d.data_id);
  relayed(t, d.index, 1, size);
  collected(newest_version(t), d.policy_version);
  return std::nullopt;
}

std::uint64_t task_manager::newest_version(const task& t) const {
  if (!t.policy_id) return 0;
  const auto* p = policies_.latest(*t.policy_id);
  return p != nullptr ? p->version : 0;
}

void task_manager::collected(std::uint64_t newest, std::optional<std::uint64_t> version) {
  ++counts_.data_items;
  if (newest == 0 || !version) return;
  ++counts_.data_lag_items;
  counts_.data_lag_versions += newest - std::min(newest, *version);
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
  if (t.data.duplicate(l.last)) return std::nullopt;  // all of them got here after all
  const auto first = t.data.relayed() + 1;
  const auto count = l.last - t.data.relayed();
  if (!t.data.may_accept(count))
    return refuse(codec::error_code::bad_index,
                  fmt::format("task '{}': DATA_LOST up to {} goes past the attempt's credit of {}",
                              t.id, l.last, t.data.limit()));
  t.data.lost_up_to(l.last);
  t.data.accept(count);
  counts_.data_lost += count;
  if (t.st == state::running) set_deadline(t, now + t.step_timeout);
  spdlog::warn("task {} attempt {}: its collector lost DATA {}..{}", t.id, t.attempt, first,
               l.last);
  emit(t, codec::event_body::data_lost{first, l.last}, fmt::format("{}..{}", first, l.last));
  if (t.data.credited()) grant(streams_.of(t.owner), nullptr);
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
  if (t.data.duplicate(last)) {
    counts_.data_duplicates += n;
    return std::nullopt;
  }
  if (past_next(t, b.first_index)) {
    counts_.data_out_of_order += n - 1;  // past_next counted one
    return std::nullopt;
  }
  const auto skip = t.data.relayed() + 1 - b.first_index;  // duplicates at the front
  const auto fresh = n - skip;
  if (!t.data.may_accept(fresh))
    return refuse(codec::error_code::no_credit,
                  fmt::format("task '{}': attempt {} was granted {} DATA and has sent {}; a batch "
                              "of {} more goes past it: wait for DATA_CREDIT",
                              t.id, t.attempt, t.data.limit(), t.data.accepted(), fresh));
  counts_.data_duplicates += skip;
  t.data.accept(fresh);
  if (t.st == state::running) set_deadline(t, now + t.step_timeout);
  const auto first = t.data.relayed() + 1;
  const std::span<const std::string_view> fresh_items(items.data() + skip, fresh);
  std::size_t bytes = 0;
  auto& s = streams_.of(t.owner);
  // Items name their policy's version inside their bytes: read only when there is a newest
  // one to trail.
  const auto newest = newest_version(t);
  for (const auto item : fresh_items) {
    bytes += item.size();
    // A unit of credit costs what the stream's largest item does (§12.12.3).
    s.max_data_bytes = std::max(s.max_data_bytes, item.size());
    collected(newest, newest != 0 ? codec::item_policy_version(item) : std::nullopt);
  }
  emit(t, codec::event_body::data_batch{first, fresh_items}, fmt::format("{}..{}", first, last),
       static_cast<std::uint32_t>(fresh));
  relayed(t, last, fresh, bytes);
  return std::nullopt;
}

// Past the next index: dropped, counted, and the worker asked now and then to send again
// from the first missing one.
bool task_manager::past_next(task& t, std::uint64_t index) {
  if (!t.data.past_next(index)) return false;
  ++counts_.data_out_of_order;
  if (t.data.gap_asks_resend()) send_data_ack(t, true);
  return true;
}

void task_manager::send_data_ack(task& t, bool resend) {
  t.data.acked();
  sink_.send_to(t.worker, codec::data_ack{t.id, t.attempt, t.data.relayed(), resend});
}

// ---- replay and flow control (§12.9) ---------------------------------------------------

void task_manager::pump_streams() {
  streams_.pump_all();
  tell_untold_credit();
}

std::optional<refusal> task_manager::on_replay(const std::string& from, const codec::replay& r) {
  auto& s = streams_.of(from);
  if (auto no = s.replay(r.from_seq)) return no;
  ++counts_.replays;
  if (journal_ != nullptr) journal_->acked(from, s.acked);
  streams_.pump(from, s);
  grant(s, nullptr);
  return std::nullopt;
}

std::optional<refusal> task_manager::on_ack(const std::string& from, const codec::ack& a) {
  auto& s = streams_.of(from);
  const auto before = s.acked;
  if (auto no = s.ack(a.seq)) return no;
  if (journal_ != nullptr && s.acked != before) journal_->acked(from, s.acked);
  streams_.pump(from, s);
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
  const std::uint64_t chunk = streams_.chunk(s);
  // Unused credit counts against the window up to each attempt's current chunk. An attempt
  // granted a bigger chunk while it shared the window with fewer others cannot be asked to
  // give it back; counting all of it would let a few idle attempts starve the rest for good.
  std::uint64_t outstanding = 0;
  for (const auto& id : s.credited) outstanding += std::min(tasks_.at(id).data.unused(), chunk);
  const std::uint64_t backlog = s.unacked_items();
  const std::size_t byte_budget = cfg_.stream_ring_bytes / 2;
  for (const auto& id : s.credited) {
    auto& t = tasks_.at(id);
    std::uint64_t add = 0;
    if (t.data.due_top_up(chunk)) {
      add = t.data.top_up(
          chunk, attempt_data::room(window, backlog, outstanding, s.unacked_bytes(), byte_budget,
                                    s.max_data_bytes, streams_.over_share(s)));
    }
    outstanding += add;
    if (add > 0 || &t == announce) tell_credit(t);
  }
}

// DATA_CREDIT with the attempt's limit so far. A worker cannot ask for it, and waits for it
// once it has used what it knows of: one that does not reach the connection is told again on
// the next tick (tell_untold_credit), and after a resumption (peer_resumed).
void task_manager::tell_credit(task& t) {
  if (sink_.send_to(t.worker, codec::data_credit{t.id, t.attempt, t.data.limit()})) t.data.told();
}

void task_manager::tell_untold_credit() {
  for (const auto& [owner, s] : streams_.all())
    for (const auto& id : s.credited)
      if (auto& t = tasks_.at(id); t.data.credit_untold()) tell_credit(t);
}

// The attempt ends: its unused credit goes back to the window, for the stream's others.
void task_manager::uncredit(task& t) {
  if (!t.data.end_credit()) return;
  auto* s = streams_.find(t.owner);
  if (s == nullptr) return;
  s->credited.erase(t.id);
  grant(*s, nullptr);
}

}  // namespace rlbus::broker
