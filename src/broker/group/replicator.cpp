// See replicator.hpp.
#include "broker/group/replicator.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "codec/codec.hpp"
#include "util/bind.hpp"
#include "util/poll.hpp"

namespace rlbus::broker {

namespace {

constexpr auto heartbeat = std::chrono::milliseconds(500);
// A standby that says nothing (it answers every RECORDS) for this long is forgotten.
constexpr auto forget_after = std::chrono::milliseconds(6000);
constexpr std::size_t part_bytes = std::size_t{1024} * 1024;  // of a SNAPSHOT part, or more for
                                                              // a larger record
constexpr int send_queue = 10'000;
// A standby this close behind what was streamed is waited for (it catches up within a turn or
// two); one further behind first catches up without holding the leader back.
constexpr std::uint64_t join_lag =
    std::uint64_t{1024} * 1024;  // messages for one standby that libzmq holds at most

}  // namespace

replicator::replicator(zmq::context_t& ctx, gatekeeper& gate, replicator_config cfg, journal& j)
    : cfg_(std::move(cfg)), gate_(gate), journal_(j), sock_(ctx, zmq::socket_type::router) {
  sock_.set(zmq::sockopt::router_mandatory, 1);
  sock_.set(zmq::sockopt::linger, 0);
  sock_.set(zmq::sockopt::sndhwm, send_queue);
  sock_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(4096));  // SYNC and SYNCED are small
  monitor_ = gate_.secure(sock_, zap_domain_replication);
  try {
    util::bind_freed(sock_, cfg_.endpoint);
  } catch (...) {
    gate_.release(monitor_);  // before the socket closes (gatekeeper.hpp)
    throw;
  }
  pending_from_ = journal_.position();
  published_ = {cfg_.self};  // what its election recorded
  journal_.tap([this](std::string_view record) {
    if (!standbys_.empty()) pending_.append(record);
  });
  if (cfg_.publish_in_sync) recorder_ = std::thread([this] { record_loop(); });
}

replicator::~replicator() {
  if (recorder_.joinable()) {
    {
      const std::lock_guard<std::mutex> hold(record_mutex_);
      record_stop_ = true;
    }
    record_wake_.notify_all();
    recorder_.join();  // within one etcd request's timeout
  }
  journal_.tap(nullptr);
  gate_.release(monitor_);
}

void replicator::record_loop() {
  std::unique_lock<std::mutex> hold(record_mutex_);
  while (true) {
    record_wake_.wait(hold, [this] { return record_stop_ || to_record_.has_value(); });
    if (record_stop_) return;
    auto members = std::move(*to_record_);
    to_record_.reset();
    hold.unlock();
    const bool ok = cfg_.publish_in_sync(members);
    hold.lock();
    // After a failure, a pause before the loop asks again: etcd may be gone for a while.
    if (!ok && record_wake_.wait_for(hold, std::chrono::milliseconds(100),
                                     [this] { return record_stop_; }))
      return;
    recorded_.emplace(std::move(members), ok);
    hold.unlock();
    if (cfg_.wake) cfg_.wake();
    hold.lock();
  }
}

void replicator::take_recorded() {
  const std::lock_guard<std::mutex> hold(record_mutex_);
  if (!recorded_) return;
  if (recorded_->second) published_ = std::move(recorded_->first);
  recorded_.reset();
  recording_ = false;
}

void replicator::ask_record(const std::vector<std::string>& members) {
  {
    const std::lock_guard<std::mutex> hold(record_mutex_);
    if (recording_) return;  // one at a time: asked again once its answer is taken up
    to_record_ = members;
    recording_ = true;
  }
  record_wake_.notify_all();
}

std::vector<std::string> replicator::successors() const {
  std::vector<std::string> out;
  for (const auto& s : standbys_)
    if (s.in_sync && !s.leaving && !s.gone &&
        std::find(published_.begin(), published_.end(), s.member) != published_.end())
      out.push_back(s.member);
  return out;
}

