// Device memory the library owns: a RAII buffer, and the internal workspaces used when the caller passes
// none. One workspace per (context, stream): calls on one stream are ordered by it, so they can share
// one. A call made while its stream is being captured into a graph gets a buffer of its own that lives
// until release_internal_workspaces(), since the graph may be replayed at any later time.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace gnsilu::detail {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(CUcontext context, std::size_t bytes);  // allocates in `context` (current on the caller)
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr get() const { return pointer_; }
  std::size_t size() const { return bytes_; }

 private:
  void reset() noexcept;
  CUcontext context_ = nullptr;
  CUdeviceptr pointer_ = 0;
  std::size_t bytes_ = 0;
};

// At least `bytes` of device memory for work on `stream` in `context` (current on the calling thread).
void* internal_workspace(CUcontext context, CUstream stream, std::size_t bytes, bool capturing);

// Frees every internal workspace (the caller promises no gnsilu work is in flight).
void release_internal_workspaces();

}  // namespace gnsilu::detail
