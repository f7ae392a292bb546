// Peer table: lookups by both keys, and expiry by deadline that neither misses a silent
// peer behind a live one nor expires a peer that has been heard from.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "broker/core/peer_table.hpp"

using namespace rlbus;
using namespace std::chrono_literals;

namespace {

broker::peer make(const std::string& id, util::time_point now, std::chrono::milliseconds window) {
  broker::peer p;
  p.routing_id = "r-" + id;
  p.id = id;
  p.window = window;
  p.joined = now;
  p.last_seen = now;
  return p;
}

std::vector<std::string> expire(broker::peer_table& t, util::time_point now) {
  std::vector<std::string> out;
  t.expire(now, [&](const broker::peer& p) { out.push_back(p.id); });
  return out;
}

}  // namespace

TEST_CASE("peers are found by routing id and by id", "[unit][peers]") {
  broker::peer_table t;
  const auto now = util::clock::now();
  t.insert(make("a", now, 100ms));
  t.insert(make("b", now, 100ms));
  REQUIRE(t.by_id("a") != nullptr);
  CHECK(t.by_routing("r-a") == t.by_id("a"));
  CHECK(t.by_routing("r-zzz") == nullptr);
  t.rebind(*t.by_id("a"), "r-a2");
  CHECK(t.by_routing("r-a") == nullptr);
  CHECK(t.by_routing("r-a2")->id == "a");
  t.erase(*t.by_id("a"));
  CHECK(t.by_id("a") == nullptr);
  CHECK(t.by_routing("r-a2") == nullptr);
  CHECK(t.size() == 1);
}

TEST_CASE("a silent peer expires exactly when its window has passed", "[unit][peers]") {
  broker::peer_table t;
  const auto t0 = util::clock::now();
  t.insert(make("a", t0, 300ms));
  CHECK(expire(t, t0 + 299ms).empty());
  CHECK(expire(t, t0 + 300ms) == std::vector<std::string>{"a"});
  CHECK(t.size() == 0);
  CHECK_FALSE(t.next_check());
}

TEST_CASE("a peer heard from is rescheduled, not expired", "[unit][peers]") {
  broker::peer_table t;
  const auto t0 = util::clock::now();
  t.insert(make("a", t0, 100ms));
  t.by_id("a")->last_seen = t0 + 80ms;
  CHECK(expire(t, t0 + 150ms).empty());
  REQUIRE(t.next_check());
  CHECK(*t.next_check() == t0 + 180ms);
  CHECK(expire(t, t0 + 180ms) == std::vector<std::string>{"a"});
}

TEST_CASE("a peer whose window shrinks is expired at its new deadline", "[unit][peers]") {
  // A resumed session may agree a shorter heartbeat: the old, later check must not hold.
  broker::peer_table t;
  const auto t0 = util::clock::now();
  t.insert(make("a", t0, 1000ms));
  auto* p = t.by_id("a");
  p->window = 100ms;
  t.reschedule(*p);
  CHECK(expire(t, t0 + 99ms).empty());
  CHECK(expire(t, t0 + 100ms) == std::vector<std::string>{"a"});
  CHECK(expire(t, t0 + 2000ms).empty());  // the stale check is skipped, not replayed
}

TEST_CASE("silent peers behind a live one all expire, in deadline order", "[unit][peers]") {
  // A list scan that stops at the first live peer would miss everything behind it.
  broker::peer_table t;
  const auto t0 = util::clock::now();
  t.insert(make("live", t0, 100ms));
  for (int i = 0; i < 50; ++i)
    t.insert(make("quiet-" + std::to_string(i), t0 + std::chrono::milliseconds(i), 100ms));
  t.by_id("live")->last_seen = t0 + 90ms;
  const auto gone = expire(t, t0 + 160ms);
  REQUIRE(gone.size() == 50);
  for (int i = 0; i < 50; ++i)
    CHECK(gone[static_cast<std::size_t>(i)] == "quiet-" + std::to_string(i));
  CHECK(t.size() == 1);
  CHECK(t.by_id("live") != nullptr);
}

TEST_CASE("an erased peer's slot is reused without reviving its old deadline", "[unit][peers]") {
  broker::peer_table t;
  const auto t0 = util::clock::now();
  t.insert(make("old", t0, 10ms));
  t.erase(*t.by_id("old"));
  t.insert(make("new", t0, 1000ms));  // takes the same slot
  CHECK(expire(t, t0 + 500ms).empty());
  CHECK(t.by_id("new") != nullptr);
}

TEST_CASE("expiry is correct across many peers with random activity", "[unit][peers]") {
  broker::peer_table t;
  const auto t0 = util::clock::now();
  std::vector<std::chrono::milliseconds> last(200);
  for (int i = 0; i < 200; ++i) t.insert(make(std::to_string(i), t0, 100ms));
  std::uint32_t rng = 12345;
  std::vector<std::string> expired;
  for (int step = 1; step <= 400; ++step) {
    const auto now = t0 + std::chrono::milliseconds(step);
    for (int k = 0; k < 20; ++k) {
      rng = rng * 1103515245 + 12345;
      const auto i = static_cast<int>((rng >> 8) % 200);
      if (auto* p = t.by_id(std::to_string(i)); p != nullptr && i % 3 != 0) {
        p->last_seen = now;
        last[static_cast<std::size_t>(i)] = std::chrono::milliseconds(step);
      }
    }
    for (const auto& id : expire(t, now)) {
      const auto i = static_cast<std::size_t>(std::stoi(id));
      CHECK(last[i] + 100ms <= std::chrono::milliseconds(step));  // never early
      CHECK(last[i] + 100ms == std::chrono::milliseconds(step));  // never late
      expired.push_back(id);
    }
  }
  // Every peer with id % 3 == 0 never spoke and must be gone.
  for (int i = 0; i < 200; i += 3) CHECK(t.by_id(std::to_string(i)) == nullptr);
}
