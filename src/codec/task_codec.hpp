// The generic codec for task messages: each struct's fields() drives one encoder and one
// decoder, so a task message is declared once (task_messages.hpp). Internal to src/codec.
#pragma once

#include <cstdint>

#include <msgpack.hpp>

#include "codec/codec.hpp"
#include "codec/field_reader.hpp"

namespace rlbus::codec::detail {

/// Decodes the task message `type` from the fields of `r` (type must satisfy is_task_type).
result<message> read_task(std::uint8_t type, field_reader& r);

/// Appends one task message in canonical form.
template <class T>
void write_task(const T& m, msgpack::packer<msgpack::sbuffer>& pk, msgpack::sbuffer& out);

}  // namespace rlbus::codec::detail
