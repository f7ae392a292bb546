// Integration: the C++ SDK's topic-bus node (rlbus::bus) against the real broker: delivery
// once subscribe returned, echo, order from several threads, fragments, a slow subscriber
// holding its publisher back, close, refusals and a resumption after a cut link (SPEC §17.10).
#include <catch2/catch.hpp>

#include <atomic>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rlbus/bus.hpp"
#include "support/link.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {

/// A node: a heartbeat of 1 s, so a loaded machine (or a sanitizer) that starves it for a few
/// hundred ms does not end its session and lose what was in flight; no test here is about
/// liveness itself. It dials again quickly.
bus_options node(const std::string& endpoint, const std::string& id) {
  bus_options o;
  o.endpoint = endpoint;
  o.id = id;
  o.heartbeat = 1s;
  o.reconnect_min = 10ms;
  o.reconnect_max = 200ms;
  return o;
}

/// Subscribes and requires the broker to accept.
void subscribed(bus& b, const std::string& topic, subscribe_options o = {}) {
  const auto r = b.subscribe(topic, o, 5s);
  INFO(r.reason);
  REQUIRE(r.ok());
}

/// Receives exactly `n` publications (each within 10 s of the one before).
std::vector<bus_message> receive(bus& b, std::size_t n) {
  std::vector<bus_message> got;
  while (got.size() < n) {
    auto m = b.recv(10s);
    if (!m) break;
    got.push_back(std::move(*m));
  }
  REQUIRE(got.size() == n);
  return got;
}

std::string pattern(std::size_t size, unsigned seed) {
  std::string s(size, '\0');
  std::uint32_t x = seed * 2654435761U + 1;
  for (auto& c : s) {
    x = x * 1664525U + 1013904223U;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

}  // namespace

TEST_CASE("bus: a publication reaches a subscriber once subscribe returned", "[bus-client]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  bus sub(node(ep, "sub"));
  bus pub(node(ep, "pub"));
  subscribed(sub, "news.today");
  subscribed(sub, "sport.", {.prefix = true});
  CHECK(sub.subscriptions() ==
        std::vector<std::pair<std::string, bool>>{{"news.today", false}, {"sport.", true}});
  REQUIRE(pub.publish("news.today", "hello").ok());
  REQUIRE(pub.publish("news.yesterday", "nobody").ok());  // matches nothing
  REQUIRE(pub.publish("sport.tennis", std::string("a\0b", 3)).ok());
  const auto got = receive(sub, 2);
  CHECK(got[0].topic == "news.today");
  CHECK(got[0].payload == "hello");
  CHECK(got[0].sender == "pub");
  CHECK_FALSE(got[0].retained);
  CHECK(got[1].topic == "sport.tennis");
  CHECK(got[1].payload == std::string("a\0b", 3));
  // Unsubscribed: what is published afterwards does not come, what follows does.
  REQUIRE(sub.unsubscribe("news.today").ok());
  REQUIRE(pub.publish("news.today", "gone").ok());
  REQUIRE(pub.publish("sport.golf", "marker").ok());
  CHECK(receive(sub, 1)[0].payload == "marker");
  CHECK(sub.lost() == 0);
  CHECK(pub.flush(5s));
  CHECK(pub.errors() == 0);
  CHECK(sub.errors() == 0);
  CHECK_THROWS_AS(pub.publish("has space", "x"), std::invalid_argument);
  CHECK_THROWS_AS(sub.subscribe(""), std::invalid_argument);
  CHECK(sub.subscribe("", {.prefix = true}, 5s).ok());  // every topic
}

TEST_CASE("bus: a node gets its own publications only with echo", "[bus-client]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  bus a(node(ep, "a"));
  bus other(node(ep, "other"));
  subscribed(a, "t");
  subscribed(other, "t");
  REQUIRE(a.publish("t", "mine").ok());
  CHECK(receive(other, 1)[0].payload == "mine");
  // The broker orders all of a subscriber's deliveries: had "mine" gone to `a`, it would come
  // before the marker published after `other` got it.
  REQUIRE(other.publish("t", "marker").ok());
  CHECK(receive(a, 1)[0].payload == "marker");

  subscribed(a, "t", {.echo = true});  // replaces the subscription's echo
  REQUIRE(a.publish("t", "mine again").ok());
  const auto got = receive(a, 1)[0];
  CHECK(got.payload == "mine again");
  CHECK(got.sender == "a");
}

TEST_CASE("bus: publications from several threads keep each thread's order", "[bus-client]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  bus sub(node(ep, "sub"));
  bus pub(node(ep, "pub"));
  bus pub2(node(ep, "pub2"));
  subscribed(sub, "", {.prefix = true});
  constexpr int threads = 4;
  constexpr int each = 400;
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      auto& p = t % 2 == 0 ? pub : pub2;
      for (int i = 0; i < each; ++i)
        if (!p.publish("t" + std::to_string(t), std::to_string(i)).ok()) ++failures;
    });
  }
  const auto got = receive(sub, threads * each);
  for (auto& t : ts) t.join();
  CHECK(failures == 0);
  std::map<std::string, int> next;
  for (const auto& m : got) {
    CHECK(m.sender == (m.topic == "t0" || m.topic == "t2" ? "pub" : "pub2"));
    CHECK(m.payload == std::to_string(next[m.topic]++));
  }
  for (int t = 0; t < threads; ++t) CHECK(next["t" + std::to_string(t)] == each);
  CHECK(sub.lost() == 0);
}

