// See session.hpp. The broker is a peer we trust more than workers trust each other, but
// its bytes are still decoded under limits and anything malformed is ignored.
#include "client/core/session.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "codec/codec.hpp"
#include "util/curve_keys.hpp"
#include "util/endpoint_list.hpp"
#include "util/inproc.hpp"
#include "util/poll.hpp"
#include "util/zmq_send.hpp"

namespace rlbus::client::detail {

namespace {
constexpr std::uint16_t code(codec::error_code c) {
  return static_cast<std::uint16_t>(c);
}
constexpr int goodbye_linger_ms = 200;
constexpr std::chrono::milliseconds min_hello_timeout{1000};
constexpr std::chrono::milliseconds refused_check{50};
constexpr std::chrono::milliseconds connect_timeout{1000};
}  // namespace

void validate(const session_options& o) {
  (void)util::split_endpoints(o.endpoint);
  if (!codec::valid_peer_id(o.id))
    throw std::invalid_argument(
        fmt::format("id '{}' is invalid: use 1-{} characters of A-Z a-z 0-9 . _ : @ / -", o.id,
                    codec::max_id_length));
  if (o.heartbeat.count() < codec::min_heartbeat_ms ||
      o.heartbeat.count() > codec::max_heartbeat_ms)
    throw std::invalid_argument(fmt::format("heartbeat must be {}..{} ms", codec::min_heartbeat_ms,
                                            codec::max_heartbeat_ms));
  if (o.reconnect_min.count() < 1 || o.reconnect_max < o.reconnect_min)
    throw std::invalid_argument("reconnect backoff needs 1 ms <= reconnect_min <= reconnect_max");
  if (o.curve) {
    for (const auto* k : {&o.curve->public_key, &o.curve->secret_key, &o.curve->server_key})
      if (!util::valid_curve_key(*k))
        throw std::invalid_argument(
            "curve keys must each be 40 Z85 characters (public, secret and the broker's)");
    if (util::curve_public_of(o.curve->secret_key) != o.curve->public_key)
      throw std::invalid_argument("curve public_key is not the public key of secret_key");
  }
  if (o.resources.size() > codec::max_resources)
    throw std::invalid_argument(fmt::format("at most {} resources", codec::max_resources));
  for (const auto& [name, value] : o.resources) {
    if (name.empty() || name.size() > codec::max_resource_name || !(value >= 0) ||
        value == std::numeric_limits<double>::infinity())
      throw std::invalid_argument(
          fmt::format("resource '{}' needs a 1-{} byte name and a non-negative finite value", name,
                      codec::max_resource_name));
  }
}

session::session(zmq::context_t& ctx, session_options opts, state_callback on_state,
                 message_callback on_message, payload_callback on_payload)
    : ctx_(ctx),
      opts_(std::move(opts)),
      on_state_(std::move(on_state)),
      on_message_(std::move(on_message)),
      on_payload_(std::move(on_payload)),
      endpoints_(util::split_endpoints(opts_.endpoint)),
      heartbeat_(opts_.heartbeat),
      jitter_(std::random_device{}()) {}

void session::start(util::time_point now) {
  open(now);
}

zmq::pollitem_t session::pollitem() {
  if (!socket_) return {nullptr, -1, 0, 0};
  return {socket_->handle(), 0, ZMQ_POLLIN, 0};
}

void session::open(util::time_point now) {
  socket_.emplace(ctx_, zmq::socket_type::dealer);
  socket_->set(zmq::sockopt::linger, 0);
  socket_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(16 * 1024 * 1024));
  if (opts_.curve) {
    socket_->set(zmq::sockopt::curve_serverkey, opts_.curve->server_key);
    socket_->set(zmq::sockopt::curve_publickey, opts_.curve->public_key);
    socket_->set(zmq::sockopt::curve_secretkey, opts_.curve->secret_key);
  }
  // The broker's door refuses in the handshake, before any message: only the socket's
  // monitor hears of it, and it tells the user why no WELCOME comes.
  const auto mon = util::unique_inproc("session.monitor");
  // Of a group's brokers, it tells a refused TCP connection too: the next one is tried then.
  followed_ = !leader_.empty();
  current_ = followed_ ? leader_ : endpoints_[next_];
  leader_.clear();
  handshake_why_.clear();
  refused_ = false;
  int events = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
  if (rotating()) {
    events |= ZMQ_EVENT_CONNECT_RETRIED;
    // A broker whose machine is gone answers nothing, not even a refusal.
    socket_->set(zmq::sockopt::connect_timeout, static_cast<int>(connect_timeout.count()));
  }
  if (zmq_socket_monitor(socket_->handle(), mon.c_str(), events) == 0) {
    monitor_.emplace(ctx_, zmq::socket_type::pair);
    monitor_->set(zmq::sockopt::linger, 0);
    monitor_->connect(mon);
  }
  socket_->connect(current_);
  codec::hello h{opts_.role, opts_.id, static_cast<std::uint32_t>(opts_.heartbeat.count()),
                 opts_.resources, std::nullopt};
  if (token_ != 0) h.session = token_;
  // A DEALER queues the HELLO until the TCP connection is up, so sending now is right.
  send(h);
  hello_deadline_ = now + hello_timeout();
  set_state(waiting_state(), "");
}

