// The one Catch2 main (compiled once: Catch2 v2 is header-only and slow to compile).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // Catch2 v2 trips it under sanitizers
#endif
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
