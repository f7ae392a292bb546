// rlbus-broker: the broker binary. Flags, environment and config file -> config (one table
// of settings, broker/core/settings.hpp), signals -> request_stop(), errors at start-up -> a clear
// message and a non-zero exit code (2: usage or config, 1: cannot bind).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "broker/core/server.hpp"
#include "broker/core/settings.hpp"
#include "broker/group/replica.hpp"
#include "broker/group/standby_door.hpp"
#include "broker/ops/http_endpoint.hpp"
#include "cluster/elector.hpp"
#include "cluster/etcd.hpp"
#include "cluster/group_view.hpp"
#include "cluster/membership.hpp"
#include "rlbus_version.h"
#include "util/curve_keys.hpp"
#include "util/endpoint_list.hpp"
#include "util/log.hpp"
#include "util/run_lock.hpp"

namespace {

// Signals are taken by one thread of their own (sigwait), blocked everywhere else: the broker
// loop and libzmq's threads are never interrupted, and the handler may call anything.
// SIGINT/SIGTERM stop (drain, then at once), SIGHUP reloads the allowlist, SIGUSR1 (sent by
// main itself) ends the thread. They go to the server serving now, if any; stops are counted
// for whoever waits without one (a standby).
class signal_thread {
 public:
  signal_thread() {
    sigemptyset(&set_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&set_, sig);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any other thread exists
    signal(SIGPIPE, SIG_IGN);
    thread_ = std::thread([this] {
      while (true) {
        int sig = 0;
        if (sigwait(&set_, &sig) != 0) continue;
        if (sig == SIGUSR1) return;
        const std::lock_guard<std::mutex> hold(mutex_);
        if (sig != SIGHUP) ++stops_;
        if (server_ == nullptr) continue;
        if (sig == SIGHUP)
          server_->request_reload();
        else
          server_->request_stop();
      }
    });
  }
  ~signal_thread() { stop(); }
  /// Where signals go from now on (nullptr: nowhere, only counted). A stop asked before
  /// (while the server was being made: a journal restored, a takeover) stops it at once.
  void serve(rlbus::broker::server* server) {
    const std::lock_guard<std::mutex> hold(mutex_);
    server_ = server;
    if (server_ != nullptr && stops_ > 0) server_->request_stop();
  }
  [[nodiscard]] bool stop_asked() {
    const std::lock_guard<std::mutex> hold(mutex_);
    return stops_ > 0;
  }
  /// Ends the thread.
  void stop() {
    if (thread_.joinable()) {
      pthread_kill(thread_.native_handle(), SIGUSR1);
      thread_.join();
    }
  }

