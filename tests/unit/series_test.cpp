// The broker's recent past (ops/series): a sample at most every second, the oldest forgotten
// past the ring's size, read back in order after a given time.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "broker/ops/metrics.hpp"
#include "broker/ops/series.hpp"

using rlbus::broker::series;
using rlbus::broker::stats;

namespace {

std::size_t column_of(std::string_view name) {
  const auto& all = series::columns();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].name == name) return i;
  FAIL("no column " << name);
  return 0;
}

std::vector<std::int64_t> times(const std::vector<series::sample>& samples) {
  std::vector<std::int64_t> out;
  for (const auto& s : samples) out.push_back(s.at_ms);
  return out;
}

}  // namespace

TEST_CASE("series keeps a sample a second, the newest ones, in order", "[unit][ops]") {
  series recent(3, 1000);
  stats s;
  s.tasks_finished = 1;
  recent.record(10'000, s);
  s.tasks_finished = 2;
  recent.record(10'400, s);  // within the second: not kept
  recent.record(11'000, s);
  s.tasks_finished = 5;
  recent.record(12'500, s);
  recent.record(13'500, s);  // past the ring's 3: the oldest goes
  CHECK(times(recent.since(0)) == std::vector<std::int64_t>{11'000, 12'500, 13'500});
  CHECK(times(recent.since(12'500)) == std::vector<std::int64_t>{13'500});
  CHECK(recent.since(13'500).empty());
  const auto finished = column_of("tasks_finished");
  const auto all = recent.since(0);
  CHECK(all[0].values[finished] == 2);
  CHECK(all[1].values[finished] == 5);
}

TEST_CASE("series columns are what the broker counts", "[unit][ops]") {
  stats s;
  s.bus.published_bytes = 4096;
  s.queued_bytes = 100;
  s.ring_bytes = 20;
  s.policy_versions = {{"a", 3}, {"b", 7}};
  s.data_items = 6;
  s.data_lag_items = 4;
  s.data_lag_versions = 9;
  series recent;
  recent.record(1, s);
  const auto v = recent.since(0).at(0).values;
  REQUIRE(v.size() == series::columns().size());
  CHECK(v[column_of("bus_published_bytes")] == 4096);
  CHECK(v[column_of("memory_budget_used")] == 120);  // the queues and the rings: one budget
  CHECK(v[column_of("policy_version")] == 7);        // the newest of any policy
  CHECK(v[column_of("data_items")] == 6);
  CHECK(v[column_of("data_lag_items")] == 4);
  CHECK(v[column_of("data_lag_versions")] == 9);
}
