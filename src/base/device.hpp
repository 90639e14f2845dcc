// Devices and contexts: what a device is (cached per device), the context a call runs in, and checks that
// a pointer is device memory of that device covering the bytes a tensor needs.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace gnsilu::detail {

struct DeviceInfo {
  CUdevice device = 0;
  int ordinal = 0;
  std::string name;
  std::string uuid;            // 32 hex digits
  int major = 0;
  int minor = 0;
  int sms = 0;                 // multiprocessors
  int l2_bytes = 0;
  std::size_t total_memory = 0;
  int arch() const { return major * 10 + minor; }
};

// Cached per device; throws on driver failure.
const DeviceInfo& device_info(CUdevice device);

// The context a call runs in: the calling thread's current context; with none current, the primary context
// of the device `hint` (a device pointer) lives on, made current for the scope and restored afterwards.
class ContextScope {
 public:
  explicit ContextScope(const void* hint);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  CUcontext context() const { return context_; }
  CUdevice device() const { return device_; }

 private:
  CUcontext context_ = nullptr;
  CUdevice device_ = 0;
  bool pushed_ = false;
};

// A context's process-unique ID (cuCtxGetId): unlike the CUcontext handle, never reused by a context created
// after another was destroyed, so it keys what the library keeps per context (modules, workspaces).
uint64_t context_id(CUcontext context);

struct Range {
  const void* begin = nullptr;
  std::size_t bytes = 0;
  bool overlaps(const Range& other) const;
};

// Throws Error(InvalidArgument) naming `name` unless [pointer, pointer + bytes) is device (or managed) memory
// of `device` inside one allocation.
void check_device_range(const char* name, const void* pointer, std::size_t bytes, const DeviceInfo& device);

}  // namespace gnsilu::detail
