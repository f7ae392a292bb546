// A list of endpoints as one string, "tcp://a:7235,tcp://b:7235": the brokers of a group for
// a peer, or etcd's URLs for a broker.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace rlbus::util {

/// The endpoints of a comma-separated list, spaces around each trimmed. Throws
/// std::invalid_argument for an empty list or an empty entry.
inline std::vector<std::string> split_endpoints(const std::string& list) {
  std::vector<std::string> out;
  for (std::size_t from = 0; from <= list.size();) {
    auto to = list.find(',', from);
    if (to == std::string::npos) to = list.size();
    auto one = list.substr(from, to - from);
    one.erase(0, one.find_first_not_of(' '));
    one.erase(one.find_last_not_of(' ') + 1);
    if (one.empty())
      throw std::invalid_argument(
          list.empty() ? "endpoint must not be empty"
                       : fmt::format("'{}' has an empty entry between its commas", list));
    out.push_back(std::move(one));
    from = to + 1;
  }
  return out;
}

}  // namespace rlbus::util
