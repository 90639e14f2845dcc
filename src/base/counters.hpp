// What happened so far in this process (for tests, tools and logs): one set of counters that every layer
// increments (the runtime counts NVRTC runs and kernels loaded from the cache, tuning counts lookups and
// tunings) and gnsilu-tune, gnsilu-bench and the tests read.
#pragma once

#include <atomic>
#include <cstdint>

namespace gnsilu::detail {

struct Counters {
  std::atomic<uint64_t> found_in_cache{0};
  std::atomic<uint64_t> tuned{0};
  std::atomic<uint64_t> defaulted{0};
  std::atomic<uint64_t> waited_for_other_process{0};
  std::atomic<uint64_t> compiled{0};            // NVRTC runs
  std::atomic<uint64_t> kernels_from_cache{0};  // compiled kernels found in the cache files
};
Counters& counters();

}  // namespace gnsilu::detail
