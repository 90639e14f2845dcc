// How the tools time GPU work: CUDA events around each run on a stream of their own, L2 flushed (a memset of
// twice its size) before every timed run, the median of the repeats. gnsilu-bench's tables and check use it; the
// tuner's GpuBackend (src/tuning/tuner.cpp) times candidates the same way.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <vector>

#include "base/driver.hpp"
#include "runtime/workspace.hpp"

namespace gnsilu::tools {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class EventTimer {
 public:
  // For work in `context` (current on the caller), on a device with `l2_bytes` of L2.
  EventTimer(CUcontext context, std::size_t l2_bytes);
  // The stream the timed work must be enqueued on.
  CUstream stream() const { return stream_.get(); }

  // Runs `body` (which enqueues work on stream()) once untimed, then `repeats` times timed; the median in us.
  template <typename F>
  double median_us(int repeats, F&& body) {
    body();  // warm-up
    std::vector<double> times;
    times.reserve(static_cast<std::size_t>(repeats > 0 ? repeats : 0));
    for (int i = 0; i < repeats; ++i) {
      start();
      body();
      times.push_back(stop_us());
    }
    return median(std::move(times));
  }

 private:
  void start();      // flushes L2, records the start event
  double stop_us();  // records the stop event, waits for it; the time since the start event
  static double median(std::vector<double> times);

  detail::UniqueStream stream_;
  detail::UniqueEvent start_, stop_;
  detail::DeviceBuffer flush_;
  unsigned char flush_byte_ = 0;
};

}  // namespace gnsilu::tools
