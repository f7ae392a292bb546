// See etcd.hpp. The gateway's paths and shapes are etcd's v3 API (rpc.proto), which 3.4 serves
// under /v3/.
#include "cluster/etcd.hpp"

#include <openssl/evp.h>

#include <utility>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

namespace rlbus::cluster {

namespace {

using json = nlohmann::json;

// etcd's answers here are a few hundred bytes; a prefix of many keys some more.
constexpr std::size_t max_answer = std::size_t{16} * 1024 * 1024;

std::string base64(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string unbase64(const std::string& in) {
  if (in.size() % 4 != 0) throw etcd_unavailable("etcd sent a value that is not base64");
  std::string out(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  if (n < 0) throw etcd_unavailable("etcd sent a value that is not base64");
  // EVP_DecodeBlock counts the padding as bytes of zero.
  std::size_t pad = 0;
  for (auto it = in.rbegin(); it != in.rend() && *it == '=' && pad < 2; ++it) ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

// A 64-bit number as the gateway writes it (a string), or a plain one; absent is 0.
std::int64_t number(const json& j, const char* field) {
  const auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (const std::exception&) {
    }
  }
  throw etcd_unavailable(fmt::format("etcd sent a field '{}' that is not a number", field));
}

std::string text(const json& j, const char* field) {
  const auto it = j.find(field);
  return it != j.end() && it->is_string() ? unbase64(it->get<std::string>()) : std::string();
}

etcd_kv kv_of(const json& j) {
  etcd_kv kv;
  kv.key = text(j, "key");
  kv.value = text(j, "value");
  kv.create_revision = number(j, "create_revision");
  kv.mod_revision = number(j, "mod_revision");
  kv.lease = number(j, "lease");
  return kv;
}

std::vector<etcd_kv> kvs_of(const json& range) {
  std::vector<etcd_kv> out;
  if (const auto it = range.find("kvs"); it != range.end() && it->is_array())
    for (const auto& k : *it) out.push_back(kv_of(k));
  return out;
}

// The end of the range of keys that start with `prefix`: the prefix with its last byte that
// can be raised raised, and what follows dropped.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(prefix.back());
    if (c < 0xff) {
      ++c;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

json put_op(const std::string& key, const std::string& value, std::int64_t lease) {
  json put = {{"key", base64(key)}, {"value", base64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return {{"request_put", put}};
}

}  // namespace

struct etcd_client::impl {
  std::vector<std::string> endpoints;
  std::chrono::milliseconds timeout;
  std::vector<std::unique_ptr<httplib::Client>> clients;
  std::size_t current = 0;

  json call(const std::string& path, const json& body) {
    const auto payload = body.dump();
    std::string failures;
    for (std::size_t tried = 0; tried < clients.size(); ++tried) {
      const std::size_t i = (current + tried) % clients.size();
      httplib::Request req;
      req.method = "POST";
      req.path = path;
      req.body = payload;
      req.set_header("Content-Type", "application/json");
      int status = 0;
      std::string body;
      req.response_handler = [&](const httplib::Response& r) {
        status = r.status;
        return true;
      };
      req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
        body.append(data, n);
        return body.size() <= max_answer;
      };
      httplib::Response res;
      auto err = httplib::Error::Success;
      // httplib (0.11) cannot read the trailers that etcd's gateway sends after an error
      // answer, and reports a read error; the answer has arrived whole before them.
      if (!clients[i]->send(req, res, err) && (status == 0 || err != httplib::Error::Read)) {
        failures += fmt::format("{}{}: {}", failures.empty() ? "" : "; ", endpoints[i],
                                httplib::to_string(err));
        continue;
      }
      json answer = json::parse(body, nullptr, false);
      if (answer.is_discarded() || !answer.is_object()) {
        failures += fmt::format("{}{}: answered HTTP {} with no JSON object",
                                failures.empty() ? "" : "; ", endpoints[i], status);
        continue;
      }
      current = i;
      if (const auto e = answer.find("error"); e != answer.end()) {
        const auto m = answer.find("message");
        throw etcd_refused(static_cast<int>(number(answer, "code")),
                           m != answer.end() && m->is_string() ? m->get<std::string>() : e->dump());
      }
      if (status != 200)
        throw etcd_unavailable(fmt::format("{}{}: HTTP {}", endpoints[i], path, status));
      return answer;
    }
    throw etcd_unavailable(fmt::format("etcd unreachable ({})", failures));
  }

  json txn(const json& compare, const json& success, const json& failure) {
    return call("/v3/kv/txn", {{"compare", compare}, {"success", success}, {"failure", failure}});
  }
};

etcd_client::etcd_client(std::vector<std::string> endpoints, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>()) {
  if (endpoints.empty()) throw std::invalid_argument("no etcd endpoint given");
  impl_->timeout = timeout;
  for (auto& e : endpoints) {
    if (e.rfind("http://", 0) != 0)
      throw std::invalid_argument(
          fmt::format("etcd endpoint '{}': expected http://HOST:PORT (etcd's client URL)", e));
    while (!e.empty() && e.back() == '/') e.pop_back();
    auto c = std::make_unique<httplib::Client>(e);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
    c->set_connection_timeout(us / 1'000'000, us % 1'000'000);
    c->set_read_timeout(us / 1'000'000, us % 1'000'000);
    c->set_write_timeout(us / 1'000'000, us % 1'000'000);
    impl_->clients.push_back(std::move(c));
  }
  impl_->endpoints = std::move(endpoints);
}

etcd_client::~etcd_client() = default;

const std::string& etcd_client::endpoint() const {
  return impl_->endpoints[impl_->current];
}

etcd_client::lease etcd_client::grant(std::int64_t ttl_s) {
  const auto a = impl_->call("/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}});
  return {number(a, "ID"), number(a, "TTL")};
}

std::int64_t etcd_client::keep_alive(std::int64_t id) {
  // A stream in gRPC; over the gateway one request, one answer.
  const auto a = impl_->call("/v3/lease/keepalive", {{"ID", std::to_string(id)}});
  const auto r = a.find("result");
  return r != a.end() && r->is_object() ? number(*r, "TTL") : 0;
}

void etcd_client::revoke(std::int64_t id) {
  try {
    (void)impl_->call("/v3/lease/revoke", {{"ID", std::to_string(id)}});
  } catch (const etcd_refused& e) {
    if (e.code != 5) throw;  // NOT_FOUND: gone already
  }
}

std::optional<etcd_kv> etcd_client::get(const std::string& key) {
  auto kvs = kvs_of(impl_->call("/v3/kv/range", {{"key", base64(key)}}));
  if (kvs.empty()) return std::nullopt;
  return std::move(kvs.front());
}

std::vector<etcd_kv> etcd_client::get_prefix(const std::string& prefix) {
  return kvs_of(impl_->call("/v3/kv/range",
                            {{"key", base64(prefix)}, {"range_end", base64(prefix_end(prefix))}}));
}

bool etcd_client::create(const std::string& key, const std::string& value, std::int64_t lease,
                         std::optional<etcd_kv>* now) {
  return create_with(key, value, lease, "", 0, std::nullopt, now);
}

bool etcd_client::create_with(const std::string& key, const std::string& value, std::int64_t lease,
                              const std::string& also, std::int64_t also_mod_revision,
                              const std::optional<std::string>& also_value,
                              std::optional<etcd_kv>* now) {
  json compare = json::array({{{"key", base64(key)},
                               {"target", "CREATE"},
                               {"result", "EQUAL"},
                               {"create_revision", "0"}}});
  const json get_op = {{"request_range", {{"key", base64(key)}}}};
  json ops = json::array({put_op(key, value, lease)});
  if (!also.empty()) {
    compare.push_back({{"key", base64(also)},
                       {"target", "MOD"},
                       {"result", "EQUAL"},
                       {"mod_revision", std::to_string(also_mod_revision)}});
    ops.push_back(also_value ? put_op(also, *also_value, 0)
                             : json{{"request_delete_range", {{"key", base64(also)}}}});
  }
  ops.push_back(get_op);
  const auto a = impl_->txn(compare, ops, json::array({get_op}));
  const bool created = a.value("succeeded", false);
  if (now != nullptr) {
    now->reset();
    const auto& responses = a.at("responses");
    const auto& range = responses.at(responses.size() - 1).at("response_range");
    if (auto kvs = kvs_of(range); !kvs.empty()) *now = std::move(kvs.front());
  }
  return created;
}

bool etcd_client::replace(const std::string& key, const std::string& value, std::int64_t lease,
                          std::int64_t mod_revision) {
  const json compare = json::array({{{"key", base64(key)},
                                     {"target", "MOD"},
                                     {"result", "EQUAL"},
                                     {"mod_revision", std::to_string(mod_revision)}}});
  return impl_->txn(compare, json::array({put_op(key, value, lease)}), json::array())
      .value("succeeded", false);
}

bool etcd_client::put_guarded(const std::string& key, const std::string& value,
                              const std::string& guard, std::int64_t guard_create_revision) {
  const json compare = json::array({{{"key", base64(guard)},
                                     {"target", "CREATE"},
                                     {"result", "EQUAL"},
                                     {"create_revision", std::to_string(guard_create_revision)}}});
  return impl_->txn(compare, json::array({put_op(key, value, 0)}), json::array())
      .value("succeeded", false);
}

bool etcd_client::erase(const std::string& key, std::int64_t create_revision) {
  const json compare = json::array({{{"key", base64(key)},
                                     {"target", "CREATE"},
                                     {"result", "EQUAL"},
                                     {"create_revision", std::to_string(create_revision)}}});
  const json del = {{"request_delete_range", {{"key", base64(key)}}}};
  return impl_->txn(compare, json::array({del}), json::array()).value("succeeded", false);
}

}  // namespace rlbus::cluster
