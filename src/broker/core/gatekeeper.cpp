// See gatekeeper.hpp. The ZAP exchange (ZeroMQ RFC 27): a request is [version "1.0"]
// [request id][domain][address][routing id][mechanism][credentials...], a reply is
// [version][request id][status code][status text][user id][metadata].
#include "broker/core/gatekeeper.hpp"

#include <algorithm>
#include <cassert>

#include <netdb.h>
#include <sys/socket.h>

#include <array>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <zmq.h>

#include "util/bind.hpp"
#include "util/curve_keys.hpp"
#include "util/inproc.hpp"
#include "util/poll.hpp"
#include "util/tcp_taken.hpp"

namespace rlbus::broker {

namespace {

constexpr const char* zap_endpoint = "inproc://zeromq.zap.01";
constexpr std::size_t zap_request_frames = 7;  // with one credentials frame (CURVE)

// The numeric address of a connection's peer, spelled as libzmq spells it in a ZAP request.
std::string peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  if (ss.ss_family == AF_UNIX) return "";
  std::array<char, NI_MAXHOST> host{};
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host.data(), host.size(), nullptr, 0,
                    NI_NUMERICHOST) != 0)
    return "?";
  return host.data();
}

}  // namespace

gatekeeper::gatekeeper(zmq::context_t& ctx, const config& cfg)
    : ctx_(ctx), cfg_(cfg), curve_(!cfg.curve_key_path.empty()), zap_(ctx, zmq::socket_type::rep) {
  if (curve_) {
    if (!util::curve_available())
      throw std::invalid_argument("CURVE asked for, but this libzmq was built without it");
    try {
      const auto pair = util::read_curve_file(cfg.curve_key_path);
      if (pair.secret_key.empty())
        throw std::runtime_error(
            fmt::format("{}: holds no secret-key (the broker needs its .key file, not its .pub)",
                        cfg.curve_key_path));
      public_key_ = pair.public_key;
      secret_key_ = pair.secret_key;
      list_ = allowlist::load(cfg.allowlist_path);
    } catch (const std::runtime_error& e) {
      throw std::invalid_argument(e.what());
    }
    list_file_ = stat_allowlist();
  }
  zap_.set(zmq::sockopt::linger, 0);
  util::bind_freed(zap_, zap_endpoint);  // before any socket that asks it can accept a connection
  zap_fd_ = zap_.get(zmq::sockopt::fd);
}

