// gnsilu: the one parameter block every kernel takes, passed by value. Shared with the host launcher, so the
// layout is the same on both sides (plain 64-bit fields and pointers, LP64 on both).
#pragma once

namespace gnsilu {
namespace kernel {

struct Params {
  const void* x;          // (N, C, S) contiguous, dtype XT
  void* y;                // same shape, dtype YT; may equal x when the element sizes match
  const void* weight;     // C values of weight_dtype, or null
  const void* bias;       // C values of bias_dtype, or null
  void* records;          // split path: ChunkRecord per chunk (groups * chunks_per_group)
  void* rows;             // split path: RowConstants per (n, c)
  long long n;            // batch
  long long c;            // channels
  long long g;            // groups per sample
  long long s;            // spatial elements per channel
  long long channels_per_group;
  long long group_length;       // channels_per_group * s
  long long groups_total;       // n * g
  long long chunks_per_group;   // ceil(group_length / kChunk)
  long long chunks_total;       // groups_total * chunks_per_group
  long long spans_per_row;      // apply tiling: each row of s elements in spans of span_length
  long long span_length;
  long long tiles_total;        // n * c * spans_per_row
  double eps;
  int weight_dtype;
  int bias_dtype;
  int vectorized;  // x and y 16-byte aligned and s % 8 == 0: 16-byte loads and stores
  int reserved;
};

}  // namespace kernel
}  // namespace gnsilu
