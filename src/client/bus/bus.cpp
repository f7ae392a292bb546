// rlbus::bus: a role on the client core (client/core/core.hpp). Callers' threads queue
// publications and subscription requests under the core's lock; the I/O thread sends them in
// its flush hook (publications within the broker's credit, fragment by fragment) and hands
// the broker's answers back: SUBSCRIBED to the waiting request, PUBLISH_CREDIT to the
// publishers, DELIVER and BUS_GAP to the inbox (client/bus/bus_inbox.hpp) that recv() empties.
// See include/rlbus/bus.hpp for the contract.
#include "rlbus/bus.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "client/bus/bus_inbox.hpp"
#include "client/core/core.hpp"
#include "codec/batch.hpp"
#include "codec/codec.hpp"

namespace rlbus {

std::string_view to_string(bus_errc e) noexcept {
  switch (e) {
    case bus_errc::none:
      return "none";
    case bus_errc::timeout:
      return "timeout";
    case bus_errc::closed:
      return "closed";
    case bus_errc::refused:
      return "refused";
  }
  return "unknown";
}

namespace {

using clock = std::chrono::steady_clock;
using client::detail::payload_frame;

constexpr std::size_t max_requests = 100'000;  // subscription requests waiting to go out
constexpr std::size_t fragment_room = defaults::bus_fragment_room;  // left for a fragment's body
constexpr std::size_t max_queued = 256;                 // publications waiting for credit
constexpr std::size_t max_queued_bytes = 16 << 20;      // or their bytes (one always fits)
constexpr auto forever = std::chrono::hours(24 * 365);  // recv() without a timeout

void check_topic(std::string_view topic, bool empty_ok) {
  if (!codec::valid_topic(topic, codec::rule::topic{empty_ok}))
    throw std::invalid_argument(
        fmt::format("topic '{}': expected 1-{} printable ASCII characters other than space{}",
                    topic, codec::max_topic_length, empty_ok ? " (or none, for a prefix)" : ""));
}

bus_result failed(bus_errc e, std::string reason, std::uint16_t code = 0) {
  return bus_result{e, code, std::move(reason)};
}

}  // namespace

struct bus::impl {
  explicit impl(bus_options o)
      : opts(std::move(o)), io(checked(opts), max_requests), inbox(opts.max_partial_bytes) {
    client::detail::core::role_hooks hooks;
    hooks.on_message = [this](codec::message&& m) { on_message(std::move(m)); };
    hooks.flush = [this](client::detail::session& s) { return flush_hook(s); };
    hooks.on_payload_message = [this](codec::message&& m, zmq::message_t&& payload) {
      on_payload(std::move(m), std::move(payload));
    };
    io.start(std::move(hooks));
  }
  ~impl() { close(std::chrono::seconds(5)); }
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  static client::detail::session_options checked(const bus_options& o) {
    client::detail::session_options so{o.endpoint,      role::bus,       o.id,   {}, o.heartbeat,
                                       o.reconnect_min, o.reconnect_max, o.curve};
    client::detail::validate(so);
    if (o.max_partial_bytes < 1)
      throw std::invalid_argument("max_partial_bytes must be at least 1");
    return so;
  }

  // A subscription request waiting for its SUBSCRIBED. Kept until answered, even when its
  // caller gave up waiting, and sent again after a reconnect: its answer may have gone with
  // the old connection.
  struct request {
    codec::message msg;  // SUBSCRIBE or UNSUBSCRIBE
    std::optional<codec::subscribed> answer;
    bool waited = true;  // false: the caller timed out, nobody takes the answer
  };
  // A publication waiting to leave, sent fragment by fragment as credit allows.
  struct outgoing {
    std::string topic;
    std::shared_ptr<const std::string> payload;
    bool retain = false;
    std::size_t offset = 0;
    std::uint32_t part = 0;
  };
  // A PUBLISH sent and not yet covered by a PUBLISH_CREDIT's `acked`.
  struct sent {
    codec::publish msg;
    payload_frame payload;
  };
  using sub_key = std::pair<bool, std::string>;  // (prefix, topic)

  // ---- callers' threads ----

