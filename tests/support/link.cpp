// See link.hpp.
#include "support/link.hpp"

#include <map>
#include <memory>
#include <vector>

#include <zmq_addon.hpp>

namespace rlbus::test {

cuttable_link::cuttable_link(zmq::context_t& ctx, std::string broker_endpoint)
    : ctx_(ctx), broker_(std::move(broker_endpoint)), front_(ctx, zmq::socket_type::router) {
  front_.set(zmq::sockopt::linger, 0);
  front_.bind("tcp://127.0.0.1:*");
  endpoint_ = front_.get(zmq::sockopt::last_endpoint);
  thread_ = std::thread([this] { run(); });
}

cuttable_link::~cuttable_link() {
  stop_.store(true);
  thread_.join();
}

void cuttable_link::run() {
  struct back_link {
    std::unique_ptr<zmq::socket_t> sock;
    unsigned epoch = 0;
  };
  std::map<std::string, back_link> backs;  // peer routing id -> its DEALER to the broker
  const auto is_cut = [this](const back_link& b) { return b.epoch < epoch_.load(); };
  while (!stop_.load()) {
    std::vector<zmq::pollitem_t> items{{front_.handle(), 0, ZMQ_POLLIN, 0}};
    std::vector<std::string> ids;
    for (auto& [id, b] : backs) {
      items.push_back({b.sock->handle(), 0, ZMQ_POLLIN, 0});
      ids.push_back(id);
    }
    // The timeout only bounds how long stop() waits; traffic wakes the poll at once.
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(10));
    if ((items[0].revents & ZMQ_POLLIN) != 0) {
      std::vector<zmq::message_t> frames;
      (void)zmq::recv_multipart(front_, std::back_inserter(frames));
      const auto id = frames[0].to_string();
      auto& back = backs[id];
      if (!back.sock) {
        back.sock = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
        back.sock->set(zmq::sockopt::linger, 0);
        back.sock->connect(broker_);
        back.epoch = epoch_.load();
      }
      if (!is_cut(back)) {
        zmq::send_multipart(*back.sock,
                            std::vector<zmq::message_t>(std::make_move_iterator(frames.begin() + 1),
                                                        std::make_move_iterator(frames.end())));
      }
    }
    for (std::size_t i = 1; i < items.size(); ++i) {
      if ((items[i].revents & ZMQ_POLLIN) == 0) continue;
      std::vector<zmq::message_t> frames;
      auto& back = backs[ids[i - 1]];
      (void)zmq::recv_multipart(*back.sock, std::back_inserter(frames));
      if (is_cut(back)) continue;
      frames.insert(frames.begin(), zmq::message_t(ids[i - 1]));
      zmq::send_multipart(front_, frames, zmq::send_flags::dontwait);
    }
  }
}

}  // namespace rlbus::test
