#include "modules.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "driver.hpp"
#include "errors.hpp"
#include "log.hpp"

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
using CodeKey = std::tuple<int, int, int, int, int>;  // x, y, elems_per_load, warps, stages
CodeKey code_key(const Variant& v) {
  return {static_cast<int>(v.x_dtype), static_cast<int>(v.y_dtype), v.config.elems_per_load, v.config.warps,
          v.config.stages};
}

struct Registry {
  std::mutex mutex;
  std::map<std::tuple<int, CodeKey>, std::unique_ptr<CompiledProgram>> programs;
  std::map<std::tuple<CUcontext, CodeKey>, std::unique_ptr<LoadedModule>> modules;
};

// Never destroyed: modules outlive static destruction, where the driver may already be gone.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

const CompiledProgram& compiled_locked(Registry& r, int arch, const Variant& variant) {
  auto& slot = r.programs[{arch, code_key(variant)}];
  if (!slot) {
    const auto started = std::chrono::steady_clock::now();
    slot = std::make_unique<CompiledProgram>(compile_variants(arch, std::span<const Variant>(&variant, 1)));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    logger().info("compiled {} for sm_{} in {:.0f} ms", describe(variant), arch, ms);
  }
  return *slot;
}

}  // namespace

const CompiledProgram& compiled_for(int arch, const Variant& variant) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return compiled_locked(r, arch, variant);
}

const LoadedModule& kernels_for(CUcontext context, const DeviceInfo& device, const Variant& variant) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto& slot = r.modules[{context, code_key(variant)}];
  if (!slot) slot = std::make_unique<LoadedModule>(context, compiled_locked(r, device.arch(), variant), 0);
  return *slot;
}

}  // namespace gnsilu::detail
