// Conformance, SPEC §15: with CURVE on, only keys in the allowlist get in, each only in the
// roles and ids it is listed with; sessions are bound to their key; a revoked key is cut off;
// subscribers authenticate too; and the resource limits refuse what is past them, each with
// its code and counter. Run against the real broker over tcp with raw DEALERs and SUBs; every
// wait has a deadline.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include "protocol/conformance.hpp"
#include "util/curve_keys.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using codec::error_code;

namespace {

// A folder with the broker's key pair, peers' key pairs and an allowlist, gone with the test.
struct keyring {
  std::string dir;
  util::curve_pair broker = util::make_curve_pair();

  keyring() {
    std::string tmpl = "/tmp/rlbus-keys-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
    util::write_curve_pair(dir + "/broker", broker);
  }
  ~keyring() { std::filesystem::remove_all(dir); }
  keyring(const keyring&) = delete;
  keyring& operator=(const keyring&) = delete;

  [[nodiscard]] std::string allowlist() const { return dir + "/allow.toml"; }
  // Written to a new file renamed over the old one, as an editor or a config tool would.
  void write_allowlist(const std::string& text) const {
    const auto tmp = allowlist() + ".new";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, allowlist());
  }
  [[nodiscard]] rlbus::curve_keys client(const util::curve_pair& p) const {
    return {p.public_key, p.secret_key, broker.public_key};
  }
  [[nodiscard]] broker::config config(const std::string& allow_text) const {
    write_allowlist(allow_text);
    auto cfg = test_config();
    cfg.curve_key_path = dir + "/broker.key";
    cfg.allowlist_path = allowlist();
    return cfg;
  }
};

std::string entry(const util::curve_pair& p, const std::string& name, const std::string& roles,
                  const std::string& ids = "") {
  return "[[key]]\nname = \"" + name + "\"\npublic-key = \"" + p.public_key + "\"\nroles = [" +
         roles + "]\n" + (ids.empty() ? "" : "ids = [" + ids + "]\n");
}

// A SUB with keys (or none) on the broker's event socket.
zmq::socket_t subscriber(zmq::context_t& ctx, const std::string& endpoint,
                         const rlbus::curve_keys* keys) {
  zmq::socket_t s(ctx, zmq::socket_type::sub);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::subscribe, "");
  if (keys != nullptr) use_curve(s, *keys);
  s.connect(endpoint);
  return s;
}

// A plain TCP connection to a tcp:// endpoint, that will never say anything; its reads time
// out after 5 s.
int tcp_connect(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool hears_an_event(zmq::socket_t& sub, std::chrono::milliseconds within) {
  return !recv_frames(sub, within).empty();
}

}  // namespace

