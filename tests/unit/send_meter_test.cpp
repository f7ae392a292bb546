// The send meter (util/send_meter.hpp): what is queued is counted per connection and in all
// until libzmq lets go of it, a send past either bound is not admitted, and accounts of
// connections that hold nothing are forgotten. Over inproc, where a message's bytes are held
// until the receiver drops the message it got.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "util/send_meter.hpp"
#include "util/zmq_send.hpp"

using rlbus::util::send_meter;

namespace {

struct pipe_pair {
  zmq::context_t ctx;
  zmq::socket_t out{ctx, zmq::socket_type::pair}, in{ctx, zmq::socket_type::pair};
  pipe_pair() {
    in.bind("inproc://meter");
    out.connect("inproc://meter");
  }
  /// Sends `body` to `a` for as long as `meter` admits it (with `elsewhere` bytes held
  /// outside the queues); returns how many were sent.
  int fill(send_meter& meter, send_meter::account& a, const std::string& body,
           std::size_t elsewhere = 0) {
    int sent = 0;
    for (; meter.admits(a, body.size(), elsewhere); ++sent) meter.send_last(out, a, body);
    return sent;
  }
  /// Takes `n` messages off the pipe and drops them: libzmq lets go of their bytes.
  void drain(int n) {
    for (int i = 0; i < n; ++i) {
      zmq::message_t got;
      REQUIRE(in.recv(got));
    }
  }
};

}  // namespace

TEST_CASE("send meter: queued bytes count until the message is let go of", "[unit][meter]") {
  pipe_pair p;
  send_meter meter(4096, 8000);  // three quarters: 6000 for connections that hold much
  auto& a = meter.of("peer-a");
  CHECK(&meter.of("peer-a") == &a);
  const std::string body(1000, 'x');
  REQUIRE(meter.admits(a, body.size()));
  meter.send_last(p.out, a, body);
  CHECK(a.bytes() == 1000 + send_meter::per_message);
  CHECK(meter.total() == a.bytes());
  meter.send_last(p.out, a, body);
  meter.send_last(p.out, a, body);
  CHECK(a.bytes() == 3 * (1000 + send_meter::per_message));
  CHECK_FALSE(meter.admits(a, body.size()));  // past this connection's 4096
  auto& b = meter.of("peer-b");
  CHECK(meter.admits(b, 1000));        // another connection: room in the budget
  CHECK_FALSE(meter.admits(b, 2200));  // but not past the budget of 6000
  {
    zmq::message_t got;
    REQUIRE(p.in.recv(got));
    CHECK(got.to_string_view() == body);
    CHECK(a.bytes() == 3 * (1000 + send_meter::per_message));  // still ours until dropped
  }
  CHECK(a.bytes() == 2 * (1000 + send_meter::per_message));
  p.drain(2);
  CHECK(meter.total() == 0);
  CHECK(meter.admits(a, body.size()));
  meter.prune();
  CHECK(meter.connections() == 0);
}

TEST_CASE("send meter: connections that never read leave the budget's last quarter to others",
          "[unit][meter]") {
  pipe_pair p;
  send_meter meter(64 * 1024, 64 * 1024);
  auto& hog = meter.of("hog");
  const std::string body(4000, 'h');
  int sent = p.fill(meter, hog, body);
  CHECK(meter.total() <= 48 * 1024);  // three quarters
  CHECK(meter.total() + body.size() + send_meter::per_message > 48 * 1024);
  sent += p.fill(meter, hog, std::string(100, 'h'));  // and what short answers leave of them
  CHECK(meter.total() + 100 + send_meter::per_message > 48 * 1024);
  auto& reader = meter.of("reader");
  CHECK(meter.admits(reader, 700));  // at most a 64th of the budget: served from the reserve
  CHECK_FALSE(meter.admits(reader, body.size()));  // more: as the hog is
  // Many small connections that never read do not pass for readers: each parks one message
  // in the reserve at most, then holds something and shares the three quarters.
  auto& small = meter.of("small");
  REQUIRE(meter.admits(small, 700));
  meter.send_last(p.out, small, std::string(700, 's'));
  ++sent;
  CHECK_FALSE(meter.admits(small, 10));
  CHECK(meter.admits(reader, 700));  // the reserve still serves the reader
  p.drain(sent);
  CHECK(meter.total() == 0);
}

TEST_CASE(
    "send meter: a connection whose queue moves is served from the reserve while non-readers "
    "fill their three quarters",
    "[unit][meter]") {
  pipe_pair p;
  send_meter meter(256 * 1024, 256 * 1024);  // a 64th: 4 KiB
  auto& hog = meter.of("hog");
  const int parked = p.fill(meter, hog, std::string(4000, 'h'));  // read by nobody
  REQUIRE(meter.total() <= 192 * 1024);                           // three quarters
  // A subscriber with deliveries in flight holds something, so it is no "connection that
  // holds nothing": until it has read some, it waits as the hog does.
  zmq::socket_t out2{p.ctx, zmq::socket_type::pair}, in2{p.ctx, zmq::socket_type::pair};
  in2.bind("inproc://reader");
  out2.connect("inproc://reader");
  auto& reader = meter.of("reader");
  const std::string delivery(1000, 'r');
  meter.send_last(out2, reader, delivery);  // from the reserve: it held nothing
  meter.send_last(out2, reader, delivery);
  CHECK_FALSE(meter.admits(reader, delivery.size()));
  {
    zmq::message_t got;
    REQUIRE(in2.recv(got));  // it reads one: libzmq lets go of it
  }
  // Its queue moves: it may hold up to a 64th of the budget from the reserve...
  CHECK(meter.admits(reader, delivery.size()));
  int streamed = 0;
  while (meter.admits(reader, delivery.size())) {
    meter.send_last(out2, reader, delivery);
    ++streamed;
  }
  CHECK(streamed == 2);  // 3 in flight: 3 x 1256 bytes, within 4 KiB
  // ... for as long as it goes on reading
  CHECK_FALSE(meter.admits(
      reader, 1, 0,
      rlbus::util::clock::now() + send_meter::moving_window + std::chrono::seconds(1)));
  CHECK(meter.admits(meter.of("asker"), 700));  // and the reserve still answers another
  p.drain(parked);
  for (int i = 0; i < streamed + 1; ++i) {
    zmq::message_t got;
    REQUIRE(in2.recv(got));
  }
  CHECK(meter.total() == 0);
}

