// A client of etcd's v3 API, spoken as JSON over HTTP (the gateway etcd serves on its client
// URLs): leases, reads and compare-and-set transactions, which is all that electing one broker
// of a group takes. No consensus is made here: etcd decides, this only asks.
//
// On the wire keys and values are base64, 64-bit numbers are strings and fields that are zero
// or false are left out. Each call blocks for at most the client's timeout per endpoint; when
// an endpoint cannot be reached the next one is tried, and the one that answered is used
// first from then on. One client per thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlbus::cluster {

/// No endpoint of etcd answered in time, or what one answered was not etcd's.
class etcd_unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// etcd answered, and refused (its gRPC status code and message).
class etcd_refused : public std::runtime_error {
 public:
  etcd_refused(int code, const std::string& message) : std::runtime_error(message), code(code) {}
  int code;
};

struct etcd_kv {
  std::string key, value;
  std::int64_t create_revision = 0, mod_revision = 0, lease = 0;
};

class etcd_client {
 public:
  /// `endpoints`: etcd's client URLs, e.g. http://10.0.0.5:2379. Throws std::invalid_argument
  /// for one that is not an http:// URL.
  etcd_client(std::vector<std::string> endpoints, std::chrono::milliseconds timeout);
  ~etcd_client();
  etcd_client(const etcd_client&) = delete;
  etcd_client& operator=(const etcd_client&) = delete;

  struct lease {
    std::int64_t id = 0;
    std::int64_t ttl_s = 0;  // what etcd granted (it may raise what was asked)
  };
  lease grant(std::int64_t ttl_s);
  /// Renews `id`: the seconds it has from now, 0 when etcd no longer knows it.
  std::int64_t keep_alive(std::int64_t id);
  /// Ends `id` and deletes the keys attached to it; one already gone is not an error.
  void revoke(std::int64_t id);

  /// The key as it is now, if it exists.
  std::optional<etcd_kv> get(const std::string& key);
  /// Every key that starts with `prefix`, in key order.
  std::vector<etcd_kv> get_prefix(const std::string& prefix);
  /// Creates `key` (attached to `lease`, 0 for none) if it does not exist. Returns whether it
  /// did; the key as it then is goes to `now` (when given).
  bool create(const std::string& key, const std::string& value, std::int64_t lease,
              std::optional<etcd_kv>* now = nullptr);
  /// create() that, in the same transaction, writes `also` (deletes it when `also_value` is
  /// empty), and does neither unless `also` has not changed since `also_mod_revision` (0: it
  /// does not exist).
  bool create_with(const std::string& key, const std::string& value, std::int64_t lease,
                   const std::string& also, std::int64_t also_mod_revision,
                   const std::optional<std::string>& also_value, std::optional<etcd_kv>* now);
  /// Writes `key` if `guard` is still the key created at `guard_create_revision`.
  bool put_guarded(const std::string& key, const std::string& value, const std::string& guard,
                   std::int64_t guard_create_revision);
  /// Writes `key` if it has not changed since `mod_revision` (0: if it does not exist).
  bool replace(const std::string& key, const std::string& value, std::int64_t lease,
               std::int64_t mod_revision);
  /// Deletes `key` if it is still the one created at `create_revision`.
  bool erase(const std::string& key, std::int64_t create_revision);

  /// The endpoint that answered last.
  [[nodiscard]] const std::string& endpoint() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace rlbus::cluster
