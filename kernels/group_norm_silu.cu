// gnsilu: the GroupNorm(+SiLU) kernels, compiled at run time by NVRTC for the device's exact architecture.
//
// Two paths compute the same bits (gnsilu_math.cuh defines the arithmetic, gnsilu_exact.cuh the exact statistics), in
// two memory layouts that also give the same bits: channel-major (NCHW, NCDHW, ...) and channels-last (NHWC, ...). A
// variant is compiled for one layout (LAYOUT) and one activation (ACT: SiLU or none).
//
//   split (three launches, any size; from sm_90 the second and third overlap the drain of the one before):
//     chunk_stats  NCHW: one warp per chunk: loads the chunk into registers (4 x 16-byte vectors per lane),
//                  finds its largest |x|, then its exact sum and sum of squares as integers on one or two
//                  grids set by that largest value (reduce_chunk). Writes a 32-byte record per chunk. When
//                  every chunk is full (S a multiple of 1024, ...) it takes a path with no division of the
//                  chunk index and no per-element mask; otherwise full chunks still skip the masks.
//                  NHWC: a block per tile of (sample, window of 1024 pixels, slice of 16 to 64 bytes of
//                  channels): the tile is read with 16-byte loads, transposed into shared memory so that each
//                  channel's window (one chunk: chunks never straddle a channel) lies as in NCHW, and the
//                  warps reduce those chunks exactly as the NCHW kernel does. Shapes the tiles cannot take
//                  (S <= 512, C not a multiple of 16 bytes, unaligned x) gather chunks element by element.
//     finalize     one block per group: adds the group's records exactly (128-bit sums per thread, each
//                  thread's loads issued ahead of its additions, then per warp, then the warps' sums in warp
//                  0), rounds the mean and variance once, writes per-(n, c) constants. The same kernel for
//                  both layouts. Calls of few groups of many records (plan.cpp: finalize_parts): two
//                  launches, one block per part of a group's records, then one block per group adding its
//                  parts' records; or one launch whose part blocks add their records into the group's
//                  accumulator with integer atomics, the last to arrive rounding (kFinalizeAtomic).
//     apply        NCHW: tiles of (row, span): y = silu(fma(fma(x, u, -z), k, c)), 16-byte loads and stores;
//                  for 16-bit outputs SiLU is estimated with MUFU and silu32 runs only where the estimate
//                  cannot decide the rounding (gnsilu_math.cuh). NHWC: items of (sample, block of pixels,
//                  slice of columns of 8 channels); each thread keeps one column's 8 sets of constants in
//                  registers and walks pixels with 16-byte loads and stores.
//     Bytes moved: x twice and y once (6 per element in 16-bit), plus 32 bytes per 1024 elements of records.
//
//   fused (one launch, groups of at most 64 chunks and 256 channels):
//     one block per group: its warps compute the chunk records into shared memory, the block merges them,
//     then the block applies the group; the second read of x mostly hits L2 (the group was just read). In
//     NHWC the chunks are gathered element by element (the group's channels are a few bytes of each pixel)
//     and the apply walks the group's pixels with vectors of 8, 4 or 1 of its channels.
//
// Launch constants are template parameters: WARPS (warps per block), EPL (elements per thread per step of the
// apply loops: 8, 16 or 32), STAGES (chunks a warp holds in flight in chunk_stats: 2 loads the next chunk
// while reducing the current one; NCHW only). BIAS (chunk_stats and apply): the instance that adds Params::input_bias
// to x as it reads it. The statistics are exact sums, so no cut of a group and no order of
// additions changes a bit of the output.
//
// This file holds the `__global__` kernels and what the host launches them with; their parts, in the order each
// includes the one before (all compiled as one program by NVRTC, embedded by cmake/embed_kernels.cmake):
//   gnsilu_math.cuh     the arithmetic, host and device (16-bit conversions, SiLU, padding geometry, constants)
//   gnsilu_params.cuh   the parameter block (Params), host and device
//   gnsilu_exact.cuh    exact statistics: records that merge by adding integers
//   gnsilu_vectors.cuh  raw 16-byte vectors and warp butterflies
//   gnsilu_chunks.cuh   a chunk in a warp's registers: its loads, the input bias, its exact sums
//   gnsilu_loops.cuh    group statistics merged, channel constants, the apply loops, chunk_stats' walk
//   gnsilu_tiles.cuh    channels-last statistics through shared-memory tiles
//   gnsilu_padded.cuh   the padded output's apply loops
#include "gnsilu_loops.cuh"
#include "gnsilu_padded.cuh"
#include "gnsilu_tiles.cuh"

