#include "tuning/tuning_run.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/counters.hpp"
#include "base/driver.hpp"
#include "base/errors.hpp"
#include "base/launch_config.hpp"
#include "base/log.hpp"
#include "cache/lease.hpp"
#include "runtime/kernels.hpp"
#include "runtime/modules.hpp"
#include "tuning/keys.hpp"

namespace gnsilu::detail {
namespace {

constexpr std::size_t kMaxScratchBytes = std::size_t{256} << 20;

std::size_t free_device_memory() {
  std::size_t free_bytes = 0, total = 0;
  GNSILU_CHECK(driver().cuMemGetInfo_v2(&free_bytes, &total));
  return free_bytes;
}

// Times the candidates on the request's slice of its call's x (sized now when the request has none); returns the
// cache entry to store.
cache::TuningEntry tune(const EntryRequest& request, const TuningHooks& hooks) {
  const Call& call = request.call;
  const cache::TuningKey& key = request.key;
  const TuningSlice sized =
      request.slice ? *request.slice
                    : tuning_slice_of(call.geometry, call.problem.x_dtype, call.problem.y_dtype,
                                      hooks.free_memory ? hooks.free_memory() : free_device_memory());
  const std::vector<int64_t>& shape = sized.shape;
  const int64_t groups = sized.groups;
  Problem slice = call.problem;
  slice.shape = shape;
  slice.num_groups = groups;
  slice.pad = {};  // the scratch output has the slice's shape: candidates are timed on the unpadded call
  const Geometry g = make_geometry(shape, groups, call.geometry.layout);

  // The path's default first: the tuner keeps it unless a candidate is clearly faster.
  std::vector<LaunchConfig> candidates{default_config(call.path)};
  for (const auto& c : candidate_configs())
    if (!(c == candidates[0])) candidates.push_back(c);
  if (!hooks.backend) {
    // Compile every candidate first, in parallel (a later process finds them in the cache file).
    std::vector<std::thread> compilers;
    compilers.reserve(candidates.size());
    for (const auto& c : candidates) {
      compilers.emplace_back([&, c] {
        try {
          compiled_for(call.device.arch(), Variant{slice.x_dtype, slice.y_dtype, c, g.layout, slice.activation});
        } catch (const Error&) {
          // select_config reports the failure when it prepares this candidate
        }
      });
    }
    for (auto& t : compilers) t.join();
  }

  const Call slice_call{slice, g, call.device, call.context, call.stream, call.path};
  const std::unique_ptr<TuneBackend> backend = hooks.backend ? hooks.backend(slice_call, candidates[0])
                                                             : std::make_unique<GpuBackend>(slice_call, candidates[0]);
  if (!backend) throw Error(Status::Internal, "gnsilu: the tuning backend factory made no backend");
  return entry_of(key, select_config(candidates, *backend, TuneBudget{}), cache::TunedShape{shape, groups, call.path});
}

bool valid(const LaunchConfig& c) {
  try {
    check_config(c);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Whether two entries are one measurement (the same entry read twice).
bool same_measurement(const cache::TuningEntry& a, const cache::TuningEntry& b) {
  return a.created_at == b.created_at && a.winner == b.winner && a.default_us == b.default_us &&
         a.best_us == b.best_us && a.noise_us == b.noise_us && a.library_version == b.library_version;
}

// Who holds `lease` in the user file now, for waiting lines and messages ("pid 1234 on host, since 12 s").
std::string lease_holder_text(cache::Store& user, const std::string& lease) {
  const auto held = user.lease(lease);
  return held ? cache::describe_owner(held->owner, cache::unix_now()) : std::string("an unknown process");
}

}  // namespace

const TuningHooks& gpu_hooks() {
  static const TuningHooks hooks;
  return hooks;
}

std::optional<cache::TuningEntry> usable_entry(cache::LayeredCache& store, const cache::TuningKey& key,
                                               const cache::TuningEntry* other_than) {
  auto e = store.find_tuning(key);
  if (!e || !valid(e->winner) || (other_than != nullptr && same_measurement(*e, *other_than))) return std::nullopt;
  counters().found_in_cache++;
  return e;
}

namespace {

// Tunes the request's key unless another live process holds its lease (find_or_tune says what happens then).
WarmResult tune_under_lease(const EntryRequest& request, cache::LayeredCache& store, const WaitOptions& wait,
                            const TuningHooks& hooks) {
  const cache::TuningKey& key = request.key;
  const bool retune = request.retune;
  const LeaseTimings& timings = hooks.timings;
  // Retuning, the entry there now is the one to replace: only another one is another process's work.
  const std::optional<cache::TuningEntry> replacing = retune ? store.find_tuning(key) : std::nullopt;
  auto theirs = [&] { return usable_entry(store, key, replacing ? &*replacing : nullptr); };
  const double lease_seconds = timings.lease_seconds.count();
  WarmResult r;
  r.key = key;
  cache::Store* user = store.user();
  const std::string owner = cache::LeaseHolder::self().text();
  const std::string lease = key.text();
  cache::Store::Claim claim = cache::Store::Claim::Unavailable;
  if (user != nullptr && user->writable()) claim = user->claim(lease, owner, lease_seconds);
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
  if (claim == cache::Store::Claim::HeldByOther) {
    counters().waited_for_other_process++;
    const auto deadline = started + std::chrono::duration<double>(std::max(0.0, wait.wait_seconds));
    const auto claim_every = std::chrono::duration_cast<std::chrono::steady_clock::duration>(timings.claim_every);
    auto next_claim = started;
    while (claim == cache::Store::Claim::HeldByOther) {
      if (auto e = theirs()) {
        r.outcome = WarmResult::Outcome::TunedElsewhere;
        r.entry = std::move(e);
        r.seconds = elapsed();
        return r;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      if (now >= next_claim) {
        next_claim = now + claim_every;
        claim = user->claim(lease, owner, lease_seconds);  // takes over a dead or silent holder
        if (claim != cache::Store::Claim::HeldByOther) break;
        if (wait.waiting) wait.waiting(lease_holder_text(*user, lease), elapsed());
      }
      std::this_thread::sleep_for(timings.poll_every);
    }
    if (claim == cache::Store::Claim::HeldByOther) {
      r.outcome = WarmResult::Outcome::HeldByOther;
      r.message = "another process holds the tuning lease (" + lease_holder_text(*user, lease) + ")";
      r.seconds = elapsed();
      return r;
    }
  }
  const bool held = claim == cache::Store::Claim::Acquired;
  if (held) {
    // Another process may have stored the entry and released the lease between this process's lookup and
    // its claim: look again before tuning, or the key is tuned twice.
    if (auto e = theirs()) {
      user->release(lease, owner);
      r.outcome = WarmResult::Outcome::TunedElsewhere;
      r.entry = std::move(e);
      r.seconds = elapsed();
      return r;
    }
  }
  std::optional<cache::LeaseHeartbeat> heartbeat;
  if (held) heartbeat.emplace(user->path(), lease, owner, timings.heartbeat_seconds.count(), lease_seconds);
  auto let_go = [&] {
    heartbeat.reset();
    if (held) user->release(lease, owner);
  };
  try {
    cache::TuningEntry entry = tune(request, hooks);
    r.seconds = elapsed();
    store.put_tuning(entry);
    let_go();
    counters().tuned++;
    logger().info("tuned {} on {} in {:.2f} s: {} at {:.1f} us (default {:.1f} us, noise {:.1f} us)", key.text(),
                  entry.tuned_shape, r.seconds, to_string(entry.winner), entry.best_us, entry.default_us,
                  entry.noise_us);
    r.outcome = WarmResult::Outcome::Tuned;
    r.entry = std::move(entry);
  } catch (const Error& e) {
    let_go();
    r.outcome = WarmResult::Outcome::Failed;
    r.message = e.what();
    r.seconds = elapsed();
  } catch (...) {
    let_go();  // not a tuning failure (out of memory, a bug): it propagates, but not with the lease held
    throw;
  }
  return r;
}

}  // namespace

WarmResult find_or_tune(const EntryRequest& request, cache::LayeredCache& store, const WaitOptions& wait,
                        const TuningHooks& hooks) {
  if (!request.retune) {
    if (auto e = usable_entry(store, request.key)) {
      WarmResult r;
      r.outcome = WarmResult::Outcome::Cached;
      r.key = request.key;
      r.entry = std::move(e);
      return r;
    }
  }
  if (!request.may_tune) {
    WarmResult r;
    r.outcome = WarmResult::Outcome::NotFound;
    r.key = request.key;
    return r;
  }
  return tune_under_lease(request, store, wait, hooks);
}

TuningSlice tuning_slice_of(const Geometry& geometry, DType x, DType y, std::size_t free_bytes) {
  const std::size_t budget = std::min(kMaxScratchBytes, free_bytes / 4);
  TuningSlice slice;
  if (!tuning_slice(geometry, dtype_size(x), dtype_size(y), budget, slice.shape, slice.groups)) {
    throw Error(Status::OutOfMemory, "gnsilu: one group needs more scratch memory than tuning may use (" +
                                         std::to_string(budget >> 20) + " MiB)");
  }
  return slice;
}

TuningSlice tuning_slice_of(const Geometry& geometry, DType x, DType y) {
  return tuning_slice_of(geometry, x, y, free_device_memory());
}

WarmResult warm_key(const Call& call, bool retune, const WaitOptions& wait) {
  return warm_key(call, retune, wait, gpu_hooks());
}

WarmResult warm_key(const Call& call, bool retune, const WaitOptions& wait, const TuningHooks& hooks) {
  return warm_key(call, tuning_key(call), std::nullopt, retune, wait, hooks);
}

WarmResult warm_key(const Call& call, const cache::TuningKey& key, const std::optional<TuningSlice>& slice,
                    bool retune, const WaitOptions& wait, const TuningHooks& hooks) {
  auto store = cache::process_cache();
  EntryRequest request{call, key};
  request.retune = retune;
  request.slice = slice;
  return find_or_tune(request, *store, wait, hooks);
}

}  // namespace gnsilu::detail
