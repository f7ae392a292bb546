// Integration: CURVE as a user turns it on with the rlbus-broker binary (keygen, --curve-key,
// --allowlist, SIGHUP), the refusals to start that keep it from failing open, and both C++
// SDK roles connecting with keys.
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "rlbus/coordinator.hpp"
#include "rlbus/worker.hpp"
#include "support/child.hpp"
#include "support/support.hpp"
#include "util/curve_keys.hpp"

using namespace rlbus;
using namespace rlbus::test;

namespace {

struct scratch_dir {
  std::string dir;
  scratch_dir() {
    std::string tmpl = "/tmp/rlbus-sec-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  ~scratch_dir() { std::filesystem::remove_all(dir); }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  [[nodiscard]] std::string path(const std::string& name) const { return dir + "/" + name; }
  void keygen(const std::string& stem) const {
    const auto [status, out] = run_to_end(broker_bin(), {"keygen", path(stem)});
    INFO(out);
    REQUIRE(status == 0);
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
  }
  [[nodiscard]] std::string read(const std::string& name) const {
    std::ifstream f(path(name));
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
};

// "rlbus-broker listening router=... events=..."
std::string listening_value(child& broker, const std::string& key) {
  const auto line = broker.wait_for_line("rlbus-broker listening ", 10s);
  INFO(broker.output());
  REQUIRE(line);
  const auto at = line->find(" " + key + "=");
  REQUIRE(at != std::string::npos);
  const auto from = at + key.size() + 2;
  return line->substr(from, line->find_first_of(" \r\n", from) - from);
}

}  // namespace

TEST_CASE("keygen writes a key pair, the secret one private, and never overwrites",
          "[binary][security]") {
  scratch_dir s;
  s.keygen("peer");
  struct stat st {};
  REQUIRE(::stat(s.path("peer.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  const auto pair = util::read_curve_file(s.path("peer.key"));
  CHECK(util::curve_public_of(pair.secret_key) == pair.public_key);
  CHECK(util::read_curve_file(s.path("peer.pub")).public_key == pair.public_key);
  CHECK(util::read_curve_file(s.path("peer.pub")).secret_key.empty());

  const auto [status, out] = run_to_end(broker_bin(), {"keygen", s.path("peer")});
  CHECK(status == 1);
  CHECK_THAT(out, Catch::Contains("exists"));
  CHECK(util::read_curve_file(s.path("peer.key")).secret_key == pair.secret_key);
}

TEST_CASE("the broker will not start with CURVE half set up", "[binary][security]") {
  scratch_dir s;
  s.keygen("broker");
  s.keygen("peer");
  s.write("allow.toml", "[[key]]\npublic-key-file = \"peer.pub\"\nroles = [\"collector\"]\n");
  const std::vector<std::string> local{"--router", "tcp://127.0.0.1:0", "--events",
                                       "tcp://127.0.0.1:0"};
  const auto run = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), local.begin(), local.end());
    return run_to_end(broker_bin(), extra);
  };
  auto [status, out] = run({"--curve-key", s.path("broker.key")});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("--curve-key needs --allowlist"));

  std::tie(status, out) = run({"--allowlist", s.path("allow.toml")});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("--allowlist needs --curve-key"));

  std::tie(status, out) =
      run({"--curve-key", s.path("missing.key"), "--allowlist", s.path("allow.toml")});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("missing.key"));

  std::tie(status, out) =
      run({"--curve-key", s.path("broker.pub"), "--allowlist", s.path("allow.toml")});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("no secret-key"));

  ::chmod(s.path("broker.key").c_str(), 0644);
  std::tie(status, out) =
      run({"--curve-key", s.path("broker.key"), "--allowlist", s.path("allow.toml")});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("chmod 600"));
  ::chmod(s.path("broker.key").c_str(), 0600);

  s.write("bad.toml", "[[key]]\npublic-key = \"short\"\nroles = [\"collector\"]\n");
  std::tie(status, out) =
      run({"--curve-key", s.path("broker.key"), "--allowlist", s.path("bad.toml")});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("key #1"));
  CHECK_THAT(out, Catch::Contains("40 Z85 characters"));

  s.write("role.toml", "[[key]]\npublic-key-file = \"peer.pub\"\nroles = [\"admin\"]\n");
  std::tie(status, out) =
      run({"--curve-key", s.path("broker.key"), "--allowlist", s.path("role.toml")});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("unknown role 'admin'"));

  // Files that say whom to trust, writable by others: anyone local could list a key.
  for (const auto* file : {"allow.toml", "peer.pub"}) {
    INFO(file);
    ::chmod(s.path(file).c_str(), 0666);
    std::tie(status, out) =
        run({"--curve-key", s.path("broker.key"), "--allowlist", s.path("allow.toml")});
    CHECK(status == 2);
    CHECK_THAT(out, Catch::Contains(s.path(file)) && Catch::Contains("chmod go-w"));
    ::chmod(s.path(file).c_str(), 0644);
  }
}

TEST_CASE("plain mode binds other machines' addresses only with --insecure, and says so",
          "[binary][security]") {
  auto [status, out] =
      run_to_end(broker_bin(), {"--router", "tcp://0.0.0.0:0", "--events", "tcp://127.0.0.1:0"});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("--insecure"));
  // The metrics endpoint too: it is a bind like the others.
  std::tie(status, out) =
      run_to_end(broker_bin(), {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                                "--metrics-port", "65001", "--metrics-address", "0.0.0.0"});
  CHECK(status == 2);
  CHECK_THAT(out, Catch::Contains("--metrics-address") && Catch::Contains("--insecure"));
  child broker(broker_bin(),
               {"--router", "tcp://0.0.0.0:0", "--events", "tcp://127.0.0.1:0", "--insecure"});
  REQUIRE(broker.wait_for_line("anyone who can reach the ports", 10s));
  broker.signal(SIGTERM);
  const auto code = broker.wait(10s);
  REQUIRE(code);
  CHECK(*code == 0);
}

