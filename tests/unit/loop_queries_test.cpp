// Questions another thread asks the broker's loop (ops/loop_queries): answered in order on the
// loop's thread, given up on past their timeout or when the loop stops, and never more than
// a few waiting at once.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "broker/ops/loop_queries.hpp"

using namespace std::chrono_literals;
using rlbus::broker::loop_queries;
using rlbus::codec::blob;
using rlbus::codec::ops;

namespace {

std::vector<ops> verbs(std::initializer_list<const char*> names) {
  std::vector<ops> out;
  for (const auto* n : names) {
    ops o;
    o.verb = n;
    out.push_back(o);
  }
  return out;
}

blob echo(const ops& o) {
  return "answer to " + o.verb;
}

}  // namespace

TEST_CASE("loop queries: the loop answers each question, in order", "[unit][ops]") {
  std::atomic<int> wakes{0};
  loop_queries q([&] { ++wakes; });
  auto asked = std::async(std::launch::async, [&] {
    return q.ask(verbs({"status", "workers"}), 10s);
  });
  // The loop: it serves what was asked by each of its turns, until the asker is answered.
  while (asked.wait_for(1ms) != std::future_status::ready) q.serve(echo);
  const auto answers = asked.get();
  REQUIRE(answers);
  CHECK(*answers == std::vector<blob>{"answer to status", "answer to workers"});
  CHECK(wakes >= 1);  // the loop was woken, not left to find it at its next timer
}

TEST_CASE("loop queries: an asker gives up when the loop does not answer", "[unit][ops]") {
  loop_queries q([] {});
  const auto started = std::chrono::steady_clock::now();
  CHECK_FALSE(q.ask(verbs({"status"}), 50ms));
  CHECK(std::chrono::steady_clock::now() - started >= 50ms);
  q.serve(echo);  // answered into the void: nobody waits for it any more
}

TEST_CASE("loop queries: a stopped loop sends every asker away at once", "[unit][ops]") {
  loop_queries q([] {});
  auto asked = std::async(std::launch::async, [&] { return q.ask(verbs({"status"}), 60s); });
  // Closed while the asker waits (or before it asks): either way it is not answered, and it
  // does not wait out its minute.
  q.close();
  CHECK(asked.wait_for(30s) == std::future_status::ready);
  CHECK_FALSE(asked.get());
  CHECK_FALSE(q.ask(verbs({"status"}), 60s));
}

TEST_CASE("loop queries: at most max_waiting questions wait", "[unit][ops]") {
  loop_queries q([] {}, 2);
  std::vector<std::future<std::optional<std::vector<blob>>>> waiting;
  for (int i = 0; i < 2; ++i)
    waiting.push_back(
        std::async(std::launch::async, [&] { return q.ask(verbs({"status"}), 60s); }));
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (q.waiting() < 2) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(1ms);
  }
  CHECK_FALSE(q.ask(verbs({"topics"}), 1ms));  // a third is turned away, never queued
  int answered = 0;
  q.serve([&](const ops& o) {
    ++answered;
    return echo(o);
  });
  CHECK(answered == 2);
  for (auto& w : waiting) {
    const auto a = w.get();
    REQUIRE(a);
    CHECK(a->at(0) == "answer to status");
  }
}
