// gnsilu kernels: the loops inside the kernels: a group's chunk records merged exactly and its channels'
// constants, the apply loops (channel-major rows, channels-last pixels, the fused kernel's group), and a warp's
// walk over its chunks in chunk_stats. A part of group_norm_silu.cu, compiled with it by NVRTC at run time.
#pragma once

#include "gnsilu_chunks.cuh"

namespace gnsilu {
namespace kernel {

// ---- a group's statistics: its chunk records merged exactly ---------------------------------------------------
// Where element (sample, channel, pixel) of x lies in the layout.
template <int LAYOUT>
__device__ __forceinline__ i64 element_offset(const Params& p, i64 sample, i64 channel, i64 pixel) {
  if constexpr (LAYOUT == kChannelsLast)
    return (sample * p.s + pixel) * p.c + channel;
  else
    return (sample * p.c + channel) * p.s + pixel;
}

// A warp's combined sums (warp_combine), for the block's thread 0 to merge.
struct WarpSums {
  exact::Wide s1, s2;
  i64 weight, count, nonfinite;
  int e, top;
};
inline constexpr int kMaxMergeWarps = 32;

// Combined sums back in an accumulator (to be combined again, or rounded): a warp's or a block's.
__device__ __forceinline__ exact::Accumulator accumulator_of(const WarpSums& ws) {
  exact::Accumulator a;
  exact::acc_clear(a);
  a.count = ws.count;
  a.nonfinite = ws.nonfinite;
  if (ws.weight != 0) {
    a.s1 = ws.s1;
    a.s2 = ws.s2;
    a.e = ws.e;
    a.top = ws.top;
    a.weight = ws.weight;
  }
  return a;
}

struct MergeShared {
  exact::Record total;  // sums that did not stay in registers (rare), and the slow path's record
  exact::Scratch scratch;
  WarpSums warp[kMaxMergeWarps];
  WarpSums block;  // the warps' sums combined (warp 0)
  int escaped;
  int spilled;  // something was added to `total`
  GroupStats stats;
};

// Additions into the block's shared record, with 64-bit integer atomics: exact, so the order of the threads changes
// no bit.
struct SharedWord {
  unsigned long long* word;
  __device__ void operator()(int, i64 d) const { atomicAdd(word, static_cast<unsigned long long>(d)); }
};
struct SharedLimbs {
  unsigned long long* limb;
  __device__ void operator()(int k, i64 d) const { atomicAdd(limb + k, static_cast<unsigned long long>(d)); }
};
__device__ __forceinline__ exact::Sink<SharedWord, SharedLimbs, SharedLimbs> shared_sink(exact::Record& r) {
  return {SharedWord{reinterpret_cast<unsigned long long*>(&r.count)},
          SharedWord{reinterpret_cast<unsigned long long*>(&r.nonfinite)},
          SharedLimbs{reinterpret_cast<unsigned long long*>(r.sum)},
          SharedLimbs{reinterpret_cast<unsigned long long*>(r.squares)}};
}

// A warp's running sums combined into one (in every lane), then written to the warp's slot by lane 0. Lanes whose sums
// do not fit a common unit (gnsilu_exact.cuh: acc_fits; rare) add their own to the block's record instead. The warp
// is reconverged first: its lanes may arrive from a loop over records that some of them left early (a group whose
// records do not fill whole warps), and a diverged warp runs every full-mask shuffle below on the compiler's collective
// fallback (WARPSYNC.COLLECTIVE), 240-300 cycles each: clock64 probes measured 19,000 cycles for one such warp's
// combine (60-80 shuffles) in finalize at 2x320x96x96 (90 records a group), half of that kernel's time.
__device__ __forceinline__ int warp_min(int v) {
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) {
    const int o = __shfl_xor_sync(0xFFFFFFFFu, v, h);
    v = o < v ? o : v;
  }
  return v;
}
__device__ __forceinline__ exact::Wide warp_sum_wide(exact::Wide v) {
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) {
    const exact::Wide o{__shfl_xor_sync(0xFFFFFFFFu, v.lo, h), __shfl_xor_sync(0xFFFFFFFFu, v.hi, h)};
    v = exact::wide_add(v, o);
  }
  return v;
}
template <typename S>
__device__ __forceinline__ void warp_combine(exact::Accumulator& acc, const S& sink, WarpSums& slot, int& spilled,
                                             int lane) {
  __syncwarp();
  const bool any = acc.weight != 0;
  const int e = warp_min(any ? acc.e : 1 << 20);
  const int top = warp_max(any ? acc.top : -(1 << 20));
  const i64 weight = warp_sum_i64(acc.weight);
  const i64 count = warp_sum_i64(acc.count);
  const i64 nonfinite = warp_sum_i64(acc.nonfinite);
  exact::Wide s1{0, 0}, s2{0, 0};
  i64 kept = 0;
  if (weight != 0 && exact::acc_fits(top, e, weight)) {
    s1 = warp_sum_wide(any ? exact::wide_shl(acc.s1, acc.e - e) : exact::Wide{0, 0});
    s2 = warp_sum_wide(any ? exact::wide_shl(acc.s2, 2 * (acc.e - e)) : exact::Wide{0, 0});
    kept = weight;
  } else if (weight != 0) {
    exact::acc_flush_sums(acc, sink);  // each lane its own
    spilled = 1;                       // every writer writes 1
  }
  if (lane == 0) slot = WarpSums{s1, s2, kept, count, nonfinite, e, top};
  exact::acc_clear(acc);
}

