// gnsilu: the GroupNorm(+SiLU) kernels, compiled at run time by NVRTC for the device's exact architecture.
//
// Two paths compute the same bits (gnsilu_math.cuh defines the arithmetic and the reduction tree), in two
// memory layouts that also give the same bits: channel-major (NCHW, NCDHW, ...) and channels-last (NHWC, ...).
// A variant is compiled for one layout (LAYOUT) and one activation (ACT: SiLU or none).
//
//   split (three launches, any size; from sm_90 the second and third overlap the drain of the one before):
//     chunk_stats  NCHW: one warp per chunk: loads the chunk into registers (4 x 16-byte vectors per lane),
//                  sums it, takes its pivot, then sums the centred values and their squares from the same
//                  registers: x is read once for the statistics. Writes a 32-byte record per chunk. When
//                  every chunk is full (S a multiple of 1024, ...) it takes a path with no division of the
//                  chunk index and no per-element mask; otherwise full chunks still skip the masks.
//                  NHWC: a block per tile of (sample, window of 1024 pixels, slice of 16 to 64 bytes of
//                  channels): the tile is read with 16-byte loads, transposed into shared memory so that each
//                  channel's window (one chunk: chunks never straddle a channel) lies as in NCHW, and the
//                  warps reduce those chunks exactly as the NCHW kernel does. Shapes the tiles cannot take
//                  (S <= 512, C not a multiple of 16 bytes, unaligned x) gather chunks element by element.
//     finalize     one block per group: combines the group's records in FP64, writes per-(n, c) constants.
//                  The same kernel for both layouts.
//     apply        NCHW: tiles of (row, span): y = silu(fma(fma(x, u, -z), k, c)), 16-byte loads and stores;
//                  for 16-bit outputs SiLU is estimated with MUFU and silu32 runs only where the estimate
//                  cannot decide the rounding (gnsilu_math.cuh). NHWC: items of (sample, block of pixels,
//                  slice of columns of 8 channels); each thread keeps one column's 8 sets of constants in
//                  registers and walks pixels with 16-byte loads and stores.
//     Bytes moved: x twice and y once (6 per element in 16-bit), plus 32 bytes per 1024 elements of records.
//
//   fused (one launch, groups of at most 64 chunks and 256 channels):
//     one block per group: its warps compute the chunk records into shared memory, warp 0 combines them,
//     then the block applies the group; the second read of x mostly hits L2 (the group was just read). In
//     NHWC the chunks are gathered element by element (the group's channels are a few bytes of each pixel)
//     and the apply walks the group's pixels with vectors of 8, 4 or 1 of its channels.
//
// Launch constants are template parameters: WARPS (warps per block), EPL (elements per thread per step of the
// apply loops: 8, 16 or 32), STAGES (chunks a warp holds in flight in chunk_stats: 2 loads the next chunk
// while reducing the current one; NCHW only). None of them changes the reduction tree, so none changes a bit of
// the output.
#include "gnsilu_math.cuh"
#include "gnsilu_params.cuh"

namespace gnsilu {
namespace kernel {

using namespace gnsilu::math;

// Blocks per multiprocessor the compiler must allow: at least 512 threads, so at most 128 registers a thread.
// Without it, ptxas for some architectures (sm_120) picks a 64-register cap and spills.
template <int WARPS>
constexpr int kMinBlocks = WARPS >= 16 ? 1 : 16 / WARPS;
// The fused kernel holds a chunk and the SiLU at once: at least 256 threads (up to 255 registers a thread).
template <int WARPS>
constexpr int kMinBlocksFused = WARPS >= 8 ? 1 : 8 / WARPS;
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

// W consecutive elements (W = 8, 4 or 1) of one pixel's channels (the channels-last fused kernel): 16- or
// 32-byte vectors for 8, 8- or 16-byte ones for 4.
__device__ __forceinline__ void load8bytes(const void* p, u32& a, u32& b) {
  asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p));
}
__device__ __forceinline__ void store8bytes(void* p, u32 a, u32 b) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b) : "memory");
}

