// See journal.hpp for the file and its guarantees. Reading is written for a file that may be
// torn or damaged: every length is checked against what is left and against a bound before
// anything is allocated, and every embedded message goes through the protocol decoder.
#include "broker/durability/journal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "codec/codec.hpp"
#include "util/errno_text.hpp"

namespace rlbus::broker {

namespace {

constexpr std::string_view file_signature{"RLBUSJ1\n"};
constexpr std::size_t record_header = 8;  // length, CRC
// A record holds at most a task_info or an event body (each within max-message) and a few ids.
constexpr std::size_t max_record = std::size_t{64} * 1024 * 1024;

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

// The little-endian u32 at `at` of `bytes` (4 bytes there).
std::uint32_t u32_at(std::string_view bytes, std::size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + at);
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8U |
         static_cast<std::uint32_t>(p[2]) << 16U | static_cast<std::uint32_t>(p[3]) << 24U;
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

bool known_type(std::uint8_t t) {
  return t >= submitted_rec && t <= policy_rec;
}

// What the bytes at `pos` hold as a record, judged by its header alone and its checksum.
enum class framing { whole, cut_short, impossible_length, bad_checksum };
struct framed {
  framing verdict;
  std::uint32_t len = 0;  // of type + body, as the header says
  std::string_view rec;   // type + body, when whole
};

framed frame_at(std::string_view data, std::size_t pos) {
  const auto left = data.size() - pos;
  fields head(data.substr(pos, std::min(left, record_header)));
  const auto len = head.u32();
  const auto crc = head.u32();
  if (left < record_header) return {framing::cut_short};
  if (len == 0 || len > max_record) return {framing::impossible_length, len};
  if (len > left - record_header) return {framing::cut_short, len};
  const auto rec = data.substr(pos + record_header, len);
  if (crc_of(rec) != crc) return {framing::bad_checksum, len};
  return {framing::whole, len, rec};
}

// Whether the bytes from `at` to the end can be the start of one record whose write was cut
// short: its length is possible, its type (once written) is one we write, and no whole record
// (a possible length, a known type and a checksum that holds) starts anywhere after it. A
// damaged length in the middle of the file runs past its end too, but the records after it
// are still whole. The search is bounded in the bytes it checksums; past the bound the tail
// cannot be told from damage, and is not taken for torn.
bool plausible_torn_tail(std::string_view data, std::size_t at, const framed& f) {
  if (data.size() - at < record_header) return true;  // the header itself is cut
  if (f.len == 0 || f.len > max_record) return false;
  if (data.size() - at > record_header &&
      !known_type(static_cast<std::uint8_t>(data[at + record_header])))
    return false;
  std::size_t budget = std::size_t{256} * 1024 * 1024;
  for (auto p = at + 1; p + record_header < data.size(); ++p) {
    if (!known_type(static_cast<std::uint8_t>(data[p + record_header]))) continue;
    fields head(data.substr(p, record_header));
    const auto len = head.u32();
    if (len == 0 || len > data.size() - p - record_header) continue;
    if (len > budget) return false;
    budget -= len;
    if (crc_of(data.substr(p + record_header, len)) == head.u32()) return false;
  }
  return true;
}

}  // namespace

namespace {

// The file a journal path names, through any symlinks: its lock and its compactions are the
// real file's, whatever name a broker was given.
std::string real_path(const std::string& path) {
  std::error_code ec;
  auto real = std::filesystem::weakly_canonical(path, ec);
  return ec || real.empty() ? path : real.string();
}

}  // namespace

journal::journal(std::string path, fsync_policy fsync, const codec::decode_limits& limits,
                 std::size_t compact_bytes)
    : path_(real_path(path)), fsync_(fsync), compact_bytes_(compact_bytes) {
  if (path_ != path) spdlog::info("journal {}: the file {} names", path_, path);
  lock();
  fd_ = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0)
    throw journal_error(fmt::format("journal {}: cannot open: {}", path_, util::errno_text()));
  lock_file(fd_);  // before anything is read: a hard link of a live journal is refused here
  try {
    load(limits);
  } catch (...) {
    ::close(fd_);  // and its lock with it: no destructor runs for a journal not made
    throw;
  }
  if (loaded_.short_signature && ::ftruncate(fd_, 0) != 0)
    throw journal_error(fmt::format("journal {}: cannot empty it: {}", path_, util::errno_text()));
  if (loaded_.bytes == 0) {
    write_all(file_signature.data(), file_signature.size());
    sync();
  }
  size_ = std::max(loaded_.bytes, file_signature.size());
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

journal::owned_fd::~owned_fd() {
  if (fd >= 0) ::close(fd);
}

// The journal file itself (its inode) is locked too, for as long as it is the journal: a name
// that is not PATH (a hard link) has another PATH.lock, but not another file.
void journal::lock_file(int fd) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return;
  const auto why = errno;
  ::close(fd);
  fd_ = -1;
  if (why == EWOULDBLOCK)
    throw journal_in_use(fmt::format(
        "journal {}: another broker is using this file under another name (a hard link); two "
        "brokers on one journal would both run its tasks. Stop that one first, or give this "
        "one a journal of its own",
        path_));
  throw journal_error(fmt::format("journal {}: cannot lock it: {}", path_, std::strerror(why)));
}

