// The one Catch2 main (compiled once: Catch2 v2 is header-only and slow to compile).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
