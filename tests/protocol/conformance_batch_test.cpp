// Conformance, SPEC §12.12: DATA_BATCH, consecutive indexed DATA in one message, judged as
// its items would be one by one and relayed as one `data_batch` event whose items are the
// worker's bytes. Run against the real broker over tcp with raw DEALERs playing a coordinator
// and its collector. Each test is named after the clause it checks and quotes it ("..."
// marks a cut); every wait has a deadline.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "codec/codec.hpp"
#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using namespace std::string_literals;
using codec::error_code;

namespace {

inline constexpr std::uint8_t type_data_batch = 0x4B;

/// The item DATA number `index` stands for: its data_id names the index.
codec::data_item item(std::uint64_t index) {
  return codec::data_item{"d" + std::to_string(index), "b", codec::empty_map_blob, std::nullopt,
                          std::nullopt};
}

/// A DATA_BATCH of attempt 1 of `task`: the items of DATA first .. first + n - 1.
codec::data_batch batch(std::uint64_t first, std::uint64_t n, const std::string& task = "t") {
  codec::items_writer items;
  for (std::uint64_t i = first; i < first + n; ++i) items.add(item(i));
  return codec::data_batch{task, 1, first, items.done()};
}

/// The next TASK_EVENT to `coord` must be a `data_batch` of the items of DATA first .. last,
/// each the bytes the worker wrote for it.
void next_batch(raw_peer& coord, std::uint64_t first, std::uint64_t last,
                const std::string& task = "t") {
  const auto e = next_event(coord, task, "data_batch");
  CHECK(e.worker_id == "w");
  const auto view = codec::read_data_batch_body(e.body);
  REQUIRE(view);
  CHECK(view.value().first_index == first);
  const auto expected = batch(first, last - first + 1, task);
  std::vector<std::string_view> got;
  for (const auto& item : view.value().items) got.push_back(item.bytes);
  CHECK(got == codec::split_items(expected.items));
}

}  // namespace

// §12.12.1 "The broker judges a batch as it would judge its items one by one, in order, and
// relays what it accepts as one TASK_EVENT `data_batch`" §12.5.6 "map: `first_index` uint ...
// then `items`: the new items, byte for byte, in index order" §12.12.3 "A DATA_LOST ... and
// the DATA, INFO and DATA_BATCH of an attempt share one sequence of indexes".
TEST_CASE_METHOD(fixture, "SPEC 12.12.1-12.12.3: a batch is relayed as one event, item by item",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  // Items with everything an item may hold travel unchanged.
  codec::items_writer full;
  full.add(codec::data_item{"d1", "replay",
                            "\x81\xa3"
                            "env\x07"s,
                            "\x00\xff"s, 3});
  full.add(item(2));
  w.send(codec::data_batch{"t", 1, 1, full.done()});
  const auto e = next_event(coord, "t", "data_batch");
  CHECK(e.attempt == 1);
  const auto view = codec::read_data_batch_body(e.body);
  REQUIRE(view);
  REQUIRE(view.value().items.size() == 2);
  CHECK(view.value().items[0].data_id == "d1");
  CHECK(view.value().items[0].buffer_id == "replay");
  CHECK(view.value().items[0].bytes ==
        "\x85\xa7"
        "data_id\xa2"
        "d1\xa9"
        "buffer_id\xa6replay\xa4meta\x81\xa3"
        "env\x07"
        "\xa7payload\xc4\x02\x00\xff\xaepolicy_version\x03"s);
  // A DATA, then a batch, then a DATA: one sequence.
  w.send(indexed_data(3));
  w.send(batch(4, 3));
  w.send(indexed_data(7));
  CHECK(next_event(coord, "t", "data").body.find("d3") != std::string::npos);
  next_batch(coord, 4, 6);
  CHECK(next_event(coord, "t", "data").body.find("d7") != std::string::npos);
  expect_quiet(w);
  CHECK(broker.get().snapshot().faults == 0);
}

// §12.12.1 "A DATA_BATCH is a collector's message about its attempt, fenced like every worker
// message (§12.7.5); from a coordinator it is refused with 404" §12.12.3 "accepted only from
// the holder of a collector task that is running or closing".
TEST_CASE_METHOD(fixture, "SPEC 12.12.1: who may send a batch, and when", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router), other(ctx, router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  join(other, "other", role::collector);
  submit_ok(coord, task_of("t"));
  // Not started yet: a batch belongs to a running task.
  raw_peer* holder = nullptr;
  for (auto* p : {&w, &other}) {
    if (auto m = p->recv(300ms)) {
      REQUIRE(std::holds_alternative<codec::task_start>(*m));
      holder = p;
    }
  }
  REQUIRE(holder != nullptr);
  next_event(coord, "t", "assigned");
  raw_peer& stranger = holder == &w ? other : w;
  holder->send(batch(1, 2));
  next_error(*holder, error_code::wrong_state, ref(type_data_batch));
  holder->send(codec::started{"t", 1});
  next_event(coord, "t", "started");
  stranger.send(batch(1, 2));
  next_error(stranger, error_code::unknown_task, ref(type_data_batch));
  coord.send(batch(1, 2));
  next_error(coord, error_code::unknown_type, ref(type_data_batch));
  auto later = batch(1, 2);
  later.attempt = 2;
  holder->send(later);
  next_error(*holder, error_code::unknown_task, ref(type_data_batch));
  // None of that changed anything: index 1 is still the next one relayed.
  holder->send(batch(1, 2));
  const auto e = next_event(coord, "t", "data_batch");
  CHECK(codec::read_data_batch_body(e.body).value().first_index == 1);
}

