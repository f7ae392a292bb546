// The broker's journal: an append-only file of what the broker has accepted, so that a broker
// killed at any moment starts again where it was (SPEC §14). It holds the tasks (submitted,
// each attempt begun and ended, each end for good), the latest version of each policy, and
// each coordinator's stream position (the seqs it may have been sent, what it acknowledged,
// and the events that end a task, which it must not miss).
//
// File: an 8-byte signature, then records, each
//   u32 length (of type + body, little endian) | u32 CRC-32 of type + body | u8 type | body
// and a body is a sequence of fields, each a u32 length and that many bytes or a u64, in the
// record's own order; protocol messages inside (a SUBMIT, a TASK_EVENT, a POLICY) are their
// wire bodies, decoded on load under the broker's limits like any message from a peer.
//
// A torn tail is told from damage by construction. A write the process or machine died in
// leaves a final record cut short: a possible length that runs past the end of the file, a
// type we write, and no whole record after it (or, after a machine crash, a run of zeros to
// the end). Only that is skipped, reported, and kept beside the journal as PATH.torn. Any
// other failure (an impossible length, a checksum that fails, a length past the end with
// whole records after it, a record that does not hold what its type says) is damage: the
// load stops, naming the offset, and nothing is compacted away.
//
// One broker per journal: PATH.lock is locked (flock) for the journal's life, and names the
// process that holds it.
//
// Writes go ahead of their effect: a record that a reply depends on (SUBMITTED, a task's
// events, a seq a coordinator may see) is handed to the kernel with write(2) before the
// broker sends anything about it, so a crash of the process loses nothing it has said.
// Whether it also survives a crash of the machine is the fsync policy: every write, every
// 100 ms (batch), or never (none).
//
// Compaction: when the file has grown past its bound, the broker writes what it holds now as
// a fresh file (PATH.tmp, fsync, rename over PATH), so the file stays proportional to the
// live state, not to its history. The same happens once at every start, after the load.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "broker/core/config.hpp"
#include "codec/messages.hpp"
#include "codec/protocol.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

/// A journal that cannot be read (damaged in the middle, not ours, unreadable) or written.
class journal_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The journal is held by another live broker.
class journal_in_use : public journal_error {
 public:
  using journal_error::journal_error;
};

/// A task's effective settings, as the broker runs it.
struct journal_task {
  std::string owner;
  std::uint64_t order = 0;
  codec::submit submit;  // task_id, kind, task_info, requirements, policy_id
  std::uint32_t start_timeout_ms = 0, step_timeout_ms = 0, close_timeout_ms = 0,
                task_timeout_ms = 0, queue_timeout_ms = 0, max_attempts = 1;
  std::uint32_t attempt = 0;  // the last attempt begun; 0 before the first
  bool running = false;       // that attempt had not ended
  std::string worker;         // who ran it
};

/// Everything a load found, in the order it was accepted.
struct journal_state {
  std::vector<journal_task> tasks;  // live tasks, by submission order
  struct stream {
    std::uint64_t head = 0;   // every seq up to here may have been sent
    std::uint64_t acked = 0;  // the coordinator processed every event up to here
    bool windowed = false;
    std::vector<codec::task_event> ends;  // finished / failed / cancelled after `acked`
  };
  std::map<std::string, stream> streams;  // by coordinator id
  struct policy {
    std::string publisher;
    codec::policy latest;
  };
  std::vector<policy> policies;
  std::size_t records = 0;       // records read
  std::size_t bytes = 0;         // of the file
  std::string torn;              // empty, or what was wrong with the last record (skipped)
  std::string torn_kept;         // where the file as read was kept when a tail was skipped
  bool short_signature = false;  // the file held part of a signature only (taken as empty)
};

class journal {
 public:
  /// How long a write may wait for its fsync under the batch policy (a replica's file too).
  static constexpr auto batch_sync_interval = std::chrono::milliseconds(100);

  /// Opens (creating it if need be) and reads `path`. Throws journal_error when it cannot.
  journal(std::string path, fsync_policy fsync, const codec::decode_limits& limits,
          std::size_t compact_bytes = std::size_t{64} * 1024 * 1024);
  ~journal();
  journal(const journal&) = delete;
  journal& operator=(const journal&) = delete;

