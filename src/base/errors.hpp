// Internal error helpers: one way to report a bad argument, a failed driver call and a failed NVRTC call.
#pragma once

#include <cuda.h>
#include <nvrtc.h>

#include <string>

#include "gnsilu/gnsilu.hpp"

namespace gnsilu::detail {

// "invalid argument 'name': what" as Error(InvalidArgument).
[[noreturn]] void throw_invalid(const std::string& name, const std::string& what);

// A failed driver call: names the call, file and line, keeps the CUresult; OOM maps to Status::OutOfMemory.
[[noreturn]] void throw_cuda(CUresult result, const char* call, const char* file, int line);

// A failed NVRTC call outside compilation proper (creation, queries).
[[noreturn]] void throw_nvrtc(nvrtcResult result, const char* call, const char* file, int line);

// What GNSILU_CHECK calls: one overload per kind of result, so that one macro checks both.
inline void check_result(CUresult result, const char* call, const char* file, int line) {
  if (result != CUDA_SUCCESS) throw_cuda(result, call, file, line);
}
inline void check_result(nvrtcResult result, const char* call, const char* file, int line) {
  if (result != NVRTC_SUCCESS) throw_nvrtc(result, call, file, line);
}

}  // namespace gnsilu::detail

// Checks a driver (CUresult) or NVRTC (nvrtcResult) call: a failure throws, naming the call, file and line.
#define GNSILU_CHECK(call) ::gnsilu::detail::check_result((call), #call, __FILE__, __LINE__)
