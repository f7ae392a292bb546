// See membership.hpp.
#include "cluster/membership.hpp"

#include <optional>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "cluster/etcd.hpp"
#include "util/clock.hpp"

namespace rlbus::cluster {

namespace {

using json = nlohmann::json;

std::string prefix(const std::string& group) {
  return "/rlbus/" + group + "/members/";
}

member_info member_of(const etcd_kv& kv) {
  member_info m;
  const auto v = json::parse(kv.value, nullptr, false);
  if (v.is_object()) {
    m.member = v.value("member", "");
    m.advertise = v.value("advertise", "");
    m.version = v.value("version", "");
    m.since_ms = v.value("since", std::int64_t{0});
  }
  return m;
}

std::string value_of(const member_info& m) {
  return json{{"member", m.member},
              {"advertise", m.advertise},
              {"version", m.version},
              {"since", m.since_ms}}
      .dump();
}

}  // namespace

std::vector<member_info> members_of(const std::vector<std::string>& etcd, const std::string& group,
                                    std::chrono::milliseconds timeout) {
  etcd_client c(etcd, timeout);
  std::vector<member_info> out;
  for (const auto& kv : c.get_prefix(prefix(group))) out.push_back(member_of(kv));
  return out;
}

std::string membership::key() const {
  return prefix(group_) + me_.member;
}

membership::membership(std::vector<std::string> etcd, std::string group, member_info me,
                       std::chrono::seconds ttl, std::chrono::milliseconds timeout)
    : etcd_(std::move(etcd)),
      group_(std::move(group)),
      me_(std::move(me)),
      ttl_(ttl),
      timeout_(timeout) {
  etcd_client c(etcd_, timeout_);
  for (const auto& kv : c.get_prefix(prefix(group_))) {
    const auto other = member_of(kv);
    if (other.member == me_.member) continue;  // below
    if (other.advertise == me_.advertise)
      throw membership_conflict(fmt::format(
          "broker {} of group {} already advertises {}: give each broker its own --advertise",
          other.member, group_, me_.advertise));
    if (other.version != me_.version)
      throw membership_conflict(fmt::format(
          "broker {} of group {} runs rlbus {}, this one {}: the brokers of a group "
          "run one version (upgrade them all, one at a time, between runs)",
          other.member, group_, other.version.empty() ? "(unknown)" : other.version, me_.version));
  }
  const auto lease = c.grant(ttl_.count());
  lease_ = lease.id;
  // One of its own name: another broker, or this one's earlier run whose lease still runs.
  // That one is gone within a lease of its last renewal, once etcd's sweep of expired leases
  // (every half second) has come round, later on a busy machine: it is waited out for twice
  // the lease.
  const auto give_up = util::clock::now() + 2 * ttl_ + std::chrono::seconds(1);
  std::optional<etcd_kv> held;
  while (!c.create(key(), value_of(me_), lease_, &held)) {
    if (util::clock::now() >= give_up) {
      c.revoke(lease_);
      const auto other = held ? member_of(*held) : member_info{};
      throw membership_conflict(fmt::format(
          "a broker named {} is already a member of group {} (advertising {}): give each "
          "broker its own --cluster-member (or --advertise)",
          me_.member, group_, other.advertise));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  thread_ = std::thread([this] { run(); });
}

membership::~membership() {
  {
    const std::lock_guard<std::mutex> hold(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Keeps the lease alive; when etcd lost it (etcd restarted from an old snapshot, or the broker
// could not reach it for a whole lease), registers again under a new one.
void membership::run() {
  etcd_client c(etcd_, timeout_);
  std::unique_lock<std::mutex> hold(mu_);
  while (!cv_.wait_for(hold, ttl_ / 4, [this] { return stop_; })) {
    hold.unlock();
    try {
      if (lease_ == 0 || c.keep_alive(lease_) <= 0) {
        lease_ = c.grant(ttl_.count()).id;
        if (!c.create(key(), value_of(me_), lease_))
          spdlog::warn("cluster {}: another broker registered as {} meanwhile", group_, me_.member);
      }
    } catch (const std::exception& e) {
      spdlog::debug("cluster {}: membership: {}", group_, e.what());
    }
    hold.lock();
  }
  hold.unlock();
  try {
    if (lease_ != 0) c.revoke(lease_);
  } catch (const std::exception&) {
  }
}

}  // namespace rlbus::cluster
