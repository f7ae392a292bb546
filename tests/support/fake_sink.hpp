// A task_sink that keeps what the task manager sends, per peer, for unit tests to take in
// order; peers can be made unreachable (their sends fail, as for a lost connection).
#pragma once

#include <catch2/catch.hpp>

#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "broker/tasks/task_manager.hpp"
#include "codec/codec.hpp"

namespace rlbus::test {

struct fake_sink : broker::task_sink {
  std::map<std::string, std::deque<codec::message>> inbox;  // per peer id
  std::vector<std::string> topics;
  std::set<std::string> unreachable;  // peers whose connection is gone: sends fail
  bool send_to(std::string_view peer_id, const codec::message& m) override {
    if (unreachable.count(std::string(peer_id)) != 0) return false;
    inbox[std::string(peer_id)].push_back(m);
    return true;
  }
  // What the broker encoded, as the peer would decode it.
  bool send_encoded(std::string_view peer_id, codec::msg_type type,
                    const util::shared_frame& body) override {
    auto m = codec::decode_body(static_cast<std::uint8_t>(type), body.view());
    if (!m) FAIL("the broker encoded what does not decode: " << m.error().reason);
    return send_to(peer_id, m.value());
  }
  void publish(std::string_view topic, decltype(codec::event::body) /*body*/) override {
    topics.emplace_back(topic);
  }
  bool wanted(std::string_view /*topic*/) override { return true; }
  std::size_t queued = 0;  // what the connections' queues would hold
  [[nodiscard]] std::size_t queued_bytes() const override { return queued; }
  template <class T>
  T take(const std::string& peer) {
    auto& q = inbox[peer];
    INFO("peer " << peer);
    REQUIRE_FALSE(q.empty());
    auto m = std::move(q.front());
    q.pop_front();
    INFO("got type " << static_cast<int>(codec::type_of(m)));
    REQUIRE(std::holds_alternative<T>(m));
    return std::get<T>(std::move(m));
  }
  /// The first message of type T for `peer`, skipping (and keeping) the others.
  template <class T>
  T take_first(const std::string& peer) {
    auto& q = inbox[peer];
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (std::holds_alternative<T>(*it)) {
        T m = std::get<T>(std::move(*it));
        q.erase(it);
        return m;
      }
    }
    FAIL("no message of the wanted type for " << peer);
    return T{};
  }
  codec::task_event event(const std::string& coordinator, const std::string& name) {
    auto e = take<codec::task_event>(coordinator);
    CHECK(e.event == name);
    return e;
  }
  bool empty(const std::string& peer) { return inbox[peer].empty(); }
};

}  // namespace rlbus::test