template <int T, int W>
__device__ __forceinline__ void load_values(const void* base, i64 i, float (&v)[W]) {
  static_assert(W == 8 || W == 4 || W == 1, "W");
  if constexpr (W == 8) {
    load_vector<T>(base, i, v);
  } else if constexpr (W == 1) {
    v[0] = load_element<T>(base, i);
  } else if constexpr (T == kFP32) {
    const Raw16 r = load16(static_cast<const float*>(base) + i);
    v[0] = float_of(r.a); v[1] = float_of(r.b); v[2] = float_of(r.c); v[3] = float_of(r.d);
  } else {
    u32 w[2];
    load8bytes(static_cast<const u16*>(base) + i, w[0], w[1]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const u16 h = static_cast<u16>(k % 2 ? w[k / 2] >> 16 : w[k / 2] & 0xFFFFu);
      v[k] = T == kBF16 ? bf16_to_float(h) : fp16_to_float(h);
    }
  }
}

template <int T, int W>
__device__ __forceinline__ void store_values(void* base, i64 i, const float (&v)[W]) {
  if constexpr (W == 8) {
    store_vector<T>(base, i, v);
  } else if constexpr (W == 1) {
    store_element<T>(base, i, v[0]);
  } else if constexpr (T == kFP32) {
    store16(static_cast<float*>(base) + i, float_canonical_bits(v[0]), float_canonical_bits(v[1]),
            float_canonical_bits(v[2]), float_canonical_bits(v[3]));
  } else if constexpr (T == kBF16) {
    store8bytes(static_cast<u16*>(base) + i, pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
  } else {
    store8bytes(static_cast<u16*>(base) + i, pack_fp16x2(v[0], v[1]), pack_fp16x2(v[2], v[3]));
  }
}

// Bytes of two words picked by a PRMT selector: 0x5410 joins the low halves (a's low half low), 0x7632 the high.
__device__ __forceinline__ u32 permute(u32 a, u32 b, u32 selector) {
  u32 out;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(selector));
  return out;
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

// Slot s of a chunk from 8 elements' bits given one by one (absent ones as 0).
template <int XT, typename BitsOf>
__device__ __forceinline__ RawVector<XT> raw_from_bits(BitsOf bits_of_element) {
  u32 w[XT == kFP32 ? 8 : 4];
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    const u32 b = bits_of_element(e);
    if constexpr (XT == kFP32) w[e] = b;
    else w[e / 2] = e % 2 ? (w[e / 2] | b << 16) : b;
  }
  RawVector<XT> r;
#pragma unroll
  for (int q = 0; q < (XT == kFP32 ? 2 : 1); ++q) r.q[q] = Raw16{w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]};
  return r;
}

// The n elements of x from `start` on (channel-major: a chunk is one contiguous run).
template <int XT>
__device__ __forceinline__ void load_run(const Params& p, i64 start, int n, int lane, ChunkData<XT>& c) {
  c.n = n;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int first = (lane + kLanes * s) * kVec;
    if (p.vectorized && first + kVec <= n) {
      c.raw[s] = load_raw<XT>(p.x, start + first);
    } else {
      // Element by element (unaligned rows, or the end of a chunk), into the same raw layout.
      c.raw[s] = raw_from_bits<XT>(
          [&](int e) { return first + e < n ? element_bits<XT>(p.x, start + first + e) : 0u; });
    }
  }
}

// Chunk `chunk` when every chunk is full and x is 16-byte aligned (all chunks of 1024 elements, rows of whole
// vectors): it starts at chunk * kChunk, with no division into (group, index) and no per-slot tests.
template <int XT>
__device__ __forceinline__ void load_full_chunk(const Params& p, i64 chunk, int lane, ChunkData<XT>& c) {
  c.n = kChunk;
  const i64 start = chunk * kChunk + static_cast<i64>(lane) * kVec;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) c.raw[s] = load_raw<XT>(p.x, start + kLanes * kVec * s);
}

