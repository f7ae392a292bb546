// The broker: one event loop that owns the ROUTER (peers) and the PUB (events) sockets.
//
// A connection's life, in the order server.cpp handles it: frames arrive on the ROUTER ->
// the header is checked -> an unknown connection may only say HELLO -> the body is decoded
// under limits -> HELLO makes a session (or resumes one, or is refused) -> every later
// message refreshes the session's liveness -> DISCONNECT or expiry ends it, with an event.
// Faults from peers never throw: they are answered with ERROR and counted.
//
// Stopping (SPEC §11) is a drain, then a stop: the first request_stop() closes the broker to
// new sessions and tasks and lets running tasks end on their own for up to drain_ms; when
// they have all ended, the drain runs out or request_stop() comes again, what is left is
// aborted, every peer is told DISCONNECT 503 and run() returns.
//
// Threads: construct anywhere (binding happens in the constructor, so endpoints are known
// at once); run() on exactly one thread, which then owns both sockets; request_stop() and
// stats() from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "broker/bus/topic_bus.hpp"
#include "broker/core/config.hpp"
#include "broker/core/event_bus.hpp"
#include "broker/core/gatekeeper.hpp"
#include "broker/core/peer_table.hpp"
#include "broker/durability/journal.hpp"
#include "broker/group/replicator.hpp"
#include "broker/ops/histogram.hpp"
#include "broker/ops/loop_queries.hpp"
#include "broker/ops/metrics.hpp"
#include "broker/ops/operations.hpp"
#include "broker/ops/view.hpp"
#include "broker/tasks/task_manager.hpp"
#include "broker/tasks/task_sink.hpp"
#include "codec/messages.hpp"
#include "util/wake_pipe.hpp"

