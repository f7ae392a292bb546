// rlbus-demo: the demo binary. `run` (the default) is the launcher and coordinator; the
// `collector` and `learner` subcommands are the worker processes it starts (one binary, so
// the demo is one file to ship). Flags -> options; exit codes are launch_options' exit_code.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "demo/launcher.hpp"
#include "demo/learner.hpp"
#include "demo/roles.hpp"

int main(int argc, char** argv) {
  using namespace rlbus::demo;
  launch_options o;
  auto& t = o.training;
  std::uint64_t kill_at = 0;
  std::uint64_t kill_broker_at = 0;
  std::uint64_t kill_leader_at = 0;
  std::uint32_t time_limit_s = 120;
  std::uint32_t heartbeat_ms = 250;

  CLI::App app{
      "rlbus-demo: distributed reinforcement learning over the rlbus broker.\n"
      "Starts rlbus-broker, one learner and N collectors (separate processes, over tcp) and\n"
      "coordinates them until a linear policy solves cart-pole (CartPole-v1). Exit status:\n"
      "0 solved, 1 not solved (limit reached or failure), 2 bad flags, 3 could not start,\n"
      "130 interrupted."};
  app.get_formatter()->column_width(34);
  app.require_subcommand(0, 1);

  auto* run = app.add_subcommand("run", "train (the default); `rlbus-demo --help` lists its flags");
  run->fallthrough();  // `rlbus-demo run --port 7300` means the top-level --port
  app.add_option("--port", o.port, "broker port on 127.0.0.1 (0: any free port)")
      ->capture_default_str();
  app.add_option("--collectors", o.collectors, "collector processes")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--seed", t.seed, "run seed: the same seed gives the same training")
      ->capture_default_str();
  app.add_option("--max-iterations", t.max_iterations, "give up after this many policy updates")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  app.add_option("--time-limit", time_limit_s, "give up after this many seconds")
      ->capture_default_str()
      ->check(CLI::Range(1, 86'400));
  auto* kill = app.add_option("--kill-collector-at", kill_at,
                              "chaos: SIGKILL a collector that is running a task at this "
                              "iteration; its task is re-queued and training goes on");
  auto* kill_broker = app.add_option("--kill-broker-at", kill_broker_at,
                                     "chaos: SIGKILL the broker at this iteration and start it "
                                     "again on its journal; training goes on");
  auto* kill_leader =
      app.add_option("--kill-leader-at", kill_leader_at,
                     "chaos: run two brokers in a group beside a throwaway etcd (etcd-server "
                     "must be installed) and SIGKILL the leader at this iteration; the standby "
                     "takes over on its copy of the journal and training goes on")
          ->excludes(kill_broker);
  app.add_flag("--respawn", o.respawn, "restart a collector that died (same id)");
  std::uint32_t linger_s = 0;
  app.add_option("--linger", linger_s,
                 "after training ends, keep the broker, its web view and the workers up this "
                 "many seconds (Ctrl-C ends the wait sooner), to look around")
      ->capture_default_str()
      ->check(CLI::Range(0, 86'400));
  app.add_option("--broker", o.broker_path,
                 "rlbus-broker binary (default: next to rlbus-demo, else the build tree's src/)");
  app.add_option("--episode-cost-ms", t.episode_cost_ms,
                 "simulated cost of one environment episode on a collector (cart-pole itself "
                 "takes microseconds; real environments do not); 0 runs flat out")
      ->capture_default_str()
      ->check(CLI::Range(0, 10'000));
  app.add_option("--directions", t.directions, "random-search directions per policy version")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--top-directions", t.top_directions, "best directions an update uses")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--directions-per-task", t.directions_per_task,
                 "directions one collector task evaluates (2 episodes each)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--sigma", t.sigma, "perturbation scale")->capture_default_str();
  app.add_option("--step-size", t.step_size, "update step size")->capture_default_str();
  app.add_option("--heartbeat-ms", heartbeat_ms,
                 "heartbeat of every peer; the broker expires one silent for 4 of them")
      ->capture_default_str()
      ->check(CLI::Range(50, 10'000));

  rlbus::demo::worker_process_options w;
  std::uint32_t worker_heartbeat_ms = 250;
  const auto add_worker = [&](const char* name, const char* what) {
    auto* sub = app.add_subcommand(name, what);
    sub->add_option("--id", w.id, "peer id")->required();
    sub->add_option("--endpoint", w.endpoint, "broker ROUTER endpoint")->required();
    sub->add_option("--heartbeat-ms", worker_heartbeat_ms, "heartbeat interval")
        ->capture_default_str()
        ->check(CLI::Range(10, 60'000));
    return sub;
  };
  auto* collector = add_worker("collector", "one collector process (the launcher starts these)");
  auto* learner = add_worker("learner", "the learner process (the launcher starts it)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return exit_usage;
  }

  try {
    if (collector->parsed() || learner->parsed()) {
      w.heartbeat = std::chrono::milliseconds(worker_heartbeat_ms);
      return run_worker_process(collector->parsed() ? rlbus::role::collector : rlbus::role::learner,
                                w);
    }
    // The learner checks its settings again, but a typo is better refused here than as a
    // failed learner task.
    learner_config check;
    check.directions = t.directions;
    check.top_directions = t.top_directions;
    check.sigma = t.sigma;
    check.step_size = t.step_size;
    try {
      check.validate();
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "rlbus-demo: %s\n", e.what());
      return exit_usage;
    }
    if (kill->count() > 0) o.kill_collector_at = kill_at;
    if (kill_broker->count() > 0) o.kill_broker_at = kill_broker_at;
    if (kill_leader->count() > 0) o.kill_leader_at = kill_leader_at;
    o.linger = std::chrono::seconds(linger_s);
    t.time_limit = std::chrono::seconds(time_limit_s);
    t.heartbeat = std::chrono::milliseconds(heartbeat_ms);
    return run_demo(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlbus-demo: %s\n", e.what());
    return exit_start_failed;
  }
}
