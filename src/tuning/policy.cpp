#include "tuning/policy.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>

#include "base/log.hpp"
#include "tuning/lease_timings.hpp"

namespace gnsilu::detail {
namespace {

constexpr std::size_t kDefaultMinTuneBytes = std::size_t{8} << 20;

std::size_t env_unsigned(const char* name, std::size_t fallback) {
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

}  // namespace

TunePolicy process_tune_policy() { return static_cast<TunePolicy>(policy_slot().load()); }
void set_process_tune_policy(TunePolicy policy) { policy_slot().store(static_cast<int>(policy)); }

std::size_t min_tune_bytes() {
  static const std::size_t bytes = env_unsigned("GNSILU_TUNE_MIN_BYTES", kDefaultMinTuneBytes);
  return bytes;
}

double first_use_wait_seconds() {
  const auto fallback_ms = static_cast<std::size_t>(
      std::chrono::duration<double, std::milli>(kLeaseTimings.first_use_wait).count());
  return static_cast<double>(env_unsigned("GNSILU_TUNE_WAIT_MS", fallback_ms)) / 1000.0;
}

}  // namespace gnsilu::detail
