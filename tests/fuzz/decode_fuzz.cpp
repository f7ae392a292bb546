// libFuzzer target for the protocol decoder: the first byte picks the message type (or an
// event topic), the rest is the body. Any crash, sanitizer report or huge allocation is a
// bug. Build and run (clang only):
//   CXX=clang++ meson setup build-fuzz -Dfuzz=true && ninja -C build-fuzz
//   /usr/bin/python3 tests/fuzz/seed_corpus.py build-fuzz/corpus
//   build-fuzz/tests/rlbus-fuzz-decode build-fuzz/corpus -max_total_time=600 -rss_limit_mb=512
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

#include "codec/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] < 0x80) {
    (void)rlbus::codec::decode_body(data[0], body);
  } else {
    static constexpr std::string_view topics[] = {
        "worker.joined",   "worker.lost", "coordinator.left",   "broker.heartbeat",
        "broker.stopping", "x.y",         "capacity.collector", "task.c.assigned"};
    (void)rlbus::codec::decode_event(topics[data[0] % std::size(topics)], body);
  }
  (void)rlbus::codec::parse_header(body);
  return 0;
}