// One broker per journal: an exclusive lock on PATH.lock, held for the journal's life (the
// journal itself is replaced at each compaction, so the lock on it moves with each new file).
// The file says which process holds it.
void journal::lock() {
  lock_.fd = lock_path(path_);
}

int journal::lock_path(const std::string& path) {
  const auto lock_path = path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    throw journal_error(fmt::format("journal {}: cannot open its lock {}: {}", path, lock_path,
                                    util::errno_text()));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const auto why = errno;
    char held[32] = {};
    const auto n = ::pread(fd, held, sizeof held - 1, 0);
    std::string holder(held, n > 0 ? static_cast<std::size_t>(n) : 0);
    holder.erase(
        std::remove_if(holder.begin(), holder.end(), [](char c) { return c < '0' || c > '9'; }),
        holder.end());
    ::close(fd);
    if (why == EWOULDBLOCK)
      throw journal_in_use(fmt::format(
          "journal {}: another broker is using it{} (it holds {}); two brokers on one journal "
          "would both run its tasks. Stop that one first, or give this one a journal of its own",
          path, holder.empty() ? "" : fmt::format(" (process {})", holder), lock_path));
    throw journal_error(
        fmt::format("journal {}: cannot lock {}: {}", path, lock_path, std::strerror(why)));
  }
  const auto pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    spdlog::warn("journal {}: cannot write this process's id into {}: {}", path, lock_path,
                 util::errno_text());
  return fd;
}

// The file as it was read, beside it, before a compaction writes it afresh without its torn
// tail: what the broker could not read is never thrown away by the broker.
void journal::keep_torn(std::string_view data) {
  const auto aside = path_ + ".torn";
  const int fd = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    throw journal_error(fmt::format("journal {}: cannot keep the file as read in {}: {}", path_,
                                    aside, util::errno_text()));
  const int held = fd_;
  fd_ = fd;
  try {
    write_all(data.data(), data.size());
    if (fsync_ != fsync_policy::none) sync();
  } catch (...) {
    fd_ = held;
    ::close(fd);
    throw;
  }
  fd_ = held;
  ::close(fd);
  loaded_.torn_kept = aside;
}