// Group `group`'s statistics from its `count` chunk records (record_at(j): record j), by a block of THREADS threads:
// each sums its share of the records in registers (exact::Accumulator), each warp combines its threads' sums, and warp
// 0 the warps'; sums that do not fit one unit go to the block's shared record instead, and so do the elements of
// escaped chunks (gnsilu_exact.cuh), read from x. Every thread returns the result. AHEAD: records a thread loads ahead
// of its additions (finalize, whose records are in global memory; 0 where they are in shared memory).
//
// record_out: the merged record is wanted, not the statistics (finalize's kStatsWrite, and its parts): it is written
// there, normalized, and the returned statistics are not computed. record_in: the record is given (kStatsRead), or the
// sum of `records_in` consecutive records (a group's parts): no chunk is read, and the statistics are rounded from it.
// One call of exact::group_stats serves both, so that the big-integer path is inlined once per kernel (twice made
// finalize spill on sm_90 and newer). first_chunk: the group's chunk that record_at(0) belongs to (a part's first).
template <int XT, int LAYOUT, int THREADS, int AHEAD = 0, typename RecordAt>
__device__ __forceinline__ GroupStats merged_group_stats(const Params& p, i64 group, i64 count, RecordAt record_at,
                                                         MergeShared& sh, i64* record_out = nullptr,
                                                         const i64* record_in = nullptr, i64 records_in = 1,
                                                         i64 first_chunk = 0) {
  static_assert(THREADS % 32 == 0 && THREADS / 32 <= kMaxMergeWarps, "whole warps, at most kMaxMergeWarps");
  constexpr int kWarps = THREADS / 32;
  const int t = static_cast<int>(threadIdx.x);
  const int lane = t & 31;
  const int warp = t >> 5;
  // Normalized records (as finalize writes them) may be added 2^31 times before a limb could overflow.
  for (int i = t; i < exact::kRecordWords; i += THREADS) {
    i64 word = 0;
    if (record_in != nullptr)
      for (i64 q = 0; q < records_in; ++q) word += record_in[q * exact::kRecordWords + i];
    (&sh.total.count)[i] = word;
  }
  if (t == 0) sh.escaped = sh.spilled = 0;
  if (record_in != nullptr) count = 0;  // no chunk to read
  __syncthreads();
  const auto sink = shared_sink(sh.total);
  exact::Accumulator acc;
  exact::acc_clear(acc);
  bool escaped = false;
  if constexpr (AHEAD == 0) {
    for (i64 j = t; j < count; j += THREADS) escaped |= !exact::acc_add_chunk(acc, record_at(j), sink);
  } else {
    // Records t, t + THREADS, ...; each load issued AHEAD records before its addition, so that a thread with many
    // records waits for one memory latency rather than one a record (the additions stay in one copy of the code).
    exact::ChunkRecord ahead[AHEAD];
#pragma unroll
    for (int q = 0; q < AHEAD; ++q) {
      const i64 j = t + static_cast<i64>(q) * THREADS;
      if (j < count) ahead[q] = record_at(j);
    }
    for (i64 j = t; j < count; j += THREADS) {
      const exact::ChunkRecord r = ahead[0];
#pragma unroll
      for (int q = 0; q + 1 < AHEAD; ++q) ahead[q] = ahead[q + 1];
      const i64 next = j + static_cast<i64>(AHEAD) * THREADS;
      if (next < count) ahead[AHEAD - 1] = record_at(next);
      escaped |= !exact::acc_add_chunk(acc, r, sink);
    }
  }
  warp_combine(acc, sink, sh.warp[warp], sh.spilled, lane);
  if (escaped) sh.escaped = 1;  // every writer writes 1
  __syncthreads();
  if (sh.escaped != 0) {
    // Rare: chunks with an element on neither level, summed element by element into the block's record.
    const i64 sample = group / p.g;
    const i64 first_channel = (group - sample * p.g) * p.channels_per_group;
    for (i64 j = 0; j < count; ++j) {
      const exact::ChunkRecord r = record_at(j);  // the same record for every thread: a uniform loop
      if ((r.flags & exact::kNonfinite) != 0 || (r.flags & exact::kEscaped) == 0) continue;
      const ChunkPlace place = chunk_place(p.s, p.channels_per_group, first_chunk + j);
      const i64 n = place.channels * place.pixels;
      for (i64 i = t; i < n; i += THREADS) {
        const i64 k = i / place.pixels;
        const i64 q = i - k * place.pixels;
        const i64 at =
            element_offset<LAYOUT>(p, sample, first_channel + place.first_channel + k, place.first_pixel + q);
        const float v = biased<XT>(p, load_element<XT>(p.x, at), first_channel + place.first_channel + k);
        exact::acc_add_element(acc, bits_of(v), sink);
      }
    }
    exact::acc_flush(acc, sink);
    if (t == 0) sh.spilled = 1;
    __syncthreads();
  }
  if (warp == 0) {
    // The warps' sums combined as a warp combines its threads' (lane w holds warp w's): a few shuffles instead of
    // one thread adding them in turn. Where they do not fit one unit (rare) the lanes add theirs to sh.total.
    exact::Accumulator mine = lane < kWarps ? accumulator_of(sh.warp[lane]) : accumulator_of(WarpSums{});
    warp_combine(mine, sink, sh.block, sh.spilled, lane);
    __syncwarp();
  }
  if (t == 0) {
    // Held whole (the usual case), the statistics come from the combined sums directly.
    const auto own = exact::sink_of(sh.total);  // thread 0 alone now: plain additions
    exact::Accumulator total = accumulator_of(sh.block);
    const bool whole = record_in == nullptr && sh.spilled == 0;
    if (record_out != nullptr) {
      // The caller wants the record itself (group_stats): normalized, so that 2^31 of them may be added.
      exact::acc_flush(total, own);
      exact::normalize(sh.total);
      for (int i = 0; i < exact::kRecordWords; ++i) record_out[i] = (&sh.total.count)[i];
    } else if (!whole || !exact::stats_from_sums(total, p.eps, sh.stats)) {
      exact::acc_flush(total, own);
      sh.stats = exact::group_stats(sh.total, p.eps, sh.scratch);
    }
  }
  __syncthreads();
  const GroupStats s = sh.stats;
  __syncthreads();  // sh is rewritten for the next group
  return s;
}