// Where chunk `chunk` of the tensor (group-major numbering) lies in channel-major memory, and its length. With
// one channel per chunk the chunks of the tensor are the rows' runs in order: chunk = row * r + k.
__device__ __forceinline__ void chunk_extent(const Params& p, i64 chunk, i64& start, int& n) {
  if (p.chunk_channels == 1) {
    const i64 row = chunk / p.chunks_per_row;
    const i64 k = chunk - row * p.chunks_per_row;
    const i64 rest = p.s - k * kChunk;
    start = row * p.s + k * kChunk;
    n = static_cast<int>(rest < kChunk ? rest : kChunk);
  } else {
    const i64 group = chunk / p.chunks_per_group;
    const i64 first = (chunk - group * p.chunks_per_group) * p.chunk_channels;
    const i64 left = p.channels_per_group - first;
    start = group * p.group_length + first * p.s;
    n = static_cast<int>((left < p.chunk_channels ? left : p.chunk_channels) * p.s);
  }
}

// Chunk `chunk` of the tensor in channel-major memory.
template <int XT>
__device__ __forceinline__ void load_chunk(const Params& p, i64 chunk, int lane, ChunkData<XT>& c) {
  i64 start;
  int n;
  chunk_extent(p, chunk, start, n);
  load_run<XT>(p, start, n, lane, c);
}

// Chunk `chunk` of the tensor in channels-last memory, element by element: element i of the chunk is its
// channel i / pixels, pixel i % pixels (gnsilu_math.cuh: chunk_place), at (sample, pixel, channel).
template <int XT>
__device__ __forceinline__ void load_gathered_chunk(const Params& p, i64 chunk, int lane, ChunkData<XT>& c) {
  const i64 group = chunk / p.chunks_per_group;
  const ChunkPlace place = chunk_place(p.s, p.channels_per_group, chunk - group * p.chunks_per_group);
  const i64 sample = group / p.g;
  const i64 channel = (group - sample * p.g) * p.channels_per_group + place.first_channel;
  const i64 base = (sample * p.s + place.first_pixel) * p.c + channel;  // element (first pixel, first channel)
  const int pixels = static_cast<int>(place.pixels);
  const int n = static_cast<int>(place.channels) * pixels;
  c.n = n;
  if (place.channels == 1) {
    // One channel's run (S > 512): element i is pixel i, C elements after element i - 1.
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int first = (lane + kLanes * s) * kVec;
      const i64 at = base + static_cast<i64>(first) * p.c;
      c.raw[s] = raw_from_bits<XT>([&](int e) { return first + e < n ? element_bits<XT>(p.x, at + e * p.c) : 0u; });
    }
    return;
  }
  // Whole channels (S <= 512): element i is channel i / S, pixel i % S. One unsigned division an element, each on
  // its own: carrying (channel, pixel) across the unrolled elements made the 16-warp fused kernel spill.
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int first = (lane + kLanes * s) * kVec;
    c.raw[s] = raw_from_bits<XT>([&](int e) {
      const unsigned i = static_cast<unsigned>(first + e);
      if (i >= static_cast<unsigned>(n)) return 0u;
      const unsigned k = i / static_cast<unsigned>(pixels);
      const unsigned pixel = i - k * static_cast<unsigned>(pixels);
      return element_bits<XT>(p.x, base + static_cast<i64>(pixel) * p.c + k);
    });
  }
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
  r.n = n;
  r.unused = 0;
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
  const double sum = partials_warp(count, lane, [&](i64 j) { return record_sum(records[j]); });
  const double mean = div64(sum, static_cast<double>(length));
  const double squares = partials_warp(
      count, lane, [&](i64 j) { return record_squares(records[j], mean); });
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
template <int XT, int YT, int ACT, int THREADS, int EPL>
__device__ __forceinline__ void apply_row(const Params& p, i64 begin, i64 end, const RowConstants& rc, int tid) {
  constexpr int kVecs = vectors_per_step<XT, EPL>();
  constexpr i64 kStep = static_cast<i64>(THREADS) * kVec * kVecs;
  const auto same = [&](int) -> const RowConstants& { return rc; };
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
          transform_values<YT, ACT, YT == kBF16>(v, same, [&](int e) { return element_of<XT>(raw[q], e); });
          store_vector<YT>(p.y, at, v);
        }
        raw[q] = next[q];
      }
    }
  } else {
    for (i64 i = begin + tid; i < end; i += THREADS) {
      store_element<YT>(p.y, i, transform<ACT>(load_element<XT>(p.x, i), rc));
    }
  }
}

