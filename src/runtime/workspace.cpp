#include "runtime/workspace.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "base/device.hpp"
#include "base/driver.hpp"
#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/process_lifetime.hpp"

namespace gnsilu::detail {

DeviceBuffer::DeviceBuffer(CUcontext context, std::size_t bytes) : context_(context), bytes_(bytes) {
  const Driver& d = driver();
  // Allocation is not a stream operation; relaxed mode lets it happen while some stream captures a graph.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  GNSILU_CHECK(d.cuThreadExchangeStreamCaptureMode(&mode));
  const CUresult result = d.cuMemAlloc_v2(&pointer_, bytes == 0 ? 1 : bytes);
  d.cuThreadExchangeStreamCaptureMode(&mode);
  if (result != CUDA_SUCCESS) {
    pointer_ = 0;
    throw_cuda(result, "cuMemAlloc (internal workspace)", __FILE__, __LINE__);
  }
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : context_(std::exchange(other.context_, nullptr)),
      pointer_(std::exchange(other.pointer_, 0)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    context_ = std::exchange(other.context_, nullptr);
    pointer_ = std::exchange(other.pointer_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (pointer_ == 0) return;
  const Driver& d = driver();
  const CUresult pushed = d.cuCtxPushCurrent_v2(context_);
  log_dropped(pushed, "cuCtxPushCurrent (freeing a workspace)");
  if (pushed == CUDA_SUCCESS) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    d.cuThreadExchangeStreamCaptureMode(&mode);
    log_dropped(d.cuMemFree_v2(pointer_), "cuMemFree (a workspace)");
    d.cuThreadExchangeStreamCaptureMode(&mode);
    CUcontext popped = nullptr;
    log_dropped(d.cuCtxPopCurrent_v2(&popped), "cuCtxPopCurrent (freeing a workspace)");
  }
  pointer_ = 0;
  bytes_ = 0;
}

namespace {

struct Workspaces {
  std::mutex mutex;
  std::map<std::pair<uint64_t, CUstream>, DeviceBuffer> per_stream;  // by context ID (device.hpp)
  std::vector<DeviceBuffer> captured;  // owned by graphs that may still be replayed
};

// Holds device memory: must outlive static destruction, where the driver may already be gone (immortal).
Workspaces& workspaces() { return immortal<Workspaces>(); }

}  // namespace

void* internal_workspace(CUcontext context, CUstream stream, std::size_t bytes, bool capturing) {
  Workspaces& w = workspaces();
  std::lock_guard lock(w.mutex);
  if (capturing) {
    w.captured.emplace_back(context, bytes);
    logger().debug("allocated a {}-byte workspace for a call under graph capture", bytes);
    return reinterpret_cast<void*>(w.captured.back().get());
  }
  DeviceBuffer& buffer = w.per_stream[{context_id(context), stream}];
  if (buffer.size() < bytes) {
    const std::size_t previous = buffer.size();
    if (buffer.get() != 0) GNSILU_CHECK(driver().cuStreamSynchronize(stream));  // earlier work may still use it
    buffer = DeviceBuffer();
    // Grow geometrically so that a sequence of growing shapes reallocates a few times only.
    buffer = DeviceBuffer(context, std::max(bytes, previous * 2));
    logger().debug("internal workspace for stream {} is now {} bytes", static_cast<void*>(stream), buffer.size());
  }
  return reinterpret_cast<void*>(buffer.get());
}

void release_internal_workspaces() {
  if (!driver_available()) return;
  Workspaces& w = workspaces();
  std::lock_guard lock(w.mutex);
  w.per_stream.clear();
  w.captured.clear();
}

}  // namespace gnsilu::detail
