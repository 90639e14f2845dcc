#include "tuning/config_table.hpp"

#include "base/hash.hpp"
#include "base/driver.hpp"
#include "base/errors.hpp"
#include "base/launch_config.hpp"
#include "base/log.hpp"
#include "base/process_lifetime.hpp"
#include "cache/cache.hpp"

namespace gnsilu::detail {
namespace {

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
    Fnv1a h;
    h.add_word(static_cast<uint64_t>(k.device));
    h.add_word(static_cast<uint64_t>(k.channels_per_group));
    h.add_word(static_cast<uint64_t>(k.x) | static_cast<uint64_t>(k.y) << 8 | static_cast<uint64_t>(k.size_class) << 16 |
        static_cast<uint64_t>(k.small) << 24 | static_cast<uint64_t>(k.path) << 32 |
        static_cast<uint64_t>(k.layout) << 40 | static_cast<uint64_t>(k.activation) << 48);
    return static_cast<std::size_t>(h.value());
  }
};

// Resolved configurations by key; a miss is resolved once while other threads asking for the key wait.
using Table = ComputeOnce<FastKey, LaunchConfig, FastKeyHash>;
Table& table() { return immortal<Table>(); }

bool capturing(const Call& call, const TuningHooks& hooks) {
  if (hooks.capturing) return hooks.capturing(call);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  GNSILU_CHECK(driver().cuStreamIsCapturing(call.stream, &capture));
  return capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

// The slow path, once per key per process: the policy decides whether this call may tune, then tuning_run's one
// sequence finds or tunes the entry. `remember` says whether the answer may stay in memory.
LaunchConfig resolve(const Call& call, TunePolicy policy, bool small, bool& remember, const TuningHooks& hooks) {
  const LaunchConfig fallback = default_config(call.path);
  if (policy == TunePolicy::Never) {
    remember = false;
    return fallback;
  }
  // Not now, but perhaps for a later call under another policy, or outside the capture: not remembered.
  const bool not_now = policy == TunePolicy::CachedOnly || capturing(call, hooks);
  EntryRequest request{call, tuning_key(call)};
  request.may_tune = !not_now && !small;
  WaitOptions wait;
  wait.wait_seconds = first_use_wait_seconds();
  auto store = cache::process_cache();
  const WarmResult r = find_or_tune(request, *store, wait, hooks);
  if (r.entry) return r.entry->winner;
  using O = WarmResult::Outcome;
  if (r.outcome == O::NotFound) {
    remember = !not_now;
  } else if (r.outcome == O::HeldByOther) {
    logger().info("another process is tuning {}; this process uses the default configuration", r.key.text());
  } else {
    logger().warn("tuning {} failed ({}); using the default configuration", r.key.text(), r.message);
  }
  counters().defaulted++;
  return fallback;
}

// `hooks` null: the GPU's (looked up only on a miss).
LaunchConfig lookup(const Call& call, TunePolicy policy, const TuningHooks* hooks) {
  const std::size_t bytes = activation_bytes(call);
  const bool small = bytes < min_tune_bytes();  // read once: this is the hot path of every call
  const FastKey key{call.device.device,
                    call.geometry.channels_per_group,
                    static_cast<int8_t>(call.problem.x_dtype),
                    static_cast<int8_t>(call.problem.y_dtype),
                    static_cast<int8_t>(fits_l2(bytes, call.device) ? 0 : 1),
                    static_cast<int8_t>(small),
                    static_cast<int8_t>(call.path),
                    static_cast<int8_t>(call.geometry.layout),
                    static_cast<int8_t>(call.problem.activation)};
  Table& t = table();
  if (auto config = t.find(key)) return *config;
  return t.get(key, [&] {
    bool remember = true;
    LaunchConfig result = default_config(call.path);
    try {
      result = resolve(call, policy, small, remember, hooks != nullptr ? *hooks : gpu_hooks());
    } catch (const std::exception& e) {
      logger().warn("choosing a launch configuration failed ({}); using the default", e.what());
      remember = false;
    }
    return Table::Computed{result, remember};
  });
}

}  // namespace

LaunchConfig config_for(const Call& call, TunePolicy policy) { return lookup(call, policy, nullptr); }

LaunchConfig config_for(const Call& call, TunePolicy policy, const TuningHooks& hooks) {
  return lookup(call, policy, &hooks);
}

void clear_config_table() { table().clear(); }

}  // namespace gnsilu::detail
