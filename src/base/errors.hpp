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

}  // namespace gnsilu::detail

#define GNSILU_CU(call)                                                                 \
  do {                                                                                  \
    const CUresult gnsilu_result_ = (call);                                             \
    if (gnsilu_result_ != CUDA_SUCCESS)                                                 \
      ::gnsilu::detail::throw_cuda(gnsilu_result_, #call, __FILE__, __LINE__);          \
  } while (0)

#define GNSILU_NVRTC(call)                                                              \
  do {                                                                                  \
    const nvrtcResult gnsilu_result_ = (call);                                          \
    if (gnsilu_result_ != NVRTC_SUCCESS)                                                \
      ::gnsilu::detail::throw_nvrtc(gnsilu_result_, #call, __FILE__, __LINE__);         \
  } while (0)