int gatekeeper::secure(zmq::socket_t& s, std::string_view domain) {
  // ZAP only where there is a key to check: libzmq keeps a pipe to the ZAP handler for the
  // life of every connection that asked it (about 11 KB each), and in plain mode the limits
  // are enforced when a connection is accepted (on_monitor).
  if (curve_) s.set(zmq::sockopt::zap_domain, std::string(domain));
  s.set(zmq::sockopt::handshake_ivl, static_cast<int>(cfg_.handshake_timeout_ms));
  if (curve_) {
    s.set(zmq::sockopt::curve_server, 1);
    s.set(zmq::sockopt::curve_secretkey, secret_key_);
  }
  const auto endpoint = util::unique_inproc("gate.monitor");
  if (zmq_socket_monitor(s.handle(), endpoint.c_str(),
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0)
    throw zmq::error_t();
  auto& mon = monitors_.emplace_back(ctx_, zmq::socket_type::pair);
  mon.set(zmq::sockopt::linger, 0);
  mon.connect(endpoint);
  monitor_fds_.push_back(mon.get(zmq::sockopt::fd));
  watched_.push_back(s.handle());
  const auto handle = static_cast<int>(monitors_.size() - 1);
  if (domain == zap_domain_router) router_monitor_ = handle;
  if (domain == zap_domain_events) events_monitor_ = handle;
  return handle;
}

gatekeeper::~gatekeeper() {
  // An owner that forgot release_all(): its sockets are closed by now and cannot be reached;
  // the I/O thread may be stuck already.
  assert(std::all_of(watched_.begin(), watched_.end(), [](void* s) { return s == nullptr; }));
}

void gatekeeper::release_all() {
  for (std::size_t i = 0; i < watched_.size(); ++i) release(static_cast<int>(i));
}

void gatekeeper::release(int handle) {
  const auto h = static_cast<std::size_t>(handle);
  if (watched_[h] == nullptr) return;
  // The monitor first: from here on libzmq reports nothing more about the socket, so its
  // reader may close.
  (void)zmq_socket_monitor(watched_[h], nullptr, 0);
  watched_[h] = nullptr;
  monitors_[h].close();
  monitor_fds_[h] = -1;
  for (auto it = connections_.begin(); it != connections_.end();) {
    const auto next = std::next(it);
    if (it->second.monitor == handle) forget(it);
    it = next;
  }
}

void gatekeeper::forget(std::unordered_map<int, connection>::iterator it) {
  const auto a = per_address_.find(it->second.address);
  if (a != per_address_.end() && --a->second == 0) per_address_.erase(a);
  connections_.erase(it);
  --counts_.connections;
}

// A socket's descriptor signals "look again", edge-style: on_readable() therefore reads each
// socket until it has nothing more (the last call on it a receive that found nothing), and
// the broker loop also calls it now and then without a signal.
void gatekeeper::poll_items(std::vector<zmq::pollitem_t>& items) {
  for (const int fd : monitor_fds_)
    if (fd >= 0) items.push_back({nullptr, fd, ZMQ_POLLIN, 0});
  items.push_back({nullptr, zap_fd_, ZMQ_POLLIN, 0});
}

void gatekeeper::on_readable() {
  read_monitors();
  on_zap();
}

void gatekeeper::read_monitors() {
  for (std::size_t i = 0; i < monitors_.size(); ++i)
    if (monitors_[i].handle() != nullptr) on_monitor(static_cast<int>(i));
}

void gatekeeper::on_monitor(int handle) {
  auto& mon = monitors_[static_cast<std::size_t>(handle)];
  while (true) {
    zmq::message_t head, addr;
    if (!util::try_recv(mon, head)) return;
    if (head.more()) (void)mon.recv(addr, zmq::recv_flags::none);
    if (head.size() < 6) continue;
    std::uint16_t event = 0;
    std::int32_t fd = -1;
    std::memcpy(&event, head.data(), sizeof event);
    std::memcpy(&fd, head.data<char>() + 2, sizeof fd);
    if (event == ZMQ_EVENT_ACCEPTED) {
      if (const auto old = connections_.find(fd); old != connections_.end()) {
        // Its end not read yet (another socket's monitor can be read first).
        if (old->second.cut && old->second.monitor == router_monitor_) cut_gone_.insert(fd);
        forget(old);
      }
      const bool unread = handle == router_monitor_ && cut_gone_.erase(fd) != 0;
      auto address = peer_address(fd);
      const auto n = ++per_address_[address];
      ++counts_.connections;
      // Past a limit, the connection is cut at once: one that never speaks would otherwise
      // hold its memory until the handshake timeout. libzmq sees the end and cleans up (its
      // DISCONNECTED event forgets it). The fd may meanwhile belong to another connection;
      // it is cut only if that one's address is past its limit too.
      const bool over_total = counts_.connections > cfg_.max_connections;
      const bool over_address = n > cfg_.max_connections_per_address;
      bool cut = false;
      if (address == "?") {
        // Gone before it could be looked at (libzmq closed it): nothing it said is served,
        // though its HELLO may be queued still, for its WELCOME would go nowhere.
        cut = true;
      } else if ((over_total || over_address) && ::shutdown(fd, SHUT_RDWR) == 0) {
        cut = true;
        ++(over_total ? counts_.refused_total : counts_.refused_address);
        note_refusal(address, over_total ? "max-connections" : "max-connections-per-address");
      } else if (unread) {
        cut = true;
        (void)::shutdown(fd, SHUT_RDWR);
        ++counts_.bounced;
      } else if (!curve_) {
        ++counts_.admitted;  // plain mode has no handshake to pass: admitted at accept
      }
      connections_[fd] = {handle, std::move(address), cut};
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      if (const auto it = connections_.find(fd);
          it != connections_.end() && it->second.monitor == handle) {
        // What a cut connection said before the cut can still be queued in the ROUTER:
        // remembered until the ROUTER has been read to the end (router_drained).
        if (it->second.cut && handle == router_monitor_) cut_gone_.insert(fd);
        forget(it);
      }
    }
  }
}

bool gatekeeper::cut_off(int fd) {
  read_monitors();
  if (cut_gone_.count(fd) != 0) return true;
  const auto it = connections_.find(fd);
  return it != connections_.end() && it->second.cut;
}

std::optional<std::string> gatekeeper::cut(int fd) {
  read_monitors();
  const auto it = connections_.find(fd);
  if (it == connections_.end() || it->second.cut || ::shutdown(fd, SHUT_RDWR) != 0)
    return std::nullopt;
  return it->second.address;
}

namespace {
constexpr auto sweep_every = std::chrono::milliseconds(100);
constexpr std::size_t swept_per_interval = 2048;  // connections; past that the sweep slows
// Sweeps in a row without a whole message from a ROUTER connection after which what it holds
// is judged even though the ROUTER has not been read to the end meanwhile (a broker kept busy):
// the ROUTER hands out one message per connection in turn, so by then its whole ones are out.
constexpr std::uint32_t quiet_sweeps = 10;
constexpr std::uint64_t events_bound = std::uint64_t{1} << 20;
}  // namespace

std::size_t gatekeeper::sweep_inbound(util::time_point now) {
  read_monitors();
  const auto slower = 1 + connections_.size() / swept_per_interval;
  next_sweep_ = now + sweep_every * static_cast<long>(slower);
  const bool drained = std::exchange(drained_, false);
  const std::uint64_t router_bound = std::uint64_t{4} * cfg_.max_message;
  struct holder {
    int fd;
    std::uint64_t held;
  };
  std::vector<holder> holders;
  std::uint64_t total = 0;
  std::size_t cuts = 0;
  const auto cut = [&](int fd, connection& c, std::string_view why) {
    if (::shutdown(fd, SHUT_RDWR) != 0) return false;
    c.swept = true;
    ++counts_.hoarding;
    ++cuts;
    note_refusal(c.address, why, "cut");
    return true;
  };
  for (auto& [fd, c] : connections_) {
    const bool router = c.monitor == router_monitor_;
    if (c.cut || c.swept || (!router && c.monitor != events_monitor_)) continue;
    const auto taken = util::tcp_taken(fd);
    if (!taken) continue;  // IPC, or gone meanwhile
    if (router) {
      if (c.delivered != c.delivered_seen) {
        c.delivered_seen = c.delivered;
        c.mark = *taken;
        c.quiet = 0;
        continue;
      }
      // Not read to the end, the ROUTER may hold whole messages of it still.
      if (++c.quiet < quiet_sweeps && !drained) continue;
    }
    const auto held = *taken > c.mark ? *taken - c.mark : 0;
    if (router && held > router_bound) {
      (void)cut(
          fd, c,
          fmt::format("{} bytes that make no whole message (more than 4 x max-message)", held));
    } else if (!router && held > events_bound) {
      (void)cut(fd, c,
                fmt::format("{} bytes sent to the event socket (more than 1 MiB of subscriptions)",
                            held));
    } else if (held > 0) {
      holders.push_back({fd, held});
      total += held;
    }
  }
  const auto total_bound = cfg_.memory_budget / 2;
  if (total <= total_bound) return cuts;
  std::sort(holders.begin(), holders.end(),
            [](const holder& a, const holder& b) { return a.held > b.held; });
  for (const auto& h : holders) {
    if (total <= total_bound) break;
    if (cut(h.fd, connections_.at(h.fd),
            fmt::format("{} bytes that make no whole message, while all connections held more "
                        "than half of memory-budget",
                        h.held)))
      total -= h.held;
  }
  return cuts;
}

void gatekeeper::on_zap() {
  std::array<zmq::message_t, zap_request_frames + 1> f;
  while (true) {
    if (!util::try_recv(zap_, f[0])) return;
    std::size_t n = 1;
    bool more = f[0].more();
    zmq::message_t rest;
    while (more) {
      auto& dst = n < f.size() ? f[n] : rest;
      (void)zap_.recv(dst, zmq::recv_flags::none);
      more = dst.more();
      if (n < f.size()) ++n;
    }
    // The request comes from libzmq itself, so it is well formed; still, never trust it.
    if (n < zap_request_frames - 1) {
      (void)zap_.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
      (void)zap_.send(zmq::message_t(), zmq::send_flags::sndmore);
      (void)zap_.send(zmq::str_buffer("500"), zmq::send_flags::sndmore);
      (void)zap_.send(zmq::str_buffer("malformed ZAP request"), zmq::send_flags::sndmore);
      (void)zap_.send(zmq::message_t(), zmq::send_flags::sndmore);
      (void)zap_.send(zmq::message_t(), zmq::send_flags::none);
      continue;
    }
    std::string key;
    if (f[5].to_string_view() == "CURVE" && n >= zap_request_frames && f[6].size() == 32) {
      std::array<char, 41> z85{};
      zmq_z85_encode(z85.data(), f[6].data<std::uint8_t>(), 32);
      key = z85.data();
    }
    const auto [status, text] =
        decide(f[2].to_string_view(), f[3].to_string_view(), f[5].to_string_view(), key);
    (void)zap_.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
    (void)zap_.send(f[1], zmq::send_flags::sndmore);
    (void)zap_.send(zmq::buffer(status), zmq::send_flags::sndmore);
    (void)zap_.send(zmq::buffer(text), zmq::send_flags::sndmore);
    (void)zap_.send(zmq::buffer(status == "200" ? key : std::string()), zmq::send_flags::sndmore);
    (void)zap_.send(zmq::message_t(), zmq::send_flags::none);
  }
}

std::pair<std::string, std::string> gatekeeper::decide(std::string_view domain,
                                                       std::string_view address,
                                                       std::string_view mechanism,
                                                       std::string& key) {
  const auto refuse = [&](std::uint64_t& counter, std::string text) {
    ++counter;
    note_refusal(address, text);
    return std::pair<std::string, std::string>{"400", std::move(text)};
  };
  if (counts_.connections > cfg_.max_connections)
    return refuse(
        counts_.refused_total,
        fmt::format("the broker holds its maximum of {} connections", cfg_.max_connections));
  if (const auto it = per_address_.find(std::string(address));
      it != per_address_.end() && it->second > cfg_.max_connections_per_address)
    return refuse(counts_.refused_address, fmt::format("{} holds its maximum of {} connections",
                                                       address, cfg_.max_connections_per_address));
  if (curve_ && domain == zap_domain_replication) {
    // The brokers of a group share one key pair: only that key may copy the journal.
    if (mechanism != "CURVE" || key != public_key_)
      return refuse(counts_.refused_key, "only the group's brokers may replicate its journal");
    ++counts_.admitted;
    return {"200", "OK"};
  }
  if (curve_) {
    // libzmq asks only about the mechanism the socket serves; a request for another one
    // would be a bug, and is refused like an unknown key.
    const auto* e = mechanism == "CURVE" ? list_.find(key) : nullptr;
    if (e == nullptr) return refuse(counts_.refused_key, "key not in the allowlist");
    if (domain == zap_domain_events) {
      if (!e->subscriber)
        return refuse(counts_.refused_subscriber,
                      fmt::format("key '{}' may not subscribe to events", e->name));
      subscriber_keys_.insert(key);
    }
  }
  ++counts_.admitted;
  return {"200", "OK"};
}

// A flood must not flood the log as well: one line per second at most, with a count of the
// refusals it stands for.
void gatekeeper::note_refusal(std::string_view address, std::string_view why,
                              std::string_view verb) {
  ++unlogged_;
  const auto now = util::clock::now();
  if (now < next_log_) return;
  spdlog::warn(
      "{} a connection from {}: {}{}", verb, address, why,
      unlogged_ > 1 ? fmt::format(" (and {} more since the last such line)", unlogged_ - 1) : "");
  unlogged_ = 0;
  next_log_ = now + std::chrono::seconds(1);
}

std::optional<gatekeeper::file_id> gatekeeper::stat_allowlist() const {
  struct stat st {};
  if (::stat(cfg_.allowlist_path.c_str(), &st) != 0) return std::nullopt;
  return file_id{st.st_dev, st.st_ino, st.st_size,
                 std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec};
}

bool gatekeeper::allowlist_changed() const {
  return curve_ && stat_allowlist() != list_file_;
}

bool gatekeeper::reload_allowlist() {
  if (!curve_) {
    spdlog::info("no allowlist to reload: CURVE is off");
    return false;
  }
  list_file_ = stat_allowlist();  // a bad file is reported once, not every second
  try {
    auto next = allowlist::load(cfg_.allowlist_path);
    if (next.size() == 0)
      throw std::runtime_error(fmt::format(
          "allowlist {}: lists no key (an editor's rewrite, or a file emptied by mistake?); "
          "taking it would end every session. To stop serving everyone, stop the broker",
          cfg_.allowlist_path));
    list_ = std::move(next);
  } catch (const std::runtime_error& e) {
    ++counts_.allowlist_errors;
    spdlog::error("{}; the allowlist in force stays ({} keys)", e.what(), list_.size());
    return false;
  }
  ++counts_.allowlist_reloads;
  spdlog::info("allowlist {} reloaded: {} keys", cfg_.allowlist_path, list_.size());
  return true;
}

bool gatekeeper::subscriber_revoked() const {
  for (const auto& k : subscriber_keys_) {
    const auto* e = list_.find(k);
    if (e == nullptr || !e->subscriber) return true;
  }
  return false;
}

}  // namespace rlbus::broker
