// See allowlist.hpp.
#include "broker/core/allowlist.hpp"

#include <fnmatch.h>

#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "codec/protocol.hpp"
#include "util/curve_keys.hpp"

namespace rlbus::broker {

bool allowlist_entry::allows(rlbus::role r, std::string_view id) const {
  if (!allows(r)) return false;
  if (ids.empty()) return true;
  const std::string text(id);
  for (const auto& pattern : ids)
    if (fnmatch(pattern.c_str(), text.c_str(), 0) == 0) return true;
  return false;
}

namespace {

allowlist_entry read_entry(const toml::table& t, std::size_t n, const std::string& path) {
  const auto fail = [&](const std::string& what) {
    const auto* name = t.get_as<std::string>("name");
    return std::runtime_error(fmt::format("allowlist {}: key #{}{}: {}", path, n,
                                          name ? fmt::format(" ('{}')", name->get()) : "", what));
  };
  for (const auto& [k, v] : t) {
    const auto key = k.str();
    if (key != "name" && key != "public-key" && key != "public-key-file" && key != "roles" &&
        key != "ids" && key != "topics")
      throw fail(fmt::format(
          "unknown setting '{}' (name, public-key, public-key-file, roles, ids, topics)", key));
  }
  allowlist_entry e;
  const auto* inline_key = t.get_as<std::string>("public-key");
  const auto* key_file = t.get_as<std::string>("public-key-file");
  if ((inline_key == nullptr) == (key_file == nullptr))
    throw fail("needs exactly one of public-key and public-key-file");
  if (inline_key != nullptr) {
    e.public_key = inline_key->get();
    if (!util::valid_curve_key(e.public_key))
      throw fail(fmt::format("public-key is not a CURVE key (40 Z85 characters, got {})",
                             e.public_key.size()));
  } else {
    std::filesystem::path file(key_file->get());
    if (file.is_relative()) file = std::filesystem::path(path).parent_path() / file;
    try {
      util::refuse_writable_by_others(file.string());
      e.public_key = util::read_curve_file(file.string()).public_key;
    } catch (const std::runtime_error& err) {
      throw fail(err.what());
    }
  }
  if (const auto* name = t.get_as<std::string>("name")) {
    e.name = name->get();
    if (e.name.empty() || e.name.size() > 128) throw fail("name must be 1-128 characters");
  } else {
    e.name = e.public_key.substr(0, 8);
  }
  const auto* roles = t.get_as<toml::array>("roles");
  if (roles == nullptr || roles->empty())
    throw fail(
        "roles must list at least one of collector, learner, coordinator, bus, subscriber, "
        "operator");
  for (const auto& r : *roles) {
    const auto* s = r.as_string();
    if (s == nullptr) throw fail("roles must be strings");
    if (s->get() == "subscriber") {
      e.subscriber = true;
    } else if (s->get() == "operator") {
      e.operator_ = true;
    } else if (const auto role = rlbus::parse_role(s->get())) {
      e.roles[static_cast<int>(*role)] = true;
    } else {
      throw fail(fmt::format(
          "unknown role '{}' (collector, learner, coordinator, bus, subscriber, operator)",
          s->get()));
    }
  }
  if (const auto* node = t.get("ids")) {
    const auto* ids = node->as_array();
    if (ids == nullptr || ids->empty())
      throw fail("ids must be a list of at least one id pattern (leave it out for any id)");
    for (const auto& p : *ids) {
      const auto* s = p.as_string();
      if (s == nullptr || s->get().empty() || s->get().size() > codec::max_id_length * 2)
        throw fail("ids must be non-empty strings (glob patterns: * ? [...])");
      e.ids.push_back(s->get());
    }
  }
  if (const auto* node = t.get("topics")) {
    const auto* topics = node->as_array();
    if (topics == nullptr || topics->empty())
      throw fail("topics must be a list of at least one topic prefix (leave it out for any topic)");
    if (!e.allows(rlbus::role::bus)) throw fail("topics is for keys of role bus");
    for (const auto& p : *topics) {
      const auto* s = p.as_string();
      if (s == nullptr || s->get().size() > codec::max_topic_length)
        throw fail(fmt::format("topics must be strings of at most {} bytes (topic prefixes)",
                               codec::max_topic_length));
      e.topics.push_back(s->get());
    }
  }
  return e;
}

}  // namespace

allowlist allowlist::load(const std::string& path) {
  toml::table doc;
  try {
    util::refuse_writable_by_others(path);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("allowlist {}", e.what()));
  }
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw std::runtime_error(
        fmt::format("allowlist {}: line {}: {}", path, e.source().begin.line, e.description()));
  }
  for (const auto& [k, v] : doc)
    if (k.str() != "key")
      throw std::runtime_error(fmt::format(
          "allowlist {}: unknown setting '{}' (entries are [[key]] tables)", path, k.str()));
  allowlist list;
  if (const auto* node = doc.get("key")) {
    const auto* keys = node->as_array();
    if (keys == nullptr)
      throw std::runtime_error(fmt::format("allowlist {}: 'key' must be [[key]] tables", path));
    for (const auto& item : *keys) {
      const auto n = list.entries_.size() + 1;
      const auto* t = item.as_table();
      if (t == nullptr)
        throw std::runtime_error(fmt::format("allowlist {}: key #{} is not a table", path, n));
      auto e = read_entry(*t, n, path);
      if (const auto* seen = list.find(e.public_key))
        throw std::runtime_error(fmt::format("allowlist {}: key #{} ('{}') repeats the key of '{}'",
                                             path, n, e.name, seen->name));
      list.by_key_.emplace(e.public_key, list.entries_.size());
      list.entries_.push_back(std::move(e));
    }
  }
  return list;
}

const allowlist_entry* allowlist::find(std::string_view public_key) const {
  const auto it = by_key_.find(std::string(public_key));
  return it == by_key_.end() ? nullptr : &entries_[it->second];
}

}  // namespace rlbus::broker
