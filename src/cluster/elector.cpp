// See elector.hpp.
#include "cluster/elector.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "cluster/etcd.hpp"

namespace rlbus::cluster {

namespace {

using json = nlohmann::json;

// Whether `value` ({"members": [...]}) names `member`.
bool in_sync(const std::string& value, const std::string& member) {
  const auto members = in_sync_members(value);
  return std::find(members.begin(), members.end(), member) != members.end();
}

leader_info leader_of(const etcd_kv& kv) {
  leader_info l;
  l.epoch = kv.create_revision;
  const auto v = json::parse(kv.value, nullptr, false);
  if (v.is_object()) {
    l.member = v.value("member", "");
    l.advertise = v.value("advertise", "");
    l.replication = v.value("replication", "");
    l.since_ms = v.value("since", std::int64_t{0});
  }
  if (l.member.empty()) l.member = "(not a broker: " + kv.value.substr(0, 64) + ")";
  return l;
}

// Clock rates of the leader's machine and etcd's may differ a little: the leader counts a
// lease's seconds as this much shorter than they are.
constexpr double rate_allowance = 0.01;

}  // namespace

std::vector<std::string> in_sync_members(const std::string& value) {
  std::vector<std::string> out;
  const auto v = json::parse(value, nullptr, false);
  if (v.is_object() && v.contains("members") && v["members"].is_array())
    for (const auto& m : v["members"])
      if (m.is_string()) out.push_back(m.get<std::string>());
  return out;
}

leader_info leader_of(const std::vector<std::string>& etcd, const std::string& group,
                      std::chrono::milliseconds timeout) {
  etcd_client c(etcd, timeout);
  const auto kv = c.get("/rlbus/" + group + "/leader");
  return kv ? leader_of(*kv) : leader_info{};
}

elector::elector(elector_config cfg) : cfg_(std::move(cfg)) {
  if (cfg_.group.empty()) throw std::invalid_argument("a cluster needs a name");
  if (cfg_.member.empty()) throw std::invalid_argument("a member of a cluster needs a name");
  if (cfg_.lease_ttl.count() < 1) throw std::invalid_argument("the lease must last 1 s or more");
  if (cfg_.margin >= cfg_.lease_ttl)
    throw std::invalid_argument(
        fmt::format("the lease margin ({} ms) must be shorter than the lease ({} s)",
                    cfg_.margin.count(), cfg_.lease_ttl.count()));
  if (cfg_.renew * 2 > cfg_.lease_ttl - cfg_.margin)
    throw std::invalid_argument(fmt::format(
        "renewing every {} ms leaves less than two renewals in the {} ms a leader may serve",
        cfg_.renew.count(),
        std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.lease_ttl - cfg_.margin)
            .count()));
  // The client is made on the thread that uses it; a bad URL is reported here, though.
  etcd_client check(cfg_.etcd, cfg_.timeout);
  thread_ = std::thread([this] { run(); });
}

elector::~elector() {
  stop_ = true;
  notify();
  if (thread_.joinable()) thread_.join();
}

leader_info elector::leader() const {
  const std::lock_guard lock(mu_);
  return leader_;
}

void elector::wait_change(util::time_point until) {
  std::unique_lock lock(mu_);
  const auto seen = changes_;
  cv_.wait_until(lock, until, [&] { return changes_ != seen || stop_; });
}

void elector::resign() {
  resign_ = true;
  serving_until_ = 0;
  notify();
}

void elector::step_aside() {
  aside_ = true;
  serving_until_ = 0;
  notify();
}

void elector::notify() {
  {
    const std::lock_guard lock(mu_);
    ++changes_;
  }
  cv_.notify_all();
}

void elector::set_leader(leader_info l) {
  {
    const std::lock_guard lock(mu_);
    if (l.epoch == leader_.epoch && l.member == leader_.member) return;
    leader_ = std::move(l);
    ++changes_;
  }
  cv_.notify_all();
}

void elector::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, d, [&] { return stop_ || resign_ || aside_; });
}

