// See journal.hpp for the file and its guarantees. Reading is written for a file that may be
// torn or damaged: every length is checked against what is left and against a bound before
// anything is allocated, and every embedded message goes through the protocol decoder.
#include "broker/journal.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "codec/codec.hpp"

namespace rlbus::broker {

namespace {

constexpr std::string_view signature{"RLBUSJ1\n"};
constexpr std::size_t record_header = 8;  // length, CRC
// A record holds at most a task_info or an event body (each within max-message) and a few ids.
constexpr std::size_t max_record = std::size_t{64} * 1024 * 1024;
constexpr auto batch_interval = std::chrono::milliseconds(100);

enum record : std::uint8_t {
  submitted_rec = 1,
  started_rec = 2,
  requeued_rec = 3,
  ended_rec = 4,
  end_event_rec = 5,
  reserved_rec = 6,
  acked_rec = 7,
  dropped_rec = 8,
  policy_rec = 9,
};

void put_u32(std::string& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFFU));
}
void put_u64(std::string& b, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFFU));
}
void put_str(std::string& b, std::string_view s) {
  put_u32(b, static_cast<std::uint32_t>(s.size()));
  b.append(s);
}
std::uint32_t crc_of(std::string_view s) {
  return static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
}

// Reads a record's fields; the first one that does not fit leaves `ok` false for good.
class fields {
 public:
  explicit fields(std::string_view s) : s_(s) {}
  std::uint64_t u64() { return little_endian(8); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(little_endian(4)); }
  std::string str() {
    const auto n = u32();
    if (!take(n)) return {};
    return std::string(s_.substr(pos_ - n, n));
  }
  [[nodiscard]] bool ok() const { return ok_ && pos_ == s_.size(); }

 private:
  bool take(std::size_t n) {
    if (!ok_ || s_.size() - pos_ < n) return ok_ = false;
    pos_ += n;
    return true;
  }
  std::uint64_t little_endian(std::size_t bytes) {
    if (!take(bytes)) return 0;
    std::uint64_t v = 0;
    for (auto i = bytes; i-- > 0;) v = (v << 8U) | static_cast<std::uint8_t>(s_[pos_ - bytes + i]);
    return v;
  }
  std::string_view s_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

template <class T>
std::optional<T> decode_as(std::string_view body, const codec::decode_limits& limits) {
  auto m = codec::decode_body(static_cast<std::uint8_t>(codec::type_of(T{})), body, limits);
  if (!m || !std::holds_alternative<T>(m.value())) return std::nullopt;
  return std::get<T>(std::move(m).value());
}

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

journal::journal(std::string path, fsync_policy fsync, const codec::decode_limits& limits,
                 std::size_t compact_bytes)
    : path_(std::move(path)), fsync_(fsync), compact_bytes_(compact_bytes) {
  load(limits);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) throw journal_error(fmt::format("journal {}: cannot open: {}", path_, errno_text()));
  if (loaded_.bytes == 0) {
    write_all(signature.data(), signature.size());
    sync();
  }
  size_ = std::max(loaded_.bytes, signature.size());
  compact_at_ = std::max(compact_bytes_, 2 * size_);
}

