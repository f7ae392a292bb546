// A standby's copy of its leader's journal (SPEC §14.10). While a broker of a group stands by,
// its replica follows the leader it last read from etcd: it asks for the journal (SYNC),
// writes the snapshot it gets as a fresh journal file (PATH.tmp, fsync, rename over PATH),
// then appends each record the leader streams, checked (length, checksum) before it is written,
// and says how far it has written (SYNCED) once the bytes are handed to the kernel (and synced
// under fsync "always"). When the broker takes over, it opens that file as its journal: the
// takeover is a restart on the leader's state.
//
// The replica runs on a thread of its own and holds the journal's lock (PATH.lock) for its
// life, as a broker's journal does. A leader that goes silent past the replica's patience, a
// stream that skips a position, or a record that fails its check makes it ask again from
// scratch; until a new snapshot is whole, the file holds what it held before.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "broker/core/config.hpp"
#include "codec/protocol.hpp"
#include "util/curve_keys.hpp"

namespace rlbus::broker {

struct replica_config {
  std::string journal_path;
  fsync_policy fsync = fsync_policy::batch;
  std::size_t compact_bytes = std::size_t{64} * 1024 * 1024;  // ask for a fresh snapshot past it
  std::string member;                                         // this broker's name in its group
  std::optional<util::curve_pair> curve;                      // the group's key pair, with CURVE on
  std::size_t max_message = std::size_t{16} * 1024 * 1024;
};

class replica {
 public:
  /// Locks the journal (throws journal_in_use when another process holds it) and starts the
  /// thread, which follows nobody until follow() is called.
  replica(zmq::context_t& ctx, replica_config cfg);
  /// Stops the thread and lets the journal's lock go; the file stays as the replica left it.
  ~replica();
  replica(const replica&) = delete;
  replica& operator=(const replica&) = delete;

  /// Follows the leadership `epoch`, whose replication endpoint is `endpoint`; a call with
  /// another epoch or endpoint starts over with it. An empty endpoint follows nobody.
  void follow(const std::string& endpoint, std::uint64_t epoch);

  struct progress {
    std::uint64_t epoch = 0;     // the leadership its file copies, 0 before a whole snapshot
    std::uint64_t position = 0;  // how far into that leadership's stream the file holds
    std::uint64_t snapshots = 0, records_bytes = 0;
  };
  [[nodiscard]] progress state() const;

 private:
  void run();
  struct leader {
    std::string endpoint;
    std::uint64_t epoch = 0;
  };

  zmq::context_t& ctx_;
  const replica_config cfg_;
  int lock_fd_ = -1;
  mutable std::mutex mu_;
  leader wanted_;
  progress progress_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace rlbus::broker
