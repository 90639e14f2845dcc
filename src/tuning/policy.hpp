// The process's tuning policy and the environment variables that set it:
//
//   GNSILU_TUNE            on (default) | cached | off
//   GNSILU_TUNE_MIN_BYTES  smallest activation (x and y bytes) timed by the tuner (default 8 MiB, read once
//                          per process); smaller ones use a cached entry or the default
//   GNSILU_TUNE_WAIT_MS    how long to wait for another process tuning the same key (default 3000,
//                          kLeaseTimings.first_use_wait; read on each tuning)
#pragma once

#include <cstddef>

#include "gnsilu/gnsilu.hpp"

namespace gnsilu::detail {

// GNSILU_TUNE until set_process_tune_policy (the API's set_tune_policy) changes it.
TunePolicy process_tune_policy();
void set_process_tune_policy(TunePolicy policy);

// GNSILU_TUNE_MIN_BYTES, read on the first call.
std::size_t min_tune_bytes();

// GNSILU_TUNE_WAIT_MS in seconds, read on each call.
double first_use_wait_seconds();

}  // namespace gnsilu::detail
