// rlbus-sdk-peer: a small C++ SDK program that plays a collector, a learner or a
// coordinator, for tests that mix it with Python peers. Everything it sees and does is
// printed as one JSON object per line on stdout ({"event":"ready"}, {"event":"data",...},
// {"event":"finished",...}), so a test can follow it line by line. User data travels as
// msgpack maps; they are printed as JSON (a map JSON cannot hold is printed as
// {"$msgpack_hex": "..."}).
//
// Workers run until SIGTERM/SIGINT, end of stdin (--exit-on-eof) or --exit-after tasks.
// A coordinator submits its tasks, prints what its callbacks receive and exits when every
// task has ended (finished, failed or cancelled), unless --stay.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "rlbus/coordinator.hpp"
#include "rlbus/worker.hpp"

namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

struct options {
  std::string endpoint;
  std::string id;
  std::string role;
  std::uint32_t heartbeat_ms = 1000;
  std::vector<std::string> resources;
  bool exit_on_eof = false;
  // workers
  std::uint32_t data_per_task = 3;
  std::string buffer_id = "replay";
  std::size_t payload_bytes = 0;
  std::uint32_t steps = 3;
  std::uint32_t batch_size = 4;
  std::uint32_t step_delay_ms = 0;
  std::optional<std::uint32_t> hang_after;
  std::string fail;
  std::uint32_t exit_after = 0;
  std::uint32_t get_data_timeout_ms = 10000;
  std::string publish_policy;  // learner: publish a version of this policy after each step
  // coordinator: the policy_id of its collector tasks
  std::string policy_id;
  // coordinator
  std::uint32_t collector_tasks = 0;
  std::uint32_t learner_tasks = 0;
  std::string task_prefix = "task";
  std::uint32_t wait_collectors = 0;
  std::uint32_t wait_learners = 0;
  std::uint32_t no_data_first = 0;
  std::optional<std::uint32_t> max_attempts, start_timeout_ms, step_timeout_ms, task_timeout_ms;
  bool stay = false;
  bool hold_data = false;
};

// ---- output ------------------------------------------------------------------------------

std::mutex out_mutex;

void say(json j) {
  const std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace);
  const std::lock_guard<std::mutex> lock(out_mutex);
  std::cout << line << '\n' << std::flush;
}

std::string to_hex(const std::string& bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out.push_back(digits[b >> 4U]);
    out.push_back(digits[b & 0x0FU]);
  }
  return out;
}

/// User data (msgpack) as JSON; what JSON cannot hold stays hex.
json user_data(const std::string& msgpack) {
  try {
    return json::from_msgpack(msgpack);
  } catch (const json::exception&) {
    return json{{"$msgpack_hex", to_hex(msgpack)}};
  }
}

std::string packed(const json& j) {
  const auto bytes = json::to_msgpack(j);
  return {bytes.begin(), bytes.end()};
}

// ---- stopping ------------------------------------------------------------------------------

volatile std::sig_atomic_t signalled = 0;
std::atomic<bool> stdin_closed{false};
std::atomic<bool> released{false};  // a "release" line came on stdin
std::atomic<std::uint32_t> tasks_closed{0};

void on_signal(int /*sig*/) {
  signalled = 1;
}

bool should_stop(const options& o) {
  if (signalled != 0) return true;
  if (o.exit_on_eof && stdin_closed.load()) return true;
  return o.exit_after > 0 && tasks_closed.load() >= o.exit_after;
}

