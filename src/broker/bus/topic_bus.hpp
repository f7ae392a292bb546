// The topic bus (SPEC §17): nodes (sessions of role `bus`) subscribe to topics and publish
// payloads; every publication is appended, in the order the broker reads them, to the queue
// of each node that subscribes to its topic, and leaves that queue through a window the node
// acknowledges. Publishers send within credit, and a publisher whose publications sit in a
// queue that is filling up gets no more until it drains. What a bound forces out is dropped
// with its number kept, so the node hears of it as a BUS_GAP.
//
// Payload frames are never copied: the frame a publisher sent is shared by every queue that
// holds it and by libzmq while it sends it. What the bus holds is counted as it is held: each
// publication once (its payload and bookkeeping), and each queue entry on its own.
//
// A node holds back only the publishers whose publications sit in its queue, and only for so
// long: one that holds them back and acknowledges nothing for bus-stall-timeout is stalled,
// its unsent deliveries dropped (a gap), and it holds no one back until it acknowledges again.
// When the bus as a whole runs short, the nodes that hold more than their share are the ones
// that hold publishers back and lose deliveries, never those that keep up.
//
// The bus knows nodes by peer id and each session by its serial; the broker loop tells it of
// sessions beginning, resuming and ending, and does the sending (bus_sink).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "broker/core/config.hpp"
#include "broker/core/refusal.hpp"
#include "codec/messages.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

/// A payload frame as its publisher sent it, shared by all its deliveries. While it lives its
/// bytes and the bookkeeping of its publication (`overhead`) count in the bus's total (an
/// atomic: libzmq may free the last reference on its own thread, after the bus is gone).
class bus_payload {
 public:
  bus_payload(zmq::message_t frame, std::size_t overhead,
              std::shared_ptr<std::atomic<std::size_t>> total);
  ~bus_payload();
  bus_payload(const bus_payload&) = delete;
  bus_payload& operator=(const bus_payload&) = delete;
  [[nodiscard]] std::string_view view() const noexcept {
    return {frame_.data<char>(), frame_.size()};
  }
  [[nodiscard]] std::size_t size() const noexcept { return frame_.size(); }

 private:
  zmq::message_t frame_;
  std::size_t counted_;
  std::shared_ptr<std::atomic<std::size_t>> total_;
};
using payload_ref = std::shared_ptr<const bus_payload>;

/// What the bus needs from the broker loop.
class bus_sink {
 public:
  virtual ~bus_sink() = default;
  /// Sends a two-frame message to the live session of `peer_id`; false when it cannot now.
  virtual bool send_bus(std::string_view peer_id, const codec::message& m) = 0;
  /// Sends DELIVER `d` with `payload` as its third frame (empty when null).
  virtual bool send_delivery(std::string_view peer_id, const codec::deliver& d,
                             const payload_ref& payload) = 0;
};

/// What the bus counts, for the metrics and OPS status.
struct bus_counts {
  std::uint64_t nodes = 0, subscriptions = 0;
  std::uint64_t published = 0, published_bytes = 0;  // PUBLISH taken
  std::uint64_t delivered = 0;                       // deliveries queued
  std::uint64_t dropped = 0;                         // deliveries dropped by a bound (gaps)
  std::uint64_t gaps = 0;                            // BUS_GAP sent
  std::uint64_t resent = 0;                          // deliveries sent again after a resumption
  std::uint64_t duplicates = 0;                      // PUBLISH copies dropped (seq already taken)
  std::uint64_t abandoned = 0;     // publications cut short by their publisher's end
  std::uint64_t held_back = 0;     // publishers waiting for credit now
  std::uint64_t stalls = 0;        // nodes found holding publishers back without acknowledging
  std::uint64_t stalled = 0;       // nodes stalled now (holding no one back)
  std::uint64_t queued_bytes = 0;  // bytes the bus holds now: publications once, entries each
  std::uint64_t retained = 0, retained_bytes = 0, retain_evicted = 0;
};

/// One topic's traffic, for `rlbus-ctl topics` and /metrics.
struct topic_stats {
  std::string topic;
  std::uint64_t messages = 0, bytes = 0;
  std::uint64_t subscribers = 0;  // nodes whose subscriptions match it now
};

/// One node, as an operator sees it.
struct node_stats {
  std::string id;
  std::uint64_t subscriptions = 0;
  std::uint64_t queued = 0, queued_bytes = 0;  // deliveries not acknowledged
  std::uint64_t next_seq = 1, acked = 0;       // of its deliveries
  std::uint64_t published = 0;                 // PUBLISH taken (its seq)
  std::uint64_t dropped = 0;                   // of its deliveries, dropped by a bound or a stall
  std::uint64_t stalls = 0;                    // times it was found stalled
  bool held_back = false;                      // as a publisher: waiting for credit
  std::string held_by;                         // ... for this node most (empty: no one)
  bool stalled = false;                        // holding no one back until it acknowledges again
  std::vector<std::string> holding_back;       // the publishers waiting for it now (at most 8)
};

