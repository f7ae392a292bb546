// rlbus::coordinator: a session (role coordinator) on an I/O thread, a callback thread that
// works through the task stream in order, and an outbox from both user threads and
// callbacks to the I/O thread. See include/rlbus/coordinator.hpp for the contract.
#include "rlbus/coordinator.hpp"

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <variant>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "client/io_loop.hpp"
#include "client/session.hpp"
#include "codec/field_reader.hpp"
#include "util/poll.hpp"
#include "util/wake_pipe.hpp"

namespace rlbus {

namespace {

// A broker could report any count; reconciling calls the seed's callbacks once per worker of
// difference, so a wild number must not keep the callback thread busy for ever.
constexpr std::uint64_t max_reconcile = 1'000'000;

// Reads fields of a msgpack map body (from the broker: decoded under limits anyway).
class body_fields {
 public:
  explicit body_fields(std::string_view body) : reader_(body, {}) {}
  [[nodiscard]] bool ok() const { return !reader_.fault(); }
  std::string str(std::string_view key) {
    std::string out;
    reader_.str(key, out, 1 << 20, false);
    return out;
  }
  std::uint64_t uint(std::string_view key) {
    std::optional<std::uint64_t> out;
    reader_.opt_uint(key, out, 0, ~std::uint64_t{0});
    return out.value_or(0);
  }
  bool flag(std::string_view key) {
    bool out = false;
    reader_.boolean(key, out, false);
    return ok() && out;
  }
  std::string raw(std::string_view key) {
    std::string out;
    if (reader_.has(key)) reader_.blob(key, out, true, false, true);
    return out;
  }
  std::optional<std::string> opt_raw(std::string_view key) {
    if (!reader_.has(key)) return std::nullopt;
    return raw(key);
  }

 private:
  codec::detail::field_reader reader_;  // views into the body: it outlives this
};

constexpr std::uint64_t ack_every = 32;  // processed events per ACK while more are queued
// What a learner is told to wait after "no data yet" (DATA_REPLY retry_ms): the first time,
// then doubled for each further one in a row, up to the cap; data given starts it over.
constexpr std::uint32_t no_data_first_ms = 10;
constexpr std::uint32_t no_data_max_ms = 1000;
constexpr std::size_t max_early = 65'536;  // events kept that arrived ahead of a gap

}  // namespace

struct coordinator::impl {
  // One item for the callback thread: a stream event, a range the broker lost, or a capacity
  // report (which has no seq).
  struct stream_item {
    codec::task_event event;
    std::uint64_t lost_first = 0, lost_last = 0;  // lost_last != 0: a lost range
    std::optional<codec::capacity> capacity;      // set: a capacity report, not a stream step
    std::uint64_t generation = 0;
  };
  impl(coordinator_options o, coordinator_callbacks cb)
      : opts(std::move(o)), callbacks(std::move(cb)), ctx(1) {
    client::detail::validate(session_options());
    if (!callbacks.deal_with_collector_judge_finish)
      callbacks.deal_with_collector_judge_finish = [](const std::string&, const std::string& info) {
        return body_fields(info).flag("collector_done");
      };
    if (!callbacks.deal_with_learner_judge_finish)
      callbacks.deal_with_learner_judge_finish = [](const std::string&, const std::string& info) {
        return body_fields(info).flag("learner_done");
      };
    io_thread = std::thread([this] { io_loop(); });
    callback_thread = std::thread([this] { callback_loop(); });
  }

  [[nodiscard]] client::detail::session_options session_options() const {
    return {opts.endpoint,      role::coordinator,  opts.id,   {}, opts.heartbeat,
            opts.reconnect_min, opts.reconnect_max, opts.curve};
  }

  void post(codec::message m) {
    {
      std::lock_guard lock(mu);
      outbox.push_back(std::move(m));
    }
    wake.notify();
  }

  // ---- I/O thread ----
  void io_loop() {
    client::detail::session s(
        ctx, session_options(),
        [this](connection_state st, std::uint64_t /*token*/, const std::string& detail) {
          std::lock_guard lock(mu);
          state = st;
          if (!detail.empty() && st != connection_state::ready) last_error = detail;
          changed.notify_all();
        },
        [this](codec::message&& m) { on_message(std::move(m)); });
    client::detail::run_io_loop(s, wake, io_stop,
                                {[this](client::detail::session& ss) { return flush(ss); }});
  }