  bus_result request_change(codec::message msg, std::string_view what, std::string_view topic,
                            std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    std::unique_lock lock(io.mu());
    if (closed) return failed(bus_errc::closed, fmt::format("{}: the bus is closed", what));
    const auto req = ++next_req;
    if (auto* s = std::get_if<codec::subscribe>(&msg)) s->req = req;
    if (auto* u = std::get_if<codec::unsubscribe>(&msg)) u->req = req;
    requests.emplace(req, request{msg, std::nullopt, true});
    // Sent once the session is ready; a WELCOME (a reconnect) sends it again.
    bool wake = false;
    (void)io.queue(std::move(msg), wake);
    if (wake) {
      lock.unlock();
      io.wake();
      lock.lock();
    }
    const bool answered = answers.wait_until(
        lock, deadline, [&] { return closed || requests.at(req).answer.has_value(); });
    auto& r = requests.at(req);
    if (!answered) {
      r.waited = false;
      return failed(bus_errc::timeout,
                    fmt::format("{} '{}': no answer from the broker within {} ms ({}: {})", what,
                                topic, timeout.count(), to_string(io.state()), io.last_error()));
    }
    if (!r.answer) {
      requests.erase(req);
      return failed(bus_errc::closed, fmt::format("{}: the bus is closed", what));
    }
    const auto answer = std::move(*r.answer);
    requests.erase(req);
    if (!answer.accepted)
      return failed(bus_errc::refused,
                    fmt::format("{} '{}': {} {}: {}", what, topic, answer.code,
                                codec::code_name(answer.code), answer.reason),
                    answer.code);
    return {};
  }

  bus_result subscribe(std::string_view topic, subscribe_options o,
                       std::chrono::milliseconds timeout) {
    check_topic(topic, o.prefix);
    {
      std::lock_guard lock(io.mu());
      if (!closed) subs.insert_or_assign(sub_key{o.prefix, std::string(topic)}, o);
    }
    return request_change(codec::subscribe{1, std::string(topic), o.prefix, o.echo, o.last},
                          "subscribe", topic, timeout);
  }

  bus_result unsubscribe(std::string_view topic, bool prefix, std::chrono::milliseconds timeout) {
    check_topic(topic, prefix);
    {
      std::lock_guard lock(io.mu());
      if (!closed && subs.erase(sub_key{prefix, std::string(topic)}) == 0) return {};
    }
    return request_change(codec::unsubscribe{1, std::string(topic), prefix}, "unsubscribe", topic,
                          timeout);
  }

  bus_result publish(std::string_view topic, std::string_view payload, publish_options o,
                     std::chrono::milliseconds timeout) {
    check_topic(topic, false);
    auto bytes = std::make_shared<const std::string>(payload);  // copied outside the lock
    const auto deadline = clock::now() + timeout;
    std::unique_lock lock(io.mu());
    const bool room = credit.wait_until(lock, deadline, [&] {
      return closed || outq.empty() ||
             (outq.size() < max_queued && queued_bytes < max_queued_bytes);
    });
    if (closed) return failed(bus_errc::closed, "publish: the bus is closed");
    if (!room)
      return failed(
          bus_errc::timeout,
          fmt::format("publish on '{}': the broker held this node back for {} ms ({})", topic,
                      timeout.count(),
                      held_by.empty() ? std::string("a subscriber does not keep up")
                                      : fmt::format("node {} does not keep up", held_by)));
    const bool first = outq.empty();
    queued_bytes += bytes->size();
    outq.push_back(outgoing{std::string(topic), std::move(bytes), o.retain});
    lock.unlock();
    if (first) io.wake();
    return {};
  }

  bool flush(std::chrono::milliseconds timeout) {
    std::unique_lock lock(io.mu());
    const bool done = credit.wait_for(lock, timeout,
                                      [&] {
                                        return (outq.empty() && unacked.empty()) ||
                                               seen_state == connection_state::refused ||
                                               seen_state == connection_state::stopped;
                                      }) &&
                      outq.empty() && unacked.empty();
    if (!done)
      spdlog::warn("bus {}: flush gave up with {} publications not taken by the broker ({})",
                   opts.id, not_taken(),
                   seen_state == connection_state::ready ? std::string_view("held back")
                                                         : to_string(seen_state));
    return done;
  }

  // The lock held: publications not taken. A fragmented one counts once (its last part, or
  // its rest still queued); a batch counts its publications.
  [[nodiscard]] std::size_t not_taken() const {
    std::size_t n = outq.size();
    for (const auto& s : unacked)
      if (!s.msg.more) n += s.msg.count.value_or(1);
    return n;
  }

