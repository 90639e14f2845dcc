// Launching a problem that has passed validation: plan, kernels, workspace, launches on the stream. Used by
// the API for the caller's call and by the tuner for its timed runs on scratch output.
#pragma once

#include <cuda.h>

#include "device.hpp"
#include "gnsilu/gnsilu.hpp"
#include "plan.hpp"

namespace gnsilu::detail {

// `workspace` holds at least workspace_bytes(geometry) bytes, or is null for the internal one. `path` may
// be Auto. Throws CudaError / CompileError.
void launch_problem(const Problem& problem, const Geometry& geometry, const DeviceInfo& device, CUcontext context,
                    CUstream stream, void* workspace, const LaunchConfig& config, Path path);

}  // namespace gnsilu::detail
