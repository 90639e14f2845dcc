/* The consumer's C part (c_part.c), called from main.cpp. */
#ifndef GNSILU_CONSUMER_C_PART_H
#define GNSILU_CONSUMER_C_PART_H

#include <gnsilu/gnsilu.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Calls the C API from C; returns the number of failed checks and sets *device_status to gnsilu_check_device(). */
int consumer_c_part(gnsilu_status* device_status);

#ifdef __cplusplus
}
#endif

#endif
