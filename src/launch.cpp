#include "launch.hpp"

#include "driver.hpp"
#include "errors.hpp"
#include "faults.hpp"
#include "kernels.hpp"
#include "modules.hpp"
#include "workspace.hpp"

namespace gnsilu::detail {
namespace {

void launch_kernel(const Driver& d, CUfunction f, unsigned blocks, unsigned threads, CUstream stream,
                   const kernel::Params& params, const char* what) {
  if (blocks == 0) return;
  kernel::Params copy = params;
  void* args[] = {&copy};
  const CUresult r = take_fault(Fault::Launch) ? CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
                                               : d.cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
  if (r != CUDA_SUCCESS) throw_cuda(r, what, __FILE__, __LINE__);
}

}  // namespace

void launch_problem(const Problem& problem, const Geometry& g, const DeviceInfo& device, CUcontext context,
                    CUstream stream, void* workspace, const LaunchConfig& config, Path path) {
  const Driver& d = driver();
  Plan plan = make_plan(g, config, path, device.sms);
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
  launch_kernel(d, kernels.kernel(kStats), plan.stats_blocks, plan.threads, stream, p, "cuLaunchKernel(chunk_stats)");
  launch_kernel(d, kernels.kernel(kFinalize), plan.finalize_blocks, plan.finalize_threads, stream, p,
                "cuLaunchKernel(finalize)");
  launch_kernel(d, kernels.kernel(kApply), plan.apply_blocks, plan.threads, stream, p, "cuLaunchKernel(apply)");
}

}  // namespace gnsilu::detail
