// The broker's log lines: human by default (time, level, message), or JSON lines, one object
// per line with the time, the level, the message and what the line is about (task id,
// attempt, worker id, coordinator id), for a log pipeline to index. What a line is about is
// set by the code around it for as long as a `log_scope` lives, so a line names its task or
// peer without each call site spelling the fields out.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

namespace rlbus::util {

/// What the lines logged meanwhile are about. Empty fields say nothing.
struct log_about {
  std::string_view task;
  std::optional<std::uint32_t> attempt;
  std::string_view worker;
  std::string_view coordinator;
};

struct about_now;

/// Sets what this thread's log lines are about until it is destroyed; a scope inside another
/// adds its fields to the outer one's. The fields are copied, so `about` may go first. Does
/// nothing unless the lines are JSON.
class log_scope {
 public:
  explicit log_scope(const log_about& about);
  ~log_scope();
  log_scope(const log_scope&) = delete;
  log_scope& operator=(const log_scope&) = delete;

 private:
  bool active_ = false;
  std::unique_ptr<about_now> saved_;
};

/// The format of spdlog's default logger from now on: "human" or "json".
void set_log_format(std::string_view format);

}  // namespace rlbus::util
