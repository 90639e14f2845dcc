// A launch configuration's checks and its one text form ("e16 w8 s1 p4"), shared by every layer above: the
// cache checks imported entries with it, the runtime and the tuner describe configurations with it. The
// candidates the tuner times and the defaults (gnsilu::candidate_configs, gnsilu::default_config in gnsilu.hpp)
// are defined in launch_config.cpp too.
#pragma once

#include <string>

#include "gnsilu/gnsilu.hpp"

namespace gnsilu::detail {

// Throws Error(InvalidArgument) naming the field ("config.warps") when a configuration is out of range.
void check_config(const LaunchConfig& config);

// "e16 w8 s1 p4": elements per load, warps per block, pipeline stages, programs per multiprocessor.
std::string to_string(const LaunchConfig& config);

}  // namespace gnsilu::detail
