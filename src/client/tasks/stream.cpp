// See stream.hpp.
#include "client/tasks/stream.hpp"

#include <variant>

#include <spdlog/spdlog.h>

namespace rlbus::client::detail {

namespace {
constexpr std::uint64_t ack_every = 32;    // processed events per ACK while more are queued
constexpr std::size_t max_early = 65'536;  // events kept that arrived ahead of a gap
}  // namespace

void event_stream::on_welcome(const codec::welcome& w) {
  // A new session that adopted our own stream (it expired while we were cut off, §12.5.8)
  // goes on like a resumption.
  const bool ours_again = w.stream_acked && next_seq_ > 1 && *w.stream_acked <= processed_;
  if (!w.resumed && !ours_again) {
    // A new session begins a new stream at 1, and what the old one still owed us went with it
    // (the broker cancelled its tasks); unless it adopted the stream an earlier process of our
    // id left, which goes on after stream_acked.
    if (w.stream_acked) {
      spdlog::info(
          "coordinator {}: adopted the tasks of an earlier session; the stream goes on after {}",
          id_, *w.stream_acked);
    } else if (next_seq_ > 1) {
      spdlog::warn("coordinator {}: new session, the stream starts again at 1", id_);
    }
    ++generation_;
    processed_ = w.stream_acked.value_or(0);
    next_seq_ = processed_ + 1;
    since_ack_ = 0;
    early_.clear();
    // ACKs and REPLAYs still queued name seqs of the old stream.
    std::erase_if(io_.outbox(), [](const codec::message& q) {
      return std::holds_alternative<codec::ack>(q) || std::holds_alternative<codec::replay>(q);
    });
  }
  // First thing on every connection, before any SUBMIT: turn on the window and fetch what the
  // broker sent after the last event we processed (on a resumption, what went down with the
  // old connection).
  ask_replay(processed_ + 1, true);
}

void event_stream::ask_replay(std::uint64_t from, bool first) {
  replay_asked_ = next_seq_;
  ++replays_;
  if (first) {
    io_.outbox().push_front(codec::replay{from});
  } else {
    io_.outbox().push_back(codec::replay{from});
  }
  io_.wake();
}

void event_stream::on_event(codec::task_event&& e) {
  if (e.seq < next_seq_) {
    ++duplicates_;
  } else if (e.seq > next_seq_) {
    if (early_.size() < max_early) early_.emplace(e.seq, std::move(e));
  } else {
    deliver(std::move(e));
  }
  settle();
}

void event_stream::on_gap(const codec::stream_gap& g) {
  if (g.last < next_seq_) return;  // about events we have already
  if (g.first > next_seq_) {
    // Something before the gap went missing as well: ask again from there, and the broker
    // reports the gap again in its place.
    ask_replay(next_seq_);
    return;
  }
  spdlog::warn("coordinator {}: events {}..{} of the stream are lost", id_, next_seq_, g.last);
  item lost;
  lost.lost_first = next_seq_;
  lost.lost_last = g.last;
  lost.generation = generation_;
  items_.push_back(std::move(lost));
  gaps_ += g.last - next_seq_ + 1;
  next_seq_ = g.last + 1;
  settle();
}

void event_stream::on_capacity(codec::capacity&& c) {
  item it;
  it.capacity = std::move(c);
  it.generation = generation_;
  items_.push_back(std::move(it));
}

void event_stream::deliver(codec::task_event&& e) {
  ++next_seq_;
  item it;
  it.event = std::move(e);
  it.generation = generation_;
  items_.push_back(std::move(it));
}

void event_stream::settle() {
  while (!early_.empty() && early_.begin()->first <= next_seq_) {
    auto node = early_.extract(early_.begin());
    if (node.key() == next_seq_) {
      deliver(std::move(node.mapped()));
    } else {
      ++duplicates_;
    }
  }
  if (replay_asked_ && next_seq_ > *replay_asked_) replay_asked_.reset();  // that gap is filled
  if (!early_.empty() && !replay_asked_) ask_replay(next_seq_);
}

void event_stream::processed(std::uint64_t seq, std::uint64_t generation, bool more) {
  if (generation != generation_) return;  // an event of a stream that has ended
  processed_ = seq;
  if (++since_ack_ < ack_every && (more || !items_.empty())) return;
  since_ack_ = 0;
  // An ACK still waiting to go out is only made newer: ACKs are cumulative.
  auto& outbox = io_.outbox();
  if (!outbox.empty() && std::holds_alternative<codec::ack>(outbox.back())) {
    std::get<codec::ack>(outbox.back()).seq = processed_;
  } else {
    outbox.push_back(codec::ack{processed_});
  }
  io_.wake();
}

}  // namespace rlbus::client::detail
