// See unconfirmed.hpp.
#include "client/tasks/unconfirmed.hpp"

#include <algorithm>
#include <variant>

namespace rlbus::client::detail {

void unconfirmed_data::track(const std::string& task_id, std::uint32_t attempt) {
  task_ = task_id;
  attempt_ = attempt;
  confirmed_ = 0;
  dropped_upto_ = 0;
  kept_.clear();
  kept_bytes_ = 0;
}

bool unconfirmed_data::ours(const std::string& task_id, std::uint32_t attempt) const {
  return attempt_ != 0 && attempt == attempt_ && task_id == task_;
}

std::size_t unconfirmed_data::size_of(const codec::message& m) {
  if (const auto* i = std::get_if<codec::info>(&m)) return i->body.size();
  if (const auto* l = std::get_if<codec::learn_info>(&m))
    return l->buffer_id.size() + l->info.size();
  const auto& d = std::get<codec::data_ready>(m);
  return d.data_id.size() + d.buffer_id.size() + d.meta.size() +
         (d.payload ? d.payload->size() : 0);
}

std::optional<std::uint64_t> unconfirmed_data::index_of(const codec::message& m) const {
  if (const auto* d = std::get_if<codec::data_ready>(&m))
    return d->index && ours(d->task_id, d->attempt) ? d->index : std::nullopt;
  if (const auto* i = std::get_if<codec::info>(&m))
    return i->index && ours(i->task_id, i->attempt) ? i->index : std::nullopt;
  if (const auto* l = std::get_if<codec::learn_info>(&m))
    return l->index && ours(l->task_id, l->attempt) ? l->index : std::nullopt;
  return std::nullopt;
}

void unconfirmed_data::sent(codec::message&& m) {
  if (!index_of(m)) return;
  kept_bytes_ += size_of(m);
  kept_.push_back(std::move(m));
  while (kept_.size() > max_items_ || (kept_bytes_ > max_bytes_ && kept_.size() > 1)) {
    dropped_upto_ = *index_of(kept_.front());
    kept_bytes_ -= size_of(kept_.front());
    kept_.pop_front();
    ++dropped_count_;
  }
}

void unconfirmed_data::confirm(std::uint64_t relayed) {
  confirmed_ = std::max(confirmed_, relayed);
  while (!kept_.empty() && *index_of(kept_.front()) <= confirmed_) {
    kept_bytes_ -= size_of(kept_.front());
    kept_.pop_front();
  }
}

bool unconfirmed_data::worth_sending(const codec::message& m) const {
  if (const auto index = index_of(m)) return *index > confirmed_;
  if (const auto* l = std::get_if<codec::data_lost>(&m))
    return !(ours(l->task_id, l->attempt) && l->last <= confirmed_);
  return true;
}

void unconfirmed_data::resend(std::deque<codec::message>& outbox) {
  resent_count_ += kept_.size();
  while (!kept_.empty()) {
    outbox.push_front(std::move(kept_.back()));
    kept_.pop_back();
  }
  kept_bytes_ = 0;
  if (dropped_upto_ > confirmed_)
    outbox.push_front(codec::data_lost{task_, attempt_, confirmed_ + 1, dropped_upto_});
}

}  // namespace rlbus::client::detail
