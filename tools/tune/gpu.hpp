// The GPU work of gnsilu-tune: a device session (the primary context of one device, made current), warming
// tuning keys, compiling kernel variants and re-timing cached winners.
#pragma once

#include <cuda.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/device.hpp"
#include "common/device.hpp"
#include "tuning/tuning_run.hpp"
#include "tune.hpp"

namespace gnsilu::tune {

class GpuSession {
 public:
  // The device with `ordinal`, or nullopt with `why` set when there is no usable driver or device.
  static std::unique_ptr<GpuSession> open(int ordinal, std::string& why);
  GpuSession(const GpuSession&) = delete;
  GpuSession& operator=(const GpuSession&) = delete;
  const detail::DeviceInfo& info() const { return context_->info(); }
  CUcontext context() const { return context_->context(); }
  cache::DeviceIdentity identity() const;

 private:
  GpuSession() = default;
  std::optional<tools::PrimaryContext> context_;  // released (after waiting for the device) with the session
};

struct WarmRow {
  ShapeRequest request;        // the first shape that needed the key
  detail::Geometry geometry;   // of that shape
  Path path = Path::Split;     // the path calls of that shape take
  cache::TuningKey key;
  detail::WarmResult::Outcome outcome = detail::WarmResult::Outcome::Failed;  // printed as outcome_name()
  std::optional<cache::TuningEntry> entry;
  std::string message;
  double seconds = 0;
};

// The distinct tuning keys of `requests` on this device (without tuning), in request order: each key is computed
// here once and carried in its row.
std::vector<WarmRow> keys_of(const GpuSession& gpu, const std::vector<ShapeRequest>& requests);

// Tunes (or finds cached) the rows' keys (keys_of) on this device, and loads the winners' kernels; while another
// process tunes a key, waits up to `wait_seconds` (0: not at all) and says who it waits for through `progress`.
std::vector<WarmRow> warm(GpuSession& gpu, std::vector<WarmRow> rows, bool retune, double wait_seconds,
                          Progress& progress);

// A warm outcome as gnsilu-tune prints it and its JSON holds it: "cached", "tuned", "tuned by another process",
// "busy", "failed" (and "not found", which warm, always allowed to tune, never gives).
const char* outcome_name(detail::WarmResult::Outcome outcome);

// What a compiled program is made for besides its launch configuration: dtypes, layout, activation.
struct KernelForm {
  DTypePair pair;
  Layout layout = Layout::ChannelsFirst;
  Activation activation = Activation::SiLU;
  friend bool operator==(const KernelForm&, const KernelForm&) = default;
};

// Appends `form` unless `forms` holds it already.
void add_unique(std::vector<KernelForm>& forms, const KernelForm& form);

// How many distinct programs the candidate configurations compile to per form (programs_per_sm is a grid size,
// not code).
std::size_t codes_per_form();

// Compiles every candidate configuration for each form and architecture into the process's kernel cache (no GPU
// needed). Returns how many variants it went through.
std::size_t compile_all(const std::vector<int>& archs, const std::vector<KernelForm>& forms, Progress& progress);

struct VerifyRow {
  cache::TuningEntry entry;
  double winner_us = 0;   // now
  double default_us = 0;  // now
  double drift = 0;       // winner_us / entry.best_us - 1
  std::string status;     // "ok", "drift", "failed: ..."
};

// Re-times the winner and the default of every entry of `entries` (all for this device and code version) on
// their tuned shapes, `samples` interleaved runs each, L2 flushed.
std::vector<VerifyRow> verify(GpuSession& gpu, const std::vector<cache::TuningEntry>& entries, int samples,
                              double tolerance, Progress& progress);

}  // namespace gnsilu::tune
