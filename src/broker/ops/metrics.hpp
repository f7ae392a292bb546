// The broker's counters: the atomics its loop counts in (server_counters), the `metrics` object
// that holds them with what the loop hands over at each turn and status tick (read from a
// const view of the broker), the snapshot any thread may take of them (stats), and that
// snapshot in the Prometheus text exposition format (version 0.0.4): what an operator graphs
// and alerts on, every family with its HELP and TYPE.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "broker/bus/topic_bus.hpp"
#include "broker/group/replicator.hpp"
#include "broker/ops/histogram.hpp"
#include "broker/ops/series.hpp"
#include "util/send_meter.hpp"

namespace rlbus::broker {

struct broker_view;  // ops/view.hpp

/// Counters a person watching the broker cares about. A snapshot; values only grow,
/// except `peers`.
struct stats {
  std::uint64_t peers = 0;           // live sessions
  std::uint64_t messages_in = 0;     // messages received on the ROUTER
  std::uint64_t messages_out = 0;    // messages sent on the ROUTER
  std::uint64_t faults = 0;          // messages refused with ERROR (any peer)
  std::uint64_t unroutable = 0;      // replies that could not be delivered
  std::uint64_t over_bytes = 0;      // of those, past max-connection-bytes or memory-budget
  std::uint64_t stalled_cut = 0;     // connections cut for not reading (SPEC §15.5)
  std::uint64_t fault_cut = 0;       // connections cut for faults without a session (§10.4)
  std::uint64_t hoarding_cut = 0;    // connections cut for bytes that made no whole message
                                     // (§10.5)
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
  std::uint64_t nodes = 0;           // live sessions of role bus (SPEC §17)
  std::uint64_t coordinators = 0;    // live coordinator sessions (the rest of `peers`)
  bool draining = false;             // a stop was requested; waiting for running tasks
  bool standby = false;              // a broker of a group that does not lead: it serves no peer
  std::uint64_t stream_replays = 0;  // REPLAYs served (SPEC §12.9)
  std::uint64_t stream_resent = 0;   // TASK_EVENTs sent again (replays)
  std::uint64_t stream_lost = 0;     // events reported gone with STREAM_GAP
  std::uint64_t ring_bytes = 0;      // event bodies all stream rings hold now
  std::uint64_t ring_drops = 0;      // events dropped from rings past half the memory budget
  // reliable data (SPEC §12.11)
  std::uint64_t data_duplicates = 0;    // indexed DATA already relayed, dropped (resends)
  std::uint64_t data_out_of_order = 0;  // indexed DATA past relayed + 1, dropped (a gap)
  std::uint64_t data_lost = 0;          // DATA a collector declared lost (DATA_LOST)
  // collected data: items relayed (a batch's new items each), and of those that name their
  // task's policy version, how many and how many versions in all they trailed the newest
  std::uint64_t data_items = 0, data_lag_items = 0, data_lag_versions = 0;
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
  std::uint64_t connections_bounced = 0;   // cut at accept: a cut connection's messages on its
                                           // descriptor were not all read yet; it connects again
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
  // the topic bus (SPEC §17), as of the last status tick: its counts, the busiest topics and
  // the nodes that lag most (most bytes queued)
  bus_counts bus;
  std::vector<topic_stats> bus_topics;
  std::vector<node_stats> bus_lag;
  // a group's leader, as of the last status tick: the standbys copying its journal (§14.10)
  std::vector<replicator::standby_state> standbys;
};

/// What the broker loop counts as it goes, in atomics any thread may read (see stats).
struct server_counters {
  std::atomic<std::uint64_t> peers{0}, messages_in{0}, messages_out{0}, faults{0}, unroutable{0},
      over_bytes{0}, stalled_cut{0}, fault_cut{0}, hoarding_cut{0}, cut_hellos{0},
      refused_hellos{0}, expired{0}, events{0}, tasks_queued{0}, tasks_running{0},
      tasks_finished{0}, tasks_failed{0}, tasks_requeued{0}, stale{0}, collectors{0}, learners{0},
      replays{0}, resent{0}, lost{0}, ring_bytes{0}, ring_drops{0}, data_duplicates{0},
      data_out_of_order{0}, data_lost{0}, data_items{0}, data_lag_items{0}, data_lag_versions{0},
      events_unheard{0}, quarantined{0}, quarantines{0}, orphaned{0}, adoptions{0}, restored{0},
      journal_torn{0}, journal_records{0}, journal_bytes{0}, journal_fsyncs{0},
      journal_compactions{0}, connections{0}, admitted{0}, refused_key{0}, refused_subscriber{0},
      refused_address{0}, refused_connections{0}, bounced{0}, refused_unauthorized{0},
      refused_role_limit{0}, refused_task_limit{0}, revoked{0}, allowlist_reloads{0},
      allowlist_errors{0}, unanswered{0}, nodes{0};
  std::atomic<bool> draining{false};
  std::array<std::atomic<std::uint64_t>, 256> received_by_type{}, sent_by_type{};
  std::array<std::atomic<std::uint64_t>, 200> errors_by_code{};
};

/// The broker's counters and what its loop hands over. The loop counts in counters() as it
/// goes and calls store() at a turn's end and tick() at a status tick; snapshot() is
/// thread-safe (the metrics endpoint takes it from its own thread).
class metrics {
 public:
  /// What snapshot() reads live: histograms and a meter whose reads are thread-safe.
  metrics(const histogram& assignment_latency, const histogram& task_duration,
          const util::send_meter& meter)
      : assignment_(assignment_latency), duration_(task_duration), meter_(meter) {}

  [[nodiscard]] server_counters& counters() noexcept { return counters_; }
  [[nodiscard]] const server_counters& counters() const noexcept { return counters_; }
  /// What the broker's parts count, into the atomics (the loop's thread).
  void store(const broker_view& v);
  /// The lists a snapshot carries, as of now: queued shapes, policies, the bus's busiest
  /// topics and laggards (at most `labelled` each), the standbys (the loop's thread).
  void tick(const broker_view& v, std::size_t labelled);
  /// Thread-safe.
  [[nodiscard]] stats snapshot() const;
  /// The last 15 minutes, a sample a second, taken at the ticks (thread-safe).
  [[nodiscard]] const series& recent() const noexcept { return recent_; }

 private:
  const histogram& assignment_;
  const histogram& duration_;
  const util::send_meter& meter_;
  server_counters counters_;
  mutable std::mutex ticked_mu_;  // the lists are not atomics
  std::vector<std::pair<std::string, std::uint64_t>> shapes_, policies_;
  bus_counts bus_;
  std::vector<topic_stats> topics_;
  std::vector<node_stats> lag_;
  std::vector<replicator::standby_state> standbys_;
  series recent_;
};

/// The exposition of one snapshot. Metric names start `rlbus_`; counters end `_total`.
std::string prometheus_text(const stats& s);

}  // namespace rlbus::broker
