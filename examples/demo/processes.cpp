// See processes.hpp: util::subprocess with the launcher's settings.
#include "demo/processes.hpp"

#include <signal.h>

#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

namespace rlbus::demo {

namespace {

util::subprocess start(const std::string& name, const std::string& path,
                       const std::vector<std::string>& args, bool capture_output) {
  util::spawn_options o;
  o.new_process_group = true;
  o.death_signal = SIGTERM;
  o.reset_signals = true;  // the launcher ignores SIGPIPE, and exec would keep that
  o.capture_output = capture_output;
  try {
    return util::subprocess(path, args, o);
  } catch (const std::system_error& e) {
    throw std::runtime_error(fmt::format("cannot start {}: {}", name, e.what()));
  }
}

}  // namespace

process::process(std::string name, const std::string& path, const std::vector<std::string>& args,
                 bool capture_output)
    : util::subprocess(start(name, path, args, capture_output)), name_(std::move(name)) {}

std::string own_directory() {
  const auto self = own_path();
  const auto slash = self.rfind('/');
  return slash == std::string::npos ? std::string() : self.substr(0, slash);
}

}  // namespace rlbus::demo
