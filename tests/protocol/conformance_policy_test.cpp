// Conformance, SPEC §13: policies. A learner publishes versions, the broker holds the latest
// per policy id and hands it to every attempt of a task that names it. Run against the real
// broker over tcp with raw DEALERs; each test is named after the clause it checks and quotes
// it ("..." marks a cut).
#include <catch2/catch.hpp>

#include <string>

#include "protocol/conformance.hpp"

using namespace rlbus;
using namespace rlbus::test;
using namespace rlbus::test::spec;
using namespace std::string_literals;
using codec::error_code;

namespace {

codec::policy inline_version(std::string id, std::uint64_t version, std::string params) {
  return codec::policy{std::move(id), version, std::nullopt, std::move(params)};
}

codec::submit with_policy(codec::submit s, std::string policy_id) {
  s.policy_id = std::move(policy_id);
  return s;
}

/// Publishes and proves the broker has read it: the HEARTBEAT answer follows any ERROR.
void publish(raw_peer& learner, const codec::policy& p) {
  learner.send(p);
  expect_quiet(learner);
}

}  // namespace

// §13.2 "Rule of the message: exactly one of `ref` and `params` is present (otherwise 402)."
TEST_CASE_METHOD(fixture, "SPEC 13.2: a version is a reference or inline params, exactly one",
                 "[spec]") {
  raw_peer l(ctx, router);
  join(l, "l", role::learner);
  refused(l, codec::policy{"p", 1, "/ckpt/1"s, "\x01\x02"s}, error_code::bad_field);
  refused(l, codec::policy{"p", 1, std::nullopt, std::nullopt}, error_code::bad_field);
  refused(l, codec::policy{"p", 0, "/ckpt/0"s, std::nullopt}, error_code::bad_field);
  refused(l, codec::policy{"not an id", 1, "/ckpt/1"s, std::nullopt}, error_code::bad_field);
  // None was held: a first good version is accepted silently.
  publish(l, codec::policy{"p", 1, "/ckpt/1"s, std::nullopt});
}

// §13.3.1 "Only a learner session MAY send POLICY; from a collector or a coordinator it SHALL be
// refused with ERROR 404 ... A learner need not hold a task to publish."
TEST_CASE_METHOD(fixture, "SPEC 13.3.1: only learners publish, with or without a task", "[spec]") {
  raw_peer stranger(ctx, router), c(ctx, router), coord(ctx, router), l(ctx, router);
  refused(stranger, inline_version("p", 1, "x"), error_code::not_ready);
  join(c, "c", role::collector);
  join(coord, "coord", role::coordinator);
  join(l, "l", role::learner);
  refused(c, inline_version("p", 1, "x"), error_code::unknown_type);
  refused(coord, inline_version("p", 1, "x"), error_code::unknown_type);
  publish(l, inline_version("p", 1, "x"));  // no task held, nothing refused
  // What the collector and coordinator sent was not held: the learner's version 1 is.
  submit_ok(coord, with_policy(task_of("t"), "p"));
  const auto start = next_a<codec::task_start>(c);
  CHECK(start.policy_version == 1u);
  CHECK(start.policy_params == "x"s);
}

// §13.3.2 "An accepted POLICY has no answer ... a version is held before anything the learner
// sends after its POLICY is relayed"
TEST_CASE_METHOD(fixture, "SPEC 13.3.2: no answer, and held before the learner's next message",
                 "[spec]") {
  raw_peer coord(ctx, router), l(ctx, router), c(ctx, router);
  join(coord, "coord", role::coordinator);
  join(l, "l", role::learner);
  join(c, "c", role::collector);
  start_task(coord, l, task_of("learn", role::learner));
  // POLICY then LEARN_INFO back to back: the coordinator reacts to the info by submitting.
  l.send(inline_version("p", 4, "four"));
  l.send(codec::learn_info{"learn", 1, "b", codec::empty_map_blob});
  expect_quiet(l);  // nothing came back for the POLICY
  next_event(coord, "learn", "learn_info");
  submit_ok(coord, with_policy(task_of("collect"), "p"));
  CHECK(next_a<codec::task_start>(c).policy_version == 4u);
}

