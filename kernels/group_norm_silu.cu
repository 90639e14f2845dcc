// gnsilu: the GroupNorm+SiLU kernels, compiled at run time by NVRTC for the device's exact architecture.
//
// Two paths compute the same bits (gnsilu_math.cuh defines the arithmetic and the reduction tree):
//
//   split (three launches, any size; from sm_90 the second and third overlap the drain of the one before):
//     chunk_stats  one warp per 1024-element chunk: loads the chunk into registers (4 x 16-byte vectors per
//                  lane), sums it, takes its pivot, then sums the centred values and their squares from the
//                  same registers: x is read once for the statistics. Writes a 32-byte record per chunk.
//                  When every chunk is full (group length a multiple of 1024) it takes a path with no
//                  division of the chunk index and no per-element mask.
//     finalize     one block per group: combines the group's records in FP64, writes per-(n, c) constants.
//     apply        tiles of (row, span): y = silu(fma(fma(x, u, -z), k, c)), 16-byte loads and stores; for
//                  16-bit outputs SiLU is estimated with MUFU and silu32 runs only where the estimate cannot
//                  decide the rounding (gnsilu_math.cuh).
//     Bytes moved: x twice and y once (6 per element in 16-bit), plus 32 bytes per 1024 elements of records.
//
//   fused (one launch, groups of at most 64 chunks and 256 channels):
//     one block per group: its warps compute the chunk records into shared memory, warp 0 combines them,
//     then the block applies the group; the second read of x mostly hits L2 (the group was just read).
//
// Launch constants are template parameters: WARPS (warps per block), EPL (elements per thread per step of the
// apply loops: 8, 16 or 32), STAGES (chunks a warp holds in flight in chunk_stats: 2 loads the next chunk
// while reducing the current one). None of them changes the reduction tree, so none changes a bit of the
// output.
#include "gnsilu_math.cuh"
#include "gnsilu_params.cuh"

namespace gnsilu {
namespace kernel {

using namespace gnsilu::math;

constexpr int kFusedMaxChunks = 64;
// Blocks per multiprocessor the compiler must allow: at least 512 threads, so at most 128 registers a thread.
// Without it, ptxas for some architectures (sm_120) picks a 64-register cap and spills.
template <int WARPS>
constexpr int kMinBlocks = WARPS >= 16 ? 1 : 16 / WARPS;
// The fused kernel holds a chunk and the SiLU at once: at least 256 threads (up to 255 registers a thread).
template <int WARPS>
constexpr int kMinBlocksFused = WARPS >= 8 ? 1 : 8 / WARPS;
constexpr int kFusedMaxChannels = 256;

struct alignas(16) Raw16 {
  u32 a, b, c, d;
};

// ---- vectors of 8 elements (16 bytes of 16-bit data, 32 of FP32) ----------------------------------------
// Loaded raw (so that a chunk in flight costs 4 registers a vector in 16-bit), converted when used.
template <int T>
struct RawVector {
  Raw16 q[T == kFP32 ? 2 : 1];
};

__device__ __forceinline__ Raw16 load16(const void* p) {
  Raw16 r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.a), "=r"(r.b), "=r"(r.c), "=r"(r.d) : "l"(p));
  return r;
}
__device__ __forceinline__ void store16(void* p, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

template <int T>
__device__ __forceinline__ RawVector<T> load_raw(const void* base, i64 i) {
  RawVector<T> r;
  if constexpr (T == kFP32) {
    r.q[0] = load16(static_cast<const float*>(base) + i);
    r.q[1] = load16(static_cast<const float*>(base) + i + 4);
  } else {
    r.q[0] = load16(static_cast<const u16*>(base) + i);
  }
  return r;
}

template <int T>
__device__ __forceinline__ void unpack(const RawVector<T>& r, float (&v)[kVec]) {
  if constexpr (T == kFP32) {
    v[0] = float_of(r.q[0].a); v[1] = float_of(r.q[0].b); v[2] = float_of(r.q[0].c); v[3] = float_of(r.q[0].d);
    v[4] = float_of(r.q[1].a); v[5] = float_of(r.q[1].b); v[6] = float_of(r.q[1].c); v[7] = float_of(r.q[1].d);
  } else {
    const u32 w[4] = {r.q[0].a, r.q[0].b, r.q[0].c, r.q[0].d};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const u16 lo = static_cast<u16>(w[k] & 0xFFFFu);
      const u16 hi = static_cast<u16>(w[k] >> 16);
      if constexpr (T == kBF16) {
        v[2 * k] = bf16_to_float(lo);
        v[2 * k + 1] = bf16_to_float(hi);
      } else {
        v[2 * k] = fp16_to_float(lo);
        v[2 * k + 1] = fp16_to_float(hi);
      }
    }
  }
}

