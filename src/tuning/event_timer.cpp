#include "tuning/event_timer.hpp"

#include <algorithm>
#include <utility>

#include "base/errors.hpp"
#include "tuning/tuner.hpp"

namespace gnsilu::detail {

EventTimer::EventTimer(CUcontext context, std::size_t l2_bytes)
    : stream_(make_stream()),
      start_(make_event()),
      stop_(make_event()),
      flush_(context, std::max<std::size_t>(2 * l2_bytes, std::size_t{1} << 20)) {}

void EventTimer::wait_for(CUstream other) {
  const Driver& d = driver();
  GNSILU_CHECK(d.cuEventRecord(start_.get(), other));
  GNSILU_CHECK(d.cuStreamWaitEvent(stream_.get(), start_.get(), 0));
}

void EventTimer::start() {
  const Driver& d = driver();
  flush_byte_ = static_cast<unsigned char>(flush_byte_ + 1);
  GNSILU_CHECK(d.cuMemsetD8Async(flush_.get(), flush_byte_, flush_.size(), stream_.get()));
  GNSILU_CHECK(d.cuEventRecord(start_.get(), stream_.get()));
}

double EventTimer::stop_us() {
  const Driver& d = driver();
  GNSILU_CHECK(d.cuEventRecord(stop_.get(), stream_.get()));
  GNSILU_CHECK(d.cuEventSynchronize(stop_.get()));
  float ms = 0;
  GNSILU_CHECK(d.cuEventElapsedTime(&ms, start_.get(), stop_.get()));
  return 1000.0 * static_cast<double>(ms);
}

double EventTimer::median(std::vector<double> times) { return median_of(std::move(times)); }

std::vector<double> EventTimer::interleaved_medians_us(int repeats, const std::vector<std::function<void()>>& bodies) {
  for (const auto& body : bodies) body();  // warm-up
  std::vector<std::vector<double>> times(bodies.size());
  for (int r = 0; r < repeats; ++r)
    for (std::size_t i = 0; i < bodies.size(); ++i) times[i].push_back(time_us(bodies[i]));
  std::vector<double> medians;
  medians.reserve(bodies.size());
  for (auto& t : times) medians.push_back(median(std::move(t)));
  return medians;
}

}  // namespace gnsilu::detail