  // After each turn: the callback thread is woken once for all the turn brought, and what the
  // other threads queued goes out. False when the socket's queue is full with more to send.
  bool flush(client::detail::session& s) {
    std::lock_guard lock(mu);
    if (notify_pending) {
      notify_pending = false;
      changed.notify_all();
    }
    while (!outbox.empty()) {
      if (!s.send_ready(outbox.front())) return s.state() != connection_state::ready;
      outbox.pop_front();
    }
    return true;
  }

  void on_message(codec::message&& m) {
    std::lock_guard lock(mu);
    if (auto* ack = std::get_if<codec::submitted>(&m)) {
      // Known as open before any of its events can reach the callback thread.
      const auto kind = submitting.find(ack->task_id);
      if (ack->accepted && kind != submitting.end()) open[ack->task_id] = kind->second;
      if (kind != submitting.end()) submitting.erase(kind);
      acks[ack->task_id] = std::move(*ack);
    } else if (auto* e = std::get_if<codec::task_event>(&m)) {
      on_event(std::move(*e));
    } else if (const auto* g = std::get_if<codec::stream_gap>(&m)) {
      on_gap(*g);
    } else if (const auto* w = std::get_if<codec::welcome>(&m)) {
      on_welcome(*w);
    } else if (auto* c = std::get_if<codec::capacity>(&m)) {
      stream_item item;  // in order with the task events around it
      item.capacity = std::move(*c);
      item.generation = generation;
      events.push_back(std::move(item));
    }
    notify_pending = true;  // the callback thread is woken once the whole read is in
  }

  // ---- the stream (SPEC §12.9): I/O thread, `mu` held ----
  // Events reach the callback thread in seq order, each once: a duplicate (a replay of what
  // came already) is dropped, one that comes early (after a gap) waits in `early` while a
  // REPLAY fetches what is missing, and what the broker no longer holds is reported lost.

  void on_welcome(const codec::welcome& w) {
    // A new session that adopted our own stream (it expired while we were cut off, §12.5.8)
    // goes on like a resumption.
    const bool ours_again = w.stream_acked && next_seq > 1 && *w.stream_acked <= processed;
    if (!w.resumed && !ours_again) {
      // A new session begins a new stream at 1, and what the old one still owed us went
      // with it (the broker cancelled its tasks); unless it adopted the stream an earlier
      // process of our id left, which goes on after stream_acked.
      if (w.stream_acked) {
        spdlog::info(
            "coordinator {}: adopted the tasks of an earlier session; the stream goes "
            "on after {}",
            opts.id, *w.stream_acked);
      } else if (next_seq > 1) {
        spdlog::warn("coordinator {}: new session, the stream starts again at 1", opts.id);
      }
      ++generation;
      processed = w.stream_acked.value_or(0);
      next_seq = processed + 1;
      since_ack = 0;
      early.clear();
      // ACKs and REPLAYs still queued name seqs of the old stream.
      std::erase_if(outbox, [](const codec::message& q) {
        return std::holds_alternative<codec::ack>(q) || std::holds_alternative<codec::replay>(q);
      });
    }
    // First thing on every connection, before any SUBMIT: turn on the window and fetch what
    // the broker sent after the last event we processed (on a resumption, what went down
    // with the old connection).
    ask_replay(processed + 1, true);
  }

  void ask_replay(std::uint64_t from, bool first = false) {
    replay_asked = next_seq;
    ++replays;
    if (first) {
      outbox.push_front(codec::replay{from});
    } else {
      outbox.push_back(codec::replay{from});
    }
    wake.notify();
  }

  void on_event(codec::task_event&& e) {
    if (e.seq < next_seq) {
      ++duplicates;
    } else if (e.seq > next_seq) {
      if (early.size() < max_early) early.emplace(e.seq, std::move(e));
    } else {
      deliver(std::move(e));
    }
    settle();
  }

  void on_gap(const codec::stream_gap& g) {
    if (g.last < next_seq) return;  // about events we have already
    if (g.first > next_seq) {
      // Something before the gap went missing as well: ask again from there, and the
      // broker reports the gap again in its place.
      ask_replay(next_seq);
      return;
    }
    spdlog::warn("coordinator {}: events {}..{} of the stream are lost", opts.id, next_seq, g.last);
    stream_item lost;
    lost.lost_first = next_seq;
    lost.lost_last = g.last;
    lost.generation = generation;
    events.push_back(std::move(lost));
    gaps += g.last - next_seq + 1;
    next_seq = g.last + 1;
    settle();
  }