// Element e of a raw vector, as a float (the value unpack gives).
template <int XT>
__device__ __forceinline__ float element_of(const RawVector<XT>& r, int e) {
  if constexpr (XT == kFP32) {
    const Raw16& h = r.q[e / 4];
    const int k = e % 4;
    return float_of(k == 0 ? h.a : k == 1 ? h.b : k == 2 ? h.c : h.d);
  } else {
    const int k = e / 2;
    const u32 w = k == 0 ? r.q[0].a : k == 1 ? r.q[0].b : k == 2 ? r.q[0].c : r.q[0].d;
    const u16 h = static_cast<u16>(e % 2 ? w >> 16 : w & 0xFFFFu);
    if constexpr (XT == kBF16) return bf16_to_float(h);
    else return fp16_to_float(h);
  }
}

template <int T>
__device__ __forceinline__ void load_vector(const void* base, i64 i, float (&v)[kVec]) {
  unpack<T>(load_raw<T>(base, i), v);
}

template <int T>
__device__ __forceinline__ void store_vector(void* base, i64 i, const float (&v)[kVec]) {
  if constexpr (T == kFP32) {
    float* p = static_cast<float*>(base) + i;
    store16(p, float_canonical_bits(v[0]), float_canonical_bits(v[1]), float_canonical_bits(v[2]),
            float_canonical_bits(v[3]));
    store16(p + 4, float_canonical_bits(v[4]), float_canonical_bits(v[5]), float_canonical_bits(v[6]),
            float_canonical_bits(v[7]));
  } else if constexpr (T == kBF16) {
    store16(static_cast<u16*>(base) + i, pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
            pack_bf16x2(v[6], v[7]));
  } else {
    store16(static_cast<u16*>(base) + i, pack_fp16x2(v[0], v[1]), pack_fp16x2(v[2], v[3]), pack_fp16x2(v[4], v[5]),
            pack_fp16x2(v[6], v[7]));
  }
}

// ---- warp butterflies: lane l adds lane l ^ h, h = 16, 8, 4, 2, 1 (addition commutes bit for bit) ------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) v = v + __shfl_xor_sync(0xFFFFFFFFu, v, h);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) v = v + __shfl_xor_sync(0xFFFFFFFFu, v, h);
  return v;
}
__device__ __forceinline__ u32 warp_max(u32 v) {
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) {
    const u32 o = __shfl_xor_sync(0xFFFFFFFFu, v, h);
    v = o > v ? o : v;
  }
  return v;
}
__device__ __forceinline__ float warp_max_float(float v) {
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, h));
  return v;
}
__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) {
    const int o = __shfl_xor_sync(0xFFFFFFFFu, v, h);
    v = o > v ? o : v;
  }
  return v;
}

// ---- one chunk, one warp ---------------------------------------------------------------------------------
// A chunk in flight, raw: slot s of this lane holds elements (lane + 32 s) * 8 ... + 7 of the chunk (absent
// elements are zero bits, +0 in every format). 16 registers a chunk in 16-bit, 32 in FP32.
template <int XT>
struct ChunkData {
  RawVector<XT> raw[kSlots];
  int n;
};