TEST_CASE("CURVE end to end: both SDKs with keys run a task; a stranger is told why not",
          "[binary][security]") {
  scratch_dir s;
  for (const auto* stem : {"broker", "coord", "coll", "stranger"}) s.keygen(stem);
  s.write("allow.toml",
          "[[key]]\nname = \"coord\"\npublic-key-file = \"coord.pub\"\nroles = "
          "[\"coordinator\"]\n"
          "[[key]]\nname = \"coll\"\npublic-key-file = \"coll.pub\"\nroles = [\"collector\"]\n"
          "ids = [\"coll-*\"]\n");
  child broker(broker_bin(), {"--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                              "--curve-key", s.path("broker.key"), "--allowlist",
                              s.path("allow.toml"), "--status-interval", "600000"});
  const auto router = listening_value(broker, "router");
  const auto broker_pub = s.path("broker.pub");

  worker_options wo;
  wo.endpoint = router;
  wo.id = "coll-1";
  wo.heartbeat = 200ms;
  wo.reconnect_max = 300ms;  // the interval of its retries after a revocation
  wo.curve = curve_keys_from_files(s.path("coll.key"), broker_pub);
  task_handlers h;
  h.run = [](task_handle& t) {
    REQUIRE(t.emit_data("d0", "buf", flag_map("done", false), std::string("payload")));
    REQUIRE(t.emit_info(flag_map("collector_done", true)));
    REQUIRE(wait_until([&] { return t.stop_requested(); }));
  };
  worker w(wo, h);
  coordinator_options co;
  co.endpoint = router;
  co.id = "crd";
  co.curve = curve_keys_from_files(s.path("coord.key"), broker_pub);
  std::atomic<int> data{0};
  std::atomic<bool> finished{false};
  coordinator_callbacks cb;
  cb.deal_with_collector_send_data = [&](const std::string&, const std::string&, const std::string&,
                                         const std::string&) { ++data; };
  cb.deal_with_collector_finish_task = [&](const std::string&, const std::string&) {
    finished = true;
  };
  coordinator c(co, cb);
  REQUIRE(w.wait_for(connection_state::ready, 5s));
  REQUIRE(c.wait_for(connection_state::ready, 5s));
  task_spec t;
  t.task_id = "t1";
  t.kind = role::collector;
  const auto submitted = c.submit(t);
  REQUIRE(submitted);
  REQUIRE(submitted->accepted);
  REQUIRE(wait_until([&] { return finished.load(); }));
  CHECK(data == 1);

  // A key the allowlist does not list: the worker is told why no WELCOME comes.
  worker_options so = wo;
  so.id = "coll-2";
  so.curve = curve_keys_from_files(s.path("stranger.key"), broker_pub);
  worker stranger(so);
  REQUIRE(wait_until(
      [&] { return stranger.last_error().find("not in its allowlist") != std::string::npos; },
      10s));
  CHECK(stranger.state() == connection_state::connecting);

  // The broker's key wrong: the handshake itself fails.
  so.id = "coll-3";
  so.curve = curve_keys_from_files(s.path("coll.key"), s.path("stranger.pub"));
  worker lost(so);
  REQUIRE(wait_until(
      [&] { return lost.last_error().find("broker's public key") != std::string::npos; }, 10s));

  // An allowlist emptied for a moment (an editor's rewrite) is refused: nobody is cut off.
  const auto full_list = s.read("allow.toml");
  s.write("allow.toml", "");
  broker.signal(SIGHUP);
  REQUIRE(broker.wait_for_line("lists no key", 10s));
  // Nor is one that others may write: they could have listed a key of their own.
  s.write("allow.toml", full_list + "\n");
  ::chmod(s.path("allow.toml").c_str(), 0666);
  broker.signal(SIGHUP);
  REQUIRE(broker.wait_for_line("chmod go-w", 10s));
  ::chmod(s.path("allow.toml").c_str(), 0644);
  CHECK(w.state() == connection_state::ready);
  CHECK(c.state() == connection_state::ready);

  // SIGHUP reads the allowlist again: the collector's key gone, its session ends (431). The
  // worker says so and keeps trying at its longest interval: when the operator puts the key
  // back, it is served again by itself.
  s.write("allow.toml",
          "[[key]]\nname = \"coord\"\npublic-key-file = \"coord.pub\"\nroles = "
          "[\"coordinator\"]\n");
  broker.signal(SIGHUP);
  REQUIRE(broker.wait_for_line("reloaded: 1 keys", 10s));
  REQUIRE(wait_until([&] { return w.last_error().find("431") != std::string::npos; }, 10s));
  CHECK(w.state() != connection_state::ready);
  CHECK(w.state() != connection_state::refused);
  s.write("allow.toml", full_list);
  broker.signal(SIGHUP);
  REQUIRE(broker.wait_for_line("reloaded: 2 keys", 10s));
  REQUIRE(w.wait_for(connection_state::ready, 10s));
  broker.signal(SIGTERM);
  const auto code = broker.wait(10s);
  REQUIRE(code);
  CHECK(*code == 0);
}
