#include "tuning/tuner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <string>
#include <utility>

#include "base/driver.hpp"
#include "base/errors.hpp"
#include "runtime/kernels.hpp"
#include "runtime/launch.hpp"
#include "base/log.hpp"
#include "runtime/modules.hpp"

namespace gnsilu::detail {

double median_of(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

double noise_of(const std::vector<double>& samples) {
  const double m = median_of(samples);
  std::vector<double> deviations;
  deviations.reserve(samples.size());
  for (double s : samples) deviations.push_back(std::fabs(s - m));
  return 1.4826 * median_of(std::move(deviations));
}

namespace {

struct Candidate {
  LaunchConfig config;
  bool ok = false;
  std::string status;
  std::vector<double> first_pass;
  std::vector<double> rounds;
  double median() const { return median_of(rounds.empty() ? first_pass : rounds); }
  double noise() const { return noise_of(rounds.empty() ? first_pass : rounds); }
};

}  // namespace

TuneOutcome select_config(std::span<const LaunchConfig> configs, TuneBackend& backend, const TuneBudget& budget) {
  if (configs.empty()) throw Error(Status::Internal, "gnsilu: tuning needs at least the default configuration");
  std::vector<Candidate> all(configs.size());
  // A candidate that cannot be built or run is left out of the rest, with why.
  const auto skip = [](Candidate& c, const Error& e) {
    c.ok = false;
    c.status = std::string("failed: ") + e.what();
    c.first_pass.clear();
    logger().warn("tuning: candidate {} skipped: {}", to_string(c.config), e.what());
  };
  // Each candidate built, loaded and run untimed first, so that compiles and module loads stay out of the timings.
  std::size_t usable = 0;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    Candidate& c = all[i];
    c.config = configs[i];
    try {
      backend.prepare(c.config);
      for (int w = 0; w < budget.warmup; ++w) backend.time_us(c.config);
      c.ok = true;
      c.status = "ok";
      ++usable;
    } catch (const Error& e) {
      if (i == 0) throw;  // the default must work: the call would fail with it anyway
      skip(c, e);
    }
  }

  // The first pass: every candidate once a round, in turn, so that no timed run follows a run of its own configuration.
  // A call in an application follows other kernels; on the H200 a configuration timed back to back ran up to 18% faster
  // than the same configuration timed after another one (docs/PERFORMANCE.md, "Tuning and timing"), and a first pass
  // timed back to back chose leaders that the interleaved rounds below then found slower than a candidate left out.
  // Rounds until every candidate has min_samples and the pass has taken seconds_per_candidate per candidate, or
  // max_samples rounds.
  const auto started = std::chrono::steady_clock::now();
  for (int round = 0; round < budget.max_samples && usable > 0; ++round) {
    for (std::size_t i = 0; i < all.size(); ++i) {
      Candidate& c = all[i];
      if (!c.ok) continue;
      try {
        c.first_pass.push_back(backend.time_us(c.config));
      } catch (const Error& e) {
        if (i == 0) throw;
        skip(c, e);
        --usable;
      }
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (round + 1 >= budget.min_samples && elapsed >= budget.seconds_per_candidate * static_cast<double>(usable)) break;
  }

  // The leaders (fastest by the first pass) and the default, re-timed in interleaved rounds so that drift in
  // the device's clocks or in other work on it affects them alike. The same order every round (a rotation would
  // put a candidate after itself where two are left), begun with another candidate than the one timed last.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].ok) order.push_back(i);
  const std::size_t timed_last = order.empty() ? 0 : order.back();
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return all[a].median() < all[b].median(); });
  std::vector<std::size_t> leaders(order.begin(), order.begin() + std::min<std::size_t>(order.size(), budget.leaders));
  if (std::find(leaders.begin(), leaders.end(), 0) == leaders.end()) leaders.push_back(0);
  std::vector<std::size_t> round_order = leaders;
  if (round_order.size() > 1 && round_order.front() == timed_last)
    std::rotate(round_order.begin(), round_order.begin() + 1, round_order.end());
  for (int r = 0; r < budget.leader_rounds; ++r) {
    for (std::size_t index : round_order) {
      Candidate& c = all[index];
      if (!c.ok) continue;
      try {
        c.rounds.push_back(backend.time_us(c.config));
      } catch (const Error& e) {
        if (&c == &all[0]) throw;
        c.ok = false;
        c.status = std::string("failed: ") + e.what();
      }
    }
  }

  // The winner: the fastest leader that beats the default by more than the noise and by min_gain, and gives the
  // default's bits; otherwise the default.
  std::stable_sort(leaders.begin(), leaders.end(), [&](std::size_t a, std::size_t b) { return all[a].median() < all[b].median(); });
  const Candidate& def = all[0];
  std::size_t winner = 0;
  for (std::size_t index : leaders) {
    if (index == 0) break;  // nothing faster than the default is left
    Candidate& c = all[index];
    if (!c.ok) continue;
    const double gain = def.median() - c.median();
    const double noise = std::max(def.noise(), c.noise());
    if (gain <= noise || gain <= budget.min_gain * def.median()) break;  // the rest are slower still
    bool same = false;
    try {
      same = backend.same_output_as_default(c.config);
    } catch (const Error& e) {
      c.status = std::string("failed: ") + e.what();
      c.ok = false;
      continue;
    }
    if (!same) {
      c.status = "wrong output";
      c.ok = false;
      logger().error("tuning: candidate {} gives different bits from the default; rejected (please report this)",
                     to_string(c.config));
      continue;
    }
    winner = index;
    break;
  }

