// The cluster's building blocks against a real etcd: the client of its API, and the elector
// that makes one broker of a group the leader and fences it by its lease.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "cluster/elector.hpp"
#include "cluster/etcd.hpp"
#include "support/etcd.hpp"
#include "support/support.hpp"

using namespace std::chrono_literals;
using rlbus::cluster::elector;
using rlbus::cluster::elector_config;
using rlbus::cluster::etcd_client;
using rlbus::test::etcd_server;

namespace {

#define NEED_ETCD()                                                                  \
  if (!etcd_server::available()) {                                                   \
    WARN("etcd is not installed (apt-get install etcd-server): nothing to test on"); \
    return;                                                                          \
  }

elector_config member(const etcd_server& e, const std::string& name) {
  elector_config c{{e.url()}, "g", name, fmt::format("tcp://{}:7235", name)};
  c.lease_ttl = 2s;
  return c;
}

}  // namespace

TEST_CASE("etcd client: leases, create-if-absent, compare-and-set, prefixes", "[cluster]") {
  NEED_ETCD();
  etcd_server e;
  etcd_client c({"http://127.0.0.1:1", e.url()}, 2000ms);  // the first one answers nothing
  CHECK_FALSE(c.get("/k").has_value());
  const auto lease = c.grant(30);
  CHECK(lease.ttl_s >= 30);
  std::optional<rlbus::cluster::etcd_kv> now;
  REQUIRE(c.create("/k", std::string("v\0\xff", 3), lease.id, &now));
  CHECK(c.endpoint() == e.url());
  REQUIRE(now);
  CHECK(now->value == std::string("v\0\xff", 3));
  CHECK(now->lease == lease.id);
  const auto first = now->create_revision;
  CHECK_FALSE(c.create("/k", "other", 0, &now));  // exists: left as it is, and shown
  REQUIRE(now);
  CHECK(now->value == std::string("v\0\xff", 3));
  CHECK_FALSE(c.replace("/k", "x", 0, now->mod_revision - 1));
  CHECK(c.replace("/k", "x", lease.id, now->mod_revision));
  CHECK(c.get("/k")->value == "x");
  CHECK(c.create("/k/a", "1", 0));
  CHECK(c.create("/k/b", "2", 0));
  CHECK(c.create("/l", "3", 0));
  const auto under = c.get_prefix("/k/");
  REQUIRE(under.size() == 2);
  CHECK(under[0].key == "/k/a");
  CHECK(under[1].value == "2");
  CHECK(c.keep_alive(lease.id) > 0);
  c.revoke(lease.id);  // its keys go with it
  CHECK_FALSE(c.get("/k").has_value());
  CHECK(c.keep_alive(lease.id) == 0);
  c.revoke(lease.id);  // again: not an error
  CHECK_FALSE(c.erase("/k/a", first));
  CHECK(c.erase("/k/a", c.get("/k/a")->create_revision));
  CHECK_THROWS_AS(etcd_client({"tcp://127.0.0.1:2379"}, 1000ms), std::invalid_argument);
  etcd_client nowhere({"http://127.0.0.1:1"}, 500ms);
  CHECK_THROWS_AS(nowhere.get("/k"), rlbus::cluster::etcd_unavailable);
}

TEST_CASE("elector: one leader at a time, and a later leader has a larger epoch", "[cluster]") {
  NEED_ETCD();
  etcd_server e;
  auto a = std::make_unique<elector>(member(e, "a"));
  REQUIRE(rlbus::test::wait_until([&] { return a->leads(); }, 20s));
  const auto first = a->epoch();
  CHECK(first > 0);
  elector b(member(e, "b"));
  REQUIRE(rlbus::test::wait_until([&] { return b.leader().member == "a"; }, 20s));
  CHECK(b.leader().advertise == "tcp://a:7235");
  CHECK(b.leader().epoch == first);
  CHECK_FALSE(b.leads());
  CHECK(a->leads());

  a.reset();  // a stops: it gives its lease back, and b need not wait for it to run out
  REQUIRE(rlbus::test::wait_until([&] { return b.leads(); }, 20s));
  CHECK(b.epoch() > first);
  CHECK(b.leader().member == "b");

  // Settings that cannot work are refused.
  auto bad = member(e, "c");
  bad.margin = 2000ms;
  CHECK_THROWS_AS(elector(bad), std::invalid_argument);
  bad = member(e, "c");
  bad.etcd = {"localhost:2379"};
  CHECK_THROWS_AS(elector(bad), std::invalid_argument);
}

TEST_CASE("elector: a leader that cannot renew stops serving before its lease can end",
          "[cluster]") {
  NEED_ETCD();
  etcd_server e;
  elector a(member(e, "a"));
  REQUIRE(rlbus::test::wait_until([&] { return a.leads(); }, 20s));
  const auto first = a.epoch();
  // etcd dies: a's serving time is no longer moved on; it ends by itself, no later than the
  // lease (which etcd counts from the last renewal it got, after a asked for it).
  e.kill();
  const auto killed = std::chrono::steady_clock::now();
  CHECK(a.serving_until() <= killed + 2s);
  REQUIRE(rlbus::test::wait_until([&] { return !a.leads(); }, 10s));
  CHECK_FALSE(a.etcd_reachable());
  // etcd back: the old lease may still be there (etcd gives leases their full time again
  // after a restart); either it runs out or a finds its key gone, and a leads again, under a
  // new epoch.
  e.start();
  REQUIRE(rlbus::test::wait_until([&] { return a.leads(); }, 30s));
  CHECK(a.epoch() > first);
}
