// Which launch configuration a call uses. The hot path is one hash lookup under a shared lock, keyed by plain
// values (no allocation). On a miss, once per key per process: the cache files (user, then shared), then,
// if the policy allows and the activation is large enough, the tuner, under a lease in the user file so that
// one process tunes a key while others wait briefly or use the default without storing anything.
//
//   GNSILU_TUNE            on (default) | cached | off
//   GNSILU_TUNE_MIN_BYTES  smallest activation (x and y bytes) timed by the tuner (default 8 MiB, read once
//                          per process); smaller ones use a cached entry or the default
//   GNSILU_TUNE_WAIT_MS    how long to wait for another process tuning the same key (default 3000)
#pragma once

#include <functional>

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/counters.hpp"  // counters(): what lookups and tunings did in this process
#include "base/device.hpp"
#include "cache/entries.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/call.hpp"
#include "runtime/plan.hpp"

namespace gnsilu::detail {

LaunchConfig config_for(const Call& call, TunePolicy policy);

TunePolicy process_tune_policy();
void set_process_tune_policy(TunePolicy policy);

// The tuning key of a call (device identity, code version, channels per group, dtypes, layout, activation, size
// class and path).
cache::TuningKey tuning_key(const DeviceInfo& device, const Geometry& geometry, DType x, DType y, Path path,
                            Activation activation = Activation::SiLU);
cache::TuningKey tuning_key(const Call& call);
cache::DeviceIdentity identity_of(const DeviceInfo& device);

// What warm_key did for a key.
struct WarmResult {
  enum class Outcome {
    Cached,          // an entry was already in a cache file
    Tuned,           // timed here and stored in the user file
    TunedElsewhere,  // another process held the key's lease and stored its entry meanwhile
    HeldByOther,     // another process holds the lease and stored nothing in time
    Failed,          // tuning failed (message says why)
  };
  Outcome outcome = Outcome::Failed;
  cache::TuningKey key;
  std::optional<cache::TuningEntry> entry;
  std::string message;
  double seconds = 0;  // spent tuning or waiting
};

// Makes sure the cache files hold a tuned entry for `call`'s key, whatever its size (gnsilu-tune warm). With
// `retune` it times the candidates even when an entry exists. Only the tuning slice of x is read: x needs to
// cover tuning_slice_of()'s shape, not the whole tensor. Throws only for driver failures outside tuning.
// While another live process holds the key's lease, `waiting` (if set) is called about every half second with
// the holder's description ("pid 1234 on host, since 12 s") and the seconds waited; warm_key waits up to
// `wait_seconds` for that process's entry, takes the lease over (and tunes) if its holder dies or stops renewing
// it, and otherwise gives up (HeldByOther).
struct WaitOptions {
  double wait_seconds = 600.0;
  std::function<void(const std::string& holder, double waited)> waiting;
};
WarmResult warm_key(const Call& call, bool retune, const WaitOptions& wait = {});

// The shape (and groups) of the part of a tensor the tuner times on this device now (it depends on free
// device memory). Throws Error(OutOfMemory) when not one group fits the scratch budget.
void tuning_slice_of(const Geometry& geometry, DType x, DType y, std::vector<int64_t>& shape, int64_t& groups);

// Forgets the configurations resolved in this process (tests).
void clear_config_table();

}  // namespace gnsilu::detail
