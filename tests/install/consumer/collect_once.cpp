// A program of a project of its own that uses the installed rlbus SDK: a collector and a
// coordinator in one process, against a broker given on the command line. The coordinator
// submits one collector task; the collector sends three data items, then says it is done;
// the program prints what arrived and exits 0 once the task has finished (1 otherwise).
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>

#include <rlbus/coordinator.hpp>
#include <rlbus/worker.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s BROKER-ENDPOINT\n", argv[0]);
    return 2;
  }
  const std::string empty_map("\x80", 1);  // msgpack {}
  const std::string done =
      "\x81\xae"
      "collector_done"
      "\xc3";  // msgpack {"collector_done": true}

  std::mutex mu;
  std::condition_variable cv;
  int items = 0;
  bool finished = false;

  rlbus::coordinator_callbacks cb;
  cb.deal_with_collector_send_data = [&](auto&, auto&, auto&, auto&) {
    std::lock_guard<std::mutex> lock(mu);
    ++items;
  };
  cb.deal_with_collector_finish_task = [&](auto&, auto&) {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
    cv.notify_all();
  };
  rlbus::coordinator_options co;
  co.endpoint = argv[1];
  co.id = "consumer-coordinator";
  rlbus::coordinator coord(co, cb);

  rlbus::worker_options wo;
  wo.endpoint = argv[1];
  wo.role = rlbus::role::collector;
  wo.id = "consumer-collector";
  rlbus::task_handlers h;
  h.run = [&](rlbus::task_handle& t) {
    for (int i = 0; i < 3; ++i) t.emit_data("item-" + std::to_string(i), "buffer-0", empty_map);
    t.emit_info(done);
  };
  h.close = [&](rlbus::task_handle&) { return empty_map; };
  rlbus::worker w(wo, h);

  rlbus::task_spec task;
  task.task_id = "consumer-task";
  task.kind = rlbus::role::collector;
  const auto answer = coord.submit(task);
  if (!answer || !answer->accepted) {
    std::fprintf(stderr, "submit refused: %s\n", answer ? answer->reason.c_str() : "no answer");
    return 1;
  }
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished; })) {
    std::fprintf(stderr, "the task did not finish within 30 s (%d items arrived)\n", items);
    return 1;
  }
  std::printf("task finished: %d data items\n", items);
  return items == 3 ? 0 : 1;
}
