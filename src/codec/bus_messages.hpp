// The topic bus (SPEC §17, type ids 0x70-0x7F): nodes (role `bus`) subscribe to topics and
// publish opaque payloads; the broker delivers each publication to every subscriber of its
// topic through a window, grants publishers credit and reports what it dropped as a gap.
// PUBLISH and DELIVER carry the payload as a third frame, so the structs hold only their
// bodies; the payload travels beside them. Fields are listed once, as for task messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "codec/task_messages.hpp"

namespace rlbus::codec {

inline constexpr std::size_t max_topic_length = 256;

namespace rule {
// A topic (SPEC §17.2.1): 1..256 printable ASCII characters, space excluded (0x21-0x7E).
// `empty_ok`: a subscription's topic, which may be empty (a prefix of every topic).
struct topic {
  bool empty_ok = false;
};
// An optional field with a default: absent means false (a bool) or 0 (a uint, whose range
// rule comes before the flag), and it is written only when it holds something else. A
// present false or 0 is read as the default (not canonical, but valid).
struct flag {};
}  // namespace rule

/// True when `t` is a valid topic (1..256 bytes of 0x21-0x7E; 0 bytes too with `empty_ok`).
bool valid_topic(std::string_view t, rule::topic r = {}) noexcept;

#define RLBUS_BUS_MESSAGE(name_, id_)             \
  static constexpr msg_type type = msg_type::id_; \
  bool operator==(const name_&) const = default;

/// SUBSCRIBE (node -> broker): match `topic` exactly, or as a prefix; `echo` lets the node's
/// own publications match; `last` asks for the retained values it matches (§17.7).
struct subscribe {
  std::uint64_t req = 1;
  std::string topic;
  bool prefix = false;
  bool echo = false;
  bool last = false;
  RLBUS_BUS_MESSAGE(subscribe, subscribe)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("req", s.req, rule::range{1, ~std::uint64_t{0}});
    f("topic", s.topic, rule::topic{true});
    f("prefix", s.prefix, rule::flag{});
    f("echo", s.echo, rule::flag{});
    f("last", s.last, rule::flag{});
  }
};

/// UNSUBSCRIBE (node -> broker): drop the subscription of this topic and kind.
struct unsubscribe {
  std::uint64_t req = 1;
  std::string topic;
  bool prefix = false;
  RLBUS_BUS_MESSAGE(unsubscribe, unsubscribe)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("req", s.req, rule::range{1, ~std::uint64_t{0}});
    f("topic", s.topic, rule::topic{true});
    f("prefix", s.prefix, rule::flag{});
  }
};

/// SUBSCRIBED (broker -> node): the answer to SUBSCRIBE or UNSUBSCRIBE `req`, sent once it
/// took effect; `subscriptions` is how many the node holds now.
struct subscribed {
  std::uint64_t req = 1;
  bool accepted = true;
  std::uint16_t code = 0;
  std::string reason;
  std::uint64_t subscriptions = 0;
  RLBUS_BUS_MESSAGE(subscribed, subscribed)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("req", s.req, rule::range{1, ~std::uint64_t{0}});
    f("accepted", s.accepted);
    f("code", s.code, rule::range{0, 0xFFFF});
    f("reason", s.reason, rule::reason);
    f("subscriptions", s.subscriptions, rule::u64);
  }
};

/// PUBLISH (node -> broker, with a payload frame): publication `seq` of the node's session
/// on `topic`; `part` and `more` make fragments of one larger payload (§17.5); `count`, a
/// batch of that many publications in the payload (§17.5.1, batch.hpp).
struct publish {
  std::uint64_t seq = 1;
  std::string topic;
  std::uint32_t part = 0;
  bool more = false;
  bool retain = false;
  std::optional<std::uint32_t> count;
  RLBUS_BUS_MESSAGE(publish, publish)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("seq", s.seq, rule::range{1, ~std::uint64_t{0}});
    f("topic", s.topic, rule::topic{});
    f("part", s.part, rule::u32, rule::flag{});  // optional: 0 when absent, written when not 0
    f("more", s.more, rule::flag{});
    f("retain", s.retain, rule::flag{});
    f("count", s.count, rule::range{2, 0xFFFF});
  }
};

/// PUBLISH_CREDIT (broker -> node): the broker has taken every PUBLISH up to `acked` and the
/// node may send up to `limit` (a running total that never decreases within a session);
/// `held_by`, when the node is held back, names the subscriber that holds it.
struct publish_credit {
  std::uint64_t acked = 0;
  std::uint64_t limit = 0;
  std::optional<std::string> held_by;
  RLBUS_BUS_MESSAGE(publish_credit, publish_credit)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("acked", s.acked, rule::u64);
    f("limit", s.limit, rule::u64);
    f("held_by", s.held_by, rule::id{});
  }
};

/// DELIVER (broker -> node, with a payload frame): delivery `seq` of the node's queue, a
/// publication (or fragment, or batch) of `from` on `topic`.
struct deliver {
  std::uint64_t seq = 1;
  std::string topic;
  std::string from;
  std::uint32_t part = 0;
  bool more = false;
  bool retained = false;
  bool abandoned = false;
  std::optional<std::uint32_t> count;
  RLBUS_BUS_MESSAGE(deliver, deliver)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("seq", s.seq, rule::range{1, ~std::uint64_t{0}});
    f("topic", s.topic, rule::topic{});
    f("from", s.from, rule::id{});
    f("part", s.part, rule::u32, rule::flag{});
    f("more", s.more, rule::flag{});
    f("retained", s.retained, rule::flag{});
    f("abandoned", s.abandoned, rule::flag{});
    f("count", s.count, rule::range{2, 0xFFFF});
  }
};

/// BUS_ACK (node -> broker): every delivery up to `seq` is taken (cumulative).
struct bus_ack {
  std::uint64_t seq = 0;
  RLBUS_BUS_MESSAGE(bus_ack, bus_ack)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("seq", s.seq, rule::u64);
  }
};

/// BUS_GAP (broker -> node): deliveries `first`..`last` were dropped and will never come.
struct bus_gap {
  std::uint64_t first = 1;
  std::uint64_t last = 1;
  RLBUS_BUS_MESSAGE(bus_gap, bus_gap)
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("first", s.first, rule::range{1, ~std::uint64_t{0}});
    f("last", s.last, rule::range{1, ~std::uint64_t{0}});
  }
};

#undef RLBUS_BUS_MESSAGE

}  // namespace rlbus::codec
