// The broker's table of settings and its config file: every setting is reachable by one key,
// one flag and one environment variable; a file sets what it names and nothing else; a file
// that cannot be used is refused naming the file, the line, the key, the value and why; the
// printed configuration is itself a config file that gives the same configuration back.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <fmt/format.h>

#include "broker/core/settings.hpp"

using namespace rlbus;

namespace {

// A config file in a fresh directory, removed with it.
struct config_file {
  std::filesystem::path dir;
  std::string path;
  explicit config_file(const std::string& text) {
    char pattern[] = "/tmp/rlbus-settings-XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    dir = pattern;
    path = (dir / "broker.toml").string();
    std::ofstream(path) << text;
  }
  ~config_file() { std::filesystem::remove_all(dir); }
  config_file(const config_file&) = delete;
  config_file& operator=(const config_file&) = delete;
};

std::string refusal_of(const std::string& text) {
  config_file f(text);
  broker::config cfg;
  try {
    broker::load_config_file(f.path, cfg, {});
  } catch (const broker::config_file_error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains(f.path));
    return what;
  }
  FAIL("the file was taken: " << text);
  return {};
}

}  // namespace

TEST_CASE("every setting has its own key, flag and environment variable", "[unit][settings]") {
  std::set<std::string> keys, flags, envs;
  const broker::config defaults;
  for (const auto& s : broker::settings()) {
    INFO(s.key());
    CHECK(keys.insert(s.key()).second);
    CHECK(flags.insert(s.flag()).second);
    CHECK(envs.insert(s.env()).second);
    CHECK(s.env().rfind("RLBUS_BROKER_", 0) == 0);
    CHECK_FALSE(s.help.empty());
    CHECK(broker::find_setting(s.key()) == &s);
    // Its default, given back as text, is a value it takes and changes nothing.
    broker::config cfg;
    CHECK(s.assign(cfg, s.text(defaults)).empty());
    CHECK(s.text(cfg) == s.text(defaults));
  }
  // The endpoints, a timeout, a limit, a heartbeat bound, the queue bound, the journal and
  // security options are all there.
  for (const char* key :
       {"router", "events", "tasks.step-timeout", "max-message", "heartbeat-min", "tasks.max-queue",
        "durability.journal", "durability.journal-fsync", "security.curve-key",
        "security.allowlist", "security.max-connections", "metrics.port", "log.level"})
    CHECK(keys.count(key) == 1);
}

TEST_CASE("a setting refuses text it cannot take, saying why", "[unit][settings]") {
  broker::config cfg;
  const auto& queue = *broker::find_setting("tasks.max-queue");
  CHECK_THAT(queue.assign(cfg, "0"), Catch::Contains("outside 1..100000000"));
  CHECK_THAT(queue.assign(cfg, "many"), Catch::Contains("not a whole number"));
  CHECK_THAT(queue.assign(cfg, "-5"), Catch::Contains("not a whole number"));
  CHECK_THAT(queue.assign(cfg, "12x"), Catch::Contains("not a whole number"));
  CHECK(cfg.max_queue == broker::config{}.max_queue);
  CHECK(queue.assign(cfg, "77").empty());
  CHECK(cfg.max_queue == 77);
  const auto& fsync = *broker::find_setting("durability.journal-fsync");
  CHECK_THAT(fsync.assign(cfg, "sometimes"), Catch::Contains("always, batch or none"));
  CHECK(fsync.assign(cfg, "always").empty());
  CHECK(cfg.journal_fsync == broker::fsync_policy::always);
  CHECK_THAT(broker::find_setting("security.insecure")->assign(cfg, "yes"),
             Catch::Contains("true or false"));
}

TEST_CASE("a config file sets what it names, and leaves what flags gave", "[unit][settings]") {
  config_file f(R"(
router = "tcp://127.0.0.1:9001"
liveness = 5

[tasks]
max-queue = 42
step-timeout = 1500

[durability]
journal = "/var/lib/rlbus/journal"
journal-fsync = "always"

[security]
insecure = true
)");
  broker::config cfg;
  cfg.liveness = 7;  // as a flag would have set it
  const auto set = broker::load_config_file(f.path, cfg, {"liveness"});
  CHECK(set == std::set<std::string>{"router", "tasks.max-queue", "tasks.step-timeout",
                                     "durability.journal", "durability.journal-fsync",
                                     "security.insecure"});
  CHECK(cfg.router_endpoint == "tcp://127.0.0.1:9001");
  CHECK(cfg.liveness == 7);
  CHECK(cfg.max_queue == 42);
  CHECK(cfg.step_timeout_ms == 1500);
  CHECK(cfg.journal_path == "/var/lib/rlbus/journal");
  CHECK(cfg.journal_fsync == broker::fsync_policy::always);
  CHECK(cfg.insecure);
  CHECK(cfg.events_endpoint == broker::config{}.events_endpoint);  // not named: the default
}