// The raw bits of element i of x (a 16-bit value in the low half, or the FP32 bits).
template <int XT>
__device__ __forceinline__ u32 element_bits(const void* x, i64 i) {
  if constexpr (XT == kFP32) return static_cast<const u32*>(x)[i];
  else return static_cast<const u16*>(x)[i];
}

// Chunk j of `group`.
template <int XT>
__device__ __forceinline__ void load_group_chunk(const Params& p, i64 group, i64 j, int lane, ChunkData<XT>& c) {
  c.n = chunk_length(p.group_length, j);
  const i64 start = group * p.group_length + j * kChunk;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int first = (lane + kLanes * s) * kVec;
    if (p.vectorized && first + kVec <= c.n) {
      c.raw[s] = load_raw<XT>(p.x, start + first);
    } else {
      // Element by element (unaligned rows, or the end of a group), into the same raw layout.
      u32 w[XT == kFP32 ? 8 : 4];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const u32 b = first + e < c.n ? element_bits<XT>(p.x, start + first + e) : 0u;
        if constexpr (XT == kFP32) w[e] = b;
        else w[e / 2] = e % 2 ? (w[e / 2] | b << 16) : b;
      }
#pragma unroll
      for (int q = 0; q < (XT == kFP32 ? 2 : 1); ++q) c.raw[s].q[q] = Raw16{w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]};
    }
  }
}

// Chunk `chunk` when every chunk is full and x is 16-byte aligned (group length a multiple of kChunk, rows of
// whole vectors): it starts at chunk * kChunk, with no division into (group, index) and no per-slot tests.
template <int XT>
__device__ __forceinline__ void load_full_chunk(const Params& p, i64 chunk, int lane, ChunkData<XT>& c) {
  c.n = kChunk;
  const i64 start = chunk * kChunk + static_cast<i64>(lane) * kVec;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) c.raw[s] = load_raw<XT>(p.x, start + kLanes * kVec * s);
}

// Chunk `chunk` of the whole tensor (the split path's numbering: group-major).
template <int XT>
__device__ __forceinline__ void load_chunk(const Params& p, i64 chunk, int lane, ChunkData<XT>& c) {
  const i64 group = chunk / p.chunks_per_group;
  load_group_chunk<XT>(p, group, chunk - group * p.chunks_per_group, lane, c);
}

template <int XT>
__device__ __forceinline__ void chunk_values(const ChunkData<XT>& c, float (&v)[kSlots][kVec]) {
#pragma unroll
  for (int s = 0; s < kSlots; ++s) unpack<XT>(c.raw[s], v[s]);
}

// Two FP64 butterflies in one: lanes with bit 4 clear keep a and send b across, lanes with bit 4 set keep b and
// send a, so after the first level each half of the warp carries one sum and every further level moves one
// value instead of two. Each lane adds the same pairs in the same order as warp_sum(a) and warp_sum(b) would
// (addition commutes bit for bit), so the sums are theirs. Lane 0 returns a's sum in `first`, b's in `second`.
struct SumPair {
  double first, second;
};
__device__ __forceinline__ SumPair warp_sum_pair(double a, double b, int lane) {
  const bool upper = (lane & 16) != 0;
  double v = (upper ? b : a) + __shfl_xor_sync(0xFFFFFFFFu, upper ? a : b, 16);
#pragma unroll
  for (int h = 8; h >= 1; h /= 2) v = v + __shfl_xor_sync(0xFFFFFFFFu, v, h);
  return {v, __shfl_xor_sync(0xFFFFFFFFu, v, 16)};
}

// The largest |x| of a lane's slots. For bf16 from sm_86, on the raw words two at a time (max.xorsign.abs: the
// larger magnitude, whose sign is then dropped; a NaN is skipped as fmaxf skips it), which gives the same value
// as max_abs over the elements.
template <int XT>
__device__ __forceinline__ float lane_max_abs(const ChunkData<XT>& c, const float (&v)[kSlots][kVec]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
  if constexpr (XT == kBF16) {
    u32 top = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const u32 w[4] = {c.raw[s].q[0].a, c.raw[s].q[0].b, c.raw[s].q[0].c, c.raw[s].q[0].d};
#pragma unroll
      for (int k = 0; k < 4; ++k) asm("max.xorsign.abs.bf16x2 %0, %0, %1;" : "+r"(top) : "r"(w[k]));
    }
    const u32 lo = top & 0x7FFFu;
    const u32 hi = (top >> 16) & 0x7FFFu;
    return float_of((lo > hi ? lo : hi) << 16);
  }
