// An attempt's data credit and indexed sequence on their own (attempt_data, SPEC §12.9.9,
// §12.11): what may be accepted, when a top-up is due and how far it goes, the window's
// room, duplicates and gaps, when a DATA_ACK is due and when a resend is asked for.
#include <catch2/catch.hpp>

#include "broker/tasks/attempt_data.hpp"

using rlbus::broker::attempt_data;

TEST_CASE("attempt data: without credit everything may be accepted", "[unit][tasks]") {
  attempt_data d;
  CHECK_FALSE(d.credited());
  CHECK(d.may_accept());
  CHECK(d.may_accept(1'000'000));
  CHECK_FALSE(d.exhausted());
  d.accept(5);
  CHECK(d.may_accept());
  CHECK_FALSE(d.end_credit());  // it held none
}

TEST_CASE("attempt data: credit is used, topped up within the chunk and given back",
          "[unit][tasks]") {
  attempt_data d;
  d.accept(7);  // before the credit: begin_credit starts from nothing
  d.begin_credit();
  CHECK(d.credited());
  CHECK(d.accepted() == 0);
  CHECK(d.limit() == 0);
  CHECK(d.exhausted());
  CHECK_FALSE(d.may_accept());
  CHECK(d.due_top_up(8));
  CHECK(d.top_up(8, 100) == 8);  // up to the chunk
  CHECK(d.limit() == 8);
  CHECK(d.may_accept(8));
  CHECK_FALSE(d.may_accept(9));
  d.accept(3);
  CHECK(d.unused() == 5);
  CHECK_FALSE(d.due_top_up(8));  // used less than half its chunk
  d.accept();
  CHECK(d.due_top_up(8));      // 4 left of 8: half used
  CHECK(d.top_up(8, 3) == 3);  // no more than the room
  CHECK(d.limit() == 11);
  CHECK(d.top_up(8, 0) == 0);
  d.accept(7);
  CHECK(d.exhausted());
  CHECK(d.end_credit());
  CHECK_FALSE(d.credited());
  CHECK(d.limit() == 0);
  CHECK(d.accepted() == 0);
  CHECK(d.may_accept());
}

TEST_CASE("attempt data: the chunk shares the window by twice the credited attempts",
          "[unit][tasks]") {
  CHECK(attempt_data::chunk(64, 0) == 32);
  CHECK(attempt_data::chunk(64, 1) == 32);
  CHECK(attempt_data::chunk(64, 4) == 8);
  CHECK(attempt_data::chunk(4, 100) == 1);  // never 0
}

TEST_CASE("attempt data: the window's room counts the backlog, the unused credit and bytes",
          "[unit][tasks]") {
  // events: window 64, 10 unacknowledged, 20 granted and unused
  CHECK(attempt_data::room(64, 10, 20, 0, 1000, 0, false) == 34);
  CHECK(attempt_data::room(64, 40, 30, 0, 1000, 0, false) == 0);  // past the window
  // bytes: 1000 - 200 left, 100 a unit: 8 units, 5 of them already granted
  CHECK(attempt_data::room(64, 0, 5, 200, 1000, 100, false) == 3);
  CHECK(attempt_data::room(64, 0, 9, 200, 1000, 100, false) == 0);
  CHECK(attempt_data::room(64, 0, 0, 1000, 1000, 1, false) == 0);  // the byte budget is used
  CHECK(attempt_data::room(64, 0, 0, 0, 1000, 0, true) == 0);      // held back
}

TEST_CASE("attempt data: indexes are duplicates, the next one or past it", "[unit][tasks]") {
  attempt_data d;
  d.begin();
  CHECK(d.relayed() == 0);
  CHECK_FALSE(d.duplicate(1));
  CHECK_FALSE(d.past_next(1));
  CHECK(d.past_next(2));
  CHECK_FALSE(d.relayed_up_to(3, 3, 30));
  CHECK(d.relayed() == 3);
  CHECK(d.duplicate(1));
  CHECK(d.duplicate(3));
  CHECK_FALSE(d.duplicate(4));
  CHECK_FALSE(d.past_next(4));
  CHECK(d.past_next(5));
  d.lost_up_to(6);  // declared lost: as good as relayed
  CHECK(d.relayed() == 6);
  CHECK(d.duplicate(6));
  CHECK_FALSE(d.past_next(7));
  d.begin();  // a new attempt starts its sequence again
  CHECK(d.relayed() == 0);
  CHECK_FALSE(d.duplicate(1));
}

TEST_CASE("attempt data: a DATA_ACK is due every 32 items or every MiB", "[unit][tasks]") {
  attempt_data d;
  d.begin();
  for (std::uint64_t i = 1; i < attempt_data::ack_every; ++i)
    CHECK_FALSE(d.relayed_up_to(i, 1, 10));
  CHECK(d.relayed_up_to(attempt_data::ack_every, 1, 10));
  d.acked();
  CHECK_FALSE(d.relayed_up_to(33, 1, attempt_data::ack_bytes - 1));
  CHECK(d.relayed_up_to(34, 1, 1));
  d.acked();
  CHECK_FALSE(d.relayed_up_to(35, 1, 1));
}

TEST_CASE("attempt data: a gap asks for a resend once and then every 64th time", "[unit][tasks]") {
  attempt_data d;
  d.begin();
  CHECK(d.gap_asks_resend());
  for (int i = 1; i < 64; ++i) CHECK_FALSE(d.gap_asks_resend());
  CHECK(d.gap_asks_resend());
  CHECK_FALSE(d.gap_asks_resend());
  (void)d.relayed_up_to(1, 1, 1);  // a relay ends the gap: the next one asks at once
  CHECK(d.gap_asks_resend());
  CHECK_FALSE(d.gap_asks_resend());
  d.lost_up_to(5);  // so does a loss declared
  CHECK(d.gap_asks_resend());
}