journal::~journal() {
  try {
    flush();
    if (unsynced_ && fsync_ != fsync_policy::none) sync();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
  if (fd_ >= 0) ::close(fd_);
}

void journal::load(const codec::decode_limits& limits) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return;  // a new journal
    throw journal_error(fmt::format("journal {}: cannot read: {}", path_, errno_text()));
  }
  std::string data;
  char chunk[65536];
  while (true) {
    const auto n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const auto why = errno_text();
      ::close(fd);
      throw journal_error(fmt::format("journal {}: cannot read: {}", path_, why));
    }
    if (n == 0) break;
    data.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  loaded_.bytes = data.size();
  if (data.empty()) return;
  if (data.size() < signature.size() || data.compare(0, signature.size(), signature) != 0)
    throw journal_error(fmt::format(
        "journal {}: not an rlbus journal (its first bytes are not the signature); name "
        "another file or move this one aside",
        path_));

  std::unordered_map<std::string, journal_task> tasks;
  std::map<std::string, journal_state::stream>& streams = loaded_.streams;
  std::map<std::string, journal_state::policy> policies;
  std::size_t pos = signature.size();
  const auto damaged = [&](std::size_t at, const std::string& what) {
    throw journal_error(fmt::format(
        "journal {}: the record at byte {} {}, and {} bytes follow it: the file is damaged. "
        "Move it aside to start without it (its tasks are then lost)",
        path_, at, what, data.size() - at));
  };
  while (pos < data.size()) {
    const auto at = pos;
    const auto left = data.size() - pos;
    fields head(std::string_view(data).substr(pos, std::min(left, record_header)));
    const auto len = head.u32();
    const auto crc = head.u32();
    if (left < record_header || len > left - record_header) {
      loaded_.torn = fmt::format("the last record, at byte {}, is cut short ({} bytes)", at, left);
      break;
    }
    const std::string_view rec(data.data() + pos + record_header, len);
    pos += record_header + len;
    if (len == 0 || len > max_record) {
      if (pos >= data.size()) {
        loaded_.torn = fmt::format("the last record, at byte {}, has an impossible length", at);
        break;
      }
      damaged(at, "has an impossible length");
    }
    if (crc_of(rec) != crc) {
      if (pos >= data.size()) {
        loaded_.torn = fmt::format("the last record, at byte {}, fails its checksum", at);
        break;
      }
      damaged(at, "fails its checksum");
    }
    const auto type = static_cast<std::uint8_t>(rec[0]);
    fields f(rec.substr(1));
    bool good = true;
    switch (type) {
      case submitted_rec: {
        journal_task t;
        t.owner = f.str();
        t.order = f.u64();
        const auto body = f.str();
        const auto narrow = [&] { return static_cast<std::uint32_t>(f.u64()); };
        t.start_timeout_ms = narrow();
        t.step_timeout_ms = narrow();
        t.close_timeout_ms = narrow();
        t.task_timeout_ms = narrow();
        t.queue_timeout_ms = narrow();
        t.max_attempts = narrow();
        auto s = decode_as<codec::submit>(body, limits);
        good = f.ok() && s.has_value() && t.max_attempts >= 1;
        if (good) {
          t.submit = std::move(*s);
          const auto id = t.submit.task_id;
          tasks[id] = std::move(t);
        }
        break;
      }
      case started_rec: {
        const auto id = f.str();
        const auto attempt = f.u64();
        auto worker = f.str();
        good = f.ok() && attempt >= 1 && attempt <= 0xFFFFFFFFU;
        if (auto it = tasks.find(id); good && it != tasks.end()) {
          it->second.attempt = static_cast<std::uint32_t>(attempt);
          it->second.running = true;
          it->second.worker = std::move(worker);
        }
        break;
      }
      case requeued_rec: {
        const auto id = f.str();
        (void)f.u64();
        good = f.ok();
        if (auto it = tasks.find(id); good && it != tasks.end()) it->second.running = false;
        break;
      }
      case ended_rec: {
        const auto id = f.str();
        good = f.ok();
        if (good) tasks.erase(id);
        break;
      }
      case end_event_rec: {
        const auto owner = f.str();
        auto e = decode_as<codec::task_event>(f.str(), limits);
        good = f.ok() && e.has_value();
        if (good) streams[owner].ends.push_back(std::move(*e));
        break;
      }
      case reserved_rec: {
        const auto owner = f.str();
        const auto seq = f.u64();
        good = f.ok();
        if (good) streams[owner].head = std::max(streams[owner].head, seq);
        break;
      }
      case acked_rec: {
        const auto owner = f.str();
        const auto seq = f.u64();
        good = f.ok();
        if (good) {
          auto& s = streams[owner];
          s.acked = seq;
          s.windowed = true;
          std::erase_if(s.ends, [&](const codec::task_event& e) { return e.seq <= seq; });
        }
        break;
      }
      case dropped_rec: {
        const auto owner = f.str();
        good = f.ok();
        if (good) streams.erase(owner);
        break;
      }
      case policy_rec: {
        auto publisher = f.str();
        auto p = decode_as<codec::policy>(f.str(), limits);
        good = f.ok() && p.has_value();
        if (good) {
          auto& held = policies[p->policy_id];
          if (p->version > held.latest.version || held.publisher.empty())
            held = journal_state::policy{std::move(publisher), std::move(*p)};
        }
        break;
      }
      default:
        good = false;
    }
    if (!good) damaged(at, fmt::format("(type {}) does not hold what its type says", type));
    ++loaded_.records;
  }
  for (auto& [id, t] : tasks) loaded_.tasks.push_back(std::move(t));
  std::sort(loaded_.tasks.begin(), loaded_.tasks.end(),
            [](const journal_task& a, const journal_task& b) { return a.order < b.order; });
  for (auto& [id, p] : policies) loaded_.policies.push_back(std::move(p));
  for (auto& [owner, s] : streams)
    s.head = std::max(s.head, s.ends.empty() ? 0 : s.ends.back().seq);
}

// ---- writing ---------------------------------------------------------------------------

void journal::append(std::uint8_t type, const std::string& body, bool through) {
  std::string rec;
  rec.reserve(1 + body.size());
  rec.push_back(static_cast<char>(type));
  rec.append(body);
  put_u32(buf_, static_cast<std::uint32_t>(rec.size()));
  put_u32(buf_, crc_of(rec));
  buf_.append(rec);
  size_ += record_header + rec.size();
  ++stats_.records;
  if (through && !compacting_) flush();
}

