// `rlbus-bench bus-rows`: the topic bus measured through the C++ SDK, for
// bench/bus_baselines.py (its `cpp` backend; `rlbus-bench bus` runs the script).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rlbus::bench {

struct bus_rows_options {
  std::string endpoint;          // a running broker's ROUTER
  int trials = 3;                // per rate row
  int round_trips = 2000;        // rtt_64B
  std::int64_t count = 20'000;   // msgs_1to1 (msgs_4to1: a quarter from each publisher)
  std::int64_t mib_count = 100;  // MBps_1MiB
  bool big = true;               // also MBps_64MiB (3 payloads)
  double slow_rate = 4000;       // lost_slow_sub: the publisher's pace, messages/s
  double slow_seconds = 3;       // ... for this long
  std::size_t slow_size = 16384;
};

/// Prints each row as "rlbus-bench bus row {json}" (metric, median, unit and the script's
/// extras: lost per trial, what the subscriber's bus reported lost, ...). Throws
/// std::runtime_error when a node cannot reach the broker.
int run_bus_rows(const bus_rows_options& o);

}  // namespace rlbus::bench
