// Integration: whole task lifecycles through the real broker over tcp, with raw peers
// playing a coordinator and its workers the way DI-engine's parallel mode drives them.
#include <catch2/catch.hpp>

#include "codec/map_writer.hpp"
#include "support/support.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {

codec::submit bare_task(const std::string& id, role kind) {
  return codec::submit{id, kind, codec::empty_map_blob, {}, {}, {}, {}, {}, {}};
}

}  // namespace

TEST_CASE("DI-engine's coordinator scenario runs to the end through the broker", "[task-flow]") {
  // Two collector tasks yield 20 data items each and say collector_done; a learner task
  // asks for data (the first answer is "not yet"), learns 5 times and is finished.
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer coord(ctx, router), c0(ctx, router), c1(ctx, router), l0(ctx, router);
  coord.introduce("coordinator", role::coordinator, 5000);
  c0.introduce("collector-0", role::collector, 5000);
  c1.introduce("collector-1", role::collector, 5000);
  l0.introduce("learner-0", role::learner, 5000);

  std::vector<codec::task_event> stream;
  for (const auto* id : {"ct-0", "ct-1"}) {  // both at once: one per free collector
    coord.send(bare_task(id, role::collector));
    const auto ack = coord.recv_a<codec::submitted>();
    REQUIRE(ack);
    CHECK(ack->accepted);
  }
  for (const auto& [id, worker] : {std::pair{"ct-0", &c0}, std::pair{"ct-1", &c1}}) {
    const auto start = worker->recv_a<codec::task_start>();
    REQUIRE(start);
    CHECK(start->task_id == id);
    worker->send(codec::started{id, start->attempt});
    for (int i = 0; i < 20; ++i) {
      worker->send(codec::data_ready{id, start->attempt, "d" + std::to_string(i), "buffer-0",
                                     codec::empty_map_blob, std::string(64, 'x')});
    }
    worker->send(codec::info{id, start->attempt, flag_map("collector_done", true)});
    until_event(coord, "info", &stream);  // judge_finish: collector_done
    coord.send(codec::finish{id});
    const auto close = worker->recv_a<codec::task_close>();
    REQUIRE(close);
    worker->send(codec::task_result{id, close->attempt, flag_map("collector_done", true)});
    const auto done = until_event(coord, "finished", &stream);
    CHECK(done.task_id == id);
  }
  const auto data_events =
      std::count_if(stream.begin(), stream.end(), [](const auto& e) { return e.event == "data"; });
  CHECK(data_events == 40);

  coord.send(bare_task("lt-0", role::learner));
  REQUIRE(coord.recv_a<codec::submitted>());
  const auto start = l0.recv_a<codec::task_start>();
  REQUIRE(start);
  l0.send(codec::started{"lt-0", start->attempt});
  std::uint64_t request = 0;
  for (int learned = 0; learned < 5;) {
    l0.send(codec::get_data{"lt-0", start->attempt, ++request, "buffer-0", 32,
                            static_cast<std::uint64_t>(learned)});
    const auto ask = until_event(coord, "data_request");
    const bool not_yet = request == 1;  // the buffer is empty at first
    coord.send(
        codec::data_reply{"lt-0", request, not_yet ? codec::nil_blob : codec::empty_map_blob});
    if (not_yet) {
      const auto wait = l0.recv_a<codec::no_data>();
      REQUIRE(wait);
      CHECK(wait->request_id == request);
      continue;
    }
    REQUIRE(l0.recv_a<codec::learn>());
    l0.send(codec::learn_info{"lt-0", start->attempt, "buffer-0",
                              flag_map("learner_done", learned == 4)});
    until_event(coord, "learn_info");
    ++learned;
  }
  coord.send(codec::finish{"lt-0"});
  REQUIRE(l0.recv_a<codec::task_close>());
  l0.send(codec::task_result{"lt-0", start->attempt, codec::empty_map_blob});
  until_event(coord, "finished");

  REQUIRE(wait_until([&] { return b.get().snapshot().tasks_finished == 3; }));
  const auto s = b.get().snapshot();
  CHECK(s.tasks_queued == 0);   // nothing left queued
  CHECK(s.tasks_running == 0);  // or assigned
  CHECK(s.tasks_failed == 0);
}

TEST_CASE("a collector killed mid-task has its task re-assigned, and its ghost is fenced",
          "[task-flow]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer coord(ctx, router), doomed(ctx, router);
  coord.introduce("coordinator", role::coordinator, 5000);
  doomed.introduce("collector-doomed", role::collector, 30);  // expires 90 ms after going quiet
  coord.send(bare_task("t", role::collector));
  REQUIRE(coord.recv_a<codec::submitted>());
  const auto first = doomed.recv_a<codec::task_start>();
  REQUIRE(first);
  doomed.send(codec::started{"t", 1});
  doomed.send(codec::data_ready{"t", 1, "d0", "b", codec::empty_map_blob, std::nullopt});
  // ... and now it falls silent. A spare collector joins and gets the task's next attempt.
  raw_peer spare(ctx, router);
  spare.introduce("collector-spare", role::collector, 5000);
  const auto requeued = until_event(coord, "requeued");
  CHECK(requeued.worker_id == "collector-doomed");
  const auto second = spare.recv_a<codec::task_start>();
  REQUIRE(second);
  CHECK(second->attempt == 2);
  spare.send(codec::started{"t", 2});
  // A round trip first: STARTED is read before the FINISH that comes on another connection.
  spare.send(codec::heartbeat{});
  REQUIRE(spare.recv_a<codec::heartbeat>());
  coord.send(codec::finish{"t"});
  REQUIRE(spare.recv_a<codec::task_close>());
  spare.send(codec::task_result{"t", 2, codec::empty_map_blob});
  until_event(coord, "finished");

  // The dead worker comes back under its old id and reports on its old attempt.
  raw_peer ghost(ctx, router);
  ghost.introduce("collector-doomed", role::collector, 5000);
  ghost.send(codec::task_result{"t", 1, codec::empty_map_blob});
  const auto refused = ghost.recv_a<codec::error>();
  REQUIRE(refused);
  CHECK(refused->code == 406);  // the task is finished: nothing of it is held any more
  CHECK(b.get().snapshot().tasks_finished == 1);
  CHECK(b.get().snapshot().tasks_requeued == 1);
}

TEST_CASE("a task nobody can run waits, and starts when a fitting worker joins", "[task-flow]") {
  broker::server_thread b(test_config());
  zmq::context_t ctx;
  const auto router = b.get().router_endpoint();
  raw_peer coord(ctx, router), small(ctx, router);
  coord.introduce("coordinator", role::coordinator, 5000);
  small.introduce("learner-small", role::learner, 5000);
  auto s = bare_task("big", role::learner);
  s.requirements = {{"gpu", 2}};
  coord.send(s);
  const auto ack = coord.recv_a<codec::submitted>();
  REQUIRE(ack);
  CHECK(ack->accepted);
  // The answer leaves before the broker's loop stores its counters.
  CHECK(wait_until([&] { return b.get().snapshot().tasks_queued == 1; }, 5s));
  raw_peer big(ctx, router);
  big.send(codec::hello{role::learner, "learner-big", 5000, {{"gpu", 4}}, std::nullopt});
  REQUIRE(big.recv_a<codec::welcome>());
  const auto start = big.recv_a<codec::task_start>();
  REQUIRE(start);
  CHECK(start->task_id == "big");
  CHECK_FALSE(small.recv_a<codec::task_start>(100ms));
}
