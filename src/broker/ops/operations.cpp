// See operations.hpp.
#include "broker/ops/operations.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "broker/core/settings.hpp"
#include "codec/map_writer.hpp"
#include "rlbus_version.h"

namespace rlbus::broker {

namespace {

// Every array in a reply fits the decoding limits of §5.1 (1024 entries): a page holds at
// most this many (§16.3.2), and so do the lists of status.
constexpr std::size_t ops_page_max = 1000;
constexpr std::size_t ops_changes_kept = 64;

std::uint64_t ms_since(util::time_point then, util::time_point now) {
  if (now <= then) return 0;
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now - then).count());
}

refusal missing(std::string_view verb, std::string_view field) {
  return {codec::error_code::bad_field, fmt::format("{} needs the field '{}'", verb, field)};
}

}  // namespace

std::variant<codec::blob, refusal> operations::answer(const codec::ops& op, const broker_view& v,
                                                      const metrics& counted, ops_levers& levers,
                                                      util::time_point now) {
  const auto limit = std::min(std::size_t{op.limit.value_or(1000)}, ops_page_max);
  const auto offset = op.offset.value_or(0);
  if (op.verb == "status") return status(v, counted.snapshot(), now);
  if (op.verb == "workers") return workers(op, v, limit, offset, now);
  if (op.verb == "tasks") return tasks(op, v, limit, offset, now);
  if (op.verb == "topics") return topics(v, limit, offset);
  if (op.verb == "drain" || op.verb == "undrain" || op.verb == "evict") {
    if (!op.worker) return missing(op.verb, "worker");
    const auto& id = *op.worker;
    const peer* q = v.peers.by_id(id);
    if (q == nullptr || q->role == rlbus::role::coordinator || q->role == rlbus::role::bus)
      return refusal{codec::error_code::no_such_peer,
                     fmt::format("no worker '{}' has a session", id)};
    if (op.verb == "evict") {
      const auto held = levers.evict(id, now);
      return codec::map_writer(2).str("worker", id).str("task", held).done();
    }
    levers.set_drained(id, op.verb == "drain", now);
    if (op.verb == "undrain") return codec::map_writer(1).str("worker", id).done();
    const auto w = v.tasks.worker_state(id).value_or(task_manager::worker_view{});
    return codec::map_writer(2).str("worker", id).str("task", w.task).done();
  }
  return set(op, v, levers, now);  // the decoder allows no other verb
}

codec::blob operations::workers(const codec::ops& op, const broker_view& v, std::size_t limit,
                                std::size_t offset, util::time_point now) {
  std::vector<const peer*> workers;
  v.peers.for_each([&](const peer& q) {
    if (q.role == rlbus::role::coordinator || q.role == rlbus::role::bus) return;
    if (op.kind && q.role != *op.kind) return;
    workers.push_back(&q);
  });
  std::sort(workers.begin(), workers.end(),
            [](const peer* a, const peer* b) { return a->serial < b->serial; });
  std::vector<codec::blob> items;
  for (std::size_t i = offset < workers.size() ? offset : workers.size(); i < workers.size(); ++i) {
    const peer* q = workers[i];
    if (items.size() == limit) break;
    const auto w = v.tasks.worker_state(q->id).value_or(task_manager::worker_view{});
    items.push_back(codec::map_writer(10)
                        .str("id", q->id)
                        .str("role", to_string(q->role))
                        .resources("resources", q->resources)
                        .str("task", w.task)
                        .uint("attempt", w.attempt)
                        .uint("heartbeat_age_ms", ms_since(q->last_seen, now))
                        .boolean("quarantined", w.quarantined)
                        .boolean("leaving", w.leaving)
                        .boolean("drained", w.drained)
                        .uint("session", q->serial)
                        .done());
  }
  return codec::map_writer(2).array("workers", items).uint("total", workers.size()).done();
}