void journal::submitted(const journal_task& t) {
  std::string b;
  put_str(b, t.owner);
  put_u64(b, t.order);
  put_str(b, codec::encode_body(codec::message{t.submit}));
  for (const auto v : {t.start_timeout_ms, t.step_timeout_ms, t.close_timeout_ms, t.task_timeout_ms,
                       t.queue_timeout_ms, t.max_attempts})
    put_u64(b, v);
  append(submitted_rec, b, true);
}

void journal::started(const std::string& task_id, std::uint32_t attempt,
                      const std::string& worker) {
  std::string b;
  put_str(b, task_id);
  put_u64(b, attempt);
  put_str(b, worker);
  append(started_rec, b, true);
}

void journal::requeued(const std::string& task_id, std::uint32_t attempt) {
  std::string b;
  put_str(b, task_id);
  put_u64(b, attempt);
  append(requeued_rec, b, true);
}

void journal::ended(const std::string& task_id) {
  std::string b;
  put_str(b, task_id);
  append(ended_rec, b, true);
}

void journal::end_event(const std::string& owner, const codec::task_event& e) {
  end_event(owner, codec::encode_body(codec::message{e}));
}

void journal::end_event(const std::string& owner, std::string_view encoded) {
  std::string b;
  put_str(b, owner);
  put_str(b, encoded);
  append(end_event_rec, b, true);
}

void journal::reserved(const std::string& owner, std::uint64_t head) {
  std::string b;
  put_str(b, owner);
  put_u64(b, head);
  append(reserved_rec, b, true);
}

void journal::acked(const std::string& owner, std::uint64_t acked) {
  std::string b;
  put_str(b, owner);
  put_u64(b, acked);
  append(acked_rec, b, false);  // lagging behind is safe: more is sent again after a restart
}

void journal::stream_dropped(const std::string& owner) {
  std::string b;
  put_str(b, owner);
  append(dropped_rec, b, true);
}

void journal::policy(const std::string& publisher, const codec::policy& p) {
  std::string b;
  put_str(b, publisher);
  put_str(b, codec::encode_body(codec::message{p}));
  append(policy_rec, b, true);
}

void journal::write_all(const char* data, std::size_t n) {
  while (n > 0) {
    const auto w = ::write(fd_, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      throw journal_error(fmt::format("journal {}: cannot write: {}", path_, errno_text()));
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

void journal::flush() {
  if (buf_.empty()) return;
  write_all(buf_.data(), buf_.size());
  stats_.bytes += buf_.size();
  buf_.clear();
  unsynced_ = true;
  if (fsync_ == fsync_policy::always) {
    sync();
  } else if (fsync_ == fsync_policy::batch && !sync_due_) {
    sync_due_ = util::clock::now() + batch_interval;
  }
}

void journal::sync() {
  if (::fdatasync(fd_) != 0)
    throw journal_error(fmt::format("journal {}: cannot sync: {}", path_, errno_text()));
  ++stats_.fsyncs;
  unsynced_ = false;
  sync_due_.reset();
}

void journal::on_timer(util::time_point now) {
  flush();
  if (sync_due_ && *sync_due_ <= now) sync();
}

std::optional<util::time_point> journal::next_due() const {
  return sync_due_;
}

void journal::compact(const std::function<void(journal&)>& fill) {
  flush();
  const auto tmp = path_ + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    throw journal_error(fmt::format("journal {}: cannot create {}: {}", path_, tmp, errno_text()));
  const int old_fd = fd_;
  const auto old_size = size_;
  fd_ = fd;
  size_ = 0;
  try {
    write_all(signature.data(), signature.size());
    size_ = signature.size();
    compacting_ = true;  // one write and one sync at the end, not one per record
    fill(*this);
    compacting_ = false;
    write_all(buf_.data(), buf_.size());
    buf_.clear();
    sync();
    if (::rename(tmp.c_str(), path_.c_str()) != 0)
      throw journal_error(
          fmt::format("journal {}: cannot replace it with {}: {}", path_, tmp, errno_text()));
  } catch (...) {
    compacting_ = false;
    ::close(fd);
    ::unlink(tmp.c_str());
    fd_ = old_fd;
    size_ = old_size;
    buf_.clear();
    throw;
  }
  ::close(old_fd);
  // The rename itself must reach the disk, or a crash could bring the old file back.
  const auto slash = path_.rfind('/');
  const auto dir = slash == std::string::npos ? std::string(".") : path_.substr(0, slash + 1);
  if (const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    (void)::fsync(d);
    ::close(d);
  }
  ++stats_.compactions;
  compact_at_ = std::max(compact_bytes_, 2 * size_);
  spdlog::info("journal {}: compacted to {} bytes", path_, size_);
}

}  // namespace rlbus::broker