__device__ __forceinline__ RowConstants channel_constants(const Params& p, const GroupStats& s, i64 channel) {
  return row_constants(s, load_parameter(p.weight, p.weight_dtype, channel, 1.0),
                       load_parameter(p.bias, p.bias_dtype, channel, 0.0));
}

// Vectors a thread loads before transforming them: EPL / 8, at most 2 where four would spill: FP32 x (whose
// vectors take twice the registers), and in the fused kernel, which also holds a chunk, any x but BF16, and
// BF16 too before sm_90 (where ptxas needs more registers for it). Only the schedule changes, never a bit.
template <int XT, int EPL, bool FUSED = false>
__device__ constexpr int vectors_per_step() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool tight = XT == kFP32 || (FUSED && XT != kBF16);
#else
  constexpr bool tight = XT == kFP32 || FUSED;
#endif
  return tight && EPL / kVec > 2 ? 2 : EPL / kVec;
}

// The vectorized part of apply_row. BIAS: the row's input bias is added to x (the loop is instantiated twice, so that
// a call without a bias runs the loop it ran before the bias existed).
template <int XT, int YT, int ACT, int THREADS, int EPL, bool BIAS>
__device__ __forceinline__ void apply_row_vectors(const Params& p, i64 begin, i64 end, const RowConstants& rc,
                                                  const RawVector<XT>& bias, int tid) {
  constexpr int kVecs = vectors_per_step<XT, EPL>();
  constexpr i64 kStep = static_cast<i64>(THREADS) * kVec * kVecs;
  const auto same = [&](int) -> const RowConstants& { return rc; };
  i64 i = begin + static_cast<i64>(tid) * kVec;
  RawVector<XT> raw[kVecs];
#pragma unroll
  for (int q = 0; q < kVecs; ++q) {
    const i64 at = i + static_cast<i64>(q) * THREADS * kVec;
    if (at < end) raw[q] = load_raw<XT>(p.x, at);
  }
  for (; i < end; i += kStep) {
    RawVector<XT> next[kVecs];
#pragma unroll
    for (int q = 0; q < kVecs; ++q) {
      const i64 at = i + kStep + static_cast<i64>(q) * THREADS * kVec;
      if (at < end) next[q] = load_raw<XT>(p.x, at);
    }
#pragma unroll
    for (int q = 0; q < kVecs; ++q) {
      const i64 at = i + static_cast<i64>(q) * THREADS * kVec;
      if (at < end) {
        if constexpr (BIAS) raw[q] = add_raw<XT>(raw[q], bias);
        float v[kVec];
        unpack<XT>(raw[q], v);
        // For bf16 outputs, x again from its raw form in registers: the rare path runs often enough in some
        // lane of a warp that reading x from memory instead measured 12% slower (PERFORMANCE.md, "The apply pass").
        transform_values<YT, ACT, YT == kBF16>(v, same, [&](int e) { return element_of<XT>(raw[q], e); });
        store_vector<YT>(p.y, at, v);
      }
      raw[q] = next[q];
    }
  }
}

