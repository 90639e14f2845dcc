#include "runtime/modules.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "base/driver.hpp"
#include "base/errors.hpp"
#include "cache/cache.hpp"
#include "base/counters.hpp"
#include "base/hash.hpp"
#include "base/log.hpp"
#include "base/process_lifetime.hpp"

namespace gnsilu::detail {

ModuleHandle::ModuleHandle(CUcontext context, const void* image) : context_(context) {
  GNSILU_CHECK(driver().cuModuleLoadData(&module_, image));
}

ModuleHandle::~ModuleHandle() {
  const Driver& d = driver();
  const CUresult pushed = d.cuCtxPushCurrent_v2(context_);
  log_dropped(pushed, "cuCtxPushCurrent (unloading a module)");
  if (pushed != CUDA_SUCCESS) return;
  log_dropped(d.cuModuleUnload(module_), "cuModuleUnload");
  CUcontext popped = nullptr;
  log_dropped(d.cuCtxPopCurrent_v2(&popped), "cuCtxPopCurrent (unloading a module)");
}

// The module is unloaded by its handle if a kernel cannot be found or configured.
LoadedModule::LoadedModule(CUcontext context, const CompiledProgram& program, std::size_t first_name)
    : module_(context, program.image.data()) {
  const Driver& d = driver();
  for (int k = 0; k < kKernelCount; ++k) {
    GNSILU_CHECK(d.cuModuleGetFunction(&functions_[static_cast<std::size_t>(k)], module_.get(),
                                       program.lowered_names[first_name + static_cast<std::size_t>(k)].c_str()));
  }
  // chunk_stats may take more than the 48 KiB of dynamic shared memory a launch gets by default (channels-last
  // tiles of 64-byte slices).
  for (const KernelIndex k : {kStats, kStatsBiased}) {
    GNSILU_CHECK(d.cuFuncSetAttribute(functions_[k], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      kMaxStatsSharedBytes));
  }
}

namespace {

// The compiled code does not depend on programs_per_sm (a grid size): key without it.
using CodeKey = std::tuple<int, int, int, int, int, int, int>;  // x, y, elems_per_load, warps, stages, layout, activation
CodeKey code_key(const Variant& v) {
  return {static_cast<int>(v.x_dtype), static_cast<int>(v.y_dtype), v.config.elems_per_load, v.config.warps,
          v.config.stages, static_cast<int>(v.layout), static_cast<int>(v.activation)};
}

using ProgramKey = std::tuple<int, CodeKey>;  // arch, code
struct ProgramKeyHash {
  std::size_t operator()(const ProgramKey& k) const noexcept {
    Fnv1a h;
    h.add_word(static_cast<uint64_t>(std::get<0>(k)));
    std::apply([&h](auto... v) { (h.add_word(static_cast<uint64_t>(v)), ...); }, std::get<1>(k));
    return static_cast<std::size_t>(h.value());
  }
};

// One program per (arch, code): the first caller compiles (or loads it from the cache), the others wait.
using Programs = ComputeOnce<ProgramKey, std::shared_ptr<const CompiledProgram>, ProgramKeyHash>;

struct Registry {
  Programs programs;
  std::mutex mutex;
  // Keyed by context ID: a destroyed context's handle may come back for a new context, its modules may not.
  std::map<std::tuple<uint64_t, CodeKey>, std::unique_ptr<LoadedModule>> modules;
};

// Modules outlive static destruction, where the driver may already be gone (immortal).
Registry& registry() { return immortal<Registry>(); }

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
  const ProgramKey key{arch, code_key(variant)};
  // A failure leaves nothing behind: a later call tries again.
  return *registry().programs.get(key, [&] { return Programs::Computed{load_or_compile(arch, variant)}; });
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