void journal::load(const codec::decode_limits& limits) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return;  // a new journal
    throw journal_error(fmt::format("journal {}: cannot read: {}", path_, util::errno_text()));
  }
  std::string data;
  char chunk[65536];
  while (true) {
    const auto n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const auto why = util::errno_text();
      ::close(fd);
      throw journal_error(fmt::format("journal {}: cannot read: {}", path_, why));
    }
    if (n == 0) break;
    data.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  loaded_.bytes = data.size();
  if (data.empty()) return;
  if (data.size() < file_signature.size() && file_signature.substr(0, data.size()) == data) {
    // A crash while the file was being created: it never held a record.
    spdlog::warn(
        "journal {}: {} bytes, the start of a signature and nothing else (a crash "
        "while it was created): taken as empty",
        path_, data.size());
    loaded_.bytes = 0;
    loaded_.short_signature = true;
    return;
  }
  if (data.size() < file_signature.size() ||
      data.compare(0, file_signature.size(), file_signature) != 0)
    throw journal_error(fmt::format(
        "journal {}: not an rlbus journal (its first bytes are not the signature); name "
        "another file or move this one aside",
        path_));

  std::unordered_map<std::string, journal_task> tasks;
  std::map<std::string, journal_state::stream>& streams = loaded_.streams;
  std::map<std::string, journal_state::policy> policies;
  std::size_t pos = file_signature.size();
  const auto damaged = [&](std::size_t at, const std::string& what) {
    throw journal_error(fmt::format(
        "journal {}: the record at byte {} {}, and {} bytes follow it: the file is damaged, "
        "so the broker does not start. To start with the {} records before it (what follows "
        "is lost), cut the file there: truncate -s {} {}; or move it aside to start without "
        "any",
        path_, at, what, data.size() - at, loaded_.records, at, path_));
  };
  while (pos < data.size()) {
    const auto at = pos;
    const auto framing_at = frame_at(data, pos);
    if (framing_at.verdict != framing::whole) {
      if (std::all_of(data.begin() + static_cast<std::ptrdiff_t>(at), data.end(),
                      [](char c) { return c == 0; })) {
        loaded_.torn = fmt::format(
            "the file ends in {} zero bytes at byte {} (space the file "
            "system gave to a write that never reached it)",
            data.size() - at, at);
      } else if (framing_at.verdict == framing::cut_short &&
                 plausible_torn_tail(data, at, framing_at)) {
        loaded_.torn = fmt::format("the last record, at byte {}, is cut short ({} of {} bytes)", at,
                                   data.size() - at, record_header + framing_at.len);
      } else {
        damaged(at, framing_at.verdict == framing::bad_checksum ? "fails its checksum"
                    : framing_at.verdict == framing::cut_short
                        ? fmt::format("says it is {} bytes long, past the end of the file",
                                      framing_at.len)
                        : fmt::format("has an impossible length ({})", framing_at.len));
      }
      keep_torn(data);
      break;
    }
    const std::string_view rec = framing_at.rec;
    pos += record_header + rec.size();
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
        if (good) {
          // The event ends its task, whether or not the record that erases the task made it
          // to the file after it (a crash between the two).
          if (auto it = tasks.find(e->task_id); it != tasks.end() && it->second.owner == owner)
            tasks.erase(it);
          streams[owner].ends.push_back(std::move(*e));
        }
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
  const auto from = buf_.size();
  put_u32(buf_, static_cast<std::uint32_t>(rec.size()));
  put_u32(buf_, crc_of(rec));
  buf_.append(rec);
  size_ += record_header + rec.size();
  ++stats_.records;
  if (!compacting_) {
    position_ += record_header + rec.size();
    if (tap_) tap_(std::string_view(buf_).substr(from));
  }
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
      throw journal_error(fmt::format("journal {}: cannot write: {}", path_, util::errno_text()));
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
    sync_due_ = util::clock::now() + batch_sync_interval;
  }
}

void journal::sync() {
  if (::fdatasync(fd_) != 0)
    throw journal_error(fmt::format("journal {}: cannot sync: {}", path_, util::errno_text()));
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

std::string_view journal::signature() {
  return file_signature;
}

std::size_t journal::record_end(std::string_view bytes, std::size_t at) {
  return at + record_header + u32_at(bytes, at);
}

std::size_t journal::whole_records(std::string_view bytes, std::string* why) {
  std::size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < record_header) {
      if (why) *why = fmt::format("a record header cut short at byte {}", at);
      return at;
    }
    const auto length = u32_at(bytes, at);
    if (length == 0 || length > max_record || length > bytes.size() - at - record_header) {
      if (why) *why = fmt::format("a record of length {} at byte {} does not fit", length, at);
      return at;
    }
    if (crc_of(bytes.substr(at + record_header, length)) != u32_at(bytes, at + 4)) {
      if (why) *why = fmt::format("the record at byte {} fails its checksum", at);
      return at;
    }
    at += record_header + length;
  }
  return at;
}

std::string journal::records_in_file() {
  flush();
  std::string out(size_ - file_signature.size(), '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    const auto n = ::pread(fd_, out.data() + got, out.size() - got,
                           static_cast<off_t>(file_signature.size() + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw journal_error(fmt::format("journal {}: cannot read it back: {}", path_,
                                      n < 0 ? util::errno_text() : std::string("it is shorter")));
    got += static_cast<std::size_t>(n);
  }
  return out;
}

void journal::compact(const std::function<void(journal&)>& fill) {
  flush();
  const auto tmp = path_ + ".tmp";
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    throw journal_error(
        fmt::format("journal {}: cannot create {}: {}", path_, tmp, util::errno_text()));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0)  // the new file carries the journal's lock on
    spdlog::warn("journal {}: cannot lock {}: {}", path_, tmp, util::errno_text());
  const int old_fd = fd_;
  const auto old_size = size_;
  fd_ = fd;
  size_ = 0;
  try {
    write_all(file_signature.data(), file_signature.size());
    size_ = file_signature.size();
    compacting_ = true;  // one write and one sync at the end, not one per record
    fill(*this);
    compacting_ = false;
    write_all(buf_.data(), buf_.size());
    buf_.clear();
    sync();
    if (::rename(tmp.c_str(), path_.c_str()) != 0)
      throw journal_error(
          fmt::format("journal {}: cannot replace it with {}: {}", path_, tmp, util::errno_text()));
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
