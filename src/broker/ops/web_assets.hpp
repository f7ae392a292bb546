// The web view's files (the page, its script and style, the charting library), compiled into
// the broker by web/embed.py: the page needs nothing outside the broker at run time.
#pragma once

#include <string_view>

namespace rlbus::broker {

struct web_asset {
  std::string_view name;  // as asked for under /assets/ ("index.html": the page)
  std::string_view type;  // its Content-Type
  std::string_view body;
};

/// The file called `name`, or nullptr.
const web_asset* find_web_asset(std::string_view name);

}  // namespace rlbus::broker