// §13.3.3 "A POLICY for an id with no held version, or with a `version` greater than the held
// one, SHALL replace the held version whole ... equal to or lower than the held one SHALL be
// refused with ERROR 426 STALE_POLICY and leave the held version unchanged. 426 is not a
// strike against the sender"
TEST_CASE("SPEC 13.3.3: the highest version wins; older ones get 426, no strike", "[spec]") {
  auto cfg = test_config();
  cfg.max_faults = 2;
  broker_with b(cfg);
  raw_peer coord(b.ctx, b.router), l1(b.ctx, b.router), l2(b.ctx, b.router), c(b.ctx, b.router);
  join(coord, "coord", role::coordinator);
  join(l1, "l1", role::learner);
  join(l2, "l2", role::learner);
  join(c, "c", role::collector);
  publish(l1, inline_version("p", 5, "five"));
  publish(l2, codec::policy{"p", 9, "/ckpt/9"s, std::nullopt});  // replaces params by a ref
  for (const std::uint64_t v : {9, 7, 1})
    refused(l1, inline_version("p", v, "old"), error_code::stale_policy);
  expect_quiet(l1);  // three refusals past max-faults 2: still in session
  CHECK(b.broker.get().snapshot().faults == 3);
  submit_ok(coord, with_policy(task_of("t"), "p"));
  const auto start = next_a<codec::task_start>(c);
  CHECK(start.policy_version == 9u);
  CHECK(start.policy_ref == "/ckpt/9"s);
  CHECK_FALSE(start.policy_params.has_value());
}

// §13.3.4 "A POLICY whose `params` are longer than policy-max-bytes ... SHALL be refused with
// ERROR 427 POLICY_LIMIT, as SHALL a POLICY for a new policy id when the broker already holds
// policy-max-ids policies ... 427 is a fault (§10)."
TEST_CASE("SPEC 13.3.4: params past policy-max-bytes and ids past policy-max-ids get 427",
          "[spec]") {
  auto cfg = test_config();
  cfg.policy_max_ids = 2;
  cfg.policy_max_bytes = 100;
  cfg.max_faults = 2;
  broker_with b(cfg);
  raw_peer l(b.ctx, b.router);
  join(l, "l", role::learner);
  publish(l, inline_version("a", 1, std::string(100, 'x')));  // exactly at the limit
  refused(l, inline_version("a", 2, std::string(101, 'x')), error_code::policy_limit);
  publish(l, codec::policy{"b", 1, std::string(1000, 'r'),
                           std::nullopt});  // refs are not bounded by it
  refused(l, inline_version("c", 1, "x"), error_code::policy_limit);
  CHECK(next_a<codec::disconnect>(l).code == code_of(error_code::too_many_faults));
}

// §13.3.5 "Held versions SHALL outlive the session that published them"
TEST_CASE_METHOD(fixture, "SPEC 13.3.5: a version outlives its publisher's session", "[spec]") {
  raw_events raw(ctx, broker.get().events_endpoint());
  REQUIRE(raw.next("broker.heartbeat", ""));  // the SUB is connected
  raw_peer coord(ctx, router), c(ctx, router);
  join(coord, "coord", role::coordinator);
  {
    raw_peer l(ctx, router);
    join(l, "l", role::learner);
    publish(l, inline_version("p", 3, "three"));
    l.send(codec::disconnect{200, "done"});
    REQUIRE(raw.next("worker.left", "l"));
  }
  join(c, "c", role::collector);
  submit_ok(coord, with_policy(task_of("t"), "p"));
  CHECK(next_a<codec::task_start>(c).policy_params == "three"s);
}

