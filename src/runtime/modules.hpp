// Compiled kernels in memory: NVRTC output per (architecture, variant), loaded as a CUmodule per (context,
// variant). A variant compiles once per process and architecture; a new shape compiles nothing.
#pragma once

#include <cuda.h>

#include <array>

#include "base/device.hpp"
#include "runtime/kernels.hpp"

namespace gnsilu::detail {

// The most dynamic shared memory a chunk_stats launch may ask for (plan.hpp: stats_shared_bytes).
constexpr int kMaxStatsSharedBytes = 64 * 1024;

// A CUmodule loaded from an image into `context` (current on the caller), unloaded in that context when destroyed
// (a failure then is logged: log_dropped).
class ModuleHandle {
 public:
  ModuleHandle(CUcontext context, const void* image);  // throws CudaError naming cuModuleLoadData
  ~ModuleHandle();
  ModuleHandle(const ModuleHandle&) = delete;
  ModuleHandle& operator=(const ModuleHandle&) = delete;
  CUmodule get() const { return module_; }

 private:
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
};

// A loaded module and its kernels (KernelIndex).
class LoadedModule {
 public:
  LoadedModule(CUcontext context, const CompiledProgram& program, std::size_t first_name);
  CUfunction kernel(KernelIndex k) const { return functions_[k]; }

 private:
  ModuleHandle module_;
  std::array<CUfunction, kKernelCount> functions_{};
};

// The kernels of `variant` in `context` (compiled for `device` and loaded on first use). Thread-safe.
const LoadedModule& kernels_for(CUcontext context, const DeviceInfo& device, const Variant& variant);

// The compiled program of `variant` for `arch` (compiled on first use, kept for the process).
const CompiledProgram& compiled_for(int arch, const Variant& variant);

}  // namespace gnsilu::detail
