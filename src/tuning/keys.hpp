// What a tuned configuration is stored under: the device's identity, the kernels' code version, channels per
// group, dtypes, layout, activation, and the size class (whether the activation fits the device's L2, by path).
#pragma once

#include <cstddef>

#include "base/device.hpp"
#include "cache/entries.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/call.hpp"
#include "runtime/plan.hpp"

namespace gnsilu::detail {

// The tuning key of a call (device identity, code version, channels per group, dtypes, layout, activation, size
// class and path).
cache::TuningKey tuning_key(const DeviceInfo& device, const Geometry& geometry, DType x, DType y, Path path,
                            Activation activation = Activation::SiLU);
cache::TuningKey tuning_key(const Call& call);
cache::DeviceIdentity identity_of(const DeviceInfo& device);

// The bytes of x and y a call reads and writes: what the size class and GNSILU_TUNE_MIN_BYTES compare.
std::size_t activation_bytes(const Call& call);
// Whether `bytes` of x and y fit the device's L2 (the size class's first split; the hot-path table's key).
bool fits_l2(std::size_t bytes, const DeviceInfo& device);

}  // namespace gnsilu::detail
