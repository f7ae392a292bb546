// Broker settings with their defaults in one place. The binary fills this from flags;
// tests and embedders fill it directly. The table of settings (settings.hpp) knows their
// keys, flags and ranges; broker::validate (there) is the single check of them. This header
// knows nothing of the table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "codec/protocol.hpp"
#include "rlbus/defaults.hpp"

namespace rlbus::broker {

/// When the journal's writes are forced to the disk (SPEC §14): after every write, every
/// 100 ms, or never (the kernel's page cache: safe against a crash of the broker, not of the
/// machine).
enum class fsync_policy { always, batch, none };

/// "always", "batch" or "none"; nullopt for anything else.
std::optional<fsync_policy> parse_fsync_policy(std::string_view s);
std::string_view to_string(fsync_policy p);

// Its fields are grouped by what they govern, not packed by size: one is made per broker.
struct config {  // NOLINT(clang-analyzer-optin.performance.Padding)
  /// Where workers and coordinators connect (DEALER -> ROUTER). Port 0 or * picks a free one.
  std::string router_endpoint{rlbus::defaults::router_endpoint};
  /// Where subscribers receive events (SUB <- PUB).
  std::string events_endpoint{rlbus::defaults::events_endpoint};
  /// A peer silent for liveness x its heartbeat interval is expired.
  std::uint32_t liveness = 3;
  /// Bounds on the heartbeat interval a peer may ask for; its request is clamped into them.
  std::uint32_t heartbeat_min_ms = 100;
  std::uint32_t heartbeat_max_ms = 60'000;
  /// Period of the broker.heartbeat event on the PUB.
  std::uint32_t status_interval_ms = 1000;
  /// Largest inbound frame (ZMQ_MAXMSGSIZE); a peer exceeding it is disconnected by libzmq.
  std::size_t max_message = std::size_t{1024} * 1024;
  /// Most sessions at once; HELLO past it is refused with BUSY.
  std::size_t max_peers = 100'000;
  /// Bad messages a peer with a session may send before it is disconnected.
  std::uint32_t max_faults = 16;
  /// How long shutdown waits for its last messages (DISCONNECTs) to leave.
  std::uint32_t shutdown_linger_ms = 1000;
  /// On the first stop request the broker drains (SPEC §11): no new sessions or tasks, but
  /// running tasks may end on their own for this long before they are aborted. 0 stops at once.
  std::uint32_t drain_ms = 10'000;
  /// The broker of one run: a file the run's processes hold a shared lock (flock) on. Once
  /// none holds it the broker stops as on SIGTERM. Empty: it runs until it is signalled.
  std::string run_lock_path;
  /// Limits for every msgpack body the broker decodes.
  codec::decode_limits limits{};

  // ---- security and resource limits (SPEC §15) ----
  /// The broker's CURVE key pair (a .key file). Set: both sockets speak CURVE and only the
  /// keys in the allowlist get in. Empty: plain (no encryption, no authentication).
  std::string curve_key_path;
  /// Public keys allowed in, with their roles and ids; required with CURVE.
  std::string allowlist_path;
  /// Lets the broker bind a non-loopback address without CURVE (anyone who can reach the
  /// port can then join as any peer).
  bool insecure = false;
  /// Most connections at once (both sockets), and from one source address; a connection
  /// past either is refused by the ZAP handler before it can say anything.
  std::size_t max_connections = 100'000;
  std::size_t max_connections_per_address = 16'384;
  /// Bytes the broker holds in its send queue for one connection, and for all of them: a
  /// message past either is not sent (as to a full queue) and counted (SPEC §15.5).
  std::size_t max_connection_bytes = std::size_t{64} * 1024 * 1024;
  std::size_t memory_budget = std::size_t{512} * 1024 * 1024;
  /// While more than half of memory_budget is held, a connection whose queue has
  /// not moved for this long is cut, so that what it holds is freed (0 = never).
  std::uint32_t stalled_timeout_ms = 10'000;
  /// A connection that has not finished the ZeroMQ handshake by then is dropped.
  std::uint32_t handshake_timeout_ms = 10'000;
  /// Most sessions of each role at once (within max_peers); HELLO past it gets BUSY.
  std::size_t max_collectors = 100'000;
  std::size_t max_learners = 100'000;
  std::size_t max_coordinators = 1'000;
  /// Most live tasks (queued or running) of one coordinator; SUBMIT past it gets 416.
  std::size_t max_tasks_per_coordinator = 10'000;