void elector::run() {
  etcd_client etcd(cfg_.etcd, cfg_.timeout);
  const auto failed = [&](const std::exception& e) {
    reachable_ = false;
    if (last_error_ != e.what()) spdlog::warn("cluster {}: etcd: {}", cfg_.group, e.what());
    last_error_ = e.what();
  };
  const auto answered = [&] {
    if (!reachable_ && !last_error_.empty())
      spdlog::info("cluster {}: etcd answers again ({})", cfg_.group, etcd.endpoint());
    reachable_ = true;
    last_error_.clear();
  };
  // A lease it no longer leads under goes back to etcd, so that a standby need not wait for
  // it to run out; when etcd cannot be told now, it is told later.
  const auto give_back = [&] {
    try {
      etcd.revoke(lease_);
    } catch (const std::exception& e) {
      orphan_ = lease_;
      failed(e);
    }
    lease_ = 0;
  };
  while (!stop_) {
    if (resign_) {
      // The broker is stopping: it gives its leadership back and never campaigns again (a
      // campaign now would record it alone in sync, and the standbys could not follow it).
      if (lease_ != 0) {
        step_down("resigned");
        give_back();
      }
      break;
    }
    if (aside_.exchange(false) && lease_ != 0) {
      step_down("it could not serve");
      give_back();
      sleep_for(std::chrono::seconds(1));
      continue;
    }
    if (lease_ == 0) {
      // A standby: who leads, and if nobody does, try to.
      try {
        if (orphan_ != 0) {  // a lease of its own it could not give back when it stepped down
          etcd.revoke(orphan_);
          orphan_ = 0;
        }
        const auto now = etcd.get(key());
        answered();
        if (now) {
          set_leader(leader_of(*now));
        } else if (const auto insync = etcd.get(insync_key());
                   insync && !in_sync(insync->value, cfg_.member)) {
          // The last leader's state is held by others only: one of them must lead.
          if (!told_not_in_sync_)
            spdlog::warn(
                "cluster {}: {} may not lead: it does not hold everything the last leader "
                "accepted (in sync: {}); it waits for a member that does",
                cfg_.group, cfg_.member, insync->value);
          told_not_in_sync_ = true;
        } else {
          const auto asked = util::clock::now();
          const auto lease = etcd.grant(cfg_.lease_ttl.count());
          std::optional<etcd_kv> holder;
          json value = {
              {"member", cfg_.member}, {"advertise", cfg_.advertise}, {"since", util::wall_ms()}};
          if (!cfg_.replication.empty()) value["replication"] = cfg_.replication;
          // With it, in one transaction: who is in sync now (itself alone), or nobody to wait
          // for when it copies nothing; and neither if the set changed since it was read.
          std::optional<std::string> now_in_sync;
          if (cfg_.replicates) now_in_sync = json{{"members", json::array({cfg_.member})}}.dump();
          if (etcd.create_with(key(), value.dump(), lease.id, insync_key(),
                               insync ? insync->mod_revision : 0, now_in_sync, &holder) &&
              holder) {
            told_not_in_sync_ = false;
            lease_ = lease.id;
            epoch_ = holder->create_revision;
            set_leader(leader_of(*holder));
            extend(asked, lease.ttl_s);
            spdlog::info("cluster {}: {} leads, epoch {} (lease {} s)", cfg_.group, cfg_.member,
                         holder->create_revision, lease.ttl_s);
            notify();
          } else {
            etcd.revoke(lease.id);
            if (holder) set_leader(leader_of(*holder));
          }
        }
      } catch (const std::exception& e) {
        failed(e);
      }
      if (lease_ == 0) sleep_for(cfg_.poll);
      continue;
    }
    // The leader: renew, and make sure the key is still ours. A leadership whose time ran out
    // is over, even if its lease is renewed after all (etcd gives leases their full time
    // again when it restarts): the broker has stopped serving, and leads again only under a
    // new epoch.
    const auto asked = util::clock::now();
    if (asked >= serving_until()) {
      step_down("its lease could not be renewed in time");
      give_back();
      continue;
    }
    try {
      const auto ttl = etcd.keep_alive(lease_);
      const auto now = ttl > 0 ? etcd.get(key()) : std::nullopt;
      answered();
      if (util::clock::now() >= serving_until()) continue;  // too late: over (above)
      if (ttl <= 0 || !now || now->create_revision != epoch_) {
        step_down(ttl <= 0 ? "etcd no longer knows its lease" : "its key is gone or not its own");
        give_back();
        if (now) set_leader(leader_of(*now));
        continue;
      }
      extend(asked, ttl);
    } catch (const std::exception& e) {
      failed(e);
    }
    sleep_for(std::min(cfg_.renew, std::chrono::duration_cast<std::chrono::milliseconds>(
                                       serving_until() - util::clock::now())));
  }
  if (lease_ != 0) {
    serving_until_ = 0;
    try {
      etcd.revoke(lease_);
    } catch (const std::exception&) {
    }
  }
}

void elector::extend(util::time_point asked, std::int64_t ttl_s) {
  const auto until =
      (asked +
       std::chrono::duration_cast<util::clock::duration>(
           std::chrono::duration<double>(static_cast<double>(ttl_s) * (1 - rate_allowance))) -
       cfg_.margin)
          .time_since_epoch()
          .count();
  // Never past a resign() that came meanwhile (it clears the time after raising the flag).
  auto was = serving_until_.load();
  while (!resign_ && !aside_ && until > was && !serving_until_.compare_exchange_weak(was, until)) {
  }
}

void elector::step_down(const std::string& why) {
  serving_until_ = 0;
  const auto was = epoch_.exchange(0);
  spdlog::warn("cluster {}: {} no longer leads (epoch {}): {}", cfg_.group, cfg_.member, was, why);
  set_leader({});  // until the next one is seen
  notify();
}

}  // namespace rlbus::cluster