namespace rlbus::broker {

class server : private task_sink, private bus_sink, private ops_levers {
 public:
  /// Validates `cfg`, binds both endpoints. Throws std::invalid_argument for a bad config
  /// and zmq::error_t when an endpoint cannot be bound.
  server(zmq::context_t& ctx, config cfg);
  ~server() override;
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// The endpoints actually bound (a "*" port resolved to the real one).
  [[nodiscard]] std::string router_endpoint() const { return router_endpoint_; }
  [[nodiscard]] std::string events_endpoint() const { return events_endpoint_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

  /// Serves until stopped (see above), then says DISCONNECT to every peer and returns.
  void run();
  /// The first call starts the drain; a second one ends it at once. Thread-safe and
  /// async-signal-safe (a signal handler calls it once per signal).
  void request_stop() noexcept;
  /// Reads the allowlist again (SIGHUP). Thread-safe and async-signal-safe.
  void request_reload() noexcept;
  /// The broker's CURVE public key, "" in plain mode.
  [[nodiscard]] std::string public_key() const { return gate_.public_key(); }
  /// Thread-safe snapshot of the counters.
  [[nodiscard]] stats snapshot() const { return metrics_.snapshot(); }
  /// The last 15 minutes of the counters, a sample a second (thread-safe).
  [[nodiscard]] const series& recent() const noexcept { return metrics_.recent(); }
  /// Any thread but the loop's: the answers of the read-only OPS verbs (status, workers,
  /// tasks, topics) to `questions`, as an operator would get them, from the loop between two
  /// turns; nullopt when the loop does not answer within `timeout` (busy, or not running).
  std::optional<std::vector<codec::blob>> ask(std::vector<codec::ops> questions,
                                              std::chrono::milliseconds timeout) {
    return queries_.ask(std::move(questions), timeout);
  }

  /// The leader of a group of brokers (cluster/elector.hpp) serves only until `until()`, which
  /// the group's election moves on. Past it the broker sends nothing more, not even a
  /// DISCONNECT, and run() returns at once: another broker of the group may be serving by
  /// then. `leader_epoch` is the leadership's epoch, named in every WELCOME. With a journal
  /// and a `replication` endpoint, the broker streams its journal to the group's standbys
  /// there and sends a peer nothing before every standby in sync holds what it depends on
  /// (SPEC §14.10). Before run().
  /// `replication.endpoint` empty: none. Its epoch, sync timeout and message bound are the
  /// broker's.
  void fence(std::function<util::time_point()> until, std::uint64_t leader_epoch,
             replicator_config replication = {});
  /// The standbys that copy this leader's journal (empty without replication).
  [[nodiscard]] std::vector<replicator::standby_state> standbys() const;
  /// Whether run() returned for its fence.
  [[nodiscard]] bool fenced() const noexcept { return fenced_; }

 private:
  /// Whether the fence has been passed (reads the clock when there is one).
  bool past_fence();
  // task_sink: how the task manager reaches peers and subscribers.
  bool send_to(std::string_view peer_id, const codec::message& m) override;
  bool send_encoded(std::string_view peer_id, codec::msg_type type,
                    const util::shared_frame& body) override;
  void publish(std::string_view topic, decltype(codec::event::body) body) override;
  bool wanted(std::string_view topic) override { return events_.wanted(topic); }
  [[nodiscard]] std::size_t queued_bytes() const override { return meter_.total(); }
  // bus_sink: how the topic bus reaches its nodes.
  bool send_bus(std::string_view peer_id, const codec::message& m) override {
    return send_to(peer_id, m);
  }
  bool send_delivery(std::string_view peer_id, const codec::deliver& d,
                     const payload_ref& payload) override;
  /// A message of the topic bus (SPEC §17) from session `p`; `payload` is PUBLISH's frame.
  void on_bus(std::string_view routing_id, peer& p, std::uint8_t type, std::string_view body,
              zmq::message_t* payload);
  /// `orderly`: the peer said DISCONNECT itself (a coordinator's tasks end at once, §12.5.8).
  void session_over(const peer& p, util::time_point now, bool orderly = false);
  /// What operations and metrics read of the broker (the loop's thread).
  [[nodiscard]] broker_view view() const;
  codec::blob answer_query(const codec::ops& op);
  /// What the task manager, the gatekeeper and the journal count, into the atomics that
  /// snapshot() reads.
  void store_counters() { metrics_.store(view()); }
  void open_journal();
  std::function<util::time_point()> fence_;
  bool fenced_ = false;
  std::optional<std::uint64_t> leader_epoch_;  // leading a group (SPEC §14.9)
  void compact_journal();

  void drain_router();
  void on_frames(zmq::message_t* frames, std::size_t count, bool overflow, util::time_point now);
  void on_hello(const std::string& routing_id, peer* current, codec::hello&& h, std::string key,
                util::time_point now);
  /// Why `key` may not make this HELLO (SPEC §15.3), or nullopt when it may.
  std::optional<std::string> hello_forbidden(const codec::hello& h, const std::string& key) const;
  void reload_allowlist();
  void forget_coordinator_keys();
  void on_disconnect(const peer& p, const codec::disconnect& d);
  /// Answers ERROR and counts it; with `strike`, it also counts against the peer's session.
  void fault(std::string_view routing_id, peer* p, codec::error_code code, std::string reason,
             std::optional<std::uint8_t> ref_type, bool strike = true);
  void refuse_hello(std::string_view routing_id, codec::error_code code, std::string reason);
  void count_error(codec::error_code code);
  /// An OPS (SPEC §16): checked against the connection's key, answered by ops_.
  void on_ops(std::string_view routing_id, peer* p, zmq::message_t& body, util::time_point now);
  // ops_levers: what an operator changes.
  std::string evict(const std::string& id, util::time_point now) override;
  void set_drained(const std::string& id, bool drained, util::time_point now) override;
  void reconfigure(config next) override { cfg_ = std::move(next); }  // tasks_ reads cfg_
  bool counters_due_ = false;  // a task message is being handled: store before sending
  void end_session(const peer& p, codec::error_code code, std::string reason, bool lost);
  /// end_session (lost) and the session forgotten: for every caller but expiry, whose table
  /// erases the peer itself.
  void forget_session(const peer& p, codec::error_code code, std::string reason);
  bool send(std::string_view routing_id, const codec::message& m);
  // Holding back (SPEC §14.10): while a standby in sync lacks a record the journal wrote, what
  // the broker sends waits here, in order, with the position it depends on.
  struct held {
    std::uint64_t position = 0;
    std::vector<zmq::message_t> frames;  // routing id, header, body[, payload]
    std::optional<std::pair<std::string, decltype(codec::event::body)>> event;  // or this
  };
  [[nodiscard]] bool holding();
  /// A frame of the message being sent: to the ROUTER, or to the held message.
  void emit(zmq::message_t&& frame, bool more);
  /// Sends what every standby in sync now holds the records of.
  void release_held();
  /// At a stop: waits up to sync-timeout for the standbys to take what is held.
  void settle_held();
  /// What the task manager said of a task message: a refusal is answered and counted.
  void task_result(std::string_view routing_id, peer* p, std::optional<refusal> refused,
                   std::uint8_t type);
  /// Queues the routing id and the header of a message of `type` whose body is `body` bytes:
  /// the account the body is to be charged to, or nullptr (counted) when the connection
  /// cannot take it (gone, its queue full, or past its bytes or the budget); the body must
  /// follow.
  util::send_meter::account* send_head(std::string_view routing_id, codec::msg_type type,
                                       std::size_t body);
  void publish_status(util::time_point now);
  /// Sends CAPACITY to every coordinator and publishes capacity.<kind> (SPEC §12.10).
  void capacity_changed(const peer& worker, bool increase);
  void send_snapshot(const peer& coordinator);
  void begin_drain(util::time_point now);
  void shutdown(const std::string& reason);
  void cut_stalled(util::time_point now);

  zmq::context_t& ctx_;
  config cfg_;
  std::uint64_t epoch_;
  gatekeeper gate_;         // before the sockets it guards
  util::send_meter meter_;  // what the router's queues hold, by connection (SPEC §15.5)
  struct {
    std::string routing_id;  // the connection of the message being handled
    int fd = -1;             // and its descriptor
  } from_;
  zmq::socket_t router_;
  event_bus events_;
  std::string router_endpoint_;
  std::string events_endpoint_;
  util::wake_pipe wake_;
  loop_queries queries_{[this] { wake_.notify(); }};
  std::atomic<unsigned> stop_requests_{0};
  std::atomic<unsigned> reload_requests_{0};
  unsigned reloads_done_ = 0;
  bool draining_ = false;
  util::time_point drain_end_{};
  peer_table peers_;
  std::unique_ptr<journal> journal_;  // outlives tasks_, which writes to it
  task_manager tasks_;
  topic_bus bus_;
  metrics metrics_{tasks_.assignment_latency(), tasks_.task_duration(), meter_};
  server_counters& counters_ = metrics_.counters();
  operations ops_;
  util::time_point started_;
  util::time_point next_status_;
  msgpack::sbuffer out_;
  std::uint64_t last_serial_ = 0;
  std::uint64_t live_workers_[2] = {0, 0};  // collectors, learners (SPEC §12.10.1)
  std::uint64_t live_nodes_ = 0;            // sessions of role bus (SPEC §17.9)
  std::set<std::string> coordinators_;      // ids of live coordinator sessions
  // The key each coordinator id last had a session with: tasks it left for adoption go only
  // to a session of the same key (§15.3). Dropped once nothing is left to adopt.
  std::map<std::string, std::string> coordinator_keys_;
  // ERRORs sent to connections that have no session, by routing id (bounded: see fault()).
  std::unordered_map<std::string, std::uint32_t> unintroduced_;
  // The journal's stream to the standbys, and what waits for them: declared last, so gone
  // before the journal it taps and the gatekeeper that watches its socket.
  std::unique_ptr<replicator> repl_;
  std::deque<held> held_;
  bool held_open_ = false;                    // the last held message still takes frames
  std::vector<std::string> handing_over_to_;  // stopped with standbys in sync: who may lead
};

/// Runs a server on a thread of its own: started by the constructor, stopped and joined by
/// the destructor. For tests and for embedding the broker in another process.
class server_thread {
 public:
  explicit server_thread(config cfg);
  ~server_thread();
  server_thread(const server_thread&) = delete;
  server_thread& operator=(const server_thread&) = delete;

  [[nodiscard]] server& get() noexcept { return *server_; }
  /// Stops the loop and waits for it; idempotent.
  void stop();

 private:
  zmq::context_t ctx_;
  std::unique_ptr<server> server_;
  std::thread thread_;
};

}  // namespace rlbus::broker
