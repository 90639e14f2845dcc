#include "tuning/config_table.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <future>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "cache/cache.hpp"
#include "cache/lease.hpp"
#include "base/driver.hpp"
#include "base/errors.hpp"
#include "runtime/kernels.hpp"
#include "base/log.hpp"
#include "runtime/modules.hpp"
#include "tuning/tuner.hpp"

namespace gnsilu::detail {
namespace {

constexpr std::size_t kMaxScratchBytes = std::size_t{256} << 20;

std::size_t env_bytes(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(v, &end, 10);
  return end != v ? static_cast<std::size_t>(parsed) : fallback;
}

TunePolicy policy_from_environment() {
  const char* v = std::getenv("GNSILU_TUNE");
  if (v == nullptr || *v == '\0') return TunePolicy::OnFirstUse;
  const std::string s(v);
  if (s == "on" || s == "auto" || s == "1") return TunePolicy::OnFirstUse;
  if (s == "cached") return TunePolicy::CachedOnly;
  if (s == "off" || s == "never" || s == "0") return TunePolicy::Never;
  logger().warn("GNSILU_TUNE={} is not one of on, cached, off; tuning on first use", s);
  return TunePolicy::OnFirstUse;
}

std::atomic<int>& policy_slot() {
  static std::atomic<int> slot{static_cast<int>(policy_from_environment())};
  return slot;
}

// The in-memory key: plain values, hashed without allocating.
struct FastKey {
  CUdevice device;
  int64_t channels_per_group;
  int8_t x, y;
  int8_t size_class;  // 0: fits L2, 1: larger
  int8_t small;       // below the tuning threshold
  int8_t path;
  int8_t layout;
  int8_t activation;
  friend bool operator==(const FastKey&, const FastKey&) = default;
};

struct FastKeyHash {
  std::size_t operator()(const FastKey& k) const noexcept {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) {
      h ^= v;
      h *= 1099511628211ull;
    };
    mix(static_cast<uint64_t>(k.device));
    mix(static_cast<uint64_t>(k.channels_per_group));
    mix(static_cast<uint64_t>(k.x) | static_cast<uint64_t>(k.y) << 8 | static_cast<uint64_t>(k.size_class) << 16 |
        static_cast<uint64_t>(k.small) << 24 | static_cast<uint64_t>(k.path) << 32 |
        static_cast<uint64_t>(k.layout) << 40 | static_cast<uint64_t>(k.activation) << 48);
    return static_cast<std::size_t>(h);
  }
};

struct Table {
  std::shared_mutex mutex;
  std::unordered_map<FastKey, LaunchConfig, FastKeyHash> configs;
  std::unordered_map<FastKey, std::shared_future<LaunchConfig>, FastKeyHash> in_flight;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: calls may come during static destruction
  return *t;
}

std::size_t call_bytes(const Call& c) {
  return static_cast<std::size_t>(c.geometry.numel) * (dtype_size(c.problem.x_dtype) + dtype_size(c.problem.y_dtype));
}

std::string shape_text(std::span<const int64_t> shape, int64_t groups) {
  std::string out;
  for (auto d : shape) {
    if (!out.empty()) out += 'x';
    out += std::to_string(d);
  }
  return out + " G=" + std::to_string(groups);
}

// Times the candidates on (a slice of) this call's x; returns the cache entry to store.
cache::TuningEntry tune(const Call& call, const cache::TuningKey& key) {
  std::vector<int64_t> shape;
  int64_t groups = 0;
  tuning_slice_of(call.geometry, call.problem.x_dtype, call.problem.y_dtype, shape, groups);
  Problem slice = call.problem;
  slice.shape = shape;
  slice.num_groups = groups;
  const Geometry g = make_geometry(shape, groups, call.geometry.layout);

  // The path's default first: the tuner keeps it unless a candidate is clearly faster.
  std::vector<LaunchConfig> candidates{default_config(call.path)};
  for (const auto& c : candidate_configs())
    if (!(c == candidates[0])) candidates.push_back(c);
  // Compile every candidate first, in parallel (a later process finds them in the cache file).
  std::vector<std::thread> compilers;
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

  GpuBackend backend(Call{slice, g, call.device, call.context, call.stream, call.path}, candidates[0]);
  const TuneOutcome outcome = select_config(candidates, backend, TuneBudget{});
  cache::TuningEntry e;
  e.key = key;
  e.winner = outcome.winner;
  e.default_us = outcome.default_us;
  e.best_us = outcome.best_us;
  e.noise_us = outcome.noise_us;
  e.candidates = outcome.candidates;
  e.tuned_shape = shape_text(shape, groups);
  e.library_version = version();
  e.created_at = static_cast<int64_t>(std::time(nullptr));
  return e;
}

bool valid(const LaunchConfig& c) {
  try {
    check_config(c);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The cache files' entry for `key` when its winner is a valid configuration (counted as found).
std::optional<cache::TuningEntry> usable_entry(cache::LayeredCache& store, const cache::TuningKey& key) {
  auto e = store.find_tuning(key);
  if (!e || !valid(e->winner)) return std::nullopt;
  counters().found_in_cache++;
  return e;
}

// Who holds `lease` in the user file now, for waiting lines and messages ("pid 1234 on host, since 12 s").
std::string lease_holder_text(cache::Store& user, const std::string& lease) {
  const auto held = user.lease(lease);
  return held ? cache::describe_owner(held->owner, cache::unix_now()) : std::string("an unknown process");
}

// Tunes `key` unless another live process holds its lease in the user file; then waits up to `wait.wait_seconds`
// for that process's entry, claiming again every half second (the lease is taken over when its holder has died
// or stopped renewing it). Stores what it tunes.
WarmResult tune_under_lease(const Call& call, const cache::TuningKey& key, cache::LayeredCache& store,
                            const WaitOptions& wait) {
  WarmResult r;
  r.key = key;
  cache::Store* user = store.user();
  const std::string owner = cache::LeaseHolder::self().text();
  const std::string lease = key.text();
  cache::Store::Claim claim = cache::Store::Claim::Unavailable;
  if (user != nullptr && user->writable()) claim = user->claim(lease, owner, cache::kLeaseSeconds);
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
  if (claim == cache::Store::Claim::HeldByOther) {
    counters().waited_for_other_process++;
    const auto deadline = started + std::chrono::duration<double>(std::max(0.0, wait.wait_seconds));
    auto next_claim = started;
    while (claim == cache::Store::Claim::HeldByOther) {
      if (auto e = usable_entry(store, key)) {
        r.outcome = WarmResult::Outcome::TunedElsewhere;
        r.entry = std::move(e);
        r.seconds = elapsed();
        return r;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      if (now >= next_claim) {
        next_claim = now + std::chrono::milliseconds(500);
        claim = user->claim(lease, owner, cache::kLeaseSeconds);  // takes over a dead or silent holder
        if (claim != cache::Store::Claim::HeldByOther) break;
        if (wait.waiting) wait.waiting(lease_holder_text(*user, lease), elapsed());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (claim == cache::Store::Claim::HeldByOther) {
      r.outcome = WarmResult::Outcome::HeldByOther;
      r.message = "another process holds the tuning lease (" + lease_holder_text(*user, lease) + ")";
      r.seconds = elapsed();
      return r;
    }
  }
  if (claim == cache::Store::Claim::Acquired) {
    // Another process may have stored the entry and released the lease between this process's lookup and
    // its claim: look again before tuning, or the key is tuned twice.
    if (auto e = usable_entry(store, key)) {
      user->release(lease, owner);
      r.outcome = WarmResult::Outcome::TunedElsewhere;
      r.entry = std::move(e);
      r.seconds = elapsed();
      return r;
    }
  }
  std::optional<cache::LeaseHeartbeat> heartbeat;
  if (claim == cache::Store::Claim::Acquired) heartbeat.emplace(user->path(), lease, owner);
  try {
    cache::TuningEntry entry = tune(call, key);
    r.seconds = elapsed();
    store.put_tuning(entry);
    heartbeat.reset();
    if (claim == cache::Store::Claim::Acquired) user->release(lease, owner);
    counters().tuned++;
    logger().info("tuned {} on {} in {:.2f} s: {} at {:.1f} us (default {:.1f} us, noise {:.1f} us)", key.text(),
                  entry.tuned_shape, r.seconds, to_string(entry.winner), entry.best_us, entry.default_us,
                  entry.noise_us);
    r.outcome = WarmResult::Outcome::Tuned;
    r.entry = std::move(entry);
  } catch (const Error& e) {
    heartbeat.reset();
    if (claim == cache::Store::Claim::Acquired) user->release(lease, owner);
    r.outcome = WarmResult::Outcome::Failed;
    r.message = e.what();
    r.seconds = elapsed();
  }
  return r;
}

// The slow path, once per key per process. `remember` says whether the answer may stay in memory.
LaunchConfig resolve(const Call& call, TunePolicy policy, bool small, bool& remember) {
  const LaunchConfig fallback = default_config(call.path);
  if (policy == TunePolicy::Never) {
    remember = false;
    return fallback;
  }
  const cache::TuningKey key = tuning_key(call);
  auto store = cache::process_cache();
  if (auto e = usable_entry(*store, key)) return e->winner;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  driver().cuStreamIsCapturing(call.stream, &capture);
  if (policy == TunePolicy::CachedOnly || capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    remember = false;  // a later call under another policy, or outside the capture, may tune
    counters().defaulted++;
    return fallback;
  }
  if (small) {
    counters().defaulted++;
    return fallback;
  }

  WaitOptions wait;
  wait.wait_seconds = static_cast<double>(env_bytes("GNSILU_TUNE_WAIT_MS", 3000)) / 1000.0;
  const WarmResult r = tune_under_lease(call, key, *store, wait);
  if (r.entry) return r.entry->winner;
  if (r.outcome == WarmResult::Outcome::HeldByOther) {
    logger().info("another process is tuning {}; this process uses the default configuration", key.text());
  } else {
    logger().warn("tuning {} failed ({}); using the default configuration", key.text(), r.message);
  }
  counters().defaulted++;
  return fallback;
}

}  // namespace

TunePolicy process_tune_policy() { return static_cast<TunePolicy>(policy_slot().load()); }
void set_process_tune_policy(TunePolicy policy) { policy_slot().store(static_cast<int>(policy)); }

cache::DeviceIdentity identity_of(const DeviceInfo& device) {
  cache::DeviceIdentity id;
  id.name = device.name;
  id.arch = device.arch();
  id.sms = device.sms;
  id.memory_mib = static_cast<int64_t>(device.total_memory >> 20);
  id.l2_kib = device.l2_bytes >> 10;
  return id;
}

cache::TuningKey tuning_key(const DeviceInfo& device, const Geometry& g, DType x, DType y, Path path,
                            Activation activation) {
  cache::TuningKey k;
  k.device = identity_of(device);
  k.code_version = code_version();
  k.channels_per_group = g.channels_per_group;
  k.x_dtype = x;
  k.y_dtype = y;
  k.layout = g.layout;
  k.activation = activation;
  k.size_class = cache::size_class_of(static_cast<std::size_t>(g.numel) * (dtype_size(x) + dtype_size(y)),
                                      static_cast<std::size_t>(device.l2_bytes), path_name(path));
  return k;
}

cache::TuningKey tuning_key(const Call& call) {
  return tuning_key(call.device, call.geometry, call.problem.x_dtype, call.problem.y_dtype, call.path,
                    call.problem.activation);
}

LaunchConfig config_for(const Call& call, TunePolicy policy) {
  const std::size_t bytes = call_bytes(call);
  // Read once: this is the hot path of every call.
  static const std::size_t min_tune_bytes = env_bytes("GNSILU_TUNE_MIN_BYTES", std::size_t{8} << 20);
  const bool small = bytes < min_tune_bytes;
  const FastKey key{call.device.device,
                    call.geometry.channels_per_group,
                    static_cast<int8_t>(call.problem.x_dtype),
                    static_cast<int8_t>(call.problem.y_dtype),
                    static_cast<int8_t>(bytes <= static_cast<std::size_t>(call.device.l2_bytes) ? 0 : 1),
                    static_cast<int8_t>(small),
                    static_cast<int8_t>(call.path),
                    static_cast<int8_t>(call.geometry.layout),
                    static_cast<int8_t>(call.problem.activation)};
  Table& t = table();
  {
    std::shared_lock lock(t.mutex);
    auto it = t.configs.find(key);
    if (it != t.configs.end()) return it->second;
  }
  std::promise<LaunchConfig> promise;
  std::shared_future<LaunchConfig> future;
  {
    std::unique_lock lock(t.mutex);
    if (auto it = t.configs.find(key); it != t.configs.end()) return it->second;
    if (auto it = t.in_flight.find(key); it != t.in_flight.end()) {
      future = it->second;
    } else {
      future = promise.get_future().share();
      t.in_flight.emplace(key, future);
      lock.unlock();
      bool remember = true;
      LaunchConfig result = default_config(call.path);
      try {
        result = resolve(call, policy, small, remember);
      } catch (const std::exception& e) {
        logger().warn("choosing a launch configuration failed ({}); using the default", e.what());
        remember = false;
      }
      lock.lock();
      if (remember) t.configs[key] = result;
      t.in_flight.erase(key);
      promise.set_value(result);
      return result;
    }
  }
  return future.get();  // another thread of this process is resolving the same key
}

void tuning_slice_of(const Geometry& geometry, DType x, DType y, std::vector<int64_t>& shape, int64_t& groups) {
  const Driver& d = driver();
  std::size_t free_bytes = 0, total = 0;
  GNSILU_CU(d.cuMemGetInfo_v2(&free_bytes, &total));
  const std::size_t budget = std::min(kMaxScratchBytes, free_bytes / 4);
  if (!tuning_slice(geometry, dtype_size(x), dtype_size(y), budget, shape, groups)) {
    throw Error(Status::OutOfMemory, "gnsilu: one group needs more scratch memory than tuning may use (" +
                                         std::to_string(budget >> 20) + " MiB)");
  }
}

WarmResult warm_key(const Call& call, bool retune, const WaitOptions& wait) {
  const cache::TuningKey key = tuning_key(call);
  auto store = cache::process_cache();
  if (!retune) {
    if (auto e = usable_entry(*store, key)) {
      WarmResult r;
      r.outcome = WarmResult::Outcome::Cached;
      r.key = key;
      r.entry = std::move(e);
      return r;
    }
  }
  return tune_under_lease(call, key, *store, wait);
}

void clear_config_table() {
  Table& t = table();
  std::unique_lock lock(t.mutex);
  t.configs.clear();
}

}  // namespace gnsilu::detail
