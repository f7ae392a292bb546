// Every coordinator's stream (SPEC §12.8, §12.9), by coordinator id, and the memory their
// rings share. Each ring is bounded in events and bytes on its own (§12.8.3); together they
// hold at most half the memory budget, and with the connections' queues at most the three
// quarters not kept for peers that read (§15.5). A stream may hold its own bound until that
// pool is full; then one holding more than an equal share gives up its oldest events (a
// replay reports them lost), so coordinators that never acknowledge cannot hold it all.
// The task manager makes the events and hands out data credit; this keeps them and sends
// what each window lets out. Single-threaded, like the task manager that owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "broker/core/config.hpp"
#include "broker/tasks/stream.hpp"
#include "broker/tasks/task_sink.hpp"

namespace rlbus::broker {

class stream_set {
 public:
  using map = std::unordered_map<std::string, coordinator_stream>;

  stream_set(const config& cfg, task_sink& sink, task_counts& counts)
      : cfg_(cfg), sink_(sink), counts_(counts) {}

  /// The stream of `owner`, begun empty when it has none.
  coordinator_stream& of(const std::string& owner) { return streams_[owner]; }
  [[nodiscard]] coordinator_stream* find(const std::string& owner);
  [[nodiscard]] const coordinator_stream* find(const std::string& owner) const;
  /// Forgets `owner`'s stream and what its ring held.
  void drop(const std::string& owner);

  /// Keeps a new event at the head of `owner`'s stream `s`, trims the ring to its bounds and
  /// the pool's share, and sends what the window lets out.
  void keep(const std::string& owner, coordinator_stream& s, coordinator_stream::held event);
  /// Sends what `s` holds unsent, as far as its window lets (at most a window per call).
  void pump(const std::string& owner, coordinator_stream& s) {
    s.pump(sink_, owner, cfg_.stream_window, counts_);
  }
  /// pump() for every windowed stream with events unsent.
  void pump_all();
  /// Counts the rings again (after streams were filled from a journal).
  void recount();

  /// Whether `s` holds more than its share of a full pool: it gets no new data credit.
  [[nodiscard]] bool over_share(const coordinator_stream& s) const;
  /// The data credit an attempt of `s` is topped up to: the window shared by twice its
  /// credited attempts.
  [[nodiscard]] std::uint64_t chunk(const coordinator_stream& s) const;
  /// Bytes the rings of all streams hold now.
  [[nodiscard]] std::size_t ring_bytes() const noexcept { return ring_total_; }
  [[nodiscard]] std::size_t size() const noexcept { return streams_.size(); }
  [[nodiscard]] const map& all() const noexcept { return streams_; }

 private:
  /// What the rings may hold together now: half the budget, less when the connections'
  /// queues hold more than a quarter of it.
  [[nodiscard]] std::size_t pool() const;

  const config& cfg_;
  task_sink& sink_;
  task_counts& counts_;
  map streams_;
  std::size_t ring_total_ = 0;
};

}  // namespace rlbus::broker
