// Launching a problem that has passed validation: plan, kernels, workspace, launches on the stream. Used by
// the API for the caller's call and by the tuner for its timed runs on scratch output.
#pragma once

#include <cuda.h>

#include "gnsilu/gnsilu.hpp"
#include "runtime/call.hpp"

namespace gnsilu::detail {

// Launches `call` with `config` on call.stream (call.workspace, or the library's for the split path). Throws
// CudaError / CompileError.
void launch_call(const Call& call, const LaunchConfig& config);

}  // namespace gnsilu::detail
