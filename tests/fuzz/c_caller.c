/* The fuzz target's calls into the C API, made from C: a C (or ctypes) caller may pass any int where the header
 * says gnsilu_dtype, gnsilu_tune_policy or gnsilu_status, which is valid C but could not be written in C++
 * without undefined behaviour in the harness itself. Statuses come back as int so that the harness can check
 * their range without relying on them. Also checks that the header compiles as C. */
#include <stddef.h>

#include "gnsilu/gnsilu.h"

int fuzz_c_group_norm_silu(const void* x, int x_dtype, void* y, int y_dtype, const int64_t* shape, int ndim,
                           int64_t num_groups, const void* weight, int weight_dtype, const void* bias,
                           int bias_dtype, double eps, void* workspace, size_t workspace_bytes, void* stream) {
  return gnsilu_group_norm_silu(x, x_dtype, y, y_dtype, shape, ndim, num_groups, weight, weight_dtype, bias,
                                bias_dtype, eps, workspace, workspace_bytes, (gnsilu_stream)stream);
}

int fuzz_c_set_tune_policy(int policy) { return gnsilu_set_tune_policy(policy); }

const char* fuzz_c_status_name(int status) { return gnsilu_status_name(status); }

/* gnsilu_group_norm with a descriptor of `struct_size` bytes in a buffer of `buffer_size` (>= sizeof(gnsilu_problem),
 * the bytes past the struct set to `tail_byte`), built from the same arguments plus any ints as layout and
 * activation codes. */
int fuzz_c_group_norm(size_t struct_size, size_t buffer_size, unsigned char tail_byte, const void* x, int x_dtype,
                      int x_layout, void* y, int y_dtype, int y_layout, const int64_t* shape, int ndim,
                      int64_t num_groups, const void* weight, int weight_dtype, const void* bias, int bias_dtype,
                      double eps, int activation, void* workspace, size_t workspace_bytes, void* stream) {
  unsigned char buffer[sizeof(gnsilu_problem) + 64];
  gnsilu_problem* p = (gnsilu_problem*)buffer;
  size_t i;
  if (buffer_size > sizeof buffer) buffer_size = sizeof buffer;
  for (i = sizeof(gnsilu_problem); i < buffer_size; ++i) buffer[i] = tail_byte;
  gnsilu_problem_init(p);
  p->struct_size = struct_size;
  p->x = x;
  p->x_dtype = x_dtype;
  p->x_layout = x_layout;
  p->y = y;
  p->y_dtype = y_dtype;
  p->y_layout = y_layout;
  p->shape = shape;
  p->ndim = ndim;
  p->num_groups = num_groups;
  p->weight = weight;
  p->weight_dtype = weight_dtype;
  p->bias = bias;
  p->bias_dtype = bias_dtype;
  p->eps = eps;
  p->activation = activation;
  return gnsilu_group_norm(p, workspace, workspace_bytes, (gnsilu_stream)stream);
}

size_t fuzz_c_problem_size(void) { return sizeof(gnsilu_problem); }

/* The size of the first version of gnsilu_problem (up to `activation`): the smallest struct_size accepted. */
size_t fuzz_c_problem_first_size(void) { return offsetof(gnsilu_problem, activation) + sizeof(int); }