#endif
  float top = 0.0f;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) top = max_abs(top, v[s][e]);
  }
  return top;
}

// The chunk's record (lane 0 returns it). FULL: the caller knows that n == kChunk, and the centring needs no
// mask (with a run-time n the compiler tests every element).
template <int XT, bool FULL = false>
__device__ __forceinline__ ChunkRecord reduce_chunk(const ChunkData<XT>& c, int lane) {
  const int n = FULL ? kChunk : c.n;
  float v[kSlots][kVec];
  chunk_values<XT>(c, v);
  float part[kSlots];
  float top = 0.0f;
  if constexpr (Scaling<XT>::kScaled) top = lane_max_abs<XT>(c, v);
#pragma unroll
  for (int s = 0; s < kSlots; ++s) part[s] = tree8(v[s]);
  const float first = warp_sum(tree_slots(part[0], part[1], part[2], part[3]));
  if constexpr (Scaling<XT>::kScaled) top = warp_max_float(top);
  const Pivot pivot = chunk_pivot<XT>(first, top, n);

  double pr[kSlots];
  double pq[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    float d[kVec];
    float dd[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int i = (lane + kLanes * s) * kVec + e;
      d[e] = FULL || n == kChunk || i < n ? centred(v[s][e], pivot) : 0.0f;
      dd[e] = d[e] * d[e];
    }
    pr[s] = static_cast<double>(tree8(d));
    pq[s] = static_cast<double>(tree8(dd));
  }
  const SumPair sums =
      warp_sum_pair(tree_slots(pr[0], pr[1], pr[2], pr[3]), tree_slots(pq[0], pq[1], pq[2], pq[3]), lane);
  ChunkRecord r;
  r.r = sums.first;
  r.c = pivot.c;
  r.q = sums.second;
  r.e = pivot.e;
  r.unused[0] = 0;
  r.unused[1] = 0;
  return r;
}

// A group's statistics from its records. Partial p (of 256) sums records p, p + 256, ... in order; the partials
// combine pairwise (p with p + 128, then p + 64, ... p + 1). One warp: lane l holds partials l + 32 m, m < 8,
// combines them in-lane for the first three levels, then across lanes.
template <typename Term>
__device__ __forceinline__ double partials_warp(i64 count, int lane, Term term) {
  double part[8];
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    double acc = 0.0;
    for (i64 j = lane + 32 * m; j < count; j += kPartials) acc = acc + term(j);
    part[m] = acc;
  }
#pragma unroll
  for (int m = 0; m < 4; ++m) part[m] = part[m] + part[m + 4];
#pragma unroll
  for (int m = 0; m < 2; ++m) part[m] = part[m] + part[m + 2];
  return warp_sum(part[0] + part[1]);
}

__device__ __forceinline__ GroupStats group_stats_warp(const ChunkRecord* records, i64 count, i64 length,
                                                       double eps, int lane) {
  int max_e = -1000;
  for (i64 j = lane; j < count; j += kLanes) max_e = records[j].e > max_e ? records[j].e : max_e;
  max_e = warp_max(max_e);
  const double sum = partials_warp(count, lane, [&](i64 j) { return record_sum(records[j], chunk_length(length, j)); });
  const double mean = div64(sum, static_cast<double>(length));
  const double squares = partials_warp(
      count, lane, [&](i64 j) { return record_squares(records[j], chunk_length(length, j), mean); });
  return group_stats(sum, squares, length, max_e, eps);
}

