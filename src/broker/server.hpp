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
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "broker/config.hpp"
#include "broker/event_bus.hpp"
#include "broker/gatekeeper.hpp"
#include "broker/histogram.hpp"
#include "broker/journal.hpp"
#include "broker/peer_table.hpp"
#include "broker/task_manager.hpp"
#include "codec/messages.hpp"
#include "util/wake_pipe.hpp"

namespace rlbus::broker {

/// Counters a person watching the broker cares about. A snapshot; values only grow,
/// except `peers`.
struct stats {
  std::uint64_t peers = 0;           // live sessions
  std::uint64_t messages_in = 0;     // messages received on the ROUTER
  std::uint64_t messages_out = 0;    // messages sent on the ROUTER
  std::uint64_t faults = 0;          // messages refused with ERROR (any peer)
  std::uint64_t unroutable = 0;      // replies that could not be delivered
  std::uint64_t over_bytes = 0;      // of those, past max-connection-bytes or memory-budget
  std::uint64_t cut_hellos = 0;      // HELLOs of connections cut at accept: never served
  std::uint64_t queued_bytes = 0;    // held in the send queues now (SPEC §15.5)
  std::uint64_t refused_hellos = 0;  // HELLOs answered with ERROR
  std::uint64_t expired = 0;         // sessions ended by silence
  std::uint64_t events = 0;          // events made (published or unheard)
  std::uint64_t events_unheard = 0;  // events no subscriber asked for: never sent
  std::uint64_t tasks_queued = 0;    // tasks waiting for a worker
  std::uint64_t tasks_running = 0;   // tasks on a worker
  std::uint64_t tasks_finished = 0;
  std::uint64_t tasks_failed = 0;    // failed for good (max attempts)
  std::uint64_t tasks_requeued = 0;  // attempts that ended and went back to the queue
  std::uint64_t stale_messages = 0;  // worker messages of an attempt that had ended
  std::uint64_t collectors = 0;      // live collector sessions
  std::uint64_t learners = 0;        // live learner sessions
  std::uint64_t coordinators = 0;    // live coordinator sessions (the rest of `peers`)
  bool draining = false;             // a stop was requested; waiting for running tasks
  std::uint64_t stream_replays = 0;  // REPLAYs served (SPEC §12.9)
  std::uint64_t stream_resent = 0;   // TASK_EVENTs sent again (replays)
  std::uint64_t stream_lost = 0;     // events reported gone with STREAM_GAP
  std::uint64_t ring_bytes = 0;      // event bodies all stream rings hold now
  std::uint64_t ring_drops = 0;      // events dropped from rings past half the memory budget
  // reliable data (SPEC §12.11)
  std::uint64_t data_duplicates = 0;    // indexed DATA already relayed, dropped (resends)
  std::uint64_t data_out_of_order = 0;  // indexed DATA past relayed + 1, dropped (a gap)
  std::uint64_t data_lost = 0;          // DATA a collector declared lost (DATA_LOST)
  // quarantine (SPEC §12.6.9)
  std::uint64_t workers_quarantined = 0;  // workers in quarantine now
  std::uint64_t quarantines = 0;          // quarantines begun
  // coordinator grace (SPEC §12.5.8)
  std::uint64_t coordinators_orphaned = 0;  // vanished coordinators whose tasks are kept now
  std::uint64_t coordinator_adoptions = 0;  // new sessions that took such tasks over
  // journal (SPEC §14)
  std::uint64_t tasks_restored = 0;   // live tasks the journal held at start
  std::uint64_t journal_torn = 0;     // 1 when its last record was cut short (skipped)
  std::uint64_t journal_records = 0;  // records written since start (compactions too)
  std::uint64_t journal_bytes = 0;    // bytes handed to the kernel since start
  std::uint64_t journal_fsyncs = 0;
  std::uint64_t journal_compactions = 0;  // the one at start included
  // security and limits (SPEC §15)
  std::uint64_t connections = 0;           // live connections, both sockets
  std::uint64_t connections_admitted = 0;  // let in by the ZAP handler
  std::uint64_t refused_key = 0;           // connections: key not in the allowlist
  std::uint64_t refused_subscriber = 0;    // event connections: key may not subscribe
  std::uint64_t refused_address = 0;       // connections past max-connections-per-address
  std::uint64_t refused_connections = 0;   // connections past max-connections
  std::uint64_t refused_unauthorized = 0;  // HELLOs the key may not make (431)
  std::uint64_t refused_role_limit = 0;    // HELLOs past a role's session limit (503)
  std::uint64_t refused_task_limit = 0;    // SUBMITs past max-tasks-per-coordinator (416)
  std::uint64_t sessions_revoked = 0;      // sessions ended because their key was revoked
  std::uint64_t allowlist_reloads = 0;
  std::uint64_t allowlist_errors = 0;   // reloads refused: the old allowlist stayed
  std::uint64_t faults_unanswered = 0;  // bad messages of a sessionless connection past its
                                        // 256th: counted, no longer answered (SPEC §10.4)
  // per message type (by its id) and per ERROR code (400..599, by code - 400)
  std::array<std::uint64_t, 256> received_by_type{};
  std::array<std::uint64_t, 256> sent_by_type{};
  std::array<std::uint64_t, 200> errors_by_code{};
  // queued -> assigned, each attempt; attempt start -> RESULT, each finished attempt
  histogram_counts assignment_latency, task_duration;
  // as of the last status tick: queued tasks by requirements ("" none), policies' versions
  std::vector<std::pair<std::string, std::uint64_t>> queued_by_shape, policy_versions;
};

class server : private task_sink {
 public:
  /// Validates `cfg`, binds both endpoints. Throws std::invalid_argument for a bad config
  /// and zmq::error_t when an endpoint cannot be bound.
  server(zmq::context_t& ctx, config cfg);
  ~server();
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
  [[nodiscard]] stats snapshot() const;

