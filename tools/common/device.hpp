// The tools' view of the GPU: whether one is there, and the primary context of one device held for a scope.
#pragma once

#include <cuda.h>

#include <string>

#include "base/device.hpp"

namespace gnsilu::tools {

// Whether a usable driver and device are present (detail::driver_available, then check_device); when not, `why`
// says why. Never throws.
bool gpu_present(std::string& why);

// The primary context of device `ordinal`, retained and made current on the calling thread. On destruction the
// device's work is waited for, gnsilu's internal workspaces are freed and the context is released. Declare it
// before the device memory, streams and events made in it, so that they go first.
class PrimaryContext {
 public:
  explicit PrimaryContext(int ordinal = 0);  // throws gnsilu::Error
  ~PrimaryContext();
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  CUdevice device() const { return device_; }
  CUcontext context() const { return context_; }
  const detail::DeviceInfo& info() const { return *info_; }

 private:
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  const detail::DeviceInfo* info_ = nullptr;
};

}  // namespace gnsilu::tools