TEST_CASE(
    "send meter: bytes held elsewhere count against the budget, whose last quarter stays for "
    "readers",
    "[unit][meter]") {
  pipe_pair p;
  send_meter meter(64 * 1024, 64 * 1024);
  auto& a = meter.of("a");
  const std::string body(1000, 'x');
  const std::size_t rings = 32 * 1024;  // half of it, as full event rings hold
  const int sent = p.fill(meter, a, body, rings);
  CHECK(meter.total() <= 16 * 1024);  // with the rings, three quarters of the budget
  CHECK(meter.total() + body.size() + send_meter::per_message > 16 * 1024);
  CHECK(meter.admits(meter.of("reader"), 10, rings));  // the last quarter is left to a reader
  // all of it held elsewhere: nothing is queued, not even a short answer
  CHECK_FALSE(meter.admits(meter.of("reader"), 10, 64 * 1024));
  CHECK(meter.admits(a, body.size()));  // given back: the queue takes more again
  p.drain(sent);
  CHECK(meter.total() == 0);
}

TEST_CASE("send meter: a shared body and a large encoded one are charged and let go of",
          "[unit][meter]") {
  pipe_pair p;
  send_meter meter(std::size_t{1} << 24, std::size_t{1} << 24);
  auto& a = meter.of("peer");
  const rlbus::util::shared_frame frame(std::string(100'000, 'y'));  // shared: large
  frame.send_last(p.out, meter, a);
  frame.send_last(p.out, meter, a);
  msgpack::sbuffer encoded;
  encoded.write(std::string(70'000, 'z').data(), 70'000);
  rlbus::util::send_last_frame(p.out, meter, a, encoded);  // handed over as it is
  CHECK(a.bytes() == 270'000 + 3 * send_meter::per_message);
  for (const auto size : {100'000U, 100'000U, 70'000U}) {
    zmq::message_t got;
    REQUIRE(p.in.recv(got));
    CHECK(got.size() == size);
  }
  CHECK(meter.total() == 0);
  CHECK(frame.size() == 100'000);  // the frame itself is still whole
}

TEST_CASE("send meter: the account outlives its meter while a message holds it", "[unit][meter]") {
  pipe_pair p;
  auto meter = std::make_unique<send_meter>(4096, 4096);
  meter->send_last(p.out, meter->of("peer"), "bytes");
  meter.reset();  // the broker gone first, the message still queued
  zmq::message_t got;
  REQUIRE(p.in.recv(got));
  CHECK(got.to_string_view() == "bytes");
}

TEST_CASE(
    "send meter: with more than half the budget held, connections whose queues have not moved "
    "are named once, by descriptor",
    "[unit][meter]") {
  using rlbus::util::clock;
  pipe_pair p;
  send_meter meter(64 * 1024, 64 * 1024);
  const std::string body(1000, 'x');
  const auto start = clock::now();
  auto& hog = meter.of("hog");
  hog.set_fd(7);
  auto& nameless = meter.of("nameless");  // no message of it seen: no descriptor to cut
  meter.send_last(p.out, nameless, body);
  auto& reader = meter.of("reader");
  meter.seen("reader", 9);
  CHECK(reader.fd() == 9);
  meter.seen("unknown", 11);  // a message in makes no account
  CHECK(meter.connections() == 3);
  int sent = 1;
  for (int i = 0; i < 20; ++i, ++sent) meter.send_last(p.out, hog, body);
  const auto later = clock::now() + std::chrono::seconds(1);
  // under half of the budget (about 25 KB of 64 KB): nobody is stalled, however long
  CHECK(meter.stalled(later).empty());
  // with what is held elsewhere, more than half: the hog, which has not read, is named
  CHECK(meter.stalled(later, 16 * 1024) == std::vector<int>{7});
  CHECK(hog.fd() == -1);
  CHECK(meter.stalled(later, 16 * 1024).empty());  // once
  // a queue that moved after `since` is not stalled (the hog's began to hold after `start`)
  hog.set_fd(7);
  CHECK(meter.stalled(start, 16 * 1024).empty());
  // nor is one that holds nothing (the reader), nor one of no known descriptor (nameless)
  CHECK(meter.stalled(later, 16 * 1024) == std::vector<int>{7});
  p.drain(sent);
  CHECK(meter.stalled(later, 64 * 1024).empty());
  CHECK(meter.total() == 0);
}
