// See wire.hpp.
#include "wire.hpp"

#include <algorithm>
#include <stdexcept>

#include "codec/field_reader.hpp"

namespace rlbus::bench {

frames encode(const codec::message& m) {
  const auto h = codec::make_header(codec::type_of(m));
  return {std::string(h.data(), h.size()), codec::encode_body(m)};
}

std::string bin_blob(std::size_t size) {
  msgpack::sbuffer b;
  msgpack::packer pk(b);
  pk.pack_bin(static_cast<std::uint32_t>(size));
  const std::string bytes(size, 'x');
  pk.pack_bin_body(bytes.data(), static_cast<std::uint32_t>(size));
  return {b.data(), b.size()};
}

std::optional<std::uint64_t> peek_seq(std::string_view body) {
  // Canonical TASK_EVENT: a fixmap of 6, the key "seq", then the shortest unsigned form.
  constexpr std::string_view key{"\xa3seq", 4};
  if (body.size() < 6 || static_cast<unsigned char>(body[0]) != 0x86 ||
      body.substr(1, key.size()) != key)
    return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(body.data()) + 1 + key.size();
  const auto rest = body.size() - 1 - key.size();
  const auto be = [&](std::size_t n) -> std::optional<std::uint64_t> {
    if (rest < 1 + n) return std::nullopt;
    std::uint64_t v = 0;
    for (std::size_t i = 1; i <= n; ++i) v = (v << 8) | p[i];
    return v;
  };
  if (p[0] < 0x80) return p[0];
  switch (p[0]) {
    case 0xcc:
      return be(1);
    case 0xcd:
      return be(2);
    case 0xce:
      return be(4);
    case 0xcf:
      return be(8);
    default:
      return std::nullopt;
  }
}

std::optional<std::uint64_t> map_uint(std::string_view body, std::string_view key) {
  codec::detail::field_reader r(body, {});
  std::optional<std::uint64_t> v;
  r.opt_uint(key, v, 0, codec::detail::u64_max);
  if (r.fault()) return std::nullopt;
  return v;
}

wire_peer::wire_peer(zmq::context_t& ctx, const std::string& endpoint,
                     const rlbus::curve_keys* keys)
    : sock_(ctx, zmq::socket_type::dealer) {
  sock_.set(zmq::sockopt::linger, 0);
  if (keys != nullptr) {
    sock_.set(zmq::sockopt::curve_serverkey, keys->server_key);
    sock_.set(zmq::sockopt::curve_publickey, keys->public_key);
    sock_.set(zmq::sockopt::curve_secretkey, keys->secret_key);
  }
  // As deep as the broker's own queues, so pipelined runs are paced by the bench's window
  // and never by a client-side limit.
  sock_.set(zmq::sockopt::rcvhwm, 100'000);
  sock_.set(zmq::sockopt::sndhwm, 100'000);
  sock_.connect(endpoint);
}

void wire_peer::send(const codec::message& m) {
  send(encode(m));
}

void wire_peer::send(const frames& f) {
  sock_.send(zmq::buffer(f.header), zmq::send_flags::sndmore);
  sock_.send(zmq::buffer(f.body), zmq::send_flags::none);
}

std::optional<codec::message> wire_peer::recv(std::chrono::milliseconds timeout) {
  // A receive timeout rather than a poll: one call less per message on the hot path.
  const auto ms = static_cast<int>(timeout.count());
  if (ms != rcvtimeo_) sock_.set(zmq::sockopt::rcvtimeo, rcvtimeo_ = ms);
  zmq::message_t head;
  zmq::message_t body;
  if (!sock_.recv(head, zmq::recv_flags::none)) return std::nullopt;
  if (!head.more()) fail("a message of one frame from the broker");
  (void)sock_.recv(body, zmq::recv_flags::none);
  while (body.more()) (void)sock_.recv(body, zmq::recv_flags::none);
  const auto h = codec::parse_header(head.to_string_view());
  if (!h) fail("a malformed header from the broker");
  auto m = codec::decode_body(h->type, body.to_string_view());
  if (!m) fail("an undecodable message from the broker: " + m.error().reason);
  if (const auto* e = std::get_if<codec::task_event>(&m.value())) {
    if (last_seq_ != 0 && e->seq > last_seq_ + 1) gaps_ += e->seq - last_seq_ - 1;
    last_seq_ = e->seq;
  }
  return std::move(m).value();
}

void wire_peer::hello(rlbus::role r, const std::string& id, rlbus::resources res) {
  send(codec::hello{r, id, codec::max_heartbeat_ms, std::move(res), std::nullopt});
  (void)expect<codec::welcome>("WELCOME");
}

std::chrono::milliseconds wire_peer::left(std::chrono::steady_clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max(ms, std::chrono::milliseconds(0));
}

void wire_peer::fail(const std::string& why) {
  throw std::runtime_error(why);
}

}  // namespace rlbus::bench
