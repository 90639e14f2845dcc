// gnsilu: the one parameter block every kernel takes, passed by value. Shared with the host launcher, so the
// layout is the same on both sides (plain 64-bit fields and pointers, LP64 on both).
#pragma once

#include "gnsilu_math.cuh"  // math::Padding

namespace gnsilu {
namespace kernel {

// What the one-launch (fused) kernel holds on chip for a group: its chunks' records and its channels' constants
// in shared memory. The host's fused_eligible (src/runtime/plan.cpp) and the kernel read these two alone.
inline constexpr int kFusedMaxChunks = 64;     // chunks of 1024 elements: groups of at most 64 Ki elements
inline constexpr int kFusedMaxChannels = 256;  // channels per group

// Channels-last apply_padded: a warp takes slices of 32 kPadPerLane channels (a lane's 8 are one 16-byte vector).
inline constexpr int kPadPerLane = 8;
// Channel-major apply_padded: the shared memory a block stages a tile of y in (math::padded_tiling's capacity is
// this over y's element size).
inline constexpr long long kPadTileBytes = 16384;

// finalize's stats_mode (Params::stats_mode).
inline constexpr int kStatsOwn = 0;
inline constexpr int kStatsWrite = 1;
inline constexpr int kStatsRead = 2;

// finalize's stage (Params::finalize_stage). A group of many chunk records is merged in parts by two launches of
// finalize: the first merges each part's records into an exact::Record (part_records: parts_per_group a group), the
// second adds a group's part records and goes on as a whole finalize would (integer additions: the same bits).
// Or by one launch (kFinalizeAtomic): each part's block adds its record into the group's accumulator in part_records
// with integer atomics (exact in any order of arrival), and the block that arrives last for its group goes on from
// the accumulated record as a whole finalize would. part_records then holds groups_total accumulators (exact::Record)
// and after them groups_total 32-bit arrival counters, all zero when finalize starts: chunk_stats zeroes them
// (Params::zero_words).
inline constexpr int kFinalizeWhole = 0;
inline constexpr int kFinalizeParts = 1;
inline constexpr int kFinalizeMerge = 2;
inline constexpr int kFinalizeAtomic = 3;

struct Params {
  const void* x;          // (N, C, S) channel-major or (N, S, C) channels-last, contiguous, dtype XT
  void* y;                // same shape and layout, dtype YT; may equal x when the element sizes match
  const void* weight;     // C values of weight_dtype, or null
  const void* bias;       // C values of bias_dtype, or null
  const void* input_bias;  // C values of XT added to x before everything (math::add_in), or null
  void* records;          // split path: ChunkRecord per chunk (groups * chunks_per_group)
  void* rows;             // split path: RowConstants per (n, c)
  void* group_stats;      // stats_mode 1: written, 2: read; exact::Record (32 int64) per (n, group)
  void* part_records;     // finalize in parts: exact::Record per (group, part), parts_per_group a group
  long long n;            // batch
  long long c;            // channels
  long long g;            // groups per sample
  long long s;            // spatial elements per channel
  long long channels_per_group;
  long long group_length;       // channels_per_group * s
  long long groups_total;       // n * g
  long long chunks_per_group;   // gnsilu_math.cuh: chunks_per_group(s, channels_per_group)
  long long chunks_total;       // groups_total * chunks_per_group
  long long parts_per_group;    // finalize in parts: parts a group's records are merged in (1: one block a group)
  long long part_chunks;        //   chunk records a part (the last part may hold fewer)
  long long zero_words;         // chunk_stats: 64-bit words of part_records it sets to zero (kFinalizeAtomic's), or 0
  long long chunk_channels;     // channels per chunk (1 when s > 512)
  long long chunks_per_row;     // chunks per channel (1 when s <= 512)
  // apply, channel-major: each row of s elements in spans of span_length
  long long spans_per_row;
  long long span_length;
  long long tiles_total;        // n * c * spans_per_row
  // channels-last statistics: tiles of (sample, window of 1024 pixels, slice of channels); 0 items: one warp
  // per chunk, gathered element by element
  long long cl_stats_items;
  long long cl_slices;          // slices per pixel
  // channels-last apply: items of (sample, block of pixels, slice of columns); a column is 8 channels
  // (vectorized) or one
  long long cl_apply_items;
  long long cl_columns;         // columns per pixel
  long long cl_column_slices;   // slices of cl_tx columns
  long long cl_block_pixels;    // pixels per item
  long long cl_blocks_per_sample;
  double eps;
  int weight_dtype;
  int bias_dtype;
  int vectorized;        // 16-byte loads and stores: x and y 16-byte aligned, and s % 8 == 0 (channel-major) or
                         // c % 8 == 0 (channels-last)
  int full_chunks;       // every chunk holds 1024 elements (chunk k of the tensor starts at element 1024 k in NCHW)
  int cl_slice_vectors;  // channels-last statistics tiles: 16-byte vectors per pixel of a slice (1, 2 or 4)
  int cl_tx;             // channels-last apply: threads across columns,
  int cl_ty;             //   and along pixels (cl_tx * cl_ty <= threads per block)
  int cl_fused_width;    // channels-last fused kernel: channels per vector (8, 4 or 1)
  math::Padding pad;     // apply_padded: y's border (mode kPadNone: y has x's shape, apply_padded is not launched)
  int pad_vectors;       // channel-major apply_padded: x and y 16-byte aligned (16-byte pieces of x, y in 16-byte
                         // vectors)
  int stats_mode;        // finalize: 0 the group's statistics from its chunk records, into row constants; 1 the same
                         // statistics written to group_stats instead (no rows); 2 rows from group_stats (no records)
  int finalize_stage;    // finalize: kFinalizeWhole, kFinalizeParts, kFinalizeMerge or kFinalizeAtomic (above)
};

}  // namespace kernel
}  // namespace gnsilu
