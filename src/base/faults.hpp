// Fault injection for the hardening tests: makes the next NVRTC compilations or kernel launches fail the way a
// broken compiler or driver would, so that tests can check each failure gives a clear error or a fallback and
// never a crash or a wrong result. Internal (tests link gnsilu_internal); the public API cannot reach it, and
// with nothing injected it costs one relaxed atomic load per compile or launch.
#pragma once

namespace gnsilu::detail {

enum class Fault : int {
  Compile = 0,  // NVRTC is given an option it rejects: a real NVRTC error with its log
  Launch = 1,   // cuLaunchKernel is reported to fail with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (not launched)
};

// The next `count` operations of kind `fault` fail (0 clears).
void inject_fault(Fault fault, int count);

// Whether this operation fails (consumes one injected fault).
bool take_fault(Fault fault);

}  // namespace gnsilu::detail
