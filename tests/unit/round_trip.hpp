// What the codec tests share: a message encoded and decoded again.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <variant>

#include "codec/codec.hpp"

namespace rlbus::test {

/// `m` encoded, then decoded: the decoder must take it back as the same kind of message.
template <class T>
T round_trip(const T& m) {
  const auto bytes = codec::encode_body(codec::message{m});
  auto back = codec::decode_body(static_cast<std::uint8_t>(codec::type_of(m)), bytes);
  INFO((back ? "" : back.error().reason));
  REQUIRE(back);
  REQUIRE(std::holds_alternative<T>(back.value()));
  return std::get<T>(back.value());
}

}  // namespace rlbus::test