TEST_CASE("a config file that cannot be used names the line, the key, the value and why",
          "[unit][settings]") {
  CHECK_THAT(refusal_of("[tasks]\nmax-queue = 0\n"),
             Catch::Contains("line 2: tasks.max-queue = 0: 0 is outside 1..100000000"));
  CHECK_THAT(refusal_of("[tasks]\nmax-queue = \"ten\"\n"),
             Catch::Contains("tasks.max-queue = 'ten': expected a whole number"));
  CHECK_THAT(refusal_of("[tasks]\nstep-timeout = -1\n"),
             Catch::Contains("tasks.step-timeout = -1: -1 is outside 1..86400000"));
  CHECK_THAT(refusal_of("[tasks]\nmax-qeue = 5\n"),
             Catch::Contains("tasks.max-qeue = 5: unknown key"));
  // A key in the wrong table is pointed at its own.
  CHECK_THAT(refusal_of("max-queue = 5\n"), Catch::Contains("did you mean tasks.max-queue?"));
  CHECK_THAT(refusal_of("[durability]\njournal-fsync = \"often\"\n"),
             Catch::Contains("'often' is not one of always, batch or none"));
  CHECK_THAT(refusal_of("[security]\ninsecure = \"yes\"\n"),
             Catch::Contains("security.insecure = 'yes': expected true or false"));
  CHECK_THAT(refusal_of("tasks = 3\n"), Catch::Contains("tasks = 3: expected a table"));
  CHECK_THAT(refusal_of("liveness = \n"), Catch::Contains("line 1"));  // not TOML at all
  broker::config cfg;
  CHECK_THROWS_WITH(broker::load_config_file("/nonexistent/broker.toml", cfg, {}),
                    Catch::Contains("/nonexistent/broker.toml"));
}

TEST_CASE("the printed configuration is a config file that gives it back", "[unit][settings]") {
  broker::config changed;
  changed.router_endpoint = "ipc:///tmp/rlbus \"quoted\" path";
  changed.max_queue = 123;
  changed.journal_fsync = broker::fsync_policy::none;
  changed.insecure = true;
  changed.stream_ring_bytes = std::size_t{1} << 33U;
  changed.log_level = "debug";
  config_file f(broker::to_toml(changed));
  broker::config read;
  const auto set = broker::load_config_file(f.path, read, {});
  CHECK(set.size() == broker::settings().size());  // it names every setting
  for (const auto& s : broker::settings()) {
    INFO(s.key());
    CHECK(s.text(read) == s.text(changed));
  }
}

TEST_CASE("the reference page lists every setting with its flag, variable and default",
          "[unit][settings]") {
  const auto page = broker::reference_markdown();
  const broker::config defaults;
  for (const auto& s : broker::settings()) {
    INFO(s.key());
    CHECK_THAT(page, Catch::Contains("`" + s.key() + "`"));
    CHECK_THAT(page, Catch::Contains("`" + s.flag() + "`"));
    CHECK_THAT(page, Catch::Contains("`" + s.env() + "`"));
    CHECK_THAT(page, Catch::Contains(std::string(s.help)));
  }
}

// SPEC §16.5 names the settings `set` may change at run time; the table's `live` settings are
// what the broker and rlbus-ctl go by. The two lists are the same.
TEST_CASE("the live settings are the ones SPEC 16.5 names", "[unit][settings]") {
  const char* dir = std::getenv("RLBUS_PROTOCOL_DIR");
  REQUIRE(dir != nullptr);
  std::ifstream in(std::string(dir) + "/SPEC.md");
  REQUIRE(in.good());
  std::string spec;  // its words, one space apart (the text wraps anywhere)
  for (std::string word; in >> word;) spec += word + " ";
  const std::string lead = "Keys that may change at run time: ";
  const auto at = spec.find(lead);
  REQUIRE(at != std::string::npos);
  const auto end = spec.find(". ", at);
  REQUIRE(end != std::string::npos);
  const auto list = spec.substr(at + lead.size(), end - at - lead.size());
  std::set<std::string> named;
  for (auto open = list.find('`'); open != std::string::npos; open = list.find('`', open + 1)) {
    const auto close = list.find('`', open + 1);
    REQUIRE(close != std::string::npos);
    named.insert(list.substr(open + 1, close - open - 1));
    open = close;
  }
  INFO("SPEC §16.5: " << list);
  const auto keys = broker::live_setting_keys();
  CHECK(named == std::set<std::string>(keys.begin(), keys.end()));
  CHECK(named.size() == keys.size());
  // Each of them is a setting the table knows by that key, and the page marks it.
  const auto page = broker::reference_markdown();
  for (const auto& k : keys) {
    const auto* s = broker::find_setting(k);
    REQUIRE(s != nullptr);
    CHECK(s->live);
    const auto row = page.find(fmt::format("| `{}` |", k));
    REQUIRE(row != std::string::npos);
    CHECK(page.substr(row, page.find('\n', row) - row).find("| live |") != std::string::npos);
  }
  CHECK(page.find("| live |") != std::string::npos);
}
