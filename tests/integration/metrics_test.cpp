// The broker's HTTP endpoint: /healthz, /readyz (not ready while draining) and /metrics, a
// Prometheus text exposition scraped from the real broker binary and parsed line by line;
// and the web view's JSON, asked of a broker's loop. (The page itself is tested in a real
// browser: python/tests/test_web_view.py.)
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "broker/core/server.hpp"
#include "broker/ops/http_endpoint.hpp"
#include "rlbus/worker.hpp"
#include "support/child.hpp"
#include "support/support.hpp"
#include "util/free_port.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {

// A TCP port nobody listens on at the moment of asking.
int free_port() {
  return rlbus::util::free_tcp_port();
}

// The samples of an exposition, checked as they are read: each family has its HELP and TYPE
// before its samples, each sample line is `name{label="value"} number` or `name number`.
// A histogram's samples are its family's name with _bucket, _sum or _count; a summary's
// (without quantiles) with _sum or _count.
std::map<std::string, double> parse_exposition(const std::string& text) {
  static const std::regex sample(
      R"(^([a-z_]+)(\{[a-z_]+="(?:[^"\\]|\\.)*"\})? ([0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?)$)");
  static const std::regex comment(R"(^# (HELP|TYPE) ([a-z_]+) (.+)$)");
  static const std::regex histogram_part(R"(^(.+)_(bucket|sum|count)$)");
  std::map<std::string, double> out;
  std::set<std::string> helped;
  std::map<std::string, std::string> typed;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    INFO(line);
    std::smatch m;
    if (std::regex_match(line, m, comment)) {
      if (m[1] == "HELP") {
        helped.insert(m[2]);
      } else {
        CHECK((m[3] == "counter" || m[3] == "gauge" || m[3] == "histogram" || m[3] == "summary"));
        typed[m[2]] = m[3];
      }
      continue;
    }
    REQUIRE(std::regex_match(line, m, sample));
    std::string family = m[1];
    std::smatch part;
    if (std::regex_match(family, part, histogram_part) &&
        (typed[part[1]] == "histogram" || (typed[part[1]] == "summary" && part[2] != "bucket")))
      family = part[1];
    CHECK(helped.count(family) == 1);
    CHECK(typed.count(family) == 1);
    CHECK(out.emplace(m[1].str() + m[2].str(), std::stod(m[3])).second);  // no sample twice
  }
  return out;
}

}  // namespace

TEST_CASE("the HTTP endpoint answers health, readiness and metrics", "[binary][metrics]") {
  std::atomic<bool> draining{false};
  broker::histogram latency;
  latency.observe(3ms);
  latency.observe(2s);
  broker::http_endpoint http("127.0.0.1", 0, [&] {
    broker::stats s;
    s.draining = draining.load();
    s.tasks_queued = 7;
    s.assignment_latency = latency.counts();
    s.queued_by_shape = {{"", 2}, {"gpu=1", 1}, {"odd\"name=1", 1}};
    s.policy_versions = {{"pi", 7}};
    s.data_items = 12;
    s.data_lag_items = 10;
    s.data_lag_versions = 25;
    return s;
  });
  httplib::Client client(http.url());
  auto r = client.Get("/healthz");
  REQUIRE(r);
  CHECK(r->status == 200);
  r = client.Get("/readyz");
  REQUIRE(r);
  CHECK(r->status == 200);
  draining = true;  // a stop was asked for: no longer ready, still alive
  r = client.Get("/readyz");
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK(client.Get("/healthz")->status == 200);
  r = client.Get("/metrics");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK_THAT(r->get_header_value("Content-Type"), Catch::StartsWith("text/plain; version=0.0.4"));
  const auto samples = parse_exposition(r->body);
  CHECK(samples.at("rlbus_draining") == 1);
  CHECK(samples.at("rlbus_queue_depth") == 7);
  CHECK(samples.at("rlbus_tasks{state=\"queued\"}") == 7);
  // Buckets count what is at most their bound, +Inf everything.
  CHECK(samples.at("rlbus_assignment_latency_seconds_bucket{le=\"0.001\"}") == 0);
  CHECK(samples.at("rlbus_assignment_latency_seconds_bucket{le=\"0.005\"}") == 1);
  CHECK(samples.at("rlbus_assignment_latency_seconds_bucket{le=\"1\"}") == 1);
  CHECK(samples.at("rlbus_assignment_latency_seconds_bucket{le=\"5\"}") == 2);
  CHECK(samples.at("rlbus_assignment_latency_seconds_bucket{le=\"+Inf\"}") == 2);
  CHECK(samples.at("rlbus_assignment_latency_seconds_count") == 2);
  CHECK(samples.at("rlbus_assignment_latency_seconds_sum") == Approx(2.003));
  CHECK(samples.at("rlbus_task_duration_seconds_count") == 0);
  CHECK(samples.at("rlbus_queue_depth_by_requirements{requirements=\"\"}") == 2);
  CHECK(samples.at("rlbus_queue_depth_by_requirements{requirements=\"gpu=1\"}") == 1);
  // A quote in a label value is escaped, as the format says.
  CHECK(samples.at("rlbus_queue_depth_by_requirements{requirements=\"odd\\\"name=1\"}") == 1);
  CHECK(samples.at("rlbus_policy_version{policy=\"pi\"}") == 7);
  // The lag of collected data: a summary whose mean is versions per item.
  CHECK(samples.at("rlbus_data_items_total") == 12);
  CHECK(samples.at("rlbus_data_policy_lag_count") == 10);
  CHECK(samples.at("rlbus_data_policy_lag_sum") == 25);
  CHECK(client.Get("/nothing")->status == 404);
}

