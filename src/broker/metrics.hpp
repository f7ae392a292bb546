// The broker's counters in the Prometheus text exposition format (version 0.0.4): what an
// operator graphs and alerts on, every family with its HELP and TYPE.
#pragma once

#include <string>

#include "broker/server.hpp"

namespace rlbus::broker {

/// The exposition of one snapshot. Metric names start `rlbus_`; counters end `_total`.
std::string prometheus_text(const stats& s);

}  // namespace rlbus::broker