// y over elements [begin, end) of row `row` (one set of constants), EPL elements per thread per step. The next
// step's vectors are loaded (raw) before this step's are transformed, so loads stay in flight during the arithmetic.
template <int XT, int YT, int ACT, int THREADS, int EPL, bool BIAS>
__device__ __forceinline__ void apply_row(const Params& p, i64 begin, i64 end, const RowConstants& rc, i64 row,
                                          int tid) {
  i64 channel = 0;
  RawVector<XT> bias = broadcast_raw<XT>(0u);
  if constexpr (BIAS) {
    channel = row % p.c;
    bias = broadcast_raw<XT>(bias_bits<XT>(p, channel));
  }
  if (p.vectorized) {
    apply_row_vectors<XT, YT, ACT, THREADS, EPL, BIAS>(p, begin, end, rc, bias, tid);
  } else {
    for (i64 i = begin + tid; i < end; i += THREADS) {
      store_element<YT>(p.y, i, transform<ACT>(biased_if<XT, BIAS>(p, load_element<XT>(p.x, i), channel), rc));
    }
  }
}

// The vectorized pixels of one (column, block) of apply_channels_last: x and y from xs and ys (the thread's first
// vector), `next` elements from one of a step's vectors to the next. BIAS: the column's input biases are added to x
// (instantiated twice, as apply_row_vectors).
template <int XT, int YT, int ACT, int EPL, bool BIAS>
__device__ __forceinline__ void cl_apply_pixels(const char* xs, char* ys, i64 begin, i64 end, i64 lanes, i64 next,
                                                const RowConstants (&rc)[kVec], const RawVector<XT>& bias) {
  // With a bias, one vector a step for FP32 x: its 8 biases beside two vectors in flight spilled on sm_120.
  constexpr int kVecs = BIAS && XT == kFP32 ? 1 : vectors_per_step<XT, EPL>();
  constexpr i64 kXBytes = XT == kFP32 ? 4 : 2, kYBytes = YT == kFP32 ? 4 : 2;
  const i64 step = next * kVecs;
  const auto per_channel = [&](int e) -> const RowConstants& { return rc[e]; };
  RawVector<XT> raw[kVecs];
#pragma unroll
  for (int q = 0; q < kVecs; ++q) {
    if (begin + q * lanes < end) raw[q] = load_raw<XT>(xs + q * next * kXBytes, 0);
  }
  for (i64 pixel = begin; pixel < end; pixel += lanes * kVecs) {
    RawVector<XT> following[kVecs];
#pragma unroll
    for (int q = 0; q < kVecs; ++q) {
      if (pixel + (kVecs + q) * lanes < end) following[q] = load_raw<XT>(xs + (step + q * next) * kXBytes, 0);
    }
#pragma unroll
    for (int q = 0; q < kVecs; ++q) {
      if (pixel + q * lanes < end) {
        if constexpr (BIAS) raw[q] = add_raw<XT>(raw[q], bias);
        float v[kVec];
        unpack<XT>(raw[q], v);
        transform_values<YT, ACT, YT == kBF16>(v, per_channel, [&](int e) { return element_of<XT>(raw[q], e); });
        store_vector<YT>(ys + q * next * kYBytes, 0, v);
      }
      raw[q] = following[q];
    }
    xs += step * kXBytes;
    ys += step * kYBytes;
  }
}