codec::blob operations::tasks(const codec::ops& op, const broker_view& v, std::size_t limit,
                              std::size_t offset, util::time_point now) {
  const auto [tasks, total] = v.tasks.list_tasks(op.state.value_or(""), op.kind,
                                                 op.coordinator.value_or(""), limit, offset);
  std::vector<codec::blob> items;
  items.reserve(tasks.size());
  for (const auto& t : tasks)
    items.push_back(codec::map_writer(9)
                        .str("id", t.id)
                        .str("kind", to_string(t.kind))
                        .str("state", t.state)
                        .uint("attempt", t.attempt)
                        .str("worker", t.worker)
                        .str("coordinator", t.coordinator)
                        .uint("age_ms", ms_since(t.submitted, now))
                        .uint("attempt_ms", t.state == "queued" ? 0 : ms_since(t.started, now))
                        .resources("requirements", t.requirements)
                        .done());
  std::vector<codec::blob> ended;
  for (const auto& e : v.tasks.recently_ended())
    ended.push_back(codec::map_writer(8)
                        .str("id", e.id)
                        .str("kind", to_string(e.kind))
                        .str("how", e.how)
                        .uint("attempt", e.attempt)
                        .str("worker", e.worker)
                        .str("coordinator", e.coordinator)
                        .str("reason", e.reason)
                        .uint("age_ms", ms_since(e.at, now))
                        .done());
  return codec::map_writer(3)
      .array("tasks", items)
      .uint("total", total)
      .array("ended", ended)
      .done();
}

std::variant<codec::blob, refusal> operations::set(const codec::ops& op, const broker_view& v,
                                                   ops_levers& levers, util::time_point now) {
  if (!op.key) return missing(op.verb, "key");
  if (!op.value) return missing(op.verb, "value");
  const auto* s = find_setting(*op.key);
  if (s == nullptr || s->key() != *op.key)
    return refusal{codec::error_code::bad_field,
                   fmt::format("'{}' is not a setting (keys as in the config file, e.g. "
                               "tasks.max-queue)",
                               *op.key)};
  if (!s->live)  // the table says which settings are read afresh at each use
    return refusal{codec::error_code::bad_field,
                   fmt::format("{} cannot change while the broker runs; the ones that can: {}",
                               *op.key, fmt::join(live_setting_keys(), ", "))};
  config next = v.cfg;
  if (auto why = s->assign(next, *op.value); !why.empty())
    return refusal{codec::error_code::bad_field, fmt::format("{}: {}", *op.key, why)};
  try {
    validate(next);
  } catch (const std::invalid_argument& e) {
    return refusal{codec::error_code::bad_field, fmt::format("{}: {}", *op.key, e.what())};
  }
  auto was = s->text(v.cfg);
  levers.reconfigure(std::move(next));
  spdlog::warn("an operator set {} = {} (was {})", *op.key, *op.value, was);
  changes_.push_back({*op.key, *op.value, was, now});
  ++changes_total_;
  if (changes_.size() > ops_changes_kept) changes_.pop_front();
  return codec::map_writer(3).str("key", *op.key).str("value", *op.value).str("was", was).done();
}

// The topic bus (SPEC §17): the busiest topics first, and the nodes that lag most first, one
// page of each.
codec::blob operations::topics(const broker_view& v, std::size_t limit, std::size_t offset) {
  const auto topics = v.bus.topics(offset + limit);
  const auto nodes = v.bus.nodes(offset + limit);
  const auto counts = v.bus.counts();
  std::vector<codec::blob> t_items, n_items;
  for (std::size_t i = offset; i < topics.size(); ++i)
    t_items.push_back(codec::map_writer(4)
                          .str("topic", topics[i].topic)
                          .uint("messages", topics[i].messages)
                          .uint("bytes", topics[i].bytes)
                          .uint("subscribers", topics[i].subscribers)
                          .done());
  for (std::size_t i = offset; i < nodes.size(); ++i)
    n_items.push_back(codec::map_writer(13)
                          .str("id", nodes[i].id)
                          .uint("subscriptions", nodes[i].subscriptions)
                          .uint("queued", nodes[i].queued)
                          .uint("queued_bytes", nodes[i].queued_bytes)
                          .uint("acked", nodes[i].acked)
                          .uint("next_seq", nodes[i].next_seq)
                          .uint("published", nodes[i].published)
                          .boolean("held_back", nodes[i].held_back)
                          .str("held_by", nodes[i].held_by)
                          .strings("holding_back", nodes[i].holding_back)
                          .boolean("stalled", nodes[i].stalled)
                          .uint("stalls", nodes[i].stalls)
                          .uint("dropped", nodes[i].dropped)
                          .done());
  return codec::map_writer(4)
      .array("topics", t_items)
      .uint("topics_total", v.bus.topics_tracked())
      .array("nodes", n_items)
      .uint("nodes_total", counts.nodes)
      .done();
}

