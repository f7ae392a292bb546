// Who may connect when CURVE is on (SPEC §15): a TOML file of public keys, each bound to
// the roles it may take and, optionally, the ids it may use.
//
//   [[key]]
//   name = "node7-collectors"            # for logs; defaults to the key's first 8 characters
//   public-key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"   # or public-key-file = "node7.pub"
//   roles = ["collector", "learner"]     # collector, learner, coordinator, bus, subscriber,
//                                        # operator
//   ids = ["node7-*"]                    # optional: glob patterns (* ? [...]); any id if absent
//   topics = ["task.", "metrics."]       # role bus only, optional: the topic prefixes its
//                                        # nodes may publish and subscribe to; any if absent
//
// "subscriber" lets the key receive events on the event socket; the other roles are HELLO
// roles on the ROUTER. A relative public-key-file is read from the allowlist's folder.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "codec/messages.hpp"
#include "codec/vocabulary.hpp"

namespace rlbus::broker {

struct allowlist_entry {
  std::string name;
  std::string public_key;                        // Z85
  bool roles[4] = {false, false, false, false};  // indexed by rlbus::role
  bool subscriber = false;
  bool operator_ = false;           // may send OPS (SPEC §16.2)
  std::vector<std::string> ids;     // glob patterns; empty: any id
  std::vector<std::string> topics;  // topic prefixes a node may use (SPEC §17.8); empty: any

  [[nodiscard]] bool allows(rlbus::role r) const noexcept { return roles[static_cast<int>(r)]; }
  /// Whether this key may say HELLO as `r` with `id`.
  [[nodiscard]] bool allows(rlbus::role r, std::string_view id) const;
};

class allowlist {
 public:
  allowlist() = default;
  /// Reads and checks the whole file; throws std::runtime_error naming the file, the entry
  /// and what is wrong (nothing is half-loaded).
  static allowlist load(const std::string& path);

  /// The entry of a Z85 public key, or nullptr when it is not listed.
  [[nodiscard]] const allowlist_entry* find(std::string_view public_key) const;
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

 private:
  std::vector<allowlist_entry> entries_;
  std::unordered_map<std::string, std::size_t> by_key_;
};

}  // namespace rlbus::broker
