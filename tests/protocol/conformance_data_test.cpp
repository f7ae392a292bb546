// Conformance, SPEC §12.11: indexed DATA relayed exactly once and in order, confirmed with
// DATA_ACK, sent again after a reconnect, and DATA a worker gave up on reported as lost. Run
// against the real broker over tcp with raw DEALERs playing a coordinator and its collector.
// Each test is named after the clause it checks and quotes it ("..." marks a cut); every
// wait has a deadline.
#include <catch2/catch.hpp>

#include <string>

#include "codec/map_writer.hpp"
#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using namespace std::string_literals;
using codec::error_code;

namespace {

inline constexpr std::uint8_t type_data_ack = 0x49;
inline constexpr std::uint8_t type_data_lost = 0x4A;

/// The next TASK_EVENT to `coord` must be `data` of the DATA numbered `index`.
void next_data(raw_peer& coord, std::uint64_t index, const std::string& task = "t") {
  const auto e = next_event(coord, task, "data");
  CHECK(e.body.find("d" + std::to_string(index)) != std::string::npos);
}

/// The next message to `p` other than DATA_CREDIT (a credited attempt gets top-ups as it
/// goes) must be a T.
template <class T>
T next_but_credit(raw_peer& p) {
  while (true) {
    auto m = p.recv(3000ms);
    REQUIRE(m);
    if (std::holds_alternative<codec::data_credit>(*m)) continue;
    if (const auto* e = std::get_if<codec::error>(&*m)) FAIL("unexpected ERROR " << e->reason);
    REQUIRE(std::holds_alternative<T>(*m));
    return std::get<T>(*m);
  }
}

}  // namespace

// §12.3.13 "| 8 | `index` | uint | optional | 1..2^64-1, the DATA's number within its attempt,
// from 1 (§12.11) |" §12.11.2, §12.11.3 (the fields of DATA_ACK and DATA_LOST). §3.5.2:
// DATA_ACK is broker-only; DATA_LOST is a worker message (§12.1.3).
TEST_CASE_METHOD(fixture, "SPEC 12.11.1-12.11.3: the fields and directions of reliable data",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  auto zero = indexed_data(1);
  zero.index = 0;
  w.send(zero);
  next_error(w, error_code::bad_field, ref(type_data));
  w.send(codec::data_ack{"t", 1, 0, false});
  next_error(w, error_code::unknown_type, ref(type_data_ack));
  coord.send(codec::data_lost{"t", 1, 1, 1});
  next_error(coord, error_code::unknown_type, ref(type_data_lost));
  // None of that changed anything: DATA 1 is still the next one relayed.
  w.send(indexed_data(1));
  next_data(coord, 1);
  expect_quiet(w);
}

// §12.11.1 "A DATA without `index` is handled exactly as §12.5 says: old peers work unchanged."
TEST_CASE_METHOD(fixture, "SPEC 12.11.1: DATA without index is relayed every time, as before",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  w.send(indexed_data(1));
  auto plain = indexed_data(1);
  plain.index.reset();
  w.send(plain);
  w.send(plain);
  next_data(coord, 1);
  next_data(coord, 1);
  next_data(coord, 1);
  expect_quiet(w);  // no DATA_ACK, no ERROR
}

// §12.11.4 "1. i <= relayed: a **duplicate**. The broker SHALL drop it: no TASK_EVENT, no ERROR,
// no credit used (§12.11.5), the deadline unchanged; it is not a fault, and the broker counts
// it ... 3. i = relayed + 1: ... relayed as `data` (§12.5.2); relayed becomes i."
TEST_CASE_METHOD(fixture, "SPEC 12.11.4: each index is relayed once, duplicates are dropped",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  for (std::uint64_t i = 1; i <= 3; ++i) w.send(indexed_data(i));
  for (std::uint64_t i = 1; i <= 3; ++i) w.send(indexed_data(i));  // a resend after a reconnect
  w.send(indexed_data(4));
  for (std::uint64_t i = 1; i <= 4; ++i) next_data(coord, i);
  expect_quiet(w);
  expect_quiet(coord);
  CHECK(broker.get().snapshot().data_duplicates == 3);
  CHECK(broker.get().snapshot().faults == 0);
}