TEST_CASE("bus: a payload of several MB travels in fragments and is joined", "[bus-client]") {
  auto cfg = test_config();
  cfg.max_message = 1 << 20;
  broker::server_thread b(cfg);
  const auto ep = b.get().router_endpoint();
  bus sub(node(ep, "sub"));
  bus pub(node(ep, "pub"));
  subscribed(sub, "big");
  const auto large = pattern((5 << 20) + 123, 1);
  const auto other = pattern(1 << 20, 2);  // just past one fragment
  REQUIRE(pub.publish("big", large).ok());
  REQUIRE(pub.publish("big", "small").ok());
  REQUIRE(pub.publish("big", other).ok());
  REQUIRE(pub.publish("big", "").ok());
  const auto got = receive(sub, 4);
  CHECK(got[0].payload.size() == large.size());
  CHECK(got[0].payload == large);
  CHECK(got[1].payload == "small");
  CHECK(got[2].payload == other);
  CHECK(got[3].payload.empty());
  CHECK(sub.lost() == 0);
  CHECK(pub.errors() == 0);
}

TEST_CASE("bus: a slow subscriber loses nothing and holds its publisher back", "[bus-client]") {
  auto cfg = test_config();
  cfg.bus_credit = 8;
  cfg.bus_window = 64;
  cfg.bus_queue_bytes = 256 * 1024;
  broker::server_thread b(cfg);
  const auto ep = b.get().router_endpoint();
  bus slow(node(ep, "slow"));
  bus pub(node(ep, "pub"));
  subscribed(slow, "load");
  const std::string payload(4096, 'x');
  // Nobody reads: the broker stops granting credit, the publisher's queue fills, and then a
  // publish waits and times out.
  std::size_t published = 0;
  bool held_back = false;
  while (published < 5000) {
    const auto r = pub.publish("load", std::to_string(published) + payload, {}, 300ms);
    if (!r.ok()) {
      CHECK(r.error == bus_errc::timeout);
      CHECK_THAT(r.reason, Catch::Contains("held this node back"));
      held_back = true;
      break;
    }
    ++published;
  }
  REQUIRE(held_back);
  // The broker holds at most about half a queue of bytes for the slow node, and credit more.
  CHECK(published < 400);
  // Reading lets everything through, in order, and the publisher goes on.
  const auto got = receive(slow, published);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].payload == std::to_string(i) + payload);
  REQUIRE(pub.publish("load", "after", {}, 5s).ok());
  CHECK(receive(slow, 1)[0].payload == "after");
  CHECK(slow.lost() == 0);
  CHECK(b.get().snapshot().messages_in > 0);
}

