// rlbus::coordinator: a role on the client core (client/core/core.hpp). The core's I/O thread hands
// it the broker's messages: answers to SUBMIT, and the task stream, which client/tasks/stream.hpp
// puts in order; a callback thread works through that stream, calling the user's callbacks one
// at a time, and what they answer goes out through the core's outbox. See
// include/rlbus/coordinator.hpp for the contract.
#include "rlbus/coordinator.hpp"

#include <atomic>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "client/core/core.hpp"
#include "client/tasks/stream.hpp"
#include "codec/field_reader.hpp"

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

// What a learner is told to wait after "no data yet" (DATA_REPLY retry_ms): the first time,
// then doubled for each further one in a row, up to the cap; data given starts it over.
constexpr std::uint32_t no_data_first_ms = 10;
constexpr std::uint32_t no_data_max_ms = 1000;

}  // namespace

struct coordinator::impl {
  using stream_item = client::detail::event_stream::item;

  // A task this coordinator knows as open: what it is, whether a judge already closed the
  // attempt now running (one FINISH per attempt: a second would be refused as a fault), and
  // whether that attempt is running as far as the stream told. The broker accepts FINISH
  // only for a running task (§12.5.3), so a finish() asked before its worker's STARTED reached
  // the broker waits here for the first event that says it did.
  struct open_task {
    role kind = role::collector;
    std::uint32_t finished_attempt = 0;  // the attempt a FINISH was sent for (0: none)
    bool running = false;
    bool finish_asked = false;  // finish() was called before the attempt ran
  };

  impl(coordinator_options o, coordinator_callbacks cb)
      : opts(std::move(o)),
        callbacks(std::move(cb)),
        io(checked(opts), std::numeric_limits<std::size_t>::max()),
        stream(io, opts.id) {
    if (!callbacks.deal_with_collector_judge_finish)
      callbacks.deal_with_collector_judge_finish = [](const std::string&, const std::string& info) {
        return body_fields(info).flag("collector_done");
      };
    if (!callbacks.deal_with_learner_judge_finish)
      callbacks.deal_with_learner_judge_finish = [](const std::string&, const std::string& info) {
        return body_fields(info).flag("learner_done");
      };
    io.start({[this](codec::message&& m) { on_message(std::move(m)); },
              [this](client::detail::session& s) { return flush(s); }});
    callback_thread = std::thread([this] { callback_loop(); });
  }
  ~impl() { stop(); }
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  static client::detail::session_options checked(const coordinator_options& o) {
    client::detail::session_options so{o.endpoint,      role::coordinator, o.id,   {}, o.heartbeat,
                                       o.reconnect_min, o.reconnect_max,   o.curve};
    client::detail::validate(so);
    return so;
  }

  void post(codec::message m) { io.post(std::move(m)); }

  // ---- I/O thread ----
  // After each turn (the core's lock held): the callback thread is woken once for all the turn
  // brought, and what the other threads queued goes out.
  bool flush(client::detail::session& s) {
    if (notify_pending) {
      notify_pending = false;
      changed.notify_all();
    }
    return io.send_in_order(s);
  }

  void on_message(codec::message&& m) {
    std::lock_guard lock(io.mu());
    if (auto* ack = std::get_if<codec::submitted>(&m)) {
      // Known as open before any of its events can reach the callback thread.
      const auto kind = submitting.find(ack->task_id);
      if (ack->accepted && kind != submitting.end()) open[ack->task_id] = {kind->second, 0};
      if (kind != submitting.end()) submitting.erase(kind);
      acks[ack->task_id] = std::move(*ack);
    } else if (auto* e = std::get_if<codec::task_event>(&m)) {
      stream.on_event(std::move(*e));
    } else if (const auto* g = std::get_if<codec::stream_gap>(&m)) {
      stream.on_gap(*g);
    } else if (const auto* w = std::get_if<codec::welcome>(&m)) {
      stream.on_welcome(*w);
    } else if (auto* c = std::get_if<codec::capacity>(&m)) {
      stream.on_capacity(std::move(*c));
    }
    notify_pending = true;  // the callback thread is woken once the whole read is in
  }

