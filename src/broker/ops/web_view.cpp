// See web_view.hpp.
#include "broker/ops/web_view.hpp"

#include <charconv>
#include <fstream>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <nlohmann/json.hpp>

#include "broker/ops/web_assets.hpp"

namespace rlbus::broker {

namespace {

using json = nlohmann::json;

// How long a request waits for the loop's answer before it says the broker is busy.
constexpr std::chrono::milliseconds loop_answer_timeout{2000};
// Rows of a table in one answer: a page, never the whole fleet.
constexpr std::uint64_t rows_max = 500;

std::array<unsigned char, 32> digest(std::string_view text) {
  std::array<unsigned char, 32> out{};
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), out.data(), &size, EVP_sha256(), nullptr);
  return out;
}

struct bad_request {
  std::string why;
};

std::uint64_t number(const httplib::Request& req, const char* name, std::uint64_t fallback,
                     std::uint64_t max) {
  if (!req.has_param(name)) return fallback;
  const auto text = req.get_param_value(name);
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || v > max)
    throw bad_request{fmt::format("{} must be a whole number 0..{}, not '{}'", name, max, text)};
  return v;
}

std::optional<std::string> word(const httplib::Request& req, const char* name,
                                std::initializer_list<std::string_view> allowed) {
  if (!req.has_param(name) || req.get_param_value(name).empty()) return std::nullopt;
  auto text = req.get_param_value(name);
  for (const auto a : allowed)
    if (a == text) return text;
  throw bad_request{fmt::format("{} must be one of {}, not '{}'", name, fmt::join(allowed, ", "),
                                text.substr(0, 64))};
}

std::optional<std::string> id(const httplib::Request& req, const char* name) {
  if (!req.has_param(name) || req.get_param_value(name).empty()) return std::nullopt;
  auto text = req.get_param_value(name);
  if (text.size() > 256) throw bad_request{fmt::format("{} is longer than an id may be", name)};
  return text;
}

void reply_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json; charset=utf-8");
}

void refuse(httplib::Response& res, const web_access& access, bool page) {
  const auto why = access.token.empty()
                       ? std::string(
                             "the web view is off here: with CURVE on, or on an address other "
                             "machines reach, it needs a token (metrics.token-file)")
                       : std::string(
                             "this needs the web view's token: open the page as /?token=TOKEN, or "
                             "send 'Authorization: Bearer TOKEN'");
  const int status = access.token.empty() ? 403 : 401;
  if (!page) return reply_json(res, status, json{{"error", why}});
  res.status = status;
  res.set_content(fmt::format("<!doctype html><title>rlbus</title><p>{}</p>\n", why),
                  "text/html; charset=utf-8");
}

// The JSON of a verb's reply (a msgpack map).
json of_reply(const codec::blob& reply) {
  return json::from_msgpack(reply);
}

void view(const web_sources& sources, const httplib::Request& req, httplib::Response& res) {
  std::vector<codec::ops> ask(4);
  ask[0].verb = "status";
  ask[1].verb = "workers";
  ask[1].offset = number(req, "workers_offset", 0, ~std::uint64_t{0} >> 1U);
  ask[1].limit = static_cast<std::uint32_t>(number(req, "workers_limit", 50, rows_max));
  if (auto k = word(req, "workers_kind", {"collector", "learner"})) ask[1].kind = parse_role(*k);
  ask[2].verb = "tasks";
  ask[2].offset = number(req, "tasks_offset", 0, ~std::uint64_t{0} >> 1U);
  ask[2].limit = static_cast<std::uint32_t>(number(req, "tasks_limit", 50, rows_max));
  if (auto k = word(req, "tasks_kind", {"collector", "learner"})) ask[2].kind = parse_role(*k);
  ask[2].state = word(req, "tasks_state", {"queued", "starting", "running", "closing"});
  ask[2].coordinator = id(req, "tasks_coordinator");
  ask[3].verb = "topics";
  ask[3].limit = static_cast<std::uint32_t>(number(req, "topics_limit", 50, rows_max));
  const auto answers = sources.ask(std::move(ask), loop_answer_timeout);
  if (!answers)
    return reply_json(res, 503,
                      json{{"error",
                            "the broker's loop did not answer within 2 s: it is busy, "
                            "stopping, or standing by"}});
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  auto status = of_reply((*answers)[0]);
  // 64 bits, more than a script's numbers hold exactly: as the log writes it.
  if (status.contains("epoch") && status["epoch"].is_number_unsigned())
    status["epoch"] = fmt::format("{:016x}", status["epoch"].get<std::uint64_t>());
  reply_json(res, 200,
             json{{"now_ms", now},
                  {"status", std::move(status)},
                  {"workers", of_reply((*answers)[1])},
                  {"tasks", of_reply((*answers)[2])},
                  {"topics", of_reply((*answers)[3])}});
}

