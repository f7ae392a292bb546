// Integration: the real broker over tcp and ipc, with workers and with hostile peers.
#include <catch2/catch.hpp>

#include <memory>
#include <random>

#include "rlbus/worker.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;

TEST_CASE("workers introduce themselves over tcp and ipc", "[broker]") {
  for (const std::string transport : {"tcp", "ipc"}) {
    INFO(transport);
    broker::server_thread b(test_config(transport));
    zmq::context_t ctx;
    event_listener events(ctx, b.get().events_endpoint());
    worker_options o;
    o.endpoint = b.get().router_endpoint();
    o.id = "collector-" + transport;
    o.resources = {{"cpu", 2}};
    o.heartbeat = 50ms;
    worker w(o);
    REQUIRE(w.wait_for(connection_state::ready, 5s));
    CHECK(w.session() != 0);
    const auto e = events.next("worker.joined");
    REQUIRE(e);
    const auto& joined = std::get<codec::peer_joined>(e->body);
    CHECK(joined.id == o.id);
    CHECK(joined.role == role::collector);
    CHECK(joined.serial == 1);  // the first session of this broker
    CHECK(joined.resources == o.resources);
  }
}

TEST_CASE("garbage from raw sockets is refused and a good worker is still served", "[broker]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  std::mt19937 rng(7);
  std::vector<std::unique_ptr<raw_peer>> attackers;
  std::size_t sent = 0;
  for (int a = 0; a < 8; ++a) {
    attackers.push_back(std::make_unique<raw_peer>(ctx, b.get().router_endpoint()));
    for (int i = 0; i < 200; ++i) {
      std::vector<std::string> frames(1 + rng() % 4);
      for (auto& f : frames) {
        f.resize(rng() % 64);
        for (auto& ch : f) ch = static_cast<char>(rng());
        if (rng() % 3 == 0 && f.size() >= 4) f.replace(0, 3, "RL\x01");  // get past the header
      }
      attackers.back()->send_frames(frames);
      ++sent;
    }
  }
  // Every garbage message is counted as a fault and none makes a session.
  REQUIRE(wait_until([&] { return b.get().snapshot().faults >= sent; }, 10s));
  CHECK(b.get().snapshot().peers == 0);
  CHECK(b.get().snapshot().messages_in == sent);

  worker_options o;
  o.endpoint = b.get().router_endpoint();
  o.id = "survivor";
  o.heartbeat = 50ms;
  worker w(o);
  CHECK(w.wait_for(connection_state::ready, 5s));
  CHECK(b.get().snapshot().peers == 1);
}

TEST_CASE("an unintroduced connection costs the broker no session state", "[broker]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  std::vector<std::unique_ptr<raw_peer>> peers;
  for (int i = 0; i < 200; ++i) {
    peers.push_back(std::make_unique<raw_peer>(ctx, b.get().router_endpoint()));
    peers.back()->send(codec::heartbeat{});
  }
  for (auto& p : peers) {
    const auto e = p->recv_a<codec::error>();
    REQUIRE(e);
    CHECK(e->code == 403);
  }
  CHECK(b.get().snapshot().peers == 0);
}

TEST_CASE("an oversized message disconnects its sender and nobody else", "[broker]") {
  auto cfg = test_config();
  cfg.max_message = 4096;
  broker::server_thread b(cfg);
  zmq::context_t ctx;
  raw_peer good(ctx, b.get().router_endpoint());
  good.introduce("good");
  raw_peer big(ctx, b.get().router_endpoint());
  big.introduce("big");
  big.send_frames({std::string("RL\x01\x03", 4), std::string(64 * 1024, '\x80')});
  // libzmq drops the offending connection; the session then expires like any silent one.
  good.send(codec::heartbeat{});
  CHECK(good.recv_a<codec::heartbeat>());
  CHECK(b.get().snapshot().faults == 0);  // never reached the broker's decoder
}

TEST_CASE("a lost worker is reported with its id, and others stay", "[broker]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  event_listener events(ctx, b.get().events_endpoint());
  worker_options o;
  o.endpoint = b.get().router_endpoint();
  o.heartbeat = 30ms;
  o.id = "stays";
  worker stays(o);
  REQUIRE(stays.wait_for(connection_state::ready, 5s));
  raw_peer dies(ctx, b.get().router_endpoint());
  dies.introduce("dies", role::learner, 30);
  const auto e = events.next("worker.lost",
                             [](const codec::event& ev) { return event_peer_id(ev) == "dies"; });
  REQUIRE(e);
  CHECK(std::get<codec::peer_gone>(e->body).role == role::learner);
  // The worker that heartbeats is still there after the other's window.
  CHECK(stays.state() == connection_state::ready);
  // (the counters are stored after the event is made, at the end of the broker's turn)
  CHECK(wait_until([&] { return b.get().snapshot().peers == 1; }));
  for (const auto& ev : events.seen())
    CHECK(!(ev.topic == "worker.lost" && event_peer_id(ev) == "stays"));
}

TEST_CASE("the broker publishes a periodic heartbeat with its peer count", "[broker]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  event_listener events(ctx, b.get().events_endpoint());
  raw_peer p(ctx, b.get().router_endpoint());
  p.introduce("counted");
  const auto e = events.next("broker.heartbeat", [](const codec::event& ev) {
    return std::get<codec::broker_status>(ev.body).peers == 1;
  });
  REQUIRE(e);
  CHECK(std::get<codec::broker_status>(e->body).uptime_ms > 0);
}

TEST_CASE("events nobody subscribed to are not sent but keep their place in the sequence",
          "[broker]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  raw_peer early(ctx, b.get().router_endpoint());
  early.introduce("early");  // worker.joined with no subscriber: made, counted, not sent
  REQUIRE(wait_until([&] { return b.get().snapshot().events_unheard >= 1; }, 5s));

  event_listener events(ctx, b.get().events_endpoint());  // every topic, live once it returns
  const auto unheard = b.get().snapshot().events_unheard;
  raw_peer late(ctx, b.get().router_endpoint());
  late.introduce("late");
  const auto joined = events.next("worker.joined");
  REQUIRE(joined);
  CHECK(std::get<codec::peer_joined>(joined->body).id == "late");
  // A subscriber of every topic sees no gap from its first event on, and the events before
  // it subscribed used their numbers: its first is not seq 1.
  const auto& seen = events.seen();
  REQUIRE(!seen.empty());
  CHECK(seen.front().seq > 1);
  for (std::size_t i = 1; i < seen.size(); ++i) CHECK(seen[i].seq == seen[i - 1].seq + 1);
  CHECK(b.get().snapshot().events_unheard == unheard);
}