  // ---- callback thread ----
  // Takes everything queued at once: one wake-up and one lock for a whole turn of the I/O
  // thread's reading, however many events it brought.
  void callback_loop() {
    std::deque<stream_item> batch;
    while (true) {
      {
        std::unique_lock lock(io.mu());
        changed.wait(lock, [&] { return cb_stop || !stream.items().empty(); });
        if (cb_stop) return;
        batch.swap(stream.items());
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

  void processed_one(std::uint64_t seq, std::uint64_t gen, bool more) {
    std::lock_guard lock(io.mu());
    stream.processed(seq, gen, more);
  }

  // Ends the task here; returns its kind: the one its end event names (§12.3.6), else the one
  // this coordinator submitted it as; nullopt when neither told.
  std::optional<role> close_task(const codec::task_event& e) {
    no_data_backoff.erase(e.task_id);  // the callback thread's own, like dispatch
    std::lock_guard lock(io.mu());
    std::optional<role> kind = e.kind;
    if (const auto it = open.find(e.task_id); it != open.end()) {
      if (!kind) kind = it->second.kind;
      open.erase(it);
    }
    return kind;
  }

  // A judge said the attempt is done: FINISH, once per attempt.
  void judged_finished(const codec::task_event& e) {
    {
      std::lock_guard lock(io.mu());
      const auto it = open.find(e.task_id);
      if (it != open.end()) {
        if (it->second.finished_attempt == e.attempt) return;
        it->second.finished_attempt = e.attempt;
      }
    }
    post(codec::finish{e.task_id});
  }

  // What an event says of its attempt: assigned and requeued, not running (yet); an end, gone
  // (close_task); anything else, running, which sends a FINISH finish() asked for earlier.
  void progress(const codec::task_event& e) {
    {
      std::lock_guard lock(io.mu());
      const auto it = open.find(e.task_id);
      if (it == open.end() || e.event == "finished" || e.event == "failed" ||
          e.event == "cancelled")
        return;
      auto& t = it->second;
      t.running = e.event != "assigned" && e.event != "requeued";
      if (!t.running || !t.finish_asked || t.finished_attempt == e.attempt) return;
      t.finish_asked = false;
      t.finished_attempt = e.attempt;
    }
    post(codec::finish{e.task_id});
  }

  void dispatch(const codec::task_event& e) {
    const auto& cb = callbacks;
    progress(e);
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
      if (cb.deal_with_collector_judge_finish(e.task_id, e.body)) judged_finished(e);
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
        judged_finished(e);
      } else if (cb.deal_with_learner_send_info) {
        cb.deal_with_learner_send_info(e.task_id, f.str("buffer_id"), info);
      }
    } else if (e.event == "finished") {
      if (close_task(e) == role::learner) {
        if (cb.deal_with_learner_finish_task) cb.deal_with_learner_finish_task(e.task_id, e.body);
      } else if (cb.deal_with_collector_finish_task) {
        cb.deal_with_collector_finish_task(e.task_id, e.body);
      }
    } else if (e.event == "data_lost") {
      body_fields f(e.body);
      const auto first = f.uint("first_index");
      const auto last = f.uint("last_index");
      {
        std::lock_guard lock(io.mu());
        if (last >= first) data_lost += last - first + 1;
      }
      if (cb.on_data_lost) cb.on_data_lost(e.task_id, e.attempt, first, last);
    } else if (e.event == "requeued") {
      if (cb.on_task_requeued) {
        body_fields f(e.body);
        cb.on_task_requeued(e.task_id, e.attempt, f.str("reason"), f.opt_raw("result"));
      }
    } else if (e.event == "failed") {
      close_task(e);
      if (cb.on_task_failed) {
        body_fields f(e.body);
        cb.on_task_failed(e.task_id, f.str("reason"), f.opt_raw("result"));
      }
    } else if (e.event == "cancelled") {
      close_task(e);
      if (cb.on_task_cancelled) cb.on_task_cancelled(e.task_id, body_fields(e.body).str("reason"));
    }
    // assigned, started: progress only
  }

  // The broker's count is the truth (§12.10): the seed's callbacks are called once per worker
  // of difference from the count known here, so a lost report or a reconnection with its
  // snapshot still leaves the user's own tally right. The count steps with each call.
  void on_capacity(const codec::capacity& c) {
    if (c.kind != role::collector && c.kind != role::learner) return;  // not a worker kind
    const bool collector = c.kind == role::collector;
    const auto step = [&](bool up) {
      {
        std::lock_guard lock(io.mu());
        auto& n = collector ? collectors : learners;
        n = up ? n + 1 : n - 1;
      }
      const auto& fn =
          up ? callbacks.deal_with_increase_collector : callbacks.deal_with_decrease_collector;
      if (collector && fn) fn();
    };
    std::uint64_t known = 0;
    {
      std::lock_guard lock(io.mu());
      known = collector ? collectors : learners;
    }
    const auto target = std::min(c.count, known + max_reconcile);
    for (auto n = known; n < target; ++n) step(true);
    for (auto n = known; n > target; --n) step(false);
    if (callbacks.on_capacity)
      callbacks.on_capacity(c.kind, std::string(codec::to_string(c.change)), c.worker_id, c.count);
  }

  void stop() {
    if (!callback_thread.joinable()) return;
    {
      std::lock_guard lock(io.mu());
      cb_stop = true;
      cb_halt.store(true);
      changed.notify_all();
    }
    callback_thread.join();
    io.stop();
  }

  coordinator_options opts;
  coordinator_callbacks callbacks;
  client::detail::core io;  // its mu() guards all that follows, but the callback thread's own
  client::detail::event_stream stream;
  std::condition_variable changed;  // new stream items, a SUBMITTED, stopping
  std::map<std::string, codec::submitted> acks;
  std::map<std::string, role> submitting;  // SUBMIT sent, SUBMITTED not yet here
  std::map<std::string, open_task> open;
  std::uint64_t data_lost = 0;   // DATA reported lost by collectors (§12.11)
  std::uint64_t collectors = 0;  // as of the last capacity callback
  std::uint64_t learners = 0;
  bool cb_stop = false;
  bool notify_pending = false;       // on_message queued something since the last notify
  std::atomic<bool> cb_halt{false};  // cb_stop, seen without the lock by a batch in hand
  // Per learner task, the retry_ms of its last "no data yet" in a row (callback thread only).
  std::unordered_map<std::string, std::uint32_t> no_data_backoff;
  std::thread callback_thread;
};

coordinator::coordinator(coordinator_options opts, coordinator_callbacks callbacks)
    : impl_(std::make_unique<impl>(std::move(opts), std::move(callbacks))) {}
coordinator::~coordinator() {
  stop();
}

connection_state coordinator::state() const {
  return impl_->io.state();
}

bool coordinator::wait_for(connection_state s, std::chrono::milliseconds timeout) const {
  return impl_->io.wait_for(s, timeout);
}

std::uint64_t coordinator::session() const {
  return impl_->io.token();
}

std::uint64_t coordinator::welcomes() const {
  return impl_->io.welcomes();
}

std::string coordinator::last_error() const {
  return impl_->io.last_error();
}

std::optional<submit_result> coordinator::submit(const task_spec& t,
                                                 std::chrono::milliseconds timeout) {
  if (t.kind != role::collector && t.kind != role::learner)
    throw std::invalid_argument("a task's kind is collector or learner");
  {
    std::lock_guard lock(impl_->io.mu());
    impl_->acks.erase(t.task_id);
    impl_->submitting[t.task_id] = t.kind;
  }
  impl_->post(codec::submit{t.task_id, t.kind, t.task_info, t.requirements, t.start_timeout_ms,
                            t.step_timeout_ms, t.close_timeout_ms, t.task_timeout_ms,
                            t.max_attempts, t.policy_id, t.queue_timeout_ms});
  std::unique_lock lock(impl_->io.mu());
  if (!impl_->changed.wait_for(lock, timeout, [&] { return impl_->acks.count(t.task_id) != 0; }))
    return std::nullopt;
  const auto ack = impl_->acks.at(t.task_id);
  impl_->acks.erase(t.task_id);
  return submit_result{ack.accepted, ack.code, ack.reason, ack.queued};
}

void coordinator::cancel(const std::string& task_id, const std::string& reason) {
  impl_->post(codec::cancel{task_id, reason});
}

void coordinator::finish(const std::string& task_id) {
  {
    std::lock_guard lock(impl_->io.mu());
    const auto it = impl_->open.find(task_id);
    if (it != impl_->open.end() && !it->second.running) {
      it->second.finish_asked = true;  // sent once the stream says the attempt runs
      return;
    }
  }
  impl_->post(codec::finish{task_id});
}

std::size_t coordinator::open_tasks() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->open.size();
}

std::uint64_t coordinator::stream_gaps() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->stream.gaps();
}

std::uint64_t coordinator::data_lost() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->data_lost;
}

std::uint64_t coordinator::collectors() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->collectors;
}

std::uint64_t coordinator::learners() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->learners;
}

std::uint64_t coordinator::stream_replays() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->stream.replays();
}

std::uint64_t coordinator::stream_duplicates() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->stream.duplicates();
}

void coordinator::stop() {
  if (impl_) impl_->stop();
}

}  // namespace rlbus
