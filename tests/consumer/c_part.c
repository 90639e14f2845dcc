/* The C API called from C: gnsilu.h must be valid C (C11 here). */
#include <stdio.h>
#include <string.h>

#include <gnsilu/gnsilu.h>

#include "c_part.h"

int consumer_c_part(gnsilu_status* device_status) {
  int failures = 0;
  printf("C   gnsilu_version: %s\n", gnsilu_version());

  gnsilu_problem p;
  gnsilu_problem_init(&p);
  if (p.struct_size != sizeof p || p.num_groups != 32 || p.x_dtype != GNSILU_BF16) {
    printf("C   gnsilu_problem_init: unexpected defaults\n");
    ++failures;
  }
  const int64_t shape[4] = {2, 64, 8, 8};
  p.shape = shape;
  p.ndim = 4;
  size_t bytes = 0;
  gnsilu_status s = gnsilu_problem_workspace_size(&p, &bytes);
  printf("C   gnsilu_problem_workspace_size: %s (%zu bytes)\n", gnsilu_status_name(s), bytes);
  if (s != GNSILU_SUCCESS) ++failures;

  /* Zero elements: a success that launches nothing, with or without a GPU. */
  float dummy[4] = {0};
  const int64_t empty[4] = {0, 64, 8, 8};
  p.x = dummy;
  p.y = dummy;
  p.x_dtype = p.y_dtype = GNSILU_FP32;
  p.shape = empty;
  s = gnsilu_group_norm(&p, NULL, 0, NULL);
  printf("C   gnsilu_group_norm (0 elements): %s\n", gnsilu_status_name(s));
  if (s != GNSILU_SUCCESS) ++failures;

  /* An argument error names the argument. */
  p.num_groups = 3; /* does not divide C = 64 */
  p.shape = shape;
  s = gnsilu_group_norm(&p, NULL, 0, NULL);
  printf("C   gnsilu_group_norm (3 groups of 64 channels): %s: %s\n", gnsilu_status_name(s), gnsilu_last_error());
  if (s != GNSILU_ERROR_INVALID_ARGUMENT || strstr(gnsilu_last_error(), "num_groups") == NULL) ++failures;

  *device_status = gnsilu_check_device();
  printf("C   gnsilu_check_device: %s%s%s\n", gnsilu_status_name(*device_status),
         *device_status == GNSILU_SUCCESS ? "" : ": ", *device_status == GNSILU_SUCCESS ? "" : gnsilu_last_error());
  return failures;
}