// §13.4.1 "that attempt's TASK_START SHALL carry `policy_id`, `policy_version` and the held
// version's `policy_ref` or `policy_params`, byte for byte as published. Every attempt gets the
// version held at its own start ... When no version is held the TASK_START carries no policy
// fields ... the broker SHALL NOT hold the task back waiting for one."
TEST_CASE_METHOD(fixture, "SPEC 13.4.1: every attempt starts with the version held at its start",
                 "[spec]") {
  raw_peer coord(ctx, router), l(ctx, router), c(ctx, router);
  join(coord, "coord", role::coordinator);
  join(l, "l", role::learner);
  join(c, "c", role::collector);
  // No version yet: started at once, without policy fields.
  auto s = with_policy(task_of("t"), "p");
  s.max_attempts = 3;
  const auto first = start_task(coord, c, s);
  CHECK_FALSE(first.policy_id.has_value());
  CHECK_FALSE(first.policy_version.has_value());
  // A version with bytes a re-encode would not keep (every byte value) arrives ...
  std::string params;
  for (int i = 0; i < 256; ++i) params.push_back(static_cast<char>(i));
  publish(l, inline_version("p", 1, params));
  // The running attempt is told (§13.4.6) ...
  CHECK(next_a<codec::policy_update>(c).policy_version == 1u);
  // ... and the next attempt gets it, byte for byte.
  c.send(codec::task_failed{"t", 1, "crash"});
  next_event(coord, "t", "requeued");
  const auto second = next_a<codec::task_start>(c);
  CHECK(second.attempt == 2);
  CHECK(second.policy_id == "p"s);
  CHECK(second.policy_version == 1u);
  CHECK(second.policy_params == params);
  next_event(coord, "t", "assigned");
  publish(l, inline_version("p", 2, "two"));
  CHECK(next_a<codec::policy_update>(c).policy_version == 2u);
  c.send(codec::task_failed{"t", 2, "crash"});
  next_event(coord, "t", "requeued");
  CHECK(next_a<codec::task_start>(c).policy_version == 2u);
  next_event(coord, "t", "assigned");
  // A task that names no policy gets none, though one is held.
  raw_peer c2(ctx, router);
  join(c2, "c2", role::collector);
  submit_ok(coord, task_of("plain"));
  CHECK_FALSE(next_a<codec::task_start>(c2).policy_id.has_value());
}

// §13.4.2 "The policy fields of TASK_START travel together: all absent, or `policy_id`,
// `policy_version` and exactly one of `policy_ref` and `policy_params`. A TASK_START that breaks
// this rule is malformed (402)"
TEST_CASE("SPEC 13.4.2: a TASK_START with a partial policy does not decode", "[spec]") {
  codec::task_start whole{"t",  1,  role::collector, codec::empty_map_blob,
                          "p"s, 3u, std::nullopt,    "x"s};
  const auto decode = [](const codec::task_start& m) {
    return codec::decode_body(static_cast<std::uint8_t>(codec::msg_type::task_start),
                              codec::encode_body(codec::message{m}), {});
  };
  REQUIRE(decode(whole));
  auto no_version = whole;
  no_version.policy_version.reset();
  auto no_id = whole;
  no_id.policy_id.reset();
  auto neither = whole;
  neither.policy_params.reset();
  auto both = whole;
  both.policy_ref = "/ckpt";
  for (const auto& bad : {no_version, no_id, neither, both}) {
    const auto r = decode(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == error_code::bad_field);
  }
}

// §13.4.3 "The `assigned` TASK_EVENT of an attempt whose TASK_START carried a policy SHALL have
// the body `{"policy_version": v}`"
TEST_CASE_METHOD(fixture, "SPEC 13.4.3: `assigned` names the version the attempt runs", "[spec]") {
  raw_peer coord(ctx, router), l(ctx, router), c(ctx, router);
  join(coord, "coord", role::coordinator);
  join(l, "l", role::learner);
  publish(l, inline_version("p", 42, "x"));
  submit_ok(coord, with_policy(task_of("t"), "p"));
  submit_ok(coord, task_of("plain"));
  join(c, "c", role::collector);
  CHECK(next_event(coord, "t", "assigned").body ==
        packed([](packer& pk) { pk.pack_map(1).pack("policy_version").pack(42); }));
  c.send(codec::started{"t", 1});
  next_event(coord, "t", "started");
  coord.send(codec::cancel{"t", "next"});
  CHECK(next_event(coord, "t", "cancelled").attempt == 1);
  CHECK(next_event(coord, "plain", "assigned").body == codec::empty_map_blob);
}

