// See http_endpoint.hpp.
#include "broker/ops/http_endpoint.hpp"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "broker/ops/metrics.hpp"

namespace rlbus::broker {

struct http_endpoint::impl {
  httplib::Server http;
  std::string address;
  int port = 0;
  std::thread thread;
  std::atomic<bool> ended{false};  // the listening thread has returned
};

http_endpoint::http_endpoint(const std::string& address, std::uint32_t port,
                             const std::function<stats()>& snapshot, const web_sources& web,
                             const web_access& access)
    : impl_(std::make_unique<impl>()) {
  auto& h = impl_->http;
  // A scraper, a probe and a page or two: a request waits for a thread, never the loop.
  h.new_task_queue = [] { return new httplib::ThreadPool(4); };
  h.Get("/metrics", [snapshot, access](const httplib::Request& req, httplib::Response& res) {
    if (access.token_for_metrics && !access.admits(req)) {
      res.status = 401;
      res.set_content("/metrics needs the token: send 'Authorization: Bearer TOKEN'\n",
                      "text/plain");
      return;
    }
    res.set_content(prometheus_text(snapshot()), "text/plain; version=0.0.4; charset=utf-8");
  });
  h.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  h.Get("/readyz", [snapshot](const httplib::Request&, httplib::Response& res) {
    const auto s = snapshot();
    if (s.standby) {
      res.status = 503;
      res.set_content("standby: another broker of the group leads\n", "text/plain");
    } else if (s.draining) {
      res.status = 503;
      res.set_content("draining: the broker is stopping\n", "text/plain");
    } else {
      res.set_content("ready\n", "text/plain");
    }
  });
  if (web.ask) add_web_view(h, web, access);
  impl_->address = address;
  impl_->port =
      port == 0 ? h.bind_to_any_port(address)
                : (h.bind_to_port(address, static_cast<int>(port)) ? static_cast<int>(port) : -1);
  if (impl_->port <= 0)
    throw std::runtime_error(fmt::format(
        "cannot listen for HTTP on {}:{} (metrics.address, metrics.port)", address, port));
  impl_->thread = std::thread([this] {
    impl_->http.listen_after_bind();
    impl_->ended = true;
  });
  // httplib's stop() does nothing until the listening loop has begun, and that loop then
  // waits in accept() for ever: an endpoint destroyed before it began (a broker stopped as it
  // starts) would never end. So it is made only once the loop runs.
  while (!impl_->http.is_running() && !impl_->ended)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

http_endpoint::~http_endpoint() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string http_endpoint::url() const {
  return fmt::format("http://{}:{}", impl_->address, impl_->port);
}

}  // namespace rlbus::broker
