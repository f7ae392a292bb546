// The broker's recent past, for the web view's charts: one sample of a few counters and
// gauges per second, for the last 15 minutes (900 samples, a fixed-size ring, about 100 KiB
// whatever the load). The loop records at its status tick (at most one sample a second);
// any thread may read. Counters are cumulative, so a reader makes rates from two samples,
// and a sample that is missing (a slow tick) costs no accuracy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <vector>

namespace rlbus::broker {

struct stats;  // ops/metrics.hpp

class series {
 public:
  enum class kind : std::uint8_t { counter, gauge };
  struct column {
    std::string_view name;
    kind k;
    std::string_view help;
  };
  /// What each sample holds, in its order.
  static const std::vector<column>& columns();

  struct sample {
    std::int64_t at_ms = 0;  // Unix time, ms
    std::vector<std::uint64_t> values;
  };

  explicit series(std::size_t keep = 900, std::int64_t every_ms = 1000)
      : keep_(keep), every_ms_(every_ms) {}

  /// Whether a sample at Unix time `at_ms` would be kept: the last one is a second old.
  [[nodiscard]] bool due(std::int64_t at_ms) const;
  /// The loop's thread: `s` as of Unix time `at_ms`, unless the last sample is younger than a
  /// second.
  void record(std::int64_t at_ms, const stats& s);
  /// Any thread: the samples after `after_ms` (Unix ms; 0: all), oldest first.
  [[nodiscard]] std::vector<sample> since(std::int64_t after_ms) const;
  [[nodiscard]] std::size_t keep() const noexcept { return keep_; }

 private:
  const std::size_t keep_;
  const std::int64_t every_ms_;
  mutable std::mutex mu_;
  std::vector<sample> ring_;  // at most keep_, ring_[(first_ + i) % keep_] the i-th oldest
  std::size_t first_ = 0;
};

}  // namespace rlbus::broker