session::~session() {
  close_socket();
}

void session::close_socket() {
  if (socket_ && monitor_) (void)zmq_socket_monitor(socket_->handle(), nullptr, 0);
  monitor_.reset();
  socket_.reset();
}

// One interval less than the broker's window for us (at least one interval): after a
// short partition we reconnect and resume while the broker still holds our session.
std::chrono::milliseconds session::broker_silence() const {
  return heartbeat_ * std::max<std::uint32_t>(liveness_ - 1, 1);
}

// Long enough that a WELCOME delayed by a busy broker still lands: giving up early would
// leave an orphaned session on the broker that refuses our id (409) until it expires.
std::chrono::milliseconds session::hello_timeout() const {
  return std::max<std::chrono::milliseconds>(opts_.heartbeat * liveness_, min_hello_timeout);
}

void session::read_monitor() {
  while (monitor_) {
    zmq::message_t head, addr;
    if (!util::try_recv(*monitor_, head)) break;
    if (head.more()) (void)monitor_->recv(addr, zmq::recv_flags::none);
    if (head.size() < 6) continue;
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    std::memcpy(&event, head.data(), sizeof event);
    std::memcpy(&value, head.data<char>() + 2, sizeof value);
    if (event == ZMQ_EVENT_CONNECT_RETRIED)
      refused_ = true;
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
      handshake_why_ = fmt::format(
          "the broker refused the connection (ZAP status {}): {}", value,
          opts_.curve ? "this peer's public key is not in its allowlist, or a connection "
                        "limit was reached"
                      : "a connection limit was reached");
    else
      handshake_why_ = opts_.curve
                           ? "the CURVE handshake failed: is the broker's public key right, and "
                             "does the broker speak CURVE?"
                           : "the handshake failed: does the broker expect CURVE keys?";
  }
}

std::string session::handshake_failure() {
  read_monitor();
  return handshake_why_;
}

void session::next_endpoint() {
  // A leader a NOT_LEADER named is not the list's: the list goes on where it was, but not
  // with the endpoint that just failed while it names another.
  if (!followed_) next_ = (next_ + 1) % endpoints_.size();
  if (endpoints_.size() > 1 && endpoints_[next_] == current_)
    next_ = (next_ + 1) % endpoints_.size();
}

void session::follow(const codec::error& e, util::time_point now, const std::string& detail) {
  const bool named = e.leader && !e.leader->empty() && *e.leader != current_ &&
                     e.leader_epoch.value_or(0) >= leader_epoch_;
  // A group answers: while it elects, it is asked again soon, not after a long backoff.
  attempt_ = std::min(attempt_, 1U);
  if (!named) {
    next_endpoint();
    retry_later(now, detail);
    return;
  }
  leader_epoch_ = std::max(leader_epoch_, e.leader_epoch.value_or(0));
  if (!followed_) next_ = (next_ + 1) % endpoints_.size();  // after the leader: the next one
  const bool again = followed_;
  leader_ = *e.leader;
  if (again) {  // the leader named before named another: the group is electing, back off
    retry_later(now, detail);
    return;
  }
  // Straight there: a standby's answer is the quickest way to the leader.
  close_socket();
  reconnect_at_ = now;
  spdlog::debug("{} {}: {}; going to the leader at {}", to_string(opts_.role), opts_.id, detail,
                leader_);
  set_state(waiting_state(), detail);
}

// Our key was revoked, or may not make our HELLO. That is the operator's to undo (an allowlist
// emptied for a moment, a key taken out by mistake), so it is not final: the session starts
// anew at the longest reconnect interval, and last_error names the revocation until a WELCOME.
void session::revoked(util::time_point now, const std::string& detail) {
  token_ = 0;
  attempt_ = std::max(attempt_, 20U);  // straight to reconnect_max
  revoked_ = detail;
  retry_later(now, detail);
}