  std::optional<bus_message> recv(std::chrono::milliseconds timeout) {
    std::unique_lock lock(io.mu());
    if (!arrived.wait_for(lock, timeout, [&] { return closed || !inbox.empty(); }) || inbox.empty())
      return std::nullopt;
    const bool was_due = inbox.ack_due();
    auto m = inbox.take();
    const bool wake = !was_due && inbox.ack_due();
    lock.unlock();
    if (wake) io.wake();
    return m;
  }

  std::size_t close(std::chrono::milliseconds timeout) {
    const auto st = io.state();
    bool first = false;
    {
      std::lock_guard lock(io.mu());
      first = !closing;
      closing = true;
    }
    // A node that is reconnecting may still resume and hand over what it kept.
    if (first && (st == connection_state::ready || st == connection_state::reconnecting))
      (void)flush(timeout);
    std::size_t dropped = 0;
    {
      std::lock_guard lock(io.mu());
      if (first) dropped = not_taken();
      if (dropped > 0) {
        inbox.count_lost(dropped);
        spdlog::error(
            "bus {}: closed with {} publications the broker had not taken: they are "
            "lost",
            opts.id, dropped);
      }
      closed = true;
      answers.notify_all();
      credit.notify_all();
      arrived.notify_all();
    }
    io.stop();  // sends the last BUS_ACK (the flush hook), then DISCONNECT
    return dropped;
  }

  // ---- the I/O thread ----

  // The core's lock held, once per turn of the loop.
  bool flush_hook(client::detail::session& s) {
    if (s.state() != seen_state) {
      seen_state = s.state();
      credit.notify_all();  // flush() gives up when the connection is refused or stopped
    }
    if (s.state() != connection_state::ready) return true;
    if (!io.send_in_order(s)) return false;
    if (inbox.ack_due()) {
      const auto upto = inbox.ack_upto();
      if (!s.send_ready(codec::bus_ack{upto})) return s.state() != connection_state::ready;
      inbox.acked(upto);
    }
    if (!credit_known) return true;
    // A resumption: what the broker did not take goes again, in order, before anything new.
    while (resend_next < resend_end) {
      const auto& p = unacked[resend_next];
      if (!s.send_ready(p.msg, p.payload)) return s.state() != connection_state::ready;
      ++resend_next;
    }
    return pump(s);
  }

  // Sends what is queued, fragment by fragment, within the credit (the core's lock held).
  bool pump(client::detail::session& s) {
    const std::size_t room = std::max<std::size_t>(
        max_message - std::min<std::size_t>(fragment_room, max_message / 2), 1);
    while (!outq.empty() && pub_seq < pub_limit) {
      auto& out = outq.front();
      const std::size_t size = out.payload->size();
      if (const auto n = batchable(); n > 1) {  // small ones queued on one topic: one PUBLISH
        auto framed = std::make_shared<std::string>();
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < n; ++i) {
          codec::append_to_batch(*framed, *outq[i].payload);
          bytes += outq[i].payload->size();
        }
        codec::publish p{pub_seq + 1, out.topic, 0, false, false};
        p.count = static_cast<std::uint32_t>(n);
        const auto length = framed->size();
        sent kept{std::move(p), payload_frame{std::move(framed), 0, length}};
        if (!s.send_ready(kept.msg, kept.payload)) return s.state() != connection_state::ready;
        ++pub_seq;
        unacked.push_back(std::move(kept));
        queued_bytes -= bytes;
        outq.erase(outq.begin(), outq.begin() + static_cast<std::ptrdiff_t>(n));
        credit.notify_all();
        continue;
      }
      const std::size_t end = std::min(size, out.offset + room);
      const bool more = end < size;
      codec::publish p{pub_seq + 1, out.topic, out.part, more,
                       out.retain && !more && out.part == 0};
      sent kept{std::move(p), payload_frame{out.payload, out.offset, end - out.offset}};
      if (!s.send_ready(kept.msg, kept.payload)) return s.state() != connection_state::ready;
      ++pub_seq;
      unacked.push_back(std::move(kept));
      if (more) {
        out.offset = end;
        ++out.part;
      } else {
        queued_bytes -= size;
        outq.pop_front();
        credit.notify_all();
      }
    }
    return true;
  }

