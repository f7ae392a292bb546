// See group_view.hpp.
#include "cluster/group_view.hpp"

#include <utility>

#include "cluster/etcd.hpp"

namespace rlbus::cluster {

using json = nlohmann::json;

group_view read_group(const std::vector<std::string>& etcd, const std::string& group,
                      std::chrono::milliseconds timeout) {
  group_view g;
  g.group = group;
  g.leader = leader_of(etcd, group, timeout);
  g.members = members_of(etcd, group, timeout);
  if (const auto kv = etcd_client(etcd, timeout).get(elector::insync_key_of(group)))
    for (auto& m : in_sync_members(kv->value)) g.in_sync.insert(std::move(m));
  return g;
}

json to_json(const group_view& g) {
  json out{{"group", g.group}, {"leader", nullptr}, {"members", json::array()}};
  const auto& l = g.leader;
  if (l.epoch != 0)
    out["leader"] = {{"member", l.member},
                     {"advertise", l.advertise},
                     {"epoch", l.epoch},
                     {"since_ms", l.since_ms}};
  for (const auto& m : g.members)
    out["members"].push_back({{"member", m.member},
                              {"advertise", m.advertise},
                              {"version", m.version},
                              {"since_ms", m.since_ms},
                              {"role", l.epoch != 0 && m.member == l.member ? "leader" : "standby"},
                              {"in_sync", g.in_sync.count(m.member) == 1}});
  return out;
}

group_watch::group_watch(std::vector<std::string> etcd, std::string group, std::string me,
                         std::chrono::milliseconds timeout, std::chrono::milliseconds every)
    : etcd_(std::move(etcd)),
      group_(std::move(group)),
      me_(std::move(me)),
      timeout_(timeout),
      every_(every) {}

json group_watch::get() {
  const std::lock_guard<std::mutex> hold(mu_);
  const auto now = util::clock::now();
  if (read_ && now - read_at_ < every_) return last_;
  read_ = true;
  read_at_ = now;
  try {
    last_ = to_json(read_group(etcd_, group_, timeout_));
  } catch (const std::exception& e) {
    if (!last_.is_object())
      last_ = {{"group", group_}, {"leader", nullptr}, {"members", json::array()}};
    last_["error"] = std::string("etcd: ") + e.what();
    last_["me"] = me_;
    return last_;
  }
  last_["me"] = me_;
  last_["read_ms"] = util::wall_ms();
  return last_;
}

}  // namespace rlbus::cluster
