// See topic_bus.hpp. Read top to bottom: sessions, subscriptions, publications (matching,
// queues, bounds), the window out, credit in, retained values, and what an operator sees.
#include "broker/bus/topic_bus.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "codec/batch.hpp"

namespace rlbus::broker {

namespace {

constexpr std::size_t delivery_overhead = 64;  // what a delivery costs a queue besides its bytes
constexpr std::size_t max_topic_cost = codec::max_topic_length + delivery_overhead;
constexpr std::size_t max_tracked_topics = 1024;  // topics counted by name; the rest as one
constexpr std::size_t max_holders_named = 8;      // publishers a node's stats name as waiting
// The topics past max_tracked_topics, counted together: a name with a space, which no topic has.
constexpr std::string_view other_topics = "(other topics)";

// What the broker really holds besides payload bytes (measured against RSS: see the limits
// tests): each publication's own record, its payload's and libzmq's (with their allocator
// headers), and its topic and publisher id; each queue entry; each retained value's places
// in the two maps that keep it.
constexpr std::size_t publication_bookkeeping = 192;
constexpr std::size_t retained_bookkeeping = 224;

bool allowed(topic_bus::topic_rights rights, std::string_view topic) {
  if (rights == nullptr) return true;
  return std::any_of(rights->begin(), rights->end(),
                     [&](const std::string& p) { return topic.substr(0, p.size()) == p; });
}

}  // namespace

bus_payload::bus_payload(zmq::message_t frame, std::size_t overhead,
                         std::shared_ptr<std::atomic<std::size_t>> total)
    : frame_(std::move(frame)), counted_(frame_.size() + overhead), total_(std::move(total)) {
  total_->fetch_add(counted_, std::memory_order_relaxed);
}

bus_payload::~bus_payload() {
  total_->fetch_sub(counted_, std::memory_order_relaxed);
}

std::size_t topic_bus::publication::cost() const noexcept {
  return topic.size() + from.size() + delivery_overhead + (payload ? payload->size() : 0);
}

topic_bus::topic_bus(const config& cfg, bus_sink& sink) : cfg_(cfg), sink_(sink) {}

topic_bus::node* topic_bus::find(std::string_view id) {
  const auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : it->second.get();
}

topic_bus::node* topic_bus::find(const session_ref& s) {
  node* n = find(s.id);
  return n != nullptr && n->serial == s.serial ? n : nullptr;
}

std::size_t topic_bus::held() const noexcept {
  return total_->load(std::memory_order_relaxed) + entries_bytes_;
}

// ---- sessions -----------------------------------------------------------------------------

void topic_bus::node_joined(const std::string& id) {
  if (find(id) != nullptr) node_gone(id);  // the broker ends a session before another begins
  auto n = std::make_unique<node>();
  n->id = id;
  n->serial = ++last_serial_;
  auto& added = *nodes_.insert_or_assign(id, std::move(n)).first->second;
  grant(added, true);
}

void topic_bus::node_resumed(const std::string& id) {
  node* n = find(id);
  if (n == nullptr) return node_joined(id);
  grant(*n, true);         // what it holds, and what the broker took of what it sent
  n->quiet_since.reset();  // a new connection: its silence begins again
  if (n->cursor > n->acked) counts_.resent += n->cursor - n->acked;
  n->cursor = n->acked;  // the old connection took what it was sent with it
  flush(*n);
}

void topic_bus::node_welcomed_again(const std::string& id) {
  if (node* n = find(id)) grant(*n, true);
}

void topic_bus::node_gone(const std::string& id) {
  const auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  node& n = *it->second;
  for (const auto& [key, echo] : n.subs) index_remove(n, key.first, key.second);
  for (const auto& e : n.queue) forget(n, e);
  if (!n.queue.empty()) holders_--;
  n.queue.clear();
  waiting_.erase(n.id);
  acks_due_.erase(n.id);
  // Its recipients drop what they hold of its open publication (SPEC §17.5).
  std::optional<open_run> open = std::move(n.open);
  auto gone = std::move(it->second);
  nodes_.erase(it);
  if (open) {
    auto cut = std::make_shared<publication>();
    cut->topic = open->topic;
    cut->from = id;
    cut->part = open->next_part;
    cut->abandoned = true;
    counts_.abandoned++;
    for (const auto& r : open->recipients)
      if (node* to = find(r)) enqueue(*to, cut);
  }
  retry_waiting();  // its queue held publishers back
}

// ---- subscriptions ------------------------------------------------------------------------

std::optional<refusal> topic_bus::handle(const std::string& id, const codec::message& m,
                                         topic_rights rights) {
  node* n = find(id);
  if (n == nullptr) return refusal{codec::error_code::unknown_type, "not a node of the bus"};
  if (const auto* s = std::get_if<codec::subscribe>(&m)) return subscribe(*n, *s, rights);
  if (const auto* u = std::get_if<codec::unsubscribe>(&m)) return unsubscribe(*n, *u, rights);
  if (const auto* a = std::get_if<codec::bus_ack>(&m)) return bus_ack(*n, a->seq);
  return refusal{codec::error_code::unknown_type, "sent by the broker, never to it"};
}

void topic_bus::answer(const node& n, std::uint64_t req, std::optional<codec::error_code> refused,
                       std::string reason) {
  const auto code = refused ? static_cast<std::uint16_t>(*refused) : std::uint16_t{0};
  (void)sink_.send_bus(n.id,
                       codec::subscribed{req, !refused, code, std::move(reason), n.subs.size()});
}

// The rules SUBSCRIBE and UNSUBSCRIBE share (SPEC §17.8 rules 2 and 3): an ERROR to answer
// (inner refusal), a SUBSCRIBED refusal already sent (inner nullopt), or nothing to refuse.
std::optional<std::optional<refusal>> topic_bus::refuse_request(const node& n, std::uint64_t req,
                                                                const std::string& topic,
                                                                bool prefix, topic_rights rights) {
  if (topic.empty() && !prefix)
    return refusal{codec::error_code::bad_field, "an empty topic is a prefix (of every topic)"};
  if (allowed(rights, topic)) return std::nullopt;
  answer(n, req, codec::error_code::unauthorized,
         fmt::format("this node's key may not use topic '{}'", topic));
  return std::optional<refusal>{};
}

std::optional<refusal> topic_bus::subscribe(node& n, const codec::subscribe& s,
                                            topic_rights rights) {
  if (auto refused = refuse_request(n, s.req, s.topic, s.prefix, rights)) return *refused;
  const auto key = std::make_pair(s.prefix, s.topic);
  const auto it = n.subs.find(key);
  if (it == n.subs.end() && n.subs.size() >= cfg_.bus_max_subscriptions) {
    answer(n, s.req, codec::error_code::too_many_subscriptions,
           fmt::format("a node holds at most {} subscriptions", cfg_.bus_max_subscriptions));
    return std::nullopt;
  }
  if (it != n.subs.end()) index_remove(n, s.prefix, s.topic);
  n.subs[key] = s.echo;
  index_add(n, s.prefix, s.topic, s.echo);
  answer(n, s.req, std::nullopt, "");
  if (s.last) {  // the retained values it matches, in topic order (SPEC §17.7)
    if (s.prefix) {
      n.replays.push_back(replay{s.topic, s.echo, s.topic, retain_clock_, {}});
      feed_replays(n);
    } else if (const auto r = retained_.find(s.topic);
               r != retained_.end() && (r->second.pub->from != n.id || s.echo)) {
      enqueue(n, r->second.pub, true);
    }
  }
  return std::nullopt;
}

// A replay is bounded by the node's queue, not by the retained values: it goes on as the node
// acknowledges, a bounded step at a time, so that the loop never stalls on it.
void topic_bus::feed_replays(node& n) {
  constexpr std::size_t step = 1024;
  for (std::size_t k = 0; k < step && !n.replays.empty(); ++k) {
    if (n.queue_bytes >= cfg_.bus_queue_bytes / 4) return;
    auto& r = n.replays.front();
    const auto it = retained_.lower_bound(r.next);
    if (it == retained_.end() || it->first.compare(0, r.prefix.size(), r.prefix) != 0) {
      n.replays.pop_front();
      continue;
    }
    r.next = it->first + '\0';  // (topics are printable: this is the next one up)
    const auto& v = it->second;
    if (v.order > r.before || r.early.count(it->first) > 0 || (v.pub->from == n.id && !r.echo))
      continue;
    enqueue(n, v.pub, true);
  }
}

void topic_bus::replay_before_live(node& n, const std::string& topic) {
  for (auto& r : n.replays) {
    if (topic.compare(0, r.prefix.size(), r.prefix) != 0 || topic < r.next ||
        !r.early.insert(topic).second)
      continue;
    const auto it = retained_.find(topic);
    if (it != retained_.end() && it->second.order <= r.before &&
        (it->second.pub->from != n.id || r.echo))
      enqueue(n, it->second.pub, true);
  }
}

std::optional<refusal> topic_bus::unsubscribe(node& n, const codec::unsubscribe& u,
                                              topic_rights rights) {
  if (auto refused = refuse_request(n, u.req, u.topic, u.prefix, rights)) return *refused;
  if (n.subs.erase(std::make_pair(u.prefix, u.topic)) > 0) index_remove(n, u.prefix, u.topic);
  answer(n, u.req, std::nullopt, "");
  return std::nullopt;
}

void topic_bus::index_add(node& n, bool prefix, const std::string& topic, bool echo) {
  (prefix ? prefixes_ : exact_)[topic].push_back({&n, echo});
  counts_.subscriptions++;
}

void topic_bus::index_remove(node& n, bool prefix, const std::string& topic) {
  auto& idx = prefix ? prefixes_ : exact_;
  const auto it = idx.find(topic);
  if (it == idx.end()) return;
  auto& subs = it->second;
  const auto before = subs.size();
  subs.erase(
      std::remove_if(subs.begin(), subs.end(), [&](const subscriber_ref& r) { return r.n == &n; }),
      subs.end());
  counts_.subscriptions -= before - subs.size();
  if (subs.empty()) idx.erase(it);
}

// ---- publications -------------------------------------------------------------------------

std::vector<topic_bus::node*> topic_bus::recipients(const std::string& topic,
                                                    const node& publisher) const {
  std::vector<node*> out;
  const auto mark = ++match_clock_;
  const auto take = [&](const std::vector<subscriber_ref>& subs) {
    for (const auto& r : subs) {
      if (r.n->mark == mark || (r.n == &publisher && !r.echo)) continue;
      r.n->mark = mark;
      out.push_back(r.n);
    }
  };
  if (const auto it = exact_.find(topic); it != exact_.end()) take(it->second);
  if (prefixes_.size() <= topic.size()) {
    for (const auto& [p, subs] : prefixes_)
      if (topic.compare(0, p.size(), p) == 0) take(subs);
  } else {
    for (std::size_t k = 0; k <= topic.size(); ++k)
      if (const auto it = prefixes_.find(std::string_view(topic).substr(0, k));
          it != prefixes_.end())
        take(it->second);
  }
  return out;
}

std::optional<refusal> topic_bus::on_publish(const std::string& id, const codec::publish& p,
                                             zmq::message_t&& payload, topic_rights rights) {
  node* n = find(id);
  if (n == nullptr) return refusal{codec::error_code::unknown_type, "not a node of the bus"};
  // Credit and order first (SPEC §17.4.2): a copy sent again after a resumption is no fault.
  if (p.seq <= n->pub_acked) {
    counts_.duplicates++;
    return std::nullopt;
  }
  if (p.seq != n->pub_acked + 1)
    return refusal{codec::error_code::bad_seq,
                   fmt::format("PUBLISH seq {} skips {}: the next one taken is {}", p.seq,
                               p.seq - n->pub_acked - 1, n->pub_acked + 1)};
  if (p.seq > n->pub_limit)
    return refusal{codec::error_code::no_credit,
                   fmt::format("PUBLISH seq {} is past the credit granted ({}): wait for "
                               "PUBLISH_CREDIT",
                               p.seq, n->pub_limit)};
  n->pub_acked = p.seq;  // taken, whatever follows
  const auto told = [&] {
    if (!grant(*n, false)) acks_due_.insert(n->id);
  };
  const auto refused = [&](codec::error_code code, std::string why) -> std::optional<refusal> {
    told();
    return refusal{code, std::move(why)};
  };
  if (!allowed(rights, p.topic))
    return refused(codec::error_code::unauthorized,
                   fmt::format("this node's key may not publish on topic '{}'", p.topic));
  if (p.count) {  // a batch (SPEC §17.5.1), checked whole before it is relayed
    if (p.retain || p.more || p.part > 0)
      return refused(codec::error_code::bad_batch,
                     "a batch is never a fragment nor a retained value: no part, more or "
                     "retain with count");
    if (!codec::valid_batch({payload.data<char>(), payload.size()}, *p.count))
      return refused(codec::error_code::bad_batch,
                     fmt::format("the payload ({} bytes) is not a batch of {} items, each a "
                                 "4-byte big-endian length and then that many bytes",
                                 payload.size(), *p.count));
  }
  if (p.retain && (p.more || p.part > 0))
    return refused(codec::error_code::bad_fragment, "a fragment cannot be retained");
  if (p.part == 0 && n->open)
    return refused(codec::error_code::bad_fragment,
                   fmt::format("publication on '{}' is open: its part {} comes first",
                               n->open->topic, n->open->next_part));
  if (p.part > 0 && (!n->open || n->open->next_part != p.part || n->open->topic != p.topic))
    return refused(codec::error_code::bad_fragment,
                   n->open ? fmt::format("the open publication is on '{}' and expects part {}",
                                         n->open->topic, n->open->next_part)
                           : std::string("no publication is open to continue"));

  auto pub = std::make_shared<publication>();
  pub->topic = p.topic;
  pub->from = id;
  pub->part = p.part;
  pub->more = p.more;
  pub->count = p.count.value_or(0);
  pub->payload = std::make_shared<bus_payload>(
      std::move(payload), publication_bookkeeping + p.topic.size() + id.size(), total_);
  n->largest = std::max(n->largest, pub->payload->size());
  counts_.published++;
  counts_.published_bytes += pub->payload->size();
  count_topic(p.topic, p.count.value_or(1), pub->payload->size());  // a batch: its publications
  if (p.part == 0) {
    const auto to = recipients(p.topic, *n);
    if (p.more) {
      n->open = open_run{p.topic, 1, {}};
      n->open->recipients.reserve(to.size());
      for (node* r : to) n->open->recipients.push_back({r->id, r->serial});
    }
    for (node* r : to) {
      if (!r->replays.empty()) replay_before_live(*r, p.topic);
      enqueue(*r, pub);
    }
  } else {
    for (const auto& r : n->open->recipients)  // enqueue leaves the run alone
      if (node* to = find(r)) enqueue(*to, pub);
    if (p.more) {
      n->open->next_part++;
    } else {
      n->open.reset();
    }
  }
  if (p.retain) retain(pub);
  told();
  return std::nullopt;
}

void topic_bus::enqueue(node& to, const pub_ref& pub, bool retained) {
  if (to.queue.empty()) holders_++;
  to.queue.push_back({to.next_seq++, pub, retained});
  to.queue_bytes += pub->cost();
  entries_bytes_ += sizeof(entry);
  counts_.delivered++;
  if (node* from = find(pub->from); from != nullptr) from->held_by[to.id]++;
  enforce_bounds(to);
  flush(to);
}

void topic_bus::forget(node& to, const entry& e) {
  to.queue_bytes -= e.pub->cost();
  entries_bytes_ -= sizeof(entry);
  if (node* from = find(e.pub->from); from != nullptr) {
    const auto it = from->held_by.find(to.id);
    if (it != from->held_by.end() && --it->second == 0) from->held_by.erase(it);
  }
}

// The node's queue past bus-queue-bytes, or all of them past bus-memory: the oldest deliveries
// not sent yet go, their seqs kept for the gap (SPEC §17.6). A stalled node holds no one back,
// so it keeps no more than one that does would: half of bus-queue-bytes, and its share of half
// of bus-memory (so that many stalled nodes never press on the bus as a whole).
void topic_bus::enforce_bounds(node& to) {
  const auto bound = to.stalled ? std::min(cfg_.bus_queue_bytes / 2,
                                           cfg_.bus_memory / 2 / std::max<std::size_t>(holders_, 1))
                                : cfg_.bus_queue_bytes;
  while (to.queue_bytes > bound)
    if (!drop_oldest_unsent(to)) break;
  while (held() > cfg_.bus_memory) {
    node* largest = nullptr;
    for (auto& [id, n] : nodes_)
      if (!n->queue.empty() && (largest == nullptr || n->queue_bytes > largest->queue_bytes))
        largest = n.get();
    if (largest == nullptr || !drop_oldest_unsent(*largest)) break;
  }
}

bool topic_bus::drop_oldest_unsent(node& n) {
  const auto it = std::upper_bound(n.queue.begin(), n.queue.end(), n.cursor,
                                   [](std::uint64_t c, const entry& e) { return c < e.seq; });
  if (it == n.queue.end()) return false;  // all it holds is sent: it goes when acknowledged
  forget(n, *it);
  n.queue.erase(it);
  if (n.queue.empty()) holders_--;
  counts_.dropped++;
  n.dropped++;
  return true;
}

// ---- the window out -----------------------------------------------------------------------

void topic_bus::flush(node& n) {
  for (;;) {
    const auto it = std::upper_bound(n.queue.begin(), n.queue.end(), n.cursor,
                                     [](std::uint64_t c, const entry& e) { return c < e.seq; });
    // The window: deliveries sent and not acknowledged are those the queue holds up to the
    // cursor. A gap takes no room in it.
    const bool room = static_cast<std::size_t>(it - n.queue.begin()) < cfg_.bus_window;
    const auto next = it == n.queue.end() ? n.next_seq : it->seq;
    if (next > n.cursor + 1) {
      // Dropped deliveries, as one gap, when the delivery after them may go too (so that
      // drops meanwhile join it), or when nothing follows them.
      if (it != n.queue.end() && !room) return;
      if (!sink_.send_bus(n.id, codec::bus_gap{n.cursor + 1, next - 1})) return;
      counts_.gaps++;
      n.cursor = next - 1;
      n.sent_max = std::max(n.sent_max, n.cursor);
      continue;
    }
    if (it == n.queue.end() || !room) return;
    const auto& pub = *it->pub;
    codec::deliver d{it->seq, pub.topic, pub.from, pub.part, pub.more, it->retained, pub.abandoned};
    if (pub.count > 0) d.count = pub.count;
    if (!sink_.send_delivery(n.id, d, pub.payload)) return;  // again on the next turn
    n.cursor = it->seq;
    n.sent_max = std::max(n.sent_max, n.cursor);
  }
}

std::optional<refusal> topic_bus::bus_ack(node& n, std::uint64_t seq) {
  if (seq > n.sent_max)
    return refusal{codec::error_code::bad_seq,
                   fmt::format("BUS_ACK {} is past the last delivery sent ({})", seq, n.sent_max)};
  if (seq <= n.acked) return std::nullopt;
  n.acked = seq;
  n.quiet_since.reset();
  if (n.stalled) {
    n.stalled = false;
    spdlog::info("bus node {} acknowledges again: it holds its publishers back again", n.id);
  }
  const bool held_any = !n.queue.empty();
  while (!n.queue.empty() && n.queue.front().seq <= seq) {
    forget(n, n.queue.front());
    n.queue.pop_front();
  }
  if (held_any && n.queue.empty()) holders_--;
  n.cursor = std::max(n.cursor, seq);
  feed_replays(n);
  flush(n);
  retry_waiting();
  return std::nullopt;
}

void topic_bus::pump(util::time_point now) {
  for (auto& [id, n] : nodes_) {
    feed_replays(*n);
    flush(*n);
    // Silence is measured from a tick: a node is never found stalled early.
    if (n->queue.empty()) {
      n->quiet_since.reset();
    } else if (!n->quiet_since) {
      n->quiet_since = now;
    } else if (!n->stalled && cfg_.bus_stall_ms > 0 &&
               now - *n->quiet_since >= util::milliseconds(cfg_.bus_stall_ms) && holds_back(*n) &&
               !waiting_on(*n, 1).empty()) {
      stall(*n, now);
    }
  }
  retry_waiting();
}

// A node that held publishers back and acknowledged nothing for bus-stall-timeout (SPEC
// §17.6.1): what it has not been sent is dropped (a gap), and it holds no one back until it
// acknowledges again.
void topic_bus::stall(node& n, util::time_point now) {
  const auto waiting = waiting_on(n, waiting_.size());
  const auto bytes = n.queue_bytes;
  const auto before = n.dropped;
  n.stalled = true;
  n.stalls++;
  counts_.stalls++;
  while (drop_oldest_unsent(n)) {
  }
  flush(n);  // the gap, if its connection takes it
  spdlog::warn(
      "bus node {} held {} publisher(s) back ({}{}) and acknowledged nothing for {} ms: its {} "
      "unsent deliveries are dropped as a gap ({} of {} bytes freed), and it holds no one back "
      "until it acknowledges again",
      n.id, waiting.size(), waiting.empty() ? std::string() : waiting.front(),
      waiting.size() > 1 ? ", ..." : "",
      std::chrono::duration_cast<std::chrono::milliseconds>(now - *n.quiet_since).count(),
      n.dropped - before, bytes - n.queue_bytes, bytes);
  retry_waiting();
}

// ---- credit in ----------------------------------------------------------------------------

// The publishers waiting for credit whose publications `subscriber` holds: at most `limit`,
// the first by id.
std::vector<std::string> topic_bus::waiting_on(const node& subscriber, std::size_t limit) const {
  std::vector<std::string> out;
  for (const auto& p : waiting_)
    if (const auto w = nodes_.find(p);
        w != nodes_.end() && w->second->held_by.count(subscriber.id) > 0)
      out.push_back(p);
  std::sort(out.begin(), out.end());
  if (out.size() > limit) out.resize(limit);
  return out;
}

// A subscriber holds its publishers back while its queue holds more than half of
// bus-queue-bytes, or, while the bus as a whole holds more than half of bus-memory, more than
// its share of that half (SPEC §17.4.2). A stalled node holds no one back.
bool topic_bus::holds_back(const node& subscriber) const {
  if (subscriber.stalled) return false;
  if (subscriber.queue_bytes > cfg_.bus_queue_bytes / 2) return true;
  return held() > cfg_.bus_memory / 2 &&
         subscriber.queue_bytes > cfg_.bus_memory / 2 / std::max<std::size_t>(holders_, 1);
}

bool topic_bus::held_back(const node& publisher) const {
  return std::any_of(publisher.held_by.begin(), publisher.held_by.end(), [&](const auto& h) {
    const auto it = nodes_.find(h.first);
    return it != nodes_.end() && holds_back(*it->second);
  });
}

std::string topic_bus::holder_of(std::string_view id) const {
  const auto p = nodes_.find(id);
  if (p == nodes_.end()) return {};
  const node* worst = nullptr;
  for (const auto& [sub, count] : p->second->held_by) {
    const auto it = nodes_.find(sub);
    if (it != nodes_.end() && holds_back(*it->second) &&
        (worst == nullptr || it->second->queue_bytes > worst->queue_bytes))
      worst = it->second.get();
  }
  return worst == nullptr ? std::string() : worst->id;
}

// Credit counts PUBLISH, but what a queue must hold is bytes: a node whose publications are
// large gets fewer at a time, so that what it may send ahead stays within a quarter of a
// queue's bound (counted at its largest payload so far, max-message before its first, and
// at least the largest batch the reference SDKs make: a node that has sent only small
// publications may send its queue as batches next).
std::uint64_t topic_bus::chunk(const node& publisher) const {
  const auto payload = publisher.largest == 0 ? cfg_.max_message : publisher.largest;
  const auto size =
      std::max(payload, codec::batch_max_bytes) + publisher.id.size() + max_topic_cost;
  const auto fits = cfg_.bus_queue_bytes / 4 / std::max<std::size_t>(size, 1);
  return std::clamp<std::uint64_t>(fits, 2, std::max<std::uint64_t>(cfg_.bus_credit, 2));
}

// Tops the publisher up once it has used half of what it held (SPEC §17.4.2), unless the
// queues its publications sit in are filling up: then it waits in `waiting_`.
bool topic_bus::grant(node& publisher, bool always_send) {
  const auto remaining = publisher.pub_limit - publisher.pub_acked;
  const auto size = chunk(publisher);
  if (remaining * 2 <= size) {
    if (!held_back(publisher)) {
      publisher.pub_limit = publisher.pub_acked + size;
      waiting_.erase(publisher.id);
      always_send = true;
    } else {
      waiting_.insert(publisher.id);
    }
  }
  if (!always_send) return false;
  acks_due_.erase(publisher.id);
  (void)sink_.send_bus(publisher.id, credit_of(publisher));
  return true;
}

// What the publisher has been granted, and while it is held back, by whom (SPEC §17.3.5).
codec::publish_credit topic_bus::credit_of(const node& publisher) const {
  codec::publish_credit c{publisher.pub_acked, publisher.pub_limit, std::nullopt};
  if (waiting_.count(publisher.id) > 0)
    if (auto holder = holder_of(publisher.id); !holder.empty()) c.held_by = std::move(holder);
  return c;
}

// A publisher hears what the broker took once per turn of the loop, in one PUBLISH_CREDIT,
// when no grant told it already: so it can let go of what it kept to send again.
void topic_bus::end_of_turn() {
  if (acks_due_.empty()) return;
  const std::vector<std::string> due(acks_due_.begin(), acks_due_.end());
  acks_due_.clear();
  for (const auto& id : due)
    if (node* n = find(id)) (void)sink_.send_bus(n->id, credit_of(*n));
}

void topic_bus::retry_waiting() {
  if (waiting_.empty()) return;
  const std::vector<std::string> due(waiting_.begin(), waiting_.end());
  for (const auto& id : due)
    if (node* n = find(id)) grant(*n, false);
}

// ---- retained values ----------------------------------------------------------------------

// Each value counts what keeping it costs: its payload, its publication's record, and its two
// places (with their copies of the topic), so that many small values are bounded as a few
// large ones are.
std::size_t topic_bus::publication::retained_cost() const noexcept {
  return (payload ? payload->size() : 0) + publication_bookkeeping + 3 * topic.size() +
         from.size() + retained_bookkeeping;
}

void topic_bus::retain(const pub_ref& pub) {
  if (const auto it = retained_.find(pub->topic); it != retained_.end()) {
    retained_bytes_ -= it->second.pub->retained_cost();
    retain_order_.erase(it->second.order);
    retained_.erase(it);
  }
  const auto size = pub->retained_cost();
  if (pub->payload->size() == 0) return;  // empty clears
  if (size > cfg_.bus_retain_bytes) {     // never kept: counted as forgotten at once
    counts_.retain_evicted++;
    return;
  }
  const auto order = ++retain_clock_;
  retained_.emplace(pub->topic, retained_value{pub, order});
  retain_order_.emplace(order, pub->topic);
  retained_bytes_ += size;
  while (retained_bytes_ > cfg_.bus_retain_bytes && !retain_order_.empty()) {
    const auto oldest = retain_order_.begin();
    const auto it = retained_.find(oldest->second);
    retained_bytes_ -= it->second.pub->retained_cost();
    retained_.erase(it);
    retain_order_.erase(oldest);
    counts_.retain_evicted++;
  }
}

// ---- what an operator sees ----------------------------------------------------------------

void topic_bus::count_topic(const std::string& topic, std::uint64_t messages, std::size_t bytes) {
  auto it = traffic_.find(topic);
  if (it == traffic_.end()) {
    if (traffic_.size() >= max_tracked_topics) {  // topics are the peers' to name: bounded
      other_traffic_.messages += messages;
      other_traffic_.bytes += bytes;
      return;
    }
    it = traffic_.emplace(topic, traffic{}).first;
  }
  it->second.messages += messages;
  it->second.bytes += bytes;
}

bus_counts topic_bus::counts() const {
  auto c = counts_;
  c.nodes = nodes_.size();
  c.held_back = waiting_.size();
  c.stalled = static_cast<std::uint64_t>(
      std::count_if(nodes_.begin(), nodes_.end(), [](const auto& n) { return n.second->stalled; }));
  c.queued_bytes = held();
  c.retained = retained_.size();
  c.retained_bytes = retained_bytes_;
  return c;
}

std::vector<topic_stats> topic_bus::topics(std::size_t limit) const {
  std::vector<topic_stats> out;
  out.reserve(traffic_.size() + 1);
  const node nobody;
  for (const auto& [topic, t] : traffic_)
    out.push_back({topic, t.messages, t.bytes, recipients(topic, nobody).size()});
  if (other_traffic_.messages > 0)
    out.push_back({std::string(other_topics), other_traffic_.messages, other_traffic_.bytes, 0});
  std::sort(out.begin(), out.end(), [](const topic_stats& a, const topic_stats& b) {
    return a.messages != b.messages ? a.messages > b.messages : a.topic < b.topic;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

std::vector<node_stats> topic_bus::nodes(std::size_t limit) const {
  std::vector<node_stats> out;
  out.reserve(nodes_.size());
  for (const auto& [id, n] : nodes_) {
    node_stats s;
    s.id = id;
    s.subscriptions = n->subs.size();
    s.queued = n->queue.size();
    s.queued_bytes = n->queue_bytes;
    s.next_seq = n->next_seq;
    s.acked = n->acked;
    s.published = n->pub_acked;
    s.dropped = n->dropped;
    s.stalls = n->stalls;
    s.held_back = waiting_.count(id) > 0;
    s.stalled = n->stalled;
    if (holds_back(*n)) s.holding_back = waiting_on(*n, max_holders_named);
    if (s.held_back) s.held_by = holder_of(id);
    out.push_back(std::move(s));
  }
  std::stable_sort(out.begin(), out.end(), [](const node_stats& a, const node_stats& b) {
    return a.queued_bytes > b.queued_bytes;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

}  // namespace rlbus::broker
