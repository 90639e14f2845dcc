/* test_api's calls with dtype and status codes outside the enums: valid C (a C or ctypes caller may pass any
   int where the header names an enum), undefined in C++, so they are made from here. */
#include "c_api_codes.h"

gnsilu_status call_with_codes(const void* x, int x_dtype, void* y, int y_dtype, const int64_t* shape, int ndim,
                              int64_t num_groups, const void* weight, int weight_dtype, const void* bias,
                              int bias_dtype, double eps) {
  return gnsilu_group_norm_silu(x, (gnsilu_dtype)x_dtype, y, (gnsilu_dtype)y_dtype, shape, ndim, num_groups, weight,
                                (gnsilu_dtype)weight_dtype, bias, (gnsilu_dtype)bias_dtype, eps, NULL, 0, NULL);
}

const char* status_name_of_code(int code) { return gnsilu_status_name((gnsilu_status)code); }

void set_problem_codes(gnsilu_problem* problem, int x_layout, int y_layout, int activation) {
  problem->x_layout = (gnsilu_layout)x_layout;
  problem->y_layout = (gnsilu_layout)y_layout;
  problem->activation = (gnsilu_activation)activation;
}

void init_problem_from_c(gnsilu_problem* problem) { gnsilu_problem_init(problem); }
