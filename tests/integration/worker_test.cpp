// Integration: the C++ worker SDK against the real broker: heartbeats, reconnection with
// backoff after the broker goes away, duplicate ids, orderly leave.
#include <catch2/catch.hpp>

#include <stdexcept>

#include <zmq_addon.hpp>

#include "rlbus/worker.hpp"
#include "support/link.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {
worker_options options_for(const std::string& endpoint, const std::string& id) {
  worker_options o;
  o.endpoint = endpoint;
  o.id = id;
  o.heartbeat = 30ms;
  o.reconnect_min = 20ms;
  o.reconnect_max = 200ms;
  return o;
}
}  // namespace

TEST_CASE("a worker's heartbeats keep it alive for many liveness windows", "[worker]") {
  broker::server_thread b(test_config());
  // 100 ms beats: short enough to span many windows quickly, long enough that a loaded
  // machine's scheduling pauses do not pass for a silent broker.
  auto o = options_for(b.get().router_endpoint(), "steady");
  o.heartbeat = 100ms;
  worker w(o);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  const auto session = w.session();
  // 10 windows of 300 ms: a worker that stopped heartbeating would be expired by now.
  CHECK_FALSE(wait_until([&] { return b.get().snapshot().expired > 0; }, 3000ms));
  CHECK(w.state() == connection_state::ready);
  CHECK(w.session() == session);
  CHECK(w.welcomes() == 1);
  CHECK(b.get().snapshot().messages_in >= 10);  // HELLO + heartbeats
}

TEST_CASE("a worker notices a dead broker and reconnects when one is back", "[worker]") {
  auto cfg = test_config("ipc");  // a fixed endpoint the second broker can bind again
  auto b = std::make_unique<broker::server_thread>(cfg);
  // Beats far apart: the broker's goodbye, not its silence while it stops, is what the worker
  // must hear, however slowly the broker stops (a loaded machine, a sanitizer).
  auto o = options_for(cfg.router_endpoint, "phoenix");
  o.heartbeat = 1000ms;
  worker w(o);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  b.reset();  // broker gone: the worker hears DISCONNECT 503 and starts retrying
  REQUIRE(wait_until([&] { return w.state() == connection_state::reconnecting; }));
  CHECK_THAT(w.last_error(), Catch::Contains("503"));
  b = std::make_unique<broker::server_thread>(cfg);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  CHECK(w.welcomes() == 2);
  CHECK(b->get().snapshot().peers == 1);
}

TEST_CASE("a worker detects a broker that went silent without a word", "[worker]") {
  // A raw ROUTER plays a broker that welcomes and then never answers again.
  zmq::context_t ctx;
  fake_broker fake(ctx);
  worker w(options_for(fake.endpoint(), "lonely"));
  CHECK(fake.answer_hello(codec::welcome{5, 1, 30, 3, 1024, false}).id == "lonely");
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  // 3 x 30 ms of silence: the worker gives up on this connection and says why.
  REQUIRE(wait_until([&] { return w.state() == connection_state::reconnecting; }, 3s));
  CHECK_THAT(w.last_error(), Catch::Contains("silent"));
}

TEST_CASE("a second worker with a live id waits until the id is free", "[worker]") {
  broker::server_thread b(test_config());
  auto o = options_for(b.get().router_endpoint(), "twin");
  o.heartbeat = 1000ms;  // the first holds its id however slow the machine: no expiry frees it
  auto first = std::make_unique<worker>(o);
  REQUIRE(first->wait_for(connection_state::ready, 5s));
  worker second(options_for(b.get().router_endpoint(), "twin"));
  REQUIRE(wait_until([&] { return second.last_error().find("409") != std::string::npos; }));
  CHECK(second.state() == connection_state::connecting);
  first.reset();  // orderly leave frees the id; the retrying twin gets in
  CHECK(second.wait_for(connection_state::ready, 5s));
}

TEST_CASE("stopping a worker says DISCONNECT and the broker publishes worker.left", "[worker]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  event_listener events(ctx, b.get().events_endpoint());
  worker w(options_for(b.get().router_endpoint(), "polite"));
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  w.stop();
  CHECK(w.state() == connection_state::stopped);
  const auto e = events.next("worker.left");
  REQUIRE(e);
  CHECK(event_peer_id(*e) == "polite");
  CHECK(b.get().snapshot().expired == 0);
  w.stop();  // idempotent
}

