// Golden vectors (protocol/vectors/*.json, written by an independent encoder): every valid
// vector decodes to its stated meaning and re-encodes byte for byte; every invalid one is
// refused with its stated code. A vector of a message with a payload frame (PUBLISH,
// DELIVER: SPEC §17.1.1) gives that frame's bytes in `payload_hex`, and only such a one does.
// protocol/messages.json must agree with the codec and the vectors. Any client of rlbus runs the
// same checks against the same files.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "codec/codec.hpp"
#include "codec/map_writer.hpp"
#include "support/support.hpp"

using namespace rlbus;
using json = nlohmann::json;
using test::unhex;
using namespace std::chrono_literals;

namespace {

std::string protocol_dir() {
  const char* dir = std::getenv("RLBUS_PROTOCOL_DIR");
  REQUIRE(dir != nullptr);
  return dir;
}

json load(const std::string& rel) {
  std::ifstream in(protocol_dir() + "/" + rel);
  REQUIRE(in.good());
  return json::parse(in);
}

// The meaning of a body, independent of the typed codec.
json to_json(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL:
      return nullptr;
    case msgpack::type::BOOLEAN:
      return o.via.boolean;
    case msgpack::type::POSITIVE_INTEGER:
      return o.via.u64;
    case msgpack::type::NEGATIVE_INTEGER:
      return o.via.i64;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      return o.via.f64;
    case msgpack::type::STR:
      return std::string(o.via.str.ptr, o.via.str.size);
    case msgpack::type::BIN: {  // vectors spell binary as {"$bin_hex": "..."}
      static constexpr char digits[] = "0123456789abcdef";
      std::string hex;
      for (std::uint32_t i = 0; i < o.via.bin.size; ++i) {
        const auto b = static_cast<unsigned char>(o.via.bin.ptr[i]);
        hex.push_back(digits[b >> 4U]);
        hex.push_back(digits[b & 0xFU]);
      }
      return json{{"$bin_hex", hex}};
    }
    case msgpack::type::ARRAY: {
      json a = json::array();
      for (std::uint32_t i = 0; i < o.via.array.size; ++i) a.push_back(to_json(o.via.array.ptr[i]));
      return a;
    }
    case msgpack::type::MAP: {
      json m = json::object();
      for (std::uint32_t i = 0; i < o.via.map.size; ++i)
        m[o.via.map.ptr[i].key.as<std::string>()] = to_json(o.via.map.ptr[i].val);
      return m;
    }
    default:
      FAIL("unexpected msgpack type in a vector");
      return nullptr;
  }
}

json meaning(const std::string& body) {
  auto oh = msgpack::unpack(body.data(), body.size());
  return to_json(oh.get());
}

// The frames a vector travels in after the routing id: header and body, and its payload
// frame when its type has one.
std::vector<std::string> frames_of(const json& v) {
  std::vector<std::string> out{unhex(v["header_hex"].get<std::string>()),
                               unhex(v["body_hex"].get<std::string>())};
  if (v.contains("payload_hex")) out.push_back(unhex(v["payload_hex"].get<std::string>()));
  return out;
}