  // ---- tasks (SPEC §12) ----
  /// Most tasks waiting for a worker; SUBMIT past it is refused with QUEUE_FULL.
  std::size_t max_queue = 10'000;
  /// Defaults for a task's timeouts and attempts when its SUBMIT does not say.
  std::uint32_t start_timeout_ms = 10'000;    // TASK_START -> STARTED
  std::uint32_t step_timeout_ms = 60'000;     // longest silence of a running task
  std::uint32_t close_timeout_ms = 30'000;    // TASK_CLOSE -> RESULT
  std::uint32_t task_timeout_ms = 3'600'000;  // a whole attempt
  std::uint32_t max_attempts = 3;
  /// Longest a task waits in the queue (each time it is queued) before it fails when its
  /// SUBMIT names no queue_timeout_ms; 0 = it waits as long as it takes (SPEC §12.7.6).
  std::uint32_t queue_timeout_ms = 0;
  /// A worker whose attempts end through it this many times in a row (failed, timed out,
  /// gone while holding one) gets no task for quarantine_ms, twice that for each further
  /// quarantine in a row, up to 8 times (SPEC §12.6.9). 0: never.
  std::uint32_t quarantine_after = 5;
  std::uint32_t quarantine_ms = 10'000;
  /// What NO_DATA tells a learner to wait before asking again (its SDK backs off from it).
  std::uint32_t no_data_retry_ms = 10;
  /// Task events kept per coordinator for replay, bounded in count and in bytes.
  std::size_t stream_ring = 65'536;
  std::size_t stream_ring_bytes = std::size_t{64} * 1024 * 1024;
  /// Most unacknowledged TASK_EVENTs in flight to a coordinator that acknowledges (SPEC
  /// §12.9.7); also what its collectors' data credit is cut from (§12.9.9).
  std::size_t stream_window = 1024;
  /// A coordinator whose session ends without its DISCONNECT (expiry, too many faults) leaves
  /// its tasks and stream for this long, to be adopted by a new session with its id: a
  /// restarted coordinator process takes them over (SPEC §12.5.8). 0: they end at once.
  std::uint32_t coordinator_grace_ms = 60'000;

  // ---- the topic bus (SPEC §17) ----
  /// Deliveries in flight to a node, not yet acknowledged.
  std::size_t bus_window = 256;
  /// PUBLISH a node may send ahead of what the broker has taken: the chunk it is topped up by.
  std::size_t bus_credit = 64;
  /// What one node's queue of deliveries holds: its publishers are held back at half of it,
  /// and its oldest unsent deliveries dropped (a gap) past it.
  std::size_t bus_queue_bytes = std::size_t{64} * 1024 * 1024;
  /// The same for the payloads all queues hold together (a payload shared by several once).
  std::size_t bus_memory = std::size_t{256} * 1024 * 1024;
  /// How long a node may hold publishers back while it acknowledges nothing: then its unsent
  /// deliveries are dropped (a gap) and it holds no one back until it acknowledges again. 0:
  /// for as long as its session lives.
  std::uint32_t bus_stall_ms = 5'000;
  /// What topics' last values may cost together; the oldest is forgotten past it.
  std::size_t bus_retain_bytes = std::size_t{64} * 1024 * 1024;
  /// Most subscriptions of one node, and most sessions of role bus at once.
  std::size_t bus_max_subscriptions = 1024;
  std::size_t bus_max_nodes = 10'000;

  // ---- durability (SPEC §14) ----
  /// The journal file: what the broker accepted, so that it starts again from there after a
  /// crash. Empty: no journal (everything is lost with the process).
  std::string journal_path;
  fsync_policy journal_fsync = fsync_policy::batch;
  /// The journal is compacted when it grows past this (or twice its last compacted size).
  std::size_t journal_compact_bytes = std::size_t{64} * 1024 * 1024;

  // ---- a group of brokers, one leading (SPEC §14.9) ----
  /// etcd's client URLs, comma-separated; empty: a broker alone.
  std::string cluster_etcd;
  std::string cluster_name = "rlbus";
  /// This broker's name in the group; empty: its advertised endpoint.
  std::string cluster_member;
  /// Where peers reach this broker when it leads (its router endpoint as seen from them).
  std::string advertise;
  std::uint32_t cluster_lease_ms = 2000;
  std::uint32_t cluster_margin_ms = 500;
  /// Where the leader streams its journal to the standbys (SPEC §14.10); empty: the router
  /// endpoint's host on a port of the system's choosing, advertised with --advertise's host.
  std::string cluster_replication;
  /// How long the leader holds back what it sends for a standby in sync that lacks a record.
  std::uint32_t cluster_sync_timeout_ms = 1000;

  // ---- policies (SPEC §13) ----
  /// Most policy ids the broker keeps a latest version of.
  std::size_t policy_max_ids = 64;
  /// Largest inline params of one version (a reference has no such bound).
  std::size_t policy_max_bytes = std::size_t{512} * 1024;

  // ---- the binary's own: its HTTP endpoint and its log ----
  /// The HTTP endpoint (/metrics, /healthz, /readyz): its port (0: none) and address.
  std::uint32_t metrics_port = 0;
  std::string metrics_address = "127.0.0.1";
  /// A file whose first line is the token the web view and its JSON ask for (and /metrics,
  /// with metrics_token_for_metrics). Without one, the view is served only on loopback
  /// without CURVE.
  std::string metrics_token_path;
  bool metrics_token_for_metrics = false;
  /// trace, debug, info, warn, error, critical or off.
  std::string log_level = "info";
  /// human (time, level, message) or json (one object per line, with the task and peers).
  std::string log_format = "human";
};

/// "tcp://host:0" -> "tcp://host:*" (libzmq spells "any free port" with a star).
std::string normalize_endpoint(std::string endpoint);

/// Whether an endpoint is reachable from this machine only (loopback TCP, ipc, inproc).
bool loopback_endpoint(std::string_view endpoint);
/// Whether a host name or address is this machine's loopback (127.*, localhost, ::1).
bool loopback_host(std::string_view host);

}  // namespace rlbus::broker
