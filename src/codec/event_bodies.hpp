// The bodies of TASK_EVENT (SPEC §12.5.6), by event: the maps the broker composes, each
// struct listing its fields once in `fields()` (written by codec::append_fields), and the
// events whose body is a field of the worker's message, byte for byte. The values are views
// into the message the event reports: a body is written at once, into the event's bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>

#include "codec/messages.hpp"

namespace rlbus::codec::event_body {

/// assigned: the task went to a worker (its id is the event's worker_id); the version of
/// the task's policy the attempt starts with, when it has one (§13.4.3).
struct assigned {
  static constexpr std::string_view event = "assigned";
  std::optional<std::uint64_t> policy_version;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("policy_version", s.policy_version, rule::range{1, ~std::uint64_t{0}});
  }
};

/// started: the worker said STARTED.
struct started {
  static constexpr std::string_view event = "started";
  template <class S, class F>
  static void fields(S& /*s*/, F&& /*f*/) {}
};

/// data: a DATA, without the task, the attempt and the index.
struct data {
  static constexpr std::string_view event = "data";
  std::string_view data_id, buffer_id;
  std::string_view meta = empty_map_blob;
  std::optional<std::string_view> payload;
  std::optional<std::uint64_t> policy_version;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("data_id", s.data_id, rule::text{256});
    f("buffer_id", s.buffer_id, rule::text{256});
    f("meta", s.meta, rule::shape::map);
    f("payload", s.payload, rule::bin{~std::size_t{0}});
    f("policy_version", s.policy_version, rule::range{1, ~std::uint64_t{0}});
  }
};

/// info: INFO's `info`.
struct info {
  static constexpr std::string_view event = "info";
  using from = codec::info;
  static constexpr std::string_view field = "info";
};

/// data_request: a GET_DATA, for the coordinator to answer with DATA_REPLY.
struct data_request {
  static constexpr std::string_view event = "data_request";
  std::uint64_t request_id = 0;
  std::string_view buffer_id;
  std::uint32_t batch_size = 0;
  std::uint64_t cur_learner_iter = 0;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("request_id", s.request_id, rule::u64);
    f("buffer_id", s.buffer_id, rule::text{256});
    f("batch_size", s.batch_size, rule::u32);
    f("cur_learner_iter", s.cur_learner_iter, rule::u64);
  }
};

/// learn_info: a LEARN_INFO's buffer and info.
struct learn_info {
  static constexpr std::string_view event = "learn_info";
  std::string_view buffer_id;
  std::string_view info = empty_map_blob;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("buffer_id", s.buffer_id, rule::text{256});
    f("info", s.info, rule::shape::map);
  }
};

/// finished: RESULT's `result`.
struct finished {
  static constexpr std::string_view event = "finished";
  using from = task_result;
  static constexpr std::string_view field = "result";
};

/// requeued and failed: why the attempt ended, which attempt, and the worker's own account
/// (TASK_FAILED `result`) when it gave one. A task that fails in the queue before its first
/// attempt (its queue timeout, §12.7.6) names attempt 0.
template <std::uint64_t FirstAttempt>
struct attempt_ended {
  std::string_view reason;
  std::uint32_t attempt = 0;
  std::optional<std::string_view> result;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("reason", s.reason, rule::reason);
    f("attempt", s.attempt, rule::range{FirstAttempt, 1000});
    f("result", s.result, rule::shape::map);
  }
};
struct requeued : attempt_ended<1> {
  static constexpr std::string_view event = "requeued";
};
struct failed : attempt_ended<0> {
  static constexpr std::string_view event = "failed";
};

/// cancelled: the coordinator's CANCEL (or the end of its session); attempt 0 when the task
/// never left the queue.
struct cancelled {
  static constexpr std::string_view event = "cancelled";
  std::string_view reason;
  std::uint32_t attempt = 0;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("reason", s.reason, rule::reason);
    f("attempt", s.attempt, rule::range{0, 1000});
  }
};

/// data_lost: indexed DATA the collector dropped before the broker had them (§12.11.6).
struct data_lost {
  static constexpr std::string_view event = "data_lost";
  std::uint64_t first_index = 1, last_index = 1;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("first_index", s.first_index, rule::range{1, ~std::uint64_t{0}});
    f("last_index", s.last_index, rule::range{1, ~std::uint64_t{0}});
  }
};

/// data_batch: the new items of a DATA_BATCH, each as it came (§12.12.4).
struct data_batch {
  static constexpr std::string_view event = "data_batch";
  std::uint64_t first_index = 1;
  std::span<const std::string_view> items;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("first_index", s.first_index, rule::range{1, std::uint64_t{1} << 63U});
    f("items", s.items, rule::items{max_batch_items});
  }
};

/// Every event of a task, in the order of §12.5.6.
using all = std::tuple<assigned, started, data, info, data_request, learn_info, finished, requeued,
                       failed, cancelled, data_lost, data_batch>;

/// Whether `B` is a body made of a field of the worker's message (info, finished).
template <class B>
constexpr bool is_verbatim = requires {
  typename B::from;
};

}  // namespace rlbus::codec::event_body