// A vector has `payload_hex` exactly when its type travels with a payload frame.
void check_payload_key(const json& v, std::uint8_t type) {
  CHECK(v.contains("payload_hex") == codec::has_payload_frame(type));
  if (v.contains("payload_hex")) {
    const auto hex = v["payload_hex"].get<std::string>();
    CHECK(hex.size() % 2 == 0);
    CHECK(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
  }
}

role sender_role(const std::string& sender) {
  if (sender == "coordinator") return role::coordinator;
  if (sender == "learner") return role::learner;
  if (sender == "bus") return role::bus;
  REQUIRE(sender == "collector");
  return role::collector;
}

// Sends each invalid vector from a fresh session of its sender (or none) to a live broker,
// with all its frames: each is answered with its code. Returns how many were sent.
int send_invalid_vectors() {
  const auto doc = load("vectors/invalid.json");
  broker::server_thread broker{test::test_config()};
  zmq::context_t ctx;
  int n = 0;
  for (const auto& v : doc["vectors"]) {
    const auto sender = v["sender"].get<std::string>();
    INFO("vector " << v["name"].get<std::string>() << " from " << sender);
    test::raw_peer p(ctx, broker.get().router_endpoint());
    ++n;
    if (sender != "none") {
      p.send(codec::hello{sender_role(sender), "vector-" + std::to_string(n), 30'000, {}, {}});
      REQUIRE(p.recv_a<codec::welcome>(30s));  // a busy machine may starve the broker a while
    }
    const auto frames = frames_of(v);
    p.send_frames(frames);
    const auto e = p.recv_a<codec::error>(30s);
    REQUIRE(e);
    INFO(e->reason);
    CHECK(static_cast<int>(e->code) == v["error_code"].get<int>());
    CHECK(e->ref_type == static_cast<std::uint8_t>(frames[0][3]));
  }
  return n;
}

}  // namespace

TEST_CASE("valid vectors decode to their meaning and re-encode byte for byte",
          "[protocol][vectors]") {
  const auto doc = load("vectors/valid.json");
  REQUIRE(doc["version"] == codec::protocol_version);
  REQUIRE(doc["vectors"].size() >= 10);
  for (const auto& v : doc["vectors"]) {
    INFO("vector " << v["name"].get<std::string>());
    const auto header = codec::parse_header(unhex(v["header_hex"].get<std::string>()));
    REQUIRE(header);
    CHECK(header->version == codec::protocol_version);
    CHECK(codec::type_name(header->type).value_or("") == v["type"].get<std::string>());
    const auto body = unhex(v["body_hex"].get<std::string>());
    auto decoded = codec::decode_body(header->type, body);
    INFO((decoded ? "" : decoded.error().reason));
    REQUIRE(decoded);
    CHECK(codec::type_of(decoded.value()) == static_cast<codec::msg_type>(header->type));
    CHECK(codec::encode_body(decoded.value()) == body);
    CHECK(meaning(body) == v["fields"]);
    check_payload_key(v, header->type);
  }
}

TEST_CASE("invalid vectors are refused with their stated code", "[protocol][vectors]") {
  const auto doc = load("vectors/invalid.json");
  REQUIRE(doc["vectors"].size() >= 20);
  for (const auto& v : doc["vectors"]) {
    INFO("vector " << v["name"].get<std::string>() << ": " << v["note"].get<std::string>());
    const auto header = codec::parse_header(unhex(v["header_hex"].get<std::string>()));
    REQUIRE(header);
    auto decoded = codec::decode_body(header->type, unhex(v["body_hex"].get<std::string>()));
    REQUIRE_FALSE(decoded);
    CHECK(static_cast<int>(decoded.error().code) == v["error_code"].get<int>());
    check_payload_key(v, header->type);
  }
}

// SPEC §5.6.1: `sender` says where a vector goes to be answered with exactly its code; sent
// from there to a live broker with all its frames (PUBLISH and DELIVER travel in three,
// §17.1.1), each one is.
TEST_CASE("invalid vectors sent from their sender get their code from a live broker",
          "[protocol][vectors]") {
  const auto doc = load("vectors/invalid.json");
  CHECK(send_invalid_vectors() == static_cast<int>(doc["vectors"].size()));
}

TEST_CASE("event vectors decode to their meaning and re-encode byte for byte",
          "[protocol][vectors]") {
  const auto doc = load("vectors/events.json");
  REQUIRE(doc["vectors"].size() >= 6);
  for (const auto& v : doc["vectors"]) {
    INFO("vector " << v["name"].get<std::string>());
    const auto header = codec::parse_header(unhex(v["header_hex"].get<std::string>()));
    REQUIRE(header);
    CHECK(header->type == static_cast<std::uint8_t>(codec::msg_type::event));
    const auto body = unhex(v["body_hex"].get<std::string>());
    auto decoded = codec::decode_event(v["topic"].get<std::string>(), body);
    INFO((decoded ? "" : decoded.error().reason));
    REQUIRE(decoded);
    CHECK(decoded.value().seq == v["fields"]["seq"].get<std::uint64_t>());
    CHECK(codec::encode_event(decoded.value()) == body);
    CHECK(meaning(body) == v["fields"]);
  }
}

TEST_CASE("messages.json agrees with the codec and the vectors", "[protocol][vectors]") {
  const auto spec = load("messages.json");
  CHECK(spec["version"] == codec::protocol_version);
  const auto valid = load("vectors/valid.json")["vectors"];
  std::set<int> ids;
  for (const auto& m : spec["messages"]) {
    const auto name = m["name"].get<std::string>();
    const auto id = m["id"].get<int>();
    INFO("message " << name);
    ids.insert(id);
    CHECK(codec::type_name(static_cast<std::uint8_t>(id)).value_or("") == name);
    CHECK(codec::has_payload_frame(static_cast<std::uint8_t>(id)) ==
          m.value("payload_frame", false));
    if (name == "EVENT") continue;
    // The spec's field names are exactly the keys its vectors use (optional ones included).
    std::set<std::string> spec_fields, vector_fields;
    for (const auto& f : m["fields"]) spec_fields.insert(f["name"].get<std::string>());
    for (const auto& v : valid)
      if (v["type"] == name)
        for (const auto& [k, _] : v["fields"].items()) vector_fields.insert(k);
    CHECK(spec_fields == vector_fields);
  }
  for (int id = 0; id < 256; ++id)
    if (codec::type_name(static_cast<std::uint8_t>(id))) CHECK(ids.count(id) == 1);
  for (const auto& c : spec["error_codes"]) {
    INFO("code " << c["code"]);
    CHECK(codec::code_name(c["code"].get<std::uint16_t>()) == c["name"].get<std::string>());
  }
}

namespace {
std::vector<json> vectors_of(const std::string& file, const std::string& type) {
  std::vector<json> out;
  const auto doc = load(file);
  for (const auto& v : doc["vectors"])
    if (v["type"] == type) out.push_back(v);
  return out;
}
}  // namespace

// The broker reads DATA in place (codec::read_data) instead of decoding it: on every DATA
// vector, valid or not, it must come to the decoder's verdict, with the same fields or the
// same refusal.
TEST_CASE("DATA read in place agrees with the decoder on every DATA vector",
          "[protocol][vectors]") {
  auto all = vectors_of("vectors/valid.json", "DATA");
  const auto invalid = vectors_of("vectors/invalid.json", "DATA");
  REQUIRE(all.size() >= 4);
  REQUIRE(invalid.size() >= 3);
  all.insert(all.end(), invalid.begin(), invalid.end());
  for (const auto& v : all) {
    INFO("vector " << v["name"].get<std::string>());
    const auto body = unhex(v["body_hex"].get<std::string>());
    const auto decoded = codec::decode_body(static_cast<std::uint8_t>(codec::msg_type::data), body);
    const auto read = codec::read_data(body);
    REQUIRE(read.ok() == decoded.ok());
    if (!decoded) {
      CHECK(read.error().code == decoded.error().code);
      CHECK(read.error().reason == decoded.error().reason);
      continue;
    }
    const auto want = codec::view_of(std::get<codec::data_ready>(decoded.value()));
    CHECK(read.value() == want);
  }
}

// The broker writes a TASK_EVENT from its attempt's fields encoded once (codec::event_fixed)
// and the event's own: the bytes must be the vectors' canonical ones.
TEST_CASE("TASK_EVENTs written from their attempt's fixed part are the vectors' bytes",
          "[protocol][vectors]") {
  const auto vectors = vectors_of("vectors/valid.json", "TASK_EVENT");
  REQUIRE(vectors.size() >= 3);
  for (const auto& v : vectors) {
    INFO("vector " << v["name"].get<std::string>());
    const auto body = unhex(v["body_hex"].get<std::string>());
    const auto decoded =
        codec::decode_body(static_cast<std::uint8_t>(codec::msg_type::task_event), body);
    REQUIRE(decoded);
    const auto& e = std::get<codec::task_event>(decoded.value());
    const codec::event_fixed fixed(e.task_id, e.attempt, e.worker_id);
    CHECK(fixed.of(e.attempt, e.worker_id));
    CHECK_FALSE(fixed.of(e.attempt + 1, e.worker_id));
    auto wire = codec::event_head(fixed, e.seq, e.event, e.body.size(), e.kind.has_value());
    wire.append(e.body);
    if (e.kind) codec::event_kind(wire, *e.kind);
    CHECK(wire == body);
  }
}
