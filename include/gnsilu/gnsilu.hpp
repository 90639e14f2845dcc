// gnsilu: y = silu(group_norm(x, num_groups, weight, bias, eps)) on NVIDIA GPUs. The C++ API.
//
//   #include <gnsilu/gnsilu.hpp>
//   const int64_t shape[] = {1, 512, 128, 128};
//   gnsilu::Problem p;
//   p.x = x; p.x_dtype = gnsilu::DType::BF16;
//   p.y = y; p.y_dtype = gnsilu::DType::BF16;
//   p.shape = shape; p.num_groups = 32;
//   p.weight = w; p.bias = b;              // FP32 by default; null for no affine
//   gnsilu::group_norm_silu(p, stream);    // throws gnsilu::Error
//
// Output bits depend only on the inputs: not on the launch configuration, not on the GPU, and they equal
// gnsilu::reference_group_norm_silu (reference.hpp) on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "gnsilu/gnsilu.h"

namespace gnsilu {

enum class DType : int { None = GNSILU_NONE, BF16 = GNSILU_BF16, FP16 = GNSILU_FP16, FP32 = GNSILU_FP32 };

enum class Status : int {
  Success = GNSILU_SUCCESS,
  InvalidArgument = GNSILU_ERROR_INVALID_ARGUMENT,
  NoDriver = GNSILU_ERROR_NO_DRIVER,
  NoDevice = GNSILU_ERROR_NO_DEVICE,
  UnsupportedDevice = GNSILU_ERROR_UNSUPPORTED_DEVICE,
  Cuda = GNSILU_ERROR_CUDA,
  Compile = GNSILU_ERROR_COMPILE,
  OutOfMemory = GNSILU_ERROR_OUT_OF_MEMORY,
  Internal = GNSILU_ERROR_INTERNAL,
};

// Every failure is an Error carrying its Status; CUDA and NVRTC failures keep their details.
class GNSILU_API Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message);
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

// A driver call failed: the message names the call, file and line; result() is the CUresult.
class GNSILU_API CudaError : public Error {
 public:
  CudaError(int result, const std::string& message, Status status = Status::Cuda);
  int result() const noexcept { return result_; }

 private:
  int result_;
};

// NVRTC failed: the message says what was compiled; log() and options() keep NVRTC's log and the options.
class GNSILU_API CompileError : public Error {
 public:
  CompileError(const std::string& message, std::string log, std::string options);
  const std::string& log() const noexcept { return log_; }
  const std::string& options() const noexcept { return options_; }

 private:
  std::string log_;
  std::string options_;
};

// How a tensor lies in memory; the shape is always (N, C, *spatial).
enum class Layout : int {
  ChannelsFirst = GNSILU_CHANNELS_FIRST,  // (N, C, *spatial) contiguous: NCHW, NCDHW
  ChannelsLast = GNSILU_CHANNELS_LAST,    // (N, *spatial, C) contiguous: NHWC, NDHWC
};

// What follows the normalization: y = silu(group_norm(x)) or y = group_norm(x).
enum class Activation : int { SiLU = GNSILU_ACTIVATION_SILU, None = GNSILU_ACTIVATION_NONE };

// The border of a padded output (Problem::pad): a constant value, or the nearest edge element (replicate).
enum class PadMode : int { Constant = GNSILU_PAD_CONSTANT, Replicate = GNSILU_PAD_REPLICATE };

// One call's inputs. x and y are contiguous tensors of shape (N, C, *spatial), any number of spatial
// dimensions, each channels-first or channels-last (y in x's layout, except where the two layouts are the same
// memory: no spatial elements, or C = 1). The layout never changes a bit of the output. y == x is allowed (in
// place) when the two dtypes have the same size.
struct Problem {
  const void* x = nullptr;
  DType x_dtype = DType::BF16;
  void* y = nullptr;
  DType y_dtype = DType::BF16;
  std::span<const int64_t> shape;
  int64_t num_groups = GNSILU_DEFAULT_NUM_GROUPS;  // 32 (gnsilu.h: the defaults, written once)
  const void* weight = nullptr;  // C values, or null (weight 1)
  DType weight_dtype = DType::FP32;
  const void* bias = nullptr;    // C values, or null (bias 0)
  DType bias_dtype = DType::FP32;
  double eps = GNSILU_DEFAULT_EPS;  // 1e-6
  Layout x_layout = Layout::ChannelsFirst;
  Layout y_layout = Layout::ChannelsFirst;
  Activation activation = Activation::SiLU;
  // A padded output: y is F.pad(output, pad, mode, value) as PyTorch computes it, written by one launch after the
  // statistics (the interior and the border). `pad` lists widths in F.pad's order, last dimension first: (W before,
  // W after, H before, H after, D before, D after), 2, 4 or 6 of them, >= 0, on at most the last three spatial
  // dimensions. y then has the padded shape, in y_layout (which must be x_layout unless x's two layouts are the same
  // memory); it may not overlap x. Empty: y has x's shape. The split path only (Path::Fused is refused).
  std::span<const int64_t> pad;
  PadMode pad_mode = PadMode::Constant;
  double pad_value = 0.0;  // the constant border, rounded to FP32 and then to y's dtype
  // An input bias (a convolution's bias handed over, so that it needs no pass of its own): C values of x's dtype, or
  // null. The tensor normalized is x + input_bias[c], each sum rounded to x's dtype (PyTorch's x + b.view(C, 1, ...)
  // in x's dtype), in the statistics and in the output alike; group_stats reads it too. It may not overlap y. The
  // split path only (Path::Fused is refused).
  const void* input_bias = nullptr;
};

