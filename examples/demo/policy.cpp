// Linear cart-pole policy and the byte form of its parameters. The byte order is written
// out explicitly (shifts, not memcpy) so the format is little-endian on any host.
#include "demo/policy.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace rlbus::demo {

static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559,
              "the parameter format is IEEE-754 binary32");

policy::policy() : params_(parameter_count, 0.0F) {}

policy::policy(std::vector<float> params) : params_(std::move(params)) {
  if (params_.size() != parameter_count)
    throw std::invalid_argument("policy: expected " + std::to_string(parameter_count) +
                                " parameters, got " + std::to_string(params_.size()));
  for (const float p : params_)
    if (!std::isfinite(p)) throw std::invalid_argument("policy: parameter is not finite");
}

double policy::score(const cartpole::state& s) const noexcept {
  return static_cast<double>(params_[0]) * s.x + static_cast<double>(params_[1]) * s.x_dot +
         static_cast<double>(params_[2]) * s.theta + static_cast<double>(params_[3]) * s.theta_dot +
         static_cast<double>(params_[4]);
}

action policy::act(const cartpole::state& s) const noexcept {
  return score(s) > 0.0 ? action::push_right : action::push_left;
}

std::string params_to_bytes(std::span<const float> params) {
  std::string out;
  out.reserve(params.size() * 4);
  for (const float p : params) {
    const auto bits = std::bit_cast<std::uint32_t>(p);
    for (unsigned shift = 0; shift < 32; shift += 8)
      out.push_back(static_cast<char>((bits >> shift) & 0xFFU));
  }
  return out;
}

std::optional<std::vector<float>> params_from_bytes(std::string_view bytes) {
  if (bytes.size() % 4 != 0) return std::nullopt;
  std::vector<float> out;
  out.reserve(bytes.size() / 4);
  for (std::size_t i = 0; i < bytes.size(); i += 4) {
    std::uint32_t bits = 0;
    for (unsigned k = 0; k < 4; ++k)
      bits |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + k])) << (8 * k);
    const auto value = std::bit_cast<float>(bits);
    if (!std::isfinite(value)) return std::nullopt;
    out.push_back(value);
  }
  return out;
}

}  // namespace rlbus::demo