// The same with a block of 256 threads: thread t holds partial t; shared memory for the levels 128 to 32, a
// butterfly for 16 to 1. Every thread of the block returns the result.
template <typename Term>
__device__ __forceinline__ double partials_block(i64 count, double* shared, Term term) {
  const int t = threadIdx.x;
  double acc = 0.0;
  // Eight terms computed (their records loaded) before they are added in order, so that the loads overlap.
  // (Measured: no change on the H200, where this kernel is bound by its chain of instructions, not by loads.)
  constexpr int kBatch = 8;
  i64 j = t;
  for (; j + (kBatch - 1) * kPartials < count; j += kBatch * kPartials) {
    double terms[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) terms[b] = term(j + b * kPartials);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) acc = acc + terms[b];
  }
  for (; j < count; j += kPartials) acc = acc + term(j);
  shared[t] = acc;
  __syncthreads();
#pragma unroll
  for (int h = kPartials / 2; h >= 32; h /= 2) {
    if (t < h) shared[t] = shared[t] + shared[t + h];
    __syncthreads();
  }
  double v = t < 32 ? shared[t] : 0.0;
  if (t < 32) v = warp_sum(v);
  __syncthreads();
  if (t == 0) shared[0] = v;
  __syncthreads();
  const double out = shared[0];
  __syncthreads();
  return out;
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

// y over elements [begin, end) of one row (one set of constants), EPL elements per thread per step. The next
// step's vectors are loaded (raw) before this step's are transformed, so loads stay in flight during the
// arithmetic.
template <int XT, int YT, int THREADS, int EPL>
__device__ __forceinline__ void apply_row(const Params& p, i64 begin, i64 end, const RowConstants& rc, int tid) {
  constexpr int kVecs = vectors_per_step<XT, EPL>();
  constexpr i64 kStep = static_cast<i64>(THREADS) * kVec * kVecs;
  if (p.vectorized) {
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
          float v[kVec];
          unpack<XT>(raw[q], v);
          // For bf16 outputs, x again from its raw form in registers: the rare path runs often enough in some
          // lane of a warp that reading x from memory instead measured 12% slower (PERFORMANCE.md, v6).
          transform_vector<YT, YT == kBF16>(v, rc, [&](int e) { return element_of<XT>(raw[q], e); });
          store_vector<YT>(p.y, at, v);
        }
        raw[q] = next[q];
      }
    }
  } else {
    for (i64 i = begin + tid; i < end; i += THREADS) store_element<YT>(p.y, i, transform(load_element<XT>(p.x, i), rc));
  }
}

// ---- split path ------------------------------------------------------------------------------------------
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

template <int XT, bool FULL>
__device__ __forceinline__ void finish_chunk(const ChunkData<XT>& c, i64 chunk, int lane, ChunkRecord* records) {
  const ChunkRecord r = reduce_chunk<XT, FULL>(c, lane);
  if (lane == 0) records[chunk] = r;
}

// The chunks of one warp: chunk, chunk + stride, ... FULL: every chunk full and aligned (load_full_chunk).
template <int XT, int WARPS, int STAGES, bool FULL>
__device__ __forceinline__ void chunk_stats_warp(const Params& p) {
  const int lane = threadIdx.x & 31;
  const i64 stride = static_cast<i64>(gridDim.x) * WARPS;
  const i64 total = p.chunks_total;
  ChunkRecord* records = static_cast<ChunkRecord*>(p.records);
  const auto load = [&](i64 chunk, ChunkData<XT>& c) {
    if constexpr (FULL) load_full_chunk<XT>(p, chunk, lane, c);
    else load_chunk<XT>(p, chunk, lane, c);
  };
  i64 chunk = static_cast<i64>(blockIdx.x) * WARPS + threadIdx.x / 32;
  if constexpr (STAGES == 1) {
    for (; chunk < total; chunk += stride) {
      ChunkData<XT> c;
      load(chunk, c);
      finish_chunk<XT, FULL>(c, chunk, lane, records);
    }
  } else {
    // Double buffering: the next chunk's loads are in flight while this one is reduced.
    if (chunk >= total) return;
    ChunkData<XT> a, b;
    load(chunk, a);
    for (;;) {
      const i64 second = chunk + stride;
      if (second < total) load(second, b);
      finish_chunk<XT, FULL>(a, chunk, lane, records);
      if (second >= total) break;
      const i64 third = second + stride;
      if (third < total) load(third, a);
      finish_chunk<XT, FULL>(b, second, lane, records);
      if (third >= total) break;
      chunk = third;
    }
  }
}