// Caller-provided device memory for the statistics (at least workspace_size() bytes); empty: internal.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// A launch configuration. None of its values changes a bit of the output.
struct LaunchConfig {
  int elems_per_load = 16;   // elements per thread per step of the apply loops: 8, 16 or 32
  int warps = 8;             // warps per block: 1 to 32
  int stages = 1;            // chunks a warp holds in flight while computing statistics: 1 or 2
  int programs_per_sm = 4;   // blocks per multiprocessor in the grid: 1 to 64
  friend bool operator==(const LaunchConfig&, const LaunchConfig&) = default;
};

// Which kernels run: Fused (one launch; groups of at most 64 Ki elements and 256 channels), Split (three
// launches, any size), or Auto (the library's choice). Both give the same bits.
enum class Path { Auto, Fused, Split };

// How a call finds its launch configuration when none is given (see the README's "Tuning").
enum class TunePolicy {
  OnFirstUse = GNSILU_TUNE_ON_FIRST_USE,  // cached entry, else time the candidates once and remember the winner
  CachedOnly = GNSILU_TUNE_CACHED_ONLY,   // cached entry, else the default; never times anything
  Never = GNSILU_TUNE_NEVER,              // always the default configuration
};

struct LaunchOptions {
  std::optional<LaunchConfig> config;  // given: used as is (no lookup, no tuning)
  Path path = Path::Auto;
  std::optional<TunePolicy> tune;      // empty: the process's policy (set_tune_policy, GNSILU_TUNE)
};

// Computes y on `stream` (null: the legacy default stream) without synchronizing the host: silu(group_norm(x)),
// or group_norm(x) when problem.activation is Activation::None. group_norm is the same function.
GNSILU_API void group_norm_silu(const Problem& problem, gnsilu_stream stream = nullptr, Workspace workspace = {},
                                const LaunchOptions& options = {});
inline void group_norm(const Problem& problem, gnsilu_stream stream = nullptr, Workspace workspace = {},
                       const LaunchOptions& options = {}) {
  group_norm_silu(problem, stream, workspace, options);
}

// ---- statistics of regions, merged, then applied -------------------------------------------------------------
// A group's statistics are its exact sum and sum of squares (docs/EXACT_STATISTICS.md), held per (sample, group) in
// kStatsWords 64-bit integers. Records merge by adding them word by word (any order, any grouping: exact), so the
// statistics of the regions of any partition of a tensor (tiles, frames, the parts of other processes: an all-reduce
// SUM of int64), added together, are the whole tensor's: group_norm_apply(x, sum over regions of group_stats(region))
// equals group_norm_silu(x) bit for bit. Records as group_stats writes them may be added 2^31 times.
inline constexpr int kStatsWords = GNSILU_STATS_WORDS;

// Writes the statistics of region.x (its shape, num_groups, dtype, layout and input_bias; nothing else of `region` is
// read) to
// `stats`: shape[0] * num_groups records of kStatsWords int64 in device memory, sample-major. The region is a
// tensor of its own (a tile of a larger one must be made contiguous first); C and the groups are the whole
// tensor's. The default launch configuration (no tuning).
GNSILU_API void group_stats(const Problem& region, int64_t* stats, gnsilu_stream stream = nullptr,
                            Workspace workspace = {});
// y from x with the given statistics (N * num_groups records, device memory) instead of x's own: weight, bias, eps,
// activation and layouts as group_norm_silu. x may be any part of the tensor the statistics describe.
GNSILU_API void group_norm_apply(const Problem& problem, const int64_t* stats, gnsilu_stream stream = nullptr,
                                 Workspace workspace = {});

// Workspace bytes a call of this shape may need (the same for every dtype, layout and activation).
GNSILU_API std::size_t workspace_size(std::span<const int64_t> shape, int64_t num_groups);
GNSILU_API std::size_t workspace_size(const Problem& problem);

// The launch configurations the tuner times.
GNSILU_API std::span<const LaunchConfig> candidate_configs();

// The configuration used for a path when nothing better is known (Auto: the split path's).
GNSILU_API LaunchConfig default_config(Path path);

// Throws Error(NoDriver / NoDevice / UnsupportedDevice) unless a usable driver and device are present.
GNSILU_API void check_device();

// Frees the internal workspaces.
GNSILU_API void release_workspaces();

// The process's tuning policy (initially from GNSILU_TUNE: "on" (default), "cached" or "off").
GNSILU_API void set_tune_policy(TunePolicy policy);
GNSILU_API TunePolicy tune_policy();

// The cache files this process uses from now on: `user_path` (writable; "" keeps everything in memory) over
// read-only `shared_paths`. Replaces what GNSILU_CACHE and GNSILU_CACHE_SHARED said; configurations already
// resolved in this process stay.
GNSILU_API void set_cache_paths(const std::string& user_path, std::span<const std::string> shared_paths = {});

GNSILU_API const char* version();
GNSILU_API const char* dtype_name(DType dtype);
GNSILU_API const char* path_name(Path path);  // "auto", "fused", "split"
GNSILU_API const char* layout_name(Layout layout);  // "nchw" (channels-first, any rank), "nhwc" (channels-last)
GNSILU_API const char* activation_name(Activation activation);  // "silu", "none"
GNSILU_API std::size_t dtype_size(DType dtype);

}  // namespace gnsilu
