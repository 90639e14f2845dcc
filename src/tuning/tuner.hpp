// The launch tuner. For a key that has no cached configuration, time every candidate launch configuration on
// scratch output (x is only read), and keep the default unless a candidate beats it by more than the noise
// measured in the same run and gives the default's bits. The selection logic talks to a TuneBackend, so CI
// tests it with an injected timer; GpuBackend times real launches on the device.
#pragma once

#include <cuda.h>

#include <memory>
#include <span>
#include <vector>

#include "base/device.hpp"
#include "base/driver.hpp"
#include "cache/entries.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/call.hpp"
#include "runtime/plan.hpp"
#include "runtime/workspace.hpp"
#include "tuning/event_timer.hpp"

namespace gnsilu::detail {

class TuneBackend {
 public:
  virtual ~TuneBackend() = default;
  // Compiles and loads the candidate's kernels; throws Error when they cannot be built.
  virtual void prepare(const LaunchConfig& config) = 0;
  // One run of the candidate on cold caches, in microseconds; throws Error when the launch fails.
  virtual double time_us(const LaunchConfig& config) = 0;
  // Whether the candidate's output is bit-identical to the default configuration's on the same input.
  virtual bool same_output_as_default(const LaunchConfig& config) = 0;
};

struct TuneBudget {
  int warmup = 2;                       // untimed runs per candidate
  int min_samples = 7;                  // first pass: rounds of every candidate in turn, at least this many,
  int max_samples = 40;                 // at most this many,
  double seconds_per_candidate = 0.02;  // and until this much wall time per candidate
  int leaders = 3;                      // the fastest, re-timed with the default before a winner is declared
  int leader_rounds = 15;               // interleaved rounds of the re-timing
  double min_gain = 0.01;               // a winner beats the default by this fraction and by the noise
};

struct TuneOutcome {
  LaunchConfig winner;
  double default_us = 0;
  double best_us = 0;
  double noise_us = 0;
  std::vector<cache::CandidateTiming> candidates;
};

// The cache entry for `key` from a tuning's outcome, timed on `tuned_shape` (the tuning slice: its dims, groups
// and the path it ran), stamped with this library's version and the time now: the one place where a TuneOutcome
// becomes a cache::TuningEntry.
cache::TuningEntry entry_of(const cache::TuningKey& key, const TuneOutcome& outcome, cache::TunedShape tuned_shape);

// Picks among `candidates`, whose first element is the default. Candidates that fail to prepare or to run
// are skipped (and reported); throws Error only when the default itself fails.
TuneOutcome select_config(std::span<const LaunchConfig> candidates, TuneBackend& backend, const TuneBudget& budget);

// Median and robust spread (1.4826 * median absolute deviation) of samples.
double median_of(std::vector<double> samples);
double noise_of(const std::vector<double>& samples);

// Times launches of `call`'s problem (already validated; x on the device) on scratch output on a private stream
// that first waits for call.stream's work, with L2 flushed before each timed run. call.workspace is not used.
class GpuBackend final : public TuneBackend {
 public:
  GpuBackend(const Call& call, const LaunchConfig& default_config);
  ~GpuBackend() override;
  GpuBackend(const GpuBackend&) = delete;
  GpuBackend& operator=(const GpuBackend&) = delete;
  void prepare(const LaunchConfig& config) override;
  double time_us(const LaunchConfig& config) override;
  bool same_output_as_default(const LaunchConfig& config) override;

 private:
  void run(const LaunchConfig& config);
  std::vector<unsigned char> output(const LaunchConfig& config);

  Problem problem_;
  Geometry geometry_;
  const DeviceInfo& device_;
  CUcontext context_;
  Path path_;
  LaunchConfig default_config_;
  EventTimer timer_;
  DeviceBuffer y_;
  DeviceBuffer workspace_;
  std::vector<unsigned char> default_output_;
};

// The part of x the tuner times (at most `max_bytes` of x and y together): its shape and group count, a prefix
// of x's memory in x's layout: channel-major, the first groups; channels-last, whole samples or the first pixels
// of the first one. Returns false when not even one group (channels-last: one pixel) fits.
bool tuning_slice(const Geometry& geometry, std::size_t x_size, std::size_t y_size, std::size_t max_bytes,
                  std::vector<int64_t>& shape, int64_t& groups);

}  // namespace gnsilu::detail
