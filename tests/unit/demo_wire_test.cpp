// The demo's messages on the bus: every one survives its msgpack form exactly, and bytes from a
// peer that are not the message are refused as values (never a throw or a crash).
#include <catch2/catch.hpp>

#include <msgpack.hpp>
#include <string>

#include "demo/wire.hpp"

// In the demo's own namespace, so its names win in a unity build where another test brings
// rlbus's into view (the SDK's rlbus::policy beside the demo's policy).
namespace rlbus::demo {

TEST_CASE("demo messages survive their msgpack form", "[unit][demo]") {
  const collector_task c{42, 0.1F, 500, 8, 4, 10};
  CHECK(decode_collector_task(encode(c)) == c);

  const learner_task l{1, 32, 8, 0.1F, 0.03F, 500, 100};
  CHECK(decode_learner_task(encode(l)) == l);

  const direction_result d{"collector-2", {3, 5, 1, 212.0, 212}, {3, 5, -1, 17.0, 17}};
  CHECK(decode_direction_result(encode(d)) == d);

  const result_batch b{3, {{3, 0, 1, 9.0, 9}, {3, 0, -1, 500.0, 500}, {3, 1, 1, 0.5, 1}}};
  CHECK(decode_result_batch(encode(b)) == b);
  CHECK(decode_result_batch(encode(result_batch{9, {}})) == result_batch{9, {}});

  learn_report r;
  r.iteration = 4;
  r.policy_version = 4;
  r.batch_mean = 123.25;
  r.batch_max = 500;
  r.eval_mean = 476.5;
  r.eval_min = 301;
  r.eval_max = 500;
  r.eval_episodes = 100;
  r.episodes = 256;
  r.eval_total = 500;
  r.learner_done = true;
  CHECK(decode_learn_report(encode(r)) == r);
}

TEST_CASE("a direction result is found inside a coordinator's data event", "[unit][demo]") {
  const direction_result d{"collector-1", {0, 2, 1, 30.0, 30}, {0, 2, -1, 12.0, 12}};
  const auto meta = encode(d);
  // {data_id, buffer_id, meta}: the shape deal_with_collector_send_data receives, with the
  // meta embedded as the collector sent it.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(3);
  pk.pack("data_id");
  pk.pack("t/1/d2");
  pk.pack("buffer_id");
  pk.pack("cartpole-results");
  pk.pack("meta");
  buf.write(meta.data(), meta.size());
  CHECK(direction_result_from_data(std::string(buf.data(), buf.size())) == d);
  CHECK_FALSE(direction_result_from_data(meta));  // no "meta" in it
  CHECK_FALSE(policy_version_from_data(std::string(buf.data(), buf.size())));

  // The broker adds the version the collector ran after the payload (SPEC §13.4.4).
  msgpack::sbuffer tagged;
  msgpack::packer<msgpack::sbuffer> tp(tagged);
  tp.pack_map(4);
  tp.pack("data_id");
  tp.pack("t/1/d3");
  tp.pack("buffer_id");
  tp.pack("cartpole-results");
  tp.pack("meta");
  tagged.write(meta.data(), meta.size());
  tp.pack("policy_version");
  tp.pack(6);
  const std::string event(tagged.data(), tagged.size());
  CHECK(direction_result_from_data(event) == d);
  CHECK(policy_version_from_data(event) == 6u);
  CHECK_FALSE(policy_version_from_data("\xc1"));  // not msgpack at all
}

TEST_CASE("bytes that are not a demo message are refused as values", "[unit][demo]") {
  const auto task = encode(collector_task{1, 0.1F, 500, 0, 4, 0});
  CHECK_FALSE(decode_collector_task(""));
  CHECK_FALSE(decode_collector_task(std::string("\x80", 1)));           // {}: fields missing
  CHECK_FALSE(decode_collector_task(std::string("\x93\x01\x02\x03")));  // an array
  CHECK_FALSE(decode_collector_task(task + "x"));                       // trailing bytes
  for (std::size_t cut = 0; cut < task.size(); ++cut)
    CHECK_FALSE(decode_collector_task(task.substr(0, cut)));
  // A huge declared array must not allocate what it claims (array32 header, no content).
  CHECK_FALSE(decode_result_batch(std::string("\xdd\x1e\x1e\x1e\x1e\x1e", 6)));
  // Wrong types in a batch row: a sign of 2, a return that is a string.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(2);
  pk.pack("policy_version");
  pk.pack(1);
  pk.pack("results");
  pk.pack_array(1);
  pk.pack_array(4);
  pk.pack(0);
  pk.pack(2);
  pk.pack(1.0);
  pk.pack(1);
  CHECK_FALSE(decode_result_batch(std::string(buf.data(), buf.size())));
  CHECK_FALSE(decode_learn_report(encode(learner_task{})));  // another message altogether
}

}  // namespace rlbus::demo
