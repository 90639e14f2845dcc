// Which launch configuration a call uses. The hot path is one hash lookup under a shared lock, keyed by plain
// values (no allocation). On a miss, once per key per process: this layer decides whether the call may tune (the
// policy allows it, no graph capture, the activation large enough), and tuning_run's find_or_tune does the rest in
// one sequence: the cache files (user, then shared), then, if allowed, the tuner, under a lease in the user file so
// that one process tunes a key while others wait briefly or use the default without storing anything.
//
// The tuning layer's other parts, included here so that one include gives all of them:
//   tuning/policy.hpp         GNSILU_TUNE, GNSILU_TUNE_MIN_BYTES, GNSILU_TUNE_WAIT_MS and the process's policy
//   tuning/keys.hpp           tuning keys, device identities, size classes
//   tuning/tuning_run.hpp     find_or_tune (look up, lease, tune, store), warm_key, WaitOptions, WarmResult,
//                             TuningHooks, the tuning slice
//   tuning/lease_timings.hpp  the lease protocol's durations
//   base/counters.hpp         what lookups and tunings did in this process
#pragma once

#include "base/counters.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/call.hpp"
#include "tuning/keys.hpp"
#include "tuning/lease_timings.hpp"
#include "tuning/policy.hpp"
#include "tuning/tuning_run.hpp"

namespace gnsilu::detail {

LaunchConfig config_for(const Call& call, TunePolicy policy);
// The same with the tuning's access to the device through `hooks` (tests: a fake backend, no GPU). The table is
// keyed by the call alone: clear_config_table() between calls with different hooks.
LaunchConfig config_for(const Call& call, TunePolicy policy, const TuningHooks& hooks);

// Forgets the configurations resolved in this process (tests).
void clear_config_table();

}  // namespace gnsilu::detail
