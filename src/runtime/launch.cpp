#include "runtime/launch.hpp"

#include "base/driver.hpp"
#include "base/errors.hpp"
#include "base/faults.hpp"
#include "runtime/kernels.hpp"
#include "base/log.hpp"
#include "runtime/modules.hpp"
#include "runtime/workspace.hpp"

namespace gnsilu::detail {
namespace {

// `overlap`: launched with programmatic stream serialization (sm_90 and later), so that the kernel's blocks
// may start while the previous kernel of the stream drains; the kernels wait (griddepcontrol.wait) for it to
// finish before they read what it wrote. A driver that refuses the attribute gets a plain launch instead.
void launch_kernel(const Driver& d, CUfunction f, unsigned blocks, unsigned threads, CUstream stream,
                   const kernel::Params& params, const char* what, bool overlap = false, unsigned shared = 0) {
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
    config.sharedMemBytes = shared;
    config.hStream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    const CUresult ex = d.cuLaunchKernelEx(&config, f, args, nullptr);
    if (ex == CUDA_SUCCESS) return;
    logger().debug("{} with programmatic stream serialization: {}; launching without it", what, describe(ex));
  }
  const CUresult r = d.cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, shared, stream, args, nullptr);
  if (r != CUDA_SUCCESS) throw_cuda(r, what, __FILE__, __LINE__);
}

}  // namespace

void launch_call(const Call& call, const LaunchConfig& config) {
  const Problem& problem = call.problem;
  const Geometry& g = call.geometry;
  const DeviceInfo& device = call.device;
  CUstream stream = call.stream;
  const Driver& d = driver();
  const Addresses addresses{reinterpret_cast<std::uintptr_t>(problem.x), reinterpret_cast<std::uintptr_t>(problem.y),
                            dtype_size(problem.x_dtype), dtype_size(problem.y_dtype)};
  Plan plan = make_plan(g, config, call.path, device.sms, addresses);
  kernel::Params& p = plan.params;
  p.x = problem.x;
  p.y = problem.y;
  p.weight = problem.weight;
  p.bias = problem.bias;
  p.input_bias = problem.input_bias;
  p.weight_dtype = problem.weight != nullptr ? static_cast<int>(problem.weight_dtype) : 0;
  p.bias_dtype = problem.bias != nullptr ? static_cast<int>(problem.bias_dtype) : 0;
  p.eps = problem.eps;
  p.stats_mode = call.stats_mode;
  p.group_stats = call.group_stats;

  const LoadedModule& kernels = kernels_for(
      call.context, device, Variant{problem.x_dtype, problem.y_dtype, config, g.layout, problem.activation});
  if (plan.path == Path::Fused) {
    launch_kernel(d, kernels.kernel(kFused), plan.fused_blocks, plan.threads, stream, p, "cuLaunchKernel(fused)");
    return;
  }
  void* base = call.workspace;
  if (base == nullptr) {
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    GNSILU_CHECK(d.cuStreamIsCapturing(stream, &capture));
    base = internal_workspace(call.context, stream, plan.workspace, capture != CU_STREAM_CAPTURE_STATUS_NONE);
  }
  p.records = base;
  p.rows = static_cast<char*>(base) + plan.rows_offset;
  p.part_records = static_cast<char*>(base) + plan.parts_offset;
  // finalize and apply overlap the tail of the kernel before them where the GPU can (sm_90 and later); the
  // first kernel waits for whatever the stream ran before, as any launch does.
  const bool overlap = device.major >= 9;
  const bool biased = problem.input_bias != nullptr;
  if (call.stats_mode != kernel::kStatsRead) {
    launch_kernel(d, kernels.kernel(biased ? kStatsBiased : kStats), plan.stats_blocks, plan.threads, stream, p,
                  "cuLaunchKernel(chunk_stats)", false, plan.stats_shared_bytes);
  }
  if (call.stats_mode != kernel::kStatsRead && plan.finalize_atomic) {
    // A group of many records in one launch: a block a part, the parts added by atomics into accumulators that
    // chunk_stats zeroed (gnsilu_params.cuh: kFinalizeAtomic).
    p.finalize_stage = kernel::kFinalizeAtomic;
    launch_kernel(d, kernels.kernel(kFinalize), plan.finalize_part_blocks, plan.finalize_threads, stream, p,
                  "cuLaunchKernel(finalize, atomic parts)", overlap);
  } else {
    if (call.stats_mode != kernel::kStatsRead && p.parts_per_group > 1) {
      // A group of many records: its parts merged by a block each first (gnsilu_params.cuh: kFinalizeParts).
      p.finalize_stage = kernel::kFinalizeParts;
      launch_kernel(d, kernels.kernel(kFinalize), plan.finalize_part_blocks, plan.finalize_threads, stream, p,
                    "cuLaunchKernel(finalize, parts)", overlap);
      p.finalize_stage = kernel::kFinalizeMerge;
    }
    launch_kernel(d, kernels.kernel(kFinalize), plan.finalize_blocks, plan.finalize_threads, stream, p,
                  "cuLaunchKernel(finalize)", overlap && call.stats_mode != kernel::kStatsRead);
  }
  p.finalize_stage = kernel::kFinalizeWhole;
  if (call.stats_mode != kernel::kStatsWrite && g.padded()) {
    launch_kernel(d, kernels.kernel(kApplyPadded), plan.padded_blocks, kPaddedThreads, stream, p,
                  "cuLaunchKernel(apply_padded)", overlap);
  } else if (call.stats_mode != kernel::kStatsWrite) {
    launch_kernel(d, kernels.kernel(biased ? kApplyBiased : kApply), plan.apply_blocks, plan.threads, stream, p, "cuLaunchKernel(apply)",
                  overlap);
  }
}

}  // namespace gnsilu::detail