void session::retry_later(util::time_point now, const std::string& reason) {
  const auto why =
      revoked_.empty() || reason == revoked_ ? reason : revoked_ + "; since then: " + reason;
  close_socket();
  const auto shift = std::min(attempt_, 20U);
  auto delay = std::min<std::chrono::milliseconds>(opts_.reconnect_max,
                                                   opts_.reconnect_min * (1LL << shift));
  delay += std::chrono::milliseconds(std::uniform_int_distribution<long long>(
      0, std::max<long long>(delay.count() / 4, 0))(jitter_));
  ++attempt_;
  reconnect_at_ = now + delay;
  spdlog::info("{} {}: {}; reconnecting in {} ms", to_string(opts_.role), opts_.id, why,
               delay.count());
  set_state(waiting_state(), why);
}

void session::on_readable(util::time_point now) {
  while (socket_) {
    zmq::message_t head;
    if (!socket_->recv(head, zmq::recv_flags::dontwait)) return;
    // [header][body], or [header][body][payload] for a DELIVER (SPEC §17.1.1); frames past the
    // third are read and dropped.
    zmq::message_t body;
    zmq::message_t payload;
    std::size_t frames = 1;
    bool more = head.more();
    while (more) {
      zmq::message_t extra;
      auto& into = frames == 1 ? body : frames == 2 ? payload : extra;
      (void)socket_->recv(into, zmq::recv_flags::none);
      more = into.more();
      ++frames;
    }
    const auto h = codec::parse_header({head.data<char>(), head.size()});
    const bool with_payload = h && codec::has_payload_frame(h->type);
    if (!h || frames != (with_payload ? 3U : 2U) || h->version != codec::protocol_version) {
      spdlog::debug("{}: ignored a malformed message from the broker", opts_.id);
      continue;
    }
    auto m = codec::decode_body(h->type, {body.data<char>(), body.size()});
    if (!m) {
      spdlog::debug("{}: ignored a broker message: {}", opts_.id, m.error().reason);
      continue;
    }
    if (with_payload) {
      if (state_ == connection_state::ready) broker_deadline_ = now + broker_silence();
      if (on_payload_) on_payload_(std::move(m).value(), std::move(payload));
      continue;
    }
    handle(std::move(m).value(), now);
  }
}

void session::handle(codec::message&& m, util::time_point now) {
  if (state_ == connection_state::ready) broker_deadline_ = now + broker_silence();
  if (const auto* w = std::get_if<codec::welcome>(&m)) {
    if (state_ == connection_state::ready) return;  // answer to a repeated HELLO
    if (w->leader_epoch && *w->leader_epoch < leader_epoch_) {
      // A leader whose leadership is over (SPEC §4.2.2): not the group's.
      next_endpoint();
      retry_later(now, fmt::format("{} welcomed us under leadership epoch {}, older than {}",
                                   current_, *w->leader_epoch, leader_epoch_));
      return;
    }
    if (w->leader_epoch) leader_epoch_ = *w->leader_epoch;
    token_ = w->session;
    heartbeat_ = std::chrono::milliseconds(w->heartbeat_ms);
    liveness_ = w->liveness;
    attempt_ = 0;
    welcomed_ = true;
    revoked_.clear();
    next_heartbeat_ = now + heartbeat_;
    broker_deadline_ = now + broker_silence();
    set_state(connection_state::ready, w->resumed ? "session resumed" : "");
    // The role above may need to know whether its session (and the broker state tied to it,
    // such as a coordinator's stream) went on or began anew.
    if (on_message_) on_message_(std::move(m));
  } else if (const auto* e = std::get_if<codec::error>(&m)) {
    const auto detail = fmt::format("{} {}: {}", e->code, codec::code_name(e->code), e->reason);
    const bool about_hello =
        e->ref_type && *e->ref_type == static_cast<std::uint8_t>(codec::msg_type::hello);
    if (e->code == code(codec::error_code::not_leader)) {
      follow(*e, now, detail);  // a standby of a group, whatever we sent it
    } else if (about_hello && (e->code == code(codec::error_code::duplicate_id) ||
                               e->code == code(codec::error_code::busy))) {
      retry_later(now, detail);  // may clear up: the old session expires, the broker drains
    } else if (about_hello && e->code == code(codec::error_code::unauthorized)) {
      revoked(now, detail);  // our key may not make this HELLO: the allowlist may change
    } else if (about_hello) {
      close_socket();
      set_state(connection_state::refused, detail);  // our version or fields are wrong
    } else if (e->code == code(codec::error_code::not_ready) && state_ == connection_state::ready) {
      // This connection is not our session's: the socket reconnected by itself (a cut link)
      // and the broker sees a new connection, or the broker restarted. Introduce ourselves
      // again with the token: the session resumes if the broker still holds it, and a token it
      // does not know begins a new one (SPEC §8.4).
      retry_later(now, "broker does not know this connection: " + detail);
    } else {
      set_state(state_, detail);
    }
  } else if (const auto* d = std::get_if<codec::disconnect>(&m)) {
    const auto detail = fmt::format("broker said DISCONNECT {} {}: {}", d->code,
                                    codec::code_name(d->code), d->reason);
    if (d->code == code(codec::error_code::replaced)) {
      close_socket();
      set_state(connection_state::refused, detail);  // another connection holds our session
      return;
    }
    if (d->code == code(codec::error_code::unauthorized)) {
      revoked(now, detail);
      return;
    }
    // An expired or faulted session is gone for good; a broker that stops (503) sends us on
    // to the next broker of the list.
    if (d->code == code(codec::error_code::expired) ||
        d->code == code(codec::error_code::too_many_faults))
      token_ = 0;
    if (d->code == code(codec::error_code::busy)) next_endpoint();
    retry_later(now, detail);
  } else if (!std::holds_alternative<codec::heartbeat>(m) && on_message_) {
    on_message_(std::move(m));  // task traffic: the SDK role above the session deals with it
  }
  // HEARTBEAT: its arrival (deadline refreshed above) is all it says.
}