bool replicator::send_to(standby& s, const codec::message& m) {
  const auto h = codec::make_header(codec::type_of(m));
  const auto body = codec::encode_body(m);
  try {
    if (!sock_.send(zmq::buffer(s.routing_id),
                    zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return false;  // its queue is full: it reads nothing
  } catch (const zmq::error_t& e) {
    if (e.num() != EHOSTUNREACH) throw;
    return false;  // its connection is gone
  }
  sock_.send(zmq::buffer(h), zmq::send_flags::sndmore);
  sock_.send(zmq::buffer(body), zmq::send_flags::none);
  return true;
}

void replicator::forget(std::size_t i, const std::string& why) {
  auto& s = standbys_[i];
  if (s.gone) return;
  spdlog::warn("replication: forgets standby {}: {}", s.member, why);
  if (!s.in_sync) {
    standbys_.erase(standbys_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
  s.leaving = s.gone = true;  // waited for until the group knows it is out of sync
  settle();
}

void replicator::settle() {
  // Recorded once it holds everything released before it was waited for, too.
  std::vector<std::string> now{cfg_.self};
  for (const auto& s : standbys_)
    if (s.in_sync && !s.leaving && s.acked >= s.joined_at) now.push_back(s.member);
  if (now != published_) {
    if (cfg_.publish_in_sync)
      take_recorded();
    else
      published_ = now;
    if (now != published_) {
      ask_record(now);  // taken up on a later turn (the recorder wakes the loop)
      return;
    }
  }
  for (auto& s : standbys_)
    if (s.leaving) {
      s.in_sync = s.leaving = false;
      ++dropped_total_;
    }
  standbys_.erase(
      std::remove_if(standbys_.begin(), standbys_.end(), [](const standby& s) { return s.gone; }),
      standbys_.end());
}

void replicator::on_readable(util::time_point now) {
  for (int n = 0; n < 1000; ++n) {
    util::frame_array frames;  // routing id, header, body
    if (!util::try_recv(sock_, frames[0])) return;
    const auto got = util::read_rest(sock_, frames);
    if (got.count != 3 || got.overflow) continue;  // only the group's brokers get here
    const auto h = codec::parse_header(frames[1].to_string_view());
    if (!h) continue;
    auto m = codec::decode_body(h->type, frames[2].to_string_view(), codec::decode_limits{});
    if (!m) continue;
    const std::string routing_id(frames[0].to_string_view());
    if (const auto* s = std::get_if<codec::repl_sync>(&m.value())) {
      on_sync(routing_id, s->member, s->leader_epoch, now);
    } else if (const auto* a = std::get_if<codec::repl_synced>(&m.value())) {
      const auto it = std::find_if(standbys_.begin(), standbys_.end(),
                                   [&](const standby& s) { return s.routing_id == routing_id; });
      if (it == standbys_.end() || it->gone) continue;
      it->heard = now;
      if (a->position < it->acked || a->position > journal_.position()) continue;
      it->acked = a->position;
      if (!it->in_sync && !it->gone && it->acked >= it->snapshot &&
          pending_from_ - std::min(pending_from_, it->acked) <= join_lag) {
        it->in_sync = true;  // waited for from now on, then recorded
        it->joined_at = journal_.position();
        spdlog::info("replication: standby {} is in sync at position {}", it->member, it->acked);
        settle();
      }
    }
  }
}

void replicator::on_sync(const std::string& routing_id, const std::string& member,
                         std::uint64_t epoch, util::time_point now) {
  if (epoch != cfg_.leader_epoch) {
    spdlog::info("replication: {} asked for leadership {}, this one is {}", member, epoch,
                 cfg_.leader_epoch);
    return;
  }
  push(now);  // what the others are owed first: the snapshot starts where they stand
  for (std::size_t i = 0; i < standbys_.size(); ++i)
    if (!standbys_[i].gone &&
        (standbys_[i].routing_id == routing_id || standbys_[i].member == member)) {
      forget(i, "it asked again");
      break;
    }
  // One in sync until now may start over only once the group knows it is not (it asks again).
  if (std::any_of(standbys_.begin(), standbys_.end(),
                  [&](const standby& s) { return s.member == member; }))
    return;
  const auto records = journal_.records_in_file();
  standby s{routing_id, member};
  s.snapshot = journal_.position();
  s.acked = 0;
  s.heard = s.sent = now;
  std::size_t at = 0;
  bool sent = true;
  do {
    // Whole records of at most part_bytes (or one larger record alone).
    std::size_t end = at;
    while (end < records.size()) {
      const auto next = journal::record_end(records, end);
      if (next - at > part_bytes && end > at) break;
      end = next;
    }
    codec::repl_snapshot part{cfg_.leader_epoch, s.snapshot, std::nullopt, end >= records.size()};
    if (end > at) part.records = records.substr(at, end - at);
    sent = send_to(s, part);
    at = end;
  } while (sent && at < records.size());
  if (!sent) {
    spdlog::warn("replication: could not send standby {} its snapshot", member);
    return;
  }
  spdlog::info("replication: standby {} gets the journal at position {} ({} bytes)", member,
               s.snapshot, records.size());
  standbys_.push_back(std::move(s));
}

void replicator::push(util::time_point now) {
  const auto sent_from = pending_from_;
  const bool any = !pending_.empty();
  pending_from_ = journal_.position();
  for (std::size_t i = 0; i < standbys_.size(); ++i) {
    auto& s = standbys_[i];
    if (s.gone) continue;
    if (now - s.heard > forget_after) {
      forget(i, fmt::format("it said nothing for {} ms", forget_after.count()));
      continue;
    }
    if (s.in_sync && !s.leaving && s.acked < sent_from) {
      if (s.behind_since == util::time_point{}) s.behind_since = now;
      if (now - s.behind_since > cfg_.sync_timeout) {
        s.leaving = true;
        spdlog::warn(
            "replication: standby {} is {} bytes behind for more than {} ms (sync-timeout): "
            "the leader stops waiting for it",
            s.member, sent_from - s.acked, cfg_.sync_timeout.count());
      }
    } else if (s.acked >= sent_from) {
      s.behind_since = {};
    }
    if (any || now - s.sent >= heartbeat) {
      codec::repl_records r{cfg_.leader_epoch, sent_from, std::nullopt};
      if (any) r.records = pending_;
      if (!send_to(s, r)) {
        forget(i, "it reads nothing of what it is sent");
        continue;
      }
      s.sent = now;
    }
  }
  pending_.clear();
  settle();
  next_due_ = now + std::min<util::clock::duration>(heartbeat, cfg_.sync_timeout);
}

std::uint64_t replicator::held_by_all() const {
  auto held = journal_.position();
  for (const auto& s : standbys_)
    if (s.in_sync) held = std::min(held, s.acked);
  return held;
}

std::vector<replicator::standby_state> replicator::standbys() const {
  std::vector<standby_state> out;
  for (const auto& s : standbys_)
    if (!s.gone)
      out.push_back({s.member, s.acked,
                     journal_.position() - std::min(s.acked, journal_.position()), s.in_sync});
  return out;
}

}  // namespace rlbus::broker