class topic_bus {
 public:
  topic_bus(const config& cfg, bus_sink& sink);
  topic_bus(const topic_bus&) = delete;
  topic_bus& operator=(const topic_bus&) = delete;

  /// A session of role bus began (after its WELCOME): it gets its first credit.
  void node_joined(const std::string& id);
  /// It resumed on a new connection (after the WELCOME): credit again, and every delivery
  /// it has not acknowledged is sent again.
  void node_resumed(const std::string& id);
  /// It said HELLO again on the connection of its session (after the WELCOME): its credit
  /// again (SPEC §17.4.2), nothing sent again.
  void node_welcomed_again(const std::string& id);
  /// Its session ended: its subscriptions and queue go, its open publication is abandoned.
  void node_gone(const std::string& id);

  /// Topic prefixes a node may use (SPEC §15.3); nullptr: every topic.
  using topic_rights = const std::vector<std::string>*;
  /// SUBSCRIBE, UNSUBSCRIBE or BUS_ACK from node `id`: a refusal to answer with ERROR, or
  /// nullopt (answers that are SUBSCRIBED are sent here).
  std::optional<refusal> handle(const std::string& id, const codec::message& m,
                                topic_rights rights);
  /// PUBLISH from node `id` with its payload frame.
  std::optional<refusal> on_publish(const std::string& id, const codec::publish& p,
                                    zmq::message_t&& payload, topic_rights rights);
  /// The status tick: sends what waits for nodes whose connection could not take more, and
  /// finds the nodes that have held publishers back without acknowledging for too long.
  void pump(util::time_point now);
  /// After each turn of the loop: publishers hear what was taken of what they sent.
  void end_of_turn();

  [[nodiscard]] bus_counts counts() const;
  /// The busiest topics first (by messages), at most `limit`.
  [[nodiscard]] std::vector<topic_stats> topics(std::size_t limit) const;
  /// How many topics topics() lists by name (the rest go together as "(other topics)").
  [[nodiscard]] std::size_t topics_tracked() const noexcept { return traffic_.size(); }
  /// The nodes that lag most first (most bytes queued), then by id; at most `limit`.
  [[nodiscard]] std::vector<node_stats> nodes(std::size_t limit) const;
  /// The publisher `id` is held back by (when it is): the laggard, for its log and OPS.
  [[nodiscard]] std::string holder_of(std::string_view id) const;

 private:
  struct publication {  // shared by the queues of all its recipients
    std::string topic, from;
    std::uint32_t part = 0;
    std::uint32_t count = 0;  // a batch of this many (SPEC §17.5.1); 0: one publication
    bool more = false, abandoned = false;
    payload_ref payload;  // null when abandoned
    /// What it costs a queue that holds it (SPEC §17.6).
    [[nodiscard]] std::size_t cost() const noexcept;
    /// What it costs to keep as a retained value (SPEC §17.7).
    [[nodiscard]] std::size_t retained_cost() const noexcept;
  };
  using pub_ref = std::shared_ptr<const publication>;
  struct entry {
    std::uint64_t seq;
    pub_ref pub;
    bool retained = false;
  };
  struct node;
  struct session_ref {  // a node's session, not just its id: a later session is another
    std::string id;
    std::uint64_t serial;
  };
  struct open_run {  // a fragmented publication between its first and last part
    std::string topic;
    std::uint32_t next_part = 1;
    std::vector<session_ref> recipients;  // fixed at part 0 (SPEC §17.2.3)
  };
  // The retained values a `last` prefix subscription has still to deliver (SPEC §17.7): fed
  // to the queue as it drains, in topic order.
  struct replay {
    std::string prefix;
    bool echo = false;
    std::string next;                          // the first topic not considered yet
    std::uint64_t before = 0;                  // values retained later came as live publications
    std::set<std::string, std::less<>> early;  // topics delivered out of turn
  };
  struct node {
    std::string id;
    std::uint64_t serial = 0;                           // which session of its id
    std::map<std::pair<bool, std::string>, bool> subs;  // (prefix, topic) -> echo
    // as a publisher
    std::uint64_t pub_acked = 0, pub_limit = 0;
    std::size_t largest = 0;  // the largest payload it published (0: none yet)
    std::optional<open_run> open;
    std::unordered_map<std::string, std::uint32_t> held_by;  // subscriber -> my deliveries there
    // as a subscriber
    std::deque<entry> queue;  // seq ascending, every delivery after `acked` still held
    std::uint64_t next_seq = 1, acked = 0;
    std::uint64_t cursor = 0;    // sent (or reported lost) on this connection up to here
    std::uint64_t sent_max = 0;  // the highest seq ever sent (BUS_ACK's bound)
    std::size_t queue_bytes = 0;
    std::deque<replay> replays;  // the first is being fed
    std::uint64_t dropped = 0, stalls = 0;
    // Since when (at a status tick) it has held deliveries and acknowledged none; stalled:
    // found holding publishers back that long, and holding no one back until it acknowledges.
    std::optional<util::time_point> quiet_since;
    bool stalled = false;
    // The match it was last taken for (so that it gets a publication once): a scratch
    // mark, not state.
    mutable std::uint64_t mark = 0;
  };
  struct subscriber_ref {
    node* n;
    bool echo;
  };
  using index = std::map<std::string, std::vector<subscriber_ref>, std::less<>>;
  struct retained_value {
    pub_ref pub;
    std::uint64_t order;
  };

