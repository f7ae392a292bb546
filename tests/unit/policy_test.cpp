// The linear policy and its parameters' byte form: exact round trips, a fixed little-endian
// layout, and bytes that cannot be parameters refused as values.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo/policy.hpp"

// In the demo's own namespace: `policy` is the demo's, even in a unity build where another test
// brings the SDK's rlbus::policy into view.
namespace rlbus::demo {

TEST_CASE("parameters survive the byte form bit for bit", "[unit][demo]") {
  const std::vector<float> params{0.0F,
                                  -0.0F,
                                  1.0F,
                                  -3.25F,
                                  0.1F,
                                  std::numeric_limits<float>::max(),
                                  std::numeric_limits<float>::lowest(),
                                  std::numeric_limits<float>::denorm_min(),
                                  1e-30F};
  const auto bytes = params_to_bytes(params);
  CHECK(bytes.size() == 4 * params.size());
  const auto back = params_from_bytes(bytes);
  REQUIRE(back);
  REQUIRE(back->size() == params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO("index " << i);
    CHECK(std::bit_cast<std::uint32_t>((*back)[i]) == std::bit_cast<std::uint32_t>(params[i]));
  }

  const policy pi({0.5F, -1.0F, 2.0F, 0.25F, -0.125F});
  const auto restored = params_from_bytes(params_to_bytes(pi.params()));
  REQUIRE(restored);
  CHECK(policy(*restored).params() == pi.params());
}

TEST_CASE("parameters are little-endian binary32", "[unit][demo]") {
  const std::vector<float> params{1.0F, -2.0F};
  CHECK(params_to_bytes(params) == std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8));
  CHECK(params_to_bytes({}).empty());
}

TEST_CASE("bytes that are not parameters are refused", "[unit][demo]") {
  CHECK_FALSE(params_from_bytes(std::string(3, '\0')));
  CHECK_FALSE(params_from_bytes(std::string(21, '\0')));
  CHECK_FALSE(params_from_bytes(std::string("\x00\x00\xc0\x7f", 4)));                  // NaN
  CHECK_FALSE(params_from_bytes(std::string("\x00\x00\x80\x7f", 4)));                  // +infinity
  CHECK_FALSE(params_from_bytes(std::string("\x00\x00\x80\x3f\x00\x00\x80\xff", 8)));  // -inf
  const auto empty = params_from_bytes("");
  REQUIRE(empty);
  CHECK(empty->empty());
}

TEST_CASE("a policy needs exactly five finite parameters", "[unit][demo]") {
  CHECK_NOTHROW(policy(std::vector<float>(policy::parameter_count, 1.0F)));
  CHECK_THROWS_AS(policy(std::vector<float>(4, 1.0F)), std::invalid_argument);
  CHECK_THROWS_AS(policy(std::vector<float>(6, 1.0F)), std::invalid_argument);
  CHECK_THROWS_AS(policy({1.0F, std::nanf(""), 0.0F, 0.0F, 0.0F}), std::invalid_argument);
  CHECK(policy().params() == std::vector<float>(policy::parameter_count, 0.0F));
}

TEST_CASE("the policy pushes right exactly when its score is positive", "[unit][demo]") {
  const policy pi({1.0F, 2.0F, 3.0F, 4.0F, 0.5F});
  const cartpole::state s{0.1, -0.2, 0.3, -0.4};
  CHECK(pi.score(s) == Approx(0.1 - 0.4 + 0.9 - 1.6 + 0.5));  // -0.5
  CHECK(pi.act(s) == action::push_left);
  CHECK(pi.act({0.1, 0.2, 0.3, 0.4}) == action::push_right);
  CHECK(policy().act({}) == action::push_left);  // a score of exactly 0 is not > 0
}

}  // namespace rlbus::demo
