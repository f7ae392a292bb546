// The rlbus SDK's value types: a peer's role and resources (rlbus/role.hpp, the vocabulary
// the SDK shares with the wire), a policy version as a task receives it, and a peer's CURVE
// keys. Everything here is a plain value type; nothing in this header touches a socket.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "rlbus/role.hpp"

namespace rlbus {

/// One version of a policy as the broker hands it to a task (SPEC §13): either a reference
/// the worker resolves itself (a checkpoint path, a URL) or the parameters inline.
struct policy {
  std::string id;
  std::uint64_t version = 0;
  std::optional<std::string> ref;
  std::optional<std::string> params;
};

/// A peer's CURVE keys (SPEC §15), each 40 characters of Z85: its own key pair and the
/// broker's public key. With them the connection is encrypted and the broker knows the
/// peer by its public key, which its allowlist must list.
struct curve_keys {
  std::string public_key;
  std::string secret_key;
  std::string server_key;  // the broker's public key
};

/// Reads a peer's key pair from its .key file and the broker's public key from a .pub (or
/// .key) file, both as `rlbus-broker keygen` writes them. Throws std::runtime_error naming
/// the file and what is wrong with it.
curve_keys curve_keys_from_files(const std::string& key_file, const std::string& broker_key_file);

}  // namespace rlbus
