// How gnsilu times GPU work, the tuner's candidates and the tools' rows alike: CUDA events around each run on a
// stream of its own, L2 flushed (a memset of twice its size) before every timed run, the median of the repeats.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "base/driver.hpp"
#include "runtime/workspace.hpp"

namespace gnsilu::detail {

class EventTimer {
 public:
  // For work in `context` (current on the caller), on a device with `l2_bytes` of L2.
  EventTimer(CUcontext context, std::size_t l2_bytes);
  // The stream the timed work must be enqueued on.
  CUstream stream() const { return stream_.get(); }
  // Makes the timer's stream wait for the work enqueued on `other` so far (x may still be being written there).
  void wait_for(CUstream other);

  // One timed run of `body` (which enqueues work on stream()), in microseconds.
  template <typename F>
  double time_us(F&& body) {
    start();
    body();
    return stop_us();
  }
  // `body` once untimed, then `repeats` timed runs; their median in microseconds.
  template <typename F>
  double median_us(int repeats, F&& body) {
    body();  // warm-up
    std::vector<double> times;
    times.reserve(static_cast<std::size_t>(repeats > 0 ? repeats : 0));
    for (int i = 0; i < repeats; ++i) times.push_back(time_us(body));
    return median(std::move(times));
  }
  // Each body once untimed, then `repeats` rounds that time every body once, in turn; the medians, in the bodies'
  // order. No timed run follows a run of its own body (unless there is only one): on the H200 a GroupNorm call timed
  // right after the same call ran up to 18% faster than after other work, which is how an application calls it
  // (docs/PERFORMANCE.md, "Tuning and timing").
  std::vector<double> interleaved_medians_us(int repeats, const std::vector<std::function<void()>>& bodies);

 private:
  void start();      // flushes L2, records the start event
  double stop_us();  // records the stop event, waits for it; the time since the start event
  static double median(std::vector<double> times);

  UniqueStream stream_;
  UniqueEvent start_, stop_;
  DeviceBuffer flush_;
  unsigned char flush_byte_ = 0;
};

}  // namespace gnsilu::detail