TEST_CASE("bus: small publications queued while held back leave as batches, in order",
          "[bus-client]") {
  auto cfg = test_config();
  cfg.bus_queue_bytes = 1024 * 1024;  // held back after ~4 000 small ones
  broker::server_thread b(cfg);
  const auto ep = b.get().router_endpoint();
  bus slow(node(ep, "slow"));
  bus pub(node(ep, "pub"));
  subscribed(slow, "small");
  // Nobody reads: the publisher is held back and its queue fills (SPEC §17.4.2): 256
  // publications wait in it when a publish times out.
  std::size_t published = 0;
  for (;; ++published) {
    const auto r = pub.publish("small", std::to_string(published), {}, 300ms);
    if (!r.ok()) {
      REQUIRE(r.error == bus_errc::timeout);
      break;
    }
  }
  REQUIRE(published > 256);
  // Then what was queued goes as a batch, one PUBLISH (SPEC §17.5.1): every publication
  // comes, in order, each once, and the 256 that waited took one PUBLISH (fewer still, as
  // the publisher batches whatever queues up meanwhile).
  const auto got = receive(slow, published);
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].payload == std::to_string(i));
    CHECK(got[i].topic == "small");
    CHECK(got[i].sender == "pub");
  }
  REQUIRE(pub.publish("small", "alone", {}, 5s).ok());
  CHECK(receive(slow, 1)[0].payload == "alone");
  const auto publish_messages =
      b.get().snapshot().received_by_type[static_cast<std::uint8_t>(codec::msg_type::publish)];
  INFO(published + 1 << " publications in " << publish_messages << " PUBLISH");
  CHECK(publish_messages <= published + 1 - 255);
  CHECK(slow.lost() == 0);
  CHECK(pub.errors() == 0);
}

TEST_CASE("bus: close flushes what was published before it says DISCONNECT", "[bus-client]") {
  broker::server_thread b(test_config());
  const auto ep = b.get().router_endpoint();
  bus sub(node(ep, "sub"));
  subscribed(sub, "t");
  constexpr int n = 2000;
  {
    bus pub(node(ep, "pub"));
    REQUIRE(pub.wait_for(connection_state::ready, 5s));
    for (int i = 0; i < n; ++i) REQUIRE(pub.publish("t", std::to_string(i)).ok());
    pub.close(10s);
    CHECK(pub.state() == connection_state::stopped);
    CHECK(pub.publish("t", "late").error == bus_errc::closed);
    CHECK(pub.subscribe("t").error == bus_errc::closed);
  }
  const auto got = receive(sub, n);
  for (int i = 0; i < n; ++i) CHECK(got[static_cast<std::size_t>(i)].payload == std::to_string(i));
  CHECK(sub.lost() == 0);
}

TEST_CASE("bus: close says how many publications the broker had not taken, and counts them",
          "[bus-client]") {
  auto cfg = test_config();
  cfg.bus_queue_bytes = 1024 * 1024;  // (the least grant, two 64 KiB batches, fits a quarter)
  cfg.bus_stall_ms = 0;               // for as long as it reads nothing
  broker::server_thread b(cfg);
  const auto ep = b.get().router_endpoint();
  bus slow(node(ep, "slow"));
  subscribed(slow, "t");
  bus pub(node(ep, "pub"));
  REQUIRE(pub.wait_for(connection_state::ready, 5s));
  const std::string body(4096, 'p');
  std::size_t published = 0;
  bus_result r;
  while ((r = pub.publish("t", std::to_string(published) + body, {}, 500ms)).ok()) ++published;
  CHECK(r.error == bus_errc::timeout);
  CHECK_THAT(r.reason, Catch::Contains("node slow does not keep up"));  // PUBLISH_CREDIT held_by
  REQUIRE(pub.unsent() > 0);
  const auto dropped = pub.close(500ms);
  INFO(published << " published, " << dropped << " not taken");
  CHECK(dropped > 0);
  CHECK(pub.lost() == dropped);
  CHECK(pub.close(1s) == 0);  // idempotent
  // Everything else the broker took reaches the subscriber, in order: nothing vanished.
  std::size_t got = 0;
  while (auto m = slow.recv(2s)) {
    CHECK(m->payload == std::to_string(got) + body);
    ++got;
  }
  CHECK(got + dropped == published);
  CHECK(slow.lost() == 0);
}

TEST_CASE("bus: close releases a blocked recv", "[bus-client]") {
  broker::server_thread b(test_config());
  bus sub(node(b.get().router_endpoint(), "sub"));
  subscribed(sub, "t");
  std::atomic<bool> returned{false};
  std::optional<bus_message> got{bus_message{}};
  std::thread reader([&] {
    got = sub.recv();  // no timeout
    returned = true;
  });
  // The reader is blocked (nothing is published); close must free it at once.
  const auto start = std::chrono::steady_clock::now();
  sub.close(1s);
  REQUIRE(wait_until([&] { return returned.load(); }, 1000ms));
  reader.join();
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  CHECK_FALSE(got.has_value());
  CHECK_FALSE(sub.recv(10ms).has_value());
  CHECK(sub.closed());
}

