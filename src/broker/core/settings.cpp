// See settings.hpp. The table below is the only list of the broker's settings.
#include "broker/core/settings.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "util/endpoint_list.hpp"

namespace rlbus::broker {

namespace {

constexpr std::uint64_t day_ms = 86'400'000;  // the longest time any setting may name
constexpr std::uint64_t ten_million = 10'000'000;
constexpr std::uint64_t hundred_million = 100'000'000;

// A setting that may change while the broker runs (OPS set, §16.5).
setting live(setting s) {
  s.live = true;
  return s;
}

std::vector<setting> make_table() {
  using c = config;
  const std::vector<std::string_view> any;
  return {
      // ---- the top level: endpoints and sessions ----
      {"", "router",
       "ROUTER endpoint where workers and coordinators connect (tcp://HOST:PORT, "
       "ipc://PATH; port 0 or * = any free port)",
       &c::router_endpoint, 1},
      {"", "events", "PUB endpoint where events are published", &c::events_endpoint, 1},
      {"", "liveness", "a peer silent for liveness x its heartbeat interval is expired",
       &c::liveness, 1, 1000},
      live({"", "heartbeat-min",
            "smallest heartbeat interval a peer may use; faster requests are "
            "clamped",
            &c::heartbeat_min_ms, 10, 600'000, any, "ms"}),
      live({"", "heartbeat-max", "largest heartbeat interval a peer may use", &c::heartbeat_max_ms,
            10, 600'000, any, "ms"}),
      {"", "status-interval", "period of the broker.heartbeat event", &c::status_interval_ms, 10,
       day_ms, any, "ms"},
      {"", "max-message", "largest inbound frame; a peer sending more is disconnected",
       &c::max_message, 1024, std::uint64_t{1} << 32U, any, "bytes"},
      {"", "max-peers", "most sessions at once; more HELLOs get BUSY", &c::max_peers, 1,
       ten_million},
      live({"", "max-faults", "bad messages a peer may send before it is disconnected",
            &c::max_faults, 1, 1'000'000}),
      {"", "shutdown-linger", "time to let the final DISCONNECTs leave at shutdown",
       &c::shutdown_linger_ms, 0, day_ms, any, "ms"},
      {"", "drain-ms",
       "on the first SIGINT/SIGTERM, time that running tasks get to end on their "
       "own before they are aborted (0 = stop at once)",
       &c::drain_ms, 0, day_ms, any, "ms"},
      {"", "run-lock",
       "file the processes of one run hold a shared lock (flock) on: the broker stops, as on "
       "SIGTERM, once no process holds it, however they ended (empty: it runs until it is "
       "signalled)",
       &c::run_lock_path},
      // ---- tasks ----
      live({"tasks", "max-queue",
            "most tasks waiting for a worker; a SUBMIT past it is refused (412 "
            "QUEUE_FULL)",
            &c::max_queue, 1, hundred_million}),
      live({"tasks", "start-timeout", "time a worker has to answer TASK_START with STARTED",
            &c::start_timeout_ms, 1, day_ms, any, "ms"}),
      live({"tasks", "step-timeout",
            "longest time a running task may go without progress from its "
            "worker",
            &c::step_timeout_ms, 1, day_ms, any, "ms"}),
      live({"tasks", "close-timeout", "time a worker has to answer TASK_CLOSE with its RESULT",
            &c::close_timeout_ms, 1, day_ms, any, "ms"}),
      live({"tasks", "task-timeout", "longest time one attempt of a task may take, start to result",
            &c::task_timeout_ms, 1, day_ms, any, "ms"}),
      live({"tasks", "max-attempts",
            "attempts a task gets before it fails (a lost worker or a timeout "
            "ends one)",
            &c::max_attempts, 1, 1000}),
      live({"tasks", "queue-timeout-ms",
            "time a task may wait in the queue for a worker, each time it "
            "is queued, before it fails, when its SUBMIT does not say (0 = as long as it takes)",
            &c::queue_timeout_ms, 0, day_ms, any, "ms"}),
      {"tasks", "quarantine-after",
       "attempts in a row a worker may end badly (failed, timed out, "
       "gone while holding one) before it gets no task for a while (0 = never)",
       &c::quarantine_after, 0, 1000},
      {"tasks", "quarantine-ms",
       "time a quarantined worker gets no task; doubled for each "
       "further quarantine in a row, up to 8 times",
       &c::quarantine_ms, 1, day_ms, any, "ms"},
      live({"tasks", "no-data-retry",
            "time a learner is told to wait (NO_DATA) before asking its "
            "coordinator again",
            &c::no_data_retry_ms, 0, day_ms, any, "ms"}),
      {"tasks", "stream-ring", "task events kept per coordinator for replay", &c::stream_ring, 16,
       hundred_million},
      {"tasks", "stream-ring-bytes", "bytes of task event bodies kept per coordinator for replay",
       &c::stream_ring_bytes, 1024, std::uint64_t{1} << 40U, any, "bytes"},
      {"tasks", "stream-window",
       "most task events in flight, not yet acknowledged, to a "
       "coordinator that acknowledges; 1 to half of stream-ring (unset: 1024, or half the ring "
       "when that is smaller)",
       &c::stream_window, 1, 50'000'000},
      {"tasks", "coordinator-grace",
       "time the tasks and stream of a coordinator that vanished "
       "(expired, not said DISCONNECT) are kept for a new process with its id to adopt (0 = "
       "cancel them at once)",
       &c::coordinator_grace_ms, 0, day_ms, any, "ms"},
      // ---- the topic bus ----
      {"bus", "window",
       "most deliveries in flight to a node of the topic bus, not yet acknowledged", &c::bus_window,
       1, 1'000'000, any, "", "bus-window"},
      {"bus", "credit",
       "PUBLISH a node may send ahead of what the broker has taken (it is topped up by this "
       "much once it has used half)",
       &c::bus_credit, 2, 1'000'000, any, "", "bus-credit"},
      {"bus", "queue-bytes",
       "bytes of deliveries one node's queue holds: its publishers get no credit past half of "
       "it, and its oldest unsent deliveries are dropped (reported as a gap) past it",
       &c::bus_queue_bytes, 4096, std::uint64_t{1} << 40U, any, "bytes", "bus-queue-bytes"},
      {"bus", "memory",
       "bytes the bus holds together: each publication once (a payload several nodes get "
       "counts once), each queue entry on its own; past half of it a node holding more than "
       "its share holds its publishers back, past it the largest queue loses its oldest unsent "
       "deliveries",
       &c::bus_memory, 4096, std::uint64_t{1} << 44U, any, "bytes", "bus-memory"},
      {"bus", "stall-timeout",
       "how long a node may hold publishers back while it acknowledges nothing; then its unsent "
       "deliveries are dropped (reported as a gap) and it holds no one back until it "
       "acknowledges again (0 = for as long as its session lives)",
       &c::bus_stall_ms, 0, day_ms, any, "ms", "bus-stall-timeout"},
      {"bus", "retain-bytes",
       "bytes kept as topics' last values for nodes that subscribe later (each its payload, "
       "topic, publisher and the broker's bookkeeping, 0 = none); the oldest is forgotten past "
       "it",
       &c::bus_retain_bytes, 0, std::uint64_t{1} << 40U, any, "bytes", "bus-retain-bytes"},
      {"bus", "max-subscriptions",
       "most subscriptions of one node; more are refused (440 TOO_MANY_SUBSCRIPTIONS)",
       &c::bus_max_subscriptions, 1, ten_million, any, "", "bus-max-subscriptions"},
      {"bus", "max-nodes", "most sessions of role bus at once; more HELLOs get BUSY",
       &c::bus_max_nodes, 1, ten_million, any, "", "bus-max-nodes"},
      // ---- durability ----
      {"durability", "journal",
       "file where the broker records the tasks, policies and stream "
       "positions it accepted; started on the same file after a crash, it takes them up again "
       "(empty: no journal, everything is lost with the process)",
       &c::journal_path},
      {"durability",
       "journal-fsync",
       "when journal writes are forced to disk: always (each "
       "one), batch (every 100 ms) or none (a broker crash loses nothing, a machine crash may)",
       &c::journal_fsync,
       0,
       0,
       {"always", "batch", "none"}},
      {"durability", "journal-compact-bytes",
       "the journal is rewritten as a snapshot when it "
       "grows past this (or twice its last compacted size)",
       &c::journal_compact_bytes, 4096, std::uint64_t{1} << 40U, any, "bytes"},
      // ---- a group of brokers ----
      {"cluster", "etcd",
       "etcd's client URLs, comma-separated (e.g. http://10.0.0.5:2379): the broker joins a "
       "group of brokers that share this etcd and cluster name; the one etcd elects leads and "
       "serves peers, the others stand by (empty: a broker alone)",
       &c::cluster_etcd, 0, 0, any, "", "cluster-etcd"},
      {"cluster", "name", "the group's name: its brokers elect one leader among them",
       &c::cluster_name, 1, 0, any, "", "cluster-name"},
      {"cluster", "member",
       "this broker's name in its group, unique in it (empty: its advertised endpoint)",
       &c::cluster_member, 0, 0, any, "", "cluster-member"},
      {"cluster", "advertise",
       "where peers reach this broker when it leads, e.g. tcp://10.0.0.7:7235 (its router "
       "endpoint as the peers see it; needed with cluster-etcd)",
       &c::advertise, 0, 0, any, "", "advertise"},
      {"cluster", "lease",
       "the leader's lease in etcd, whole seconds: a standby takes over at most this long after "
       "the leader's last renewal (etcd may raise a lease shorter than its own minimum)",
       &c::cluster_lease_ms, 1000, 60'000, any, "ms", "cluster-lease"},
      {"cluster", "lease-margin",
       "the leader stops serving this long before its lease could run out, as counted on its "
       "own clock from its last renewal; at least a quarter of the lease",
       &c::cluster_margin_ms, 100, 60'000, any, "ms", "cluster-lease-margin"},
      {"cluster", "replication",
       "where the leader streams its journal to the group's standbys, e.g. tcp://*:7237 (empty: "
       "the router endpoint's host on a free port); the standbys reach it at --advertise's host",
       &c::cluster_replication, 0, 0, any, "", "cluster-replication"},
      {"cluster", "sync-timeout",
       "how long the leader holds back what it sends while a standby in sync lacks a record it "
       "wrote; past it the leader lets that standby go and serves on",
       &c::cluster_sync_timeout_ms, 10, 60'000, any, "ms", "cluster-sync-timeout"},
      // ---- policies ----
      {"policies", "policy-max-ids", "most policy ids the broker keeps a latest version of",
       &c::policy_max_ids, 1, 1'000'000},
      {"policies", "policy-max-bytes",
       "largest inline params of one policy version (a reference "
       "has no such bound)",
       &c::policy_max_bytes, 0, std::uint64_t{1024} * 1024, any, "bytes"},
      // ---- security and limits ----
      {"security", "curve-key",
       "the broker's CURVE key pair (a .key file from keygen): both "
       "sockets encrypt, and only keys in allowlist get in (empty: plain, no CURVE)",
       &c::curve_key_path},
      {"security", "allowlist",
       "TOML file of the public keys let in, each with its roles and "
       "optional id patterns; required with curve-key; reloaded on SIGHUP or when it changes",
       &c::allowlist_path},
      {"security", "insecure",
       "allow binding an address other machines can reach without CURVE "
       "(anyone who reaches it can join as any peer)",
       &c::insecure},
      {"security", "max-connections",
       "most connections at once on both sockets; more are "
       "refused at the handshake",
       &c::max_connections, 1, ten_million},
      {"security", "max-connections-per-address",
       "most connections at once from one source "
       "address",
       &c::max_connections_per_address, 1, ten_million},
      {"security", "max-connection-bytes",
       "bytes of answers and events the broker holds for one connection that has not read "
       "them; a message past it is not sent (as to a full queue) and counted; at least twice "
       "max-message",
       &c::max_connection_bytes, 4096, std::uint64_t{1} << 40U, any, "bytes"},
      {"security", "memory-budget",
       "bytes the broker holds for its peers: the answers and events queued to all "
       "connections and the coordinators' event rings together (a message past it is not "
       "sent and counted; at least max-connection-bytes); the rings hold at most half of it, "
       "and a quarter is kept for peers that read (half of it for those whose queues move, "
       "all of it for a short answer to one that holds nothing)",
       &c::memory_budget, 4096, std::uint64_t{1} << 44U, any, "bytes"},
      {"security", "stalled-timeout",
       "while more than half of memory-budget is held, a connection that has read "
       "nothing of what it was sent for this long is cut, which frees what it holds; it may "
       "connect again (0 = never)",
       &c::stalled_timeout_ms, 0, day_ms, any, "ms"},
      {"security", "handshake-timeout",
       "time a new connection has to finish the ZeroMQ "
       "handshake before it is dropped",
       &c::handshake_timeout_ms, 100, day_ms, any, "ms"},
      {"security", "max-collectors", "most collector sessions at once; more HELLOs get BUSY",
       &c::max_collectors, 1, ten_million},
      {"security", "max-learners", "most learner sessions at once; more HELLOs get BUSY",
       &c::max_learners, 1, ten_million},
      {"security", "max-coordinators", "most coordinator sessions at once; more HELLOs get BUSY",
       &c::max_coordinators, 1, ten_million},
      {"security", "max-tasks-per-coordinator",
       "most live tasks (queued or running) of one "
       "coordinator; a SUBMIT past it is refused (416 TOO_MANY_TASKS)",
       &c::max_tasks_per_coordinator, 1, hundred_million},
      // ---- metrics ----
      {"metrics", "port",
       "TCP port of the HTTP endpoint with /metrics (Prometheus), /healthz and /readyz (0 = no "
       "endpoint)",
       &c::metrics_port, 0, 65'535, any, "", "metrics-port"},
      {"metrics", "address",
       "address the HTTP endpoint listens on (a scraper on another machine needs 0.0.0.0 or "
       "the host's address; in plain mode that also needs insecure, as the sockets do)",
       &c::metrics_address, 1, 0, any, "", "metrics-address"},
      {"metrics", "token-file",
       "file whose first line is the token the web view (/) and its JSON (/api/) ask for, as "
       "'Authorization: Bearer TOKEN' or ?token=TOKEN; with CURVE on or an address other "
       "machines reach, the view is served only with one",
       &c::metrics_token_path, 0, 0, any, "", "metrics-token-file"},
      {"metrics", "token-for-metrics", "/metrics asks for the token too",
       &c::metrics_token_for_metrics, 0, 0, any, "", "metrics-token-for-metrics"},
      // ---- logging ----
      {"log",
       "level",
       "least severe log lines written",
       &c::log_level,
       0,
       0,
       {"trace", "debug", "info", "warn", "error", "critical", "off"},
       "",
       "log-level"},
      {"log",
       "format",
       "human (time, level, message) or json (one object per line: ts, level, msg and, when the "
       "line is about one, task, attempt, worker and coordinator)",
       &c::log_format,
       0,
       0,
       {"human", "json"},
       "",
       "log-format"},
  };
}

template <class T>
constexpr bool is_number = std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::size_t>;

std::string range_text(const setting& s) {
  return fmt::format("{}..{}", s.min, s.max);
}

std::string words_text(const std::vector<std::string_view>& words) {
  std::string out;
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += i + 1 == words.size() ? " or " : ", ";
    out += words[i];
  }
  return out;
}

// Why a number cannot be this setting's value ("" when it can).
std::string number_fault(const setting& s, std::uint64_t v) {
  if (v < s.min || v > s.max) return fmt::format("{} is outside {}", v, range_text(s));
  return {};
}

std::string word_fault(const setting& s, std::string_view v) {
  if (s.words.empty() || std::find(s.words.begin(), s.words.end(), v) != s.words.end()) return {};
  return fmt::format("'{}' is not one of {}", v, words_text(s.words));
}

}  // namespace

std::string setting::key() const {
  return section.empty() ? std::string(name) : fmt::format("{}.{}", section, name);
}

std::string setting::flag() const {
  return fmt::format("--{}", flag_name.empty() ? name : flag_name);
}

std::string setting::env() const {
  std::string out = "RLBUS_BROKER_";
  for (const char ch : flag_name.empty() ? name : flag_name)
    out.push_back(ch == '-' ? '_'
                            : static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
  return out;
}

std::string setting::text(const config& cfg) const {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = cfg.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, fsync_policy>) {
          return std::string(to_string(v));
        } else if constexpr (is_number<T>) {
          return std::to_string(v);
        } else {
          return v;
        }
      },
      where);
}

std::string setting::assign(config& cfg, std::string_view text) const {
  return std::visit(
      [&](auto member) -> std::string {
        auto& v = cfg.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (text == "true" || text == "1") {
            v = true;
          } else if (text == "false" || text == "0") {
            v = false;
          } else {
            return fmt::format("'{}' is not true or false", text);
          }
          return {};
        } else if constexpr (std::is_same_v<T, fsync_policy>) {
          if (auto why = word_fault(*this, text); !why.empty()) return why;
          v = *parse_fsync_policy(text);
          return {};
        } else if constexpr (is_number<T>) {
          std::uint64_t n = 0;
          const auto* end = text.data() + text.size();
          const auto [at, ec] = std::from_chars(text.data(), end, n);
          if (text.empty() || ec != std::errc{} || at != end)
            return fmt::format("'{}' is not a whole number in {}", text, range_text(*this));
          if (auto why = number_fault(*this, n); !why.empty()) return why;
          v = static_cast<T>(n);
          return {};
        } else {
          if (min > 0 && text.empty()) return "must not be empty";
          if (auto why = word_fault(*this, text); !why.empty()) return why;
          v = std::string(text);
          return {};
        }
      },
      where);
}

std::string setting::check(const config& cfg) const {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = cfg.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (is_number<T>) {
          return number_fault(*this, v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (min > 0 && v.empty()) return "must not be empty";
          return word_fault(*this, v);
        } else {
          return {};
        }
      },
      where);
}

const std::vector<setting>& settings() {
  static const std::vector<setting> table = make_table();
  return table;
}

namespace {
void require(bool ok, std::string_view what) {
  if (!ok) throw std::invalid_argument(std::string(what));
}
}  // namespace

void validate(const config& cfg) {
  // Each setting on its own, by the bounds of the table of settings (settings.cpp).
  for (const auto& s : settings())
    if (auto why = s.check(cfg); !why.empty())
      throw std::invalid_argument(fmt::format("{} ({}): {}", s.key(), s.flag(), why));
  // Settings that bound each other.
  require(cfg.heartbeat_min_ms <= cfg.heartbeat_max_ms,
          fmt::format("heartbeat-min ({} ms) must not exceed heartbeat-max ({} ms)",
                      cfg.heartbeat_min_ms, cfg.heartbeat_max_ms));
  require(cfg.policy_max_bytes <= cfg.limits.max_bin,
          "inline policy params cannot exceed the decoder's bin limit");
  // The held events of a full window must fit the ring with room to spare.
  require(cfg.stream_window <= cfg.stream_ring / 2,
          fmt::format("tasks.stream-window (--stream-window) is {} but must be 1..{}, half the "
                      "stream ring (--stream-ring {})",
                      cfg.stream_window, cfg.stream_ring / 2, cfg.stream_ring));
  require(cfg.max_connection_bytes >= 2 * cfg.max_message,
          fmt::format("security.max-connection-bytes (--max-connection-bytes) is {} but must be "
                      "at least twice max-message ({}): a connection must be able to take the "
                      "largest message",
                      cfg.max_connection_bytes, cfg.max_message));
  require(cfg.memory_budget >= cfg.max_connection_bytes,
          fmt::format("security.memory-budget (--memory-budget) is {} but must be at least "
                      "max-connection-bytes ({})",
                      cfg.memory_budget, cfg.max_connection_bytes));
  // Security (SPEC §15): fail closed. CURVE without an allowlist would let any key in.
  require(cfg.curve_key_path.empty() == cfg.allowlist_path.empty(),
          cfg.curve_key_path.empty()
              ? "--allowlist needs --curve-key: without CURVE a peer's key is unknown"
              : "--curve-key needs --allowlist: CURVE admits only the keys it lists");
  if (cfg.curve_key_path.empty() && !cfg.insecure) {
    for (const auto* ep : {&cfg.router_endpoint, &cfg.events_endpoint})
      require(loopback_endpoint(*ep),
              fmt::format("{} is reachable from other machines, and without CURVE anyone who "
                          "reaches it can join as any peer: turn CURVE on (--curve-key, "
                          "--allowlist) or say --insecure",
                          *ep));
    require(cfg.metrics_port == 0 || loopback_host(cfg.metrics_address),
            fmt::format("metrics.address (--metrics-address) {} is reachable from other "
                        "machines, and without CURVE every other socket of the broker stays on "
                        "loopback unless told: turn CURVE on or say --insecure",
                        cfg.metrics_address));
  }
  require(!cfg.metrics_token_for_metrics || !cfg.metrics_token_path.empty(),
          "metrics.token-for-metrics (--metrics-token-for-metrics) needs the token it asks for: "
          "set metrics.token-file (--metrics-token-file)");
  if (!cfg.cluster_etcd.empty()) {
    std::vector<std::string> urls;
    try {
      urls = util::split_endpoints(cfg.cluster_etcd);
    } catch (const std::invalid_argument& e) {
      require(false, fmt::format("cluster.etcd (--cluster-etcd): {}", e.what()));
    }
    for (const auto& url : urls)
      require(url.rfind("http://", 0) == 0,
              fmt::format("cluster.etcd (--cluster-etcd): '{}' is not an etcd client URL "
                          "(http://HOST:PORT)",
                          url));
    require(!cfg.advertise.empty(),
            "cluster.advertise (--advertise) is needed with cluster.etcd: the leader tells its "
            "group where peers reach it");
    require(cfg.cluster_lease_ms % 1000 == 0,
            fmt::format("cluster.lease (--cluster-lease) is {} ms but etcd counts leases in "
                        "whole seconds",
                        cfg.cluster_lease_ms));
    require(cfg.cluster_margin_ms * 4 >= cfg.cluster_lease_ms &&
                cfg.cluster_margin_ms * 2 <= cfg.cluster_lease_ms,
            fmt::format("cluster.lease-margin (--cluster-lease-margin) is {} ms but must be a "
                        "quarter to a half of the lease ({} ms)",
                        cfg.cluster_margin_ms, cfg.cluster_lease_ms));
  }
}

std::vector<std::pair<std::string, std::string>> changed_settings(const config& cfg) {
  const config defaults;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& s : settings())
    if (auto value = s.text(cfg); value != s.text(defaults))
      out.emplace_back(s.key(), std::move(value));
  return out;
}

std::vector<std::string> live_setting_keys() {
  std::vector<std::string> out;
  for (const auto& s : settings())
    if (s.live) out.push_back(s.key());
  return out;
}

const setting* find_setting(std::string_view key_or_name) {
  for (const auto& s : settings())
    if (s.key() == key_or_name || s.name == key_or_name ||
        s.flag() == fmt::format("--{}", key_or_name))
      return &s;
  return nullptr;
}

std::set<std::string> load_config_file(const std::string& path, config& cfg,
                                       const std::set<std::string>& keep) {
  toml::table doc;
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    throw config_file_error(
        at.line == 0 ? fmt::format("config file {}: {}", path, e.description())
                     : fmt::format("config file {}: line {}: {}", path, at.line, e.description()));
  }
  const auto fail = [&](const std::string& key, const toml::node& value, std::string_view why) {
    std::ostringstream shown;
    value.visit([&](const auto& v) { shown << v; });
    const auto line = value.source().begin.line;
    throw config_file_error(
        fmt::format("config file {}: line {}: {} = {}: {}", path, line, key, shown.str(), why));
  };
  std::set<std::string> set;
  const auto read_one = [&](std::string_view section, std::string_view name,
                            const toml::node& node) {
    const auto key = section.empty() ? std::string(name) : fmt::format("{}.{}", section, name);
    const setting* s = nullptr;
    for (const auto& candidate : settings())
      if (candidate.section == section && candidate.name == name) s = &candidate;
    if (s == nullptr) {
      const auto* elsewhere = find_setting(name);
      fail(key, node,
           elsewhere != nullptr ? fmt::format("unknown key; did you mean {}?", elsewhere->key())
                                : std::string("unknown key"));
    }
    if (keep.count(s->key()) != 0) return;  // a flag or the environment gave it
    std::string why;
    std::visit(
        [&](auto member) {
          using T = std::decay_t<decltype(cfg.*member)>;
          if constexpr (std::is_same_v<T, bool>) {
            if (!node.is_boolean()) return void(why = "expected true or false");
            cfg.*member = node.as_boolean()->get();
          } else if constexpr (is_number<T>) {
            if (!node.is_integer())
              return void(why = "expected a whole number in " + range_text(*s));
            const auto n = node.as_integer()->get();
            if (n < 0) return void(why = fmt::format("{} is outside {}", n, range_text(*s)));
            why = s->assign(cfg, std::to_string(n));
          } else {
            if (!node.is_string()) return void(why = "expected a string");
            why = s->assign(cfg, node.as_string()->get());
          }
        },
        s->where);
    if (!why.empty()) fail(key, node, why);
    set.insert(s->key());
  };
  std::set<std::string_view> sections;
  for (const auto& s : settings())
    if (!s.section.empty()) sections.insert(s.section);
  for (const auto& [k, node] : doc) {
    if (sections.count(k.str()) == 0) {
      read_one("", k.str(), node);
      continue;
    }
    const auto* table = node.as_table();
    if (table == nullptr) fail(std::string(k.str()), node, "expected a table of settings");
    for (const auto& [name, value] : *table) read_one(k.str(), name.str(), value);
  }
  return set;
}

namespace {

// A comment of `text` wrapped at 92 columns, each line starting "# ".
std::string comment(std::string_view text) {
  std::string out, line = "#";
  std::istringstream words{std::string(text)};
  for (std::string w; words >> w;) {
    if (line.size() + 1 + w.size() > 92) {
      out += line + "\n";
      line = "#";
    }
    line += " " + w;
  }
  return out + line + "\n";
}

std::string toml_value(const setting& s, const config& cfg) {
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::decay_t<decltype(cfg.*member)>;
        if constexpr (std::is_same_v<T, bool> || is_number<T>) {
          return s.text(cfg);
        } else {
          std::ostringstream out;
          out << toml::value<std::string>(s.text(cfg));  // quoted and escaped as TOML says
          return out.str();
        }
      },
      s.where);
}

std::string bounds(const setting& s) {
  if (!s.words.empty()) return "one of " + words_text(s.words);
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::decay_t<decltype(config{}.*member)>;
        if constexpr (is_number<T>)
          return s.unit.empty() ? range_text(s) : fmt::format("{} {}", range_text(s), s.unit);
        else if constexpr (std::is_same_v<T, bool>)
          return "true or false";
        else
          return s.min > 0 ? "text, not empty" : "text";
      },
      s.where);
}

}  // namespace

