// Replication between the brokers of a group (SPEC §14.10, type ids 0x80-0x8F): a standby
// asks the leader for its journal (SYNC), gets it whole (SNAPSHOT, in parts of whole records)
// and then every record the leader writes (RECORDS), and says how far it has written
// (SYNCED). These travel on the leader's replication endpoint only, never on the ROUTER that
// peers use. Records are the journal file's own bytes (length, checksum, type, body).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "codec/task_messages.hpp"

namespace rlbus::codec {

#define RLBUS_REPLICATION_MESSAGE(name_, id_)     \
  static constexpr msg_type type = msg_type::id_; \
  bool operator==(const name_&) const = default;

/// SYNC (standby -> leader): `member` of the group follows the leadership `leader_epoch`.
struct repl_sync {
  std::string member;
  std::uint64_t leader_epoch = 1;
  RLBUS_REPLICATION_MESSAGE(repl_sync, sync)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("member", s.member, rule::id{});
    f("leader_epoch", s.leader_epoch, rule::range{1, ~std::uint64_t{0}});
  }
};

/// SNAPSHOT (leader -> standby): a part of the journal as it stands at `position` of the
/// leadership's record stream; the standby's journal is these parts, in order, once `last`
/// has come.
struct repl_snapshot {
  std::uint64_t leader_epoch = 1;
  std::uint64_t position = 0;
  std::optional<std::string> records;  // absent: none
  bool last = false;
  RLBUS_REPLICATION_MESSAGE(repl_snapshot, snapshot)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("leader_epoch", s.leader_epoch, rule::range{1, ~std::uint64_t{0}});
    f("position", s.position, rule::u64);
    f("records", s.records, rule::bin{~std::size_t{0}});
    f("last", s.last);
  }
};

/// RECORDS (leader -> standby): the records of the stream from `position` on.
struct repl_records {
  std::uint64_t leader_epoch = 1;
  std::uint64_t position = 0;
  std::optional<std::string> records;  // absent: none
  RLBUS_REPLICATION_MESSAGE(repl_records, records)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("leader_epoch", s.leader_epoch, rule::range{1, ~std::uint64_t{0}});
    f("position", s.position, rule::u64);
    f("records", s.records, rule::bin{~std::size_t{0}});
  }
};

/// SYNCED (standby -> leader): the standby's journal holds the stream up to `position`.
struct repl_synced {
  std::uint64_t position = 0;
  RLBUS_REPLICATION_MESSAGE(repl_synced, synced)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("position", s.position, rule::u64);
  }
};

#undef RLBUS_REPLICATION_MESSAGE

}  // namespace rlbus::codec
