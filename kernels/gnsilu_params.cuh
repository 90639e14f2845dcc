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
  // streamed path (one persistent launch): work items in ticket order (group_norm_silu.cu, streamed)
  void* counters;               // u64 ticket, then u32 arrivals[groups_total], u32 ready[groups_total]; zeroed
  long long ahead;              // groups whose statistics run ahead of the first apply
  long long stats_item_chunks;  // chunks per statistics item
  long long stats_items_per_group;
  long long apply_items_per_group;  // channels_per_group * spans_per_row
  long long items_total;            // groups_total * (stats_items_per_group + apply_items_per_group)
  unsigned long long* trace;  // EXPERIMENT
  double eps;
  int weight_dtype;
  int bias_dtype;
  int vectorized;  // x and y 16-byte aligned and s % 8 == 0: 16-byte loads and stores
  int reserved;
};

// The streamed path's work item of ticket t: the statistics items of groups 0 .. ahead - 1, then for each group
// g its apply items followed by the statistics items of group g + ahead (while there is one). Every item with
// a ticket below items_total is one of the groups' items, each exactly once, and a group's statistics items
// come before its apply items.
struct Item {
  long long group;
  long long index;  // among the group's statistics items or its apply items
  bool stats;
};

#if defined(__CUDACC__)
__host__ __device__ __forceinline__
#else
inline
#endif
Item item_of(const Params& p, long long t) {
  const long long ns = p.stats_items_per_group;
  const long long na = p.apply_items_per_group;
  const long long ahead = p.ahead;
  if (t < ahead * ns) return {t / ns, t % ns, true};
  t -= ahead * ns;
  const long long period = na + ns;
  const long long periods = p.groups_total - ahead;  // groups followed by another group's statistics
  if (t < periods * period) {
    const long long g = t / period;
    const long long r = t - g * period;
    return r < na ? Item{g, r, false} : Item{g + ahead, r - na, true};
  }
  t -= periods * period;
  return {periods + t / na, t % na, false};
}

}  // namespace kernel
}  // namespace gnsilu
