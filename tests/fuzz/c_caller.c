/* The fuzz target's calls into the C API, made from C: a C (or ctypes) caller may pass any int where the header
 * says gnsilu_dtype, gnsilu_tune_policy or gnsilu_status, which is valid C but could not be written in C++
 * without undefined behaviour in the harness itself. Statuses come back as int so that the harness can check
 * their range without relying on them. Also checks that the header compiles as C. */
#include "gnsilu/gnsilu.h"

int fuzz_c_group_norm_silu(const void* x, int x_dtype, void* y, int y_dtype, const int64_t* shape, int ndim,
                           int64_t num_groups, const void* weight, int weight_dtype, const void* bias,
                           int bias_dtype, double eps, void* workspace, size_t workspace_bytes, void* stream) {
  return gnsilu_group_norm_silu(x, x_dtype, y, y_dtype, shape, ndim, num_groups, weight, weight_dtype, bias,
                                bias_dtype, eps, workspace, workspace_bytes, (gnsilu_stream)stream);
}

int fuzz_c_set_tune_policy(int policy) { return gnsilu_set_tune_policy(policy); }

const char* fuzz_c_status_name(int status) { return gnsilu_status_name(status); }
