// CURVE key pairs (ZeroMQ's elliptic-curve security): made, checked, written and read.
//
// A key is 32 bytes, written as 40 characters of Z85. rlbus keeps a key pair in two small
// TOML files: NAME.key (public and secret key, mode 0600: whoever holds it is this peer)
// and NAME.pub (the public key alone, to hand to the broker's allowlist or to peers).
#pragma once

#include <string>
#include <string_view>

namespace rlbus::util {

struct curve_pair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

/// Whether `key` is a well-formed Z85 CURVE key (40 characters of the Z85 alphabet).
[[nodiscard]] bool valid_curve_key(std::string_view key) noexcept;

/// A fresh key pair. Throws std::runtime_error if libzmq was built without CURVE.
[[nodiscard]] curve_pair make_curve_pair();

/// The public key of a secret key; throws std::invalid_argument if `secret` is malformed.
[[nodiscard]] std::string curve_public_of(std::string_view secret);

/// Writes `stem`.key (mode 0600, created afresh: an existing file is an error, so a key is
/// never overwritten by mistake) and `stem`.pub. Throws std::runtime_error naming the file.
void write_curve_pair(const std::string& stem, const curve_pair& pair);

/// Throws std::runtime_error naming `path` and its mode when its group or others may write
/// it: a file that says whom to trust (an allowlist, a public key) that anyone may rewrite.
void refuse_writable_by_others(const std::string& path);

/// Reads a key file: a .key file gives both keys (the public one checked against the
/// secret), a .pub file only `public_key`. Throws std::runtime_error naming the file and
/// what is wrong with it (unreadable, not TOML, a key missing or malformed, readable by
/// others when it holds a secret key).
[[nodiscard]] curve_pair read_curve_file(const std::string& path);

/// Whether ZeroMQ's CURVE mechanism is available in the libzmq at hand.
[[nodiscard]] bool curve_available() noexcept;

}  // namespace rlbus::util
