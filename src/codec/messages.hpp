// Typed v1 messages: one struct per message and per event body, generated from the wire's
// list (codec/model.hpp), and what the codec and its users say about them beyond the list.
// Plain values; the codec turns them into bytes and back.
#pragma once

#include "codec/model.hpp"
#include "codec/rules.hpp"
#include "codec/vocabulary.hpp"

namespace rlbus::codec {

/// The type id each message struct travels under.
template <class T, class = decltype(T::type)>
constexpr msg_type type_of(const T&) noexcept {
  return T::type;
}
msg_type type_of(const message& m) noexcept;

}  // namespace rlbus::codec