TEST_CASE("bus: a subscription past bus_max_subscriptions is refused with 440", "[bus-client]") {
  auto cfg = test_config();
  cfg.bus_max_subscriptions = 3;
  broker::server_thread b(cfg);
  bus n(node(b.get().router_endpoint(), "n"));
  subscribed(n, "a");
  subscribed(n, "b");
  subscribed(n, "c");
  subscribed(n, "c", {.echo = true});  // one it holds: counts once
  const auto r = n.subscribe("d");
  CHECK_FALSE(r.ok());
  CHECK(r.error == bus_errc::refused);
  CHECK(r.code == 440);
  CHECK_THAT(r.reason, Catch::Contains("440"));
  CHECK(n.subscriptions().size() == 3);  // the refused one is not kept
  CHECK(n.errors() == 0);                // a refusal is no fault
  REQUIRE(n.unsubscribe("a").ok());
  subscribed(n, "d");
}

TEST_CASE("bus: publications survive a cut link, nothing lost or repeated", "[bus-client]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  cuttable_link relay(ctx, b.get().router_endpoint());
  // Both through the relay: the cut hits the publisher's PUBLISH and the subscriber's
  // DELIVER in flight. 1 s beats: the broker keeps the sessions 3 s, the nodes act at 2 s and
  // resume in time, with a second to spare on a slow machine.
  auto po = node(relay.endpoint(), "pub");
  auto so = node(relay.endpoint(), "sub");
  po.reconnect_min = so.reconnect_min = 5ms;
  bus pub(po);
  bus sub(so);
  subscribed(sub, "t");
  REQUIRE(pub.wait_for(connection_state::ready, 5s));
  constexpr int n = 3000;
  std::atomic<int> sent{0};
  std::thread publisher([&] {
    for (int i = 0; i < n; ++i) {
      if (!pub.publish("t", std::to_string(i), {}, 10s).ok()) return;
      ++sent;
    }
  });
  std::vector<bus_message> got;
  while (got.size() < 500) got.push_back(*sub.recv(10s));
  relay.cut_existing();
  const auto first = got.size();
  while (got.size() < static_cast<std::size_t>(n)) {
    auto m = sub.recv(10s);
    if (!m) break;
    got.push_back(std::move(*m));
  }
  publisher.join();
  CHECK(first == 500);
  REQUIRE(sent == n);
  REQUIRE(got.size() == static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) CHECK(got[static_cast<std::size_t>(i)].payload == std::to_string(i));
  // Both resume once they hear nothing for two beats (on a busy machine the subscriber may
  // have had every delivery before the cut, and the last checks above come sooner).
  CHECK(wait_until([&] { return pub.welcomes() == 2 && sub.welcomes() == 2; }, 10s));
  CHECK(pub.welcomes() == 2);
  CHECK(sub.welcomes() == 2);
  CHECK(pub.sessions_lost() == 0);
  CHECK(sub.sessions_lost() == 0);
  CHECK(sub.lost() == 0);
  CHECK(pub.flush(5s));
  CHECK_FALSE(sub.recv(50ms).has_value());  // no copy came twice
}

TEST_CASE("bus: a new session makes the subscriptions again and counts sessions_lost",
          "[bus-client]") {
  auto cfg = test_config("ipc");  // a fixed endpoint the second broker can bind again
  auto b = std::make_unique<broker::server_thread>(cfg);
  bus sub(node(cfg.router_endpoint, "sub"));
  subscribed(sub, "t");
  subscribed(sub, "p.", {.prefix = true});
  b.reset();  // every session gone with the broker
  b = std::make_unique<broker::server_thread>(cfg);
  REQUIRE(wait_until([&] { return sub.sessions_lost() == 1; }, 10s));
  CHECK(sub.welcomes() == 2);
  bus pub(node(cfg.router_endpoint, "pub"));
  // The subscriptions come back on their own, shortly after the WELCOME: the publisher
  // publishes until one arrives, then the order holds from there.
  std::optional<bus_message> m;
  for (int i = 0; i < 500 && !m; ++i) {
    REQUIRE(pub.publish("p.x", "probe").ok());
    m = sub.recv(20ms);
  }
  REQUIRE(m);
  REQUIRE(pub.publish("t", "exact").ok());
  std::optional<bus_message> exact;
  while ((exact = sub.recv(5s)) && exact->topic != "t") {
  }
  REQUIRE(exact);
  CHECK(exact->payload == "exact");
}