 private:
  sigset_t set_{};
  std::mutex mutex_;
  rlbus::broker::server* server_ = nullptr;
  int stops_ = 0;
  std::thread thread_;
};

// The broker of one run (--run-lock) stops once no process of the run is left, looked at five
// times a second by a thread of its own. Destroyed before the server it stops.
class run_watch {
 public:
  run_watch(const std::string& path, rlbus::broker::server& server) : lock_(path) {
    thread_ = std::thread([this, path, &server] {
      std::unique_lock<std::mutex> hold(mutex_);
      while (!done_) {
        if (lock_.released()) {
          spdlog::info("no process of the run holds {} any more: stopping", path);
          server.request_stop();
          return;
        }
        wake_.wait_for(hold, std::chrono::milliseconds(200));
      }
    });
  }
  ~run_watch() {
    {
      const std::lock_guard<std::mutex> hold(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  run_watch(const run_watch&) = delete;
  run_watch& operator=(const run_watch&) = delete;

 private:
  rlbus::util::run_lock_watch lock_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// While a server serves, signals go to it (and not once it is gone).
struct serving {
  serving(signal_thread& s, rlbus::broker::server& server) : signals(s) { s.serve(&server); }
  ~serving() { signals.serve(nullptr); }
  serving(const serving&) = delete;
  serving& operator=(const serving&) = delete;
  signal_thread& signals;
};

// One line for whoever started the broker to read the endpoints from (SPEC §1.4.1): a port 0
// or * is resolved to the one bound.
void say_listening(const rlbus::broker::server& server, const rlbus::broker::http_endpoint* http) {
  std::printf("rlbus-broker listening router=%s events=%s%s%s\n", server.router_endpoint().c_str(),
              server.events_endpoint().c_str(), http ? " metrics=" : "",
              http ? http->url().c_str() : "");
  std::fflush(stdout);
}

// Who may see the web view: a token when one is set; one is needed with CURVE on or on an
// address other machines reach. Throws std::runtime_error when the token file is unusable.
rlbus::broker::web_access web_access_of(const rlbus::broker::config& cfg) {
  rlbus::broker::web_access access;
  if (!cfg.metrics_token_path.empty())
    access.token = rlbus::broker::read_token_file(cfg.metrics_token_path);
  access.token_required =
      !cfg.curve_key_path.empty() || !rlbus::broker::loopback_host(cfg.metrics_address);
  access.token_for_metrics = cfg.metrics_token_for_metrics;
  if (cfg.metrics_port != 0 && access.token_required && access.token.empty())
    spdlog::warn(
        "the web view is off: with CURVE on or on {} it needs a token (metrics.token-file); "
        "/metrics, /healthz and /readyz are served",
        cfg.metrics_address);
  return access;
}

// The web view's sources: `server`'s loop and recent counters.
rlbus::broker::web_sources web_sources_of(rlbus::broker::server& server) {
  return {[&server](std::vector<rlbus::codec::ops> questions, std::chrono::milliseconds timeout) {
            return server.ask(std::move(questions), timeout);
          },
          [&server](std::int64_t after) { return server.recent().since(after); }};
}

// The broker alone: serves until stopped.
int serve_alone(zmq::context_t& ctx, const rlbus::broker::config& cfg, signal_thread& signals) {
  rlbus::broker::server server(ctx, cfg);
  const serving routed(signals, server);
  // Metrics, probes and the web view on a port of their own, when asked for: serving from
  // here on.
  std::unique_ptr<rlbus::broker::http_endpoint> http;
  if (cfg.metrics_port != 0)
    http = std::make_unique<rlbus::broker::http_endpoint>(
        cfg.metrics_address, cfg.metrics_port, [&server] { return server.snapshot(); },
        web_sources_of(server), web_access_of(cfg));
  std::unique_ptr<run_watch> run;  // destroyed before `server`
  if (!cfg.run_lock_path.empty()) run = std::make_unique<run_watch>(cfg.run_lock_path, server);
  say_listening(server, http.get());
  server.run();
  return 0;
}

// `endpoint` with its port replaced (tcp://HOST:PORT).
std::string with_port(const std::string& endpoint, const std::string& port) {
  return endpoint.substr(0, endpoint.rfind(':') + 1) + port;
}
std::string port_of(const std::string& endpoint) {
  return endpoint.substr(endpoint.rfind(':') + 1);
}

rlbus::broker::replica_config replica_settings(const rlbus::broker::config& cfg,
                                               const std::string& member) {
  rlbus::broker::replica_config rc;
  rc.journal_path = cfg.journal_path;
  rc.fsync = cfg.journal_fsync;
  rc.compact_bytes = cfg.journal_compact_bytes;
  rc.member = member;
  rc.max_message = cfg.max_message;
  if (!cfg.curve_key_path.empty()) rc.curve = rlbus::util::read_curve_file(cfg.curve_key_path);
  return rc;
}

// A broker of a group: stands by until etcd makes it the leader, serves while it leads, and
// stands by again when its lease could run out, until stopped.
int serve_in_group(zmq::context_t& ctx, const rlbus::broker::config& cfg, signal_thread& signals) {
  rlbus::broker::validate(cfg);  // before the group hears of it
  rlbus::cluster::elector_config ec;
  ec.etcd = rlbus::util::split_endpoints(cfg.cluster_etcd);
  ec.group = cfg.cluster_name;
  ec.member = cfg.cluster_member.empty() ? cfg.advertise : cfg.cluster_member;
  ec.advertise = cfg.advertise;
  ec.lease_ttl = std::chrono::seconds(cfg.cluster_lease_ms / 1000);
  ec.margin = std::chrono::milliseconds(cfg.cluster_margin_ms);
  ec.renew = std::chrono::milliseconds(cfg.cluster_lease_ms / 4);
  // A request that takes longer than a renewal's period is as good as failed.
  ec.timeout = ec.renew;
  try {  // a group whose etcd cannot be reached at start is most likely misconfigured
    rlbus::cluster::etcd_client(ec.etcd, std::chrono::seconds(2)).get("/rlbus/" + ec.group);
  } catch (const std::exception& e) {
    spdlog::critical("cannot start: group {}: {}", ec.group, e.what());
    return 1;
  }
  // Checked against the group's other brokers: a name, an advertised endpoint or a version
  // that does not fit is refused here, before it can lead.
  std::unique_ptr<rlbus::cluster::membership> member;
  try {
    member = std::make_unique<rlbus::cluster::membership>(
        ec.etcd, ec.group,
        rlbus::cluster::member_info{ec.member, ec.advertise, RLBUS_VERSION,
                                    static_cast<std::int64_t>(rlbus::util::wall_ms())},
        ec.lease_ttl, std::chrono::seconds(2));
  } catch (const std::exception& e) {
    spdlog::critical("cannot start: group {}: {}", ec.group, e.what());
    return 1;
  }
  // While it stands by, its ROUTER endpoint tells peers where the leader is (SPEC §14.9.1);
  // bound before it campaigns, so that a broker whose endpoint is taken never leads. With a
  // journal it also holds the endpoint where, leading, it streams the journal to the standbys
  // (§14.10): resolved once, then bound again as it was.
  std::string replication;
  if (!cfg.journal_path.empty())
    replication = !cfg.cluster_replication.empty()
                      ? cfg.cluster_replication
                      : with_port(rlbus::broker::normalize_endpoint(cfg.router_endpoint), "*");
  std::unique_ptr<rlbus::broker::standby_door> door;
  std::unique_ptr<rlbus::broker::replica> copy;
  try {
    door = std::make_unique<rlbus::broker::standby_door>(ctx, cfg, replication);
    if (!replication.empty()) {
      replication = door->replication_endpoint();
      ec.replication = with_port(cfg.advertise, port_of(replication));
      copy = std::make_unique<rlbus::broker::replica>(ctx, replica_settings(cfg, ec.member));
    }
  } catch (const std::exception& e) {
    spdlog::critical("cannot start: {}", e.what());
    return 1;
  }
  if (cfg.journal_path.empty())
    spdlog::warn(
        "group {}: this broker has no journal, so no standby copies what it accepts: a takeover "
        "starts with no tasks (give each broker --journal)",
        ec.group);
  ec.replicates = !replication.empty();
  rlbus::cluster::elector group(ec);
  // The group as the web view shows it: etcd is asked at most every 2 s however many watch.
  rlbus::cluster::group_watch watch(ec.etcd, ec.group, ec.member, ec.timeout,
                                    std::chrono::seconds(2));
  std::mutex mutex;  // `current`, for the HTTP endpoint's thread
  rlbus::broker::server* current = nullptr;
  std::unique_ptr<rlbus::broker::http_endpoint> http;
  // The web view reads whichever server leads from here; standing by, it has nothing to show.
  rlbus::broker::web_sources web{
      [&](std::vector<rlbus::codec::ops> questions,
          std::chrono::milliseconds timeout) -> std::optional<std::vector<rlbus::codec::blob>> {
        const std::lock_guard<std::mutex> hold(mutex);
        if (current == nullptr) return std::nullopt;
        return current->ask(std::move(questions), timeout);
      },
      [&](std::int64_t after) {
        const std::lock_guard<std::mutex> hold(mutex);
        return current != nullptr ? current->recent().since(after)
                                  : std::vector<rlbus::broker::series::sample>{};
      },
      [&watch] {
        return watch.get().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      }};
  if (cfg.metrics_port != 0)
    http = std::make_unique<rlbus::broker::http_endpoint>(
        cfg.metrics_address, cfg.metrics_port,
        [&] {
          const std::lock_guard<std::mutex> hold(mutex);
          if (current != nullptr) return current->snapshot();
          rlbus::broker::stats s;
          s.standby = true;
          return s;
        },
        web, web_access_of(cfg));
  std::printf("rlbus-broker standing by: member %s of group %s router=%s%s%s\n", ec.member.c_str(),
              ec.group.c_str(), door->endpoint().c_str(), http ? " metrics=" : "",
              http ? http->url().c_str() : "");
  std::fflush(stdout);
  std::int64_t seen = 0;  // the epoch of the leader last named in the log
  while (!signals.stop_asked()) {
    if (!group.leads()) {
      const auto l = group.leader();
      if (l.epoch != seen && l.epoch != 0) {
        seen = l.epoch;
        spdlog::info("standing by: {} leads group {} (epoch {}, peers at {})", l.member, ec.group,
                     l.epoch, l.advertise);
      }
      if (!door) {
        try {
          door = std::make_unique<rlbus::broker::standby_door>(ctx, cfg, replication);
        } catch (const std::exception& e) {  // its last leadership's sockets not yet gone
          spdlog::warn("group {}: cannot bind its endpoints to stand by: {}; trying again",
                       ec.group, e.what());
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          continue;
        }
      }
      if (!replication.empty() && !copy)
        copy = std::make_unique<rlbus::broker::replica>(ctx, replica_settings(cfg, ec.member));
      rlbus::broker::leader_hint hint;
      if (l.epoch > 0 && l.member != ec.member) {  // never itself: its own leadership is over
        hint = {l.member, l.advertise, static_cast<std::uint64_t>(l.epoch)};
      }
      if (copy) {
        if (hint.epoch > 0)
          copy->follow(l.replication, hint.epoch);
        else
          copy->follow("", 0);
      }
      // A short turn: a change of leader (or its own election) is seen within it.
      door->serve(hint, rlbus::util::clock::now() + std::chrono::milliseconds(50));
      continue;
    }
    door.reset();  // the endpoint is the leader's now
    if (copy) {
      const auto held = copy->state();
      copy.reset();  // the journal is the server's now
      spdlog::info("taking over with the journal {} holds: leadership {} up to position {}",
                   cfg.journal_path, held.epoch, held.position);
    }
    spdlog::info("leading group {} (epoch {}): serving", ec.group, group.epoch());
    // A leader that cannot bind its endpoints (a socket of its own last turn not yet gone, or
    // another process on the port) gives the leadership back and campaigns again: it may be
    // the only broker in sync, so exiting would leave the group without a leader.
    std::optional<rlbus::broker::server> leading;
    try {
      leading.emplace(ctx, cfg);
      rlbus::broker::replicator_config rc;
      if (!replication.empty()) {
        rc.endpoint = replication;
        rc.self = ec.member;
        // Who is in sync, recorded only while this leadership holds (SPEC §14.10.6).
        rc.publish_in_sync = [&group, &ec, epoch = group.epoch(),
                              etcd = std::make_shared<rlbus::cluster::etcd_client>(
                                  ec.etcd, ec.renew)](const std::vector<std::string>& members) {
          try {
            if (etcd->put_guarded(group.insync_key(), nlohmann::json{{"members", members}}.dump(),
                                  group.key(), epoch)) {
              spdlog::info("group {}: in sync now: {}", ec.group, fmt::join(members, ", "));
              return true;
            }
          } catch (const std::exception& e) {
            spdlog::warn("group {}: cannot record who is in sync: {}", ec.group, e.what());
          }
          return false;
        };
      }
      leading->fence([&group] { return group.serving_until(); },
                     static_cast<std::uint64_t>(group.epoch()), std::move(rc));
    } catch (const std::exception& e) {
      spdlog::error(
          "group {}: cannot serve as its leader: {}; it gives the leadership back and "
          "campaigns again in a second",
          ec.group, e.what());
      leading.reset();
      group.step_aside();
      continue;
    }
    auto& server = *leading;
    {
      const serving routed(signals, server);
      {
        const std::lock_guard<std::mutex> hold(mutex);
        current = &server;
      }
      say_listening(server, http.get());
      server.run();
      const std::lock_guard<std::mutex> hold(mutex);
      current = nullptr;
    }
    if (!server.fenced()) break;  // stopped
  }
  group.resign();
  return 0;
}

// rlbus-broker keygen STEM: a fresh CURVE key pair in STEM.key (0600) and STEM.pub.
int keygen(const std::string& stem) {
  try {
    const auto pair = rlbus::util::make_curve_pair();
    rlbus::util::write_curve_pair(stem, pair);
    std::printf("wrote %s.key (secret, mode 0600) and %s.pub\npublic key: %s\n", stem.c_str(),
                stem.c_str(), pair.public_key.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlbus-broker keygen: %s\n", e.what());
    return 1;
  }
}

// The flags of every setting, made from the table (broker/core/settings.hpp): each takes its value
// as text, checked as the config file's would be, and may come from its environment variable.
// Returns each setting's option, to tell afterwards which ones were given.
std::vector<std::pair<const rlbus::broker::setting*, CLI::Option*>> add_settings(
    CLI::App& app, rlbus::broker::config& cfg) {
  const rlbus::broker::config defaults;
  const std::map<std::string_view, std::string> groups{{"", "Endpoints and sessions"},
                                                       {"tasks", "Tasks"},
                                                       {"bus", "The topic bus"},
                                                       {"durability", "Durability"},
                                                       {"cluster", "A group of brokers"},
                                                       {"policies", "Policies"},
                                                       {"security", "Security and limits"},
                                                       {"metrics", "Metrics"},
                                                       {"log", "Logging"}};
  std::vector<std::pair<const rlbus::broker::setting*, CLI::Option*>> out;
  for (const auto& s : rlbus::broker::settings()) {
    const auto help = fmt::format("{} (config file: {})", s.help, s.key());
    CLI::Option* opt = nullptr;
    if (std::holds_alternative<bool rlbus::broker::config::*>(s.where)) {
      opt = app.add_flag(s.flag(), cfg.*std::get<bool rlbus::broker::config::*>(s.where), help);
    } else {
      opt = app.add_option_function<std::string>(
                   s.flag(),
                   [&cfg, &s](const std::string& text) {
                     if (auto why = s.assign(cfg, text); !why.empty())
                       throw CLI::ValidationError(s.flag(), why);
                   },
                   help)
                ->default_str(s.text(defaults));
      const bool text = std::holds_alternative<std::string rlbus::broker::config::*>(s.where);
      opt->type_name(!s.words.empty() ? "WORD"
                     : text           ? "TEXT"
                     : s.unit == "ms" ? "MS"
                     : s.unit.empty() ? "N"
                                      : "BYTES");
    }
    opt->envname(s.env())->group(groups.at(s.section));
    out.emplace_back(&s, opt);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  rlbus::broker::config cfg;

  CLI::App app{
      "rlbus-broker: message bus for distributed reinforcement learning.\n"
      "Workers (collectors, learners) and coordinators connect to the ROUTER endpoint;\n"
      "events (workers joined/lost, broker heartbeat) are published on the events endpoint.\n"
      "Stops on SIGINT/SIGTERM with a drain: no new sessions or tasks, queued tasks are\n"
      "cancelled, running tasks get up to --drain-ms to end on their own (a second signal\n"
      "stops at once); then what is left is aborted, every peer is told DISCONNECT, exit 0.\n"
      "SIGHUP reads the allowlist again (so does a change of its file).\n"
      "Every setting is a flag, an environment variable (RLBUS_BROKER_...) or a key of a TOML\n"
      "file (--config), strongest first; --print-config shows what is in effect.\n"
      "Times are in milliseconds. `rlbus-broker keygen STEM` makes a CURVE key pair.\n"
      "Exit status: 0 stopped cleanly, 1 cannot start (endpoint in use, journal), 2 bad\n"
      "flags, configuration or config file."};
  app.get_formatter()->column_width(40);
  std::string config_path;
  app.add_option("--config", config_path,
                 "TOML file of settings (see --print-config); flags and the environment win")
      ->envname("RLBUS_BROKER_CONFIG");
  bool print_config = false;
  app.add_flag("--print-config", print_config,
               "print the configuration in effect (defaults, file, environment, flags) as a "
               "TOML file and exit");
  bool print_reference = false;
  app.add_flag("--print-reference", print_reference,
               "print the reference page of every setting (Markdown) and exit");
  const auto options = add_settings(app, cfg);
  std::string keygen_stem;
  auto* keygen_cmd = app.add_subcommand(
      "keygen",
      "write a new CURVE key pair: STEM.key (public and secret key, mode 0600; never "
      "overwritten) and STEM.pub (public key, for allowlists and peers), then exit");
  keygen_cmd->add_option("stem", keygen_stem, "path without extension, e.g. keys/broker")
      ->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (keygen_cmd->parsed()) return keygen(keygen_stem);
  if (print_reference) {
    std::fputs(rlbus::broker::reference_markdown().c_str(), stdout);
    return 0;
  }
  std::set<std::string> given;  // by a flag or the environment
  for (const auto& [s, opt] : options)
    if (opt->count() > 0) given.insert(s->key());
  if (!config_path.empty()) {
    try {
      const auto from_file = rlbus::broker::load_config_file(config_path, cfg, given);
      given.insert(from_file.begin(), from_file.end());
    } catch (const rlbus::broker::config_file_error& e) {
      std::fprintf(stderr, "rlbus-broker: %s\n", e.what());
      return 2;
    }
  }
  // The window's default follows a small ring, so every ring size allowed works without
  // naming a window as well.
  if (given.count("tasks.stream-window") == 0)
    cfg.stream_window = std::min<std::size_t>(1024, cfg.stream_ring / 2);
  if (print_config) {
    try {
      rlbus::broker::validate(cfg);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "rlbus-broker: bad configuration: %s\n", e.what());
      return 2;
    }
    std::fputs(rlbus::broker::to_toml(cfg).c_str(), stdout);
    return 0;
  }

  spdlog::set_level(spdlog::level::from_str(cfg.log_level));
  rlbus::util::set_log_format(cfg.log_format);
  signal_thread signals;  // first: every thread made later inherits the blocked signals
  try {
    zmq::context_t ctx(1);
    return cfg.cluster_etcd.empty() ? serve_alone(ctx, cfg, signals)
                                    : serve_in_group(ctx, cfg, signals);
  } catch (const std::invalid_argument& e) {
    spdlog::critical("bad configuration: {}", e.what());
    return 2;
  } catch (const zmq::error_t& e) {
    spdlog::critical("cannot start: {} (is another broker using the endpoint?)", e.what());
    return 1;
  } catch (const rlbus::broker::journal_in_use& e) {
    spdlog::critical("{}", e.what());
    return 2;
  } catch (const rlbus::broker::journal_error& e) {
    spdlog::critical("{}", e.what());
    return 1;
  } catch (const std::runtime_error& e) {  // the HTTP endpoint could not listen
    spdlog::critical("cannot start: {}", e.what());
    return 1;
  }
}