codec::blob operations::status(const broker_view& v, const stats& s, util::time_point now) const {
  std::vector<codec::blob> streams;
  const auto all_streams = v.tasks.list_streams();
  for (const auto& st : all_streams) {
    if (streams.size() == ops_page_max) break;
    streams.push_back(codec::map_writer(5)
                          .str("coordinator", st.coordinator)
                          .uint("seq", st.seq)
                          .uint("acked", st.acked)
                          .boolean("windowed", st.windowed)
                          .uint("held", st.held)
                          .done());
  }
  std::vector<codec::blob> changes;
  for (const auto& c : changes_)
    changes.push_back(codec::map_writer(4)
                          .str("key", c.key)
                          .str("value", c.value)
                          .str("was", c.was)
                          .uint("age_ms", ms_since(c.at, now))
                          .done());
  const std::pair<std::string_view, std::uint64_t> counts[] = {
      {"messages_in", s.messages_in},
      {"messages_out", s.messages_out},
      {"faults", s.faults},
      {"expired", s.expired},
      {"events", s.events},
      {"tasks_finished", s.tasks_finished},
      {"tasks_failed", s.tasks_failed},
      {"tasks_requeued", s.tasks_requeued},
      {"stale_messages", s.stale_messages},
      {"stream_replays", s.stream_replays},
      {"stream_resent", s.stream_resent},
      {"stream_lost", s.stream_lost},
      {"data_duplicates", s.data_duplicates},
      {"data_out_of_order", s.data_out_of_order},
      {"data_lost", s.data_lost},
      {"data_items", s.data_items},
      {"data_lag_items", s.data_lag_items},
      {"data_lag_versions", s.data_lag_versions},
      {"quarantines", s.quarantines},
      {"connections", s.connections},
      {"over_bytes", s.over_bytes},
      {"stalled_cut", s.stalled_cut},
      {"fault_cut", s.fault_cut},
      {"hoarding_cut", s.hoarding_cut},
      {"cut_hellos", s.cut_hellos},
      {"send_queue_bytes", s.queued_bytes},
      {"stream_ring_bytes", s.ring_bytes},
      {"stream_ring_budget_drops", s.ring_drops}};
  codec::map_writer counters(static_cast<std::uint32_t>(std::size(counts)));
  for (const auto& [name, v] : counts) counters.uint(name, v);
  const auto b = v.bus.counts();  // live: this runs on the loop's thread
  const std::pair<std::string_view, std::uint64_t> bus_counts[] = {
      {"nodes", b.nodes},
      {"subscriptions", b.subscriptions},
      {"published", b.published},
      {"published_bytes", b.published_bytes},
      {"delivered", b.delivered},
      {"dropped", b.dropped},
      {"gaps", b.gaps},
      {"resent", b.resent},
      {"duplicates", b.duplicates},
      {"abandoned", b.abandoned},
      {"held_back", b.held_back},
      {"stalls", b.stalls},
      {"stalled", b.stalled},
      {"queued_bytes", b.queued_bytes},
      {"retained", b.retained},
      {"retained_bytes", b.retained_bytes},
      {"retain_evicted", b.retain_evicted}};
  codec::map_writer bus(static_cast<std::uint32_t>(std::size(bus_counts)));
  for (const auto& [name, v] : bus_counts) bus.uint(name, v);
  // A group's leader: the standbys that copy its journal (SPEC §14.10).
  std::vector<codec::blob> standbys;
  const auto group = v.replication != nullptr ? v.replication->standbys()
                                              : std::vector<replicator::standby_state>{};
  standbys.reserve(group.size());
  for (const auto& st : group)
    standbys.push_back(codec::map_writer(4)
                           .str("member", st.member)
                           .uint("position", st.position)
                           .uint("lag_bytes", st.lag)
                           .boolean("in_sync", st.in_sync)
                           .done());
  const auto changed = changed_settings(v.cfg);
  codec::map_writer settings(static_cast<std::uint32_t>(changed.size()));
  for (const auto& [key, value] : changed) settings.str(key, value);
  return codec::map_writer(15)
      .str("version", RLBUS_VERSION)
      .uint("epoch", v.epoch)
      .raw("settings", settings.done())
      .uint("uptime_ms", ms_since(v.started, now))
      .boolean("draining", s.draining)
      .raw("peers", codec::map_writer(4)
                        .uint("collector", s.collectors)
                        .uint("learner", s.learners)
                        .uint("coordinator", s.coordinators)
                        .uint("bus", s.nodes)
                        .done())
      .raw("tasks", codec::map_writer(2)
                        .uint("queued", s.tasks_queued)
                        .uint("running", s.tasks_running)
                        .done())
      .uint("queue_depth", s.tasks_queued)
      .raw("counters", counters.done())
      .array("streams", streams)
      .uint("streams_total", all_streams.size())
      .array("changes", changes)
      .uint("changes_total", changes_total_)
      .raw("bus", bus.done())
      .array("standbys", standbys)
      .done();
}

}  // namespace rlbus::broker
