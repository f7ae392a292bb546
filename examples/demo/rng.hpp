// Reproducible random numbers for the demo: seeds derived from (seed, stream) pairs and
// distributions written out by hand, because the std:: distributions are free to differ
// between standard libraries and a collector must redraw exactly what the learner drew.
#pragma once

#include <cstdint>
#include <random>

namespace rlbus::demo {

/// A seed for sub-stream `stream` of `seed` (SplitMix64's finaliser over a Weyl step):
/// nearby inputs give unrelated outputs, so (run seed, version) or (batch seed, direction)
/// pairs name independent streams without any coordination.
constexpr std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) noexcept {
  std::uint64_t z = seed + (stream + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27U)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31U);
}

/// Uniform in [0, 1) from the top 53 bits of one draw: every value is a multiple of 2^-53.
inline double uniform01(std::mt19937_64& gen) {
  return static_cast<double>(gen() >> 11U) * 0x1.0p-53;
}

/// Uniform in [lo, hi).
inline double uniform(std::mt19937_64& gen, double lo, double hi) {
  return lo + (hi - lo) * uniform01(gen);
}

/// Zero mean, unit variance, bounded by +-2*sqrt(3): a sum of four uniforms (Irwin-Hall),
/// close enough to a Gaussian for search noise. Only additions and one constant product,
/// so it is bit-identical wherever it runs, unlike Box-Muller's log/cos from libm.
inline double unit_noise(std::mt19937_64& gen) {
  constexpr double scale = 1.7320508075688772;  // sqrt(3): a sum of 4 U(0,1) has variance 1/3
  const double sum = uniform01(gen) + uniform01(gen) + uniform01(gen) + uniform01(gen);
  return (sum - 2.0) * scale;
}

}  // namespace rlbus::demo
