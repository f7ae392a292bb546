// The broker's answers to operators (SPEC §16): the verb of an OPS in, one reply or a refusal
// out. What a verb reads it reads through a const view of the broker (ops/view.hpp); what
// it changes (a worker drained or evicted, a setting) it asks of the broker through
// ops_levers, which the broker carries out. The broker's loop owns the object; the session
// and key checks of an OPS stay with the loop, which answers it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <variant>

#include "broker/core/config.hpp"
#include "broker/core/refusal.hpp"
#include "broker/ops/metrics.hpp"
#include "broker/ops/view.hpp"
#include "codec/protocol.hpp"
#include "util/clock.hpp"

namespace rlbus::broker {

/// What an operator may change, as the broker does it.
class ops_levers {
 public:
  virtual ~ops_levers() = default;
  /// Ends worker `id`'s session (it has one), its task handed back; returns the task's id, ""
  /// when it held none.
  virtual std::string evict(const std::string& id, util::time_point now) = 0;
  /// Drains worker `id` (no new task; it ends the one it holds) or lets it take tasks again.
  virtual void set_drained(const std::string& id, bool drained, util::time_point now) = 0;
  /// Puts a configuration in force that validate() accepted.
  virtual void reconfigure(config next) = 0;
};

class operations {
 public:
  /// The answer to `op`: its reply, or why not. `now` dates ages and changes.
  std::variant<codec::blob, refusal> answer(const codec::ops& op, const broker_view& v,
                                            const metrics& counted, ops_levers& levers,
                                            util::time_point now);

 private:
  [[nodiscard]] codec::blob status(const broker_view& v, const stats& s,
                                   util::time_point now) const;
  [[nodiscard]] static codec::blob workers(const codec::ops& op, const broker_view& v,
                                           std::size_t limit, std::size_t offset,
                                           util::time_point now);
  [[nodiscard]] static codec::blob tasks(const codec::ops& op, const broker_view& v,
                                         std::size_t limit, std::size_t offset,
                                         util::time_point now);
  [[nodiscard]] static codec::blob topics(const broker_view& v, std::size_t limit,
                                          std::size_t offset);
  std::variant<codec::blob, refusal> set(const codec::ops& op, const broker_view& v,
                                         ops_levers& levers, util::time_point now);

  struct change {  // a setting an operator changed (§16.5)
    std::string key, value, was;
    util::time_point at;
  };
  std::deque<change> changes_;  // the last few
  std::uint64_t changes_total_ = 0;
};

}  // namespace rlbus::broker
