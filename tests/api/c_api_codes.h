/* C helpers for test_api: the C API called with any int as a dtype or status code (c_api_codes.c). */
#ifndef GNSILU_TESTS_C_API_CODES_H
#define GNSILU_TESTS_C_API_CODES_H

#include "gnsilu/gnsilu.h"

#ifdef __cplusplus
extern "C" {
#endif

gnsilu_status call_with_codes(const void* x, int x_dtype, void* y, int y_dtype, const int64_t* shape, int ndim,
                              int64_t num_groups, const void* weight, int weight_dtype, const void* bias,
                              int bias_dtype, double eps);
const char* status_name_of_code(int code);
/* Sets the layout and activation fields of a gnsilu_problem from any ints. */
void set_problem_codes(gnsilu_problem* problem, int x_layout, int y_layout, int activation);
/* gnsilu_problem_init as a C caller compiles it. */
void init_problem_from_c(gnsilu_problem* problem);

#ifdef __cplusplus
}
#endif

#endif