// Channels-last apply: item ((slice of cl_tx columns, sample), block of pixels), blocks fastest, so that a block's
// successive items (item, item + gridDim, ...) mostly keep their column and sample. Thread (tx, ty) takes column
// slice * cl_tx + tx (8 channels when vectorized, else one) and pixels ty, ty + cl_ty, ... of the block, with the
// column's constants in registers, loaded again only when the column or the sample changes. Vectors are 8
// consecutive channels of one pixel (16 or 32 bytes); the next step's are loaded before this step's are
// transformed, as in apply_row; addresses advance by a constant stride.
template <int XT, int YT, int ACT, int EPL, bool BIAS>
__device__ __forceinline__ void apply_channels_last(const Params& p) {
  const int tx = threadIdx.x % p.cl_tx;
  const int ty = threadIdx.x / p.cl_tx;
  if (ty >= p.cl_ty) return;  // no barriers below: idle threads may leave
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  const i64 lanes = p.cl_ty;
  i64 loaded = -1;  // the (slice, sample) whose constants are in registers
  RowConstants rc[kVec];
  RawVector<XT> bias = broadcast_raw<XT>(0u);  // the column's input bias
  for (i64 item = blockIdx.x; item < p.cl_apply_items; item += gridDim.x) {
    i64 key, block, slice, sample;
    divide_small(item, p.cl_blocks_per_sample, key, block);
    divide_small(key, p.n, slice, sample);
    const i64 column = slice * p.cl_tx + tx;
    if (column >= p.cl_columns) continue;
    const i64 begin = block * p.cl_block_pixels + ty;
    const i64 end = (block + 1) * p.cl_block_pixels < p.s ? (block + 1) * p.cl_block_pixels : p.s;
    if (p.vectorized) {
      if (key != loaded) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) rc[e] = rows[sample * p.c + column * kVec + e];
        if constexpr (BIAS) bias = raw_from_bits<XT>([&](int e) { return bias_bits<XT>(p, column * kVec + e); });
        loaded = key;
      }
      // Element offsets: of the thread's first vector, and of the next vector of a step.
      const i64 first = (sample * p.s + begin) * p.c + column * kVec;
      const i64 next = lanes * p.c;
      const auto* xs = static_cast<const char*>(p.x) + first * (XT == kFP32 ? 4 : 2);
      auto* ys = static_cast<char*>(p.y) + first * (YT == kFP32 ? 4 : 2);
      cl_apply_pixels<XT, YT, ACT, EPL, BIAS>(xs, ys, begin, end, lanes, next, rc, bias);
    } else {
      // One channel per column, 8 pixels loaded before they are transformed.
      const RowConstants one = rows[sample * p.c + column];
      const i64 base = sample * p.s * p.c + column;
      for (i64 pixel = begin; pixel < end; pixel += lanes * kVec) {
        float v[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const i64 at = pixel + e * lanes;
          v[e] = at < end ? biased_if<XT, BIAS>(p, load_element<XT>(p.x, base + at * p.c), column) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const i64 at = pixel + e * lanes;
          if (at < end) store_element<YT>(p.y, base + at * p.c, transform<ACT>(v[e], one));
        }
      }
    }
  }
}

// The record of a loaded chunk, stored by lane 0. FULL: every chunk is full; otherwise a full chunk still takes
// the unmasked reduction (a branch uniform over the warp), and only the end of a row or group is masked.
template <int XT, bool FULL>
__device__ __forceinline__ void finish_chunk(const ChunkData<XT>& c, i64 chunk, int lane, exact::ChunkRecord* records) {
  const exact::ChunkRecord r = reduce_chunk<XT, FULL>(c, lane);
  if (lane == 0) records[chunk] = r;
}

// How a warp of chunk_stats loads its chunks: channel-major with every chunk full and aligned (load_full_chunk),
// channel-major in general (load_chunk), or channels-last element by element (load_gathered_chunk).
enum : int { kLoadFull = 0, kLoadRun = 1, kLoadGathered = 2 };

