// Integration: the rlbus-broker binary as a user runs it: flags, logged endpoints, serving
// a worker, and a clean exit 0 on SIGTERM/SIGINT that tells peers DISCONNECT.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdlib>

#include "rlbus/worker.hpp"
#include "support/child.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {

std::string broker_bin() {
  const char* p = std::getenv("RLBUS_BROKER_BIN");
  REQUIRE(p != nullptr);
  return p;
}

struct endpoints {
  std::string router, events;
};

endpoints started(child& c) {
  const auto line = c.wait_for_line("rlbus broker", 10s);
  INFO(c.output());
  REQUIRE(line);
  // "... router ENDPOINT events ENDPOINT (epoch ...)"
  const auto word_after = [&](const std::string& key) {
    const auto at = line->find(key + " ");
    REQUIRE(at != std::string::npos);
    const auto from = at + key.size() + 1;
    return line->substr(from, line->find(' ', from) - from);
  };
  return {word_after("router"), word_after("events")};
}

}  // namespace

TEST_CASE("--help documents every flag", "[binary]") {
  const auto [status, out] = run_to_end(broker_bin(), {"--help"});
  CHECK(status == 0);
  for (const char* flag : {"--router", "--events", "--liveness", "--heartbeat-min",
                           "--heartbeat-max", "--status-interval", "--max-message", "--max-peers",
                           "--max-faults", "--shutdown-linger", "--log-level"})
    CHECK_THAT(out, Catch::Contains(flag));
}

TEST_CASE("bad flags and settings exit 2 with a message", "[binary]") {
  auto [status, out] = run_to_end(broker_bin(), {"--no-such-flag"});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("no-such-flag"));
  std::tie(status, out) =
      run_to_end(broker_bin(), {"--heartbeat-min", "5000", "--heartbeat-max", "100"});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("heartbeat"));
}

TEST_CASE("an endpoint in use exits 1 with a message", "[binary]") {
  zmq::context_t ctx;
  zmq::socket_t squatter(ctx, zmq::socket_type::router);
  squatter.bind("tcp://127.0.0.1:*");
  const auto taken = squatter.get(zmq::sockopt::last_endpoint);
  const auto [status, out] =
      run_to_end(broker_bin(), {"--router", taken, "--events", "tcp://127.0.0.1:0"});
  CHECK(status == 1);
  CHECK_THAT(out, Catch::Contains("cannot start"));
}

TEST_CASE("the broker binary serves workers and stops cleanly on SIGTERM", "[binary]") {
  child broker(broker_bin(), {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                              "--heartbeat-min", "10", "--status-interval", "50"});
  const auto ep = started(broker);
  CHECK(ep.router.find(":0") == std::string::npos);  // the real port is logged

  zmq::context_t ctx;
  event_listener events(ctx, ep.events);
  worker_options o;
  o.endpoint = ep.router;
  o.id = "collector-bin";
  o.heartbeat = 50ms;
  o.reconnect_min = 5000ms;  // so the state after shutdown stays observable
  o.reconnect_max = 5000ms;
  worker w(o);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  REQUIRE(broker.wait_for_line("collector-bin (collector) joined", 5s));

  broker.signal(SIGTERM);
  const auto status = broker.wait(10s);
  INFO(broker.output());
  REQUIRE(status);
  CHECK(*status == 0);
  CHECK(events.next("broker.stopping"));
  REQUIRE(wait_until([&] { return w.last_error().find("503") != std::string::npos; }));
  CHECK(w.state() == connection_state::connecting);
  CHECK_THAT(broker.output(), Catch::Contains("broker stopped"));
}

TEST_CASE("SIGINT stops the broker binary with exit status 0", "[binary]") {
  child broker(broker_bin(), {"--router", "ipc:///tmp/rlbus-bin-" + std::to_string(::getpid()),
                              "--events", "tcp://127.0.0.1:0", "--log-level", "info"});
  started(broker);
  broker.signal(SIGINT);
  const auto status = broker.wait(10s);
  REQUIRE(status);
  CHECK(*status == 0);
}
