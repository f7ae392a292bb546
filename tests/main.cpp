// The one Catch2 main (compiled once: Catch2 v2 is header-only and slow to compile).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // Catch2 v2 trips it under sanitizers
#endif
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <spdlog/spdlog.h>

int main(int argc, char* argv[]) {
  // spdlog's registry is made on first use, inside libspdlog; made here, before any test
  // starts a thread, every thread sees it whole (and ThreadSanitizer, which cannot see into
  // libspdlog, sees that too).
  (void)spdlog::default_logger();
  return Catch::Session().run(argc, argv);
}
