// The C API: each function calls the C++ API, turns exceptions into status codes and keeps the message for
// gnsilu_last_error() in a thread-local string. Nothing escapes as an exception.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <vector>
#include <string>

#include "cache/cache.hpp"
#include "gnsilu/gnsilu.h"
#include "gnsilu/gnsilu.hpp"
#include "gnsilu/reference.hpp"
#include "base/log.hpp"

namespace {

thread_local std::string last_error;

template <typename F>
gnsilu_status guarded(F&& body) noexcept {
  try {
    last_error.clear();
    body();
    return GNSILU_SUCCESS;
  } catch (const gnsilu::Error& e) {
    last_error = e.what();
    return static_cast<gnsilu_status>(e.status());
  } catch (const std::bad_alloc&) {
    last_error = "gnsilu: out of host memory";
    return GNSILU_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    last_error = std::string("gnsilu: internal error: ") + e.what();
    return GNSILU_ERROR_INTERNAL;
  } catch (...) {
    last_error = "gnsilu: internal error (unknown exception)";
    return GNSILU_ERROR_INTERNAL;
  }
}

// A C caller (ctypes, ...) may pass any int where the header names an enum: valid C, but in C++ reading a value
// outside the enum's range as that enum is undefined behaviour. Read the int; validation rejects unknown codes.
template <typename E>
int code_of(const E& value) {
  static_assert(sizeof(E) == sizeof(int));
  int code;
  std::memcpy(&code, &value, sizeof code);
  return code;
}

[[noreturn]] void invalid(const char* name, const std::string& why) {
  throw gnsilu::Error(gnsilu::Status::InvalidArgument, std::string("gnsilu: invalid argument '") + name + "': " + why);
}

std::span<const int64_t> shape_span(const int64_t* shape, int ndim) {
  if (ndim < 0) invalid("ndim", "is negative");
  if (shape == nullptr && ndim > 0) invalid("shape", "is null");
  return {shape, static_cast<std::size_t>(ndim)};
}

// The caller's gnsilu_problem as the C++ Problem. The caller says how large its struct is: the fields this
// library knows that fit in it are read, the others keep their defaults (gnsilu_problem_init's), and bytes past
// the ones this library knows must be zero (fields of a later version it cannot honour).
gnsilu::Problem problem_of(const gnsilu_problem* given) {
  if (given == nullptr) invalid("problem", "is null");
  std::size_t size = 0;
  std::memcpy(&size, given, sizeof size);
  constexpr std::size_t kFirstVersion = offsetof(gnsilu_problem, activation) + sizeof(int);
  if (size < kFirstVersion) {
    invalid("problem.struct_size", std::to_string(size) + " is smaller than the first version of gnsilu_problem (" +
                                       std::to_string(kFirstVersion) + " bytes); set it with gnsilu_problem_init");
  }
  if (size > (std::size_t{1} << 16)) invalid("problem.struct_size", std::to_string(size) + " is not a struct size");
  gnsilu_problem c;
  gnsilu_problem_init(&c);
  std::memcpy(&c, given, std::min(size, sizeof c));
  // Fields added after the first version that the caller's struct does not hold whole keep their defaults (a size
  // that ends inside one must not hand over half a pointer or half a double).
  const auto holds = [size](std::size_t offset, std::size_t bytes) { return size >= offset + bytes; };
  if (!holds(offsetof(gnsilu_problem, pad), sizeof c.pad)) c.pad = nullptr;
  if (!holds(offsetof(gnsilu_problem, pad_count), sizeof c.pad_count)) c.pad_count = 0;
  if (!holds(offsetof(gnsilu_problem, pad_mode), sizeof c.pad_mode)) c.pad_mode = GNSILU_PAD_CONSTANT;
  if (!holds(offsetof(gnsilu_problem, pad_value), sizeof c.pad_value)) c.pad_value = 0.0;
  if (!holds(offsetof(gnsilu_problem, input_bias), sizeof c.input_bias)) c.input_bias = nullptr;
  const auto* bytes = reinterpret_cast<const unsigned char*>(given);
  for (std::size_t i = sizeof c; i < size; ++i) {
    if (bytes[i] != 0) {
      invalid("problem.struct_size", std::to_string(size) + " bytes with fields this gnsilu (" +
                                         std::to_string(sizeof c) + " bytes) does not know set; update gnsilu");
    }
  }
  gnsilu::Problem p;
  p.x = c.x;
  p.x_dtype = static_cast<gnsilu::DType>(code_of(c.x_dtype));
  p.x_layout = static_cast<gnsilu::Layout>(code_of(c.x_layout));
  p.y = c.y;
  p.y_dtype = static_cast<gnsilu::DType>(code_of(c.y_dtype));
  p.y_layout = static_cast<gnsilu::Layout>(code_of(c.y_layout));
  p.shape = shape_span(c.shape, c.ndim);
  p.num_groups = c.num_groups;
  p.weight = c.weight;
  p.weight_dtype = static_cast<gnsilu::DType>(code_of(c.weight_dtype));
  p.bias = c.bias;
  p.bias_dtype = static_cast<gnsilu::DType>(code_of(c.bias_dtype));
  p.eps = c.eps;
  p.activation = static_cast<gnsilu::Activation>(code_of(c.activation));
  if (c.pad_count < 0) invalid("pad_count", "is negative");
  if (c.pad == nullptr && c.pad_count > 0) invalid("pad", "is null but pad_count is " + std::to_string(c.pad_count));
  p.pad = {c.pad, static_cast<std::size_t>(c.pad_count)};
  p.pad_mode = static_cast<gnsilu::PadMode>(code_of(c.pad_mode));
  p.pad_value = c.pad_value;
  p.input_bias = c.input_bias;
  return p;
}

}  // namespace