// §13.4.4 "The broker does not check it; it relays it in the `data` TASK_EVENT (§12.5.6) after
// `payload`."
TEST_CASE_METHOD(fixture, "SPEC 13.4.4: a data item's policy version reaches its coordinator",
                 "[spec]") {
  raw_peer coord(ctx, router), c(ctx, router);
  join(coord, "coord", role::coordinator);
  join(c, "c", role::collector);
  start_task(coord, c, task_of("t"));
  codec::data_ready d{"t", 1, "d1", "b", codec::empty_map_blob, "\x07"s};
  d.policy_version = 17;
  c.send(d);
  CHECK(next_event(coord, "t", "data").body == packed([](packer& pk) {
          pk.pack_map(5);
          pk.pack("data_id").pack("d1");
          pk.pack("buffer_id").pack("b");
          pk.pack("meta").pack_map(0);
          pk.pack("payload").pack_bin(1).pack_bin_body("\x07", 1);
          pk.pack("policy_version").pack(17);
        }));
  c.send(codec::data_ready{"t", 1, "d2", "b", codec::empty_map_blob, std::nullopt});
  const auto plain = next_event(coord, "t", "data").body;
  CHECK(plain.find("policy_version") == std::string::npos);
}

// §13.4.5 "After accepting a POLICY the broker SHALL publish an event (§7) on topic
// `policy.<policy_id>` with body policy_status ... Parameters are never published."
TEST_CASE_METHOD(fixture, "SPEC 13.4.5: each accepted version is announced on the PUB", "[spec]") {
  raw_events raw(ctx, broker.get().events_endpoint());
  REQUIRE(raw.next("broker.heartbeat", ""));  // the SUB is connected
  raw_peer l(ctx, router);
  join(l, "l", role::learner);
  const std::string secret = "params-never-published";
  publish(l, inline_version("p.main", 2, secret));
  refused(l, inline_version("p.main", 1, secret), error_code::stale_policy);
  publish(l, codec::policy{"p.main", 3, "/ckpt/3"s, std::nullopt});
  const auto first = raw.next("policy.p.main", "");
  REQUIRE(first);
  CHECK(std::get<codec::policy_status>(first->body) ==
        codec::policy_status{"p.main", 2, "l", secret.size()});
  const auto second = raw.next("policy.p.main", "");
  REQUIRE(second);
  CHECK(std::get<codec::policy_status>(second->body) == codec::policy_status{"p.main", 3, "l", 0});
  for (const auto& item : raw.seen()) CHECK(item.body.find(secret) == std::string::npos);
}

// §13.4.6 "After accepting a POLICY, the broker SHALL send POLICY_UPDATE with the version it now
// holds to the holder of every attempt in starting or running whose task's SUBMIT named that
// `policy_id` ... Queued and closing tasks get none"; POLICY_UPDATE is broker-only (§3.5.2).
TEST_CASE_METHOD(fixture, "SPEC 13.4.6: a new policy version reaches the attempts that run it",
                 "[spec]") {
  raw_peer coord(ctx, router), c1(ctx, router), c2(ctx, router), l(ctx, router);
  join(coord, "coord", role::coordinator);
  join(c1, "c1", role::collector);
  join(c2, "c2", role::collector);
  join(l, "l", role::learner);
  auto with = task_of("with");
  with.policy_id = "pi";
  start_task(coord, c1, with);
  start_task(coord, c2, task_of("without"));
  l.send(codec::policy{"pi", 2, std::nullopt, "\x00\x01\xff"s});
  const auto u = next_a<codec::policy_update>(c1);
  CHECK(u.task_id == "with");
  CHECK(u.attempt == 1);
  CHECK(u.policy_id == "pi");
  CHECK(u.policy_version == 2);
  CHECK_FALSE(u.policy_ref);
  CHECK(u.policy_params == "\x00\x01\xff"s);
  expect_quiet(c2);  // its task names no policy
  expect_quiet(coord);
  l.send(codec::policy{"pi", 3, "/ckpt/3"s, std::nullopt});
  const auto v = next_a<codec::policy_update>(c1);
  CHECK(v.policy_version == 3);
  CHECK(v.policy_ref == "/ckpt/3"s);
  // Closing: no update.
  coord.send(codec::finish{"with"});
  next_a<codec::task_close>(c1);
  l.send(codec::policy{"pi", 4, "/ckpt/4"s, std::nullopt});
  expect_quiet(l);
  expect_quiet(c1);
  // Broker-only.
  refused(c1, codec::policy_update{"with", 1, "pi", 5, "/x"s, std::nullopt},
          error_code::unknown_type);
}
