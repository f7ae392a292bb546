// A latency histogram with fixed buckets (seconds), written by the broker loop and read by
// any thread (the metrics endpoint): every count is an atomic, bumped with relaxed order.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace rlbus::broker {

/// Upper bounds of the buckets, in seconds: 1 ms to an hour.
inline constexpr std::array<double, 13> histogram_bounds{0.001, 0.005, 0.01, 0.05, 0.1,  0.5, 1,
                                                         5,     10,    60,   300,  1800, 3600};

/// What a histogram held at one moment: cumulative counts per bound (Prometheus' `le`),
/// all observations, and their sum.
struct histogram_counts {
  std::array<std::uint64_t, histogram_bounds.size()> at_most{};
  std::uint64_t count = 0;
  double sum_seconds = 0;
};

class histogram {
 public:
  void observe(std::chrono::nanoseconds d) {
    const double s = std::chrono::duration<double>(d).count();
    std::size_t i = 0;
    while (i < histogram_bounds.size() && s > histogram_bounds[i]) ++i;
    if (i < histogram_bounds.size()) buckets_[i].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(d.count(), 0)),
                      std::memory_order_relaxed);
  }
  [[nodiscard]] histogram_counts counts() const {
    histogram_counts c;
    std::uint64_t running = 0;
    for (std::size_t i = 0; i < histogram_bounds.size(); ++i) {
      running += buckets_[i].load(std::memory_order_relaxed);
      c.at_most[i] = running;
    }
    // Read last, so it is never below the buckets read before it.
    c.count = std::max(count_.load(std::memory_order_relaxed), running);
    c.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
    return c;
  }

 private:
  std::array<std::atomic<std::uint64_t>, histogram_bounds.size()> buckets_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_ns_{0};
};

}  // namespace rlbus::broker
