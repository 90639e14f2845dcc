#include "launch.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "driver.hpp"
#include "errors.hpp"
#include "faults.hpp"
#include "kernels.hpp"
#include "log.hpp"
#include "modules.hpp"
#include "workspace.hpp"

namespace gnsilu::detail {
namespace {

// `overlap`: launched with programmatic stream serialization (sm_90 and later), so that the kernel's blocks
// may start while the previous kernel of the stream drains; the kernels wait (griddepcontrol.wait) for it to
// finish before they read what it wrote. A driver that refuses the attribute gets a plain launch instead.
void launch_kernel(const Driver& d, CUfunction f, unsigned blocks, unsigned threads, CUstream stream,
                   const kernel::Params& params, const char* what, bool overlap = false) {
  if (blocks == 0) return;
  kernel::Params copy = params;
  void* args[] = {&copy};
  if (take_fault(Fault::Launch)) throw_cuda(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, what, __FILE__, __LINE__);
  if (overlap) {
    CUlaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = blocks;
    config.gridDimY = 1;
    config.gridDimZ = 1;
    config.blockDimX = threads;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.hStream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    const CUresult ex = d.cuLaunchKernelEx(&config, f, args, nullptr);
    if (ex == CUDA_SUCCESS) return;
    logger().debug("{} with programmatic stream serialization: {}; launching without it", what, describe(ex));
  }
  const CUresult r = d.cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
  if (r != CUDA_SUCCESS) throw_cuda(r, what, __FILE__, __LINE__);
}

// Knobs for experiments with the streamed path (unset: the plan's choice). GNSILU_STREAMED_AHEAD: groups whose
// statistics run ahead of the apply; GNSILU_STREAMED_ITEM: elements per work item.
int64_t env_override(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::max<int64_t>(0, std::atoll(v)) : int64_t{0};
}
int64_t ahead_override() {
  static const int64_t value = env_override("GNSILU_STREAMED_AHEAD");
  return value;
}
int64_t item_override() {
  static const int64_t value = env_override("GNSILU_STREAMED_ITEM");
  return value;
}

}  // namespace

void launch_problem(const Problem& problem, const Geometry& g, const DeviceInfo& device, CUcontext context,
                    CUstream stream, void* workspace, const LaunchConfig& config, Path path) {
  const Driver& d = driver();
  Target target = target_of(device, problem.x_dtype);
  if (item_override() > 0) target.streamed_item = item_override();
  Plan plan = make_plan(g, config, path, target);
  kernel::Params& p = plan.params;
  p.x = problem.x;
  p.y = problem.y;
  p.weight = problem.weight;
  p.bias = problem.bias;
  p.weight_dtype = problem.weight != nullptr ? static_cast<int>(problem.weight_dtype) : 0;
  p.bias_dtype = problem.bias != nullptr ? static_cast<int>(problem.bias_dtype) : 0;
  p.eps = problem.eps;
  p.vectorized = vectorizable(g, problem.x, problem.y) ? 1 : 0;

  const LoadedModule& kernels = kernels_for(context, device, Variant{problem.x_dtype, problem.y_dtype, config});
  if (plan.path == Path::Fused) {
    launch_kernel(d, kernels.kernel(kFused), plan.fused_blocks, plan.threads, stream, p, "cuLaunchKernel(fused)");
    return;
  }
  void* base = workspace;
  if (base == nullptr) {
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    GNSILU_CU(d.cuStreamIsCapturing(stream, &capture));
    base = internal_workspace(context, stream, plan.workspace, capture != CU_STREAM_CAPTURE_STATUS_NONE);
  }
  p.records = base;
  p.rows = static_cast<char*>(base) + plan.rows_offset;
  if (plan.path == Path::Streamed) {
    // The ticket, arrival counters and ready flags start at zero (a memset node when captured).
    p.counters = static_cast<char*>(base) + plan.counters_offset;
    if (ahead_override() > 0) p.ahead = std::min(ahead_override(), g.groups_total);
    GNSILU_CU(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p.counters), 0, plan.counters_bytes, stream));
    static const bool tracing = std::getenv("GNSILU_STREAMED_TRACE") != nullptr;  // EXPERIMENT
    static int traced = 0;
    CUdeviceptr trace = 0;
    const std::size_t G = static_cast<std::size_t>(g.groups_total);
    if (tracing && ++traced == 3) {
      GNSILU_CU(d.cuMemAlloc_v2(&trace, 6 * 8 * G));
      GNSILU_CU(d.cuMemsetD8Async(trace, 0xFF, 2 * 8 * G, stream));
      GNSILU_CU(d.cuMemsetD8Async(trace + 2 * 8 * G, 0, 4 * 8 * G, stream));
      p.trace = reinterpret_cast<unsigned long long*>(trace);
    }
    launch_kernel(d, kernels.kernel(kStreamed), plan.streamed_blocks, plan.threads, stream, p,
                  "cuLaunchKernel(streamed)");
    if (trace) {
      GNSILU_CU(d.cuStreamSynchronize(stream));
      std::vector<unsigned long long> h(6 * G);
      GNSILU_CU(d.cuMemcpyDtoH_v2(h.data(), trace, h.size() * 8));
      d.cuMemFree_v2(trace);
      const unsigned long long* mn = h.data();
      const unsigned long long* ot = h.data() + 2 * G;
      unsigned long long t0 = ~0ull, tend = 0;
      for (std::size_t k = 0; k < G; ++k) { t0 = std::min(t0, mn[2 * k]); tend = std::max(tend, ot[4 * k + 3]); }
      std::fprintf(stderr, "TRACE %s ahead %lld blocks %u items %lld: total %.1f us\n", describe(Variant{problem.x_dtype, problem.y_dtype, config}).c_str(),
                   static_cast<long long>(p.ahead), plan.streamed_blocks, static_cast<long long>(p.items_total), (tend - t0) / 1e3);
      for (std::size_t k = 0; k < G; ++k) {
        const auto us = [&](unsigned long long v) { return (static_cast<double>(v) - static_cast<double>(t0)) / 1e3; };
        std::fprintf(stderr, "  g%-3zu stats start %7.1f  arrived %7.1f  ready %7.1f (fin %5.1f)  apply first %7.1f  end %7.1f  wait sum %8.1f us (%5.2f us/item)\n", k,
                     us(mn[2 * k]), us(ot[4 * k]), us(ot[4 * k + 1]), (ot[4 * k + 1] - ot[4 * k]) / 1e3, us(mn[2 * k + 1]), us(ot[4 * k + 3]),
                     ot[4 * k + 2] / 1e3, ot[4 * k + 2] / 1e3 / static_cast<double>(p.apply_items_per_group));
      }
    }
    return;
  }
  // finalize and apply overlap the tail of the kernel before them where the GPU can (sm_90 and later); the
  // first kernel waits for whatever the stream ran before, as any launch does.
  const bool overlap = device.major >= 9;
  launch_kernel(d, kernels.kernel(kStats), plan.stats_blocks, plan.threads, stream, p, "cuLaunchKernel(chunk_stats)");
  launch_kernel(d, kernels.kernel(kFinalize), plan.finalize_blocks, plan.finalize_threads, stream, p,
                "cuLaunchKernel(finalize)", overlap);
  launch_kernel(d, kernels.kernel(kApply), plan.apply_blocks, plan.threads, stream, p, "cuLaunchKernel(apply)",
                overlap);
}

}  // namespace gnsilu::detail