  // How many publications from the front of the queue go as one batch (SPEC §17.5.1): small
  // ones, none retained, on the front's topic, within the batch bounds; 1 when the front goes
  // alone.
  [[nodiscard]] std::size_t batchable() const {
    const auto small = [](const outgoing& o) {
      return o.part == 0 && !o.retain && o.payload->size() <= codec::batch_max_item_bytes;
    };
    const auto& front = outq.front();
    if (!small(front)) return 1;
    std::size_t n = 1;
    std::size_t bytes = codec::batch_item_head + front.payload->size();
    for (; n < outq.size() && n < codec::batch_max_items; ++n) {
      const auto& next = outq[n];
      if (!small(next) || next.topic != front.topic ||
          bytes + codec::batch_item_head + next.payload->size() > codec::batch_max_bytes)
        break;
      bytes += codec::batch_item_head + next.payload->size();
    }
    return n;
  }

  void on_message(codec::message&& m) {
    std::lock_guard lock(io.mu());
    if (const auto* w = std::get_if<codec::welcome>(&m)) {
      on_welcome(*w);
    } else if (const auto* c = std::get_if<codec::publish_credit>(&m)) {
      while (!unacked.empty() && unacked.front().msg.seq <= c->acked) {
        unacked.pop_front();
        resend_next = resend_next > 0 ? resend_next - 1 : 0;
        resend_end = resend_end > 0 ? resend_end - 1 : 0;
      }
      pub_acked = std::max(pub_acked, c->acked);
      pub_limit = std::max(pub_limit, c->limit);
      held_by = c->held_by.value_or(std::string());
      if (!credit_known) {  // the first credit of this connection: resend what it did not take
        credit_known = true;
        if (resend_pending) {
          resend_next = 0;
          resend_end = unacked.size();
          resend_pending = false;
        }
      }
      credit.notify_all();
    } else if (auto* a = std::get_if<codec::subscribed>(&m)) {
      const auto it = requests.find(a->req);
      if (it == requests.end()) return;  // a subscription made again after a new session
      if (!a->accepted) {
        if (const auto* sub = std::get_if<codec::subscribe>(&it->second.msg))
          subs.erase(sub_key{sub->prefix, sub->topic});
      }
      if (!it->second.waited) {
        requests.erase(it);
        return;
      }
      it->second.answer = std::move(*a);
      answers.notify_all();
    } else if (const auto* g = std::get_if<codec::bus_gap>(&m)) {
      spdlog::warn("bus {}: the broker dropped deliveries {}..{}", opts.id, g->first, g->last);
      inbox.gap(g->first, g->last);
    } else if (const auto* e = std::get_if<codec::error>(&m)) {
      ++errors;
      spdlog::warn("bus {}: the broker refused a message: {} {}: {}", opts.id, e->code,
                   codec::code_name(e->code), e->reason);
    }
  }

  // The core's lock held.
  void on_welcome(const codec::welcome& w) {
    max_message = w.max_message;
    credit_known = false;
    resend_next = resend_end = 0;
    if (w.resumed) {
      resend_pending = true;  // once the PUBLISH_CREDIT that follows says what was taken
    } else if (welcomed) {
      new_session();
    }
    welcomed = true;
    // Whatever waited in the outbox belongs to the old connection: the requests go again in
    // order, after the subscriptions a new session must make again.
    auto& out = io.outbox();
    out.clear();
    if (!w.resumed) {
      for (const auto& sub : subs) {
        const auto& key = sub.first;  // (a lambda cannot capture a structured binding in clang 14)
        const bool pending = std::any_of(requests.begin(), requests.end(), [&](const auto& r) {
          const auto* s = std::get_if<codec::subscribe>(&r.second.msg);
          return s != nullptr && s->prefix == key.first && s->topic == key.second;
        });
        if (!pending)
          out.push_back(codec::subscribe{++next_req, key.second, key.first, sub.second.echo});
      }
    }
    for (const auto& [req, r] : requests) out.push_back(r.msg);
  }

  // The core's lock held: the broker knows nothing of an earlier session of ours.
  void new_session() {
    ++sessions_lost;
    if (!unacked.empty() || inbox.partials() > 0)
      spdlog::warn(
          "bus {}: a new session: {} publications in flight and {} incomplete deliveries are "
          "lost",
          opts.id, unacked.size(), inbox.partials());
    unacked.clear();
    pub_seq = pub_acked = pub_limit = 0;
    resend_pending = false;
    // A publication half sent in the old session cannot be finished: it starts again.
    if (!outq.empty() && outq.front().part > 0) {
      outq.front().offset = 0;
      outq.front().part = 0;
    }
    inbox.new_session();
    credit.notify_all();
  }

