// The topic bus through the C++ SDK (`rlbus-bench bus-rows`, run by bench/bus_baselines.py
// as its `cpp` backend, beside the Python nodes and the Redis / pyzmq baselines): the same
// five measurements as the script's, with every node an rlbus::bus of its own (its own
// ZeroMQ context and I/O thread, as a process would have) in a thread of this process,
// against a broker the script started. Each row is printed as one line
// "rlbus-bench bus row {json}" for the script to merge; nothing here judges a number.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bus_rows.hpp"
#include "report.hpp"
#include "rlbus/bus.hpp"

namespace rlbus::bench {

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

// A message starts as the script's do: publisher index (int32), sequence number (int64, -1
// for a probe), little-endian.
constexpr std::size_t header_size = 12;

std::string packet(std::int32_t index, std::int64_t seq, std::size_t size) {
  std::string p(std::max(size, header_size), '\0');
  std::memcpy(p.data(), &index, 4);
  std::memcpy(p.data() + 4, &seq, 8);
  return p;
}

std::pair<std::int32_t, std::int64_t> unpack(const std::string& p) {
  std::int32_t index = -1;
  std::int64_t seq = -1;
  if (p.size() >= header_size) {
    std::memcpy(&index, p.data(), 4);
    std::memcpy(&seq, p.data() + 4, 8);
  }
  return {index, seq};
}

std::atomic<int> node_counter{0};

std::unique_ptr<rlbus::bus> open_node(const std::string& endpoint) {
  rlbus::bus_options o;
  o.endpoint = endpoint;
  o.id = fmt::format("bench-cpp-{}-{}", ::getpid(), node_counter++);
  auto b = std::make_unique<rlbus::bus>(o);
  if (!b->wait_for(connection_state::ready, 30s))
    throw std::runtime_error("bus-rows: no session with the broker at " + endpoint + ": " +
                             b->last_error());
  return b;
}

void require(const bus_result& r, const char* what) {
  if (!r)
    throw std::runtime_error(
        fmt::format("bus-rows: {}: {} {}", what, to_string(r.error), r.reason));
}

void print_row(const std::string& metric, double value, const char* unit, nlohmann::json extra) {
  extra["metric"] = metric;
  extra["median"] = value;
  extra["unit"] = unit;
  std::printf("rlbus-bench bus row %s\n", extra.dump().c_str());
  std::fflush(stdout);
}

// -- round trip -------------------------------------------------------------------------------

void round_trips(const bus_rows_options& o) {
  auto echo = open_node(o.endpoint);
  auto me = open_node(o.endpoint);
  require(echo->subscribe("ping"), "subscribe ping");
  require(me->subscribe("pong"), "subscribe pong");
  std::thread echoer([&] {
    while (auto m = echo->recv()) {
      if (m->payload.empty()) break;
      (void)echo->publish("pong", m->payload);
    }
  });
  std::vector<double> times;
  for (int seq = -1; seq < o.round_trips; ++seq) {  // -1: a warm-up exchange, not timed
    const auto t0 = clock::now();
    require(me->publish("ping", packet(0, seq, 64)), "publish ping");
    auto m = me->recv(10s);
    if (!m || unpack(m->payload).second != seq) break;
    if (seq >= 0)
      times.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
  }
  (void)me->publish("ping", "");
  echoer.join();
  const nlohmann::json extra = {{"round_trips", times.size()},
                                {"lost", o.round_trips - static_cast<int>(times.size())}};
  print_row("rtt_64B_median", median(times), "us", extra);
  print_row("rtt_64B_p99", quantile(times, 0.99), "us", extra);
}

// -- streams ------------------------------------------------------------------------------------

struct stream_result {
  std::uint64_t received = 0;
  std::uint64_t distinct = 0;
  double seconds = 0;       // from go to the last message received
  double send_seconds = 0;  // the slowest publisher's
  std::uint64_t reported_lost = 0;
};

// `publishers` nodes each send `count` messages of `size` bytes to one subscriber, paced to
// `rate` per second when given; with `slow`, the subscriber handles one message per ten the
// publisher would send until the publishers are done, then drains at full speed.
stream_result stream(const bus_rows_options& o, int publishers, std::int64_t count,
                     std::size_t size, double rate = 0, bool slow = false) {
  auto sub = open_node(o.endpoint);
  require(sub->subscribe("data"), "subscribe data");
  std::atomic<bool> go{false};
  std::atomic<int> done{0};
  std::vector<double> send_seconds(static_cast<std::size_t>(publishers));
  std::vector<std::thread> threads;
  for (int i = 0; i < publishers; ++i) {
    threads.emplace_back([&, i] {
      auto pub = open_node(o.endpoint);
      while (!go) {  // probes until the subscriber has heard every publisher
        require(pub->publish("data", packet(i, -1, header_size)), "publish probe");
        std::this_thread::sleep_for(20ms);
      }
      auto msg = packet(i, 0, size);
      const auto t0 = clock::now();
      for (std::int64_t seq = 0; seq < count; ++seq) {
        if (rate > 0) std::this_thread::sleep_until(t0 + std::chrono::duration<double>(seq / rate));
        std::memcpy(msg.data() + 4, &seq, 8);
        require(pub->publish("data", msg, {}, 600s), "publish");
      }
      send_seconds[static_cast<std::size_t>(i)] =
          std::chrono::duration<double>(clock::now() - t0).count();
      ++done;
      pub->close(60s);  // flushes what is queued
    });
  }
  std::set<int> heard;
  std::vector<std::vector<bool>> seen(static_cast<std::size_t>(publishers),
                                      std::vector<bool>(static_cast<std::size_t>(count)));
  stream_result r;
  auto t0 = clock::now();
  auto last = t0;
  const auto wanted = static_cast<std::uint64_t>(publishers) * static_cast<std::uint64_t>(count);
  const auto pause = std::chrono::duration<double>(rate > 0 ? 10.0 / rate : 0.0);
  while (r.received < wanted) {
    auto m = sub->recv(done == publishers ? 2s : 60s);  // idle that long: the rest is lost
    if (!m) break;
    const auto [index, seq] = unpack(m->payload);
    if (index < 0 || index >= publishers) continue;
    if (seq < 0) {
      heard.insert(index);
      if (static_cast<int>(heard.size()) == publishers && !go) {
        t0 = clock::now();
        go = true;
      }
      continue;
    }
    if (seq >= count) continue;
    ++r.received;
    last = clock::now();
    std::vector<bool>::reference slot =
        seen[static_cast<std::size_t>(index)][static_cast<std::size_t>(seq)];
    if (!slot) ++r.distinct;
    slot = true;
    if (slow && done < publishers) std::this_thread::sleep_for(pause);
  }
  go = true;  // lets publishers that never were heard end
  for (auto& t : threads) t.join();
  r.seconds = std::chrono::duration<double>(last - t0).count();
  r.send_seconds = *std::max_element(send_seconds.begin(), send_seconds.end());
  r.reported_lost = sub->lost();
  sub->close();
  return r;
}

void rates(const bus_rows_options& o) {
  struct rate_case {
    std::string metric;
    int publishers;
    std::int64_t count;
    std::size_t size;
    bool mb;
  };
  std::vector<rate_case> cases = {{"msgs_1to1", 1, o.count, 64, false},
                                  {"msgs_4to1", 4, o.count / 4, 64, false},
                                  {"MBps_1MiB", 1, o.mib_count, std::size_t{1} << 20, true}};
  if (o.big) cases.push_back({"MBps_64MiB", 1, 3, std::size_t{64} << 20, true});
  for (const auto& c : cases) {
    std::vector<double> per_trial;
    nlohmann::json lost = nlohmann::json::array();
    nlohmann::json reported = nlohmann::json::array();
    for (int t = 0; t < o.trials; ++t) {
      const auto r = stream(o, c.publishers, c.count, c.size);
      const double unit = c.mb ? static_cast<double>(c.size) / 1e6 : 1.0;
      per_trial.push_back(r.received && r.seconds > 0 ? r.received * unit / r.seconds : 0.0);
      lost.push_back(static_cast<std::int64_t>(c.publishers * c.count) -
                     static_cast<std::int64_t>(r.distinct));
      reported.push_back(r.reported_lost);
    }
    print_row(c.metric, median(per_trial), c.mb ? "MB/s" : "msg/s",
              {{"sent", c.publishers * c.count},
               {"lost", lost},
               {"trials", per_trial},
               {"reported_lost", reported}});
  }
}

void slow_subscriber(const bus_rows_options& o) {
  const auto count = static_cast<std::int64_t>(o.slow_rate * o.slow_seconds);
  std::vector<double> lost;
  nlohmann::json send_rate = nlohmann::json::array();
  nlohmann::json took = nlohmann::json::array();
  nlohmann::json reported = nlohmann::json::array();
  for (int t = 0; t < o.trials; ++t) {
    const auto r = stream(o, 1, count, o.slow_size, o.slow_rate, true);
    lost.push_back(static_cast<double>(count) - static_cast<double>(r.distinct));
    send_rate.push_back(r.send_seconds > 0 ? std::round(count / r.send_seconds * 10) / 10 : 0.0);
    took.push_back(std::round(r.seconds * 100) / 100);
    reported.push_back(r.reported_lost);
  }
  print_row("lost_slow_sub", median(lost), "msgs",
            {{"sent", count},
             {"size", o.slow_size},
             {"publisher_rate", o.slow_rate},
             {"achieved_send_rate", send_rate},
             {"seconds", took},
             {"trials", lost},
             {"reported_lost", reported}});
}

}  // namespace

int run_bus_rows(const bus_rows_options& o) {
  round_trips(o);
  rates(o);
  slow_subscriber(o);
  return 0;
}

}  // namespace rlbus::bench