template <int XT, int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) chunk_stats(const Params p) {
  static_assert(WARPS >= 1 && WARPS <= 32, "WARPS");
  static_assert(STAGES == 1 || STAGES == 2, "STAGES");
  allow_next_kernel();
  if (p.vectorized && p.group_length % kChunk == 0) chunk_stats_warp<XT, WARPS, STAGES, true>(p);
  else chunk_stats_warp<XT, WARPS, STAGES, false>(p);
}

// The tree's last levels once the 256 partials are in shared memory: warp 0 combines p with p + 128, p + 64 and
// p + 32 in its lanes' registers (lane l holds partials l + 32 m, as partials_warp), then the butterfly; the same
// pairs in the same order as partials_block. Lanes of warp 0 return the result.
__device__ __forceinline__ double combine_partials_warp0(const double* shared, int lane) {
  double v[8];
#pragma unroll
  for (int m = 0; m < 8; ++m) v[m] = shared[lane + 32 * m];
#pragma unroll
  for (int m = 0; m < 4; ++m) v[m] = v[m] + v[m + 4];
#pragma unroll
  for (int m = 0; m < 2; ++m) v[m] = v[m] + v[m + 2];
  return warp_sum(v[0] + v[1]);
}

// A group's statistics when each of the 256 threads can hold its records (t, t + 256, ... : at most K) in
// registers: partial t's chain is this thread's, the records are loaded once for both passes, and the tree's
// levels 128 to 32 run in warp 0's registers. The same terms, chains and tree as partials_block, so the same
// bits; fewer loads, barriers and instructions on the path (finalize is latency-bound). Every thread returns it.
struct FinalizeCache {
  double partials[kPartials];
  int max_e[kPartials / 32];
  double sum;
  GroupStats stats;
};
template <int K>
__device__ __forceinline__ GroupStats group_stats_cached(const ChunkRecord* records, i64 count, i64 length, double eps,
                                                         FinalizeCache& sh) {
  const int t = threadIdx.x;
  const int lane = t & 31;
  ChunkRecord r[K];
#pragma unroll
  for (int m = 0; m < K; ++m) {
    if (t + kPartials * m < count) r[m] = records[t + kPartials * m];
  }
  int max_e = -1000;
  double acc = 0.0;
#pragma unroll
  for (int m = 0; m < K; ++m) {
    const i64 j = t + kPartials * m;
    if (j < count) {
      max_e = r[m].e > max_e ? r[m].e : max_e;
      acc = acc + record_sum(r[m], chunk_length(length, j));
    }
  }
  max_e = warp_max(max_e);  // a maximum: the order does not matter
  if (lane == 0) sh.max_e[t / 32] = max_e;
  sh.partials[t] = acc;
  __syncthreads();
  if (t < 32) {
    const double total = combine_partials_warp0(sh.partials, lane);
    if (lane == 0) sh.sum = total;
  }
  __syncthreads();
  const double sum = sh.sum;
  const double mean = div64(sum, static_cast<double>(length));
  double acc2 = 0.0;
#pragma unroll
  for (int m = 0; m < K; ++m) {
    const i64 j = t + kPartials * m;
    if (j < count) acc2 = acc2 + record_squares(r[m], chunk_length(length, j), mean);
  }
  sh.partials[t] = acc2;
  __syncthreads();
  if (t < 32) {
    const double squares = combine_partials_warp0(sh.partials, lane);
    int e = -1000;
#pragma unroll
    for (int w = 0; w < kPartials / 32; ++w) e = sh.max_e[w] > e ? sh.max_e[w] : e;
    const GroupStats g = group_stats(sum, squares, length, e, eps);
    __syncwarp();
    if (lane == 0) sh.stats = g;
  }
  __syncthreads();
  const GroupStats g = sh.stats;
  __syncthreads();  // everyone has read the shared values before the next group writes them
  return g;
}