  void on_payload(codec::message&& m, zmq::message_t&& payload) {
    const auto* d = std::get_if<codec::deliver>(&m);
    if (d == nullptr) return;
    std::lock_guard lock(io.mu());
    if (inbox.deliver(*d, {payload.data<char>(), payload.size()})) arrived.notify_one();
  }

  bus_options opts;
  client::detail::core io;
  // All that follows is guarded by io.mu().
  std::condition_variable answers;  // a SUBSCRIBED came, or closed
  std::condition_variable credit;   // room in the queue, acked grew, link changed, or closed
  std::condition_variable arrived;  // a publication for recv(), or closed
  bool closing = false;             // close() began
  bool closed = false;              // close() flushed: calls fail, recv() stops waiting
  bool welcomed = false;            // a WELCOME came once
  connection_state seen_state = connection_state::connecting;  // as the flush hook last saw it
  std::uint64_t max_message = 0;
  // subscriptions and requests
  std::map<sub_key, subscribe_options> subs;
  std::map<std::uint64_t, request> requests;
  std::uint64_t next_req = 0;
  // publishing
  std::deque<outgoing> outq;
  std::size_t queued_bytes = 0;  // payload bytes in outq
  std::deque<sent> unacked;
  std::uint64_t pub_seq = 0;    // the last PUBLISH seq used in this session
  std::uint64_t pub_acked = 0;  // the broker has taken up to here
  std::uint64_t pub_limit = 0;  // and we may send up to here
  bool credit_known = false;    // a PUBLISH_CREDIT came on this connection
  bool resend_pending = false;  // resumed: resend once the credit says what was taken
  std::size_t resend_next = 0;  // unacked[resend_next, resend_end) is still to resend
  std::size_t resend_end = 0;
  // receiving
  client::detail::bus_inbox inbox;
  std::uint64_t errors = 0;
  std::uint64_t sessions_lost = 0;
  std::string held_by;  // the subscriber the broker last said holds this node back
};

bus::bus(bus_options opts) : impl_(std::make_unique<impl>(std::move(opts))) {}
bus::~bus() = default;
bus::bus(bus&&) noexcept = default;
bus& bus::operator=(bus&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->close(std::chrono::seconds(5));
    impl_ = std::move(other.impl_);
  }
  return *this;
}

bus_result bus::subscribe(std::string_view topic, subscribe_options o,
                          std::chrono::milliseconds timeout) {
  return impl_->subscribe(topic, o, timeout);
}

bus_result bus::unsubscribe(std::string_view topic, bool prefix,
                            std::chrono::milliseconds timeout) {
  return impl_->unsubscribe(topic, prefix, timeout);
}

std::vector<std::pair<std::string, bool>> bus::subscriptions() const {
  std::lock_guard lock(impl_->io.mu());
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& [key, o] : impl_->subs) out.emplace_back(key.second, key.first);
  std::sort(out.begin(), out.end());
  return out;
}

bus_result bus::publish(std::string_view topic, std::string_view payload, publish_options o,
                        std::chrono::milliseconds timeout) {
  return impl_->publish(topic, payload, o, timeout);
}

bool bus::flush(std::chrono::milliseconds timeout) {
  return impl_->flush(timeout);
}

std::optional<bus_message> bus::recv() {
  return impl_->recv(forever);
}

std::optional<bus_message> bus::recv(std::chrono::milliseconds timeout) {
  return impl_->recv(timeout);
}

std::size_t bus::unsent() const {
  const std::lock_guard lock(impl_->io.mu());
  return impl_->not_taken();
}

std::size_t bus::close(std::chrono::milliseconds timeout) {
  return impl_ ? impl_->close(timeout) : 0;
}

bool bus::closed() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->closed;
}

connection_state bus::state() const {
  return impl_->io.state();
}

bool bus::wait_for(connection_state s, std::chrono::milliseconds timeout) const {
  return impl_->io.wait_for(s, timeout);
}

std::uint64_t bus::session() const {
  return impl_->io.token();
}

std::uint64_t bus::welcomes() const {
  return impl_->io.welcomes();
}

std::string bus::last_error() const {
  return impl_->io.last_error();
}

std::uint64_t bus::lost() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->inbox.lost();
}

std::uint64_t bus::sessions_lost() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->sessions_lost;
}

std::uint64_t bus::errors() const {
  std::lock_guard lock(impl_->io.mu());
  return impl_->errors;
}

const bus_options& bus::options() const {
  return impl_->opts;
}

}  // namespace rlbus