// §12.11.4 "2. i > relayed + 1: **out of order** ... The broker SHALL drop it like a duplicate
// (counted as out of order) and answer DATA_ACK with `resend` = true for the first one after
// relayed last changed and for every 64th after that, and for no other"
TEST_CASE_METHOD(fixture, "SPEC 12.11.4: DATA past a gap is dropped and a resend is asked once",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  w.send(indexed_data(1));
  next_data(coord, 1);
  for (std::uint64_t i = 3; i <= 5; ++i) w.send(indexed_data(i));  // 2 went missing
  const auto ack = next_a<codec::data_ack>(w);
  CHECK(ack.task_id == "t");
  CHECK(ack.attempt == 1);
  CHECK(ack.relayed == 1);
  CHECK(ack.resend);
  expect_quiet(w);  // one DATA_ACK for the three
  expect_quiet(coord);
  for (std::uint64_t i = 2; i <= 5; ++i) w.send(indexed_data(i));
  for (std::uint64_t i = 2; i <= 5; ++i) next_data(coord, i);
  expect_quiet(w);
  CHECK(broker.get().snapshot().data_out_of_order == 3);
  // Every 64th out-of-order DATA is answered again, so a lost DATA_ACK is made good.
  for (std::uint64_t i = 0; i < 65; ++i) w.send(indexed_data(7));
  CHECK(next_a<codec::data_ack>(w).relayed == 5);
  CHECK(next_a<codec::data_ack>(w).relayed == 5);
  expect_quiet(w);
}

// §12.11.4 "since it may have been emitted before the worker saw TASK_CLOSE and be sent again
// after a reconnect, it is also accepted while the task is closing." §12.5.3 (DATA without
// index while closing: 408).
TEST_CASE_METHOD(fixture, "SPEC 12.11.4: indexed DATA is still relayed while the task closes",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  w.send(indexed_data(1));
  next_data(coord, 1);
  coord.send(codec::finish{"t"});
  next_a<codec::task_close>(w);
  w.send(indexed_data(2));
  next_data(coord, 2);
  auto plain = indexed_data(3);
  plain.index.reset();
  w.send(plain);
  next_error(w, error_code::wrong_state, ref(type_data));
  w.send(codec::task_result{"t", 1, codec::empty_map_blob});
  next_event(coord, "t", "finished");
}

// §12.11.5 "A duplicate or an out-of-order DATA uses no credit and is never refused with 414,
// so a worker that sends again what it sent before, within the credit it had, is never
// refused."
TEST_CASE("SPEC 12.11.5: resending within credit is never refused NO_CREDIT", "[spec]") {
  auto cfg = test_config();
  cfg.stream_window = 8;  // chunks of 4 for one attempt
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  coord.send(codec::replay{1});  // windowed: the attempt is credited
  submit_ok(coord, task_of("t"));
  const auto credit = next_a<codec::data_credit>(w);
  REQUIRE(credit.limit == 4);
  next_a<codec::task_start>(w);
  w.send(codec::started{"t", 1});
  for (std::uint64_t i = 1; i <= 4; ++i) w.send(indexed_data(i));
  // All four credited DATA again, and one more out of order: dropped, no 414.
  for (std::uint64_t i = 1; i <= 4; ++i) w.send(indexed_data(i));
  w.send(indexed_data(6));
  const auto ack = next_but_credit<codec::data_ack>(w);
  CHECK(ack.relayed == 4);
  CHECK(ack.resend);
  w.send(codec::heartbeat{});
  next_but_credit<codec::heartbeat>(w);  // and no ERROR
  CHECK(b.broker.get().snapshot().faults == 0);
  CHECK(b.broker.get().snapshot().data_duplicates == 4);
}

// §12.11.6 "Otherwise the DATA relayed + 1 to `last` are lost: the broker SHALL set relayed to
// `last`, count them ... and emit `data_lost` with `first_index` = relayed + 1 (before the
// change) and `last_index` = `last`, in its place in the owner's stream" "If `last` <=
// relayed, every DATA it names was relayed after all: it changes nothing and is not an error."
TEST_CASE_METHOD(fixture, "SPEC 12.11.6: DATA the worker gave up on is reported, only once",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  for (std::uint64_t i = 1; i <= 3; ++i) w.send(indexed_data(i));
  w.send(codec::data_lost{"t", 1, 2, 6});  // 2 and 3 got here after all
  w.send(indexed_data(7));
  w.send(codec::data_lost{"t", 1, 1, 5});  // nothing new
  for (std::uint64_t i = 1; i <= 3; ++i) next_data(coord, i);
  const auto lost = next_event(coord, "t", "data_lost");
  CHECK(lost.attempt == 1);
  CHECK(lost.worker_id == "w");
  CHECK(lost.body == codec::map_writer(2).uint("first_index", 4).uint("last_index", 6).done());
  next_data(coord, 7);
  expect_quiet(w);
  expect_quiet(coord);
  CHECK(broker.get().snapshot().data_lost == 3);
}