extern "C" {

gnsilu_status gnsilu_group_norm_silu(const void* x, gnsilu_dtype x_dtype, void* y, gnsilu_dtype y_dtype,
                                     const int64_t* shape, int ndim, int64_t num_groups, const void* weight,
                                     gnsilu_dtype weight_dtype, const void* bias, gnsilu_dtype bias_dtype, double eps,
                                     void* workspace, size_t workspace_bytes, gnsilu_stream stream) {
  return guarded([&] {
    gnsilu::Problem p;
    p.x = x;
    p.x_dtype = static_cast<gnsilu::DType>(code_of(x_dtype));
    p.y = y;
    p.y_dtype = static_cast<gnsilu::DType>(code_of(y_dtype));
    p.shape = shape_span(shape, ndim);
    p.num_groups = num_groups;
    p.weight = weight;
    p.weight_dtype = static_cast<gnsilu::DType>(code_of(weight_dtype));
    p.bias = bias;
    p.bias_dtype = static_cast<gnsilu::DType>(code_of(bias_dtype));
    p.eps = eps;
    gnsilu::group_norm_silu(p, stream, {workspace, workspace_bytes});
  });
}

gnsilu_status gnsilu_group_norm(const gnsilu_problem* problem, void* workspace, size_t workspace_bytes,
                                gnsilu_stream stream) {
  return guarded([&] { gnsilu::group_norm(problem_of(problem), stream, {workspace, workspace_bytes}); });
}

gnsilu_status gnsilu_group_stats(const gnsilu_problem* region, int64_t* stats, void* workspace, size_t workspace_bytes,
                                 gnsilu_stream stream) {
  return guarded([&] { gnsilu::group_stats(problem_of(region), stats, stream, {workspace, workspace_bytes}); });
}

gnsilu_status gnsilu_group_norm_apply(const gnsilu_problem* problem, const int64_t* stats, void* workspace,
                                      size_t workspace_bytes, gnsilu_stream stream) {
  return guarded([&] { gnsilu::group_norm_apply(problem_of(problem), stats, stream, {workspace, workspace_bytes}); });
}

gnsilu_status gnsilu_reference_group_norm(const gnsilu_problem* problem, unsigned threads) {
  return guarded([&] { gnsilu::reference_group_norm_silu(problem_of(problem), threads); });
}

gnsilu_status gnsilu_reference_group_stats(const gnsilu_problem* region, int64_t* stats, unsigned threads) {
  return guarded([&] { gnsilu::reference_group_stats(problem_of(region), stats, threads); });
}

gnsilu_status gnsilu_reference_group_norm_apply(const gnsilu_problem* problem, const int64_t* stats,
                                                unsigned threads) {
  return guarded([&] { gnsilu::reference_group_norm_apply(problem_of(problem), stats, threads); });
}

gnsilu_status gnsilu_problem_workspace_size(const gnsilu_problem* problem, size_t* bytes) {
  return guarded([&] {
    const gnsilu::Problem p = problem_of(problem);
    if (bytes == nullptr) invalid("bytes", "is null");
    *bytes = gnsilu::workspace_size(p);
  });
}

gnsilu_status gnsilu_workspace_size(const int64_t* shape, int ndim, int64_t num_groups, size_t* bytes) {
  return guarded([&] {
    if (bytes == nullptr) invalid("bytes", "is null");
    *bytes = gnsilu::workspace_size(shape_span(shape, ndim), num_groups);
  });
}

gnsilu_status gnsilu_check_device(void) {
  return guarded([] { gnsilu::check_device(); });
}

gnsilu_status gnsilu_release_workspaces(void) {
  return guarded([] { gnsilu::release_workspaces(); });
}

gnsilu_status gnsilu_set_tune_policy(gnsilu_tune_policy policy) {
  return guarded([&] { gnsilu::set_tune_policy(static_cast<gnsilu::TunePolicy>(code_of(policy))); });
}

gnsilu_status gnsilu_set_cache_paths(const char* user_path, const char* shared_paths) {
  return guarded([&] {
    const std::vector<std::string> shared =
        shared_paths != nullptr ? gnsilu::cache::split_path_list(shared_paths) : std::vector<std::string>{};
    gnsilu::set_cache_paths(user_path != nullptr ? user_path : "", shared);
  });
}

const char* gnsilu_last_error(void) { return last_error.c_str(); }

const char* gnsilu_status_name(gnsilu_status status) {
  switch (code_of(status)) {
    case GNSILU_SUCCESS: return "GNSILU_SUCCESS";
    case GNSILU_ERROR_INVALID_ARGUMENT: return "GNSILU_ERROR_INVALID_ARGUMENT";
    case GNSILU_ERROR_NO_DRIVER: return "GNSILU_ERROR_NO_DRIVER";
    case GNSILU_ERROR_NO_DEVICE: return "GNSILU_ERROR_NO_DEVICE";
    case GNSILU_ERROR_UNSUPPORTED_DEVICE: return "GNSILU_ERROR_UNSUPPORTED_DEVICE";
    case GNSILU_ERROR_CUDA: return "GNSILU_ERROR_CUDA";
    case GNSILU_ERROR_COMPILE: return "GNSILU_ERROR_COMPILE";
    case GNSILU_ERROR_OUT_OF_MEMORY: return "GNSILU_ERROR_OUT_OF_MEMORY";
    case GNSILU_ERROR_INTERNAL: return "GNSILU_ERROR_INTERNAL";
  }
  return "GNSILU_UNKNOWN_STATUS";
}

const char* gnsilu_version(void) { return gnsilu::version(); }

}  // extern "C"