  void deliver(codec::task_event&& e) {
    ++next_seq;
    stream_item item;
    item.event = std::move(e);
    item.generation = generation;
    events.push_back(std::move(item));
  }

  // Hands on what `early` holds in order, and asks once per gap for what is missing.
  void settle() {
    while (!early.empty() && early.begin()->first <= next_seq) {
      auto node = early.extract(early.begin());
      if (node.key() == next_seq) {
        deliver(std::move(node.mapped()));
      } else {
        ++duplicates;
      }
    }
    if (replay_asked && next_seq > *replay_asked) replay_asked.reset();  // that gap is filled
    if (!early.empty() && !replay_asked) ask_replay(next_seq);
  }

  // ---- callback thread ----
  // Takes everything queued at once: one wake-up and one lock for a whole turn of the I/O
  // thread's reading, however many events it brought.
  void callback_loop() {
    std::deque<stream_item> batch;
    while (true) {
      {
        std::unique_lock lock(mu);
        changed.wait(lock, [&] { return cb_stop || !events.empty(); });
        if (cb_stop) return;
        batch.swap(events);
      }
      while (!batch.empty() && !cb_halt.load(std::memory_order_relaxed)) {
        auto item = std::move(batch.front());
        batch.pop_front();
        handle(item, !batch.empty());
      }
    }
  }

  // One item of the stream, on the callback thread; `more`: others are already in hand.
  void handle(stream_item& item, bool more) {
    if (item.capacity) {  // no seq: nothing to acknowledge
      try {
        on_capacity(*item.capacity);
      } catch (const std::exception& ex) {
        spdlog::error("coordinator {}: capacity callback threw: {}", opts.id, ex.what());
      }
      return;
    }
    const auto& e = item.event;
    const bool lost = item.lost_last != 0;
    try {
      if (lost) {
        if (callbacks.on_stream_lost) callbacks.on_stream_lost(item.lost_first, item.lost_last);
      } else {
        dispatch(e);
      }
    } catch (const std::exception& ex) {
      spdlog::error("coordinator {}: callback for {} of task {} threw: {}", opts.id,
                    lost ? "lost events" : e.event, e.task_id, ex.what());
    }
    processed_one(lost ? item.lost_last : e.seq, item.generation, more);
  }

  // Acknowledges processed events: every ack_every of them, and whenever the callback thread
  // has caught up, so a window smaller than ack_every never stalls.
  void processed_one(std::uint64_t seq, std::uint64_t gen, bool more) {
    {
      std::lock_guard lock(mu);
      if (gen != generation) return;  // an event of a stream that has ended
      processed = seq;
      if (++since_ack < ack_every && (more || !events.empty())) return;
      since_ack = 0;
      // An ACK still waiting to go out is only made newer: ACKs are cumulative.
      if (!outbox.empty() && std::holds_alternative<codec::ack>(outbox.back())) {
        std::get<codec::ack>(outbox.back()).seq = processed;
      } else {
        outbox.push_back(codec::ack{processed});
      }
    }
    wake.notify();
  }

  std::optional<role> kind_of(const std::string& task_id) {
    std::lock_guard lock(mu);
    const auto it = open.find(task_id);
    if (it == open.end()) return std::nullopt;
    return it->second;
  }

  void close_task(const std::string& task_id) {
    no_data_backoff.erase(task_id);  // the callback thread's own, like dispatch
    std::lock_guard lock(mu);
    open.erase(task_id);
  }