  /// What the file held when it was opened.
  [[nodiscard]] const journal_state& loaded() const noexcept { return loaded_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  // ---- records (each written through at once, but acked(), which waits for flush()) ----
  void submitted(const journal_task& t);
  void started(const std::string& task_id, std::uint32_t attempt, const std::string& worker);
  void requeued(const std::string& task_id, std::uint32_t attempt);
  void ended(const std::string& task_id);
  /// A TASK_EVENT that ends a task, kept until its coordinator acknowledges it.
  void end_event(const std::string& owner, const codec::task_event& e);
  /// The same, for the TASK_EVENT as it was encoded to be sent (canonical).
  void end_event(const std::string& owner, std::string_view encoded);
  /// Seqs up to `head` of `owner`'s stream may be sent from now on.
  void reserved(const std::string& owner, std::uint64_t head);
  void acked(const std::string& owner, std::uint64_t acked);
  void stream_dropped(const std::string& owner);
  void policy(const std::string& publisher, const codec::policy& p);

  /// Hands what is buffered to the kernel (and fsyncs under "always").
  void flush();
  /// The batch fsync, when it is due.
  void on_timer(util::time_point now);
  [[nodiscard]] std::optional<util::time_point> next_due() const;

  /// Whether the file has grown past its bound since the last compaction.
  [[nodiscard]] bool wants_compaction() const noexcept { return size_ > compact_at_; }
  /// Replaces the file with the records `fill` writes (the live state), atomically.
  void compact(const std::function<void(journal&)>& fill);

  // ---- replication to the standbys of a group (SPEC §14.10) ----
  /// Bytes of records appended since the journal was opened, compactions aside: the position
  /// of the leadership's record stream.
  [[nodiscard]] std::uint64_t position() const noexcept { return position_; }
  /// Called with each record appended from now on (length, checksum, type, body), as the file
  /// holds it, before it is written.
  void tap(std::function<void(std::string_view record)> f) { tap_ = std::move(f); }
  /// The records the file holds now (after its signature), all written first: the journal
  /// as it stands at position().
  [[nodiscard]] std::string records_in_file();
  /// What every journal file starts with.
  static std::string_view signature();
  /// How many bytes of `bytes` are whole, sound records from its start; `why` says what is
  /// wrong with the rest, if anything is.
  static std::size_t whole_records(std::string_view bytes, std::string* why = nullptr);
  /// Where the record that starts at `at` of `bytes` ends (its header read, nothing checked):
  /// for records known to be whole, as records_in_file() gives them.
  static std::size_t record_end(std::string_view bytes, std::size_t at);
  /// Locks PATH.lock for `path` as a broker does for its journal's life, and returns the
  /// descriptor that holds the lock. Throws journal_in_use when another process holds it.
  static int lock_path(const std::string& path);

  struct counters {
    std::uint64_t records = 0, bytes = 0, fsyncs = 0, compactions = 0;
  };
  [[nodiscard]] counters stats() const noexcept { return stats_; }

 private:
  void lock();
  void lock_file(int fd);
  void load(const codec::decode_limits& limits);
  void keep_torn(std::string_view data);
  void append(std::uint8_t type, const std::string& body, bool through);
  void write_all(const char* data, std::size_t n);
  void sync();

  std::string path_;
  fsync_policy fsync_;
  std::size_t compact_bytes_;
  int fd_ = -1;
  struct owned_fd {  // closed even when the constructor throws after lock()
    int fd = -1;
    owned_fd() = default;
    owned_fd(const owned_fd&) = delete;
    owned_fd& operator=(const owned_fd&) = delete;
    ~owned_fd();
  } lock_;
  std::string buf_;
  std::size_t size_ = 0;        // bytes in the file, with what is buffered
  std::size_t compact_at_ = 0;  // compact when size_ passes this
  bool unsynced_ = false;
  bool compacting_ = false;
  std::optional<util::time_point> sync_due_;
  journal_state loaded_;
  counters stats_;
  std::uint64_t position_ = 0;
  std::function<void(std::string_view)> tap_;
};

}  // namespace rlbus::broker
