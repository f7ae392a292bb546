// See http.hpp.
#include "http.hpp"

#include <unistd.h>

#include <memory>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "scenario.hpp"

namespace rlbus::bench {

namespace {

constexpr std::chrono::seconds start_timeout{20};

// A command's time limit: generous, since a loaded machine can make a step take 50 ms.
std::chrono::milliseconds limit_for(std::uint64_t steps) {
  return std::chrono::milliseconds(30'000 + 100 * steps);
}

}  // namespace

http_baseline::http_baseline(const settings& s) {
  if (::access(s.python.c_str(), X_OK) != 0) throw std::runtime_error("no python at " + s.python);
  if (::access(s.http_script.c_str(), R_OK) != 0)
    throw std::runtime_error("no HTTP baseline script at " + s.http_script);
  worker_ =
      std::make_unique<child_process>(std::vector<std::string>{s.python, s.http_script, "worker"},
                                      log_file(s, "http-worker"), s.cpus);
  coordinator_ = std::make_unique<child_process>(
      std::vector<std::string>{s.python, s.http_script, "coordinator"},
      log_file(s, "http-coordinator"), s.cpus, true);
  try {
    worker_url_ =
        word_after(worker_->wait_for_line("rlbus-bench http: worker", start_timeout), "worker");
    (void)coordinator_->wait_for_line("rlbus-bench http: coordinator", start_timeout);
  } catch (const std::runtime_error&) {
    // The script's own words when flask or requests is missing, else the whole story.
    for (const auto* p : {worker_.get(), coordinator_.get()}) {
      const auto log = p->log();
      if (const auto at = log.find("missing python module"); at != std::string::npos)
        throw std::runtime_error(log.substr(at, log.find('\n', at) - at));
    }
    throw;
  }
}

std::string http_baseline::command(const std::string& cmd, std::chrono::milliseconds timeout) {
  const auto id = ++next_id_;
  if (!coordinator_->send_line(fmt::format("{} {}", id, cmd)))
    throw std::runtime_error("the HTTP coordinator process is gone");
  const auto tag = fmt::format("rlbus-bench http result {} ", id);
  const auto line = coordinator_->wait_for_line(tag, timeout);
  return line.substr(line.find(tag) + tag.size());
}

http_baseline::latency_result http_baseline::latency(std::size_t payload, int steps) {
  const auto out =
      nlohmann::json::parse(command(fmt::format("latency {} {} {}", worker_url_, payload, steps),
                                    limit_for(static_cast<std::uint64_t>(steps))));
  if (out.contains("error"))
    throw std::runtime_error("HTTP baseline: " + out["error"].get<std::string>());
  return {out.at("median_us").get<double>(), out.at("p99_us").get<double>()};
}

double http_baseline::throughput(std::size_t payload, int threads, std::uint64_t steps) {
  const auto out = nlohmann::json::parse(
      command(fmt::format("throughput {} {} {} {}", worker_url_, payload, threads, steps),
              limit_for(steps)));
  if (out.contains("error"))
    throw std::runtime_error("HTTP baseline: " + out["error"].get<std::string>());
  return out.at("steps_per_s").get<double>();
}

}  // namespace rlbus::bench
