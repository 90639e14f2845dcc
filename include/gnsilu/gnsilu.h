/* gnsilu: y = silu(group_norm(x, num_groups, weight, bias, eps)) on NVIDIA GPUs. The C API.
 *
 * A small, stable ABI for C and for other languages (Python ctypes, ...): plain types, status codes, and a
 * message for the last error of the calling thread. Every pointer is a device pointer of the current CUDA
 * context (or, with no context current, of the device x lives on), except where it says otherwise.
 *
 *   const int64_t shape[4] = {1, 512, 128, 128};
 *   gnsilu_status s = gnsilu_group_norm_silu(x, GNSILU_BF16, y, GNSILU_BF16, shape, 4, 32,
 *                                            w, GNSILU_FP32, b, GNSILU_FP32, 1e-6, NULL, 0, stream);
 *   if (s != GNSILU_SUCCESS) fprintf(stderr, "%s\n", gnsilu_last_error());
 */
#ifndef GNSILU_GNSILU_H
#define GNSILU_GNSILU_H

#include <stddef.h>
#include <stdint.h>

#if defined(GNSILU_BUILDING_LIBRARY)
#define GNSILU_API __attribute__((visibility("default")))
#else
#define GNSILU_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The same type as CUstream (driver API) and cudaStream_t (runtime API); NULL is the legacy default stream. */
typedef struct CUstream_st* gnsilu_stream;

typedef enum gnsilu_dtype {
  GNSILU_NONE = 0, /* weight or bias absent */
  GNSILU_BF16 = 1,
  GNSILU_FP16 = 2,
  GNSILU_FP32 = 3
} gnsilu_dtype;

typedef enum gnsilu_status {
  GNSILU_SUCCESS = 0,
  GNSILU_ERROR_INVALID_ARGUMENT = 1, /* the message names the argument; nothing was written */
  GNSILU_ERROR_NO_DRIVER = 2,        /* libcuda.so.1 missing, a stub, or too old */
  GNSILU_ERROR_NO_DEVICE = 3,        /* no CUDA device, or none usable */
  GNSILU_ERROR_UNSUPPORTED_DEVICE = 4, /* compute capability below 7.5 */
  GNSILU_ERROR_CUDA = 5,             /* a driver call failed: the message names it and its CUresult */
  GNSILU_ERROR_COMPILE = 6,          /* NVRTC failed: the message holds its log */
  GNSILU_ERROR_OUT_OF_MEMORY = 7,    /* device memory for the internal workspace */
  GNSILU_ERROR_INTERNAL = 8
} gnsilu_status;

typedef enum gnsilu_tune_policy {
  GNSILU_TUNE_ON_FIRST_USE = 0, /* cached entry, else time the candidates once (large activations) */
  GNSILU_TUNE_CACHED_ONLY = 1,  /* cached entry, else the default configuration */
  GNSILU_TUNE_NEVER = 2         /* always the default configuration */
} gnsilu_tune_policy;

/* Computes y = silu(group_norm(x)) on `stream`, asynchronously (no host synchronization).
 *   x, x_dtype       contiguous (N, C, *spatial) tensor, any number of spatial dimensions (ndim >= 2)
 *   y, y_dtype       output of the same shape; y == x (in place) is allowed when both dtypes have the same
 *                    size; any other overlap is an error
 *   shape, ndim      the sizes, N >= 0, C >= 1; zero elements is a success that launches nothing
 *   num_groups       G >= 1 dividing C
 *   weight, bias     C values each of their dtype (BF16, FP16 or FP32), or NULL (GNSILU_NONE) for none
 *   eps              finite and > 0
 *   workspace        NULL: an internal per-stream buffer (see the README for graph capture); otherwise at
 *                    least gnsilu_workspace_size() bytes of device memory that this call may use until it
 *                    completes on the stream
 * Returns GNSILU_SUCCESS or an error with gnsilu_last_error() set; on an argument error nothing is written. */
GNSILU_API gnsilu_status gnsilu_group_norm_silu(const void* x, gnsilu_dtype x_dtype, void* y, gnsilu_dtype y_dtype,
                                                const int64_t* shape, int ndim, int64_t num_groups,
                                                const void* weight, gnsilu_dtype weight_dtype, const void* bias,
                                                gnsilu_dtype bias_dtype, double eps, void* workspace,
                                                size_t workspace_bytes, gnsilu_stream stream);

/* Bytes of workspace a call with this shape may need (the same for every dtype and launch configuration). */
GNSILU_API gnsilu_status gnsilu_workspace_size(const int64_t* shape, int ndim, int64_t num_groups, size_t* bytes);

/* Whether a usable driver and device are present: GNSILU_SUCCESS, or NO_DRIVER / NO_DEVICE with a message. */
GNSILU_API gnsilu_status gnsilu_check_device(void);

/* Frees the internal workspaces (call with no gnsilu work in flight; later calls allocate again). */
GNSILU_API gnsilu_status gnsilu_release_workspaces(void);

/* The process's tuning policy (initially from GNSILU_TUNE: "on", "cached" or "off"). */
GNSILU_API gnsilu_status gnsilu_set_tune_policy(gnsilu_tune_policy policy);

/* The cache files this process uses from now on: user_path (writable; NULL or "" keeps everything in memory)
 * over the read-only files in shared_paths (separated by ':', or NULL). Replaces GNSILU_CACHE and
 * GNSILU_CACHE_SHARED. */
GNSILU_API gnsilu_status gnsilu_set_cache_paths(const char* user_path, const char* shared_paths);

/* The message of the last error of this thread ("" if none); valid until the thread's next gnsilu call. */
GNSILU_API const char* gnsilu_last_error(void);

/* A short name for a status code. */
GNSILU_API const char* gnsilu_status_name(gnsilu_status status);

/* The library version, "MAJOR.MINOR.PATCH". */
GNSILU_API const char* gnsilu_version(void);

#ifdef __cplusplus
}
#endif

#endif /* GNSILU_GNSILU_H */
