// What a broker component answers when it refuses a peer's message.
#pragma once

#include <string>

#include "codec/protocol.hpp"

namespace rlbus::broker {

/// A refused message: the broker answers ERROR with this and counts a fault.
struct refusal {
  codec::error_code code;
  std::string reason;
  /// The message only lost a race (its task moved on before it arrived, SPEC §12.5.5, or
  /// another learner published a newer version, §13.3.3): answered and counted, but no
  /// strike against the sender.
  bool late = false;
};

}  // namespace rlbus::broker