  void dispatch(const codec::task_event& e) {
    const auto& cb = callbacks;
    if (e.event == "data") {
      body_fields f(e.body);
      if (cb.deal_with_collector_send_data)
        cb.deal_with_collector_send_data(e.task_id, f.str("buffer_id"), f.str("data_id"), e.body);
    } else if (e.event == "data_batch") {
      // Each item as the `data` it stands for, in order (§12.12.6).
      const auto batch = codec::read_data_batch_body(e.body);
      if (!batch) {
        spdlog::error("coordinator {}: a data_batch of task {} is malformed: {}", opts.id,
                      e.task_id, batch.error().reason);
        return;
      }
      if (!cb.deal_with_collector_send_data) return;
      std::string item;
      for (const auto& it : batch.value().items) {
        item.assign(it.bytes);
        try {
          cb.deal_with_collector_send_data(e.task_id, it.buffer_id, it.data_id, item);
        } catch (const std::exception& ex) {  // one item's failure does not cost the others
          spdlog::error("coordinator {}: callback for data of task {} threw: {}", opts.id,
                        e.task_id, ex.what());
        }
      }
    } else if (e.event == "info") {
      if (cb.deal_with_collector_judge_finish(e.task_id, e.body)) post(codec::finish{e.task_id});
    } else if (e.event == "data_request") {
      body_fields f(e.body);
      std::optional<std::string> data;
      if (cb.deal_with_learner_get_data)
        data = cb.deal_with_learner_get_data(e.task_id, f.str("buffer_id"),
                                             static_cast<std::uint32_t>(f.uint("batch_size")),
                                             f.uint("cur_learner_iter"));
      codec::data_reply reply{e.task_id, f.uint("request_id"), codec::nil_blob};
      if (data) {
        reply.data = std::move(*data);
        no_data_backoff.erase(e.task_id);
      } else {
        const auto [it, first] = no_data_backoff.try_emplace(e.task_id, no_data_first_ms);
        if (!first) it->second = std::min(no_data_max_ms, it->second * 2);
        reply.retry_ms = it->second;
      }
      post(std::move(reply));
    } else if (e.event == "learn_info") {
      body_fields f(e.body);
      const auto info = f.raw("info");
      if (cb.deal_with_learner_judge_finish(e.task_id, info)) {
        post(codec::finish{e.task_id});
      } else if (cb.deal_with_learner_send_info) {
        cb.deal_with_learner_send_info(e.task_id, f.str("buffer_id"), info);
      }
    } else if (e.event == "finished") {
      const auto kind = kind_of(e.task_id);
      close_task(e.task_id);
      if (kind == role::learner) {
        if (cb.deal_with_learner_finish_task) cb.deal_with_learner_finish_task(e.task_id, e.body);
      } else if (cb.deal_with_collector_finish_task) {
        cb.deal_with_collector_finish_task(e.task_id, e.body);
      }
    } else if (e.event == "data_lost") {
      body_fields f(e.body);
      const auto first = f.uint("first_index");
      const auto last = f.uint("last_index");
      {
        std::lock_guard lock(mu);
        if (last >= first) data_lost += last - first + 1;
      }
      if (cb.on_data_lost) cb.on_data_lost(e.task_id, e.attempt, first, last);
    } else if (e.event == "requeued") {
      if (cb.on_task_requeued) {
        body_fields f(e.body);
        cb.on_task_requeued(e.task_id, e.attempt, f.str("reason"), f.opt_raw("result"));
      }
    } else if (e.event == "failed") {
      close_task(e.task_id);
      if (cb.on_task_failed) {
        body_fields f(e.body);
        cb.on_task_failed(e.task_id, f.str("reason"), f.opt_raw("result"));
      }
    } else if (e.event == "cancelled") {
      close_task(e.task_id);
      if (cb.on_task_cancelled) cb.on_task_cancelled(e.task_id, body_fields(e.body).str("reason"));
    }
    // assigned, started: progress only
  }

  // The broker's count is the truth (§12.10): the seed's callbacks are called once per worker
  // of difference from the count known here, so a lost report or a reconnection with its
  // snapshot still leaves the user's own tally right. The count steps with each call.
  void on_capacity(const codec::capacity& c) {
    if (c.kind == role::coordinator) return;
    const bool collector = c.kind == role::collector;
    const auto step = [&](bool up) {
      {
        std::lock_guard lock(mu);
        auto& n = collector ? collectors : learners;
        n = up ? n + 1 : n - 1;
      }
      const auto& fn =
          up ? callbacks.deal_with_increase_collector : callbacks.deal_with_decrease_collector;
      if (collector && fn) fn();
    };
    std::uint64_t known = 0;
    {
      std::lock_guard lock(mu);
      known = collector ? collectors : learners;
    }
    const auto target = std::min(c.count, known + max_reconcile);
    for (auto n = known; n < target; ++n) step(true);
    for (auto n = known; n > target; --n) step(false);
    if (callbacks.on_capacity)
      callbacks.on_capacity(c.kind, std::string(codec::to_string(c.change)), c.worker_id, c.count);
  }

  void stop() {
    if (!io_thread.joinable()) return;
    {
      std::lock_guard lock(mu);
      cb_stop = true;
      cb_halt.store(true);
      changed.notify_all();
    }
    callback_thread.join();
    io_stop.store(true);
    wake.notify();
    io_thread.join();
  }

