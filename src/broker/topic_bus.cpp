// See topic_bus.hpp. Read top to bottom: sessions, subscriptions, publications (matching,
// queues, bounds), the window out, credit in, retained values, and what an operator sees.
#include "broker/topic_bus.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "codec/batch.hpp"

namespace rlbus::broker {

namespace {

constexpr std::size_t delivery_overhead = 64;  // what a delivery costs a queue besides its bytes
constexpr std::size_t max_topic_cost = codec::max_topic_length + delivery_overhead;
constexpr std::size_t max_tracked_topics = 1024;  // topics counted by name; the rest as one

bool allowed(topic_bus::topic_rights rights, std::string_view topic) {
  if (rights == nullptr) return true;
  return std::any_of(rights->begin(), rights->end(),
                     [&](const std::string& p) { return topic.substr(0, p.size()) == p; });
}

}  // namespace

bus_payload::bus_payload(zmq::message_t frame, std::shared_ptr<std::atomic<std::size_t>> total)
    : frame_(std::move(frame)), total_(std::move(total)) {
  total_->fetch_add(frame_.size(), std::memory_order_relaxed);
}

bus_payload::~bus_payload() {
  total_->fetch_sub(frame_.size(), std::memory_order_relaxed);
}

std::size_t topic_bus::publication::cost() const noexcept {
  return topic.size() + from.size() + delivery_overhead + (payload ? payload->size() : 0);
}

topic_bus::topic_bus(const config& cfg, bus_sink& sink) : cfg_(cfg), sink_(sink) {}

topic_bus::node* topic_bus::find(std::string_view id) {
  const auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : it->second.get();
}

// ---- sessions -----------------------------------------------------------------------------

void topic_bus::node_joined(const std::string& id) {
  auto n = std::make_unique<node>();
  n->id = id;
  auto& added = *nodes_.insert_or_assign(id, std::move(n)).first->second;
  grant(added, true);
}

void topic_bus::node_resumed(const std::string& id) {
  node* n = find(id);
  if (n == nullptr) return node_joined(id);
  grant(*n, true);  // what it holds, and what the broker took of what it sent
  if (n->cursor > n->acked) counts_.resent += n->cursor - n->acked;
  n->cursor = n->acked;  // the old connection took what it was sent with it
  flush(*n);
}

void topic_bus::node_gone(const std::string& id) {
  const auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  node& n = *it->second;
  for (const auto& [key, echo] : n.subs) index_remove(n, key.first, key.second);
  for (const auto& e : n.queue) forget(n, e);
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
    const auto send_retained = [&](const retained_value& v) {
      if (v.pub->from != n.id || s.echo) enqueue(n, v.pub, true);
    };
    if (s.prefix) {
      for (auto r = retained_.lower_bound(s.topic);
           r != retained_.end() && r->first.compare(0, s.topic.size(), s.topic) == 0; ++r)
        send_retained(r->second);
    } else if (const auto r = retained_.find(s.topic); r != retained_.end()) {
      send_retained(r->second);
    }
  }
  return std::nullopt;
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
  pub->payload = std::make_shared<bus_payload>(std::move(payload), total_);
  n->largest = std::max(n->largest, pub->payload->size());
  counts_.published++;
  counts_.published_bytes += pub->payload->size();
  count_topic(p.topic, p.count.value_or(1), pub->payload->size());  // a batch: its publications
  if (p.part == 0) {
    const auto to = recipients(p.topic, *n);
    if (p.more) {
      n->open = open_run{p.topic, 1, {}};
      n->open->recipients.reserve(to.size());
      for (node* r : to) n->open->recipients.push_back(r->id);
    }
    for (node* r : to) enqueue(*r, pub);
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
  to.queue.push_back({to.next_seq++, pub, retained});
  to.queue_bytes += pub->cost();
  counts_.delivered++;
  if (node* from = find(pub->from); from != nullptr) from->held_by[to.id]++;
  enforce_bounds(to);
  flush(to);
}

void topic_bus::forget(node& to, const entry& e) {
  to.queue_bytes -= e.pub->cost();
  if (node* from = find(e.pub->from); from != nullptr) {
    const auto it = from->held_by.find(to.id);
    if (it != from->held_by.end() && --it->second == 0) from->held_by.erase(it);
  }
}

// The node's queue past bus-queue-bytes, or all of them past bus-memory: the oldest
// deliveries not sent yet go, their seqs kept for the gap (SPEC §17.6).
void topic_bus::enforce_bounds(node& to) {
  while (to.queue_bytes > cfg_.bus_queue_bytes)
    if (!drop_oldest_unsent(to)) break;
  while (total_->load(std::memory_order_relaxed) > cfg_.bus_memory) {
    node* largest = nullptr;
    for (auto& [id, n] : nodes_)
      if (n->queue.size() > 0 && (largest == nullptr || n->queue_bytes > largest->queue_bytes))
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
  counts_.dropped++;
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
  while (!n.queue.empty() && n.queue.front().seq <= seq) {
    forget(n, n.queue.front());
    n.queue.pop_front();
  }
  n.cursor = std::max(n.cursor, seq);
  flush(n);
  retry_waiting();
  return std::nullopt;
}

void topic_bus::pump() {
  for (auto& [id, n] : nodes_) flush(*n);
  retry_waiting();
}

// ---- credit in ----------------------------------------------------------------------------

bool topic_bus::held_back(const node& publisher) const {
  if (total_->load(std::memory_order_relaxed) > cfg_.bus_memory / 2) return true;
  return std::any_of(publisher.held_by.begin(), publisher.held_by.end(), [&](const auto& h) {
    const auto it = nodes_.find(h.first);
    return it != nodes_.end() && it->second->queue_bytes > cfg_.bus_queue_bytes / 2;
  });
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
  (void)sink_.send_bus(publisher.id,
                       codec::publish_credit{publisher.pub_acked, publisher.pub_limit});
  return true;
}

// A publisher hears what the broker took once per turn of the loop, in one PUBLISH_CREDIT,
// when no grant told it already: so it can let go of what it kept to send again.
void topic_bus::end_of_turn() {
  if (acks_due_.empty()) return;
  const std::vector<std::string> due(acks_due_.begin(), acks_due_.end());
  acks_due_.clear();
  for (const auto& id : due)
    if (node* n = find(id))
      (void)sink_.send_bus(n->id, codec::publish_credit{n->pub_acked, n->pub_limit});
}

void topic_bus::retry_waiting() {
  if (waiting_.empty()) return;
  const std::vector<std::string> due(waiting_.begin(), waiting_.end());
  for (const auto& id : due)
    if (node* n = find(id)) grant(*n, false);
}

// ---- retained values ----------------------------------------------------------------------

// Each value counts its topic and bookkeeping besides its payload, so that many small values
// are bounded as a few large ones are.
void topic_bus::retain(const pub_ref& pub) {
  if (const auto it = retained_.find(pub->topic); it != retained_.end()) {
    retained_bytes_ -= it->second.pub->cost();
    retain_order_.erase(it->second.order);
    retained_.erase(it);
  }
  const auto size = pub->cost();
  if (pub->payload->size() == 0 || size > cfg_.bus_retain_bytes) return;  // empty clears
  const auto order = ++retain_clock_;
  retained_.emplace(pub->topic, retained_value{pub, order});
  retain_order_.emplace(order, pub->topic);
  retained_bytes_ += size;
  while (retained_bytes_ > cfg_.bus_retain_bytes && !retain_order_.empty()) {
    const auto oldest = retain_order_.begin();
    const auto it = retained_.find(oldest->second);
    retained_bytes_ -= it->second.pub->cost();
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
  c.queued_bytes = total_->load(std::memory_order_relaxed);
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
    out.push_back({"(other)", other_traffic_.messages, other_traffic_.bytes, 0});
  std::sort(out.begin(), out.end(), [](const topic_stats& a, const topic_stats& b) {
    return a.messages != b.messages ? a.messages > b.messages : a.topic < b.topic;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

std::vector<node_stats> topic_bus::nodes(std::size_t limit) const {
  std::vector<node_stats> out;
  out.reserve(nodes_.size());
  for (const auto& [id, n] : nodes_)
    out.push_back({id, n->subs.size(), n->queue.size(), n->queue_bytes, n->next_seq, n->acked,
                   n->pub_acked, waiting_.count(id) > 0});
  std::stable_sort(out.begin(), out.end(), [](const node_stats& a, const node_stats& b) {
    return a.queued_bytes > b.queued_bytes;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

}  // namespace rlbus::broker
