// The CUDA driver (libcuda.so.1), loaded at run time so that the library, its tests and tools start on a
// machine without one and say so. `driver()` loads it once (thread-safe) and calls cuInit.
#pragma once

#include <cuda.h>

#include <memory>
#include <string>

namespace gnsilu::detail {

// X(member, exported symbol): the member's type is that of the toolkit's declaration.
#define GNSILU_DRIVER_FUNCTIONS(X)                                                \
  X(cuInit, "cuInit")                                                             \
  X(cuDriverGetVersion, "cuDriverGetVersion")                                     \
  X(cuGetErrorName, "cuGetErrorName")                                             \
  X(cuGetErrorString, "cuGetErrorString")                                         \
  X(cuDeviceGet, "cuDeviceGet")                                                   \
  X(cuDeviceGetCount, "cuDeviceGetCount")                                         \
  X(cuDeviceGetName, "cuDeviceGetName")                                           \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute")                                 \
  X(cuDeviceGetUuid_v2, "cuDeviceGetUuid_v2")                                     \
  X(cuDeviceTotalMem_v2, "cuDeviceTotalMem_v2")                                   \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")                         \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2")                 \
  X(cuCtxGetCurrent, "cuCtxGetCurrent")                                           \
  X(cuCtxSetCurrent, "cuCtxSetCurrent")                                           \
  X(cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2")                                   \
  X(cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2")                                     \
  X(cuCtxGetDevice, "cuCtxGetDevice")                                             \
  X(cuCtxGetId, "cuCtxGetId")                                                     \
  X(cuCtxSynchronize, "cuCtxSynchronize")                                         \
  X(cuModuleLoadData, "cuModuleLoadData")                                         \
  X(cuModuleUnload, "cuModuleUnload")                                             \
  X(cuModuleGetFunction, "cuModuleGetFunction")                                   \
  X(cuFuncSetAttribute, "cuFuncSetAttribute")                                     \
  X(cuLaunchKernel, "cuLaunchKernel")                                             \
  X(cuLaunchKernelEx, "cuLaunchKernelEx")                                         \
  X(cuMemAlloc_v2, "cuMemAlloc_v2")                                               \
  X(cuMemFree_v2, "cuMemFree_v2")                                                 \
  X(cuMemcpyHtoD_v2, "cuMemcpyHtoD_v2")                                           \
  X(cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2")                                           \
  X(cuMemsetD8_v2, "cuMemsetD8_v2")                                               \
  X(cuMemGetInfo_v2, "cuMemGetInfo_v2")                                           \
  X(cuPointerGetAttributes, "cuPointerGetAttributes")                             \
  X(cuStreamCreate, "cuStreamCreate")                                             \
  X(cuStreamDestroy_v2, "cuStreamDestroy_v2")                                     \
  X(cuStreamSynchronize, "cuStreamSynchronize")                                   \
  X(cuStreamWaitEvent, "cuStreamWaitEvent")                                       \
  X(cuMemsetD8Async, "cuMemsetD8Async")                                           \
  X(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync_v2")                                 \
  X(cuStreamIsCapturing, "cuStreamIsCapturing")                                   \
  X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode")       \
  X(cuEventCreate, "cuEventCreate")                                               \
  X(cuEventDestroy_v2, "cuEventDestroy_v2")                                       \
  X(cuEventRecord, "cuEventRecord")                                               \
  X(cuEventSynchronize, "cuEventSynchronize")                                     \
  X(cuEventElapsedTime, "cuEventElapsedTime")

struct Driver {
// NOLINTNEXTLINE(bugprone-macro-parentheses): `member` names a declaration, which parentheses would break
#define GNSILU_DRIVER_MEMBER(member, symbol) decltype(&::member) member = nullptr;
  GNSILU_DRIVER_FUNCTIONS(GNSILU_DRIVER_MEMBER)
#undef GNSILU_DRIVER_MEMBER
  int version = 0;  // cuDriverGetVersion, e.g. 13000
};

// The loaded driver; throws Error(NoDriver) with the reason when it cannot be loaded or initialised.
// The library to open is libcuda.so.1, or the path in GNSILU_LIBCUDA.
const Driver& driver();

// Whether driver() would succeed, with the reason when not; never throws.
bool driver_available(std::string* why = nullptr);

// "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)" style text for a result.
std::string describe(CUresult result);

// For destructors and other paths that cannot throw: a driver call's failure is logged, never thrown or dropped
// silently (a debug line where the driver is already shutting down at process exit, a warning otherwise).
void log_dropped(CUresult result, const char* what) noexcept;

// Owned streams and events: destroyed with their owner (the driver must be loaded to make one).
struct StreamDestroy {
  void operator()(CUstream stream) const noexcept;
};
struct EventDestroy {
  void operator()(CUevent event) const noexcept;
};
using UniqueStream = std::unique_ptr<CUstream_st, StreamDestroy>;
using UniqueEvent = std::unique_ptr<CUevent_st, EventDestroy>;
// Throw CudaError naming cuStreamCreate / cuEventCreate when the driver refuses.
UniqueStream make_stream(unsigned flags = CU_STREAM_NON_BLOCKING);
UniqueEvent make_event(unsigned flags = CU_EVENT_DEFAULT);

}  // namespace gnsilu::detail
