// Running a tuning under the key's lease. One process times a key's candidates while holding the key's lease in
// the user cache file (renewing it while it times) and stores the winner; another process that finds the lease
// held waits for that entry, takes the lease over when its holder dies or stops renewing it, and otherwise gives
// up after its wait. The durations are kLeaseTimings (tuning/lease_timings.hpp).
//
// What the tuning needs from the device comes through TuningHooks: empty hooks time real launches on the GPU;
// tests pass a fake backend (and the free memory) and run the lease, wait and store logic on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/device.hpp"
#include "cache/cache.hpp"
#include "cache/entries.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/call.hpp"
#include "runtime/plan.hpp"
#include "tuning/lease_timings.hpp"
#include "tuning/tuner.hpp"

namespace gnsilu::detail {

// What warm_key did for a key.
struct WarmResult {
  enum class Outcome {
    Cached,          // an entry was already in a cache file
    Tuned,           // timed here and stored in the user file
    TunedElsewhere,  // another process held the key's lease and stored its entry meanwhile
    HeldByOther,     // another process holds the lease and stored nothing in time
    Failed,          // tuning failed (message says why)
    NotFound,        // no entry, and the request did not allow tuning (EntryRequest::may_tune)
  };
  Outcome outcome = Outcome::Failed;
  cache::TuningKey key;
  std::optional<cache::TuningEntry> entry;
  std::string message;
  double seconds = 0;  // spent tuning or waiting
};

// While another live process holds the key's lease, `waiting` (if set) is called every claim_every (half a second)
// with the holder's description ("pid 1234 on host, since 12 s") and the seconds waited; the wait lasts up to
// `wait_seconds` for that process's entry, takes the lease over (and tunes) if its holder dies or stops renewing
// it, and otherwise gives up (HeldByOther).
struct WaitOptions {
  double wait_seconds = kLeaseTimings.warm_wait.count();
  std::function<void(const std::string& holder, double waited)> waiting;
};

// Makes the backend that times the candidates, for the call of the tuning slice (its problem covers only the
// slice's shape; the Call and what it refers to live until the backend is destroyed) and the path's default
// configuration (the first candidate).
using BackendFactory =
    std::function<std::unique_ptr<TuneBackend>(const Call& slice_call, const LaunchConfig& default_config)>;

// What a tuning needs from the device. An empty member means the GPU's (gpu_hooks(): all empty).
struct TuningHooks {
  // Empty: a GpuBackend, and before timing, every candidate's kernels are compiled in parallel with NVRTC (they
  // land in the cache file, where GpuBackend::prepare finds them). With a factory nothing is compiled up front:
  // its backend's prepare() builds what it needs (a fake needs nothing, so tests run without NVRTC work).
  BackendFactory backend;
  // Free device memory in bytes, which bounds the tuning slice. Empty: cuMemGetInfo in the current context.
  std::function<std::size_t()> free_memory;
  // Whether the call's stream is capturing a CUDA graph (config_for then uses a cached entry or the default and
  // does not tune). Empty: cuStreamIsCapturing(call.stream).
  std::function<bool(const Call& call)> capturing;
  LeaseTimings timings = kLeaseTimings;
};
const TuningHooks& gpu_hooks();

// The part of a tensor the tuner times on this device (tuning_slice_of): its shape and groups.
struct TuningSlice {
  std::vector<int64_t> shape;
  int64_t groups = 0;
};

// An entry wanted for one key of one call, and what may be done to get it.
struct EntryRequest {
  EntryRequest(const Call& for_call, cache::TuningKey its_key) : call(for_call), key(std::move(its_key)) {}
  const Call& call;
  cache::TuningKey key;    // tuning_key(call), computed once by the caller
  bool may_tune = true;    // false: the cache files' entry or NotFound (a policy or a graph capture forbids timing)
  bool retune = false;     // time the candidates even when an entry exists (gnsilu-tune warm --retune)
  std::optional<TuningSlice> slice;  // the slice the caller sized x for (gnsilu-tune); empty: tuning_slice_of
                                     // when the tuning starts
};

// The one sequence of a miss, for config_for and for gnsilu-tune warm alike: the cache files' entry for the key
// (Cached) unless `retune`; else, if `may_tune`, the candidates timed under the key's lease and the winner stored
// in `store`'s user file. Under the lease: when another live process holds it, this waits as `wait` says for that
// process's entry (TunedElsewhere), claiming again every claim_every (the lease is taken over when its holder has
// died or stopped renewing it), and gives up after the wait (HeldByOther). A failed tuning (an Error) is Failed,
// with its message; the lease is released however the tuning ends. With `retune`, the entry in the cache files when
// it starts is the one being replaced: only a different one (stored by the lease's holder meanwhile) is
// TunedElsewhere. Only the tuning slice of x is read: x needs to cover the slice's shape, not the whole tensor.
// Throws only for driver failures outside tuning.
WarmResult find_or_tune(const EntryRequest& request, cache::LayeredCache& store, const WaitOptions& wait,
                        const TuningHooks& hooks);

// find_or_tune for `call` in the process's cache files, tuning allowed (gnsilu-tune warm): makes sure they hold a
// tuned entry for its key, whatever its size.
WarmResult warm_key(const Call& call, bool retune, const WaitOptions& wait = {});
WarmResult warm_key(const Call& call, bool retune, const WaitOptions& wait, const TuningHooks& hooks);
// The same with the key and the slice as the caller computed them: gnsilu-tune warm keys its rows once and sizes
// x for the slice it passes, which the tuning then times.
WarmResult warm_key(const Call& call, const cache::TuningKey& key, const std::optional<TuningSlice>& slice,
                    bool retune, const WaitOptions& wait, const TuningHooks& hooks = gpu_hooks());

// The cache files' entry for `key` when its winner is a valid configuration (counted as found in the cache).
// With `other_than`, an entry with the same measurement as that one counts as none (retuning: only a new entry
// is another process's work).
std::optional<cache::TuningEntry> usable_entry(cache::LayeredCache& store, const cache::TuningKey& key,
                                               const cache::TuningEntry* other_than = nullptr);

// The part of a tensor the tuner times on this device now: at most a quarter of the free device memory
// (cuMemGetInfo; or `free_bytes`), and at most 256 MiB. Throws Error(OutOfMemory) when not one group fits that
// scratch budget.
TuningSlice tuning_slice_of(const Geometry& geometry, DType x, DType y);
TuningSlice tuning_slice_of(const Geometry& geometry, DType x, DType y, std::size_t free_bytes);

}  // namespace gnsilu::detail
