// The broker loop. Read top to bottom it is the life of a connection: run() polls, drains
// the ROUTER, on_frames() checks framing and state, on_hello()/on_disconnect() make and end
// sessions, expiry runs from the peer table's deadline heap, begin_drain() closes the doors
// and shutdown() aborts what is left and says goodbye.
#include "broker/core/server.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "broker/core/settings.hpp"
#include "codec/codec.hpp"
#include "codec/map_writer.hpp"
#include "util/bind.hpp"
#include "util/log.hpp"
#include "util/poll.hpp"
#include "util/random.hpp"
#include "util/zmq_send.hpp"

namespace rlbus::broker {

namespace {

// What a log line about a peer names (util/log.hpp): a coordinator or a worker.
util::log_about about(std::string_view id, rlbus::role role) {
  if (role == rlbus::role::coordinator) return {.coordinator = id};
  return {.worker = id};
}

constexpr std::size_t max_batch = 1024;  // messages per poll wake-up before timers run
constexpr std::size_t max_unintroduced_tracked = 65'536;
constexpr std::uint32_t max_unintroduced_answers = 256;  // ERRORs to one sessionless connection
constexpr std::size_t max_labelled = 64;  // bus topics and nodes the metrics name, each

std::string_view topic_for(rlbus::role r, std::string_view what) {
  if (r == rlbus::role::bus)
    return what == "joined" ? "bus.joined" : what == "left" ? "bus.left" : "bus.lost";
  const bool coord = r == rlbus::role::coordinator;
  if (what == "joined")
    return coord ? codec::topic::coordinator_joined : codec::topic::worker_joined;
  if (what == "left") return coord ? codec::topic::coordinator_left : codec::topic::worker_left;
  return coord ? codec::topic::coordinator_lost : codec::topic::worker_lost;
}

std::string resources_text(const rlbus::resources& res) {
  std::string out;
  for (const auto& [k, v] : res) out += fmt::format("{}{}={}", out.empty() ? "" : " ", k, v);
  return out.empty() ? "none" : out;
}

}  // namespace

server::server(zmq::context_t& ctx, config cfg)
    : ctx_(ctx),
      cfg_((validate(cfg), std::move(cfg))),
      epoch_(util::random_u64_nonzero()),
      gate_(ctx, cfg_),
      meter_(cfg_.max_connection_bytes, cfg_.memory_budget),
      router_(ctx, zmq::socket_type::router),
      events_(
          ctx, normalize_endpoint(cfg_.events_endpoint), epoch_,
          [this](zmq::socket_t& s) { return gate_.secure(s, zap_domain_events); },
          [this](int handle) { gate_.release(handle); }),
      tasks_(cfg_, *this),
      bus_(cfg_, *this) {
  if (!cfg_.journal_path.empty()) open_journal();  // before anyone can connect
  router_.set(zmq::sockopt::router_mandatory, 1);
  router_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(cfg_.max_message));
  router_.set(zmq::sockopt::linger, 0);
  router_.set(zmq::sockopt::sndhwm, 100'000);
  router_.set(zmq::sockopt::rcvhwm, 100'000);
  const auto watch = gate_.secure(router_, zap_domain_router);
  try {
    util::bind_freed(router_, normalize_endpoint(cfg_.router_endpoint));
  } catch (...) {
    gate_.release(watch);  // before the socket closes (gatekeeper.hpp)
    throw;
  }
  router_endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  events_endpoint_ = events_.endpoint();
}

server::~server() {
  gate_.release_all();  // before the sockets close (gatekeeper.hpp)
}

// Takes up what the journal holds, then starts it afresh with just that (a compaction), so a
// torn tail is gone and the file starts small.
void server::open_journal() {
  journal_ = std::make_unique<journal>(cfg_.journal_path, cfg_.journal_fsync, cfg_.limits,
                                       cfg_.journal_compact_bytes);
  const auto& js = journal_->loaded();
  if (!js.torn.empty())
    spdlog::warn(
        "journal {}: {}; it was skipped (a write the crash cut short), and the file "
        "as read is kept as {}",
        journal_->path(), js.torn, js.torn_kept);
  spdlog::info("journal {} (fsync {}): {} records, {} bytes", journal_->path(),
               to_string(cfg_.journal_fsync), js.records, js.bytes);
  if (cfg_.coordinator_grace_ms == 0 && !js.tasks.empty())
    spdlog::warn(
        "coordinator grace is 0: the {} journaled tasks are cancelled, as nobody can "
        "adopt them",
        js.tasks.size());
  tasks_.restore(js, util::clock::now());
  counters_.restored.store(js.tasks.size(), std::memory_order_relaxed);
  counters_.journal_torn.store(js.torn.empty() ? 0 : 1, std::memory_order_relaxed);
  compact_journal();
  tasks_.attach(journal_.get());
}

// The journal written afresh with the live state alone.
void server::compact_journal() {
  journal_->compact([this](journal& j) { tasks_.write_snapshot(j); });
}

void server::request_reload() noexcept {
  reload_requests_.fetch_add(1, std::memory_order_relaxed);
  wake_.notify();
}

void server::request_stop() noexcept {
  stop_requests_.fetch_add(1, std::memory_order_relaxed);
  wake_.notify();
}

void server::run() {
  spdlog::info("rlbus broker v{}: router {} events {} (epoch {:016x})", codec::protocol_version,
               router_endpoint_, events_endpoint_, epoch_);
  if (gate_.curve())
    spdlog::info("CURVE on: broker public key {}; allowlist {}", gate_.public_key(),
                 cfg_.allowlist_path);
  else if (cfg_.insecure &&
           !(loopback_endpoint(cfg_.router_endpoint) && loopback_endpoint(cfg_.events_endpoint) &&
             (cfg_.metrics_port == 0 || loopback_host(cfg_.metrics_address))))
    spdlog::warn(
        "--insecure: serving other machines without CURVE; anyone who can reach the ports can "
        "join as any peer, submit tasks, read every event and the metrics (router {}, events "
        "{}, metrics {})",
        router_endpoint_, events_endpoint_,
        cfg_.metrics_port == 0 ? std::string("off")
                               : fmt::format("{}:{}", cfg_.metrics_address, cfg_.metrics_port));
  started_ = util::clock::now();
  next_status_ = started_;
  std::vector<zmq::pollitem_t> items;
  std::string why_stopped;
  struct closing {  // however run() ends, whoever asks the loop stops waiting
    loop_queries& q;
    ~closing() { q.close(); }
  } const close_queries{queries_};
  while (true) {
    auto now = util::clock::now();
    if (past_fence()) break;
    const auto stops = stop_requests_.load(std::memory_order_relaxed);
    if (stops > 0 && !draining_) {
      // A leader whose standbys hold all it accepted hands its tasks over to them rather than
      // drain and cancel them: the group goes on with every task (SPEC §14.10.7).
      if (repl_) handing_over_to_ = repl_->successors();
      if (!handing_over_to_.empty()) break;
      begin_drain(now);
    }
    if (stops > 1) {
      why_stopped = "broker shutting down: stopped again before its running tasks ended";
      break;
    }
    if (draining_ && tasks_.live() == 0) break;
    if (draining_ && now >= drain_end_) {
      why_stopped = fmt::format("broker shutting down: its drain of {} ms ran out", cfg_.drain_ms);
      break;
    }
    auto deadline = next_status_;
    if (auto check = peers_.next_check()) deadline = std::min(deadline, *check);
    if (auto due = tasks_.next_deadline()) deadline = std::min(deadline, *due);
    if (journal_)
      if (auto due = journal_->next_due()) deadline = std::min(deadline, *due);
    if (draining_) deadline = std::min(deadline, drain_end_);
    if (fence_) deadline = std::min(deadline, fence_());
    if (repl_) deadline = std::min(deadline, repl_->next_due());
    deadline = std::min(deadline, gate_.next_sweep());
    if (gate_.awaits_drain()) deadline = now;  // a cut connection ended: read the ROUTER now
    // Built each turn: the event socket is a new one after a subscriber's key was revoked.
    items.assign({{router_.handle(), 0, ZMQ_POLLIN, 0},
                  {nullptr, wake_.read_fd(), ZMQ_POLLIN, 0},
                  {events_.handle(), 0, ZMQ_POLLIN, 0},
                  {repl_ ? repl_->socket().handle() : nullptr, repl_ ? 0 : -1, ZMQ_POLLIN, 0}});
    gate_.poll_items(items);
    util::poll(items.data(), items.size(), util::poll_timeout_ms(now, deadline));
    if ((items[1].revents & ZMQ_POLLIN) != 0) wake_.drain();
    // The door first: a connection is let in (or not) before its first message is read.
    if (std::any_of(items.begin() + 4, items.end(),
                    [](const zmq::pollitem_t& i) { return (i.revents & ZMQ_POLLIN) != 0; }))
      gate_.on_readable();
    if (const auto r = reload_requests_.load(std::memory_order_relaxed); r != reloads_done_) {
      reloads_done_ = r;
      reload_allowlist();
    }
    // Subscriptions first: an event made in this round goes to whoever asked by now.
    if ((items[2].revents & ZMQ_POLLIN) != 0) events_.read_subscriptions();
    now = util::clock::now();
    if (repl_ && (items[3].revents & ZMQ_POLLIN) != 0) repl_->on_readable(now);
    if ((items[0].revents & ZMQ_POLLIN) != 0 || gate_.awaits_drain()) drain_router();
    now = util::clock::now();
    if (now >= gate_.next_sweep()) {
      // Nothing left to read is as good as read to the end (it may never have had a message).
      if ((router_.get(zmq::sockopt::events) & ZMQ_POLLIN) == 0) gate_.router_drained();
      gate_.sweep_inbound(now);
    }
    bus_.end_of_turn();
    peers_.expire(now, [this](const peer& p) {
      const util::log_scope log(about(p.id, p.role));
      counters_.expired.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("peer {} ({}) expired: silent for more than {} ms", p.id, to_string(p.role),
                   std::chrono::duration_cast<std::chrono::milliseconds>(p.window).count());
      end_session(p, codec::error_code::expired, "no message within the liveness window", true);
    });
    tasks_.on_timers(now);
    if (journal_) {
      journal_->on_timer(now);
      if (journal_->wants_compaction()) compact_journal();
    }
    if (now >= next_status_) {
      gate_.on_readable();  // besides its descriptors' signals (gatekeeper::poll_items)
      if (gate_.allowlist_changed()) reload_allowlist();
      forget_coordinator_keys();
      cut_stalled(now);
      meter_.prune();
      tasks_.pump_streams();
      bus_.pump(now);
      publish_status(now);
    }
    if (repl_) {
      repl_->push(util::clock::now());
      release_held();
    }
    store_counters();
    queries_.serve([this](const codec::ops& op) { return answer_query(op); });
  }
  if (fenced_) {
    // Whatever libzmq still holds for peers is dropped with the sockets.
    router_.set(zmq::sockopt::linger, 0);
    events_.set_linger(0);
    store_counters();
    return;
  }
  shutdown(why_stopped);
}

void server::fence(std::function<util::time_point()> until, std::uint64_t leader_epoch,
                   replicator_config replication) {
  fence_ = std::move(until);
  leader_epoch_ = leader_epoch;
  if (!journal_ || replication.endpoint.empty()) return;
  replication.leader_epoch = leader_epoch;
  replication.sync_timeout = std::chrono::milliseconds(cfg_.cluster_sync_timeout_ms);
  replication.max_message = cfg_.max_message;
  replication.wake = [this] { wake_.notify(); };
  repl_ = std::make_unique<replicator>(ctx_, gate_, std::move(replication), *journal_);
}

std::vector<replicator::standby_state> server::standbys() const {
  return repl_ ? repl_->standbys() : std::vector<replicator::standby_state>{};
}

bool server::holding() {
  if (!repl_) return false;
  if (!held_.empty()) return true;
  if (repl_->held_by_all() >= journal_->position()) return false;
  repl_->push(util::clock::now());  // the records go out before what depends on them waits
  return true;
}

void server::emit(zmq::message_t&& frame, bool more) {
  if (held_open_) {
    held_.back().frames.push_back(std::move(frame));
    held_open_ = more;
    return;
  }
  router_.send(frame, more ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

void server::release_held() {
  if (held_.empty()) return;
  const auto held_by_all = repl_->held_by_all();
  while (!held_.empty() && held_.front().position <= held_by_all && !past_fence()) {
    auto& h = held_.front();
    if (h.event) {
      events_.publish(h.event->first, std::move(h.event->second));
    } else {
      try {
        if (router_.send(h.frames[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
          for (std::size_t i = 1; i < h.frames.size(); ++i)
            router_.send(h.frames[i], i + 1 < h.frames.size() ? zmq::send_flags::sndmore
                                                              : zmq::send_flags::none);
        } else {
          counters_.unroutable.fetch_add(1, std::memory_order_relaxed);
        }
      } catch (const zmq::error_t& e) {
        if (e.num() != EHOSTUNREACH) throw;
        counters_.unroutable.fetch_add(1, std::memory_order_relaxed);  // connection is gone
      }
    }
    held_.pop_front();
  }
}

void server::settle_held() {
  if (!repl_ || held_.empty()) return;
  const auto until = util::clock::now() + std::chrono::milliseconds(cfg_.cluster_sync_timeout_ms);
  while (!held_.empty() && util::clock::now() < until && !past_fence()) {
    zmq::pollitem_t item{repl_->socket().handle(), 0, ZMQ_POLLIN, 0};
    util::poll(&item, 1, 10);
    const auto now = util::clock::now();
    repl_->on_readable(now);
    repl_->push(now);
    release_held();
  }
  if (!held_.empty())
    spdlog::warn("stopped with {} messages that no standby confirmed: they are not sent",
                 held_.size());
  held_.clear();
}

bool server::past_fence() {
  if (fenced_) return true;
  if (!fence_ || util::clock::now() < fence_()) return false;
  fenced_ = true;
  spdlog::warn(
      "no longer the group's leader: its lease may run out, so it sends nothing more; its "
      "peers go to the next leader");
  return true;
}

// Each message is handled at the time it was read: a deadline it starts (a step's timeout, a
// session's liveness) never begins before its message came, however long the batch.
void server::drain_router() {
  util::frame_array frames;
  for (std::size_t n = 0; n < max_batch; ++n) {
    if (!util::try_recv(router_, frames[0])) {
      gate_.router_drained();
      return;
    }
    const auto [count, overflow] = util::read_rest(router_, frames);
    counters_.messages_in.fetch_add(1, std::memory_order_relaxed);
    on_frames(frames.data(), count, overflow, util::clock::now());
  }
}

void server::on_frames(zmq::message_t* frames, std::size_t count, bool overflow,
                       util::time_point now) {
  const std::string routing_id(frames[0].to_string_view());
  // Which connection this is, for cutting it should it stop reading (SPEC §15.5).
  const int fd = count >= 2 ? frames[1].get(ZMQ_SRCFD) : -1;
  meter_.seen(routing_id, fd);
  gate_.delivered(fd);
  from_ = {routing_id, fd};
  peer* p = peers_.by_routing(routing_id);
  if (p != nullptr) p->last_seen = now;  // anything from a session's connection is a sign of life
  const util::log_scope log(p == nullptr ? util::log_about{} : about(p->id, p->role));
  // Two frames after the routing id, or three for a message with a payload (SPEC §17.1.1).
  const auto header = count >= 2 ? codec::parse_header(frames[1].to_string_view()) : std::nullopt;
  const bool with_payload = header && codec::has_payload_frame(header->type);
  if (overflow || count != (with_payload ? 4U : 3U)) {
    return fault(routing_id, p, codec::error_code::bad_frame,
                 with_payload
                     ? fmt::format("{} takes 3 frames after the routing id (header, body, "
                                   "payload), got {}",
                                   codec::type_name(header->type).value_or("?"), count - 1)
                     : fmt::format("expected 2 frames after the routing id (header, body), got {}",
                                   overflow ? "more than 3" : std::to_string(count - 1)),
                 std::nullopt);
  }
  if (header) counters_.received_by_type[header->type].fetch_add(1, std::memory_order_relaxed);
  if (!header) {
    return fault(routing_id, p, codec::error_code::bad_frame,
                 "header frame must be 4 bytes: 'R' 'L' version type", std::nullopt);
  }
  if (header->version != codec::protocol_version) {
    return fault(routing_id, p, codec::error_code::version_mismatch,
                 fmt::format("this broker speaks protocol version {}, the message has version {}",
                             codec::protocol_version, header->version),
                 header->type);
  }
  const auto type = static_cast<codec::msg_type>(header->type);
  // Operators need no session (§16.1).
  if (type == codec::msg_type::ops) return on_ops(routing_id, p, frames[2], now);
  if (p == nullptr && type != codec::msg_type::hello) {
    if (!codec::type_name(header->type)) {
      return fault(routing_id, p, codec::error_code::unknown_type,
                   fmt::format("unknown message type 0x{:02x}", header->type), header->type);
    }
    return fault(routing_id, p, codec::error_code::not_ready, "introduce yourself with HELLO first",
                 header->type);
  }
  // A node of the bus sends no task message (SPEC §12.1.3): refused once its body is read.
  const auto not_for_nodes = [&] {
    fault(routing_id, p, codec::error_code::unknown_type,
          fmt::format("{} is a task message: a node of the bus sends none",
                      codec::type_name(header->type).value_or("?")),
          header->type);
  };
  if (type == codec::msg_type::data) {  // the hot path: read in place, never copied
    const auto d = codec::read_data(frames[2].to_string_view(), cfg_.limits);
    if (!d) return fault(routing_id, p, d.error().code, d.error().reason, header->type);
    if (p->role == rlbus::role::bus) return not_for_nodes();
    counters_due_ = true;
    return task_result(routing_id, p, tasks_.on_data(p->id, p->role, d.value(), now), header->type);
  }
  if (codec::is_bus_type(header->type))
    return on_bus(routing_id, *p, header->type, frames[2].to_string_view(),
                  with_payload ? &frames[3] : nullptr);
  auto decoded = codec::decode_body(header->type, frames[2].to_string_view(), cfg_.limits);
  if (!decoded) {
    const auto& err = decoded.error();
    return fault(routing_id, p, err.code, err.reason, header->type);
  }
  auto& msg = decoded.value();
  if (codec::is_task_type(header->type)) {
    if (p->role == rlbus::role::bus) return not_for_nodes();
    counters_due_ = true;
    return task_result(routing_id, p, tasks_.handle(p->id, p->role, std::move(msg), now),
                       header->type);
  }
  switch (type) {
    case codec::msg_type::hello: {
      // A connection cut at accept for a limit may have said HELLO before the cut: it never
      // gets a session (its WELCOME would be lost, and the session would hold its id).
      if (p == nullptr) {
        const int fd = frames[1].get(ZMQ_SRCFD);  // a frame off the wire
        if (fd >= 0 && gate_.cut_off(fd)) {
          counters_.cut_hellos.fetch_add(1, std::memory_order_relaxed);
          return;
        }
      }
      // The connection's key, as the ZAP handler named it (SPEC §15.2).
      std::string key;
      if (gate_.curve())
        // message_t::gets reads the connection's metadata; it is not C's gets.
        // NOLINTNEXTLINE(clang-analyzer-security.insecureAPI.gets)
        if (const char* k = frames[2].gets("User-Id")) key = k;
      return on_hello(routing_id, p, std::move(std::get<codec::hello>(msg)), std::move(key), now);
    }
    case codec::msg_type::heartbeat:
      (void)send(routing_id, codec::heartbeat{});
      return;
    case codec::msg_type::disconnect:
      return on_disconnect(*p, std::get<codec::disconnect>(msg));
    default:
      return fault(routing_id, p, codec::error_code::unknown_type,
                   codec::is_replication_type(header->type)
                       ? fmt::format("{} travels between the brokers of a group, on the "
                                     "leader's replication endpoint, never on this one",
                                     codec::type_name(header->type).value_or("?"))
                       : fmt::format("{} is sent by the broker, never to it",
                                     codec::type_name(header->type).value_or("?")),
                   header->type);
  }
}

std::optional<std::string> server::hello_forbidden(const codec::hello& h,
                                                   const std::string& key) const {
  if (!gate_.curve()) return std::nullopt;
  const auto* e = gate_.entry(key);
  if (e == nullptr) return std::string("this connection's key is no longer in the allowlist");
  if (!e->allows(h.role))
    return fmt::format("key '{}' may not be a {}", e->name, to_string(h.role));
  if (!e->allows(h.role, h.id))
    return fmt::format("key '{}' may not use id '{}' (it may use: {})", e->name, h.id,
                       fmt::join(e->ids, ", "));
  if (const peer* live = peers_.by_id(h.id); live != nullptr && live->key != key)
    return fmt::format("id '{}' belongs to a live session of another key", h.id);
  if (h.role == rlbus::role::coordinator && tasks_.orphaned(h.id))
    if (const auto it = coordinator_keys_.find(h.id);
        it != coordinator_keys_.end() && it->second != key)
      return fmt::format("id '{}' has tasks waiting for a coordinator of another key", h.id);
  return std::nullopt;
}

void server::on_hello(const std::string& routing_id, peer* current, codec::hello&& h,
                      std::string key, util::time_point now) {
  const util::log_scope log(about(h.id, h.role));
  // Draining (SPEC §8.3 rule 2): sessions that exist go on, new ones are refused.
  if ((draining_ || stop_requests_.load(std::memory_order_relaxed) > 0) && current == nullptr &&
      peers_.by_id(h.id) == nullptr)
    return refuse_hello(routing_id, codec::error_code::busy,
                        "broker is shutting down: it accepts no new sessions");
  const auto hb = std::clamp(h.heartbeat_ms, cfg_.heartbeat_min_ms, cfg_.heartbeat_max_ms);
  const auto welcome_for = [&](const peer& p, bool resumed,
                               std::optional<std::uint64_t> stream_acked = std::nullopt) {
    return codec::welcome{p.session,        epoch_,  p.heartbeat_ms, cfg_.liveness,
                          cfg_.max_message, resumed, stream_acked,   leader_epoch_};
  };
  // What a HELLO may change in a session that goes on: timings and resources.
  const auto renew = [&](peer& p) {
    p.heartbeat_ms = hb;
    p.window = std::chrono::milliseconds(std::uint64_t{hb} * cfg_.liveness);
    p.resources = std::move(h.resources);
    p.last_seen = now;
    peers_.reschedule(p);
    tasks_.peer_resources(p.id, p.resources, now);
  };

  if (current != nullptr) {  // this connection already has a session
    if (current->id != h.id || current->role != h.role) {
      return fault(routing_id, current, codec::error_code::bad_field,
                   fmt::format("this connection is already '{}'; open a new one for '{}'",
                               current->id, h.id),
                   static_cast<std::uint8_t>(codec::msg_type::hello));
    }
    renew(*current);
    (void)send(routing_id, welcome_for(*current, true));
    if (current->role == rlbus::role::bus) bus_.node_welcomed_again(current->id);
    return;
  }
  if (auto why = hello_forbidden(h, key)) {
    counters_.refused_unauthorized.fetch_add(1, std::memory_order_relaxed);
    return refuse_hello(routing_id, codec::error_code::unauthorized, std::move(*why));
  }

  if (peer* live = peers_.by_id(h.id)) {
    if (!h.session || *h.session != live->session || live->role != h.role) {
      const auto silent =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - live->last_seen);
      return refuse_hello(
          routing_id, codec::error_code::duplicate_id,
          fmt::format("id '{}' belongs to a live session (last heard {} ms ago, expires after "
                      "{} ms of silence); resume it with its session token or use another id",
                      h.id, silent.count(),
                      std::chrono::duration_cast<std::chrono::milliseconds>(live->window).count()));
    }
    // The same session on a new connection: the newer connection wins.
    (void)send(live->routing_id,
               codec::disconnect{static_cast<std::uint16_t>(codec::error_code::replaced),
                                 "session resumed on a newer connection"});
    peers_.rebind(*live, routing_id);
    renew(*live);
    live->faults = 0;
    spdlog::info("peer {} ({}) resumed session #{} on a new connection", live->id,
                 to_string(live->role), live->serial);
    (void)send(routing_id, welcome_for(*live, true));
    publish(topic_for(live->role, "joined"),
            codec::peer_joined{live->id, live->role, live->serial, live->resources, true});
    // What a node was sent on the old connection and has not acknowledged, again (§17.4.3).
    if (live->role == rlbus::role::bus) return bus_.node_resumed(live->id);
    // Changes sent while the old connection was cut were lost: the counts again (§12.10.4).
    if (live->role == rlbus::role::coordinator) send_snapshot(*live);
    // After the WELCOME: a collector learns what the broker relayed of its task (§12.11), a
    // coordinator's stream waits for its REPLAY (§12.9.7).
    tasks_.peer_resumed(live->id);
    return;
  }

  if (peers_.size() >= cfg_.max_peers) {
    return refuse_hello(routing_id, codec::error_code::busy,
                        fmt::format("broker holds its maximum of {} sessions", cfg_.max_peers));
  }
  const auto role_limit = h.role == rlbus::role::coordinator ? cfg_.max_coordinators
                          : h.role == rlbus::role::learner   ? cfg_.max_learners
                          : h.role == rlbus::role::bus       ? cfg_.bus_max_nodes
                                                             : cfg_.max_collectors;
  const auto role_count = h.role == rlbus::role::coordinator ? coordinators_.size()
                          : h.role == rlbus::role::bus       ? live_nodes_
                                                             : live_workers_[worker_slot(h.role)];
  if (role_count >= role_limit) {
    counters_.refused_role_limit.fetch_add(1, std::memory_order_relaxed);
    return refuse_hello(
        routing_id, codec::error_code::busy,
        fmt::format("broker holds its maximum of {} {} sessions", role_limit, to_string(h.role)));
  }
  peer p;
  p.routing_id = routing_id;
  p.id = std::move(h.id);
  p.role = h.role;
  p.resources = std::move(h.resources);
  p.session = util::random_u64_nonzero();
  p.serial = ++last_serial_;
  p.heartbeat_ms = hb;
  p.window = std::chrono::milliseconds(std::uint64_t{hb} * cfg_.liveness);
  p.joined = now;
  p.last_seen = now;
  p.key = std::move(key);
  unintroduced_.erase(routing_id);
  const peer& added = peers_.insert(std::move(p));
  counters_.peers.store(peers_.size(), std::memory_order_relaxed);
  spdlog::info("peer {} ({}) joined: session #{}, heartbeat {} ms, resources {}", added.id,
               to_string(added.role), added.serial, added.heartbeat_ms,
               resources_text(added.resources));
  // A coordinator's new session takes over what an earlier one of its id left (§12.5.8).
  const auto adopted =
      added.role == rlbus::role::coordinator ? tasks_.adopt(added.id) : std::nullopt;
  (void)send(routing_id, welcome_for(added, false, adopted));
  publish(topic_for(added.role, "joined"),
          codec::peer_joined{added.id, added.role, added.serial, added.resources, false});
  if (added.role == rlbus::role::bus) {  // a node of the bus has no part in tasks
    ++live_nodes_;
    bus_.node_joined(added.id);
    return;
  }
  if (added.role == rlbus::role::coordinator) {
    coordinators_.insert(added.id);
    if (gate_.curve()) coordinator_keys_[added.id] = added.key;
    send_snapshot(added);
  } else {
    capacity_changed(added, true);  // before the new worker can be given a task
  }
  tasks_.peer_joined(added.id, added.role, added.resources, added.serial, now);
}

// A new allowlist in force: sessions whose key lost the right to what they are end now
// (DISCONNECT 431), and if a subscriber's key lost its right, the event socket is opened
// afresh so that every subscriber passes the door again.
void server::reload_allowlist() {
  if (!gate_.reload_allowlist()) return;
  std::vector<std::string> revoked;
  peers_.for_each([&](const peer& p) {
    const auto* e = gate_.entry(p.key);
    if (e == nullptr || !e->allows(p.role, p.id)) revoked.push_back(p.id);
  });
  for (const auto& id : revoked) {
    const peer& p = *peers_.by_id(id);
    spdlog::warn("peer {} ({}): its key was revoked; session ended", p.id, to_string(p.role));
    counters_.revoked.fetch_add(1, std::memory_order_relaxed);
    forget_session(p, codec::error_code::unauthorized, "this peer's key was revoked");
  }
  if (gate_.subscriber_revoked()) {
    spdlog::warn("a subscriber's key was revoked: reopening the event socket");
    gate_.forget_subscribers();
    events_.reopen();
  }
}

// Coordinator ids with no session and nothing left to adopt need no key remembered.
void server::forget_coordinator_keys() {
  if (coordinator_keys_.size() <= coordinators_.size()) return;
  for (auto it = coordinator_keys_.begin(); it != coordinator_keys_.end();)
    it = coordinators_.count(it->first) == 0 && !tasks_.orphaned(it->first)
             ? coordinator_keys_.erase(it)
             : std::next(it);
}

void server::on_disconnect(const peer& p, const codec::disconnect& d) {
  spdlog::info("peer {} ({}) left: {} {}", p.id, to_string(p.role), d.code,
               d.reason.empty() ? "(no reason given)" : d.reason);
  publish(topic_for(p.role, "left"), codec::peer_gone{p.id, p.role, p.serial, d.code, d.reason});
  session_over(p, util::clock::now(), true);
  peers_.erase(p);
  counters_.peers.store(peers_.size(), std::memory_order_relaxed);
}

void server::fault(std::string_view routing_id, peer* p, codec::error_code code, std::string reason,
                   std::optional<std::uint8_t> ref_type, bool strike) {
  counters_.faults.fetch_add(1, std::memory_order_relaxed);
  count_error(code);
  if (reason.size() > codec::max_reason_length) reason.resize(codec::max_reason_length);
  const auto code_num = static_cast<std::uint16_t>(code);
  if (p == nullptr) {
    // A connection without a session is answered so many times, then cut: one that sends
    // garbage and never reads would otherwise fill its send queue with our ERRORs, and one
    // that sends faster than the broker reads fills libzmq's queue of it (SPEC §10.4). What
    // it had queued by then is read and counted, unanswered. The count is kept for the last
    // 64 K such connections.
    if (unintroduced_.size() >= max_unintroduced_tracked) unintroduced_.clear();
    const auto n = ++unintroduced_[std::string(routing_id)];
    if (n > max_unintroduced_answers) {
      counters_.unanswered.fetch_add(1, std::memory_order_relaxed);
      if (n == max_unintroduced_answers + 1 && routing_id == from_.routing_id && from_.fd >= 0)
        if (const auto address = gate_.cut(from_.fd)) {
          counters_.fault_cut.fetch_add(1, std::memory_order_relaxed);
          spdlog::debug("cut the connection from {}: {} faults without a session", *address,
                        max_unintroduced_answers);
        }
      return;
    }
  }
  if (p == nullptr || !strike) {
    spdlog::debug("refused a message from {}: {} {}", p ? p->id : "an unintroduced connection",
                  code_num, reason);
    (void)send(routing_id, codec::error{code_num, std::move(reason), ref_type});
    return;
  }
  spdlog::warn("peer {}: refused a message: {} {} (fault {} of {})", p->id, code_num, reason,
               p->faults + 1, cfg_.max_faults);
  (void)send(routing_id, codec::error{code_num, std::move(reason), ref_type});
  if (++p->faults >= cfg_.max_faults) {
    forget_session(*p, codec::error_code::too_many_faults,
                   fmt::format("{} bad messages", p->faults));
  }
}

void server::count_error(codec::error_code code) {
  const auto n = static_cast<unsigned>(code);
  if (n >= 400 && n < 600)
    counters_.errors_by_code[n - 400].fetch_add(1, std::memory_order_relaxed);
}

void server::refuse_hello(std::string_view routing_id, codec::error_code code, std::string reason) {
  counters_.refused_hellos.fetch_add(1, std::memory_order_relaxed);
  counters_.faults.fetch_add(1, std::memory_order_relaxed);
  count_error(code);
  spdlog::warn("refused a HELLO: {} {}", static_cast<unsigned>(code), reason);
  (void)send(routing_id, codec::error{static_cast<std::uint16_t>(code), std::move(reason),
                                      static_cast<std::uint8_t>(codec::msg_type::hello)});
}

// Says DISCONNECT (best effort: the peer may be gone) and publishes *.lost or *.left.
// The caller erases the session.
void server::end_session(const peer& p, codec::error_code code, std::string reason, bool lost) {
  const util::log_scope log(about(p.id, p.role));
  const auto code_num = static_cast<std::uint16_t>(code);
  (void)send(p.routing_id, codec::disconnect{code_num, reason});
  publish(topic_for(p.role, lost ? "lost" : "left"),
          codec::peer_gone{p.id, p.role, p.serial, code_num, std::move(reason)});
  session_over(p, util::clock::now());
}

void server::forget_session(const peer& p, codec::error_code code, std::string reason) {
  end_session(p, code, std::move(reason), true);
  peers_.erase(p);
  counters_.peers.store(peers_.size(), std::memory_order_relaxed);
}

// A connection that reads nothing of what it is sent holds its bytes until it ends: with the
// budget short, those that have not read for stalled-timeout are cut (SPEC §15.5).
void server::cut_stalled(util::time_point now) {
  if (cfg_.stalled_timeout_ms == 0) return;
  const auto since = now - util::milliseconds(cfg_.stalled_timeout_ms);
  for (const int fd : meter_.stalled(since, tasks_.ring_bytes())) {
    const auto address = gate_.cut(fd);
    if (!address) continue;
    counters_.stalled_cut.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn(
        "cut the connection from {}: it read nothing of what it was sent for {} ms while "
        "the send queues held more than half of memory-budget ({} bytes)",
        *address, cfg_.stalled_timeout_ms, meter_.total());
  }
}

util::send_meter::account* server::send_head(std::string_view routing_id, codec::msg_type type,
                                             std::size_t body) {
  // A snapshot taken once a peer has heard of a task step includes what the step changed
  // before that message left: the counters are stored before its first message.
  if (counters_due_) {
    counters_due_ = false;
    store_counters();
  }
  if (past_fence()) return nullptr;
  auto& account = meter_.of(routing_id);
  if (account.fd() < 0 && routing_id == from_.routing_id) account.set_fd(from_.fd);
  // the queues and the rings share one budget
  if (!meter_.admits(account, body, tasks_.ring_bytes())) {
    // What this connection has not read, or all of them, is at its bound (SPEC §15.5).
    counters_.unroutable.fetch_add(1, std::memory_order_relaxed);
    counters_.over_bytes.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const auto header = codec::make_header(type);
  if (holding()) {
    held h{journal_->position(), {}, std::nullopt};
    h.frames.emplace_back(routing_id.data(), routing_id.size());
    h.frames.emplace_back(header.data(), header.size());
    held_.push_back(std::move(h));
    held_open_ = true;
    counters_.sent_by_type[static_cast<std::uint8_t>(type)].fetch_add(1, std::memory_order_relaxed);
    return &account;
  }
  try {
    if (!router_.send(zmq::buffer(routing_id),
                      zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      counters_.unroutable.fetch_add(1, std::memory_order_relaxed);  // peer's queue is full
      return nullptr;
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != EHOSTUNREACH) throw;
    counters_.unroutable.fetch_add(1, std::memory_order_relaxed);  // connection is gone
    return nullptr;
  }
  router_.send(zmq::buffer(header), zmq::send_flags::sndmore);
  counters_.sent_by_type[static_cast<std::uint8_t>(type)].fetch_add(1, std::memory_order_relaxed);
  return &account;
}

bool server::send(std::string_view routing_id, const codec::message& m) {
  out_.clear();
  codec::encode_body(m, out_);
  auto* account = send_head(routing_id, codec::type_of(m), out_.size());
  if (account == nullptr) return false;
  emit(util::charged_frame(meter_, *account, out_), false);
  counters_.messages_out.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void server::task_result(std::string_view routing_id, peer* p, std::optional<refusal> refused,
                         std::uint8_t type) {
  counters_due_ = false;
  store_counters();  // and what the step changed after its first message left
  // A late message about a task that moved on is normal after a re-assignment, a cancel or a
  // close: refused and counted, but no strike against the peer (SPEC §12.5.5).
  if (refused)
    fault(routing_id, p, refused->code, std::move(refused->reason), type, !refused->late);
}

// Whatever the session held (a worker's task, a coordinator's tasks) is settled before the
// session is forgotten. The caller erases the peer afterwards.
void server::session_over(const peer& p, util::time_point now, bool orderly) {
  if (p.role == rlbus::role::bus) {
    --live_nodes_;
    bus_.node_gone(p.id);
    return;
  }
  tasks_.peer_gone(p.id, p.role, now, orderly);
  if (p.role == rlbus::role::coordinator) {
    coordinators_.erase(p.id);
  } else {
    capacity_changed(p, false);
  }
}

void server::capacity_changed(const peer& worker, bool increase) {
  auto& count = live_workers_[worker_slot(worker.role)];
  count = increase ? count + 1 : count - 1;
  const auto change =
      increase ? codec::capacity_change::increase : codec::capacity_change::decrease;
  const codec::capacity m{worker.role, change, worker.id, count};
  for (const auto& id : coordinators_) (void)send_to(id, m);
  publish(worker.role == rlbus::role::learner ? codec::topic::capacity_learner
                                              : codec::topic::capacity_collector,
          codec::capacity_status{worker.role, change, worker.id, count});
}

void server::send_snapshot(const peer& coordinator) {
  for (const auto kind : {rlbus::role::collector, rlbus::role::learner})
    (void)send(coordinator.routing_id, codec::capacity{kind, codec::capacity_change::snapshot, "",
                                                       live_workers_[worker_slot(kind)]});
}

bool server::send_to(std::string_view peer_id, const codec::message& m) {
  const peer* p = peers_.by_id(peer_id);
  return p != nullptr && send(p->routing_id, m);
}

bool server::send_encoded(std::string_view peer_id, codec::msg_type type,
                          const util::shared_frame& body) {
  const peer* p = peers_.by_id(peer_id);
  if (p == nullptr) return false;
  auto* account = send_head(p->routing_id, type, body.size());
  if (account == nullptr) return false;
  emit(body.charged(meter_, *account), false);
  counters_.messages_out.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool server::send_delivery(std::string_view peer_id, const codec::deliver& d,
                           const payload_ref& payload) {
  const peer* p = peers_.by_id(peer_id);
  if (p == nullptr) return false;
  out_.clear();
  codec::encode_body(codec::message{d}, out_);
  const auto size = payload ? payload->size() : 0;
  auto* account = send_head(p->routing_id, codec::msg_type::deliver, out_.size() + size);
  if (account == nullptr) return false;
  emit(meter_.charge(*account, {out_.data(), out_.size()}), true);
  if (size < util::zero_copy_from) {
    emit(meter_.charge(*account, payload ? payload->view() : std::string_view{}), false);
  } else {  // the publisher's frame itself: the message holds a reference until libzmq is done
    emit(meter_.charge_shared(*account, payload->view(), new payload_ref(payload),
                              [](void* held) { delete static_cast<payload_ref*>(held); }),
         false);
  }
  counters_.messages_out.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void server::on_bus(std::string_view routing_id, peer& p, std::uint8_t type, std::string_view body,
                    zmq::message_t* payload) {
  auto decoded = codec::decode_body(type, body, cfg_.limits);
  if (!decoded) return fault(routing_id, &p, decoded.error().code, decoded.error().reason, type);
  if (p.role != rlbus::role::bus)
    return fault(routing_id, &p, codec::error_code::unknown_type,
                 fmt::format("{} is a message of the topic bus: only a peer of role bus sends it",
                             codec::type_name(type).value_or("?")),
                 type);
  // In CURVE mode a node's key may be bound to topic prefixes (SPEC §15.3).
  topic_bus::topic_rights rights = nullptr;
  if (gate_.curve())
    if (const auto* e = gate_.entry(p.key); e != nullptr && !e->topics.empty()) rights = &e->topics;
  std::optional<refusal> refused;
  if (const auto* pub = std::get_if<codec::publish>(&decoded.value())) {
    refused = bus_.on_publish(p.id, *pub, std::move(*payload), rights);
  } else {
    refused = bus_.handle(p.id, decoded.value(), rights);
  }
  if (refused) fault(routing_id, &p, refused->code, std::move(refused->reason), type);
}

void server::publish(std::string_view topic, decltype(codec::event::body) body) {
  if (past_fence()) return;
  if (holding()) {
    held_.push_back({journal_->position(), {}, std::pair{std::string(topic), std::move(body)}});
  } else {
    events_.publish(topic, std::move(body));
  }
  counters_.events.fetch_add(1, std::memory_order_relaxed);
  counters_.events_unheard.store(events_.unheard(), std::memory_order_relaxed);
}

// ---- operations (SPEC §16): the answers are ops_'s; the checks and the levers are here ----

void server::on_ops(std::string_view routing_id, peer* p, zmq::message_t& body,
                    util::time_point now) {
  constexpr auto type = static_cast<std::uint8_t>(codec::msg_type::ops);
  // An operator's mistake (a bad field, an unknown worker, a key that is not an operator's)
  // is answered and counted, never a strike against the session: a coordinator that also
  // runs operations keeps its work (§16.2).
  const auto refuse = [&](codec::error_code code, std::string reason) {
    fault(routing_id, p, code, std::move(reason), type, false);
  };
  const std::string_view bytes(static_cast<const char*>(body.data()), body.size());
  auto decoded = codec::decode_body(type, bytes, cfg_.limits);
  if (!decoded) return refuse(decoded.error().code, decoded.error().reason);
  const auto& op = std::get<codec::ops>(decoded.value());
  if (gate_.curve()) {  // §16.2: only keys listed as operators
    std::string key;
    // message_t::gets reads the connection's metadata; it is not C's gets.
    // NOLINTNEXTLINE(clang-analyzer-security.insecureAPI.gets)
    if (const char* k = body.gets("User-Id")) key = k;
    const auto* e = gate_.entry(key);
    if (e == nullptr || !e->operator_)
      return refuse(codec::error_code::unauthorized,
                    e == nullptr ? std::string("this connection's key is not in the allowlist")
                                 : fmt::format("key '{}' is not an operator", e->name));
  }
  auto answer = ops_.answer(op, view(), metrics_, *this, now);
  if (auto* why = std::get_if<refusal>(&answer)) return refuse(why->code, std::move(why->reason));
  (void)send(routing_id,
             codec::ops_reply{op.request_id, op.verb, std::move(std::get<codec::blob>(answer))});
}

std::string server::evict(const std::string& id, util::time_point now) {
  auto held = tasks_.take_back(id, "evicted by an operator", now).value_or("");
  spdlog::warn("worker {} evicted by an operator{}", id,
               held.empty() ? "" : fmt::format(" (its task {} handed back)", held));
  if (const peer* q = peers_.by_id(id))
    forget_session(*q, codec::error_code::evicted, "evicted by an operator");
  store_counters();
  return held;
}

void server::set_drained(const std::string& id, bool drained, util::time_point now) {
  tasks_.set_drained(id, drained, now);
  store_counters();
}

// What another thread asks of the loop (the web view): a read-only verb's reply, or why not.
codec::blob server::answer_query(const codec::ops& op) {
  if (op.verb != "status" && op.verb != "workers" && op.verb != "tasks" && op.verb != "topics")
    return codec::map_writer(1).str("error", "only status, workers, tasks and topics").done();
  auto answer = ops_.answer(op, view(), metrics_, *this, util::clock::now());
  if (auto* reply = std::get_if<codec::blob>(&answer)) return std::move(*reply);
  return codec::map_writer(1).str("error", std::get<refusal>(answer).reason).done();
}

broker_view server::view() const {
  return {cfg_,        peers_,         tasks_,      bus_,
          gate_,       journal_.get(), repl_.get(), {live_workers_[0], live_workers_[1]},
          live_nodes_, draining_,      started_,    epoch_};
}

void server::publish_status(util::time_point now) {
  const auto uptime = std::chrono::duration_cast<std::chrono::milliseconds>(now - started_);
  publish(codec::topic::broker_heartbeat,
          codec::broker_status{peers_.size(), static_cast<std::uint64_t>(uptime.count())});
  next_status_ = now + std::chrono::milliseconds(cfg_.status_interval_ms);
  metrics_.tick(view(), max_labelled);
}

// The first stop request: the broker says how long it will wait, closes its doors (HELLO of
// a new session and SUBMIT are refused with 503 from now on) and cancels the tasks that have
// not started; running tasks go on, with their workers and coordinators, until they end.
void server::begin_drain(util::time_point now) {
  draining_ = true;
  drain_end_ = now + std::chrono::milliseconds(cfg_.drain_ms);
  const auto counts = tasks_.counts();
  if (cfg_.drain_ms == 0) {
    spdlog::info("stopping at once (no drain): {} running tasks aborted, {} queued cancelled",
                 counts.running, counts.queued);
  } else {
    spdlog::info(
        "stopping: draining for at most {} ms ({} tasks running, {} queued tasks cancelled); "
        "signal again to stop at once",
        cfg_.drain_ms, counts.running, counts.queued);
  }
  publish(codec::topic::broker_stopping, codec::broker_stopping{cfg_.drain_ms});
  tasks_.close_queue("broker shutting down: queued tasks are not started");
  store_counters();
}

void server::shutdown(const std::string& reason) {
  if (!handing_over_to_.empty()) {
    const auto counts = tasks_.counts();
    spdlog::info(
        "stopping: handing over to {} (in sync): its {} running and {} queued tasks stay with "
        "the group",
        fmt::join(handing_over_to_, ", "), counts.running, counts.queued);
  } else if (const auto aborted = tasks_.abort_all(reason); aborted > 0) {
    spdlog::warn("aborted {} tasks still running: {}", aborted, reason);
  }
  store_counters();
  spdlog::info("shutting down: telling {} peers", peers_.size());
  const std::string goodbye = handing_over_to_.empty()
                                  ? "broker shutting down"
                                  : "broker handing over to another broker of its group";
  peers_.for_each([&](const peer& p) {
    (void)send(p.routing_id,
               codec::disconnect{static_cast<std::uint16_t>(codec::error_code::busy), goodbye});
  });
  settle_held();
  router_.set(zmq::sockopt::linger, static_cast<int>(cfg_.shutdown_linger_ms));
  events_.set_linger(static_cast<int>(cfg_.shutdown_linger_ms));
  spdlog::info("broker stopped: {} messages in, {} out, {} refused, {} expired, {} quarantines",
               counters_.messages_in.load(), counters_.messages_out.load(), counters_.faults.load(),
               counters_.expired.load(), counters_.quarantines.load());
  const auto& g = gate_.counts();
  spdlog::info(
      "connections: {} admitted; refused {} past max-connections, {} past "
      "max-connections-per-address, {} unlisted keys, {} non-subscriber keys, {} on a descriptor "
      "whose cut connection was not read to the end; {} HELLOs unauthorized, {} past a role's "
      "limit, {} from connections cut at accept; {} SUBMITs past the task limit; {} faults "
      "unanswered; {} messages not sent past max-connection-bytes or memory-budget; {} "
      "connections cut for reading nothing while memory-budget ran short, {} for their faults "
      "without a session, {} for bytes that made no whole message",
      g.admitted, g.refused_total, g.refused_address, g.refused_key, g.refused_subscriber,
      g.bounced, counters_.refused_unauthorized.load(), counters_.refused_role_limit.load(),
      counters_.cut_hellos.load(), counters_.refused_task_limit.load(), counters_.unanswered.load(),
      counters_.over_bytes.load(), counters_.stalled_cut.load(), counters_.fault_cut.load(),
      g.hoarding);
}

server_thread::server_thread(config cfg)
    : server_(std::make_unique<server>(ctx_, std::move(cfg))),
      thread_([this] { server_->run(); }) {}

server_thread::~server_thread() {
  stop();
}

void server_thread::stop() {
  if (thread_.joinable()) {
    server_->request_stop();
    thread_.join();
  }
}

}  // namespace rlbus::broker