namespace gnsilu {
namespace kernel {

// Blocks per multiprocessor the compiler must allow: at least 512 threads, so at most 128 registers a thread.
// Without it, ptxas for some architectures (sm_120) picks a 64-register cap and spills.
template <int WARPS>
inline constexpr int kMinBlocks = WARPS >= 16 ? 1 : 16 / WARPS;
// chunk_stats of 16-bit x in channel-major layout without an input bias, one chunk in flight a warp (STAGES 1): 1024
// threads a multiprocessor, so at most 64 registers, twice the warps of STAGES 2's 128: the tuner's s1 and s2
// candidates then differ in how latency is hidden (more warps, or two chunks a warp), where STAGES 1 held 128
// registers too. FP32 x, the input bias (sm_100, sm_120) and channels-last tiles spill at 64: those keep 128.
template <int XT, int WARPS, int STAGES, int LAYOUT, int BIAS>
inline constexpr int kMinBlocksStats = STAGES == 1 && LAYOUT == kChannelsFirst && XT != kFP32 && BIAS == 0
                                           ? (WARPS >= 32 ? 1 : 32 / WARPS)
                                           : kMinBlocks<WARPS>;
// The fused kernel holds a chunk and the SiLU at once: at least 256 threads (up to 255 registers a thread).
template <int WARPS>
inline constexpr int kMinBlocksFused = WARPS >= 8 ? 1 : 8 / WARPS;

// ---- the kernels -------------------------------------------------------------------------------------------
// Programmatic dependent launch (sm_90 and later; no-ops before): the host launches finalize and apply with
// programmatic stream serialization, so their blocks may be resident before the kernel ahead of them has
// finished. wait_for_previous_kernel returns once that kernel has completed and its writes are visible (at
// once for a plain launch); allow_next_kernel lets the next kernel's blocks be scheduled as this one's drain.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <int XT, int WARPS, int STAGES, int LAYOUT, bool BIAS>
__device__ __forceinline__ void chunk_stats_body(const Params& p) {
  if constexpr (LAYOUT == kChannelsLast) {
    // Gathering needs more registers than holding two chunks leaves (and is the rare case): one chunk at a time.
    if (p.cl_stats_items > 0)
      chunk_stats_tiles<XT, WARPS, BIAS>(p);
    else
      chunk_stats_warp<XT, WARPS, 1, kLoadGathered, BIAS>(p);
  } else {
    // With a bias, one chunk at a time: the bias's code beside two chunks' registers left a stack frame on sm_75
    // and sm_80 (FP32 x, 16 warps).
    constexpr int kStages = BIAS ? 1 : STAGES;
    if (p.vectorized && p.full_chunks)
      chunk_stats_warp<XT, WARPS, kStages, kLoadFull, BIAS>(p);
    else
      chunk_stats_warp<XT, WARPS, kStages, kLoadRun, BIAS>(p);
  }
}

// BIAS: the instance for calls with an input bias (the host launches it where Params::input_bias is not null).
template <int XT, int WARPS, int STAGES, int LAYOUT, int BIAS>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocksStats<XT, WARPS, STAGES, LAYOUT, BIAS>)
    chunk_stats(const Params p) {
  static_assert(WARPS >= 1 && WARPS <= 32, "WARPS");
  static_assert(STAGES == 1 || STAGES == 2, "STAGES");
  static_assert(LAYOUT == kChannelsFirst || LAYOUT == kChannelsLast, "LAYOUT");
  static_assert(BIAS == 0 || BIAS == 1, "BIAS");
  allow_next_kernel();
  // finalize's accumulators and arrival counters (kFinalizeAtomic), zeroed for it: finalize reads them only once this
  // kernel has completed, and every call zeroes them again, so no earlier call or failed launch leaves them dirty.
  if (p.zero_words != 0) {
    i64* const words = static_cast<i64*>(p.part_records);
    const i64 threads = static_cast<i64>(gridDim.x) * (WARPS * 32);
    for (i64 i = blockIdx.x * static_cast<i64>(WARPS * 32) + threadIdx.x; i < p.zero_words; i += threads) words[i] = 0;
  }
  chunk_stats_body<XT, WARPS, STAGES, LAYOUT, BIAS == 1>(p);
}

// One block of 256 threads per group (a grid-stride loop over the groups): the group's chunk records merged
// exactly (merged_group_stats), then its channels' constants. Groups of many records are merged in parts
// (Params::finalize_stage): by two launches, kFinalizeParts taking one block per (group, part) that writes the part's
// record and kFinalizeMerge one block per group that adds its parts' records and goes on as kFinalizeWhole; or by one
// launch, kFinalizeAtomic, whose block per (group, part) adds the part's record into the group's accumulator with
// integer atomics, the last to arrive going on from the accumulated record. One call of merged_group_stats serves
// every stage and step (its big-integer path inlined once).
template <int XT, int LAYOUT>
// One block a multiprocessor at least (kPartials, 1): without it, NVRTC for sm_100, sm_103 and sm_110 gave this kernel
// 64 registers and an 8-byte stack once its fallback read x with the input bias.
__global__ void __launch_bounds__(kPartials, 1) finalize(const Params p) {
  __shared__ MergeShared sh;
  __shared__ i64 part[exact::kRecordWords];  // kFinalizeAtomic: the part's record, then the group's
  __shared__ int last;                       // kFinalizeAtomic: this block is the group's last part to arrive
  allow_next_kernel();
  wait_for_previous_kernel();
  const i64 count = p.chunks_per_group;
  i64* const given = static_cast<i64*>(p.group_stats);
  i64* const parts = static_cast<i64*>(p.part_records);
  const bool atomic = p.finalize_stage == kFinalizeAtomic;
  const bool in_parts = p.finalize_stage == kFinalizeParts || atomic;
  const bool from_parts = p.finalize_stage == kFinalizeMerge;
  const i64 per_group = in_parts ? p.parts_per_group : 1;
  const i64 items = p.groups_total * per_group;
  const int t = static_cast<int>(threadIdx.x);
  for (i64 item = blockIdx.x; item < items; item += gridDim.x) {
    const i64 group = in_parts ? item / per_group : item;
    const i64 first = in_parts ? (item - group * per_group) * p.part_chunks : 0;
    const i64 n = in_parts ? (p.part_chunks < count - first ? p.part_chunks : count - first) : count;
    const exact::ChunkRecord* records = static_cast<const exact::ChunkRecord*>(p.records) + group * count + first;
    const i64 sample = group / p.g;
    const i64 first_channel = (group - sample * p.g) * p.channels_per_group;
    // Step 0 merges this block's records; step 1 (kFinalizeAtomic, the group's last part to arrive) rounds the
    // group's accumulated record.
    for (int step = 0; step < 2; ++step) {
      const bool whole = !in_parts || step == 1;  // the group's statistics (or record) are this step's result
      const bool constants = whole && p.stats_mode != kStatsWrite;
      // The thread's first channel's weight and bias, loaded now so that their latency passes during the merge.
      const i64 k0 = t;
      const bool has_k0 = constants && k0 < p.channels_per_group;
      const double weight0 = has_k0 ? load_parameter(p.weight, p.weight_dtype, first_channel + k0, 1.0) : 1.0;
      const double bias0 = has_k0 ? load_parameter(p.bias, p.bias_dtype, first_channel + k0, 0.0) : 0.0;
      // Out: a part's record, or the caller's (kStatsWrite). In: the caller's record (kStatsRead: statistics of merged
      // regions), the group's parts, or its accumulated record (step 1).
      i64* const record_out = !whole                      ? (atomic ? part : parts + item * exact::kRecordWords)
                              : p.stats_mode == kStatsWrite ? given + group * exact::kRecordWords
                                                          : nullptr;
      const i64* const record_in = p.stats_mode == kStatsRead ? given + group * exact::kRecordWords
                                   : from_parts ? parts + group * p.parts_per_group * exact::kRecordWords
                                   : step == 1  ? part
                                                : nullptr;
      const GroupStats s = merged_group_stats<XT, LAYOUT, kPartials, 3>(
          p, group, step == 1 ? 0 : n, [&](i64 j) { return records[j]; }, sh, record_out, record_in,
          from_parts && p.stats_mode != kStatsRead ? p.parts_per_group : 1, first);
      if (atomic && step == 0) {
        // The part's normalized record (in `part` for every thread now) into the group's accumulator: integer
        // additions, so the sum does not depend on the order in which the parts arrive; 2^31 normalized records may
        // be added before a limb could overflow, and a group has at most a few hundred parts.
        unsigned long long* const acc =
            reinterpret_cast<unsigned long long*>(parts + group * exact::kRecordWords);
        if (t < exact::kRecordWords) {
          if (part[t] != 0) atomicAdd(acc + t, static_cast<unsigned long long>(part[t]));
          __threadfence();  // the additions reach the device before the arrival is counted
        }
        __syncthreads();
        if (t == 0) {
          unsigned* const arrivals = reinterpret_cast<unsigned*>(parts + p.groups_total * exact::kRecordWords);
          last = atomicAdd(arrivals + group, 1u) + 1u == static_cast<unsigned>(p.parts_per_group) ? 1 : 0;
        }
        __syncthreads();
        if (last == 0) break;  // `last` is read by every thread before thread 0 may write it again
        __threadfence();
        // The accumulated record, read through the device's atomics (never a cached copy).
        if (t < exact::kRecordWords) part[t] = static_cast<i64>(atomicAdd(acc + t, 0ull));
        __syncthreads();
        continue;
      }
      if (constants) {
        RowConstants* rows = static_cast<RowConstants*>(p.rows);
        if (has_k0) rows[sample * p.c + first_channel + k0] = row_constants(s, weight0, bias0);
        for (i64 k = k0 + kPartials; k < p.channels_per_group; k += kPartials) {
          rows[sample * p.c + first_channel + k] = channel_constants(p, s, first_channel + k);
        }
      }
      break;
    }
  }
}

template <int XT, int YT, int WARPS, int EPL, int LAYOUT, int ACT, bool BIAS>
__device__ __forceinline__ void apply_body(const Params& p) {
  if constexpr (LAYOUT == kChannelsLast) {
    apply_channels_last<XT, YT, ACT, EPL, BIAS>(p);
  } else {
    const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
    for (i64 t = blockIdx.x; t < p.tiles_total; t += gridDim.x) {
      const i64 row = t / p.spans_per_row;
      const i64 span = t - row * p.spans_per_row;
      const RowConstants rc = rows[row];
      const i64 begin = span * p.span_length;
      const i64 end = begin + p.span_length < p.s ? begin + p.span_length : p.s;
      apply_row<XT, YT, ACT, WARPS * 32, EPL, BIAS>(p, row * p.s + begin, row * p.s + end, rc, row, threadIdx.x);
    }
  }
}

// BIAS: as chunk_stats'.
template <int XT, int YT, int WARPS, int EPL, int LAYOUT, int ACT, int BIAS>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) apply(const Params p) {
  static_assert(EPL == 8 || EPL == 16 || EPL == 32, "EPL");
  static_assert(LAYOUT == kChannelsFirst || LAYOUT == kChannelsLast, "LAYOUT");
  static_assert(BIAS == 0 || BIAS == 1, "BIAS");
  wait_for_previous_kernel();
  apply_body<XT, YT, WARPS, EPL, LAYOUT, ACT, BIAS == 1>(p);
}