  coordinator_options opts;
  coordinator_callbacks callbacks;
  zmq::context_t ctx;
  util::wake_pipe wake;
  mutable std::mutex mu;
  mutable std::condition_variable changed;
  std::deque<codec::message> outbox;
  std::deque<stream_item> events;  // in arrival order
  std::map<std::string, codec::submitted> acks;
  std::map<std::string, role> submitting;  // SUBMIT sent, SUBMITTED not yet here
  std::map<std::string, role> open;
  connection_state state = connection_state::connecting;
  std::string last_error;
  std::uint64_t next_seq = 1;                        // the next seq to hand to the callback thread
  std::uint64_t processed = 0;                       // the last seq the callback thread finished
  std::uint64_t since_ack = 0;                       // processed since the last ACK
  std::uint64_t generation = 0;                      // +1 per new stream (a new session)
  std::map<std::uint64_t, codec::task_event> early;  // arrived ahead of a gap
  std::optional<std::uint64_t> replay_asked;         // next_seq when the pending REPLAY was asked
  std::uint64_t gaps = 0;                            // events lost: they never arrived
  std::uint64_t duplicates = 0;
  std::uint64_t data_lost = 0;  // DATA reported lost by collectors (§12.11)
  // Per learner task, the retry_ms of its last "no data yet" in a row (callback thread only).
  std::unordered_map<std::string, std::uint32_t> no_data_backoff;
  std::uint64_t replays = 0;
  std::uint64_t collectors = 0;  // as of the last capacity callback
  std::uint64_t learners = 0;
  bool cb_stop = false;
  bool notify_pending = false;       // on_message queued something since the last notify
  std::atomic<bool> cb_halt{false};  // cb_stop, seen without the lock by a batch in hand
  std::atomic<bool> io_stop{false};
  std::thread io_thread;
  std::thread callback_thread;
};

coordinator::coordinator(coordinator_options opts, coordinator_callbacks callbacks)
    : impl_(std::make_unique<impl>(std::move(opts), std::move(callbacks))) {}
coordinator::~coordinator() {
  stop();
}

connection_state coordinator::state() const {
  std::lock_guard lock(impl_->mu);
  return impl_->state;
}

bool coordinator::wait_for(connection_state s, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mu);
  return impl_->changed.wait_for(lock, timeout, [&] { return impl_->state == s; });
}

std::optional<submit_result> coordinator::submit(const task_spec& t,
                                                 std::chrono::milliseconds timeout) {
  if (t.kind == role::coordinator)
    throw std::invalid_argument("a task's kind is collector or learner");
  {
    std::lock_guard lock(impl_->mu);
    impl_->acks.erase(t.task_id);
    impl_->submitting[t.task_id] = t.kind;
  }
  impl_->post(codec::submit{t.task_id, t.kind, t.task_info, t.requirements, t.start_timeout_ms,
                            t.step_timeout_ms, t.close_timeout_ms, t.task_timeout_ms,
                            t.max_attempts, t.policy_id, t.queue_timeout_ms});
  std::unique_lock lock(impl_->mu);
  if (!impl_->changed.wait_for(lock, timeout, [&] { return impl_->acks.count(t.task_id) != 0; }))
    return std::nullopt;
  const auto ack = impl_->acks.at(t.task_id);
  impl_->acks.erase(t.task_id);
  return submit_result{ack.accepted, ack.code, ack.reason, ack.queued};
}

void coordinator::cancel(const std::string& task_id, const std::string& reason) {
  impl_->post(codec::cancel{task_id, reason});
}

std::size_t coordinator::open_tasks() const {
  std::lock_guard lock(impl_->mu);
  return impl_->open.size();
}

std::uint64_t coordinator::stream_gaps() const {
  std::lock_guard lock(impl_->mu);
  return impl_->gaps;
}

std::uint64_t coordinator::data_lost() const {
  std::lock_guard lock(impl_->mu);
  return impl_->data_lost;
}

std::uint64_t coordinator::collectors() const {
  std::lock_guard lock(impl_->mu);
  return impl_->collectors;
}

std::uint64_t coordinator::learners() const {
  std::lock_guard lock(impl_->mu);
  return impl_->learners;
}

std::uint64_t coordinator::stream_replays() const {
  std::lock_guard lock(impl_->mu);
  return impl_->replays;
}

std::uint64_t coordinator::stream_duplicates() const {
  std::lock_guard lock(impl_->mu);
  return impl_->duplicates;
}

void coordinator::stop() {
  if (impl_) impl_->stop();
}

}  // namespace rlbus
