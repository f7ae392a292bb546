// See replica.hpp.
#include "broker/group/replica.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "broker/durability/journal.hpp"
#include "codec/codec.hpp"
#include "util/clock.hpp"
#include "util/errno_text.hpp"

namespace rlbus::broker {

namespace {

// How long a leader may say nothing (it sends at least an empty RECORDS every 500 ms, §14.10.4)
// before the replica asks again on a new connection.
constexpr auto patience = std::chrono::milliseconds(3000);
constexpr auto turn = std::chrono::milliseconds(50);

void write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const auto n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw journal_error(fmt::format("journal {}: cannot write: {}", path, util::errno_text()));
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

void sync_fd(int fd, const std::string& path) {
  if (::fdatasync(fd) != 0)
    throw journal_error(fmt::format("journal {}: cannot sync: {}", path, util::errno_text()));
}

void sync_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  const auto dir = slash == std::string::npos ? std::string(".") : path.substr(0, slash + 1);
  if (const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    (void)::fsync(d);
    ::close(d);
  }
}

// The file a replica writes: the journal being appended to once a snapshot is whole, and the
// next snapshot, written beside it until its last part.
class mirror_file {
 public:
  mirror_file(std::string path, fsync_policy fsync) : path_(std::move(path)), fsync_(fsync) {}
  ~mirror_file() {
    if (tmp_ >= 0) {
      ::close(tmp_);
      ::unlink((path_ + ".tmp").c_str());
    }
    finish();
    if (fd_ >= 0) ::close(fd_);
  }
  mirror_file(const mirror_file&) = delete;
  mirror_file& operator=(const mirror_file&) = delete;

