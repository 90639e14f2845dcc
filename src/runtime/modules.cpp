#include "runtime/modules.hpp"

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "base/driver.hpp"
#include "base/errors.hpp"
#include "cache/cache.hpp"
#include "base/counters.hpp"
#include "base/log.hpp"

namespace gnsilu::detail {

LoadedModule::LoadedModule(CUcontext context, const CompiledProgram& program, std::size_t first_name)
    : context_(context) {
  const Driver& d = driver();
  GNSILU_CU(d.cuModuleLoadData(&module_, program.image.data()));
  try {
    for (int k = 0; k < kKernelCount; ++k) {
      GNSILU_CU(d.cuModuleGetFunction(&functions_[static_cast<std::size_t>(k)], module_,
                                      program.lowered_names[first_name + static_cast<std::size_t>(k)].c_str()));
    }
    // chunk_stats may take more than the 48 KiB of dynamic shared memory a launch gets by default (channels-last
    // tiles of 64-byte slices).
    GNSILU_CU(d.cuFuncSetAttribute(functions_[kStats], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   kMaxStatsSharedBytes));
  } catch (...) {
    d.cuModuleUnload(module_);
    throw;
  }
}

LoadedModule::~LoadedModule() {
  const Driver& d = driver();
  if (d.cuCtxPushCurrent_v2(context_) == CUDA_SUCCESS) {
    d.cuModuleUnload(module_);
    CUcontext popped = nullptr;
    d.cuCtxPopCurrent_v2(&popped);
  }
}

namespace {

// The compiled code does not depend on programs_per_sm (a grid size): key without it.
using CodeKey = std::tuple<int, int, int, int, int, int, int>;  // x, y, elems_per_load, warps, stages, layout, activation
CodeKey code_key(const Variant& v) {
  return {static_cast<int>(v.x_dtype), static_cast<int>(v.y_dtype), v.config.elems_per_load, v.config.warps,
          v.config.stages, static_cast<int>(v.layout), static_cast<int>(v.activation)};
}

using ProgramFuture = std::shared_future<std::shared_ptr<const CompiledProgram>>;

struct Registry {
  std::mutex mutex;
  // One entry per (arch, code): the first caller compiles (outside the lock), the others wait on its future.
  std::map<std::tuple<int, CodeKey>, ProgramFuture> programs;
  // Keyed by context ID: a destroyed context's handle may come back for a new context, its modules may not.
  std::map<std::tuple<uint64_t, CodeKey>, std::unique_ptr<LoadedModule>> modules;
};

// Never destroyed: modules outlive static destruction, where the driver may already be gone.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

// The compiled program of a variant: from the cache files when there, else from NVRTC (and then saved).
std::shared_ptr<const CompiledProgram> load_or_compile(int arch, const Variant& variant) {
  const cache::KernelKey key{arch, code_version(), code_name(variant)};
  auto store = cache::process_cache();
  if (auto image = store->find_kernel(key); image && image->lowered_names.size() == kKernelCount) {
    auto program = std::make_shared<CompiledProgram>();
    program->arch = arch;
    program->is_cubin = image->is_cubin;
    program->image = std::move(image->image);
    program->lowered_names = std::move(image->lowered_names);
    program->options = std::move(image->options);
    counters().kernels_from_cache++;
    return program;
  }
  const auto started = std::chrono::steady_clock::now();
  auto program = std::make_shared<const CompiledProgram>(compile_variants(arch, std::span<const Variant>(&variant, 1)));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  logger().info("compiled {} for sm_{} in {:.0f} ms", describe(variant), arch, ms);
  counters().compiled++;
  cache::KernelImage image;
  image.is_cubin = program->is_cubin;
  image.image = program->image;
  image.lowered_names = program->lowered_names;
  image.options = program->options;
  image.nvrtc_version = nvrtc_version();
  store->put_kernel(key, image);
  return program;
}

}  // namespace

const CompiledProgram& compiled_for(int arch, const Variant& variant) {
  Registry& r = registry();
  const auto key = std::make_tuple(arch, code_key(variant));
  std::promise<std::shared_ptr<const CompiledProgram>> promise;
  ProgramFuture future;
  bool mine = false;
  {
    std::lock_guard lock(r.mutex);
    auto it = r.programs.find(key);
    if (it == r.programs.end()) {
      future = promise.get_future().share();
      r.programs.emplace(key, future);
      mine = true;
    } else {
      future = it->second;
    }
  }
  if (mine) {
    try {
      promise.set_value(load_or_compile(arch, variant));
    } catch (...) {
      promise.set_exception(std::current_exception());
      std::lock_guard lock(r.mutex);
      r.programs.erase(key);  // a later call tries again
      throw;
    }
  }
  return *future.get();
}

const LoadedModule& kernels_for(CUcontext context, const DeviceInfo& device, const Variant& variant) {
  Registry& r = registry();
  const auto key = std::make_tuple(context_id(context), code_key(variant));
  {
    std::lock_guard lock(r.mutex);
    auto it = r.modules.find(key);
    if (it != r.modules.end()) return *it->second;
  }
  const CompiledProgram& program = compiled_for(device.arch(), variant);
  std::lock_guard lock(r.mutex);
  auto& slot = r.modules[key];
  if (!slot) slot = std::make_unique<LoadedModule>(context, program, 0);
  return *slot;
}

}  // namespace gnsilu::detail
