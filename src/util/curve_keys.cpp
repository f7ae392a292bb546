// See curve_keys.hpp.
#include "util/curve_keys.hpp"

#include "rlbus/types.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <toml++/toml.h>
#include <zmq.h>

namespace rlbus::util {

namespace {

constexpr std::size_t z85_key_length = 40;
constexpr std::string_view z85_alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

void write_new_file(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot create {}: {}", path, strerror(errno)));
  const auto* p = text.data();
  auto left = text.size();
  while (left > 0) {
    const auto n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(fmt::format("cannot write {}: {}", path, strerror(err)));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw std::runtime_error(fmt::format("cannot write {}: {}", path, strerror(errno)));
}

std::string key_field(const toml::table& t, std::string_view name, const std::string& path) {
  const auto* v = t.get_as<std::string>(name);
  if (v == nullptr)
    throw std::runtime_error(fmt::format("{}: no {} (a string of 40 Z85 characters)", path, name));
  std::string key = v->get();
  if (!valid_curve_key(key))
    throw std::runtime_error(
        fmt::format("{}: {} is not a CURVE key (40 Z85 characters, got {} characters)", path, name,
                    key.size()));
  return key;
}

}  // namespace

bool valid_curve_key(std::string_view key) noexcept {
  return key.size() == z85_key_length && key.find_first_not_of(z85_alphabet) == std::string::npos;
}

bool curve_available() noexcept {
  return zmq_has("curve") != 0;
}

curve_pair make_curve_pair() {
  std::array<char, z85_key_length + 1> pub{}, sec{};
  if (zmq_curve_keypair(pub.data(), sec.data()) != 0)
    throw std::runtime_error("this libzmq was built without CURVE (libsodium) support");
  return {pub.data(), sec.data()};
}

std::string curve_public_of(std::string_view secret) {
  if (!valid_curve_key(secret))
    throw std::invalid_argument("a CURVE secret key is 40 Z85 characters");
  const std::string sec(secret);
  std::array<char, z85_key_length + 1> pub{};
  if (zmq_curve_public(pub.data(), sec.c_str()) != 0)
    throw std::invalid_argument("not a CURVE secret key (or libzmq lacks CURVE support)");
  return pub.data();
}

void write_curve_pair(const std::string& stem, const curve_pair& pair) {
  write_new_file(stem + ".key",
                 fmt::format("# rlbus CURVE key pair (Z85). Keep this file private: whoever "
                             "holds it is this peer.\n"
                             "public-key = \"{}\"\nsecret-key = \"{}\"\n",
                             pair.public_key, pair.secret_key),
                 0600);
  write_new_file(stem + ".pub",
                 fmt::format("# rlbus CURVE public key (Z85): list it in the broker's allowlist, "
                             "or give it to peers as the broker's key.\n"
                             "public-key = \"{}\"\n",
                             pair.public_key),
                 0644);
}

void refuse_writable_by_others(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 022) != 0)
    throw std::runtime_error(fmt::format(
        "{}: its group or others may write it (mode {:o}), so they could add a key of their "
        "own: chmod go-w {}",
        path, st.st_mode & 0777, path));
}

curve_pair read_curve_file(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw std::runtime_error(fmt::format("{}: line {}: {}", path, where.line, e.description()));
  }
  curve_pair pair;
  pair.public_key = key_field(t, "public-key", path);
  if (!t.contains("secret-key")) return pair;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
    throw std::runtime_error(
        fmt::format("{}: holds a secret key but others may read it (mode {:o}): chmod 600 {}", path,
                    st.st_mode & 0777, path));
  pair.secret_key = key_field(t, "secret-key", path);
  if (curve_public_of(pair.secret_key) != pair.public_key)
    throw std::runtime_error(
        fmt::format("{}: public-key is not the public key of secret-key", path));
  return pair;
}

}  // namespace rlbus::util

namespace rlbus {

curve_keys curve_keys_from_files(const std::string& key_file, const std::string& broker_key_file) {
  const auto own = util::read_curve_file(key_file);
  if (own.secret_key.empty())
    throw std::runtime_error(fmt::format(
        "{}: holds no secret-key (a peer needs its .key file, not its .pub)", key_file));
  return {own.public_key, own.secret_key, util::read_curve_file(broker_key_file).public_key};
}

}  // namespace rlbus