  void snapshot_part(std::string_view records, bool last) {
    const auto tmp = path_ + ".tmp";
    if (tmp_ < 0) {
      tmp_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
      if (tmp_ < 0)
        throw journal_error(
            fmt::format("journal {}: cannot create {}: {}", path_, tmp, util::errno_text()));
      write_all(tmp_, journal::signature(), path_);
      size_ = journal::signature().size();
    }
    write_all(tmp_, records, path_);
    size_ += records.size();
    if (!last) return;
    sync_fd(tmp_, path_);
    if (::rename(tmp.c_str(), path_.c_str()) != 0)
      throw journal_error(
          fmt::format("journal {}: cannot replace it with {}: {}", path_, tmp, util::errno_text()));
    sync_dir(path_);
    if (fd_ >= 0) ::close(fd_);
    fd_ = tmp_;
    tmp_ = -1;
    unsynced_ = false;
    sync_due_.reset();
  }
  void drop_snapshot() {
    if (tmp_ < 0) return;
    ::close(tmp_);
    tmp_ = -1;
    ::unlink((path_ + ".tmp").c_str());
  }
  void append(std::string_view records) {
    write_all(fd_, records, path_);
    size_ += records.size();
    if (fsync_ == fsync_policy::always) {
      sync_fd(fd_, path_);
    } else if (fsync_ == fsync_policy::batch) {
      unsynced_ = true;
      if (!sync_due_) sync_due_ = util::clock::now() + journal::batch_sync_interval;
    }
  }
  void on_timer(util::time_point now) {
    if (sync_due_ && *sync_due_ <= now) finish();
  }
  void finish() {
    if (fd_ >= 0 && unsynced_) {
      try {
        sync_fd(fd_, path_);
      } catch (const journal_error& e) {
        spdlog::error("{}", e.what());
      }
    }
    unsynced_ = false;
    sync_due_.reset();
  }
  [[nodiscard]] bool whole() const noexcept { return fd_ >= 0; }
  [[nodiscard]] bool snapshotting() const noexcept { return tmp_ >= 0; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  std::string path_;
  fsync_policy fsync_;
  int fd_ = -1, tmp_ = -1;
  std::size_t size_ = 0;
  bool unsynced_ = false;
  std::optional<util::time_point> sync_due_;
};

}  // namespace

replica::replica(zmq::context_t& ctx, replica_config cfg) : ctx_(ctx), cfg_(std::move(cfg)) {
  lock_fd_ = journal::lock_path(cfg_.journal_path);
  thread_ = std::thread([this] { run(); });
}

replica::~replica() {
  stop_ = true;
  thread_.join();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void replica::follow(const std::string& endpoint, std::uint64_t epoch) {
  const std::lock_guard lock(mu_);
  wanted_ = {endpoint, epoch};
}

replica::progress replica::state() const {
  const std::lock_guard lock(mu_);
  return progress_;
}

void replica::run() {
  codec::decode_limits limits;
  limits.max_bin = cfg_.max_message + std::size_t{1024} * 1024;
  leader following;
  std::unique_ptr<zmq::socket_t> sock;
  mirror_file file(cfg_.journal_path, cfg_.fsync);
  std::uint64_t epoch = 0, position = 0, snapshot_at = 0;
  util::time_point heard{};
  const auto send = [&](const codec::message& m) {
    const auto h = codec::make_header(codec::type_of(m));
    sock->send(zmq::buffer(h), zmq::send_flags::sndmore);
    const auto body = codec::encode_body(m);
    sock->send(zmq::buffer(body), zmq::send_flags::none);
  };
  // A new connection, and the journal asked for from scratch.
  const auto ask = [&](const std::string& why) {
    sock = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    sock->set(zmq::sockopt::linger, 0);
    sock->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits.max_bin + 4096));
    if (cfg_.curve) {
      sock->set(zmq::sockopt::curve_serverkey, cfg_.curve->public_key);
      sock->set(zmq::sockopt::curve_publickey, cfg_.curve->public_key);
      sock->set(zmq::sockopt::curve_secretkey, cfg_.curve->secret_key);
    }
    sock->connect(following.endpoint);
    file.drop_snapshot();
    send(codec::repl_sync{cfg_.member, following.epoch});
    heard = util::clock::now();
    spdlog::info("replica: asks {} (leadership {}) for its journal: {}", following.endpoint,
                 following.epoch, why);
  };
  const auto publish = [&] {
    const std::lock_guard lock(mu_);
    progress_.epoch = epoch;
    progress_.position = position;
  };
  while (!stop_) {
    leader want;
    {
      const std::lock_guard lock(mu_);
      want = wanted_;
    }
    if (want.endpoint != following.endpoint || want.epoch != following.epoch) {
      following = want;
      sock.reset();
      if (!following.endpoint.empty()) ask("a new leader");
    }
    const auto now = util::clock::now();
    file.on_timer(now);
    if (!sock) {
      std::this_thread::sleep_for(turn);
      continue;
    }
    if (now - heard > patience) {
      ask("the leader said nothing for 3 s");
      continue;
    }
    zmq::pollitem_t item{sock->handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, turn);
    zmq::message_t head, body;
    if (!sock->recv(head, zmq::recv_flags::dontwait)) continue;
    const bool two = head.more() && sock->recv(body, zmq::recv_flags::dontwait) && !body.more();
    while (body.more()) (void)sock->recv(body, zmq::recv_flags::dontwait);
    const auto h = codec::parse_header(head.to_string_view());
    if (!two || !h) continue;
    auto m = codec::decode_body(h->type, body.to_string_view(), limits);
    if (!m) {
      spdlog::warn("replica: a message from the leader that cannot be read: {}", m.error().reason);
      continue;
    }
    heard = util::clock::now();
    try {
      if (auto* s = std::get_if<codec::repl_snapshot>(&m.value())) {
        if (s->leader_epoch != following.epoch) continue;
        const std::string_view recs = s->records ? *s->records : std::string_view{};
        std::string why;
        if (journal::whole_records(recs, &why) != recs.size()) {
          ask("a snapshot part is not whole records: " + why);
          continue;
        }
        if (!file.snapshotting()) snapshot_at = s->position;
        if (s->position != snapshot_at) {
          ask("a snapshot part of another position");
          continue;
        }
        file.snapshot_part(recs, s->last);
        if (!s->last) continue;
        epoch = following.epoch;
        position = snapshot_at;
        {
          const std::lock_guard lock(mu_);
          ++progress_.snapshots;
        }
        publish();
        spdlog::info("replica: holds the journal of leadership {} at position {} ({} bytes)", epoch,
                     position, file.size());
        send(codec::repl_synced{position});
      } else if (auto* r = std::get_if<codec::repl_records>(&m.value())) {
        if (r->leader_epoch != following.epoch) continue;
        if (!file.whole() || epoch != following.epoch) {
          if (!file.snapshotting()) ask("records before a whole snapshot");
          continue;
        }
        if (r->position != position) {
          ask(fmt::format("records from position {} where it holds {}", r->position, position));
          continue;
        }
        const std::string_view recs = r->records ? *r->records : std::string_view{};
        std::string why;
        if (journal::whole_records(recs, &why) != recs.size()) {
          ask("records that are not whole: " + why);
          continue;
        }
        if (!recs.empty()) {
          file.append(recs);
          position += recs.size();
          {
            const std::lock_guard lock(mu_);
            progress_.records_bytes += recs.size();
          }
          publish();
        }
        send(codec::repl_synced{position});
        if (file.size() > cfg_.compact_bytes) ask("its journal grew past its bound");
      }
    } catch (const journal_error& e) {
      spdlog::error("replica: {}; it follows nobody for a second", e.what());
      file.drop_snapshot();
      sock.reset();
      following = {};
      {
        const std::lock_guard lock(mu_);
        wanted_ = {};
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
}

}  // namespace rlbus::broker
