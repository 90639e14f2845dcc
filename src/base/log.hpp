// The library's logger (spdlog, to stderr, named "gnsilu"). Level from GNSILU_LOG_LEVEL: trace, debug, info,
// warn (the default), error, critical or off.
#pragma once

#include <spdlog/spdlog.h>

namespace gnsilu::detail {

spdlog::logger& logger();

}  // namespace gnsilu::detail