TEST_CASE("an HTTP endpoint stopped as soon as it is made ends", "[broker][metrics]") {
  // A broker stopped while it starts destroys its endpoint at once. The endpoints are made
  // and destroyed on a thread of their own, so that one that never ends fails the test
  // rather than hang it (the thread is then left behind).
  auto done = std::make_shared<std::promise<void>>();
  auto ended = done->get_future();
  std::thread([done] {
    for (int i = 0; i < 200; ++i) {
      const broker::http_endpoint http("127.0.0.1", 0, [] { return broker::stats{}; });
    }
    done->set_value();
  }).detach();
  REQUIRE(ended.wait_for(60s) == std::future_status::ready);
}

TEST_CASE("the broker binary's /metrics counts what it serves", "[binary][metrics]") {
  const auto port = free_port();
  child broker(binary_from_env("RLBUS_BROKER_BIN"),
               {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0", "--metrics-port",
                std::to_string(port)});
  const auto line = broker.wait_for_line("rlbus-broker listening", 10s);
  INFO(broker.output());
  REQUIRE(line);
  const auto url = "http://127.0.0.1:" + std::to_string(port);
  CHECK_THAT(*line, Catch::Contains("metrics=" + url));
  const auto from = line->find("router=") + 7;
  const auto router = line->substr(from, line->find(' ', from) - from);

  worker_options o;
  o.endpoint = router;
  o.id = "collector-scraped";
  worker w(o);
  REQUIRE(w.wait_for(connection_state::ready, 5s));

  httplib::Client client(url);
  std::map<std::string, double> samples;
  REQUIRE(wait_until([&] {
    const auto r = client.Get("/metrics");
    if (!r || r->status != 200) return false;
    samples = parse_exposition(r->body);
    return samples["rlbus_peers{role=\"collector\"}"] == 1;
  }));
  CHECK(samples.at("rlbus_messages_received_total{type=\"HELLO\"}") >= 1);
  CHECK(samples.at("rlbus_messages_sent_total{type=\"WELCOME\"}") >= 1);
  CHECK(samples.at("rlbus_peers{role=\"coordinator\"}") == 0);
  CHECK(samples.at("rlbus_draining") == 0);
  CHECK(client.Get("/readyz")->status == 200);
  broker.signal(SIGTERM);
  const auto code = broker.wait(10s);
  REQUIRE(code);
  CHECK(*code == 0);
}