TEST_CASE("a worker the broker refuses for good stops retrying", "[worker]") {
  // The broker refuses a wrong-version HELLO; a raw ROUTER stands in to refuse with 402.
  zmq::context_t ctx;
  fake_broker fake(ctx);
  worker w(options_for(fake.endpoint(), "rejected"));
  fake.answer_hello(codec::error{402, "field 'resources': nope", 1});
  REQUIRE(w.wait_for(connection_state::refused, 5s));
  CHECK_THAT(w.last_error(), Catch::Contains("402"));
}

TEST_CASE("bad worker options are refused at construction", "[worker]") {
  worker_options o;
  o.id = "";
  CHECK_THROWS_AS(worker(o), std::invalid_argument);
  o.id = "bad id";
  CHECK_THROWS_WITH(worker(o), Catch::Contains("id"));
  o.id = "ok";
  o.role = role::coordinator;
  CHECK_THROWS_WITH(worker(o), Catch::Contains("role"));
  o.role = role::learner;
  o.heartbeat = 1ms;
  CHECK_THROWS_WITH(worker(o), Catch::Contains("heartbeat"));
  o.heartbeat = 1000ms;
  o.resources = {{"cpu", -1}};
  CHECK_THROWS_WITH(worker(o), Catch::Contains("cpu"));
}

TEST_CASE("a worker cut off from the broker resumes its session on a new connection", "[worker]") {
  // The worker gives up on a silent broker one interval before the broker would expire it,
  // so after a short partition it reconnects and presents its token in time.
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  event_listener events(ctx, b.get().events_endpoint());
  cuttable_link relay(ctx, b.get().router_endpoint());
  auto o = options_for(relay.endpoint(), "partitioned");
  o.heartbeat = 200ms;  // broker expires after 600 ms of silence, the worker acts at 400 ms
  o.reconnect_min = 5ms;
  worker w(o);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  const auto token = w.session();
  const auto joined = events.next("worker.joined");
  REQUIRE(joined);

  relay.cut_existing();
  REQUIRE(wait_until([&] { return w.welcomes() == 2; }, 5s));
  CHECK(w.session() == token);  // the same session, not a new one
  CHECK_THAT(w.last_error(), Catch::Contains("silent"));
  const auto resumed = events.next("worker.joined", [](const codec::event& e) {
    return std::get<codec::peer_joined>(e.body).resumed;
  });
  REQUIRE(resumed);
  CHECK(std::get<codec::peer_joined>(resumed->body).serial ==
        std::get<codec::peer_joined>(joined->body).serial);
  CHECK(b.get().snapshot().expired == 0);
  CHECK(b.get().snapshot().peers == 1);
  for (const auto& e : events.seen()) CHECK(e.topic != "worker.lost");
}

TEST_CASE("a worker goes where a group's standby sends it, and never to an older leadership",
          "[worker]") {
  // Raw ROUTERs play a standby and two leaders of a group (SPEC §4.2.2, §14.9.2).
  zmq::context_t ctx;
  fake_broker standby(ctx), leader(ctx), old(ctx);
  worker_options o;
  o.endpoint = standby.endpoint();
  o.id = "follower";
  o.heartbeat = 30'000ms;  // a HELLO left unanswered keeps last_error for a long while
  o.reconnect_min = 20ms;
  o.reconnect_max = 100ms;
  worker w(o);
  const auto not_leader = [](const std::string& where, std::uint64_t epoch) {
    return codec::error{421, "a standby", 1, where, epoch};
  };
  const auto welcome = [](std::uint64_t epoch) {
    return codec::welcome{5, 1, 30, 3, 1024, false, std::nullopt, epoch};
  };
  standby.answer_hello(not_leader(leader.endpoint(), 7));
  leader.answer_hello(welcome(7));
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  // The leader goes silent (3 x 30 ms): back to the list, whose standby names a later leader
  // that welcomes under an older leadership than it said: not taken.
  standby.answer_hello(not_leader(old.endpoint(), 9));
  old.answer_hello(welcome(8));
  // A refusal naming an older leadership than one seen is not followed either.
  standby.answer_hello(not_leader(leader.endpoint(), 3));
  CHECK(standby.answer_hello(codec::heartbeat{}).id == "follower");
  CHECK(w.state() != connection_state::ready);
  CHECK(w.welcomes() == 1);
}