// The chunks of one warp: chunk, chunk + stride, ...
template <int XT, int WARPS, int STAGES, int LOAD, bool BIAS>
__device__ __forceinline__ void chunk_stats_warp(const Params& p) {
  constexpr bool kFull = LOAD == kLoadFull;
  const int lane = threadIdx.x & 31;
  const i64 stride = static_cast<i64>(gridDim.x) * WARPS;
  const i64 total = p.chunks_total;
  exact::ChunkRecord* records = static_cast<exact::ChunkRecord*>(p.records);
  const auto load = [&](i64 chunk, ChunkData<XT>& c) {
    if constexpr (LOAD == kLoadFull)
      load_full_chunk<XT, BIAS>(p, chunk, lane, c);
    else if constexpr (LOAD == kLoadRun)
      load_chunk<XT, BIAS>(p, chunk, lane, c);
    else
      load_gathered_chunk<XT, BIAS>(p, chunk, lane, c);
  };
  i64 chunk = static_cast<i64>(blockIdx.x) * WARPS + threadIdx.x / 32;
  if constexpr (STAGES == 1) {
    for (; chunk < total; chunk += stride) {
      ChunkData<XT> c;
      load(chunk, c);
      finish_chunk<XT, kFull>(c, chunk, lane, records);
    }
  } else {
    // Double buffering: the next chunk's loads are in flight while this one is reduced.
    if (chunk >= total) return;
    ChunkData<XT> a, b;
    load(chunk, a);
    for (;;) {
      const i64 second = chunk + stride;
      if (second < total) load(second, b);
      finish_chunk<XT, kFull>(a, chunk, lane, records);
      if (second >= total) break;
      const i64 third = second + stride;
      if (third < total) load(third, a);
      finish_chunk<XT, kFull>(b, second, lane, records);
      if (third >= total) break;
      chunk = third;
    }
  }
}

// ---- the fused kernel's apply ------------------------------------------------------------------------------
// The channels-last apply of one group (sample, channels [first_channel, first_channel + cpg)): columns of W
// channels (W = 8, 4 or 1 dividing cpg), thread (tx, ty) takes columns tx, tx + lanes_x, ... and pixels ty,
// ty + lanes_y, ..., with the column's constants (from shared memory) in registers; up to 8 elements loaded
// before they are transformed.
template <int XT, int YT, int ACT, int THREADS, int EPL, int W>
__device__ __forceinline__ void fused_apply_channels_last(const Params& p, const RowConstants* rows, i64 sample,
                                                          i64 first_channel) {
  // At most 8 elements in flight: the kernel also holds a chunk's state, and W = 8 keeps 8 sets of constants (16
  // spilled on sm_75 to sm_89 and sm_100 and later with 16-warp blocks).
  constexpr int kElements = EPL < 8 ? EPL : 8;
  constexpr int kBatch = kElements / W < 1 ? 1 : kElements / W;
  const int columns = static_cast<int>(p.channels_per_group) / W;
  const int lanes_x = columns < THREADS ? columns : THREADS;
  const int lanes_y = THREADS / lanes_x;
  const int tx = threadIdx.x % lanes_x;
  const int ty = threadIdx.x / lanes_x;
  if (ty >= lanes_y) return;
  const i64 step = static_cast<i64>(lanes_y) * kBatch;
  for (int column = tx; column < columns; column += lanes_x) {
    // u (2^-apply_e) is the group's: one register for it, three per channel for the rest.
    const float u = rows[0].u;
    float z[W], k[W], c[W];
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const RowConstants r = rows[column * W + e];
      z[e] = r.z;
      k[e] = r.k;
      c[e] = r.c;
    }
    const auto per_channel = [&](int e) { return RowConstants{u, z[e], k[e], c[e]}; };
    const i64 base = sample * p.s * p.c + first_channel + column * W;
    for (i64 pixel = ty; pixel < p.s; pixel += step) {
      float v[kBatch][W];
#pragma unroll
      for (int q = 0; q < kBatch; ++q) {
        const i64 at = pixel + static_cast<i64>(q) * lanes_y;
        if (at < p.s) load_values<XT, W>(p.x, base + at * p.c, v[q]);
      }
#pragma unroll
      for (int q = 0; q < kBatch; ++q) {
        const i64 at = pixel + static_cast<i64>(q) * lanes_y;
        if (at < p.s) {
          transform_values<YT, ACT, false>(v[q], per_channel, [](int) { return 0.0f; });  // x stays in v[q]
          store_values<YT, W>(p.y, base + at * p.c, v[q]);
        }
      }
    }
  }
}

}  // namespace kernel
}  // namespace gnsilu