bool session::send_ready(const codec::message& m) {
  return state_ == connection_state::ready && send(m);
}

bool session::send_ready(const codec::message& m, const payload_frame& payload) {
  return state_ == connection_state::ready && send(m, &payload);
}

void session::on_timers(util::time_point now) {
  if (reconnect_at_ && now >= *reconnect_at_) {
    reconnect_at_.reset();
    open(now);
    return;
  }
  if (!socket_) return;
  if (waiting() && rotating() && now < hello_deadline_) {
    read_monitor();
    if (refused_) {
      auto why = fmt::format("{} refused the connection", current_);
      next_endpoint();
      retry_later(now, why);
    }
    return;
  }
  if (waiting() && now >= hello_deadline_) {
    auto why = fmt::format("no WELCOME within {} ms", hello_timeout().count());
    if (const auto failure = handshake_failure(); !failure.empty()) {
      why += ": " + failure;
      spdlog::warn("{} {}: {}", to_string(opts_.role), opts_.id, failure);
    }
    if (rotating()) {
      why = current_ + ": " + why;
      next_endpoint();
    }
    retry_later(now, why);
  } else if (state_ == connection_state::ready) {
    if (now >= broker_deadline_) {
      next_endpoint();
      retry_later(now, fmt::format("broker silent for {} ms", broker_silence().count()));
    } else if (now >= next_heartbeat_) {
      send(codec::heartbeat{});
      next_heartbeat_ = now + heartbeat_;
    }
  }
}

util::time_point session::next_timer() const {
  if (reconnect_at_) return *reconnect_at_;
  // Of a group's brokers, a refused connection is looked for in the meantime.
  if (waiting() && rotating()) return std::min(hello_deadline_, util::clock::now() + refused_check);
  if (waiting()) return hello_deadline_;
  if (state_ == connection_state::ready) return std::min(next_heartbeat_, broker_deadline_);
  return util::clock::now() + std::chrono::hours(1);
}

void session::stop() {
  if (socket_ && state_ == connection_state::ready) {
    send(codec::disconnect{code(codec::error_code::goodbye), "worker stopping"});
    socket_->set(zmq::sockopt::linger, goodbye_linger_ms);
  }
  close_socket();
  reconnect_at_.reset();
  set_state(connection_state::stopped, "");
}

bool session::send(const codec::message& m, const payload_frame* payload) {
  if (!socket_) return false;
  out_.clear();
  codec::encode_body(m, out_);
  const auto header = codec::make_header(codec::type_of(m));
  if (!socket_->send(zmq::buffer(header), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
    return false;
  if (payload == nullptr) {
    util::send_last_frame(*socket_, out_);
    return true;
  }
  // The frames after the first of a message are always taken.
  socket_->send(zmq::const_buffer(out_.data(), out_.size()), zmq::send_flags::sndmore);
  const std::string_view bytes =
      std::string_view(*payload->bytes).substr(payload->offset, payload->size);
  if (bytes.size() < util::zero_copy_from) {
    socket_->send(zmq::const_buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
    return true;
  }
  // The message holds a reference of its own to the bytes, dropped by libzmq once sent.
  using ref = std::shared_ptr<const std::string>;
  auto held = std::make_unique<ref>(payload->bytes);
  zmq::message_t frame(
      const_cast<char*>(bytes.data()), bytes.size(),
      [](void* /*data*/, void* hint) { delete static_cast<ref*>(hint); }, held.get());
  (void)held.release();  // the message owns it now
  socket_->send(frame, zmq::send_flags::none);
  return true;
}

void session::set_state(connection_state s, const std::string& detail) {
  state_ = s;
  if (on_state_) on_state_(s, token_, detail);
}

}  // namespace rlbus::client::detail
