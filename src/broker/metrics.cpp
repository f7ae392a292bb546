// See metrics.hpp.
#include "broker/metrics.hpp"

#include <fmt/format.h>

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
  e.one("rlbus_allowlist_errors_total", "counter", "allowlist reloads refused", s.allowlist_errors);
  e.one("rlbus_draining", "gauge", "1 while the broker drains before it stops", s.draining ? 1 : 0);
  return e.done();
}

}  // namespace rlbus::broker