// q = a / b and r = a % b for a >= 0, b >= 1, in 32-bit arithmetic when both fit (the common case).
__device__ __forceinline__ void divide(i64 a, i64 b, i64& q, i64& r) {
  if (((a | b) >> 32) == 0) {
    const unsigned ua = static_cast<unsigned>(a), ub = static_cast<unsigned>(b);
    q = ua / ub;
    r = ua - static_cast<unsigned>(q) * ub;
  } else {
    q = a / b;
    r = a - q * b;
  }
}

// Channels-last apply: item ((slice of cl_tx columns, sample), block of pixels), blocks fastest, so that a block's
// successive items (item, item + gridDim, ...) mostly keep their column and sample. Thread (tx, ty) takes column
// slice * cl_tx + tx (8 channels when vectorized, else one) and pixels ty, ty + cl_ty, ... of the block, with the
// column's constants in registers, loaded again only when the column or the sample changes. Vectors are 8
// consecutive channels of one pixel (16 or 32 bytes); the next step's are loaded before this step's are
// transformed, as in apply_row; addresses advance by a constant stride.
template <int XT, int YT, int ACT, int EPL>
__device__ __forceinline__ void apply_channels_last(const Params& p) {
  const int tx = threadIdx.x % p.cl_tx;
  const int ty = threadIdx.x / p.cl_tx;
  if (ty >= p.cl_ty) return;  // no barriers below: idle threads may leave
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  const i64 lanes = p.cl_ty;
  i64 loaded = -1;  // the (slice, sample) whose constants are in registers
  RowConstants rc[kVec];
  for (i64 item = blockIdx.x; item < p.cl_apply_items; item += gridDim.x) {
    i64 key, block, slice, sample;
    divide(item, p.cl_blocks_per_sample, key, block);
    divide(key, p.n, slice, sample);
    const i64 column = slice * p.cl_tx + tx;
    if (column >= p.cl_columns) continue;
    const i64 begin = block * p.cl_block_pixels + ty;
    const i64 end = (block + 1) * p.cl_block_pixels < p.s ? (block + 1) * p.cl_block_pixels : p.s;
    if (p.vectorized) {
      constexpr int kVecs = vectors_per_step<XT, EPL>();
      if (key != loaded) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) rc[e] = rows[sample * p.c + column * kVec + e];
        loaded = key;
      }
      const auto per_channel = [&](int e) -> const RowConstants& { return rc[e]; };
      // Element offsets: of the thread's first vector, of the next vector of a step, of the next step.
      const i64 first = (sample * p.s + begin) * p.c + column * kVec;
      const i64 next = lanes * p.c;
      const i64 step = next * kVecs;
      const auto* xs = static_cast<const char*>(p.x) + first * (XT == kFP32 ? 4 : 2);
      auto* ys = static_cast<char*>(p.y) + first * (YT == kFP32 ? 4 : 2);
      constexpr i64 kXBytes = XT == kFP32 ? 4 : 2, kYBytes = YT == kFP32 ? 4 : 2;
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
    } else {
      // One channel per column, 8 pixels loaded before they are transformed.
      const RowConstants one = rows[sample * p.c + column];
      const i64 base = sample * p.s * p.c + column;
      for (i64 pixel = begin; pixel < end; pixel += lanes * kVec) {
        float v[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const i64 at = pixel + e * lanes;
          v[e] = at < end ? load_element<XT>(p.x, base + at * p.c) : 0.0f;
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

// The record of a loaded chunk, stored by lane 0. FULL: every chunk is full; otherwise a full chunk still takes
// the unmasked reduction (a branch uniform over the warp), and only the end of a row or group is masked.
template <int XT, bool FULL>
__device__ __forceinline__ void finish_chunk(const ChunkData<XT>& c, i64 chunk, int lane, ChunkRecord* records) {
  const ChunkRecord r = FULL || c.n == kChunk ? reduce_chunk<XT, true>(c, lane) : reduce_chunk<XT, false>(c, lane);
  if (lane == 0) records[chunk] = r;
}

// How a warp of chunk_stats loads its chunks: channel-major with every chunk full and aligned (load_full_chunk),
// channel-major in general (load_chunk), or channels-last element by element (load_gathered_chunk).
enum : int { kLoadFull = 0, kLoadRun = 1, kLoadGathered = 2 };

// The chunks of one warp: chunk, chunk + stride, ...
template <int XT, int WARPS, int STAGES, int LOAD>
__device__ __forceinline__ void chunk_stats_warp(const Params& p) {
  constexpr bool kFull = LOAD == kLoadFull;
  const int lane = threadIdx.x & 31;
  const i64 stride = static_cast<i64>(gridDim.x) * WARPS;
  const i64 total = p.chunks_total;
  ChunkRecord* records = static_cast<ChunkRecord*>(p.records);
  const auto load = [&](i64 chunk, ChunkData<XT>& c) {
    if constexpr (LOAD == kLoadFull) load_full_chunk<XT>(p, chunk, lane, c);
    else if constexpr (LOAD == kLoadRun) load_chunk<XT>(p, chunk, lane, c);
    else load_gathered_chunk<XT>(p, chunk, lane, c);
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

// ---- channels-last statistics tiles ------------------------------------------------------------------------
// Item (sample, window k, slice): pixels [1024 k, 1024 k + pixels) of the slice's K channels, which are K whole
// chunks (one channel per chunk: S > 512). The tile sits in shared memory channel-major: row c holds channel c's
// window as NCHW would, 16-bit values two to a word (FP32 one), so that a warp reads its chunk's vector u (pixels
// 8u ... 8u + 7) as one 16-byte load (FP32: two) and reduces it with reduce_chunk, the NCHW kernel's code.
// O = cl_slice_vectors 16-byte vectors per pixel of the slice (K = O * 8 channels in 16-bit, O * 4 in FP32).
// Writes transpose: a thread loads vector o of a pixel pair (16-bit: the same 8 channels of pixels 2a and 2a + 1,
// joined into words by PRMT) or of one pixel (FP32), and stores one word per channel. The word index is XOR-ed
// with (32 / O) * o, which keeps groups of 4 words (16 bytes) together and puts the O vectors of a warp's stores
// in distinct banks; readers apply the same XOR.
template <int XT>
struct Tile {
  static constexpr int kBytes = XT == kFP32 ? 4 : 2;
  static constexpr int kRowWords = kChunk * kBytes / 4;  // one channel's window: 512 or 1024 words
  static constexpr int kChannelsPerVector = 16 / kBytes;  // 8 or 4
};

__device__ __forceinline__ int log2_small(int v) { return v >= 4 ? 2 : v >= 2 ? 1 : 0; }



// Where one thread's units of a tile go (store_tile).
struct TileUnits {
  const char* at;   // the first unit's first vector in x
  i64 step_bytes;   // from a unit to the thread's next one
  i64 pixel_bytes;  // from a pixel to the next (16-bit units hold two)
  u32* row;         // the thread's vector's first row in the tile
  u32 first_word, word_step, swizzle;
  int first_pixel, pixel_step, count, pixels;
};

// A batch of 4 of a thread's units (j0 ... j0 + 3) held in registers between their loads and their stores.
template <int XT>
struct HeldUnits {
  Raw16 a[4], b[4];  // b: the second pixel of a 16-bit unit
};

// Loads units j0 ... j0 + 3, `at` pointing at unit j0. FULL: a whole window in whole batches (the common case),
// with no test per unit; otherwise units past the count or the window's pixels are zero.
template <int XT, bool FULL>
__device__ __forceinline__ void load_units(const TileUnits& u, const char* at, int j0, HeldUnits<XT>& h) {
  const Raw16 zero{0u, 0u, 0u, 0u};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = j0 + q;
    const int pixel = u.first_pixel + j * u.pixel_step;
    const char* unit = at + q * u.step_bytes;
    if constexpr (FULL) {
      h.a[q] = load16(unit);
      if constexpr (XT != kFP32) h.b[q] = load16(unit + u.pixel_bytes);
    } else {
      h.a[q] = j < u.count && pixel < u.pixels ? load16(unit) : zero;
      if constexpr (XT != kFP32) h.b[q] = j < u.count && pixel + 1 < u.pixels ? load16(unit + u.pixel_bytes) : zero;
    }
  }
}

// Stores units j0 ... j0 + 3 into the tile, one word per channel.
template <int XT, bool FULL>
__device__ __forceinline__ void store_units(const TileUnits& u, int j0, const HeldUnits<XT>& h) {
  using T = Tile<XT>;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = j0 + q;
    if (FULL || j < u.count) {
      u32* words = u.row + ((u.first_word + static_cast<u32>(j) * u.word_step) ^ u.swizzle);
      const u32 wa[4] = {h.a[q].a, h.a[q].b, h.a[q].c, h.a[q].d};
      if constexpr (XT == kFP32) {
#pragma unroll
        for (int k = 0; k < 4; ++k) words[k * T::kRowWords] = wa[k];
      } else {
        const u32 wb[4] = {h.b[q].a, h.b[q].b, h.b[q].c, h.b[q].d};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          words[(2 * k) * T::kRowWords] = permute(wa[k], wb[k], 0x5410u);
          words[(2 * k + 1) * T::kRowWords] = permute(wa[k], wb[k], 0x7632u);
        }
      }
    }
  }
}

// All of a thread's units into the tile, a batch of 4 at a time.
template <int XT, bool FULL>
__device__ __forceinline__ void store_tile_units(const TileUnits& u) {
  const char* at = u.at;
  for (int j0 = 0; j0 < u.count; j0 += 4) {
    HeldUnits<XT> h;
    load_units<XT, FULL>(u, at, j0, h);
    store_units<XT, FULL>(u, j0, h);
    at += 4 * u.step_bytes;
  }
}

// A thread's units of item `item`'s tile, and the item's place: (sample, window, slice).
template <int XT, int THREADS>
__device__ __forceinline__ TileUnits tile_units(const Params& p, i64 item, u32* tile, i64& sample, i64& window,
                                                i64& slice) {
  using T = Tile<XT>;
  constexpr int kPixelsPerUnit = XT == kFP32 ? 1 : 2;
  i64 rest;
  divide(item, p.cl_slices, rest, slice);
  divide(rest, p.chunks_per_row, sample, window);
  const i64 left = p.s - window * kChunk;
  const int shift = log2_small(p.cl_slice_vectors);
  const int vectors = p.cl_slice_vectors;
  const int units = (kChunk / kPixelsPerUnit) << shift;
  // A thread's units are tid, tid + THREADS, ...: all the same vector o of a pixel (THREADS is a multiple of the
  // vectors per pixel), at unit rows (tid >> shift) + j (THREADS >> shift). Addresses and words advance by
  // constants, so a unit costs its loads, PRMTs and stores and a few adds.
  const int o = static_cast<int>(threadIdx.x) & (vectors - 1);
  TileUnits u;
  u.count = THREADS <= units ? units / THREADS : (static_cast<int>(threadIdx.x) < units ? 1 : 0);
  u.pixels = static_cast<int>(left < kChunk ? left : kChunk);
  u.first_pixel = (static_cast<int>(threadIdx.x) >> shift) * kPixelsPerUnit;
  u.pixel_step = (THREADS >> shift) * kPixelsPerUnit;
  u.pixel_bytes = p.c * T::kBytes;
  const i64 slice_channels = static_cast<i64>(vectors) * T::kChannelsPerVector;
  u.at = static_cast<const char*>(p.x) +
         ((sample * p.s + window * kChunk + u.first_pixel) * p.c + slice * slice_channels) * T::kBytes + o * 16;
  u.step_bytes = u.pixel_step * u.pixel_bytes;
  u.swizzle = static_cast<u32>(o) * (32u >> shift);
  u.row = tile + o * T::kChannelsPerVector * T::kRowWords;
  u.first_word = static_cast<u32>(u.first_pixel / kPixelsPerUnit);
  u.word_step = static_cast<u32>(THREADS >> shift);
  return u;
}

template <int XT>
__device__ __forceinline__ void store_tile(const TileUnits& u) {
  if (u.pixels == kChunk && u.count % 4 == 0) store_tile_units<XT, true>(u);
  else store_tile_units<XT, false>(u);
}

// Channel c's chunk of the tile, in reduce_chunk's raw layout.
template <int XT>
__device__ __forceinline__ void tile_chunk(const u32* tile, int c, int shift, int pixels, int lane, ChunkData<XT>& d) {
  using T = Tile<XT>;
  const u32 swizzle = (32u >> shift) * static_cast<u32>(c / T::kChannelsPerVector);
  const u32* row = tile + c * T::kRowWords;
  d.n = pixels;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const u32 u = static_cast<u32>(lane + kLanes * s);
    if constexpr (XT == kFP32) {
      d.raw[s].q[0] = *reinterpret_cast<const Raw16*>(row + ((8u * u) ^ swizzle));
      d.raw[s].q[1] = *reinterpret_cast<const Raw16*>(row + ((8u * u + 4u) ^ swizzle));
    } else {
      d.raw[s].q[0] = *reinterpret_cast<const Raw16*>(row + ((4u * u) ^ swizzle));
    }
  }
}

// The K chunks of a tile in shared memory, reduced by the block's warps.
template <int XT, int WARPS>
__device__ __forceinline__ void reduce_tile(const Params& p, const u32* tile, i64 sample, i64 window, i64 slice,
                                            int pixels) {
  using T = Tile<XT>;
  const int lane = threadIdx.x & 31;
  const int shift = log2_small(p.cl_slice_vectors);
  const int slice_channels = p.cl_slice_vectors * T::kChannelsPerVector;
  ChunkRecord* records = static_cast<ChunkRecord*>(p.records);
  for (int c = static_cast<int>(threadIdx.x) / 32; c < slice_channels; c += WARPS) {
    ChunkData<XT> d;
    tile_chunk<XT>(tile, c, shift, pixels, lane, d);
    const i64 row = sample * p.c + slice * slice_channels + c;
    finish_chunk<XT, false>(d, row * p.chunks_per_row + window, lane, records);
  }
}

// The block's items item, item + gridDim, ... With at most 4 units a thread (the default 8-warp blocks), the next
// item's loads are issued before this item is reduced, so that a block always has loads in flight; otherwise each
// item is loaded, then reduced.
template <int XT, int WARPS>
__device__ __forceinline__ void chunk_stats_tiles(const Params& p) {
  constexpr int kThreads = WARPS * 32;
  extern __shared__ Raw16 dynamic_shared[];
  u32* tile = reinterpret_cast<u32*>(dynamic_shared);
  i64 item = blockIdx.x;
  if (item >= p.cl_stats_items) return;
  i64 sample, window, slice;
  TileUnits u = tile_units<XT, kThreads>(p, item, tile, sample, window, slice);
  if (u.count <= 4) {
    // One batch a thread (count <= 4): its loads for the next item are in flight while this item is reduced.
    HeldUnits<XT> held;
    load_units<XT, false>(u, u.at, 0, held);
    for (;;) {
      store_units<XT, false>(u, 0, held);
      __syncthreads();
      const i64 next = item + gridDim.x;
      i64 next_sample = 0, next_window = 0, next_slice = 0;
      TileUnits following = u;
      if (next < p.cl_stats_items) {
        following = tile_units<XT, kThreads>(p, next, tile, next_sample, next_window, next_slice);
        load_units<XT, false>(following, following.at, 0, held);
      }
      reduce_tile<XT, WARPS>(p, tile, sample, window, slice, u.pixels);
      __syncthreads();  // the tile is rewritten for the next item
      if (next >= p.cl_stats_items) return;
      item = next;
      u = following;
      sample = next_sample;
      window = next_window;
      slice = next_slice;
    }
  }
  for (;;) {
    store_tile<XT>(u);
    __syncthreads();
    reduce_tile<XT, WARPS>(p, tile, sample, window, slice, u.pixels);
    __syncthreads();  // the tile is rewritten for the next item
    item += gridDim.x;
    if (item >= p.cl_stats_items) return;
    u = tile_units<XT, kThreads>(p, item, tile, sample, window, slice);
  }
}

template <int XT, int WARPS, int STAGES, int LAYOUT>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) chunk_stats(const Params p) {
  static_assert(WARPS >= 1 && WARPS <= 32, "WARPS");
  static_assert(STAGES == 1 || STAGES == 2, "STAGES");
  static_assert(LAYOUT == kChannelsFirst || LAYOUT == kChannelsLast, "LAYOUT");
  allow_next_kernel();
  if constexpr (LAYOUT == kChannelsLast) {
    // Gathering needs more registers than holding two chunks leaves (and is the rare case): one chunk at a time.
    if (p.cl_stats_items > 0) chunk_stats_tiles<XT, WARPS>(p);
    else chunk_stats_warp<XT, WARPS, 1, kLoadGathered>(p);
  } else {
    if (p.vectorized && p.full_chunks) chunk_stats_warp<XT, WARPS, STAGES, kLoadFull>(p);
    else chunk_stats_warp<XT, WARPS, STAGES, kLoadRun>(p);
  }
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
      acc = acc + record_sum(r[m]);
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
    if (j < count) acc2 = acc2 + record_squares(r[m], mean);
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
          partials_block(count, shared, [&](i64 j) { return record_sum(records[j]); });
      const double mean = div64(sum, static_cast<double>(length));
      const double squares = partials_block(
          count, shared, [&](i64 j) { return record_squares(records[j], mean); });
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

template <int XT, int YT, int WARPS, int EPL, int LAYOUT, int ACT>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) apply(const Params p) {
  static_assert(EPL == 8 || EPL == 16 || EPL == 32, "EPL");
  static_assert(LAYOUT == kChannelsFirst || LAYOUT == kChannelsLast, "LAYOUT");
  wait_for_previous_kernel();
  if constexpr (LAYOUT == kChannelsLast) {
    apply_channels_last<XT, YT, ACT, EPL>(p);
  } else {
    const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
    for (i64 t = blockIdx.x; t < p.tiles_total; t += gridDim.x) {
      const i64 row = t / p.spans_per_row;
      const i64 span = t - row * p.spans_per_row;
      const RowConstants rc = rows[row];
      const i64 begin = span * p.span_length;
      const i64 end = begin + p.span_length < p.s ? begin + p.span_length : p.s;
      apply_row<XT, YT, ACT, WARPS * 32, EPL>(p, row * p.s + begin, row * p.s + end, rc, threadIdx.x);
    }
  }
}

// ---- fused path ------------------------------------------------------------------------------------------
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

template <int XT, int YT, int WARPS, int EPL, int LAYOUT, int ACT>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocksFused<WARPS>) fused(const Params p) {
  static_assert(LAYOUT == kChannelsFirst || LAYOUT == kChannelsLast, "LAYOUT");
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
      if constexpr (LAYOUT == kChannelsLast) load_gathered_chunk<XT>(p, group * chunks + j, lane, c);
      else load_chunk<XT>(p, group * chunks + j, lane, c);
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
    if constexpr (LAYOUT == kChannelsLast) {
      if (p.cl_fused_width == 8) fused_apply_channels_last<XT, YT, ACT, kThreads, EPL, 8>(p, rows, sample, first_channel);
      else if (p.cl_fused_width == 4) fused_apply_channels_last<XT, YT, ACT, kThreads, EPL, 4>(p, rows, sample, first_channel);
      else fused_apply_channels_last<XT, YT, ACT, kThreads, EPL, 1>(p, rows, sample, first_channel);
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
