// The generic codec: each message's and event body's fields() drives one encoder and one
// decoder, so a message is declared once (in messages.json, generated into model.hpp).
// Internal to src/codec.
#pragma once

#include <cstdint>

#include <msgpack.hpp>

#include "codec/codec.hpp"
#include "codec/field_reader.hpp"

namespace rlbus::codec::detail {

/// Decodes the message `type` (any ROUTER message) from the fields of `r`.
result<message> read_fields_message(std::uint8_t type, field_reader& r);

/// Reads an event's envelope and the fields of the body `e.body` holds (by its topic).
void read_event_fields(field_reader& r, event& e);

}  // namespace rlbus::codec::detail
