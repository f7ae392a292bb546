// See metrics.hpp.
#include "broker/ops/metrics.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>

#include <fmt/format.h>

#include "broker/ops/view.hpp"
#include "codec/protocol.hpp"

namespace rlbus::broker {

namespace {

// A label value as the exposition format writes it: \\, \" and \n escaped.
std::string escaped(std::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

class exposition {
 public:
  /// A family of one sample.
  void one(std::string_view name, std::string_view type, std::string_view help,
           std::uint64_t value) {
    head(name, type, help);
    fmt::format_to(std::back_inserter(out_), "{} {}\n", name, value);
  }
  void head(std::string_view name, std::string_view type, std::string_view help) {
    fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name,
                   type);
  }
  void sample(std::string_view name, std::string_view label, std::string_view value_of_label,
              std::uint64_t value) {
    fmt::format_to(std::back_inserter(out_), "{}{{{}=\"{}\"}} {}\n", name, label, value_of_label,
                   value);
  }
  void histogram(std::string_view name, std::string_view help, const histogram_counts& h) {
    head(name, "histogram", help);
    for (std::size_t i = 0; i < histogram_bounds.size(); ++i)
      fmt::format_to(std::back_inserter(out_), "{}_bucket{{le=\"{}\"}} {}\n", name,
                     histogram_bounds[i], h.at_most[i]);
    fmt::format_to(std::back_inserter(out_),
                   "{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, h.count, name,
                   h.sum_seconds, name, h.count);
  }
  /// A summary without quantiles: how many observations, and their sum.
  void summary(std::string_view name, std::string_view help, std::uint64_t count,
               std::uint64_t sum) {
    head(name, "summary", help);
    fmt::format_to(std::back_inserter(out_), "{}_sum {}\n{}_count {}\n", name, sum, name, count);
  }
  /// One sample per (label value, value) pair.
  void labelled(std::string_view name, std::string_view type, std::string_view help,
                std::string_view label,
                const std::vector<std::pair<std::string, std::uint64_t>>& values) {
    head(name, type, help);
    for (const auto& [v, n] : values) sample(name, label, escaped(v), n);
  }
  std::string done() { return std::move(out_); }

 private:
  std::string out_;
};

// A message type's label: its name in the SPEC, or its id for one this broker does not know.
std::string type_label(std::size_t type) {
  if (auto name = codec::type_name(static_cast<std::uint8_t>(type))) return std::string(*name);
  return fmt::format("0x{:02x}", type);
}

void by_type(exposition& e, std::string_view name, std::string_view help,
             const std::array<std::uint64_t, 256>& counts) {
  e.head(name, "counter", help);
  for (std::size_t t = 0; t < counts.size(); ++t)
    if (counts[t] != 0) e.sample(name, "type", type_label(t), counts[t]);
}

// The topic bus (SPEC §17), as of the last status tick. Topics and node ids are the peers'
// to name: at most the busiest topics and the laggiest nodes the tick kept get a label.
void bus_families(exposition& e, const stats& s) {
  const auto& b = s.bus;
  e.one("rlbus_bus_subscriptions", "gauge", "subscriptions the nodes of the bus hold",
        b.subscriptions);
  e.one("rlbus_bus_published_total", "counter", "publications (and fragments) the bus took",
        b.published);
  e.one("rlbus_bus_published_bytes_total", "counter", "payload bytes the bus took",
        b.published_bytes);
  e.one("rlbus_bus_delivered_total", "counter", "deliveries queued to nodes", b.delivered);
  e.one("rlbus_bus_dropped_total", "counter",
        "deliveries dropped by a bound (bus-queue-bytes, bus-memory) or a stall, reported as gaps",
        b.dropped);
  e.one("rlbus_bus_stalls_total", "counter",
        "nodes found holding publishers back without acknowledging for bus-stall-timeout",
        b.stalls);
  e.one("rlbus_bus_stalled_nodes", "gauge",
        "nodes stalled now (holding no one back until they acknowledge)", b.stalled);
  e.one("rlbus_bus_gaps_total", "counter", "BUS_GAP messages sent", b.gaps);
  e.one("rlbus_bus_resent_total", "counter", "deliveries sent again after a resumption", b.resent);
  e.one("rlbus_bus_duplicates_total", "counter", "PUBLISH copies dropped (already taken)",
        b.duplicates);
  e.one("rlbus_bus_abandoned_total", "counter",
        "fragmented publications cut short by the end of their publisher's session", b.abandoned);
  e.one("rlbus_bus_held_back", "gauge", "publishers waiting for credit now", b.held_back);
  e.one("rlbus_bus_queued_bytes", "gauge",
        "bytes the bus holds (publications once, queue entries each), against bus-memory",
        b.queued_bytes);
  e.one("rlbus_bus_retained", "gauge", "topics with a retained value", b.retained);
  e.one("rlbus_bus_retained_bytes", "gauge", "bytes of retained values", b.retained_bytes);
  e.one("rlbus_bus_retain_evicted_total", "counter",
        "retained values forgotten past bus-retain-bytes", b.retain_evicted);
  e.head("rlbus_bus_topic_messages_total", "counter", "publications by topic (the busiest)");
  for (const auto& t : s.bus_topics)
    e.sample("rlbus_bus_topic_messages_total", "topic", escaped(t.topic), t.messages);
  e.head("rlbus_bus_topic_bytes_total", "counter", "payload bytes by topic (the busiest)");
  for (const auto& t : s.bus_topics)
    e.sample("rlbus_bus_topic_bytes_total", "topic", escaped(t.topic), t.bytes);
  e.head("rlbus_bus_topic_subscribers", "gauge", "nodes a topic's publications go to now");
  for (const auto& t : s.bus_topics)
    e.sample("rlbus_bus_topic_subscribers", "topic", escaped(t.topic), t.subscribers);
  e.head("rlbus_bus_node_lag", "gauge",
         "deliveries a node has not acknowledged (the nodes that lag most)");
  for (const auto& n : s.bus_lag) e.sample("rlbus_bus_node_lag", "node", escaped(n.id), n.queued);
  e.head("rlbus_bus_node_lag_bytes", "gauge", "bytes a node has not acknowledged");
  for (const auto& n : s.bus_lag)
    e.sample("rlbus_bus_node_lag_bytes", "node", escaped(n.id), n.queued_bytes);
  e.head("rlbus_bus_node_dropped_total", "counter",
         "a node's deliveries dropped by a bound or a stall (the nodes that lag most)");
  for (const auto& n : s.bus_lag)
    e.sample("rlbus_bus_node_dropped_total", "node", escaped(n.id), n.dropped);
  e.head("rlbus_bus_node_stalled", "gauge",
         "1 while a node is stalled: it holds no publisher back until it acknowledges");
  for (const auto& n : s.bus_lag)
    e.sample("rlbus_bus_node_stalled", "node", escaped(n.id), n.stalled ? 1 : 0);
}

}  // namespace

std::string prometheus_text(const stats& s) {
  exposition e;
  by_type(e, "rlbus_messages_received_total", "messages received on the ROUTER, by type",
          s.received_by_type);
  by_type(e, "rlbus_messages_sent_total", "messages sent on the ROUTER, by type", s.sent_by_type);
  e.head("rlbus_errors_total", "counter", "messages refused with ERROR, by code");
  for (std::size_t i = 0; i < s.errors_by_code.size(); ++i)
    if (s.errors_by_code[i] != 0)
      e.sample("rlbus_errors_total", "code", std::to_string(400 + i), s.errors_by_code[i]);
  e.head("rlbus_peers", "gauge", "live sessions, by role");
  e.sample("rlbus_peers", "role", "collector", s.collectors);
  e.sample("rlbus_peers", "role", "learner", s.learners);
  e.sample("rlbus_peers", "role", "coordinator", s.coordinators);
  e.sample("rlbus_peers", "role", "bus", s.nodes);
  e.head("rlbus_tasks", "gauge", "live tasks, by state");
  e.sample("rlbus_tasks", "state", "queued", s.tasks_queued);
  e.sample("rlbus_tasks", "state", "running", s.tasks_running);
  e.one("rlbus_queue_depth", "gauge", "tasks waiting for a worker", s.tasks_queued);
  e.labelled("rlbus_queue_depth_by_requirements", "gauge",
             "tasks waiting for a worker, by the resources they require (\"\" none), as of "
             "the last status tick",
             "requirements", s.queued_by_shape);
  e.labelled("rlbus_policy_version", "gauge",
             "the latest version of each policy the broker holds, as of the last status tick",
             "policy", s.policy_versions);
  e.histogram("rlbus_assignment_latency_seconds",
              "time from a task's queueing to the start of its attempt, each attempt",
              s.assignment_latency);
  e.histogram("rlbus_task_duration_seconds",
              "time from the start of an attempt to its RESULT, each finished attempt",
              s.task_duration);
  e.one("rlbus_tasks_finished_total", "counter", "tasks that finished", s.tasks_finished);
  e.one("rlbus_tasks_failed_total", "counter", "tasks that failed for good (out of attempts)",
        s.tasks_failed);
  e.one("rlbus_tasks_requeued_total", "counter", "attempts that ended and went back to the queue",
        s.tasks_requeued);
  e.one("rlbus_stale_messages_total", "counter",
        "worker messages about an attempt that had ended, refused", s.stale_messages);
  e.one("rlbus_sessions_expired_total", "counter", "sessions ended by silence", s.expired);
  e.one("rlbus_faults_total", "counter", "messages refused with ERROR, any peer", s.faults);
  e.one("rlbus_unroutable_total", "counter", "messages that could not be delivered", s.unroutable);
  e.one("rlbus_over_bytes_total", "counter",
        "messages not sent: their connection, or all, held max-connection-bytes or memory-budget",
        s.over_bytes);
  e.one("rlbus_stalled_connections_cut_total", "counter",
        "connections cut for reading nothing for stalled-timeout while memory-budget ran short",
        s.stalled_cut);
  e.one("rlbus_fault_connections_cut_total", "counter",
        "connections cut for sending faults past the 256th without a session", s.fault_cut);
  e.one("rlbus_hoarding_connections_cut_total", "counter",
        "connections cut for sending more than their bound that made no whole message",
        s.hoarding_cut);
  e.one("rlbus_send_queue_bytes", "gauge", "bytes held in the send queues of all connections",
        s.queued_bytes);
  e.one("rlbus_events_total", "counter", "events made on the PUB (sent or unheard)", s.events);
  e.one("rlbus_events_unheard_total", "counter", "events no subscriber asked for",
        s.events_unheard);
  e.one("rlbus_stream_replays_total", "counter", "REPLAYs served", s.stream_replays);
  e.one("rlbus_stream_resent_total", "counter", "task events sent again", s.stream_resent);
  e.one("rlbus_stream_lost_total", "counter", "task events reported gone (STREAM_GAP)",
        s.stream_lost);
  e.one("rlbus_stream_ring_bytes", "gauge", "task event bytes the streams' rings hold",
        s.ring_bytes);
  e.one("rlbus_stream_ring_budget_drops_total", "counter",
        "task events dropped from a ring past its share of half the memory budget", s.ring_drops);
  e.one("rlbus_data_duplicates_total", "counter", "indexed DATA dropped as already relayed",
        s.data_duplicates);
  e.one("rlbus_data_out_of_order_total", "counter", "indexed DATA dropped past the next index",
        s.data_out_of_order);
  e.one("rlbus_data_lost_total", "counter", "DATA its collector declared lost", s.data_lost);
  e.one("rlbus_data_items_total", "counter",
        "collected data items relayed to coordinators (each item of a batch)", s.data_items);
  e.summary("rlbus_data_policy_lag",
            "versions a collected item trailed the newest of its task's policy when it came "
            "(items that name their version, of tasks whose policy the broker holds)",
            s.data_lag_items, s.data_lag_versions);
  e.one("rlbus_workers_quarantined", "gauge", "workers in quarantine", s.workers_quarantined);
  e.one("rlbus_quarantines_total", "counter", "quarantines begun", s.quarantines);
  e.one("rlbus_coordinators_orphaned", "gauge", "vanished coordinators whose tasks are kept",
        s.coordinators_orphaned);
  e.one("rlbus_journal_records_total", "counter", "journal records written", s.journal_records);
  e.one("rlbus_journal_bytes_total", "counter", "journal bytes written", s.journal_bytes);
  e.one("rlbus_journal_fsyncs_total", "counter", "journal fsyncs", s.journal_fsyncs);
  e.one("rlbus_connections", "gauge", "live connections, both sockets", s.connections);
  e.head("rlbus_connections_refused_total", "counter", "connections refused at the door, by why");
  e.sample("rlbus_connections_refused_total", "reason", "max_connections", s.refused_connections);
  e.sample("rlbus_connections_refused_total", "reason", "max_per_address", s.refused_address);
  e.sample("rlbus_connections_refused_total", "reason", "key", s.refused_key);
  e.sample("rlbus_connections_refused_total", "reason", "subscriber", s.refused_subscriber);
  e.sample("rlbus_connections_refused_total", "reason", "descriptor_unread", s.connections_bounced);
  e.one("rlbus_allowlist_errors_total", "counter", "allowlist reloads refused", s.allowlist_errors);
  e.one("rlbus_draining", "gauge", "1 while the broker drains before it stops", s.draining ? 1 : 0);
  e.one("rlbus_standby", "gauge", "1 while the broker stands by for its group's leader",
        s.standby ? 1 : 0);
  // A group's leader: each standby that copies its journal (SPEC §14.10).
  e.head("rlbus_replication_in_sync", "gauge",
         "1 while a standby holds everything the leader wrote and is waited for");
  for (const auto& b : s.standbys)
    e.sample("rlbus_replication_in_sync", "member", escaped(b.member), b.in_sync ? 1 : 0);
  e.head("rlbus_replication_lag_bytes", "gauge",
         "bytes of journal records the leader wrote that a standby does not hold yet");
  for (const auto& b : s.standbys)
    e.sample("rlbus_replication_lag_bytes", "member", escaped(b.member), b.lag);
  bus_families(e, s);
  return e.done();
}

// ---- the snapshot -----------------------------------------------------------------------

stats metrics::snapshot() const {
  const auto& c = counters_;
  stats s;
  for (std::size_t i = 0; i < s.received_by_type.size(); ++i) {
    s.received_by_type[i] = c.received_by_type[i].load(std::memory_order_relaxed);
    s.sent_by_type[i] = c.sent_by_type[i].load(std::memory_order_relaxed);
  }
  for (std::size_t i = 0; i < s.errors_by_code.size(); ++i)
    s.errors_by_code[i] = c.errors_by_code[i].load(std::memory_order_relaxed);
  {
    const std::lock_guard lock(ticked_mu_);
    s.queued_by_shape = shapes_;
    s.policy_versions = policies_;
    s.bus = bus_;
    s.bus_topics = topics_;
    s.bus_lag = lag_;
    s.standbys = standbys_;
  }
  s.assignment_latency = assignment_.counts();
  s.task_duration = duration_.counts();
  s.peers = c.peers.load();
  s.messages_in = c.messages_in.load();
  s.messages_out = c.messages_out.load();
  s.faults = c.faults.load();
  s.unroutable = c.unroutable.load();
  s.over_bytes = c.over_bytes.load();
  s.stalled_cut = c.stalled_cut.load();
  s.fault_cut = c.fault_cut.load();
  s.hoarding_cut = c.hoarding_cut.load();
  s.cut_hellos = c.cut_hellos.load();
  s.queued_bytes = meter_.total();
  s.refused_hellos = c.refused_hellos.load();
  s.expired = c.expired.load();
  s.events = c.events.load();
  s.events_unheard = c.events_unheard.load();
  s.tasks_queued = c.tasks_queued.load();
  s.tasks_running = c.tasks_running.load();
  s.tasks_finished = c.tasks_finished.load();
  s.tasks_failed = c.tasks_failed.load();
  s.tasks_requeued = c.tasks_requeued.load();
  s.stale_messages = c.stale.load();
  s.collectors = c.collectors.load();
  s.learners = c.learners.load();
  s.nodes = c.nodes.load();
  // Read apart from `peers`, the other counts may pass it for a moment.
  s.coordinators = s.peers - std::min(s.peers, s.collectors + s.learners + s.nodes);
  s.draining = c.draining.load();
  s.stream_replays = c.replays.load();
  s.stream_resent = c.resent.load();
  s.stream_lost = c.lost.load();
  s.ring_bytes = c.ring_bytes.load();
  s.ring_drops = c.ring_drops.load();
  s.data_duplicates = c.data_duplicates.load();
  s.data_out_of_order = c.data_out_of_order.load();
  s.data_lost = c.data_lost.load();
  s.data_items = c.data_items.load();
  s.data_lag_items = c.data_lag_items.load();
  s.data_lag_versions = c.data_lag_versions.load();
  s.workers_quarantined = c.quarantined.load();
  s.quarantines = c.quarantines.load();
  s.coordinators_orphaned = c.orphaned.load();
  s.coordinator_adoptions = c.adoptions.load();
  s.journal_records = c.journal_records.load();
  s.journal_bytes = c.journal_bytes.load();
  s.journal_fsyncs = c.journal_fsyncs.load();
  s.journal_compactions = c.journal_compactions.load();
  s.journal_torn = c.journal_torn.load();
  s.tasks_restored = c.restored.load();
  s.connections = c.connections.load();
  s.connections_admitted = c.admitted.load();
  s.refused_key = c.refused_key.load();
  s.refused_subscriber = c.refused_subscriber.load();
  s.refused_address = c.refused_address.load();
  s.refused_connections = c.refused_connections.load();
  s.connections_bounced = c.bounced.load();
  s.refused_unauthorized = c.refused_unauthorized.load();
  s.refused_role_limit = c.refused_role_limit.load();
  s.refused_task_limit = c.refused_task_limit.load();
  s.sessions_revoked = c.revoked.load();
  s.allowlist_reloads = c.allowlist_reloads.load();
  s.allowlist_errors = c.allowlist_errors.load();
  s.faults_unanswered = c.unanswered.load();
  return s;
}

void metrics::store(const broker_view& v) {
  const auto t = v.tasks.counts();
  auto& c = counters_;
  c.peers.store(v.peers.size(), std::memory_order_relaxed);
  c.tasks_queued.store(t.queued, std::memory_order_relaxed);
  c.tasks_running.store(t.running, std::memory_order_relaxed);
  c.tasks_finished.store(t.finished, std::memory_order_relaxed);
  c.tasks_failed.store(t.failed, std::memory_order_relaxed);
  c.tasks_requeued.store(t.requeued, std::memory_order_relaxed);
  c.stale.store(t.stale, std::memory_order_relaxed);
  c.collectors.store(v.workers[0], std::memory_order_relaxed);
  c.learners.store(v.workers[1], std::memory_order_relaxed);
  c.nodes.store(v.nodes, std::memory_order_relaxed);
  c.draining.store(v.draining, std::memory_order_relaxed);
  c.replays.store(t.replays, std::memory_order_relaxed);
  c.resent.store(t.resent, std::memory_order_relaxed);
  c.lost.store(t.lost, std::memory_order_relaxed);
  c.ring_bytes.store(t.ring_bytes, std::memory_order_relaxed);
  c.ring_drops.store(t.ring_budget_drops, std::memory_order_relaxed);
  c.data_duplicates.store(t.data_duplicates, std::memory_order_relaxed);
  c.data_out_of_order.store(t.data_out_of_order, std::memory_order_relaxed);
  c.data_lost.store(t.data_lost, std::memory_order_relaxed);
  c.data_items.store(t.data_items, std::memory_order_relaxed);
  c.data_lag_items.store(t.data_lag_items, std::memory_order_relaxed);
  c.data_lag_versions.store(t.data_lag_versions, std::memory_order_relaxed);
  c.quarantined.store(t.quarantined, std::memory_order_relaxed);
  c.quarantines.store(t.quarantines, std::memory_order_relaxed);
  c.orphaned.store(t.orphaned, std::memory_order_relaxed);
  c.adoptions.store(t.adoptions, std::memory_order_relaxed);
  c.refused_task_limit.store(t.task_limit, std::memory_order_relaxed);
  const auto& g = v.gate.counts();
  c.connections.store(g.connections, std::memory_order_relaxed);
  c.admitted.store(g.admitted, std::memory_order_relaxed);
  c.refused_key.store(g.refused_key, std::memory_order_relaxed);
  c.refused_subscriber.store(g.refused_subscriber, std::memory_order_relaxed);
  c.refused_address.store(g.refused_address, std::memory_order_relaxed);
  c.refused_connections.store(g.refused_total, std::memory_order_relaxed);
  c.bounced.store(g.bounced, std::memory_order_relaxed);
  c.hoarding_cut.store(g.hoarding, std::memory_order_relaxed);
  c.allowlist_reloads.store(g.allowlist_reloads, std::memory_order_relaxed);
  c.allowlist_errors.store(g.allowlist_errors, std::memory_order_relaxed);
  if (v.log != nullptr) {
    const auto j = v.log->stats();
    c.journal_records.store(j.records, std::memory_order_relaxed);
    c.journal_bytes.store(j.bytes, std::memory_order_relaxed);
    c.journal_fsyncs.store(j.fsyncs, std::memory_order_relaxed);
    c.journal_compactions.store(j.compactions, std::memory_order_relaxed);
  }
}

void metrics::tick(const broker_view& v, std::size_t labelled) {
  auto shapes = v.tasks.queued_by_shape();
  auto policies = v.tasks.policy_versions();
  auto topics = v.bus.topics(labelled);
  auto lag = v.bus.nodes(labelled);
  auto standbys = v.replication != nullptr ? v.replication->standbys()
                                           : std::vector<replicator::standby_state>{};
  {
    const std::lock_guard lock(ticked_mu_);
    shapes_ = std::move(shapes);
    policies_ = std::move(policies);
    bus_ = v.bus.counts();
    topics_ = std::move(topics);
    lag_ = std::move(lag);
    standbys_ = std::move(standbys);
  }
  const auto unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  if (recent_.due(unix_ms)) recent_.record(unix_ms, snapshot());  // a snapshot a second
}

}  // namespace rlbus::broker