/// Polls `cond` every few ms until it holds or `timeout` passes.
template <class Cond>
bool wait_until(Cond&& cond, std::chrono::milliseconds timeout) {
  const auto deadline = clock_type::now() + timeout;
  while (!cond()) {
    if (clock_type::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

void wait_stop(const rlbus::task_handle& t) {
  while (!t.stop_requested()) std::this_thread::sleep_for(5ms);
}

rlbus::resources parse_resources(const std::vector<std::string>& items) {
  rlbus::resources out;
  for (const auto& item : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) throw std::invalid_argument("--resource " + item);
    out[item.substr(0, eq)] = std::stod(item.substr(eq + 1));
  }
  return out;
}

json policy_json(const std::optional<rlbus::policy>& p) {
  if (!p) return nullptr;
  json j{{"id", p->id}, {"version", p->version}};
  if (p->ref) j["ref"] = *p->ref;
  if (p->params) j["params_hex"] = to_hex(*p->params);
  return j;
}

/// The params a learner publishes with version `v`: "params-v<v>".
std::string policy_params(std::uint64_t v) {
  return "params-v" + std::to_string(v);
}

std::atomic<std::uint64_t> last_published{0};

// ---- workers -------------------------------------------------------------------------------

std::uint32_t info_count(const json& info, const char* key, std::uint32_t fallback) {
  if (info.is_object() && info.contains(key) && info[key].is_number_unsigned())
    return info[key].get<std::uint32_t>();
  return fallback;
}

rlbus::task_handlers collector_handlers(const options& o) {
  auto emitted = std::make_shared<std::map<std::string, std::uint32_t>>();
  auto mutex = std::make_shared<std::mutex>();
  rlbus::task_handlers h;
  h.run = [&o, emitted, mutex](rlbus::task_handle& t) {
    const json info = user_data(t.info());
    const std::uint32_t n = info_count(info, "data", o.data_per_task);
    say({{"event", "task_start"},
         {"task_id", t.id()},
         {"attempt", t.attempt()},
         {"kind", "collector"},
         {"info", info},
         {"policy", policy_json(t.policy())}});
    std::uint32_t sent = 0;
    for (std::uint32_t i = 0; i < n && !t.stop_requested(); ++i) {
      if (o.hang_after && i == *o.hang_after) {
        say({{"event", "hanging"}, {"task_id", t.id()}, {"attempt", t.attempt()}});
        wait_stop(t);
        break;
      }
      const std::string data_id = t.id() + "#" + std::to_string(i);
      const json meta{{"i", i}, {"worker", o.id}, {"attempt", t.attempt()}};
      std::optional<std::string> payload;
      if (o.payload_bytes > 0)
        payload = std::string(o.payload_bytes, static_cast<char>('a' + i % 26));
      const bool ok = t.emit_data(data_id, o.buffer_id, packed(meta), payload);
      if (ok) ++sent;
      say({{"event", "emitted"},
           {"task_id", t.id()},
           {"attempt", t.attempt()},
           {"data_id", data_id},
           {"ok", ok}});
      if (o.step_delay_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(o.step_delay_ms));
    }
    {
      const std::lock_guard<std::mutex> lock(*mutex);
      (*emitted)[t.id()] = sent;
    }
    if (!o.fail.empty() && !t.stop_requested()) {
      say({{"event", "failing"}, {"task_id", t.id()}, {"attempt", t.attempt()}});
      throw rlbus::task_failure(o.fail, packed({{"worker", o.id}, {"emitted", sent}}));
    }
    if (!t.stop_requested()) {
      const bool ok =
          t.emit_info(packed({{"collector_done", true}, {"count", sent}, {"worker", o.id}}));
      say({{"event", "info_sent"}, {"task_id", t.id()}, {"attempt", t.attempt()}, {"ok", ok}});
    }
    wait_stop(t);
    say({{"event", "run_end"},
         {"task_id", t.id()},
         {"attempt", t.attempt()},
         {"aborted", t.aborted()}});
  };
  h.close = [&o, emitted, mutex](rlbus::task_handle& t) {
    std::uint32_t sent = 0;
    {
      const std::lock_guard<std::mutex> lock(*mutex);
      sent = (*emitted)[t.id()];
    }
    say({{"event", "close"}, {"task_id", t.id()}, {"attempt", t.attempt()}});
    ++tasks_closed;
    return packed({{"worker", o.id}, {"task_id", t.id()}, {"count", sent}});
  };
  h.on_policy = [](const std::string& task_id, std::uint32_t attempt, const rlbus::policy& p) {
    say({{"event", "policy"},
         {"task_id", task_id},
         {"attempt", attempt},
         {"policy", policy_json(p)}});
  };
  return h;
}

rlbus::task_handlers learner_handlers(const options& o) {
  auto done = std::make_shared<std::map<std::string, std::uint32_t>>();
  auto mutex = std::make_shared<std::mutex>();
  rlbus::task_handlers h;
  h.run = [&o, done, mutex](rlbus::task_handle& t) {
    const json info = user_data(t.info());
    const std::uint32_t steps = info_count(info, "steps", o.steps);
    say({{"event", "task_start"},
         {"task_id", t.id()},
         {"attempt", t.attempt()},
         {"kind", "learner"},
         {"info", info},
         {"policy", policy_json(t.policy())}});
    std::uint32_t step = 0;
    for (; step < steps && !t.stop_requested(); ++step) {
      const auto batch = t.get_data(o.buffer_id, o.batch_size, step,
                                    std::chrono::milliseconds(o.get_data_timeout_ms));
      if (!batch) {
        say({{"event", "no_batch"}, {"task_id", t.id()}, {"attempt", t.attempt()}, {"iter", step}});
        break;
      }
      say({{"event", "batch"},
           {"task_id", t.id()},
           {"attempt", t.attempt()},
           {"iter", step},
           {"data", user_data(*batch)}});
      if (!o.publish_policy.empty()) {
        const auto v = ++last_published;
        const bool published = t.publish_policy(o.publish_policy, v, policy_params(v));
        say({{"event", "published"},
             {"task_id", t.id()},
             {"policy_id", o.publish_policy},
             {"version", v},
             {"ok", published}});
      }
      const bool last = step + 1 == steps;
      const bool ok = t.emit_learn_info(
          o.buffer_id, packed({{"learner_step", step}, {"learner_done", last}, {"worker", o.id}}));
      say({{"event", "learn_info_sent"},
           {"task_id", t.id()},
           {"attempt", t.attempt()},
           {"iter", step},
           {"ok", ok}});
      if (o.step_delay_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(o.step_delay_ms));
    }
    {
      const std::lock_guard<std::mutex> lock(*mutex);
      (*done)[t.id()] = step;
    }
    if (!o.fail.empty() && !t.stop_requested()) {
      say({{"event", "failing"}, {"task_id", t.id()}, {"attempt", t.attempt()}});
      throw rlbus::task_failure(o.fail, packed({{"worker", o.id}, {"steps", step}}));
    }
    wait_stop(t);
    say({{"event", "run_end"},
         {"task_id", t.id()},
         {"attempt", t.attempt()},
         {"aborted", t.aborted()}});
  };
  h.close = [&o, done, mutex](rlbus::task_handle& t) {
    std::uint32_t steps = 0;
    {
      const std::lock_guard<std::mutex> lock(*mutex);
      steps = (*done)[t.id()];
    }
    say({{"event", "close"}, {"task_id", t.id()}, {"attempt", t.attempt()}});
    ++tasks_closed;
    return packed({{"worker", o.id}, {"task_id", t.id()}, {"steps", steps}});
  };
  return h;
}

int run_worker(const options& o) {
  rlbus::worker_options wo;
  wo.endpoint = o.endpoint;
  wo.id = o.id;
  wo.role = o.role == "learner" ? rlbus::role::learner : rlbus::role::collector;
  wo.resources = parse_resources(o.resources);
  wo.heartbeat = std::chrono::milliseconds(o.heartbeat_ms);
  rlbus::worker w(wo, o.role == "learner" ? learner_handlers(o) : collector_handlers(o));
  auto last = w.state();
  say({{"event", "state"}, {"state", std::string(rlbus::to_string(last))}});
  bool ready_said = false;
  std::uint64_t credit_waits = 0;
  while (!should_stop(o)) {
    if (w.credit_waits() != credit_waits) {
      credit_waits = w.credit_waits();
      say({{"event", "credit_waits"}, {"count", credit_waits}});
    }
    const auto s = w.state();
    if (s != last) {
      say({{"event", "state"},
           {"state", std::string(rlbus::to_string(s))},
           {"welcomes", w.welcomes()}});
      last = s;
    }
    if (s == rlbus::connection_state::ready && !ready_said) {
      say({{"event", "ready"}, {"id", o.id}, {"role", o.role}});
      ready_said = true;
    }
    if (s == rlbus::connection_state::refused) {
      say({{"event", "refused"}, {"error", w.last_error()}});
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  w.stop();
  say({{"event", "stopped"},
       {"tasks_closed", tasks_closed.load()},
       {"data_resent", w.data_resent()},
       {"data_dropped", w.data_dropped()}});
  return 0;
}

// ---- coordinator ---------------------------------------------------------------------------

int run_coordinator(const options& o) {
  std::atomic<std::uint32_t> ended{0};
  std::mutex m;
  std::map<std::string, std::uint32_t> requests;  // get_data calls per task
  rlbus::coordinator_callbacks cb;
  cb.deal_with_collector_send_data = [&o](const std::string& task_id, const std::string& buffer_id,
                                          const std::string& data_id, const std::string& data) {
    if (o.hold_data && !released.load()) {
      say({{"event", "holding"}, {"task_id", task_id}, {"data_id", data_id}});
      while (!released.load() && !should_stop(o)) std::this_thread::sleep_for(5ms);
    }
    say({{"event", "data"},
         {"task_id", task_id},
         {"buffer_id", buffer_id},
         {"data_id", data_id},
         {"data", user_data(data)}});
  };
  cb.deal_with_collector_judge_finish = [](const std::string& task_id, const std::string& info) {
    const json j = user_data(info);
    say({{"event", "info"}, {"task_id", task_id}, {"info", j}});
    return j.is_object() && j.value("collector_done", false);
  };
  cb.deal_with_collector_finish_task = [&ended](const std::string& task_id,
                                                const std::string& result) {
    say({{"event", "finished"},
         {"kind", "collector"},
         {"task_id", task_id},
         {"result", user_data(result)}});
    ++ended;
  };
  cb.deal_with_learner_get_data = [&o, &m, &requests](
                                      const std::string& task_id, const std::string& buffer_id,
                                      std::uint32_t batch_size,
                                      std::uint64_t iter) -> std::optional<std::string> {
    std::uint32_t n = 0;
    {
      const std::lock_guard<std::mutex> lock(m);
      n = requests[task_id]++;
    }
    const bool give = n >= o.no_data_first;
    say({{"event", "data_request"},
         {"task_id", task_id},
         {"buffer_id", buffer_id},
         {"batch_size", batch_size},
         {"iter", iter},
         {"answered", give}});
    if (!give) return std::nullopt;
    return packed({{"task_id", task_id}, {"iter", iter}, {"batch_size", batch_size}});
  };
  cb.deal_with_learner_judge_finish = [](const std::string& task_id, const std::string& info) {
    const json j = user_data(info);
    say({{"event", "learn_info"}, {"task_id", task_id}, {"info", j}});
    return j.is_object() && j.value("learner_done", false);
  };
  cb.deal_with_learner_finish_task = [&ended](const std::string& task_id,
                                              const std::string& result) {
    say({{"event", "finished"},
         {"kind", "learner"},
         {"task_id", task_id},
         {"result", user_data(result)}});
    ++ended;
  };
  const auto result_json = [](const std::optional<std::string>& r) -> json {
    return r ? user_data(*r) : json(nullptr);
  };
  cb.on_task_requeued = [result_json](const std::string& task_id, std::uint32_t attempt,
                                      const std::string& reason,
                                      const std::optional<std::string>& result) {
    say({{"event", "requeued"},
         {"task_id", task_id},
         {"attempt", attempt},
         {"reason", reason},
         {"result", result_json(result)}});
  };
  cb.on_task_failed = [&ended, result_json](const std::string& task_id, const std::string& reason,
                                            const std::optional<std::string>& result) {
    say({{"event", "failed"},
         {"task_id", task_id},
         {"reason", reason},
         {"result", result_json(result)}});
    ++ended;
  };
  cb.on_task_cancelled = [&ended](const std::string& task_id, const std::string& reason) {
    say({{"event", "cancelled"}, {"task_id", task_id}, {"reason", reason}});
    ++ended;
  };
  cb.on_capacity = [](rlbus::role kind, const std::string& change, const std::string& worker_id,
                      std::uint64_t count) {
    say({{"event", "capacity"},
         {"kind", std::string(rlbus::to_string(kind))},
         {"change", change},
         {"worker_id", worker_id},
         {"count", count}});
  };
  cb.on_stream_lost = [](std::uint64_t first, std::uint64_t last) {
    say({{"event", "stream_lost"}, {"first", first}, {"last", last}});
  };
  cb.on_data_lost = [](const std::string& task_id, std::uint32_t attempt, std::uint64_t first,
                       std::uint64_t last) {
    say({{"event", "data_lost"},
         {"task_id", task_id},
         {"attempt", attempt},
         {"first", first},
         {"last", last}});
  };

  rlbus::coordinator_options co;
  co.endpoint = o.endpoint;
  co.id = o.id;
  co.heartbeat = std::chrono::milliseconds(o.heartbeat_ms);
  rlbus::coordinator c(co, std::move(cb));
  const auto waiting = [&] { return !should_stop(o); };
  if (!wait_until([&] { return !waiting() || c.state() == rlbus::connection_state::ready; }, 30s) ||
      !waiting()) {
    say({{"event", "not_ready"}, {"state", std::string(rlbus::to_string(c.state()))}});
    c.stop();
    return 1;
  }
  say({{"event", "ready"}, {"id", o.id}, {"role", "coordinator"}});
  if (!wait_until(
          [&] {
            return !waiting() ||
                   (c.collectors() >= o.wait_collectors && c.learners() >= o.wait_learners);
          },
          30s)) {
    say({{"event", "workers_missing"}, {"collectors", c.collectors()}, {"learners", c.learners()}});
  }
  std::uint32_t submitted = 0;
  const auto submit = [&](rlbus::role kind, std::uint32_t i) {
    rlbus::task_spec spec;
    const bool collector = kind == rlbus::role::collector;
    spec.task_id = o.task_prefix + (collector ? "-c" : "-l") + std::to_string(i);
    spec.kind = kind;
    spec.task_info = collector ? packed({{"data", o.data_per_task}}) : packed({{"steps", o.steps}});
    if (collector && !o.policy_id.empty()) spec.policy_id = o.policy_id;
    spec.max_attempts = o.max_attempts;
    spec.start_timeout_ms = o.start_timeout_ms;
    spec.step_timeout_ms = o.step_timeout_ms;
    spec.task_timeout_ms = o.task_timeout_ms;
    const auto r = c.submit(spec);
    if (!r) {
      say({{"event", "submit_timeout"}, {"task_id", spec.task_id}});
      return;
    }
    say({{"event", "submitted"},
         {"task_id", spec.task_id},
         {"kind", std::string(rlbus::to_string(kind))},
         {"accepted", r->accepted},
         {"code", r->code},
         {"reason", r->reason},
         {"queued", r->queued}});
    if (r->accepted) ++submitted;
  };
  for (std::uint32_t i = 0; i < o.collector_tasks; ++i) submit(rlbus::role::collector, i);
  for (std::uint32_t i = 0; i < o.learner_tasks; ++i) submit(rlbus::role::learner, i);
  bool done_said = false;
  while (!should_stop(o)) {
    if (!done_said && ended.load() >= submitted) {
      say({{"event", "done"},
           {"tasks", submitted},
           {"open_tasks", c.open_tasks()},
           {"stream_gaps", c.stream_gaps()},
           {"data_lost", c.data_lost()}});
      done_said = true;
      if (!o.stay) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  c.stop();
  say({{"event", "stopped"},
       {"stream_replays", c.stream_replays()},
       {"stream_duplicates", c.stream_duplicates()}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{
      "rlbus-sdk-peer: a C++ SDK collector, learner or coordinator that prints what happens as\n"
      "JSON lines on stdout (for tests that mix C++ and Python peers).\n"
      "A collector emits --data DATA per task (task_info \"data\" overrides), then INFO\n"
      "{collector_done: true}, and waits for the close. A learner asks for --steps batches\n"
      "(task_info \"steps\" overrides), sending LEARN_INFO after each, learner_done on the last.\n"
      "A coordinator submits --collector-tasks and --learner-tasks tasks named\n"
      "<prefix>-c<i> / <prefix>-l<i> and exits once all have ended (unless --stay)."};
  app.add_option("--endpoint", o.endpoint, "The broker's ROUTER endpoint")->required();
  app.add_option("--id", o.id, "Peer id (1-128 of A-Z a-z 0-9 . _ : @ / -)")->required();
  app.add_option("--role", o.role, "collector, learner or coordinator")
      ->required()
      ->check(CLI::IsMember({"collector", "learner", "coordinator"}));
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "Heartbeat interval asked of the broker")
      ->capture_default_str();
  app.add_option("--resource", o.resources, "A worker resource, name=value (repeatable)");
  app.add_flag("--exit-on-eof", o.exit_on_eof,
               "Exit when stdin reaches its end (a line \"release\" releases --hold-data)");
  app.add_option("--data", o.data_per_task,
                 "Collector: data per task; coordinator: task_info "
                 "\"data\" of its collector tasks")
      ->capture_default_str();
  app.add_option("--buffer-id", o.buffer_id, "Buffer id of DATA, GET_DATA and LEARN_INFO")
      ->capture_default_str();
  app.add_option("--payload-bytes", o.payload_bytes, "Collector: inline payload size (0: none)")
      ->capture_default_str();
  app.add_option("--steps", o.steps,
                 "Learner: batches per task; coordinator: task_info "
                 "\"steps\" of its learner tasks")
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Learner: batch size asked for")
      ->capture_default_str();
  app.add_option("--step-delay-ms", o.step_delay_ms, "Workers: pause after each data / step")
      ->capture_default_str();
  app.add_option("--hang-after", o.hang_after,
                 "Collector: after this many data, stop emitting and wait for the close/abort");
  app.add_option("--fail", o.fail, "Workers: fail every attempt with this reason (task_failure)");
  app.add_option("--exit-after", o.exit_after, "Workers: exit after this many tasks closed");
  app.add_option("--get-data-timeout-ms", o.get_data_timeout_ms, "Learner: get_data timeout")
      ->capture_default_str();
  app.add_option("--publish-policy", o.publish_policy,
                 "Learner: after each step, publish the next version v (1, 2, ...) of this "
                 "policy with params \"params-v<v>\"");
  app.add_option("--policy-id", o.policy_id, "Coordinator: policy_id of its collector tasks");
  app.add_option("--collector-tasks", o.collector_tasks, "Coordinator: collector tasks to submit")
      ->capture_default_str();
  app.add_option("--learner-tasks", o.learner_tasks, "Coordinator: learner tasks to submit")
      ->capture_default_str();
  app.add_option("--task-prefix", o.task_prefix, "Coordinator: task id prefix")
      ->capture_default_str();
  app.add_option("--wait-collectors", o.wait_collectors,
                 "Coordinator: wait for this many live collectors before submitting");
  app.add_option("--wait-learners", o.wait_learners,
                 "Coordinator: wait for this many live learners before submitting");
  app.add_option("--no-data-first", o.no_data_first,
                 "Coordinator: answer the first N data requests of each task with no data");
  app.add_option("--max-attempts", o.max_attempts, "Coordinator: SUBMIT max_attempts");
  app.add_option("--start-timeout-ms", o.start_timeout_ms, "Coordinator: SUBMIT start_timeout_ms");
  app.add_option("--step-timeout-ms", o.step_timeout_ms, "Coordinator: SUBMIT step_timeout_ms");
  app.add_option("--task-timeout-ms", o.task_timeout_ms, "Coordinator: SUBMIT task_timeout_ms");
  app.add_flag("--stay", o.stay, "Coordinator: keep running after every task ended");
  app.add_flag("--hold-data", o.hold_data,
               "Coordinator: the data callback blocks (holding the stream) until a line "
               "\"release\" comes on stdin");
  CLI11_PARSE(app, argc, argv);

  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  if (o.exit_on_eof || o.hold_data) {
    std::thread([] {
      std::string line;
      while (std::getline(std::cin, line)) {
        if (line == "release") released = true;
      }
      stdin_closed = true;
    }).detach();
  }
  try {
    return o.role == "coordinator" ? run_coordinator(o) : run_worker(o);
  } catch (const std::exception& e) {
    say({{"event", "error"}, {"what", e.what()}});
    return 1;
  }
}