// §15.2 "A connection whose key is not in the allowlist is refused in the handshake (ZAP
// status 400): it never reaches the broker's protocol, and learns nothing, not even an ERROR"
TEST_CASE("SPEC 15.2: a key not in the allowlist, or no key at all, gets nothing", "[spec]") {
  keyring k;
  const auto listed = util::make_curve_pair(), stranger = util::make_curve_pair();
  broker_with b(k.config(entry(listed, "listed", "\"collector\", \"subscriber\"")));
  const auto stranger_keys = k.client(stranger);

  raw_peer out(b.ctx, b.router, &stranger_keys), plain(b.ctx, b.router);
  out.send(codec::hello{role::collector, "w-out", 30'000, {}, std::nullopt});
  plain.send(codec::hello{role::collector, "w-plain", 30'000, {}, std::nullopt});
  auto sub = subscriber(b.ctx, b.broker.get().events_endpoint(), &stranger_keys);
  REQUIRE(wait_until([&] { return b.broker.get().snapshot().refused_key >= 2; }));
  CHECK(out.recv(300ms) == std::nullopt);
  CHECK(plain.recv(300ms) == std::nullopt);
  CHECK_FALSE(hears_an_event(sub, 300ms));  // broker.heartbeat goes out every 20 ms
  CHECK(b.broker.get().snapshot().peers == 0);

  const auto listed_keys = k.client(listed);
  raw_peer in(b.ctx, b.router, &listed_keys);
  join(in, "w-in", role::collector);
  auto listed_sub = subscriber(b.ctx, b.broker.get().events_endpoint(), &listed_keys);
  CHECK(hears_an_event(listed_sub, 3000ms));
}

// §15.3 "A HELLO for a role the key is not listed with, or an id none of its patterns match,
// SHALL be refused with ERROR 431 (UNAUTHORIZED, ref HELLO)"
TEST_CASE("SPEC 15.3: a key says HELLO only in its roles and with its ids", "[spec]") {
  keyring k;
  const auto node = util::make_curve_pair();
  broker_with b(k.config(entry(node, "node7", "\"collector\", \"learner\"", "\"node7-*\"")));
  const auto keys = k.client(node);
  raw_peer p(b.ctx, b.router, &keys);

  p.send(codec::hello{role::coordinator, "node7-c", 30'000, {}, std::nullopt});
  auto e = expect_error(p, error_code::unauthorized);
  CHECK(e.ref_type == ref(type_hello));
  CHECK(e.reason.find("may not be a coordinator") != std::string::npos);

  p.send(codec::hello{role::collector, "node8-a", 30'000, {}, std::nullopt});
  e = expect_error(p, error_code::unauthorized);
  CHECK(e.reason.find("node7-*") != std::string::npos);

  join(p, "node7-a", role::collector);
  raw_peer q(b.ctx, b.router, &keys);
  join(q, "node7-b", role::learner);
  CHECK(b.broker.get().snapshot().refused_unauthorized == 2);
}

// §15.3 "A session is bound to the key that began it: a HELLO naming its id from a connection of
// another key is refused with 431, whatever session token it carries; so is the adoption of a
// vanished coordinator's tasks (§12.5.8) by another key"
TEST_CASE("SPEC 15.3: no id is taken over by another key, not even with the session token",
          "[spec]") {
  keyring k;
  const auto alice = util::make_curve_pair(), mallory = util::make_curve_pair();
  auto cfg = k.config(entry(alice, "alice", "\"collector\", \"coordinator\"") +
                      entry(mallory, "mallory", "\"collector\", \"coordinator\""));
  cfg.coordinator_grace_ms = 60'000;
  broker_with b(cfg);
  const auto ak = k.client(alice), mk = k.client(mallory);

  raw_peer a(b.ctx, b.router, &ak), m(b.ctx, b.router, &mk);
  const auto w = join(a, "w-1", role::collector);
  m.send(codec::hello{role::collector, "w-1", 30'000, {}, w.session});  // a stolen token
  CHECK(expect_error(m, error_code::unauthorized).reason.find("another key") != std::string::npos);
  expect_quiet(a);  // alice's session goes on

  // A coordinator of alice's vanishes, its task kept for adoption: mallory may not adopt it.
  raw_peer crd(b.ctx, b.router, &ak);
  join(crd, "crd", role::coordinator);
  submit_ok(crd, task_of("t1"));  // alice's w-1 takes it
  (void)next_a<codec::task_start>(a);
  next_event(crd, "t1", "assigned");
  crd.send(codec::hello{role::coordinator, "crd", 20, {}, std::nullopt});
  REQUIRE(next_a<codec::welcome>(crd).resumed);
  REQUIRE(next_a<codec::disconnect>(crd, 5000ms).code == code_of(error_code::expired));
  REQUIRE(wait_until([&] { return b.broker.get().snapshot().coordinators_orphaned == 1; }));

  raw_peer m2(b.ctx, b.router, &mk);
  m2.send(codec::hello{role::coordinator, "crd", 30'000, {}, std::nullopt});
  CHECK(expect_error(m2, error_code::unauthorized).reason.find("another key") != std::string::npos);
  raw_peer a2(b.ctx, b.router, &ak);
  a2.send(codec::hello{role::coordinator, "crd", 30'000, {}, std::nullopt});
  CHECK(next_a<codec::welcome>(a2).stream_acked.has_value());  // alice's own: adopted
}

// §15.4 "When the allowlist is read again (SIGHUP, or a change of its file), every session whose
// key is no longer listed for its role and id ends with DISCONNECT 431, and the key's new
// connections are refused in the handshake"
namespace {
enum class reread { file_change, sighup };

void check_revocation(reread how) {
  keyring k;
  const auto stays = util::make_curve_pair(), goes = util::make_curve_pair();
  auto cfg =
      k.config(entry(stays, "stays", "\"collector\"") + entry(goes, "goes", "\"collector\""));
  // Without a status tick during the test the broker never looks at the file by itself.
  if (how == reread::sighup) cfg.status_interval_ms = 600'000;
  broker_with b(cfg);
  const auto sk = k.client(stays), gk = k.client(goes);
  raw_peer s(b.ctx, b.router, &sk), g(b.ctx, b.router, &gk);
  join(s, "w-stays", role::collector);
  join(g, "w-goes", role::collector);

  k.write_allowlist(entry(stays, "stays", "\"collector\""));
  if (how == reread::sighup) b.broker.get().request_reload();
  const auto d = next_a<codec::disconnect>(g, 5000ms);
  CHECK(d.code == code_of(error_code::unauthorized));
  // The old connection may still speak (a ROUTER cannot drop it), but no HELLO gets through.
  g.send(codec::hello{role::collector, "w-goes", 30'000, {}, std::nullopt});
  expect_error(g, error_code::unauthorized);
  raw_peer again(b.ctx, b.router, &gk);
  again.send(codec::hello{role::collector, "w-goes", 30'000, {}, std::nullopt});
  CHECK(again.recv(500ms) == std::nullopt);
  expect_quiet(s);
  REQUIRE(wait_until([&] { return b.broker.get().snapshot().sessions_revoked == 1; }));
  CHECK(b.broker.get().snapshot().allowlist_reloads == 1);
}
}  // namespace

TEST_CASE("SPEC 15.4: a revoked key is cut off when the allowlist file changes", "[spec]") {
  check_revocation(reread::file_change);
}

TEST_CASE("SPEC 15.4: a revoked key is cut off on SIGHUP (request_reload)", "[spec]") {
  check_revocation(reread::sighup);
}

// §15.4 "A reloaded allowlist that cannot be read or is malformed is refused as a whole: the one
// in force stays, and the refusal is counted"
TEST_CASE("SPEC 15.4: a broken allowlist on reload leaves the one in force", "[spec]") {
  keyring k;
  const auto p = util::make_curve_pair();
  broker_with b(k.config(entry(p, "p", "\"collector\"")));
  const auto keys = k.client(p);
  raw_peer w(b.ctx, b.router, &keys);
  join(w, "w", role::collector);
  k.write_allowlist("[[key]]\nname = \"p\"\nroles = [\"collector\"]\n");  // no key: invalid
  REQUIRE(wait_until([&] { return b.broker.get().snapshot().allowlist_errors == 1; }));
  expect_quiet(w);
  raw_peer w2(b.ctx, b.router, &keys);
  join(w2, "w2", role::collector);
}

// §15.6 "Subscribers authenticate too: the event socket admits only keys listed with the role
// subscriber ... When a subscriber's key is revoked the broker opens its event socket afresh:
// every subscriber connects again and passes the handshake again"
TEST_CASE("SPEC 15.6: only subscriber keys hear events, and a revoked one stops hearing them",
          "[spec]") {
  keyring k;
  const auto mon = util::make_curve_pair(), other = util::make_curve_pair(),
             worker = util::make_curve_pair();
  const auto subs = entry(mon, "mon", "\"subscriber\"") + entry(worker, "w", "\"collector\"");
  broker_with b(k.config(subs + entry(other, "other", "\"subscriber\"")));
  const auto mk = k.client(mon), ok = k.client(other), wk = k.client(worker);
  const auto events = b.broker.get().events_endpoint();

  auto not_sub = subscriber(b.ctx, events, &wk);  // a listed key, but not a subscriber
  REQUIRE(wait_until([&] { return b.broker.get().snapshot().refused_subscriber >= 1; }));
  CHECK_FALSE(hears_an_event(not_sub, 300ms));

  auto m = subscriber(b.ctx, events, &mk), o = subscriber(b.ctx, events, &ok);
  REQUIRE(hears_an_event(m, 3000ms));
  REQUIRE(hears_an_event(o, 3000ms));
  k.write_allowlist(subs);  // "other" revoked
  // "other" hears nothing once the socket is new; "mon" comes back by itself.
  REQUIRE(wait_until([&] { return b.broker.get().snapshot().allowlist_reloads == 1; }));
  while (hears_an_event(o, 300ms)) {
  }
  CHECK_FALSE(hears_an_event(o, 500ms));
  while (recv_frames(m, 10ms).size() == 3) {
  }
  CHECK(hears_an_event(m, 3000ms));
}

// §15.5 "Most sessions of each role at once ... a HELLO past it is refused with ERROR 503 (BUSY,
// ref HELLO) ... a SUBMIT that would give its coordinator more than max-tasks-per-coordinator
// live tasks is answered with SUBMITTED, accepted = false, code 416"
TEST_CASE("SPEC 15.5: session limits per role and the task limit per coordinator", "[spec]") {
  auto cfg = test_config();
  cfg.max_coordinators = 1;
  cfg.max_learners = 1;
  cfg.max_tasks_per_coordinator = 2;
  broker_with b(cfg);
  raw_peer c1(b.ctx, b.router), c2(b.ctx, b.router), l1(b.ctx, b.router), l2(b.ctx, b.router),
      w(b.ctx, b.router);
  join(c1, "c1", role::coordinator);
  c2.send(codec::hello{role::coordinator, "c2", 30'000, {}, std::nullopt});
  CHECK(expect_error(c2, error_code::busy).reason.find("coordinator") != std::string::npos);
  join(l1, "l1", role::learner);
  l2.send(codec::hello{role::learner, "l2", 30'000, {}, std::nullopt});
  expect_error(l2, error_code::busy);
  join(w, "w", role::collector);  // other roles are not affected

  submit_ok(c1, task_of("t1", role::collector, {{"gpu", 1}}));  // nobody fits: both stay queued
  submit_ok(c1, task_of("t2", role::collector, {{"gpu", 1}}));
  c1.send(task_of("t3"));
  const auto refused = next_a<codec::submitted>(c1);
  CHECK_FALSE(refused.accepted);
  CHECK(refused.code == code_of(error_code::too_many_tasks));
  c1.send(codec::cancel{"t1"});
  next_event(c1, "t1", "cancelled");
  submit_ok(c1, task_of("t3"));  // the limit counts live tasks: one ended, room for one
  const auto st = b.broker.get().snapshot();
  CHECK(st.refused_role_limit == 2);
  CHECK(st.refused_task_limit == 1);
}

// §15.5 "Connections past max-connections-per-address from one source address, or past
// max-connections in all, are refused in the handshake (ZAP status 400) ... also in plain mode"
TEST_CASE("SPEC 15.5: connections past the per-address limit are refused at the door", "[spec]") {
  auto cfg = test_config();
  cfg.max_connections_per_address = 3;
  broker_with b(cfg);
  std::vector<std::unique_ptr<raw_peer>> peers;
  for (int i = 0; i < 3; ++i) {
    peers.push_back(std::make_unique<raw_peer>(b.ctx, b.router));
    join(*peers.back(), "w" + std::to_string(i), role::collector);
  }
  {
    // A connection that never speaks is cut as soon as it is accepted, before its handshake.
    const int fd = tcp_connect(b.router);
    REQUIRE(fd >= 0);
    // libzmq may have sent the start of its greeting; then the connection ends (EOF or a
    // reset), long before the handshake timeout (10 s) or the read timeout (5 s).
    std::array<char, 64> buf{};
    ssize_t got = 0, n = 0;
    while ((n = ::recv(fd, buf.data(), buf.size(), 0)) > 0) got += n;
    CHECK(got < 64);
    CHECK((n == 0 || errno == ECONNRESET));
    ::close(fd);
    REQUIRE(wait_until([&] { return b.broker.get().snapshot().refused_address >= 1; }));
    raw_peer extra(b.ctx, b.router);
    extra.send(codec::hello{role::collector, "w-extra", 30'000, {}, std::nullopt});
    REQUIRE(wait_until([&] { return b.broker.get().snapshot().refused_address >= 2; }));
    CHECK(extra.recv(300ms) == std::nullopt);
    CHECK(b.broker.get().snapshot().connections >= 3);
  }
  peers.back()->send(codec::disconnect{200, "making room"});
  peers.pop_back();  // its connection closes
  REQUIRE(wait_until([&] { return b.broker.get().snapshot().connections <= 2; }));
  raw_peer later(b.ctx, b.router);
  join(later, "w-later", role::collector);
}

// §15.3 "A coordinator holds, sees and steers only its own tasks in any mode (§12.4.1, §12.8):
// no TASK_EVENT, SUBMITTED or STREAM_GAP about another coordinator's task is ever sent to it"
TEST_CASE("SPEC 15.3: a coordinator is told nothing about another's tasks, and cannot steer them",
          "[spec]") {
  broker_with b(test_config());
  raw_peer a(b.ctx, b.router), other(b.ctx, b.router), w(b.ctx, b.router);
  join(a, "crd-a", role::coordinator);
  join(other, "crd-b", role::coordinator);
  join(w, "w", role::collector);
  start_task(a, w, task_of("a1"));
  w.send(codec::data_ready{"a1", 1, "d0", "buf", codec::empty_map_blob, std::nullopt});
  next_event(a, "a1", "data");
  submit_ok(a, task_of("a2", role::learner));  // queued: no learner

  // Steering refused exactly as for a task that does not exist.
  for (const codec::message& m :
       {codec::message{codec::finish{"a1"}}, codec::message{codec::cancel{"a2"}},
        codec::message{codec::data_reply{"a1", 1, codec::nil_blob, std::nullopt}}}) {
    other.send(m);
    CHECK(expect_error(other, error_code::unknown_task).reason.find("of yours") !=
          std::string::npos);
  }
  // A SUBMIT of the same id is a duplicate (task ids are one namespace), which says only that.
  other.send(task_of("a1"));
  CHECK(next_a<codec::submitted>(other).code == code_of(error_code::duplicate_task));
  // Its own stream, replayed from the start, holds nothing: nothing of a1 or a2 was made for it.
  other.send(codec::replay{1});
  expect_quiet(other);
  CHECK(b.broker.get().snapshot().tasks_running == 1);  // a1 goes on, untouched
  a.send(codec::finish{"a1"});
  REQUIRE(w.recv_a<codec::task_close>());
}

// §16.2 "In CURVE mode an OPS SHALL be refused with ERROR 431 (UNAUTHORIZED, ref_type = OPS)
// unless the connection's key is in the allowlist with the role operator ... checked at each
// OPS, so a reload that drops the role takes effect at once"
TEST_CASE("SPEC 16.2: under CURVE only an operator's key may send OPS", "[spec]") {
  keyring k;
  const auto admin = util::make_curve_pair(), worker = util::make_curve_pair();
  const auto both = [&](const std::string& admin_roles) {
    return entry(admin, "admin", admin_roles) + entry(worker, "worker", "\"collector\"");
  };
  broker_with b(k.config(both("\"operator\"")));
  const auto admin_keys = k.client(admin), worker_keys = k.client(worker);
  raw_peer ctl(b.ctx, b.router, &admin_keys), w(b.ctx, b.router, &worker_keys);
  codec::ops status;
  status.request_id = 9;
  status.verb = "status";
  ctl.send(status);
  CHECK(next_a<codec::ops_reply>(ctl).request_id == 9);
  // A worker's key may not, with or without a session.
  w.send(status);
  CHECK_THAT(next_error(w, error_code::unauthorized, ref(0x50)).reason,
             Catch::Contains("not an operator"));
  join(w, "w0", role::collector);
  w.send(status);
  next_error(w, error_code::unauthorized, ref(0x50));
  // The operator role taken away: refused from the next OPS on.
  const auto reloads = b.broker.get().snapshot().allowlist_reloads;
  k.write_allowlist(both("\"subscriber\""));
  b.broker.get().request_reload();
  REQUIRE(wait_until([&] { return b.broker.get().snapshot().allowlist_reloads > reloads; }));
  ctl.send(status);
  next_error(ctl, error_code::unauthorized, ref(0x50));
}