void recent(const web_sources& sources, const httplib::Request& req, httplib::Response& res) {
  const auto after = static_cast<std::int64_t>(number(req, "after", 0, ~std::uint64_t{0} >> 1U));
  json columns = json::array();
  for (const auto& c : series::columns())
    columns.push_back({{"name", c.name},
                       {"kind", c.k == series::kind::counter ? "counter" : "gauge"},
                       {"help", c.help}});
  json samples = json::array();
  for (const auto& s : sources.recent(after)) {
    json row = json::array({s.at_ms});
    for (const auto v : s.values) row.push_back(v);
    samples.push_back(std::move(row));
  }
  reply_json(res, 200, json{{"columns", std::move(columns)}, {"samples", std::move(samples)}});
}

// The group, as its watch last read it from etcd; {"group": null} for a broker alone.
void cluster(const web_sources& sources, httplib::Response& res) {
  if (!sources.cluster) return reply_json(res, 200, json{{"group", nullptr}});
  res.status = 200;
  res.set_header("Cache-Control", "no-store");
  res.set_content(sources.cluster(), "application/json; charset=utf-8");
}

void serve_asset(std::string_view name, httplib::Response& res) {
  const auto* a = find_web_asset(name);
  if (a == nullptr) {
    res.status = 404;
    res.set_content("no such file\n", "text/plain");
    return;
  }
  res.set_content(std::string(a->body), std::string(a->type));
}

}  // namespace

bool web_access::admits(const httplib::Request& req) const {
  if (token.empty()) return !token_required;
  std::string presented;
  const auto auth = req.get_header_value("Authorization");
  if (auth.rfind("Bearer ", 0) == 0)
    presented = auth.substr(7);
  else if (req.has_param("token"))
    presented = req.get_param_value("token");
  // Digests of equal size, compared in constant time: neither the token nor its length shows.
  const auto want = digest(token);
  const auto got = digest(presented);
  return CRYPTO_memcmp(want.data(), got.data(), want.size()) == 0;
}

void add_web_view(httplib::Server& http, const web_sources& sources, const web_access& access) {
  http.set_default_headers({
      // Nothing the page uses comes from anywhere but the broker.
      {"Content-Security-Policy",
       "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
  });
  http.Get("/", [access](const httplib::Request& req, httplib::Response& res) {
    if (!access.admits(req)) return refuse(res, access, true);
    serve_asset("index.html", res);
    res.set_header("Cache-Control", "no-store");
  });
  http.Get(R"(/assets/([a-z.\-]+))", [](const httplib::Request& req, httplib::Response& res) {
    serve_asset(req.matches[1].str(), res);
  });
  const auto guarded = [access](auto handler) {
    return [access, handler](const httplib::Request& req, httplib::Response& res) {
      if (!access.admits(req)) return refuse(res, access, false);
      try {
        handler(req, res);
      } catch (const bad_request& e) {
        reply_json(res, 400, json{{"error", e.why}});
      }
    };
  };
  http.Get("/api/view", guarded([sources](const httplib::Request& req, httplib::Response& res) {
             view(sources, req, res);
           }));
  http.Get("/api/series", guarded([sources](const httplib::Request& req, httplib::Response& res) {
             recent(sources, req, res);
           }));
  http.Get("/api/cluster", guarded([sources](const httplib::Request&, httplib::Response& res) {
             cluster(sources, res);
           }));
}

std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line))
    throw std::runtime_error(
        fmt::format("cannot read the web view's token from {} (metrics.token-file)", path));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  if (line.size() < 16)
    throw std::runtime_error(fmt::format(
        "{} (metrics.token-file): its first line must be a token of at least 16 characters", path));
  return line;
}

}  // namespace rlbus::broker