  node* find(std::string_view id);
  node* find(const session_ref& s);
  std::optional<std::optional<refusal>> refuse_request(const node& n, std::uint64_t req,
                                                       const std::string& topic, bool prefix,
                                                       topic_rights rights);
  std::optional<refusal> subscribe(node& n, const codec::subscribe& s, topic_rights rights);
  std::optional<refusal> unsubscribe(node& n, const codec::unsubscribe& u, topic_rights rights);
  std::optional<refusal> bus_ack(node& n, std::uint64_t seq);
  /// SUBSCRIBED for request `req`: accepted, or refused with `refused`.
  void answer(const node& n, std::uint64_t req, std::optional<codec::error_code> refused,
              std::string reason);
  void index_add(node& n, bool prefix, const std::string& topic, bool echo);
  void index_remove(node& n, bool prefix, const std::string& topic);
  /// The nodes a publication of `publisher` on `topic` goes to, each once.
  std::vector<node*> recipients(const std::string& topic, const node& publisher) const;
  void enqueue(node& to, const pub_ref& pub, bool retained = false);
  /// Feeds `n`'s queue from its replays while it holds less than a quarter of its bound.
  void feed_replays(node& n);
  /// A live publication on `topic` for `n`: a retained value of that topic still to be
  /// replayed goes first.
  void replay_before_live(node& n, const std::string& topic);
  void forget(node& to, const entry& e);  // an entry leaves `to`'s queue
  void enforce_bounds(node& to);
  bool drop_oldest_unsent(node& n);
  /// Bytes the bus holds now: publications (each once) and queue entries (each).
  [[nodiscard]] std::size_t held() const noexcept;
  /// Whether `subscriber`'s queue holds its publishers back now (SPEC §17.4.2).
  [[nodiscard]] bool holds_back(const node& subscriber) const;
  void stall(node& n, util::time_point now);
  void flush(node& n);
  /// True when it sent PUBLISH_CREDIT.
  bool grant(node& publisher, bool always_send);
  /// The PUBLISH a grant tops `publisher` up by (SPEC §17.4.2).
  [[nodiscard]] std::uint64_t chunk(const node& publisher) const;
  [[nodiscard]] bool held_back(const node& publisher) const;
  [[nodiscard]] std::vector<std::string> waiting_on(const node& subscriber,
                                                    std::size_t limit) const;
  [[nodiscard]] codec::publish_credit credit_of(const node& publisher) const;
  void retry_waiting();
  void retain(const pub_ref& pub);
  void count_topic(const std::string& topic, std::uint64_t messages, std::size_t bytes);

  config const& cfg_;
  bus_sink& sink_;
  std::map<std::string, std::unique_ptr<node>, std::less<>> nodes_;
  index exact_, prefixes_;
  std::unordered_set<std::string> waiting_;   // publishers due credit but held back
  std::unordered_set<std::string> acks_due_;  // publishers to tell what was taken
  std::map<std::string, retained_value, std::less<>> retained_;
  std::map<std::uint64_t, std::string> retain_order_;
  std::uint64_t retain_clock_ = 0;
  mutable std::uint64_t match_clock_ = 0;
  std::size_t retained_bytes_ = 0;
  std::size_t entries_bytes_ = 0;  // what the queues' entries cost, each counted
  std::size_t holders_ = 0;        // nodes whose queue holds something
  std::uint64_t last_serial_ = 0;
  std::shared_ptr<std::atomic<std::size_t>> total_ = std::make_shared<std::atomic<std::size_t>>(0);
  struct traffic {
    std::uint64_t messages = 0, bytes = 0;
  };
  std::unordered_map<std::string, traffic> traffic_;  // bounded: see count_topic
  traffic other_traffic_;
  bus_counts counts_;
};

}  // namespace rlbus::broker