std::string to_toml(const config& cfg) {
  std::string out =
      "# rlbus-broker configuration (rlbus-broker --print-config): every setting with the value\n"
      "# in effect. Give it back with --config FILE; flags and RLBUS_BROKER_* variables win.\n";
  std::string_view section = "-";
  for (const auto& s : settings()) {
    if (s.section != section) {
      section = s.section;
      if (!section.empty()) out += fmt::format("\n[{}]\n", section);
    }
    out += "\n" + comment(fmt::format("{} ({})", s.help, bounds(s)));
    out += fmt::format("{} = {}\n", s.name, toml_value(s, cfg));
  }
  return out;
}

std::string reference_markdown() {
  const config defaults;
  std::string out =
      "# rlbus-broker configuration reference\n\n"
      "Generated by `rlbus-broker --print-reference` from the broker's table of settings; a\n"
      "test fails when this page and the binary differ.\n\n"
      "Every setting can be given three ways. Strongest first:\n\n"
      "1. a flag, `--NAME VALUE` (`--insecure` takes no value);\n"
      "2. an environment variable, `RLBUS_BROKER_NAME` (upper case, `-` as `_`);\n"
      "3. a TOML file named by `--config FILE` (or `RLBUS_BROKER_CONFIG`), where a setting is\n"
      "   the key NAME in its section's table, or at the top level when it has no section.\n\n"
      "What is not given anywhere keeps its default. `rlbus-broker --print-config` prints the\n"
      "configuration in effect as such a file. A file that cannot be used stops the broker\n"
      "before it binds anything (exit 2), naming the file, the line, the key, the value and\n"
      "why. Times are in milliseconds.\n\n"
      "The settings marked live may also change while the broker runs: `rlbus-ctl set KEY\n"
      "VALUE` (the operations message OPS `set`, SPEC §16.5) gives one a new value, within the\n"
      "same bounds; the others are read once, at start-up.\n";
  std::string_view section = "-";
  for (const auto& s : settings()) {
    if (s.section != section) {
      section = s.section;
      out += section.empty() ? std::string("\n## Top level\n\n")
                             : fmt::format("\n## [{}]\n\n", section);
      out += "| key | flag | environment | default | values | live | meaning |\n";
      out += "|---|---|---|---|---|---|---|\n";
    }
    const auto shown = s.text(defaults);
    out += fmt::format("| `{}` | `{}` | `{}` | {} | {} | {} | {} |\n", s.key(), s.flag(), s.env(),
                       shown.empty() ? std::string("(empty)") : fmt::format("`{}`", shown),
                       bounds(s), s.live ? "live" : "", s.help);
  }
  return out;
}

}  // namespace rlbus::broker
