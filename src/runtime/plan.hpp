// From a validated problem to launches: the geometry of the tensor, the path (fused or split), grid sizes,
// the kernel parameter block and the workspace layout. Pure host logic: tested in CI without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "gnsilu/gnsilu.hpp"
#include "kernels/gnsilu_params.cuh"

namespace gnsilu::detail {

struct Geometry {
  int64_t n = 0;                   // batch
  int64_t c = 0;                   // channels
  int64_t s = 1;                   // spatial elements per channel (1 with no spatial dimension)
  int64_t g = 1;                   // groups per sample
  int64_t channels_per_group = 0;
  int64_t group_length = 0;        // channels_per_group * s
  int64_t groups_total = 0;        // n * g
  int64_t chunk_channels = 1;      // channels per chunk (gnsilu_math.cuh: chunk_channels)
  int64_t chunks_per_row = 1;      // chunks per channel
  int64_t chunks_per_group = 0;
  int64_t chunks_total = 0;
  int64_t numel = 0;
  // The layout the kernels see, x's and y's: the problem's, or ChannelsFirst where both layouts are the same memory
  // (s == 1 or c == 1; with a padded output, y's layout where y's two are not: add_padding).
  Layout layout = Layout::ChannelsFirst;
  // y: x's shape, or x's with a border (add_padding; pad.mode kPadNone: none), in `layout`.
  math::Padding pad{{1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1}, 1, math::kPadNone, 0.0f};
  int64_t y_numel = 0;
  bool biased = false;  // an input bias (Problem::input_bias): the split path only (fused_eligible)
  bool padded() const { return pad.mode != math::kPadNone; }
  bool full_chunks() const { return chunks_total * 1024 == numel; }  // every chunk holds 1024 elements
};

// Checks the shape and group count (throws Error(InvalidArgument) naming "shape", "ndim" or "num_groups").
Geometry make_geometry(std::span<const int64_t> shape, int64_t num_groups, Layout layout = Layout::ChannelsFirst);

// Adds a padded output (Problem::pad, pad_mode, pad_value) to a geometry made from `shape`: checks the widths
// (throws Error(InvalidArgument) naming "pad", "pad_count" or "pad_mode") and sets pad, y_numel and, where x's two
// layouts are one memory but the padded y's are not, the layout (y_layout). No widths: y is x's shape and pad.mode
// stays kPadNone.
void add_padding(Geometry& geometry, std::span<const int64_t> shape, std::span<const int64_t> pad, PadMode mode,
                 double value, Layout y_layout);

// Whether the one-launch kernel can take this geometry (a group's records and constants fit on chip: the limits
// of kernels/gnsilu_params.cuh).
bool fused_eligible(const Geometry& geometry);
// Throws Error(InvalidArgument) naming "options.path" when `requested` is Fused and the geometry is not eligible.
void check_path(const Geometry& geometry, Path requested);

// The kernels' parameter block for the geometry (shape fields only: pointers, eps and the plan's fields unset).
kernel::Params params_of(const Geometry& geometry);

// Bytes of workspace for the split path (0 when fused); workspace_bytes is the most any path needs.
std::size_t split_workspace_bytes(const Geometry& geometry);
inline std::size_t workspace_bytes(const Geometry& geometry) { return split_workspace_bytes(geometry); }

inline constexpr unsigned kPaddedThreads = 256;  // apply_padded's __launch_bounds__
inline constexpr int64_t kPaddedSliceChannels = 32 * kernel::kPadPerLane;  // channels-last apply_padded's slices

struct Plan {
  Path path = Path::Split;
  kernel::Params params{};
  unsigned threads = 0;           // per block (finalize: finalize_threads)
  unsigned finalize_threads = 256;
  unsigned stats_blocks = 0;
  unsigned stats_shared_bytes = 0;  // dynamic shared memory of chunk_stats (channels-last tiles)
  unsigned finalize_blocks = 0;
  unsigned apply_blocks = 0;
  unsigned fused_blocks = 0;
  unsigned padded_blocks = 0;     // apply_padded (in place of apply), kPaddedThreads threads a block
  std::size_t workspace = 0;      // bytes the plan needs
  std::size_t rows_offset = 0;    // where the per-row constants start in the workspace
  unsigned finalize_part_blocks = 0;  // finalize in parts (params.parts_per_group > 1): its first launch's blocks
                                      // (its only launch where finalize_atomic)
  bool finalize_atomic = false;   // the parts by one launch with atomics (kernel::kFinalizeAtomic; chunk_stats zeroes
                                  // params.zero_words words of the accumulators first)
  std::size_t parts_offset = 0;   // where the parts' records (or kFinalizeAtomic's accumulators) start in the workspace
};

// How finalize merges a group's chunk records: in `parts` parts of `chunks` records (the last may hold fewer), each
// merged by a block of its own before the part's block adds its record into the group's accumulator with integer
// atomics and the last to arrive rounds (`atomic`: one launch, kernel::kFinalizeAtomic), or before one block a group
// adds the parts' records (two launches; only where forced, below). The library's rule: parts of 256 records from 16384
// records a group in calls of at most 4 groups, else 1 part (the whole group). Exact integer additions: neither the
// parts nor the order of their arrival changes a bit.
struct FinalizeParts {
  int64_t parts = 1;
  int64_t chunks = 0;
  bool atomic = false;
};
FinalizeParts finalize_parts(const Geometry& geometry);

// The path a call takes: `requested` (which check_path accepted), or for Auto the library's choice (which depends on
// the geometry and the device, not on the launch configuration). The API checks the request before it looks for a
// device, decides once per call here and hands the decided path down (Call::path).
Path choose_path(const Geometry& geometry, Path requested, int sms);

// Where x and y lie, for the choice of vector widths (alignment only; 0 counts as aligned).
struct Addresses {
  std::uintptr_t x = 0;
  std::uintptr_t y = 0;
  std::size_t x_size = 2;  // element sizes
  std::size_t y_size = 2;
};

// The launches for `geometry` under `config` on a device with `sms` multiprocessors, on `path` as choose_path decided
// it (Fused or Split; anything else is Error(Internal)); `config` already passed check_config. Pointers in params are
// left null.
Plan make_plan(const Geometry& geometry, const LaunchConfig& config, Path path, int sms,
               const Addresses& addresses = {});

// Whether 16-byte vectors can be used: both pointers 16-byte aligned and vectors of 8 elements that stay in one
// row (channel-major: s % 8 == 0; channels-last: c % 8 == 0).
bool vectorizable(const Geometry& geometry, const Addresses& addresses);
inline bool vectorizable(const Geometry& geometry, const void* x, const void* y) {
  return vectorizable(geometry, Addresses{reinterpret_cast<std::uintptr_t>(x), reinterpret_cast<std::uintptr_t>(y)});
}

// Bytes per pixel of a channels-last statistics tile's slice (16, 32 or 64): tests and gnsilu-bench may force
// one; 0 restores the library's choice. Not thread-safe against concurrent calls.
void force_tile_slice_bytes(int bytes);
// Finalize in parts of 512 records by two launches for every group of at least `records` chunk records, whatever
// the call's number of groups (tests take the parts' boundaries on small tensors; gnsilu-bench times the rule); 0
// restores the library's rule.
void force_finalize_parts_from(int64_t records);
// The parts forced above take one launch with atomics (kernel::kFinalizeAtomic, parts of 256 records) instead of two
// launches, while `on` (tests take both ways on the GPU; gnsilu-bench times them); without forced parts it changes
// nothing (the library's rule takes atomics). Not thread-safe against concurrent calls.
void force_finalize_atomic(bool on);

}  // namespace gnsilu::detail
