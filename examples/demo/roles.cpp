// The collector and learner task handlers, and the little process around them. All the
// reinforcement learning is in collector.hpp / learner.hpp; this file only moves it onto
// the bus: task_info in, data / learn info out.
#include "demo/roles.hpp"

#include <signal.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "demo/collector.hpp"
#include "demo/learner.hpp"
#include "demo/policy.hpp"
#include "demo/policy_channel.hpp"
#include "demo/rng.hpp"
#include "demo/wire.hpp"

namespace rlbus::demo {

namespace {

using namespace std::chrono_literals;

// The stream of the run seed that evaluation episodes come from, apart from every stream
// the learner's work items use, so a policy is never judged on the starts it learned on.
constexpr std::uint64_t eval_stream = 0xE7A1;

// Sleeps `ms` in short steps, returning early once the task should stop: the simulated
// environment cost must not hold up a close or an abort.
void pace(const rlbus::task_handle& t, std::uint32_t ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!t.stop_requested() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(
        std::min<std::chrono::nanoseconds>(2ms, until - std::chrono::steady_clock::now()));
}

void run_collector_task(collector_state& st, rlbus::task_handle& t) {
  const auto task = decode_collector_task(t.info());
  if (!task || task->direction_count == 0)
    throw std::runtime_error("task_info is not a demo collector task");
  const auto release = task_policy(t, *task);
  if (!release) throw std::runtime_error("the task names no policy");
  auto params = params_from_bytes(release->params);
  if (!params || params->size() != policy::parameter_count)
    throw std::runtime_error(fmt::format("policy v{} has malformed parameters", release->version));
  const work_item whole =
      version_work(task->seed, release->version, std::move(*params), task->sigma,
                   task->first_direction + task->direction_count, task->max_steps);

  st.episodes = 0;
  for (std::uint32_t k = 0; k < task->direction_count && !t.stop_requested(); ++k) {
    work_item one = whole;
    one.first_direction = task->first_direction + k;
    one.direction_count = 1;
    const auto results = collect(one);  // + then -, both from the same start state
    pace(t, 2 * task->episode_cost_ms);
    st.episodes += results.size();
    const direction_result r{st.id, results.at(0), results.at(1)};
    t.emit_data(fmt::format("{}/{}/d{}", t.id(), t.attempt(), one.first_direction), results_buffer,
                encode(r));
  }
  if (t.stop_requested()) return;
  t.emit_info(collector_done(st.episodes));
  // The coordinator judges the info and closes the task; until then there is nothing to do.
  while (!t.stop_requested()) std::this_thread::sleep_for(2ms);
}

void run_learner_task(learner_state& st, rlbus::task_handle& t) {
  const auto spec = decode_learner_task(t.info());
  if (!spec) throw std::runtime_error("task_info is not a demo learner task");
  learner_config cfg;
  cfg.seed = spec->seed;
  cfg.directions = spec->directions;
  cfg.top_directions = spec->top_directions;
  cfg.sigma = spec->sigma;
  cfg.step_size = spec->step_size;
  cfg.max_steps = spec->max_steps;
  // Another attempt (the last one's worker died, the broker restarted) goes on from the last
  // version published, not from scratch.
  const auto resumed = latest_policy(t);
  if (resumed) {
    auto params = params_from_bytes(resumed->params);
    if (!params || params->size() != policy::parameter_count)
      throw std::runtime_error(
          fmt::format("policy v{} has malformed parameters", resumed->version));
    cfg.initial_params = std::move(*params);
    cfg.initial_version = resumed->version;
  }
  learner l(cfg);  // bad settings throw: the task fails with the setting's name
  const std::uint64_t eval_seed = derive_seed(spec->seed, eval_stream);
  std::uint64_t eval_total = 0;

  // Evaluates the current mean and tells the coordinator (and, through it, the collectors).
  const auto publish = [&] {
    const auto e = evaluate(policy(l.params()), derive_seed(eval_seed, l.version()),
                            spec->eval_episodes, spec->max_steps);
    eval_total += e.episodes;
    learn_report report;
    report.iteration = l.version();
    report.policy_version = l.version();
    if (const auto& u = l.last_update()) {
      report.batch_mean = u->mean_return;
      report.batch_max = u->max_return;
    }
    report.eval_mean = e.mean_return;
    report.eval_min = e.min_return;
    report.eval_max = e.max_return;
    report.eval_episodes = e.episodes;
    report.episodes = l.total_episodes();
    report.eval_total = eval_total;
    report.learner_done = solved(e);
    if (resumed && l.version() == resumed->version) {
      report.policy_version = l.version();  // out already: the broker holds it
    } else {
      announce_policy(t, report, {l.version(), params_to_bytes(l.params())});
    }
    st.last_report = encode(report);
    t.emit_learn_info(results_buffer, encode(report));
  };

  publish();  // the version it starts from, so the coordinator has a policy to hand out
  while (!t.stop_requested()) {
    const auto data = t.get_data(results_buffer, 2 * cfg.directions, l.version(), 100ms);
    // The SDK's own retries back off to 200 ms; asking afresh every 100 ms keeps the pause
    // between a batch completing and the learner taking it short.
    if (!data) continue;  // none yet, or the task is closing
    const auto batch = decode_result_batch(*data);
    if (!batch || batch->policy_version != l.version())
      throw std::runtime_error(
          fmt::format("the coordinator sent a batch that is not version {}'s", l.version()));
    const auto before = l.version();
    for (const auto& r : batch->results) l.submit(r);
    if (l.version() == before)
      throw std::runtime_error(fmt::format("the batch for version {} was incomplete", before));
    publish();
  }
}

}  // namespace

rlbus::task_handlers collector_handlers(collector_state& st) {
  rlbus::task_handlers h;
  h.run = [&st](rlbus::task_handle& t) { run_collector_task(st, t); };
  h.close = [&st](rlbus::task_handle&) { return collector_done(st.episodes); };
  return h;
}

rlbus::task_handlers learner_handlers(learner_state& st) {
  rlbus::task_handlers h;
  h.run = [&st](rlbus::task_handle& t) { run_learner_task(st, t); };
  h.close = [&st](rlbus::task_handle&) { return st.last_report; };
  return h;
}

int run_worker_process(rlbus::role r, const worker_process_options& opts) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // Blocked before the worker's threads exist, so they inherit the mask and only the
  // sigtimedwait below ever takes these signals.
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  spdlog::set_level(spdlog::level::warn);
  spdlog::set_pattern(fmt::format("{}: %l %v", opts.id));

  rlbus::worker_options wo;
  wo.endpoint = opts.endpoint;
  wo.id = opts.id;
  wo.role = r;
  wo.resources = {{"cpu", 1}};
  wo.heartbeat = opts.heartbeat;
  wo.reconnect_max = 500ms;  // a respawned collector waits for its old session to expire
  collector_state cs{opts.id};
  learner_state ls;
  rlbus::worker w(wo, r == rlbus::role::collector ? collector_handlers(cs) : learner_handlers(ls));

  const timespec tick{0, 200'000'000};
  while (true) {
    if (sigtimedwait(&stop_signals, nullptr, &tick) > 0) break;
    if (w.state() == rlbus::connection_state::refused) {
      spdlog::error("the broker refused this worker: {}", w.last_error());
      return 1;
    }
  }
  w.stop();
  return 0;
}

}  // namespace rlbus::demo
