// Broker configuration: bad settings are refused up front with a message naming them by
// their key and flag (broker/core/settings.hpp).
#include <catch2/catch.hpp>

#include <stdexcept>

#include "broker/core/config.hpp"
#include "broker/core/settings.hpp"

using namespace rlbus;

TEST_CASE("the default configuration is valid and names the documented endpoints",
          "[unit][config]") {
  broker::config cfg;
  CHECK_NOTHROW(broker::validate(cfg));
  CHECK(cfg.router_endpoint == "tcp://127.0.0.1:7235");
  CHECK(cfg.events_endpoint == "tcp://127.0.0.1:7236");
}

TEST_CASE("out-of-range settings are refused with the setting's name", "[unit][config]") {
  broker::config cfg;
  cfg.liveness = 0;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("liveness"));
  cfg = {};
  cfg.heartbeat_min_ms = 5000;
  cfg.heartbeat_max_ms = 1000;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("heartbeat"));
  cfg = {};
  cfg.router_endpoint.clear();
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("router"));
  cfg = {};
  cfg.max_message = 10;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("max-message"));
  cfg = {};
  cfg.stream_window = 0;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("stream-window"));
  cfg = {};
  cfg.stream_ring = 100;
  cfg.stream_window = 51;  // the held events of a full window must fit the ring twice
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("stream-window"));
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("1..50"));
  cfg.stream_window = 50;
  CHECK_NOTHROW(broker::validate(cfg));
}

TEST_CASE("session settings have upper bounds as well", "[unit][config]") {
  broker::config cfg;
  cfg.status_interval_ms = 9;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("status-interval"));
  cfg.status_interval_ms = 86'400'001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("status-interval"));
  cfg = {};
  cfg.max_faults = 0;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("max-faults"));
  cfg.max_faults = 1'000'001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("max-faults"));
  cfg.max_faults = 1'000'000;
  CHECK_NOTHROW(broker::validate(cfg));
  cfg = {};
  cfg.max_peers = 0;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("max-peers"));
  cfg.max_peers = 10'000'001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("max-peers"));
  cfg = {};
  cfg.shutdown_linger_ms = 86'400'001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("shutdown-linger"));
  cfg.shutdown_linger_ms = 0;
  CHECK_NOTHROW(broker::validate(cfg));
}

TEST_CASE("quarantine settings are bounded, and 0 turns quarantine off", "[unit][config]") {
  broker::config cfg;
  cfg.quarantine_after = 0;
  CHECK_NOTHROW(broker::validate(cfg));
  cfg.quarantine_after = 1001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("quarantine-after"));
  cfg = {};
  cfg.quarantine_ms = 0;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("quarantine"));
  cfg.quarantine_ms = 86'400'001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("quarantine"));
}

TEST_CASE("the coordinator grace is bounded, and 0 turns it off", "[unit][config]") {
  broker::config cfg;
  CHECK(cfg.coordinator_grace_ms > 0);  // a restarted coordinator can adopt by default
  cfg.coordinator_grace_ms = 0;
  CHECK_NOTHROW(broker::validate(cfg));
  cfg.coordinator_grace_ms = 86'400'001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("coordinator-grace"));
}

TEST_CASE("port 0 means any free port", "[unit][config]") {
  CHECK(broker::normalize_endpoint("tcp://127.0.0.1:0") == "tcp://127.0.0.1:*");
  CHECK(broker::normalize_endpoint("tcp://127.0.0.1:7235") == "tcp://127.0.0.1:7235");
  CHECK(broker::normalize_endpoint("tcp://127.0.0.1:70") == "tcp://127.0.0.1:70");
  CHECK(broker::normalize_endpoint("ipc:///tmp/x:0") == "ipc:///tmp/x:0");
}

TEST_CASE("the drain and the task defaults are checked, each by its name", "[unit][config]") {
  broker::config cfg;
  CHECK(cfg.drain_ms == 10'000);  // a stop waits for running tasks unless told otherwise
  cfg.drain_ms = 0;
  CHECK_NOTHROW(broker::validate(cfg));  // 0: stop at once
  cfg.drain_ms = 86'400'001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("drain"));
  cfg = {};
  cfg.step_timeout_ms = 0;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("tasks.step-timeout"));
  cfg = {};
  cfg.close_timeout_ms = 86'400'001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("tasks.close-timeout"));
  cfg = {};
  cfg.stream_ring_bytes = 100;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("stream-ring-bytes"));
  cfg = {};
  cfg.max_attempts = 1001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("tasks.max-attempts"));
  cfg = {};
  CHECK(cfg.queue_timeout_ms == 0);  // queued tasks wait as long as it takes
  cfg.queue_timeout_ms = 86'400'001;
  CHECK_THROWS_WITH(broker::validate(cfg), Catch::Contains("queue-timeout-ms"));
}
