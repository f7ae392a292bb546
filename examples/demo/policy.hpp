// The demo's policy: a linear score over the cart-pole state (4 weights and a bias), push
// right when it is positive. Its parameters are a flat float vector, the unit the learner
// updates and the bytes that travel; the policy version travels beside them, not inside.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "demo/cartpole.hpp"

namespace rlbus::demo {

/// A deterministic linear policy. Immutable after construction; safe to share across
/// threads for reading.
class policy {
 public:
  /// Weights for x, x_dot, theta, theta_dot, then the bias.
  static constexpr std::size_t parameter_count = 5;

  /// The all-zero policy (it always pushes left: a score of 0 is not > 0).
  policy();
  /// Throws std::invalid_argument unless `params` holds parameter_count finite floats.
  explicit policy(std::vector<float> params);

  /// push_right iff w . s + b > 0 (evaluated in double, so the result does not depend on
  /// how a compiler orders float arithmetic).
  [[nodiscard]] action act(const cartpole::state& s) const noexcept;
  [[nodiscard]] double score(const cartpole::state& s) const noexcept;

  [[nodiscard]] const std::vector<float>& params() const noexcept { return params_; }

 private:
  std::vector<float> params_;
};

/// Parameters as bytes: each float as IEEE-754 binary32, little-endian, in order; no header
/// (the count is the size / 4, the version travels separately).
std::string params_to_bytes(std::span<const float> params);

/// The inverse of params_to_bytes. Bytes come from peers, so a bad input is a value, not an
/// exception: nullopt when the size is not a multiple of 4 or a value is NaN or infinite.
std::optional<std::vector<float>> params_from_bytes(std::string_view bytes);

}  // namespace rlbus::demo
