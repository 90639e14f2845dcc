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

/* How a tensor lies in memory. `shape` is always given as (N, C, *spatial), as PyTorch reports it in both. */
typedef enum gnsilu_layout {
  GNSILU_CHANNELS_FIRST = 0, /* channel-major (N, C, *spatial) contiguous: NCHW, NCDHW (torch.contiguous_format) */
  GNSILU_CHANNELS_LAST = 1   /* (N, *spatial, C) contiguous: NHWC, NDHWC (torch.channels_last, channels_last_3d) */
} gnsilu_layout;

/* What follows the normalization. */
typedef enum gnsilu_activation {
  GNSILU_ACTIVATION_SILU = 0, /* y = silu(group_norm(x)) */
  GNSILU_ACTIVATION_NONE = 1  /* y = group_norm(x) */
} gnsilu_activation;

/* The border of a padded output (gnsilu_problem.pad). */
typedef enum gnsilu_pad_mode {
  GNSILU_PAD_CONSTANT = 0, /* pad_value (zero by default) */
  GNSILU_PAD_REPLICATE = 1 /* the nearest edge element, as F.pad(mode="replicate") */
} gnsilu_pad_mode;

typedef enum gnsilu_tune_policy {
  GNSILU_TUNE_ON_FIRST_USE = 0, /* cached entry, else time the candidates once (large activations) */
  GNSILU_TUNE_CACHED_ONLY = 1,  /* cached entry, else the default configuration */
  GNSILU_TUNE_NEVER = 2         /* always the default configuration */
} gnsilu_tune_policy;

/* Computes y = silu(group_norm(x)) on `stream`, asynchronously (no host synchronization). Channels-first
 * layouts and SiLU only: gnsilu_group_norm takes the layouts and the activation as arguments.
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

/* Bytes of workspace a call with this shape may need (the same for every dtype, layout, activation and launch
 * configuration). */
GNSILU_API gnsilu_status gnsilu_workspace_size(const int64_t* shape, int ndim, int64_t num_groups, size_t* bytes);

/* One call, described field by field: what gnsilu_group_norm takes. The struct may grow in later versions (room
 * for strides, say): callers set struct_size to sizeof(gnsilu_problem) as their header declares it (use
 * gnsilu_problem_init), the library reads that many bytes and gives fields it has not been handed their defaults;
 * bytes it does not know must be zero. */
typedef struct gnsilu_problem {
  size_t struct_size;           /* sizeof(gnsilu_problem) of the caller's header */
  const void* x;                /* input, of shape `shape` in x_layout */
  gnsilu_dtype x_dtype;
  gnsilu_layout x_layout;
  void* y;                      /* output, same shape, in y_layout (which must be x_layout, see below) */
  gnsilu_dtype y_dtype;
  gnsilu_layout y_layout;
  const int64_t* shape;         /* (N, C, *spatial), ndim >= 2, whatever the layout */
  int ndim;
  int64_t num_groups;           /* G >= 1 dividing C */
  const void* weight;           /* C values, or NULL */
  gnsilu_dtype weight_dtype;
  const void* bias;             /* C values, or NULL */
  gnsilu_dtype bias_dtype;
  double eps;                   /* finite and > 0 */
  gnsilu_activation activation; /* GNSILU_ACTIVATION_SILU (0) or GNSILU_ACTIVATION_NONE */
  /* Since 0.2: a padded output. y = F.pad(output, pad[0:pad_count], mode, pad_value) in PyTorch's terms: widths in
   * F.pad's order, last dimension first ((W before, W after, H before, H after, D before, D after), >= 0), on at
   * most the last three spatial dimensions; y has the padded shape, in y_layout, and may not overlap x. The
   * interior and the border are written by one launch, after the statistics; the border of GNSILU_PAD_REPLICATE
   * holds the output's own edge bits. pad_count 0 (the default): no padding. */
  const int64_t* pad;
  int pad_count;                /* 0, 2, 4 or 6 */
  gnsilu_pad_mode pad_mode;     /* GNSILU_PAD_CONSTANT (0) or GNSILU_PAD_REPLICATE */
  double pad_value;             /* the constant border (0), rounded to FP32, then to y_dtype */
  /* Since 0.3: an input bias (a convolution's bias handed over, so that it needs no pass of its own). C values of
   * x_dtype, or NULL (the default): the tensor normalized is x + input_bias[c], each sum rounded to x_dtype (what
   * PyTorch's x + b.view(C, 1, ...) gives in x's dtype), in the statistics and in the output alike; regions
   * (gnsilu_group_stats) read it too. It may not overlap y. A call with it takes the split path. */
  const void* input_bias;
} gnsilu_problem;