template <int XT, int YT, int LAYOUT, int ACT>
__global__ void __launch_bounds__(256, 2) apply_padded(const Params p) {
  static_assert(LAYOUT == kChannelsFirst || LAYOUT == kChannelsLast, "LAYOUT");
  wait_for_previous_kernel();
  if constexpr (LAYOUT == kChannelsFirst)
    apply_padded_channels_first<XT, YT, ACT>(p);
  else
    apply_padded_channels_last<XT, YT, ACT>(p);
}

template <int XT, int YT, int WARPS, int EPL, int LAYOUT, int ACT>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocksFused<WARPS>) fused(const Params p) {
  static_assert(LAYOUT == kChannelsFirst || LAYOUT == kChannelsLast, "LAYOUT");
  constexpr int kThreads = WARPS * 32;
  constexpr int kVecs = vectors_per_step<XT, EPL, true>();
  __shared__ exact::ChunkRecord records[kFusedMaxChunks];
  __shared__ RowConstants rows[kFusedMaxChannels];
  __shared__ MergeShared merge;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32;
  const int chunks = static_cast<int>(p.chunks_per_group);
  const int channels = static_cast<int>(p.channels_per_group);
  const int length = static_cast<int>(p.group_length);  // <= 64 * 1024
  const unsigned s = static_cast<unsigned>(p.s);
  for (i64 group = blockIdx.x; group < p.groups_total; group += gridDim.x) {
    for (int j = warp; j < chunks; j += WARPS) {
      ChunkData<XT> c;
      if constexpr (LAYOUT == kChannelsLast)
        load_gathered_chunk<XT, false>(p, group * chunks + j, lane, c);
      else
        load_chunk<XT, false>(p, group * chunks + j, lane, c);
      const exact::ChunkRecord r = reduce_chunk<XT>(c, lane);
      if (lane == 0) records[j] = r;
    }
    __syncthreads();
    const GroupStats stats = merged_group_stats<XT, LAYOUT, kThreads>(
        p, group, chunks, [&](i64 j) { return records[j]; }, merge);
    const i64 sample = group / p.g;
    const i64 first_channel = (group - sample * p.g) * p.channels_per_group;
    for (int k = threadIdx.x; k < channels; k += kThreads) rows[k] = channel_constants(p, stats, first_channel + k);
    __syncthreads();
    if constexpr (LAYOUT == kChannelsLast) {
      if (p.cl_fused_width == 8)
        fused_apply_channels_last<XT, YT, ACT, kThreads, EPL, 8>(p, rows, sample, first_channel);
      else if (p.cl_fused_width == 4)
        fused_apply_channels_last<XT, YT, ACT, kThreads, EPL, 4>(p, rows, sample, first_channel);
      else
        fused_apply_channels_last<XT, YT, ACT, kThreads, EPL, 1>(p, rows, sample, first_channel);
    } else {
      const i64 base = group * p.group_length;
      if (p.vectorized) {
        for (int i = threadIdx.x * kVec; i < length; i += kThreads * kVec * kVecs) {
          float v[kVecs][kVec];
#pragma unroll
          for (int q = 0; q < kVecs; ++q) {
            const int at = i + q * kThreads * kVec;
            if (at < length) load_vector<XT>(p.x, base + at, v[q]);
          }
#pragma unroll
          for (int q = 0; q < kVecs; ++q) {
            const int at = i + q * kThreads * kVec;
            if (at < length) {
              const RowConstants rc = rows[static_cast<unsigned>(at) / s];
              const auto same = [&](int) { return rc; };
              transform_values<YT, ACT, false>(v[q], same, [](int) { return 0.0f; });  // x stays in v[q]
              store_vector<YT>(p.y, base + at, v[q]);
            }
          }
        }
      } else {
        for (int i = threadIdx.x; i < length; i += kThreads) {
          const RowConstants rc = rows[static_cast<unsigned>(i) / s];
          store_element<YT>(p.y, base + i, transform<ACT>(load_element<XT>(p.x, base + i), rc));
        }
      }
    }
    __syncthreads();  // the shared records and constants are rewritten for the next group
  }
}

}  // namespace kernel
}  // namespace gnsilu