TEST_CASE("/metrics counts the topic bus by topic and the nodes that lag", "[binary][metrics]") {
  const auto port = free_port();
  child broker(binary_from_env("RLBUS_BROKER_BIN"),
               {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0", "--metrics-port",
                std::to_string(port), "--status-interval", "100"});
  const auto line = broker.wait_for_line("rlbus-broker listening", 10s);
  INFO(broker.output());
  REQUIRE(line);
  const auto from = line->find("router=") + 7;
  const auto router = line->substr(from, line->find(' ', from) - from);
  zmq::context_t ctx;
  raw_peer pub(ctx, router), sub(ctx, router);
  pub.introduce("pub", role::bus, 30'000);
  sub.introduce("sub", role::bus, 30'000);
  sub.send(codec::subscribe{1, "model", false, false, false});
  REQUIRE(sub.recv_a<codec::subscribed>());
  pub.send(codec::publish{1, "model"}, std::string(1000, 'w'));
  pub.send(codec::publish{2, "model"}, std::string(1000, 'w'));
  httplib::Client client("http://127.0.0.1:" + std::to_string(port));
  std::map<std::string, double> samples;
  REQUIRE(wait_until([&] {  // as of the status tick after the publications
    const auto r = client.Get("/metrics");
    if (!r || r->status != 200) return false;
    samples = parse_exposition(r->body);
    return samples["rlbus_bus_published_total"] == 2;
  }));
  CHECK(samples.at("rlbus_peers{role=\"bus\"}") == 2);
  CHECK(samples.at("rlbus_bus_published_bytes_total") == 2000);
  CHECK(samples.at("rlbus_bus_topic_messages_total{topic=\"model\"}") == 2);
  CHECK(samples.at("rlbus_bus_topic_subscribers{topic=\"model\"}") == 1);
  CHECK(samples.at("rlbus_bus_node_lag{node=\"sub\"}") == 2);  // nothing acknowledged
  CHECK(samples.at("rlbus_bus_dropped_total") == 0);
}

// The web view's JSON, from a broker loop that serves peers meanwhile: the questions go to
// the loop from the HTTP thread and come back as the OPS verbs answer them.
TEST_CASE("the web view's JSON is what the loop's OPS verbs answer", "[broker][metrics]") {
  broker::server_thread b(test_config());
  auto& s = b.get();
  broker::web_access access;
  access.token = "a-token-of-sixteen-chars";
  broker::http_endpoint http(
      "127.0.0.1", 0, [&s] { return s.snapshot(); },
      {[&s](std::vector<codec::ops> q, std::chrono::milliseconds t) {
         return s.ask(std::move(q), t);
       },
       [&s](std::int64_t after) { return s.recent().since(after); }},
      access);
  worker_options o;
  o.endpoint = s.router_endpoint();
  o.id = "collector-viewed";
  o.heartbeat = 1s;
  worker w(o);
  REQUIRE(w.wait_for(connection_state::ready, 10s));

  httplib::Client client(http.url());
  CHECK(client.Get("/api/view")->status == 401);
  const httplib::Headers bearer{{"Authorization", "Bearer " + access.token}};
  nlohmann::json view;
  REQUIRE(wait_until(
      [&] {
        const auto r = client.Get("/api/view?workers_kind=collector", bearer);
        if (!r || r->status != 200) return false;
        view = nlohmann::json::parse(r->body);
        return view.at("workers").at("total") == 1;
      },
      20s));
  CHECK(view.at("workers").at("workers")[0].at("id") == "collector-viewed");
  CHECK(view.at("status").at("peers").at("collector") == 1);
  CHECK(view.at("status").at("epoch") == fmt::format("{:016x}", s.epoch()));
  CHECK(view.at("tasks").at("total") == 0);
  CHECK(client.Get("/api/view?tasks_state=lost", bearer)->status == 400);
  // The series gets a sample a second at the status ticks (every 20 ms here).
  REQUIRE(wait_until(
      [&] {
        const auto r = client.Get("/api/series", bearer);
        return r && r->status == 200 && nlohmann::json::parse(r->body).at("samples").size() >= 2;
      },
      20s));
  b.stop();
  // A loop that stopped answers nothing, and says so at once.
  const auto r = client.Get("/api/view", bearer);
  REQUIRE(r);
  CHECK(r->status == 503);
}