/* The defaults of a problem (gnsilu_problem_init here, gnsilu::Problem in gnsilu.hpp): the group count and eps of
 * the VAEs' GroupNorms. */
#define GNSILU_DEFAULT_NUM_GROUPS 32
#define GNSILU_DEFAULT_EPS 1e-6

/* Zeroes *problem and sets struct_size, num_groups GNSILU_DEFAULT_NUM_GROUPS (32), eps GNSILU_DEFAULT_EPS (1e-6), BF16
 * x and y and FP32 weight and bias dtypes (channels-first layouts, SiLU: the zero values). Inline, so struct_size is
 * the caller's own sizeof. */
static inline void gnsilu_problem_init(gnsilu_problem* problem) {
  unsigned char* bytes = (unsigned char*)problem;
  for (size_t i = 0; i < sizeof(gnsilu_problem); ++i) bytes[i] = 0;
  problem->struct_size = sizeof(gnsilu_problem);
  problem->x_dtype = GNSILU_BF16;
  problem->y_dtype = GNSILU_BF16;
  problem->num_groups = GNSILU_DEFAULT_NUM_GROUPS;
  problem->weight_dtype = GNSILU_FP32;
  problem->bias_dtype = GNSILU_FP32;
  problem->eps = GNSILU_DEFAULT_EPS;
}

/* Computes y = silu(group_norm(x)) (or group_norm(x) with GNSILU_ACTIVATION_NONE) on `stream`, asynchronously,
 * with the checks and the guarantees of gnsilu_group_norm_silu, in either layout:
 *   - the output bits do not depend on the layout: a channels-last call gives, bit for bit, the channels-first
 *     call's output on the same logical tensor;
 *   - y is written in x's layout: y_layout must equal x_layout, except where the two layouts are the same memory
 *     (no spatial elements, or C = 1), where either is accepted;
 *   - y == x (in place) is allowed when both dtypes have one size (and the layouts match).
 * workspace, workspace_bytes: as for gnsilu_group_norm_silu. Returns GNSILU_SUCCESS or an error with
 * gnsilu_last_error() set (INVALID_ARGUMENT names the field, e.g. 'x_layout'); on an argument error nothing is
 * written. */
GNSILU_API gnsilu_status gnsilu_group_norm(const gnsilu_problem* problem, void* workspace, size_t workspace_bytes,
                                           gnsilu_stream stream);

/* Statistics of regions, merged, then applied. A group's statistics are its exact sum and sum of squares, held per
 * (sample, group) in GNSILU_STATS_WORDS int64 words; records merge by adding them word by word (exact, in any order:
 * an all-reduce SUM of int64 merges the records of several processes). For every partition of a tensor into regions,
 * gnsilu_group_norm_apply(x, sum of gnsilu_group_stats(region)) equals gnsilu_group_norm(x) bit for bit.
 *
 * gnsilu_group_stats: reads region->x (shape, num_groups, x_dtype, x_layout, input_bias; the rest is not read) and
 * writes shape[0] * num_groups records to `stats` (device memory, sample-major). gnsilu_group_norm_apply: y from x with
 * the given statistics (N * num_groups records) in place of x's own. */
#define GNSILU_STATS_WORDS 32
GNSILU_API gnsilu_status gnsilu_group_stats(const gnsilu_problem* region, int64_t* stats, void* workspace,
                                            size_t workspace_bytes, gnsilu_stream stream);
GNSILU_API gnsilu_status gnsilu_group_norm_apply(const gnsilu_problem* problem, const int64_t* stats, void* workspace,
                                                 size_t workspace_bytes, gnsilu_stream stream);

/* The CPU reference of the three calls above, on host memory, with `threads` threads (0: one per hardware thread):
 * the same bits and the same records as the GPU, for tests and for CPU tensors. */
GNSILU_API gnsilu_status gnsilu_reference_group_norm(const gnsilu_problem* problem, unsigned threads);
GNSILU_API gnsilu_status gnsilu_reference_group_stats(const gnsilu_problem* region, int64_t* stats, unsigned threads);
GNSILU_API gnsilu_status gnsilu_reference_group_norm_apply(const gnsilu_problem* problem, const int64_t* stats,
                                                           unsigned threads);

/* Bytes of workspace gnsilu_group_norm may need for this problem (only its shape and groups matter today). */
GNSILU_API gnsilu_status gnsilu_problem_workspace_size(const gnsilu_problem* problem, size_t* bytes);

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