// One block of 256 threads per group (a grid-stride loop over the groups). Groups of at most 16 x 256 records
// (4 Mi elements) keep their records in registers (group_stats_cached); larger ones read them twice.
__global__ void __launch_bounds__(kPartials) finalize(const Params p) {
  __shared__ double shared[kPartials];
  __shared__ int max_shared;
  __shared__ FinalizeCache cache;
  allow_next_kernel();
  wait_for_previous_kernel();
  const i64 count = p.chunks_per_group;
  const i64 length = p.group_length;
  for (i64 group = blockIdx.x; group < p.groups_total; group += gridDim.x) {
    const ChunkRecord* records = static_cast<const ChunkRecord*>(p.records) + group * count;
    GroupStats s;
    if (count <= kPartials) {
      s = group_stats_cached<1>(records, count, length, p.eps, cache);
    } else if (count <= 4 * kPartials) {
      s = group_stats_cached<4>(records, count, length, p.eps, cache);
    } else if (count <= 16 * kPartials) {
      s = group_stats_cached<16>(records, count, length, p.eps, cache);
    } else {
      if (threadIdx.x == 0) max_shared = -1000;
      __syncthreads();
      int max_e = -1000;
#pragma unroll 8
      for (i64 j = threadIdx.x; j < count; j += kPartials) max_e = records[j].e > max_e ? records[j].e : max_e;
      atomicMax(&max_shared, max_e);  // a maximum: the order does not matter
      const double sum =
          partials_block(count, shared, [&](i64 j) { return record_sum(records[j], chunk_length(length, j)); });
      const double mean = div64(sum, static_cast<double>(length));
      const double squares = partials_block(
          count, shared, [&](i64 j) { return record_squares(records[j], chunk_length(length, j), mean); });
      s = group_stats(sum, squares, length, max_shared, p.eps);
    }
    const i64 sample = group / p.g;
    const i64 first_channel = (group - sample * p.g) * p.channels_per_group;
    RowConstants* rows = static_cast<RowConstants*>(p.rows);
    for (i64 k = threadIdx.x; k < p.channels_per_group; k += kPartials) {
      rows[sample * p.c + first_channel + k] = channel_constants(p, s, first_channel + k);
    }
    __syncthreads();  // max_shared is reset for the next group
  }
}

template <int XT, int YT, int WARPS, int EPL>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) apply(const Params p) {
  static_assert(EPL == 8 || EPL == 16 || EPL == 32, "EPL");
  wait_for_previous_kernel();
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  for (i64 t = blockIdx.x; t < p.tiles_total; t += gridDim.x) {
    const i64 row = t / p.spans_per_row;
    const i64 span = t - row * p.spans_per_row;
    const RowConstants rc = rows[row];
    const i64 begin = span * p.span_length;
    const i64 end = begin + p.span_length < p.s ? begin + p.span_length : p.s;
    apply_row<XT, YT, WARPS * 32, EPL>(p, row * p.s + begin, row * p.s + end, rc, threadIdx.x);
  }
}