// §12.11.6 "the broker SHALL refuse it with ERROR 415 (BAD_INDEX) when `last` < `first`, or
// when the attempt is credited and `last` - relayed is more than the attempt's unused credit"
// "A DATA_LOST whose `first` is greater than relayed + 1 is out of order too (rule 2)."
TEST_CASE("SPEC 12.11.6: a backwards DATA_LOST, or one past credit, is refused BAD_INDEX",
          "[spec]") {
  auto cfg = test_config();
  cfg.stream_window = 8;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  coord.send(codec::replay{1});
  submit_ok(coord, task_of("t"));
  REQUIRE(next_a<codec::data_credit>(w).limit == 4);
  next_a<codec::task_start>(w);
  w.send(codec::started{"t", 1});
  w.send(codec::data_lost{"t", 1, 3, 2});
  next_error(w, error_code::bad_index, ref(type_data_lost));
  w.send(codec::data_lost{"t", 1, 1, 5});
  next_error(w, error_code::bad_index, ref(type_data_lost));
  w.send(codec::data_lost{"t", 1, 3, 3});  // skips 1 and 2: out of order
  const auto ack = next_a<codec::data_ack>(w);
  CHECK(ack.relayed == 0);
  CHECK(ack.resend);
  // Within credit it is accepted and uses that credit, which is then topped up.
  w.send(codec::data_lost{"t", 1, 1, 4});
  CHECK(next_a<codec::data_credit>(w).limit == 8);
  // The counters are stored once DATA_LOST is handled, just after the credit left.
  CHECK(wait_until([&] { return b.broker.get().snapshot().data_lost == 4; }));
  CHECK(b.broker.get().snapshot().faults == 2);
}

// §12.11.7 "The broker SHALL send the holder DATA_ACK with `resend` = false and the current
// relayed value after every 32 indexed DATA it relays ... and, for the collector task the
// worker holds while it is running or closing, right after the WELCOME that resumes the
// worker's session (§8.6)."
TEST_CASE_METHOD(fixture, "SPEC 12.11.7: DATA_ACK every 32 DATA and after a resumption", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  join(coord, "coord", role::coordinator);
  const auto welcome = join(w, "w", role::collector);
  start_task(coord, w, task_of("t"));
  for (std::uint64_t i = 1; i <= 40; ++i) w.send(indexed_data(i));
  const auto ack = next_a<codec::data_ack>(w);
  CHECK(ack.relayed == 32);
  CHECK_FALSE(ack.resend);
  expect_quiet(w);
  for (std::uint64_t i = 1; i <= 40; ++i) next_data(coord, i);

  raw_peer again(ctx, router);
  again.send(codec::hello{role::collector, "w", 30'000, {}, welcome.session});
  CHECK(next_a<codec::welcome>(again).resumed);
  const auto resumed = next_a<codec::data_ack>(again);
  CHECK(resumed.task_id == "t");
  CHECK(resumed.relayed == 40);
  CHECK_FALSE(resumed.resend);
  again.send(indexed_data(41));
  next_data(coord, 41);
}

// §12.2.3.1 "... `meta` of DATA, `info` of LEARN_INFO and `result` of TASK_FAILED SHALL nest
// at most 14 levels of maps and arrays, the field's own map counting as the first ... A deeper
// one is refused with 402 naming the field; like every refusal it changes nothing (§12.5.4)."
// The events that carry them decode within §5.1 (the test's codec reads them under it).
TEST_CASE_METHOD(fixture, "SPEC 12.2.3.1: user maps relayed one level deeper nest at most 14",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  auto deep = indexed_data(1);
  deep.meta = nested_map(15);  // the DATA is 16 levels deep: within §5.1, its event would not be
  w.send(deep);
  CHECK(next_error(w, error_code::bad_field, ref(type_data)).reason.find("'meta'") !=
        std::string::npos);
  auto edge = indexed_data(1);
  edge.meta = nested_map(14);
  w.send(edge);  // index 1 is still the next: the refusal changed nothing
  const auto e = next_event(coord, "t", "data");
  CHECK(e.body.find(edge.meta) != std::string::npos);

  w.send(codec::task_failed{"t", 1, "broke", nested_map(15)});
  CHECK(next_error(w, error_code::bad_field, ref(type_task_failed)).reason.find("'result'") !=
        std::string::npos);
  w.send(codec::task_failed{"t", 1, "broke", nested_map(14)});
  const auto end = next_a<codec::task_event>(coord);
  CHECK((end.event == "requeued" || end.event == "failed"));
  CHECK(end.body.find(nested_map(14)) != std::string::npos);
}