 private:
  struct counters {
    std::atomic<std::uint64_t> peers{0}, messages_in{0}, messages_out{0}, faults{0}, unroutable{0},
        over_bytes{0}, cut_hellos{0}, refused_hellos{0}, expired{0}, events{0}, tasks_queued{0},
        tasks_running{0}, tasks_finished{0}, tasks_failed{0}, tasks_requeued{0}, stale{0},
        collectors{0}, learners{0}, replays{0}, resent{0}, lost{0}, ring_bytes{0}, ring_drops{0},
        data_duplicates{0}, data_out_of_order{0}, data_lost{0}, events_unheard{0}, quarantined{0},
        quarantines{0}, orphaned{0}, adoptions{0}, restored{0}, journal_torn{0}, journal_records{0},
        journal_bytes{0}, journal_fsyncs{0}, journal_compactions{0}, connections{0}, admitted{0},
        refused_key{0}, refused_subscriber{0}, refused_address{0}, refused_connections{0},
        refused_unauthorized{0}, refused_role_limit{0}, refused_task_limit{0}, revoked{0},
        allowlist_reloads{0}, allowlist_errors{0}, unanswered{0};
    std::atomic<bool> draining{false};
    std::array<std::atomic<std::uint64_t>, 256> received_by_type{}, sent_by_type{};
    std::array<std::atomic<std::uint64_t>, 200> errors_by_code{};
  };

  // task_sink: how the task manager reaches peers and subscribers.
  bool send_to(std::string_view peer_id, const codec::message& m) override;
  bool send_encoded(std::string_view peer_id, codec::msg_type type,
                    const util::shared_frame& body) override;
  void publish(std::string_view topic, decltype(codec::event::body) body) override;
  bool wanted(std::string_view topic) override { return events_.wanted(topic); }
  [[nodiscard]] std::size_t queued_bytes() const override { return meter_.total(); }
  /// `orderly`: the peer said DISCONNECT itself (a coordinator's tasks end at once, §12.5.8).
  void session_over(const peer& p, util::time_point now, bool orderly = false);
  void store_counters();
  void open_journal();
  void compact_journal();

  void drain_router(util::time_point now);
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
  // operations (SPEC §16), in operations.cpp
  void on_ops(std::string_view routing_id, peer* p, zmq::message_t& body, util::time_point now);
  std::variant<codec::blob, refusal> ops_answer(const codec::ops& op, util::time_point now);
  [[nodiscard]] codec::blob ops_status(util::time_point now) const;
  struct change {  // a setting an operator changed (§16.5)
    std::string key, value, was;
    util::time_point at;
  };
  std::deque<change> changes_;  // the last ops_changes_kept
  std::uint64_t changes_total_ = 0;
  bool counters_due_ = false;  // a task message is being handled: store before sending
  // What the loop hands the metrics endpoint at each status tick (not in atomics: lists).
  mutable std::mutex ticked_mu_;
  std::vector<std::pair<std::string, std::uint64_t>> ticked_shapes_, ticked_policies_;
  void end_session(const peer& p, codec::error_code code, std::string reason, bool lost);
  /// end_session (lost) and the session forgotten: for every caller but expiry, whose table
  /// erases the peer itself.
  void forget_session(const peer& p, codec::error_code code, std::string reason);
  bool send(std::string_view routing_id, const codec::message& m);
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

  config cfg_;
  std::uint64_t epoch_;
  gatekeeper gate_;         // before the sockets it guards
  util::send_meter meter_;  // what the router's queues hold, by connection (SPEC §15.5)
  zmq::socket_t router_;
  event_bus events_;
  std::string router_endpoint_;
  std::string events_endpoint_;
  util::wake_pipe wake_;
  std::atomic<unsigned> stop_requests_{0};
  std::atomic<unsigned> reload_requests_{0};
  unsigned reloads_done_ = 0;
  bool draining_ = false;
  util::time_point drain_end_{};
  peer_table peers_;
  std::unique_ptr<journal> journal_;  // outlives tasks_, which writes to it
  task_manager tasks_;
  counters counters_;
  util::time_point started_;
  util::time_point next_status_;
  msgpack::sbuffer out_;
  std::uint64_t last_serial_ = 0;
  std::uint64_t live_workers_[2] = {0, 0};  // collectors, learners (SPEC §12.10.1)
  std::set<std::string> coordinators_;      // ids of live coordinator sessions
  // The key each coordinator id last had a session with: tasks it left for adoption go only
  // to a session of the same key (§15.3). Dropped once nothing is left to adopt.
  std::map<std::string, std::string> coordinator_keys_;
  // ERRORs sent to connections that have no session, by routing id (bounded: see fault()).
  std::unordered_map<std::string, std::uint32_t> unintroduced_;
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
