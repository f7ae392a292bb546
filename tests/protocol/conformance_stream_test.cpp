// Conformance, SPEC §12.9: the coordinator's stream replayed from the broker's ring, held to a
// window while the coordinator acknowledges, lost events reported, and collectors' data held
// back by credit. Run against the real broker over tcp with raw DEALERs playing a coordinator
// and its workers. Each test is named after the clause it checks and quotes it ("..." marks a
// cut); every wait has a deadline.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using namespace std::string_literals;
using codec::error_code;

namespace {

inline constexpr std::uint8_t type_replay = 0x40;
inline constexpr std::uint8_t type_ack = 0x41;
inline constexpr std::uint8_t type_stream_gap = 0x42;
inline constexpr std::uint8_t type_data_credit = 0x48;

/// A collector task started on `w` for `coord`, from a stream that is still plain: SUBMITTED,
/// TASK_START, `assigned`, STARTED, `started` (seq 1 and 2).
void start_plain(raw_peer& coord, raw_peer& w, const std::string& id = "t") {
  start_task(coord, w, task_of(id));
}

/// `n` INFOs from the holder of attempt 1 of `task`: n events, none answered.
void infos(raw_peer& w, int n, const std::string& task = "t") {
  for (int i = 0; i < n; ++i) w.send(codec::info{task, 1, codec::empty_map_blob});
  expect_quiet(w);
}

/// The next `n` messages to `coord`, which must all be TASK_EVENTs; their seqs.
std::vector<std::uint64_t> next_seqs(raw_peer& coord, std::size_t n) {
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(next_a<codec::task_event>(coord).seq);
  return out;
}

/// Coordinator "coord" runs a task on collector `w`, makes its stream windowed (ACK 2) and
/// loses its connection; `w` then makes `events` more (3, 4, ...: into the void, or held); the
/// coordinator resumes its session on a new connection, which is returned, WELCOMEd.
std::unique_ptr<raw_peer> resumed_after(broker_with& b, raw_peer& w, int events) {
  auto coord = std::make_unique<raw_peer>(b.ctx, b.router);
  const auto token = join(*coord, "coord", role::coordinator).session;
  join(w, "w", role::collector);
  start_plain(*coord, w);
  coord->send(codec::ack{2});  // windowed from here
  expect_quiet(*coord);
  coord.reset();  // the connection goes; the session stays
  infos(w, events);
  auto again = std::make_unique<raw_peer>(b.ctx, b.router);
  again->send(codec::hello{role::coordinator, "coord", 30'000, {}, token});
  CHECK(next_a<codec::welcome>(*again).resumed);
  return again;
}

broker::config with_window(std::size_t window, std::size_t ring = 65'536) {
  auto cfg = test_config();
  cfg.stream_window = window;
  cfg.stream_ring = ring;
  return cfg;
}

/// What a collector hears after sending one DATA: its credit (when granted) and whether the
/// DATA was refused, read up to the answer of a HEARTBEAT sent right after it.
struct data_outcome {
  bool refused = false;
  std::uint64_t limit = 0;  // the highest DATA_CREDIT limit that came, 0 if none
};

data_outcome send_data(raw_peer& w, const std::string& task, std::uint64_t n) {
  w.send(codec::data_ready{task, 1, "d" + std::to_string(n), "b", codec::empty_map_blob,
                           std::nullopt});
  w.send(codec::heartbeat{});
  data_outcome out;
  while (true) {
    auto m = w.recv();
    REQUIRE(m);
    if (std::holds_alternative<codec::heartbeat>(*m)) return out;
    if (const auto* c = std::get_if<codec::data_credit>(&*m)) {
      out.limit = std::max(out.limit, c->limit);
    } else {
      const auto* e = std::get_if<codec::error>(&*m);
      REQUIRE(e != nullptr);
      INFO(e->reason);
      CHECK(e->code == code_of(error_code::no_credit));
      CHECK(e->ref_type == ref(type_data));
      out.refused = true;
    }
  }
}

/// Sends DATA of task "t" until its attempt has used all the credit it has heard of: `limit`,
/// raised by any DATA_CREDIT that comes meanwhile. None may be refused, nor more than `most`
/// go. Returns how many went.
std::uint64_t use_credit(raw_peer& w, std::uint64_t& limit, std::uint64_t most = 1'000'000) {
  std::uint64_t accepted = 0;
  while (accepted < limit) {
    const auto out = send_data(w, "t", accepted);
    REQUIRE_FALSE(out.refused);
    ++accepted;
    limit = std::max(limit, out.limit);
    REQUIRE(accepted <= most);
  }
  return accepted;
}

}  // namespace

// §12.9.1 "A stream is **plain** until its coordinator's first ACK or REPLAY ... A plain stream
// is sent as §12.8.2 says, every TASK_EVENT as it is made: a coordinator that never sends ACK or
// REPLAY sees exactly the behaviour of §12.1-§12.8."
TEST_CASE("SPEC 12.9.1: a coordinator that never acknowledges gets its stream as in v1", "[spec]") {
  broker_with b(with_window(4));
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  submit_ok(coord, task_of("t"));
  CHECK(next_a<codec::task_start>(w).task_id == "t");  // no DATA_CREDIT before it
  next_event(coord, "t", "assigned");
  w.send(codec::started{"t", 1});
  next_event(coord, "t", "started");
  for (int i = 0; i < 20; ++i)
    w.send(codec::data_ready{"t", 1, "d", "b", codec::empty_map_blob, std::nullopt});
  infos(w, 20);
  CHECK(next_seqs(coord, 40) == range(3, 42));  // far past the window of 4
  expect_quiet(coord);
}

// §12.9.2 "| 1 | `from_seq` | uint | required | 1..2^64-1 ..." §12.9.3 "| 1 | `seq` | uint |
// required | 0..2^64-1 ..." §12.9.5 "| 2 | `attempt` | uint | required | 1..1000 (§12.2.2) |"
TEST_CASE_METHOD(fixture, "SPEC 12.9.2-12.9.5: the fields of the stream messages", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  refused(coord, codec::replay{0}, error_code::bad_field);
  coord.send_frames({header(1, type_ack), packed([](packer& pk) {
                       pk.pack_map(1);
                       pk.pack("seq").pack("1");
                     })});
  next_error(coord, error_code::bad_field, ref(type_ack));
  coord.send_frames({header(1, type_replay), "\x80"});
  next_error(coord, error_code::bad_field, ref(type_replay));
  // Broker-only: decoded first (§3.5.2), so a bad body is a 402 ...
  refused(w, codec::data_credit{"t", 0, 1}, error_code::bad_field);
  refused(coord, codec::stream_gap{0, 1}, error_code::bad_field);
  // ... and a good one a 404.
  refused(w, codec::data_credit{"t", 1, 1}, error_code::unknown_type);
  refused(coord, codec::stream_gap{1, 1}, error_code::unknown_type);
  coord.send(codec::ack{0});  // the smallest ACK: nothing processed yet
  coord.send(codec::replay{1});
  expect_quiet(coord);
}

// §12.9.6 "A REPLAY whose `from_seq` is greater than the head + 1 SHALL be refused with ERROR 413
// (BAD_SEQ). Otherwise the broker SHALL make the stream windowed, take `from_seq` - 1 as
// acknowledged ... and go on sending the stream from `from_seq`, within the window (§12.9.7). The
// TASK_EVENTs it sends again are the ones it sent first, byte for byte, with the same `seq` ...
// `from_seq` = head + 1 asks for nothing old and only makes the stream windowed"
TEST_CASE("SPEC 12.9.6: REPLAY resends the stream byte for byte from any seq it holds", "[spec]") {
  broker_with b(with_window(6));
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  submit_ok(coord, task_of("t"));
  next_a<codec::task_start>(w);
  w.send(codec::started{"t", 1});
  w.send(codec::info{"t", 1, "\x81\xa1x\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00"s});  // float64 1.0
  // A payload of 100 KiB: the broker holds its event in a buffer its sends share (one of 64
  // KiB or more), and every send of it must still carry it whole.
  std::string payload(100 * 1024, '\0');
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7 + i / 251);
  w.send(codec::data_ready{"t", 1, "d1", "b", "\x81\xa1k\xd0\x05"s, payload});
  infos(w, 7);
  std::vector<std::string> first;  // events 1..11 as first sent
  for (int i = 0; i < 11; ++i) first.push_back(next_body(coord, type_task_event));
  REQUIRE(first[3].find(payload) != std::string::npos);    // seq 4, the data event
  refused(coord, codec::replay{13}, error_code::bad_seq);  // the head is 11
  coord.send(codec::replay{2});
  for (std::uint64_t seq = 2; seq <= 7; ++seq) {  // a window of 6, from 2
    INFO("seq " << seq);
    CHECK(next_body(coord, type_task_event) == first[seq - 1]);
  }
  expect_quiet(coord);  // 8..11 wait for an ACK
  coord.send(codec::ack{7});
  for (std::uint64_t seq = 8; seq <= 11; ++seq)
    CHECK(next_body(coord, type_task_event) == first[seq - 1]);
  // Nothing old: only new events from here.
  coord.send(codec::replay{12});
  expect_quiet(coord);
  infos(w, 1);
  CHECK(next_a<codec::task_event>(coord).seq == 12);
  CHECK(b.broker.get().snapshot().stream_replays == 2);
  CHECK(b.broker.get().snapshot().stream_resent == 10);
}

// §12.9.6 (a resumption) §12.8.1 "a resumption (§8.6) continues it" §12.9.7 "An event the
// broker cannot send (the connection is gone or its queue is full, §10.4) is held as well, never
// dropped"
TEST_CASE("SPEC 12.9.6, 12.9.7: back on a new connection, REPLAY fetches what went down",
          "[spec]") {
  broker_with b(with_window(64));
  raw_peer w(b.ctx, b.router);
  auto again = resumed_after(b, w, 5);
  again->send(codec::replay{3});
  CHECK(next_seqs(*again, 5) == range(3, 7));
  expect_quiet(*again);
}

// §12.9.7 "After a resumption (§8.6) of a windowed stream's session the broker SHALL send no
// event of the stream until the coordinator's first REPLAY or ACK on the new connection"
TEST_CASE("SPEC 12.9.7: a resumed coordinator hears nothing of its stream before its REPLAY",
          "[spec]") {
  broker_with b(with_window(64));
  raw_peer w(b.ctx, b.router);
  auto again = resumed_after(b, w, 3);
  infos(w, 1);           // 6, made after the WELCOME
  expect_quiet(*again);  // held: the coordinator has not said from where it goes on
  again->send(codec::replay{3});
  CHECK(next_seqs(*again, 4) == range(3, 6));
  expect_quiet(*again);
}

// §12.9.7 "The broker SHALL send the events of the stream in seq order, and event `next` only
// while `next` <= acked + stream-window ... Events past the window are **held** in the ring and
// sent as ACKs arrive." §12.9.8 "a `seq` not greater than acked changes nothing and is not an
// error, so ACKs may be repeated."
TEST_CASE("SPEC 12.9.7, 12.9.8: at most a window of unacknowledged events is in flight", "[spec]") {
  broker_with b(with_window(4));
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  start_plain(coord, w);  // seq 1, 2
  coord.send(codec::ack{2});
  expect_quiet(coord);  // windowed before the worker's events come (another connection)
  infos(w, 10);         // 3..12
  CHECK(next_seqs(coord, 4) == range(3, 6));
  expect_quiet(coord);
  coord.send(codec::ack{4});
  CHECK(next_seqs(coord, 2) == range(7, 8));
  expect_quiet(coord);
  coord.send(codec::ack{3});  // older than what was acknowledged: nothing happens
  coord.send(codec::ack{4});
  expect_quiet(coord);
  coord.send(codec::ack{8});
  CHECK(next_seqs(coord, 4) == range(9, 12));
  expect_quiet(coord);
}

// §12.9.8 "An ACK whose `seq` is greater than the head SHALL be refused with ERROR 413.
// Otherwise it makes the stream windowed; a `seq` greater than acked becomes acked (if it is at
// or past `next`, the broker skips to the event after it, as the coordinator says)"
TEST_CASE("SPEC 12.9.8: ACK moves the window and may skip what the coordinator has", "[spec]") {
  broker_with b(with_window(2));
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  refused(coord, codec::ack{1}, error_code::bad_seq);  // no event yet: the head is 0
  start_plain(coord, w);
  coord.send(codec::ack{2});
  expect_quiet(coord);  // windowed before the worker's events come (another connection)
  infos(w, 8);          // 3..10
  CHECK(next_seqs(coord, 2) == range(3, 4));
  refused(coord, codec::ack{11}, error_code::bad_seq);
  coord.send(codec::ack{8});  // the coordinator says it has 5..8: the broker skips them
  CHECK(next_seqs(coord, 2) == range(9, 10));
  expect_quiet(coord);
}

// §12.9.9 "When the event the broker is about to send is one the ring has dropped, it SHALL
// first send STREAM_GAP with `first` = that seq and `last` = the seq before the oldest event the
// ring still holds ..., count the lost events as acknowledged ... and go on from the oldest held
// event. No event of a windowed stream is ever skipped in silence."
TEST_CASE("SPEC 12.9.9: events the ring no longer holds are reported with STREAM_GAP", "[spec]") {
  broker_with b(with_window(8, 16));
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  start_plain(coord, w);
  infos(w, 30);  // 3..32; the ring keeps 17..32
  CHECK(next_seqs(coord, 30) == range(3, 32));
  coord.send(codec::replay{1});
  const auto gap = next_a<codec::stream_gap>(coord);
  CHECK(gap.first == 1);
  CHECK(gap.last == 16);
  CHECK(next_seqs(coord, 8) == range(17, 24));
  expect_quiet(coord);
  coord.send(codec::ack{24});
  CHECK(next_seqs(coord, 8) == range(25, 32));
  CHECK(b.broker.get().snapshot().stream_lost == 16);
  // The wire form: exactly first, last.
  coord.send(codec::replay{10});
  check_canonical(next_body(coord, type_stream_gap), {"first", "last"});
}

// §12.9.10 "Before the TASK_START of a credited attempt the broker SHALL send its worker
// DATA_CREDIT for that attempt, even with `limit` 0, and later ones whenever it grants more. A
// DATA of a credited attempt that ... would make the attempt's accepted DATA exceed its `limit`
// SHALL be refused with ERROR 414 (NO_CREDIT) ... The broker SHALL grant only while the stream's
// unacknowledged events (head - acked) plus the credit its credited attempts hold and have not
// used stay within stream-window"
TEST_CASE("SPEC 12.9.10: a credited collector sends no more DATA than its coordinator can take",
          "[spec]") {
  broker_with b(with_window(8));
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  coord.send(codec::replay{1});
  submit_ok(coord, task_of("t"));
  const auto credit = next_a<codec::data_credit>(w);  // the very next message: before the task
  CHECK(credit.task_id == "t");
  CHECK(credit.attempt == 1);
  CHECK(next_a<codec::task_start>(w).task_id == "t");
  w.send(codec::started{"t", 1});
  std::uint64_t limit = credit.limit;
  const auto accepted = use_credit(w, limit, 8);
  CHECK(2 + accepted <= 8);  // assigned, started and the data fit the window
  CHECK(send_data(w, "t", accepted).refused);
  CHECK(next_seqs(coord, 2 + accepted) == range(1, 2 + accepted));  // the refused one made none
  expect_quiet(coord);
  // The coordinator catches up: more credit, and the DATA goes through.
  coord.send(codec::ack{2 + accepted});
  const auto body = next_body(w, type_data_credit);
  check_canonical(body, {"task_id", "attempt", "limit"});
  const auto more = codec::decode_body(type_data_credit, body);
  REQUIRE(more);
  CHECK(std::get<codec::data_credit>(more.value()).limit > limit);
  CHECK_FALSE(send_data(w, "t", accepted).refused);
  CHECK(next_event(coord, "t", "data").seq == 3 + accepted);
}

// §12.9.10 "A worker cannot ask for credit, and one that has used what it knows of waits for
// DATA_CREDIT, so the broker SHALL send an attempt's DATA_CREDIT again, with its current
// `limit`, right after the WELCOME that resumes the worker's session (§8.6), since the old
// connection may have taken the last one down"
TEST_CASE("SPEC 12.9.10: a resumed collector hears its credit again", "[spec]") {
  broker_with b(with_window(8));
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  const auto welcome = join(w, "w", role::collector);
  coord.send(codec::replay{1});
  submit_ok(coord, task_of("t"));
  std::uint64_t limit = next_a<codec::data_credit>(w).limit;
  next_a<codec::task_start>(w);
  w.send(codec::started{"t", 1});
  const auto accepted = use_credit(w, limit);
  // The coordinator catches up and the broker grants more, on a connection that then breaks:
  // the worker never reads it.
  next_seqs(coord, 2 + accepted);
  coord.send(codec::ack{2 + accepted});
  const auto granted = next_a<codec::data_credit>(w).limit;
  REQUIRE(granted > limit);
  raw_peer again(b.ctx, b.router);
  again.send(codec::hello{role::collector, "w", 30'000, {}, welcome.session});
  CHECK(next_a<codec::welcome>(again).resumed);
  std::optional<std::uint64_t> heard;
  while (auto m = again.recv(2000ms)) {
    if (const auto* c = std::get_if<codec::data_credit>(&*m)) {
      heard = c->limit;
      break;
    }
  }
  REQUIRE(heard);
  CHECK(*heard == granted);
  CHECK_FALSE(send_data(again, "t", accepted).refused);
}

// §12.9.11 "When the step deadline (§12.7.1) of a running credited attempt passes while that
// attempt has used all its credit, the broker SHALL set the deadline step-timeout later instead
// of ending the attempt: its worker is held back by the coordinator, not silent. The task
// timeout still caps every deadline, so it still bounds the attempt."
TEST_CASE("SPEC 12.9.11: a collector held back by the window does not time out", "[spec]") {
  broker_with b(with_window(4));
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  coord.send(codec::replay{1});
  auto s = task_of("t");
  s.step_timeout_ms = 200;
  s.task_timeout_ms = 2000;
  s.max_attempts = 1;
  submit_ok(coord, s);
  std::uint64_t limit = next_a<codec::data_credit>(w).limit;
  next_a<codec::task_start>(w);
  w.send(codec::started{"t", 1});
  use_credit(w, limit);
  // Several step timeouts pass and the attempt goes on ...
  CHECK_FALSE(w.recv_a<codec::task_abort>(1000ms));
  // ... until the task timeout, which still bounds it.
  const auto abort = w.recv_a<codec::task_abort>(5000ms);
  REQUIRE(abort);
  CHECK(abort->reason == "task timeout");
}

// §12.9.12 "REPLAY and ACK are coordinator messages: from a worker they SHALL be refused with
// ERROR 404 (§12.1.3). STREAM_GAP and DATA_CREDIT are broker-only (§3.5.2). A REPLAY or ACK
// refused with 413, and a DATA refused with 414, is a fault of §10 like any other"
TEST_CASE("SPEC 12.9.12: stream messages from the wrong sender, and bad seqs, are faults",
          "[spec]") {
  auto cfg = with_window(4);
  cfg.max_faults = 3;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::learner);
  refused(w, codec::replay{1}, error_code::unknown_type);
  refused(w, codec::ack{0}, error_code::unknown_type);
  refused(w, codec::stream_gap{1, 2}, error_code::unknown_type);
  CHECK(b.broker.get().snapshot().faults == 3);
  const auto left = next_a<codec::disconnect>(w);  // the third fault: max-faults 3
  CHECK(left.code == code_of(error_code::too_many_faults));
  refused(coord, codec::replay{2}, error_code::bad_seq);
  refused(coord, codec::ack{1}, error_code::bad_seq);
  refused(coord, codec::data_credit{"t", 1, 1}, error_code::unknown_type);
  CHECK(next_a<codec::disconnect>(coord).code == code_of(error_code::too_many_faults));
}
