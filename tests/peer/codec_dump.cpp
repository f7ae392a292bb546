// rlbus-codec-dump: the C++ codec's verdict on messages read from stdin, one per line, as
// one JSON object per line on stdout. The Python test suite feeds it the same bytes it
// gives the Python codec and checks that both codecs agree.
//
// Input lines (hex is case-insensitive; an empty body or payload is written as "-"):
//   <header_hex> <body_hex>                a ROUTER message of two frames
//   <header_hex> <body_hex> <payload_hex>  one of three: a payload frame after the body
//   event <topic_hex> <body_hex>           a PUB event body published under a topic
// Output, one line per input line:
//   {"ok":true,"type":<id>,"body":"<canonical re-encoding, hex>"}
//   {"ok":true,"type":<id>,"body":"...","payload":"<hex>"}   (a message of three frames)
//   {"ok":false,"code":<SPEC §6 code>,"reason":"..."}
// A line that is not in the format above gets {"ok":false,"code":0,"reason":"bad input ..."}.
#include <cstdint>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "codec/codec.hpp"

namespace {

using nlohmann::json;
namespace codec = rlbus::codec;

std::optional<std::string> from_hex(std::string_view hex) {
  if (hex == "-") return std::string{};
  if (hex.size() % 2 != 0) return std::nullopt;
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]);
    const int lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>((hi << 4) | lo));
  }
  return out;
}

std::string to_hex(std::string_view bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto b = static_cast<std::uint8_t>(c);
    out.push_back(digits[b >> 4U]);
    out.push_back(digits[b & 0x0FU]);
  }
  return out;
}

json refused(std::uint16_t code, std::string reason) {
  return json{{"ok", false}, {"code", code}, {"reason", std::move(reason)}};
}

json refused(const codec::decode_error& e) {
  return refused(static_cast<std::uint16_t>(e.code), e.reason);
}

// A ROUTER message: header checks as the broker makes them (SPEC §3.2, §3.3), the frame
// count its type asks for (a payload frame for PUBLISH and DELIVER only, §17.1.1), then the
// body.
json message_verdict(std::string_view header, std::string_view body,
                     const std::optional<std::string>& payload) {
  const auto h = codec::parse_header(header);
  if (!h) return refused(400, "header frame must be 4 bytes starting 'RL'");
  if (h->version != codec::protocol_version)
    return refused(405, "protocol version " + std::to_string(h->version) + " is not 1");
  if (codec::has_payload_frame(h->type) != payload.has_value())
    return refused(400, payload ? "a payload frame on a message that has none"
                                : "a message of this type has a payload frame");
  auto r = codec::decode_body(h->type, body);
  if (!r) return refused(r.error());
  json out{{"ok", true}, {"type", h->type}, {"body", to_hex(codec::encode_body(r.value()))}};
  if (payload) out["payload"] = to_hex(*payload);
  return out;
}

json event_verdict(std::string_view topic, std::string_view body) {
  auto r = codec::decode_event(topic, body);
  if (!r) return refused(r.error());
  return json{{"ok", true}, {"body", to_hex(codec::encode_event(r.value()))}};
}

json verdict(const std::string& line) {
  std::istringstream in(line);
  std::string a, b, c, extra;
  in >> a >> b >> c >> extra;
  if (a.empty()) return refused(0, "bad input: empty line");
  if (a == "event") {
    const auto topic = from_hex(b);
    const auto body = from_hex(c);
    if (!topic || !body || c.empty() || !extra.empty()) return refused(0, "bad input: event line");
    return event_verdict(*topic, *body);
  }
  const auto header = from_hex(a);
  const auto body = from_hex(b.empty() ? "-" : b);
  std::optional<std::string> payload;
  if (!c.empty()) payload = from_hex(c);
  if (!header || !body || (!c.empty() && !payload) || !extra.empty())
    return refused(0, "bad input: message line");
  return message_verdict(*header, *body, payload);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const std::string_view arg = argv[1];
    std::cout << "usage: rlbus-codec-dump < lines\n"
                 "Reads one message per line from stdin and prints the C++ codec's verdict\n"
                 "on it as one JSON object per line.\n"
                 "  <header_hex> <body_hex> [<payload_hex>]\n"
                 "                                 a ROUTER message ('-' for an empty body\n"
                 "                                 or payload), a payload frame after it\n"
                 "  event <topic_hex> <body_hex>   an event body under a topic\n"
                 "Prints {\"ok\":true,\"type\":N,\"body\":\"<canonical hex>\"} or\n"
                 "{\"ok\":false,\"code\":N,\"reason\":\"...\"}.\n";
    return arg == "--help" || arg == "-h" ? 0 : 2;
  }
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::cout << verdict(line).dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  }
  std::cout.flush();
  return 0;
}
