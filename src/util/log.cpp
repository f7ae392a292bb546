// See log.hpp.
#include "util/log.hpp"

#include <chrono>
#include <memory>
#include <string>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

namespace rlbus::util {

// What this thread's lines are about, owned: the views a scope is given may go before it
// does (a session erased while its message is handled). Kept only for JSON lines.
struct about_now {
  std::string task;
  std::optional<std::uint32_t> attempt;
  std::string worker;
  std::string coordinator;
};

namespace {

thread_local about_now current;
bool json_lines = false;  // set once at start, before any other thread logs

// One JSON object per line: ts (UTC, ms), level, msg, then the fields of the current scope.
class json_formatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& m, spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json line;
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(m.time.time_since_epoch());
    line["ts"] =
        fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03}Z",
                    fmt::gmtime(std::chrono::system_clock::to_time_t(m.time)), ms.count() % 1000);
    const auto level = spdlog::level::to_string_view(m.level);
    line["level"] = std::string(level.data(), level.size());
    line["msg"] = std::string(m.payload.data(), m.payload.size());
    if (!current.task.empty()) line["task"] = current.task;
    if (current.attempt) line["attempt"] = *current.attempt;
    if (!current.worker.empty()) line["worker"] = current.worker;
    if (!current.coordinator.empty()) line["coordinator"] = current.coordinator;
    // Replaced, never thrown: a message with bytes that are not UTF-8 still makes a line.
    const auto text = line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }
  [[nodiscard]] std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<json_formatter>();
  }
};

}  // namespace

// Human lines name their task and peers in their text: the scope costs nothing there.
log_scope::log_scope(const log_about& about) : active_(json_lines) {
  if (!active_) return;
  saved_ = std::make_unique<about_now>(current);
  if (!about.task.empty()) current.task = about.task;
  if (about.attempt) current.attempt = about.attempt;
  if (!about.worker.empty()) current.worker = about.worker;
  if (!about.coordinator.empty()) current.coordinator = about.coordinator;
}

log_scope::~log_scope() {
  if (active_) current = std::move(*saved_);
}

void set_log_format(std::string_view format) {
  json_lines = format == "json";
  if (json_lines) {
    spdlog::set_formatter(std::make_unique<json_formatter>());
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  }
}

}  // namespace rlbus::util