// ---- fused path ------------------------------------------------------------------------------------------
template <int XT, int YT, int WARPS, int EPL>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocksFused<WARPS>) fused(const Params p) {
  constexpr int kThreads = WARPS * 32;
  constexpr int kVecs = vectors_per_step<XT, EPL, true>();
  __shared__ ChunkRecord records[kFusedMaxChunks];
  __shared__ RowConstants rows[kFusedMaxChannels];
  __shared__ GroupStats stats;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32;
  const int chunks = static_cast<int>(p.chunks_per_group);
  const int channels = static_cast<int>(p.channels_per_group);
  const int length = static_cast<int>(p.group_length);  // <= 64 * 1024
  const unsigned s = static_cast<unsigned>(p.s);
  for (i64 group = blockIdx.x; group < p.groups_total; group += gridDim.x) {
    for (int j = warp; j < chunks; j += WARPS) {
      ChunkData<XT> c;
      load_group_chunk<XT>(p, group, j, lane, c);
      const ChunkRecord r = reduce_chunk<XT>(c, lane);
      if (lane == 0) records[j] = r;
    }
    __syncthreads();
    if (warp == 0) {
      const GroupStats g = group_stats_warp(records, chunks, length, p.eps, lane);
      if (lane == 0) stats = g;
    }
    __syncthreads();
    const i64 sample = group / p.g;
    const i64 first_channel = (group - sample * p.g) * p.channels_per_group;
    for (int k = threadIdx.x; k < channels; k += kThreads) rows[k] = channel_constants(p, stats, first_channel + k);
    __syncthreads();
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
            transform_vector<YT, false>(v[q], rc, [](int) { return 0.0f; });  // x stays in v[q]
            store_vector<YT>(p.y, base + at, v[q]);
          }
        }
      }
    } else {
      for (int i = threadIdx.x; i < length; i += kThreads) {
        const RowConstants rc = rows[static_cast<unsigned>(i) / s];
        store_element<YT>(p.y, base + i, transform(load_element<XT>(p.x, base + i), rc));
      }
    }
    __syncthreads();  // the shared records and constants are rewritten for the next group
  }
}

// ---- self-check of the fast 16-bit SiLU -------------------------------------------------------------------
// For the FP32 bit patterns [first, first + count): how often transform_vector takes its fast decision and
// whether the decision gives silu32's 16-bit rounding. counts: [0] decided for bf16, [1] for fp16, [2] bf16
// decided wrongly, [3] fp16 decided wrongly, [4] largest distance of the estimate from silu32 in FP32 ulps
// (|v| <= 64), [5] largest ratio of that distance to the margin silu16_decided allows, in thousandths (below
// 1000: silu32(v) always lies within the margin). Instantiated only by tests/gpu/test_gpu.cpp, over all 2^32.
template <int UNUSED>
__global__ void silu_fast_check(unsigned long long first, unsigned long long count, unsigned long long* counts) {
  unsigned long long c[6] = {0, 0, 0, 0, 0, 0};
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const float v = float_of(static_cast<u32>(first + i));
    const float exact = silu32(v);
    const float f = silu_estimate(v);
    if (silu16_decided<kBF16>(v, f)) {
      ++c[0];
      c[2] += pack_bf16x2(f, f) != pack_bf16x2(exact, exact);
    }
    if (silu16_decided<kFP16>(v, f)) {
      ++c[1];
      c[3] += pack_fp16x2(f, f) != pack_fp16x2(exact, exact);
    }
    const float a = fabsf(v);
    if (a <= 64.0f && ((bits_of(f) ^ bits_of(exact)) & 0x80000000u) == 0) {
      const long long d = static_cast<long long>(bits_of(f)) - static_cast<long long>(bits_of(exact));
      const unsigned long long ulps = static_cast<unsigned long long>(d < 0 ? -d : d);
      c[4] = ulps > c[4] ? ulps : c[4];
      const auto ratio = static_cast<unsigned long long>(1000.0f * static_cast<float>(ulps) / fma32(a, 1.25f, 16.0f));
      c[5] = ratio > c[5] ? ratio : c[5];
    } else if (a <= 64.0f && exact != 0.0f) {
      c[5] = 1000000;  // opposite signs: never within the margin
    }
  }
  for (int k = 0; k < 6; ++k) {
    unsigned long long value = c[k];
    for (int offset = 16; offset > 0; offset /= 2) {
      const unsigned long long other = __shfl_down_sync(0xFFFFFFFFu, value, offset);
      value = k < 4 ? value + other : (other > value ? other : value);
    }
    if ((threadIdx.x & 31) == 0) {
      if (k < 4) atomicAdd(&counts[k], value);
      else atomicMax(&counts[k], value);
    }
  }
}

}  // namespace kernel
}  // namespace gnsilu