// §12.12.3 "1. `last` <= relayed: every item is a duplicate ... counting each item in
// `data_duplicates`. 2. `first` > relayed + 1: **out of order** ... a batch counting as one
// message for the answers and each item in `data_out_of_order`. 3. Otherwise the items `first`
// to relayed are duplicates ... the new items are emitted as one `data_batch` whose
// `first_index` is the index of the first new item."
TEST_CASE_METHOD(fixture, "SPEC 12.12.3: duplicates are dropped, item by item", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  w.send(batch(1, 3));
  w.send(batch(2, 4));  // 2 and 3 again, then 4 and 5: a resend that overlaps
  w.send(batch(1, 5));  // nothing new
  w.send(batch(8, 2));  // 6 and 7 went missing
  next_batch(coord, 1, 3);
  next_batch(coord, 4, 5);
  const auto ack = next_a<codec::data_ack>(w);
  CHECK(ack.relayed == 5);
  CHECK(ack.resend);
  w.send(batch(6, 4));
  next_batch(coord, 6, 9);
  expect_quiet(coord);
  expect_quiet(w);
  const auto s = broker.get().snapshot();
  CHECK(s.data_duplicates == 2 + 5);
  CHECK(s.data_out_of_order == 2);
  CHECK(s.faults == 0);
}

// §12.12.3 "When the attempt is credited and its accepted DATA plus the new items would
// exceed its `limit`, the batch SHALL be refused with ERROR 414 as a whole; like every refusal
// it changes nothing ... The broker then tries to grant credit, as after an accepted DATA."
TEST_CASE("SPEC 12.12.3: credit counts items, and a batch past it is refused whole", "[spec]") {
  auto cfg = test_config();
  cfg.stream_window = 8;  // chunks of 4 for one attempt
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), w(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(w, "w", role::collector);
  coord.send(codec::replay{1});  // windowed: the attempt is credited
  submit_ok(coord, task_of("t"));
  REQUIRE(next_a<codec::data_credit>(w).limit == 4);
  next_a<codec::task_start>(w);
  w.send(codec::started{"t", 1});
  w.send(batch(1, 5));  // one message, but five items: one past the credit
  CHECK(next_error(w, error_code::no_credit, ref(type_data_batch)).reason.find("5 more") !=
        std::string::npos);
  w.send(batch(1, 4));  // the same indexes within it: the refusal changed nothing
  const auto topped = next_a<codec::data_credit>(w).limit;
  CHECK(topped > 4);
  CHECK(topped <= 4 + cfg.stream_window);
  w.send(batch(5, topped - 4 + 1));
  next_error(w, error_code::no_credit, ref(type_data_batch));
  w.send(batch(3, topped - 4 + 2));  // 3 and 4 again, then exactly what is left
  next_event(coord, "t", "assigned");
  next_event(coord, "t", "started");
  next_batch(coord, 1, 4);
  next_batch(coord, 5, topped);
  // The counters are stored once the batch is handled, just after its event left.
  CHECK(wait_until([&] { return b.broker.get().snapshot().data_duplicates == 2; }));
  CHECK(b.broker.get().snapshot().faults == 2);
}

// §12.12.3 "each new item counts towards the next DATA_ACK (§12.11.7)" §12.11.7 "once it has
// relayed 32 indexed items of the attempt ... since its last DATA_ACK".
TEST_CASE_METHOD(fixture, "SPEC 12.12.3: DATA_ACK counts the items of batches", "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  w.send(batch(1, 20));
  w.send(batch(21, 20));
  const auto ack = next_a<codec::data_ack>(w);
  CHECK(ack.relayed == 40);
  CHECK_FALSE(ack.resend);
  next_batch(coord, 1, 20);
  next_batch(coord, 21, 40);
  expect_quiet(w);
}

// §12.12.3 "accepted only from the holder of a collector task that is running or closing ...
// the step deadline is set when the task is running (a closing task keeps its close deadline)"
TEST_CASE_METHOD(fixture, "SPEC 12.12.3: a batch is still relayed while the task closes",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  coord.send(codec::finish{"t"});
  next_a<codec::task_close>(w);
  w.send(batch(1, 2));
  next_batch(coord, 1, 2);
  w.send(codec::task_result{"t", 1, codec::empty_map_blob});
  next_event(coord, "t", "finished");
}

// §12.2.3.1 "The `meta` of a DATA_BATCH item ... SHALL nest at most 12 levels". §12.12.2 "A
// batch whose `items` is not an array of 1 to 1024 such maps ... is refused with 402".
TEST_CASE_METHOD(fixture, "SPEC 12.12.2: items are checked, and their meta nests at most 12",
                 "[spec]") {
  raw_peer coord(ctx, router), w(ctx, router);
  running(coord, w);
  codec::items_writer deep;
  auto too_deep = item(1);
  too_deep.meta = nested_map(13);
  deep.add(too_deep);
  w.send(codec::data_batch{"t", 1, 1, deep.done()});
  CHECK(next_error(w, error_code::bad_field, ref(type_data_batch)).reason.find("'meta'") !=
        std::string::npos);
  codec::items_writer edge;
  auto deepest = item(1);
  deepest.meta = nested_map(12);
  edge.add(deepest);
  w.send(codec::data_batch{"t", 1, 1, edge.done()});
  const auto e = next_event(coord, "t", "data_batch");  // and it decodes within §5.1
  CHECK(e.body.find(deepest.meta) != std::string::npos);
  w.send(codec::data_batch{"t", 1, 2, {"\x90"s, {}}});
  next_error(w, error_code::bad_field, ref(type_data_batch));
}
