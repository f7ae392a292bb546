// A cuttable relay between peers and the broker, for tests of network failure: each peer
// connection gets its own DEALER to the broker (so the broker sees one connection per peer,
// as without the relay), and cut_existing() silently drops everything on the connections
// open at that moment, in both directions, like a partition neither side is told about.
// Connections opened afterwards pass, so a peer that reconnects gets through.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include <zmq.hpp>

namespace rlbus::test {

class cuttable_link {
 public:
  /// Binds a ROUTER on an ephemeral tcp port and starts relaying to `broker_endpoint`.
  cuttable_link(zmq::context_t& ctx, std::string broker_endpoint);
  ~cuttable_link();
  cuttable_link(const cuttable_link&) = delete;
  cuttable_link& operator=(const cuttable_link&) = delete;

  /// Where peers connect instead of the broker.
  [[nodiscard]] const std::string& endpoint() const { return endpoint_; }
  /// From now on, drop every frame of the connections open now (both directions).
  void cut_existing() { ++epoch_; }

 private:
  void run();
  zmq::context_t& ctx_;
  std::string broker_;
  zmq::socket_t front_;
  std::string endpoint_;
  std::atomic<unsigned> epoch_{0};  // connections opened in an earlier epoch are cut
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace rlbus::test
