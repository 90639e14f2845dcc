// How the tools time things: the wall clock (Clock, seconds_since) and GPU work with the tuner's EventTimer (CUDA
// events around each run on a stream of its own, L2 flushed before every timed run, the median of the repeats).
#pragma once

#include <chrono>

#include "tuning/event_timer.hpp"

namespace gnsilu::tools {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The tuner's timer (src/tuning/event_timer.hpp): one way of timing GPU work for the library and the tools.
using detail::EventTimer;

}  // namespace gnsilu::tools