  TuneOutcome out;
  out.winner = all[winner].config;
  out.default_us = def.median();
  out.best_us = all[winner].median();
  out.noise_us = std::max(def.noise(), all[winner].noise());
  for (const Candidate& c : all) {
    cache::CandidateTiming t;
    t.config = c.config;
    t.status = c.status;
    const auto& samples = c.rounds.empty() ? c.first_pass : c.rounds;
    t.samples = static_cast<int>(samples.size());
    t.median_us = samples.empty() ? 0 : c.median();
    t.noise_us = samples.empty() ? 0 : c.noise();
    out.candidates.push_back(std::move(t));
  }
  return out;
}

cache::TuningEntry entry_of(const cache::TuningKey& key, const TuneOutcome& outcome, cache::TunedShape tuned_shape) {
  cache::TuningEntry e;
  e.key = key;
  e.winner = outcome.winner;
  e.default_us = outcome.default_us;
  e.best_us = outcome.best_us;
  e.noise_us = outcome.noise_us;
  e.candidates = outcome.candidates;
  e.tuned_shape = std::move(tuned_shape);
  e.library_version = version();
  e.created_at = static_cast<int64_t>(std::time(nullptr));
  return e;
}

bool tuning_slice(const Geometry& g, std::size_t x_size, std::size_t y_size, std::size_t max_bytes,
                  std::vector<int64_t>& shape, int64_t& groups) {
  const std::size_t element_bytes = x_size + y_size;
  const std::size_t group_bytes = static_cast<std::size_t>(g.group_length) * element_bytes;
  if (g.layout == Layout::ChannelsLast) {
    // Whole samples, or the first pixels of the first sample with all their channels (groups interleave in a
    // pixel, so a prefix of memory holds every group): whole windows of 1024 pixels where there are more.
    const std::size_t sample_bytes = group_bytes * static_cast<std::size_t>(g.g);
    groups = g.g;
    if (sample_bytes != 0 && sample_bytes <= max_bytes) {
      shape = {std::min<int64_t>(g.n, static_cast<int64_t>(max_bytes / sample_bytes)), g.c, g.s};
      return true;
    }
    const std::size_t pixel_bytes = static_cast<std::size_t>(g.c) * element_bytes;
    int64_t pixels = static_cast<int64_t>(max_bytes / pixel_bytes);
    if (g.s > 1024 && pixels >= 1024) pixels -= pixels % 1024;
    if (pixels < 1 || pixel_bytes == 0) return false;
    shape = {1, g.c, std::min(pixels, g.s)};
    return true;
  }
  if (group_bytes == 0 || group_bytes > max_bytes) return false;
  const int64_t fit = static_cast<int64_t>(max_bytes / group_bytes);
  if (fit >= g.groups_total) {
    shape = {g.n, g.c, g.s};
    groups = g.g;
  } else if (fit >= g.g) {
    shape = {fit / g.g, g.c, g.s};  // whole samples
    groups = g.g;
  } else {
    shape = {1, fit * g.channels_per_group, g.s};  // the first groups of the first sample
    groups = fit;
  }
  return true;
}

GpuBackend::GpuBackend(const Call& call, const LaunchConfig& default_config)
    : problem_(call.problem), geometry_(call.geometry), device_(call.device), context_(call.context),
      path_(call.path), default_config_(default_config),
      // L2 flushed before each timed run, so that every run reads x from DRAM as a real call would.
      timer_(call.context, static_cast<std::size_t>(call.device.l2_bytes)) {
  timer_.wait_for(call.stream);  // x may still be being written by the caller's stream: start after its work
  y_ = DeviceBuffer(context_, static_cast<std::size_t>(geometry_.numel) * dtype_size(problem_.y_dtype));
  workspace_ = DeviceBuffer(context_, std::max<std::size_t>(workspace_bytes(geometry_), 256));
  problem_.y = reinterpret_cast<void*>(y_.get());
}

GpuBackend::~GpuBackend() {
  // The buffers, events and stream go after its work.
  log_dropped(driver().cuStreamSynchronize(timer_.stream()), "cuStreamSynchronize (the tuner's stream)");
}

void GpuBackend::prepare(const LaunchConfig& config) {
  check_config(config);
  kernels_for(context_, device_,
              Variant{problem_.x_dtype, problem_.y_dtype, config, geometry_.layout, problem_.activation});
}

void GpuBackend::run(const LaunchConfig& config) {
  launch_call(Call{problem_, geometry_, device_, context_, timer_.stream(), path_,
                   reinterpret_cast<void*>(workspace_.get())},
              config);
}

double GpuBackend::time_us(const LaunchConfig& config) { return timer_.time_us([&] { run(config); }); }

std::vector<unsigned char> GpuBackend::output(const LaunchConfig& config) {
  const Driver& d = driver();
  GNSILU_CHECK(d.cuMemsetD8Async(y_.get(), 0xFF, y_.size(), timer_.stream()));
  run(config);
  std::vector<unsigned char> host(y_.size());
  GNSILU_CHECK(d.cuStreamSynchronize(timer_.stream()));
  GNSILU_CHECK(d.cuMemcpyDtoH_v2(host.data(), y_.get(), host.size()));
  return host;
}

bool GpuBackend::same_output_as_default(const LaunchConfig& config) {
  if (default_output_.empty()) default_output_ = output(default_config_);
  return output(config) == default_output_;
}

}  // namespace gnsilu::detail
