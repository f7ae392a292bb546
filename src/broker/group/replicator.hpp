// The leader's side of replication (SPEC §14.10): it binds the group's replication endpoint,
// answers a standby's SYNC with the journal as it stands (SNAPSHOT, in parts of whole records)
// and streams every record the journal appends from then on (RECORDS), at least every 500 ms
// (an empty one when nothing was written, so a standby knows its leader is there).
//
// The broker holds back what it sends to peers until every standby in sync holds the records
// it depends on (held_by_all(), server.cpp). A standby is in sync once it holds its snapshot and
// everything after it; one that falls behind for longer than sync-timeout is let go from the
// set (logged and counted) so that the leader serves on, and joins it again once it has caught
// up. A standby that says nothing for a while is forgotten; it asks again when it comes back.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "broker/core/gatekeeper.hpp"
#include "broker/durability/journal.hpp"
#include "codec/messages.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

struct replicator_config {
  std::string endpoint;  // to bind: the one the group's standbys were told
  std::string self;      // the leader's member name
  std::uint64_t leader_epoch = 1;
  /// Records in etcd who is in sync (the leader first); false when it could not. A standby
  /// stops being waited for only once a set without it is recorded (SPEC §14.10.6). None: the
  /// set is recorded nowhere. Called on a thread of the replicator's own, as it waits for etcd.
  std::function<bool(const std::vector<std::string>&)> publish_in_sync;
  /// Wakes the broker's loop (from that thread) once a set is recorded, or could not be.
  std::function<void()> wake;
  std::chrono::milliseconds sync_timeout{1000};
  std::size_t max_message = std::size_t{16} * 1024 * 1024;
};

class replicator {
 public:
  /// Binds the endpoint (CURVE with the broker's own key: only the group's brokers get in) and
  /// taps `j`, which must outlive it.
  replicator(zmq::context_t& ctx, gatekeeper& gate, replicator_config cfg, journal& j);
  ~replicator();
  replicator(const replicator&) = delete;
  replicator& operator=(const replicator&) = delete;

  [[nodiscard]] zmq::socket_t& socket() noexcept { return sock_; }
  /// Reads SYNC and SYNCED messages until none is left.
  void on_readable(util::time_point now);
  /// Sends the records appended since the last call to every standby (and an empty RECORDS to
  /// one that heard nothing for 500 ms); lets go of standbys too far behind for too long.
  void push(util::time_point now);
  /// The stream position that every standby in sync holds: the journal's own position when
  /// none is.
  [[nodiscard]] std::uint64_t held_by_all() const;
  /// When the next push() is due for a heartbeat or a timeout.
  [[nodiscard]] util::time_point next_due() const noexcept { return next_due_; }

  struct standby_state {
    std::string member;
    std::uint64_t position = 0;  // what it holds
    std::uint64_t lag = 0;       // bytes of records it does not hold yet
    bool in_sync = false;
  };
  [[nodiscard]] std::vector<standby_state> standbys() const;
  /// The standbys in sync that etcd records as such: any of them may lead after this broker
  /// (SPEC §14.10.6). Empty when none is.
  [[nodiscard]] std::vector<std::string> successors() const;
  [[nodiscard]] std::uint64_t dropped_total() const noexcept { return dropped_total_; }

 private:
  struct standby {
    std::string routing_id, member;
    std::uint64_t acked = 0;      // what it said it holds
    std::uint64_t snapshot = 0;   // the position its snapshot stood at
    bool in_sync = false;         // waited for
    std::uint64_t joined_at = 0;  // the journal's position when it began to be waited for
    bool leaving = false;         // in sync, until a set without it is recorded
    bool gone = false;            // and then forgotten
    util::time_point behind_since{};
    util::time_point heard{}, sent{};
  };
  void on_sync(const std::string& routing_id, const std::string& member, std::uint64_t epoch,
               util::time_point now);
  bool send_to(standby& s, const codec::message& m);
  void forget(std::size_t i, const std::string& why);
  /// Records the set of standbys in sync when it changed; lets go of those leaving once it is.
  void settle();
  std::vector<std::string> published_;  // the set etcd holds, as last recorded

  // The recording of the set, on a thread of its own: the loop never waits for etcd. One
  // record at a time; settle() asks for one and takes up its answer on a later turn.
  void record_loop();
  void take_recorded();
  void ask_record(const std::vector<std::string>& members);
  std::mutex record_mutex_;
  std::condition_variable record_wake_;
  std::optional<std::vector<std::string>> to_record_;  // asked, not yet taken by the thread
  std::optional<std::pair<std::vector<std::string>, bool>> recorded_;  // its answer
  bool recording_ = false;  // asked, and its answer not taken up yet
  bool record_stop_ = false;
  std::thread recorder_;  // last: started once the rest is

  replicator_config cfg_;
  gatekeeper& gate_;
  journal& journal_;
  zmq::socket_t sock_;
  int monitor_ = -1;
  std::vector<standby> standbys_;
  std::string pending_;             // records appended since the last push
  std::uint64_t pending_from_ = 0;  // the position of its first byte
  util::time_point next_due_{};
  std::uint64_t dropped_total_ = 0;
};

}  // namespace rlbus::broker
