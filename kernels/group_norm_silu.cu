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
//     finalize     one block per group: adds the group's records exactly (128-bit sums per thread, then per
//                  warp, then one thread), rounds the mean and variance once, writes per-(n, c) constants.
//                  The same kernel for both layouts.
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
#include "gnsilu_exact.cuh"
#include "gnsilu_math.cuh"
#include "gnsilu_params.cuh"

namespace gnsilu {
namespace kernel {

using namespace gnsilu::math;

// Blocks per multiprocessor the compiler must allow: at least 512 threads, so at most 128 registers a thread.
// Without it, ptxas for some architectures (sm_120) picks a 64-register cap and spills.
template <int WARPS>
inline constexpr int kMinBlocks = WARPS >= 16 ? 1 : 16 / WARPS;
// The fused kernel holds a chunk and the SiLU at once: at least 256 threads (up to 255 registers a thread).
template <int WARPS>
inline constexpr int kMinBlocksFused = WARPS >= 8 ? 1 : 8 / WARPS;
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
    v[0] = float_of(r.q[0].a);
    v[1] = float_of(r.q[0].b);
    v[2] = float_of(r.q[0].c);
    v[3] = float_of(r.q[0].d);
    v[4] = float_of(r.q[1].a);
    v[5] = float_of(r.q[1].b);
    v[6] = float_of(r.q[1].c);
    v[7] = float_of(r.q[1].d);
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
    if constexpr (XT == kBF16)
      return bf16_to_float(h);
    else
      return fp16_to_float(h);
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
    v[0] = float_of(r.a);
    v[1] = float_of(r.b);
    v[2] = float_of(r.c);
    v[3] = float_of(r.d);
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
  if constexpr (XT == kFP32)
    return static_cast<const u32*>(x)[i];
  else
    return static_cast<const u16*>(x)[i];
}

// Slot s of a chunk from 8 elements' bits given one by one (absent ones as 0).
template <int XT, typename BitsOf>
__device__ __forceinline__ RawVector<XT> raw_from_bits(BitsOf bits_of_element) {
  u32 w[XT == kFP32 ? 8 : 4];
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    const u32 b = bits_of_element(e);
    if constexpr (XT == kFP32)
      w[e] = b;
    else
      w[e / 2] = e % 2 ? (w[e / 2] | b << 16) : b;
  }
  RawVector<XT> r;
#pragma unroll
  for (int q = 0; q < (XT == kFP32 ? 2 : 1); ++q) r.q[q] = Raw16{w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]};
  return r;
}

// ---- the input bias (Params::input_bias) ----------------------------------------------------------------
// The tensor normalized is x + b[channel], each sum rounded to XT (math::add_in). It is added where x is loaded: to
// raw vectors (a chunk's, or an apply step's), or to single elements; absent elements of a chunk stay +0.
template <int XT>
__device__ __forceinline__ u32 bias_bits(const Params& p, i64 channel) {
  return element_bits<XT>(p.input_bias, channel);
}

// An element of x plus its channel's bias (x itself without one).
template <int XT>
__device__ __forceinline__ float biased(const Params& p, float x, i64 channel) {
  return p.input_bias != nullptr ? add_in<XT>(x, load_element<XT>(p.input_bias, channel)) : x;
}

// The same where the kernel is instantiated for one case (BIAS: Params::input_bias is not null). chunk_stats and
// apply have an instance of each (template argument BIAS), so that a call without a bias runs none of its code and
// is compiled as if the bias did not exist: a test per row or chunk cost 1-7% at small shapes (PERFORMANCE.md v20),
// and both bodies in one kernel, branched at its top, still 2-7% (v22: ptxas gives the two one register layout and
// one schedule). A call with a bias takes the split path (the fused kernel has no bias).
template <int XT, bool BIAS>
__device__ __forceinline__ float biased_if(const Params& p, float x, i64 channel) {
  if constexpr (BIAS)
    return add_in<XT>(x, load_element<XT>(p.input_bias, channel));
  else
    return x;
}

// Raw bits x + b (both raw bits of XT, 16-bit values in the low half).
template <int XT>
__device__ __forceinline__ u32 add_bits(u32 x, u32 b) {
  if constexpr (XT == kFP32) {
    return bits_of(float_of(x) + float_of(b));
  } else {
    const u16 hx = static_cast<u16>(x), hb = static_cast<u16>(b);
    if constexpr (XT == kBF16)
      return float_to_bf16(bf16_to_float(hx) + bf16_to_float(hb));
    else
      return float_to_fp16(fp16_to_float(hx) + fp16_to_float(hb));
  }
}

// x + b for the 16 bytes of a tile unit (both raw bits of XT), element by element, rounded to XT (math::add_in).
template <int XT>
__device__ __forceinline__ Raw16 add_words(const Raw16& x, const Raw16& b) {
  const u32 wx[4] = {x.a, x.b, x.c, x.d}, wb[4] = {b.a, b.b, b.c, b.d};
  u32 r[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (XT == kFP32) {
      r[k] = add_bits<XT>(wx[k], wb[k]);
    } else {
      const u32 low = add_bits<XT>(wx[k] & 0xFFFFu, wb[k] & 0xFFFFu), high = add_bits<XT>(wx[k] >> 16, wb[k] >> 16);
      r[k] = (low & 0xFFFFu) | (high << 16);
    }
  }
  return Raw16{r[0], r[1], r[2], r[3]};
}

// The same value in every element of a raw vector.
template <int XT>
__device__ __forceinline__ RawVector<XT> broadcast_raw(u32 bits) {
  const u32 w = XT == kFP32 ? bits : (bits & 0xFFFFu) * 0x10001u;
  RawVector<XT> r;
#pragma unroll
  for (int q = 0; q < (XT == kFP32 ? 2 : 1); ++q) r.q[q] = Raw16{w, w, w, w};
  return r;
}

// x + b element by element, rounded to XT (math::add_in; pack_*x2 round as float_to_* do).
template <int XT>
__device__ __forceinline__ RawVector<XT> add_raw(const RawVector<XT>& x, const RawVector<XT>& b) {
  float v[kVec], w[kVec];
  unpack<XT>(x, v);
  unpack<XT>(b, w);
#pragma unroll
  for (int e = 0; e < kVec; ++e) v[e] += w[e];
  RawVector<XT> r;
  if constexpr (XT == kFP32) {
    r.q[0] = Raw16{bits_of(v[0]), bits_of(v[1]), bits_of(v[2]), bits_of(v[3])};
    r.q[1] = Raw16{bits_of(v[4]), bits_of(v[5]), bits_of(v[6]), bits_of(v[7])};
  } else if constexpr (XT == kBF16) {
    r.q[0] = Raw16{pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7])};
  } else {
    r.q[0] = Raw16{pack_fp16x2(v[0], v[1]), pack_fp16x2(v[2], v[3]), pack_fp16x2(v[4], v[5]), pack_fp16x2(v[6], v[7])};
  }
  return r;
}

// Elements m ... 7 of a raw vector set to +0 (m < 8).
template <int XT>
__device__ __forceinline__ void keep_first(RawVector<XT>& r, int m) {
#pragma unroll
  for (int q = 0; q < (XT == kFP32 ? 2 : 1); ++q) {
    u32* w[4] = {&r.q[q].a, &r.q[q].b, &r.q[q].c, &r.q[q].d};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (XT == kFP32) {
        if (4 * q + k >= m) *w[k] = 0u;
      } else {
        const u32 keep = (2 * k < m ? 0xFFFFu : 0u) | (2 * k + 1 < m ? 0xFFFF0000u : 0u);
        *w[k] &= keep;
      }
    }
  }
}

// Bias vector b added to a lane's slots of a loaded chunk (its absent elements stay +0).
template <int XT>
__device__ __forceinline__ void add_chunk_bias(const RawVector<XT>& b, int lane, ChunkData<XT>& c) {
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int first = (lane + kLanes * s) * kVec;
    if (first < c.n) {
      c.raw[s] = add_raw<XT>(c.raw[s], b);
      if (first + kVec > c.n) keep_first<XT>(c.raw[s], c.n - first);
    }
  }
}

// The input bias added to a chunk of channel-major memory loaded from element `start` (load_run, load_full_chunk):
// one channel's where the chunk lies in one row, else (whole channels: S <= 512) each element's own. A chunk lies
// in one group, so its channels follow the first one's without wrapping.
// The input bias added to a chunk that spans whole channels: element i is in channel `channel` + (offset + i) / s.
// Each slot's first element's channel is found by one division, then carried through its 8 elements; run after
// the chunk's loads, so that none of the loads' registers are live beside it.
template <int XT>
__device__ __forceinline__ void add_channels_bias(const Params& p, i64 channel, unsigned offset, unsigned s, int lane,
                                                  ChunkData<XT>& c) {
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int first = (lane + kLanes * k) * kVec;
    if (first >= c.n) continue;
    const unsigned i = offset + static_cast<unsigned>(first);
    unsigned next = i / s, r = i - next * s;
    const RawVector<XT> b = raw_from_bits<XT>([&](int e) {
      const u32 bits = first + e < c.n ? bias_bits<XT>(p, channel + next) : 0u;
      if (++r == s) {
        r = 0;
        ++next;
      }
      return bits;
    });
    c.raw[k] = add_raw<XT>(c.raw[k], b);
    if (first + kVec > c.n) keep_first<XT>(c.raw[k], c.n - first);
  }
}

template <int XT>
__device__ __forceinline__ void add_run_bias(const Params& p, i64 start, int lane, ChunkData<XT>& c) {
  const i64 row = start / p.s;
  const i64 offset = start - row * p.s;
  const i64 channel = row % p.c;
  if (offset + c.n <= p.s) {
    add_chunk_bias<XT>(broadcast_raw<XT>(bias_bits<XT>(p, channel)), lane, c);
    return;
  }
  add_channels_bias<XT>(p, channel, static_cast<unsigned>(offset), static_cast<unsigned>(p.s), lane, c);
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
      c.raw[s] =
          raw_from_bits<XT>([&](int e) { return first + e < n ? element_bits<XT>(p.x, start + first + e) : 0u; });
    }
  }
}

// The chunk loads below take BIAS: whether the caller's body has an input bias (without, none of its code is
// compiled in). The fused kernel has none: a call with an input bias takes the split path (plan.cpp,
// fused_eligible), so that the fused kernel stays as it was (with the bias its 16-warp channels-last instance spilled
// on sm_100).
// Chunk `chunk` when every chunk is full and x is 16-byte aligned (all chunks of 1024 elements, rows of whole
// vectors): it starts at chunk * kChunk, with no division into (group, index) and no per-slot tests.
template <int XT, bool BIAS>
__device__ __forceinline__ void load_full_chunk(const Params& p, i64 chunk, int lane, ChunkData<XT>& c) {
  c.n = kChunk;
  const i64 start = chunk * kChunk + static_cast<i64>(lane) * kVec;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) c.raw[s] = load_raw<XT>(p.x, start + kLanes * kVec * s);
  if constexpr (BIAS) add_run_bias<XT>(p, chunk * kChunk, lane, c);
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
template <int XT, bool BIAS>
__device__ __forceinline__ void load_chunk(const Params& p, i64 chunk, int lane, ChunkData<XT>& c) {
  i64 start;
  int n;
  chunk_extent(p, chunk, start, n);
  load_run<XT>(p, start, n, lane, c);
  if constexpr (BIAS) add_run_bias<XT>(p, start, lane, c);
}

// Chunk `chunk` of the tensor in channels-last memory, element by element: element i of the chunk is its
// channel i / pixels, pixel i % pixels (gnsilu_math.cuh: chunk_place), at (sample, pixel, channel).
template <int XT, bool BIAS>
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
    if constexpr (BIAS) add_chunk_bias<XT>(broadcast_raw<XT>(bias_bits<XT>(p, channel)), lane, c);
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
  if constexpr (BIAS) add_channels_bias<XT>(p, channel, 0u, static_cast<unsigned>(pixels), lane, c);
}

template <int XT>
__device__ __forceinline__ void chunk_values(const ChunkData<XT>& c, float (&v)[kSlots][kVec]) {
#pragma unroll
  for (int s = 0; s < kSlots; ++s) unpack<XT>(c.raw[s], v[s]);
}

// The bits of the largest |x| of a lane's slots, where NaN counts as larger than Inf and Inf as larger than any
// finite value (so the chunk's nonfinite elements show in it). From sm_86, on the raw 16-bit words two at a time
// (max.NaN.xorsign.abs: the larger magnitude, NaN propagated, whose sign is then dropped); elsewhere on the bits.
template <int XT>
__device__ __forceinline__ u32 lane_top_bits(const ChunkData<XT>& c, const float (&v)[kSlots][kVec]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
  if constexpr (XT == kBF16 || XT == kFP16) {
    u32 top = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const u32 w[4] = {c.raw[s].q[0].a, c.raw[s].q[0].b, c.raw[s].q[0].c, c.raw[s].q[0].d};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (XT == kBF16)
          asm("max.NaN.xorsign.abs.bf16x2 %0, %0, %1;" : "+r"(top) : "r"(w[k]));
        else
          asm("max.NaN.xorsign.abs.f16x2 %0, %0, %1;" : "+r"(top) : "r"(w[k]));
      }
    }
    const u32 lo = top & 0x7FFFu;
    const u32 hi = (top >> 16) & 0x7FFFu;
    const u16 larger = static_cast<u16>(lo > hi ? lo : hi);
    return bits_of(XT == kBF16 ? bf16_to_float(larger) : fp16_to_float(larger)) & 0x7FFFFFFFu;
  }
#endif
  u32 top = 0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const u32 a = bits_of(v[s][e]) & 0x7FFFFFFFu;
      top = a > top ? a : top;
    }
  }
  return top;
}

__device__ __forceinline__ i64 warp_sum_i64(i64 v) {
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, h);
  return v;
}

// ---- a chunk's exact sums, from FP32 arithmetic that rounds nothing ------------------------------------------------
// Levels: with every |x| of the chunk below 2^(a + 1), a grid 2^g with g = a - 21 holds each x on it as an integer k
// of fewer than 22 bits, and one FMA finds it: t = x 2^-g + 1.5 2^23 lies in [2^23, 2^24), where FP32's unit is 1,
// so t is rounded to an integer and bits(t) = bits(1.5 2^23) + k. It is exact (rounds nothing) exactly when x lies on
// the grid; rounding toward zero and toward +Inf then agree, and they differ otherwise (t is positive). The sums
// follow from the bits: sum k from a 32-bit sum of bits(t), sum k^2 from a 64-bit sum of bits(t)^2 (every sum modulo
// 2^32 or 2^64, whose true values are far smaller). An element lies on the grid when its significand's last bit
// weighs at least 2^g: for 16-bit inputs every element within 14 (BF16) or 11 (FP16) binades of the largest.
inline constexpr float kMagic = 12582912.0f;  // 1.5 2^23
inline constexpr u32 kMagicBits = 0x4B400000u;
inline constexpr int kLaneElements = kSlots * kVec;

__device__ __forceinline__ float fma_rz(float a, float b, float c) { return __fmaf_rz(a, b, c); }
__device__ __forceinline__ float fma_ru(float a, float b, float c) { return __fmaf_ru(a, b, c); }

// Sum of k and of k^2 over `lanes_elements` values t = bits(1.5 2^23 + k) from their sums modulo 2^32 and 2^64.
__device__ __forceinline__ void level_sums(u32 sum_t, u64 sum_t2, int elements, i64& sum_k, i64& sum_k2) {
  const int k = static_cast<int>(sum_t - static_cast<u32>(elements) * kMagicBits);
  const u64 m = kMagicBits;
  sum_k = k;
  sum_k2 =
      static_cast<i64>(sum_t2 - static_cast<u64>(elements) * m * m - 2ull * m * static_cast<u64>(static_cast<i64>(k)));
}

// Two levels (gnsilu_exact.cuh: level_grid), for chunks whose elements do not all lie on the one grid, and FP32
// inputs. A nonzero element on neither grid marks the chunk escaped.
// CHECK false: the caller knows that the second grid holds every element (FP16 chunks below 2^10, whose second grid
// is FP16's smallest subnormal, 2^-24).
template <int XT, bool CHECK = true>
__device__ __forceinline__ exact::ChunkRecord two_level_chunk(const float (&v)[kSlots][kVec], int a,
                                                              exact::ChunkRecord r) {
  const exact::LevelGrid<XT> l = exact::level_grid<XT>(a);
  const int g = l.g;
  const int g2 = l.g2;
  const float pre = pow2f(l.shift);
  const float s = pow2f(-g);
  const float s2 = pow2f(-g2);
  u32 inexact = 0;
  i64 sum1, sum2, sum11, sum22, sum12 = 0;
  if constexpr (XT != kFP32) {
    const float threshold = pow2f(l.threshold);
    u32 t1_sum = 0, t2_sum = 0;
    u64 t1_sq = 0, t2_sq = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float x = XT == kBF16 ? v[i][e] * pre : v[i][e];
        const bool high = fabsf(x) >= threshold;
        const float x1 = high ? x : 0.0f;
        const float x2 = high ? 0.0f : x;
        const u32 t1 = bits_of(fma_rz(x1, s, kMagic));  // exact: x1 lies on the grid
        const u32 t2 = bits_of(fma_rz(x2, s2, kMagic));
        if constexpr (CHECK) inexact |= t2 ^ bits_of(fma_ru(x2, s2, kMagic));
        t1_sum += t1;
        t2_sum += t2;
        t1_sq += static_cast<u64>(t1) * t1;
        t2_sq += static_cast<u64>(t2) * t2;
      }
    }
    level_sums(t1_sum, t1_sq, kLaneElements, sum1, sum11);
    level_sums(t2_sum, t2_sq, kLaneElements, sum2, sum22);
  } else {
    const float step = -pow2f(g);
    int k1_sum = 0, k2_sum = 0;
    i64 k11 = 0, k22 = 0, k12 = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float x = v[i][e] * pre;
        const float t1 = fmaf(x, s, kMagic);            // nearest: |x - k1 2^g| <= 2^(g - 1)
        const float rest = fmaf(t1 - kMagic, step, x);  // exact
        const float t2 = fma_rz(rest, s2, kMagic);
        inexact |= bits_of(t2) ^ bits_of(fma_ru(rest, s2, kMagic));
        const int k1 = static_cast<int>(bits_of(t1) - kMagicBits);
        const int k2 = static_cast<int>(bits_of(t2) - kMagicBits);
        k1_sum += k1;
        k2_sum += k2;
        k11 += static_cast<i64>(k1) * k1;
        k22 += static_cast<i64>(k2) * k2;
        k12 += static_cast<i64>(k1) * k2;
      }
    }
    sum1 = k1_sum;
    sum2 = k2_sum;
    sum11 = k11;
    sum22 = k22;
    sum12 = k12;
  }
  if (CHECK && __any_sync(0xFFFFFFFFu, inexact != 0)) {
    r.flags = exact::kEscaped;
    return r;
  }
  sum1 = warp_sum_i64(sum1);
  sum2 = warp_sum_i64(sum2);
  sum11 = warp_sum_i64(sum11);
  sum22 = warp_sum_i64(sum22);
  if constexpr (XT == kFP32) sum12 = warp_sum_i64(sum12);
  exact::set_two_levels(r, g, g2, l.shift, sum1, sum2, sum11, sum12, sum22);
  return r;
}

// The chunk's exact sums (gnsilu_exact.cuh: ChunkRecord); every lane returns them. Absent elements are +0 and add
// nothing, so no element is masked. BF16 chunks whose elements all lie on the one grid (the usual case: every
// element within 14 binades of the largest, or zero) take two FMAs, a 32-bit and a 64-bit addition an element; other
// chunks, FP16 chunks below 2^10 and FP32 inputs take two levels.
template <int XT, bool FULL = false>
__device__ __forceinline__ exact::ChunkRecord reduce_chunk(const ChunkData<XT>& c, int lane) {
  (void)lane;
  float v[kSlots][kVec];
  chunk_values<XT>(c, v);
  exact::ChunkRecord r;
  r.n = static_cast<unsigned short>(FULL ? kChunk : c.n);
  r.flags = 0;
  r.s1 = 0;
  r.s2_lo = r.s2_hi = 0;
  const u32 top = warp_max(lane_top_bits<XT>(c, v));
  const int field = static_cast<int>(top >> 23);
  const int a = (field > 1 ? field : 1) - 127;  // every |x| < 2^(a + 1)
  r.top = static_cast<short>(a + 1);
  r.e = static_cast<short>(a + 1);
  if (top >= 0x7F800000u) {
    r.flags = exact::kNonfinite;
    return r;
  }
  if constexpr (XT == kFP16) {
    // FP16 chunks below 2^10 (the usual ones): two levels always, the second FP16's own grid (2^-24). One level holds
    // only the elements within 11 binades of the largest, which half of the chunks of normal data exceed.
    if (a <= exact::kFP16WholeBelow) return two_level_chunk<XT, false>(v, a, r);
  }
  if constexpr (XT != kFP32) {
    if (a >= exact::kTinyBelow) {
      const int g = a - 21;
      const float s = pow2f(-g);
      u32 t_sum = 0, inexact = 0;
      u64 t_sq = 0;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const u32 t = bits_of(fma_rz(v[i][e], s, kMagic));
          inexact |= t ^ bits_of(fma_ru(v[i][e], s, kMagic));
          t_sum += t;
          t_sq += static_cast<u64>(t) * t;
        }
      }
      if (!__any_sync(0xFFFFFFFFu, inexact != 0)) {
        i64 k, k2;
        level_sums(t_sum, t_sq, kLaneElements, k, k2);
        r.e = static_cast<short>(g);
        r.s1 = warp_sum_i64(k);
        r.s2_lo = static_cast<u64>(warp_sum_i64(k2));
        return r;
      }
    }
  }
  return two_level_chunk<XT>(v, a, r);
}

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

struct MergeShared {
  exact::Record total;  // sums that did not stay in registers (rare), and the slow path's record
  exact::Scratch scratch;
  WarpSums warp[kMaxMergeWarps];
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
// do not fit a common unit (gnsilu_exact.cuh: acc_fits; rare) add their own to the block's record instead.
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
// each sums its share of the records in registers (exact::Accumulator), each warp combines its threads' sums and adds
// them into the block's shared record; the elements of escaped chunks (gnsilu_exact.cuh) are then read from x and
// added the same way. Every thread returns the result.
//
// record_out: the merged record is wanted, not the statistics (finalize's kStatsWrite): it is written there,
// normalized, and the returned statistics are not computed. record_in: the record is given (kStatsRead): no chunk is
// read, and the statistics are rounded from it. One call of exact::group_stats serves both, so that the big-integer
// path is inlined once per kernel (twice made finalize spill on sm_90 and newer).
template <int XT, int LAYOUT, int THREADS, typename RecordAt>
__device__ __forceinline__ GroupStats merged_group_stats(const Params& p, i64 group, i64 count, RecordAt record_at,
                                                         MergeShared& sh, i64* record_out = nullptr,
                                                         const i64* record_in = nullptr) {
  static_assert(THREADS % 32 == 0 && THREADS / 32 <= kMaxMergeWarps, "whole warps, at most kMaxMergeWarps");
  constexpr int kWarps = THREADS / 32;
  const int t = static_cast<int>(threadIdx.x);
  const int lane = t & 31;
  const int warp = t >> 5;
  for (int i = t; i < exact::kRecordWords; i += THREADS) (&sh.total.count)[i] = record_in ? record_in[i] : 0;
  if (t == 0) sh.escaped = sh.spilled = 0;
  if (record_in != nullptr) count = 0;  // no chunk to read
  __syncthreads();
  const auto sink = shared_sink(sh.total);
  exact::Accumulator acc;
  exact::acc_clear(acc);
  bool escaped = false;
  for (i64 j = t; j < count; j += THREADS) escaped |= !exact::acc_add_chunk(acc, record_at(j), sink);
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
      const ChunkPlace place = chunk_place(p.s, p.channels_per_group, j);
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
  if (t == 0) {
    // The warps' sums into one accumulator; held whole (the usual case), the statistics come from it directly.
    const auto own = exact::sink_of(sh.total);  // thread 0 alone now: plain additions
    exact::Accumulator total;
    exact::acc_clear(total);
    int low = 1 << 20, high = -(1 << 20);
    i64 weight = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (sh.warp[w].weight == 0) continue;
      low = sh.warp[w].e < low ? sh.warp[w].e : low;
      high = sh.warp[w].top > high ? sh.warp[w].top : high;
      weight += sh.warp[w].weight;
    }
    const bool whole = record_in == nullptr && sh.spilled == 0 && (weight == 0 || exact::acc_fits(high, low, weight));
    for (int w = 0; w < kWarps; ++w) {
      const WarpSums& ws = sh.warp[w];
      total.count += ws.count;
      total.nonfinite += ws.nonfinite;
      if (ws.weight != 0) exact::acc_add(total, ws.e, ws.top, ws.weight, ws.s1, ws.s2, own);
    }
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
        // lane of a warp that reading x from memory instead measured 12% slower (PERFORMANCE.md, v6).
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
  static constexpr int kRowWords = kChunk * kBytes / 4;   // one channel's window: 512 or 1024 words
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
  Raw16 bias;  // with an input bias: the biases of the thread's vector's channels (raw bits of x's dtype)
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

// Stores units j0 ... j0 + 3 into the tile, one word per channel. BIAS: the input bias is added to the units'
// pixels (those past the window's stay +0), here, where only this batch's registers are live (added to a chunk
// after the tile, with the next item's units held, the 16-bit instances spilled on sm_75).
template <int XT, bool FULL, bool BIAS>
__device__ __forceinline__ void store_units(const TileUnits& u, int j0, const HeldUnits<XT>& h) {
  using T = Tile<XT>;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = j0 + q;
    if (FULL || j < u.count) {
      u32* words = u.row + ((u.first_word + static_cast<u32>(j) * u.word_step) ^ u.swizzle);
      Raw16 a = h.a[q];
      if constexpr (BIAS) {
        const int pixel = u.first_pixel + j * u.pixel_step;
        if (FULL || pixel < u.pixels) a = add_words<XT>(a, u.bias);
      }
      const u32 wa[4] = {a.a, a.b, a.c, a.d};
      if constexpr (XT == kFP32) {
#pragma unroll
        for (int k = 0; k < 4; ++k) words[k * T::kRowWords] = wa[k];
      } else {
        Raw16 b = h.b[q];
        if constexpr (BIAS) {
          const int pixel = u.first_pixel + j * u.pixel_step;
          if (FULL || pixel + 1 < u.pixels) b = add_words<XT>(b, u.bias);
        }
        const u32 wb[4] = {b.a, b.b, b.c, b.d};
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
template <int XT, bool FULL, bool BIAS>
__device__ __forceinline__ void store_tile_units(const TileUnits& u) {
  const char* at = u.at;
  for (int j0 = 0; j0 < u.count; j0 += 4) {
    HeldUnits<XT> h;
    load_units<XT, FULL>(u, at, j0, h);
    store_units<XT, FULL, BIAS>(u, j0, h);
    at += 4 * u.step_bytes;
  }
}

// A thread's units of item `item`'s tile, and the item's place: (sample, window, slice).
template <int XT, int THREADS, bool BIAS>
__device__ __forceinline__ TileUnits tile_units(const Params& p, i64 item, u32* tile, i64& sample, i64& window,
                                                i64& slice) {
  using T = Tile<XT>;
  constexpr int kPixelsPerUnit = XT == kFP32 ? 1 : 2;
  i64 rest;
  divide_small(item, p.cl_slices, rest, slice);
  divide_small(rest, p.chunks_per_row, sample, window);
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
  if constexpr (BIAS) {
    const i64 first = slice * slice_channels + o * T::kChannelsPerVector;  // the vector's first channel
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (XT == kFP32)
        w[k] = bias_bits<XT>(p, first + k);
      else
        w[k] = bias_bits<XT>(p, first + 2 * k) | (bias_bits<XT>(p, first + 2 * k + 1) << 16);
    }
    u.bias = Raw16{w[0], w[1], w[2], w[3]};
  }
  return u;
}

template <int XT, bool BIAS>
__device__ __forceinline__ void store_tile(const TileUnits& u) {
  if (u.pixels == kChunk && u.count % 4 == 0)
    store_tile_units<XT, true, BIAS>(u);
  else
    store_tile_units<XT, false, BIAS>(u);
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
  exact::ChunkRecord* records = static_cast<exact::ChunkRecord*>(p.records);
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
template <int XT, int WARPS, bool BIAS>
__device__ __forceinline__ void chunk_stats_tiles(const Params& p) {
  constexpr int kThreads = WARPS * 32;
  extern __shared__ Raw16 dynamic_shared[];
  u32* tile = reinterpret_cast<u32*>(dynamic_shared);
  i64 item = blockIdx.x;
  if (item >= p.cl_stats_items) return;
  i64 sample, window, slice;
  TileUnits u = tile_units<XT, kThreads, BIAS>(p, item, tile, sample, window, slice);
  if (u.count <= 4) {
    // One batch a thread (count <= 4): its loads for the next item are in flight while this item is reduced.
    HeldUnits<XT> held;
    load_units<XT, false>(u, u.at, 0, held);
    for (;;) {
      store_units<XT, false, BIAS>(u, 0, held);
      __syncthreads();
      const i64 next = item + gridDim.x;
      i64 next_sample = 0, next_window = 0, next_slice = 0;
      TileUnits following = u;
      if (next < p.cl_stats_items) {
        following = tile_units<XT, kThreads, BIAS>(p, next, tile, next_sample, next_window, next_slice);
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
    store_tile<XT, BIAS>(u);
    __syncthreads();
    reduce_tile<XT, WARPS>(p, tile, sample, window, slice, u.pixels);
    __syncthreads();  // the tile is rewritten for the next item
    item += gridDim.x;
    if (item >= p.cl_stats_items) return;
    u = tile_units<XT, kThreads, BIAS>(p, item, tile, sample, window, slice);
  }
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
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) chunk_stats(const Params p) {
  static_assert(WARPS >= 1 && WARPS <= 32, "WARPS");
  static_assert(STAGES == 1 || STAGES == 2, "STAGES");
  static_assert(LAYOUT == kChannelsFirst || LAYOUT == kChannelsLast, "LAYOUT");
  static_assert(BIAS == 0 || BIAS == 1, "BIAS");
  allow_next_kernel();
  chunk_stats_body<XT, WARPS, STAGES, LAYOUT, BIAS == 1>(p);
}

// One block of 256 threads per group (a grid-stride loop over the groups): the group's chunk records merged
// exactly (merged_group_stats), then its channels' constants.
template <int XT, int LAYOUT>
__global__ void __launch_bounds__(kPartials) finalize(const Params p) {
  __shared__ MergeShared sh;
  allow_next_kernel();
  wait_for_previous_kernel();
  const i64 count = p.chunks_per_group;
  i64* const given = static_cast<i64*>(p.group_stats);
  for (i64 group = blockIdx.x; group < p.groups_total; group += gridDim.x) {
    // kStatsRead: statistics given by the caller (merged records of regions), rounded from their record.
    const exact::ChunkRecord* records = static_cast<const exact::ChunkRecord*>(p.records) + group * count;
    const GroupStats s = merged_group_stats<XT, LAYOUT, kPartials>(
        p, group, count, [&](i64 j) { return records[j]; }, sh,
        p.stats_mode == kStatsWrite ? given + group * exact::kRecordWords : nullptr,
        p.stats_mode == kStatsRead ? given + group * exact::kRecordWords : nullptr);
    if (p.stats_mode == kStatsWrite) continue;
    const i64 sample = group / p.g;
    const i64 first_channel = (group - sample * p.g) * p.channels_per_group;
    RowConstants* rows = static_cast<RowConstants*>(p.rows);
    for (i64 k = threadIdx.x; k < p.channels_per_group; k += kPartials) {
      rows[sample * p.c + first_channel + k] = channel_constants(p, s, first_channel + k);
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

// y with a border (Params::pad), after finalize. The padded output is cut into lines: the W' positions of one
// (outer, d', h') of the last three spatial dimensions, which all show one line of x (math::padded_line) or, on a
// constant border, none. An element inside, or on a replicate border, is y of the element of x it shows, computed as
// apply computes it (transform_values with its row's constants), so the border holds F.pad's copy of the unpadded
// output's bits; a constant border is the value rounded to y's dtype. LAYOUT is y's (the variant's: where x's two
// layouts are one memory, the host picks y's). One layout per instance: with both in one kernel ptxas spilled on
// sm_100 and later.
// - Channel-major: y as one flat sequence of pieces of 8 elements, a thread per piece. A piece inside one line and
//   inside x's line (most of them) reads its 8 elements of x from the two 16-byte vectors that hold them (three for
//   FP32); one near a border, across lines or at the end of y gathers them one at a time. Both then share the
//   transform and the store (one 16-byte vector where x and y are aligned), so a warp diverges only in the gather
//   (with a path of their own, one exact SiLU at a time, the kernel was compute-bound at 15% of the DRAM bandwidth
//   on the H200: PERFORMANCE.md v16). A piece is located with
//   divisions (math::divide_small); the next line follows without (next_line). A constant border stored through a
//   vector is rounded as store_element rounds it (the host makes a NaN border the canonical one, add_padding).
// - Channels-last: a warp per (sample, line, slice of 32 kPadPerLane channels). With 16-byte vectors (x and y
//   aligned, C a multiple of 8), a lane takes 8 consecutive channels, so lanes_per_pixel lanes cover a pixel's
//   channels of the slice and the warp walks 32 / lanes_per_pixel pixels at a time, four vectors in flight a lane
//   (two for FP32 x).
//   Otherwise a lane takes channels lane, lane + 32, ... one element at a time. The lanes keep their channels'
//   constants in registers. kPadPerLane: gnsilu_params.cuh. transform<ACT> gives transform_values' bits (it is the
//   exact path those take for an element whose fast SiLU is not decided).

// One of four words (or floats) by a runtime index 0..3: selects, where indexing an array would put it in memory.
template <typename T>
__device__ __forceinline__ T pick4(int i, T a, T b, T c, T d) {
  return i == 0 ? a : (i == 1 ? b : (i == 2 ? c : d));
}

// The 8 elements of x from element `first` (any alignment; x's base 16-byte aligned), from the aligned 16-byte
// vectors that hold them: two for 16-bit x, three for FP32. The caller makes sure those vectors lie inside x.
template <int XT>
__device__ __forceinline__ void load_window(const void* x, i64 first, float (&v)[kVec]) {
  if constexpr (XT == kFP32) {
    const float* base = static_cast<const float*>(x) + (first & ~i64{3});
    const int r = static_cast<int>(first & 3);
    const Raw16 q0 = load16(base), q1 = load16(base + 4);
    const Raw16 q2 = r != 0 ? load16(base + 8) : q1;
    const u32 w[12] = {q0.a, q0.b, q0.c, q0.d, q1.a, q1.b, q1.c, q1.d, q2.a, q2.b, q2.c, q2.d};
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = float_of(pick4(r, w[j], w[j + 1], w[j + 2], w[j + 3]));
  } else {
    const u16* base = static_cast<const u16*>(x) + (first & ~i64{7});
    const int r = static_cast<int>(first & 7);
    const Raw16 q0 = load16(base);
    const Raw16 q1 = r != 0 ? load16(base + 8) : q0;
    const u32 w[8] = {q0.a, q0.b, q0.c, q0.d, q1.a, q1.b, q1.c, q1.d};
    const int q = r >> 1;
    RawVector<XT> raw;
    u32 out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const u32 lo = pick4(q, w[j], w[j + 1], w[j + 2], w[j + 3]);
      const u32 hi = pick4(q, w[j + 1], w[j + 2], w[j + 3], w[j + 4]);
      out[j] = r & 1 ? permute(lo, hi, 0x5432) : lo;  // elements 2j + r, 2j + r + 1
    }
    raw.q[0] = Raw16{out[0], out[1], out[2], out[3]};
    unpack<XT>(raw, v);
  }
}

// Rows of fewer than 8 padded elements (a tiny spatial block): a thread per piece, each element with its own row's
// constants, located from scratch (math::padded_cursor).
template <int XT, int YT, int ACT>
__device__ __forceinline__ void apply_padded_tiny_rows(const Params& p, i64 lines, i64 total) {
  const math::Padding& pad = p.pad;
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  const i64 width = pad.dims[2], out_width = pad.out_dims[2], before = pad.before[2];
  const i64 threads = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 piece = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; piece * kVec < total; piece += threads) {
    const i64 start = piece * kVec;
    i64 flat_line, position;
    divide_small(start, out_width, flat_line, position);
    PaddedCursor at = padded_cursor(p.pad, p.s, flat_line, lines);
#pragma unroll 1
    for (int k = 0; k < kVec && start + k < total; ++k) {
      if (position == out_width) {
        position = 0;
        next_padded_line(p.pad, p.s, at, lines);
      }
      i64 w = position - before;
      const bool shows = at.shown && (pad.mode == kPadReplicate || (w >= 0 && w < width));
      w = w < 0 ? 0 : (w >= width ? width - 1 : w);
      store_element<YT>(
          p.y, start + k,
          shows ? transform<ACT>(biased<XT>(p, load_element<XT>(p.x, at.x_line + w), at.row % p.c), rows[at.row])
                : pad.value);
      ++position;
    }
  }
}

// Channel-major: each warp takes one run of consecutive pieces of y (the pieces divided evenly among the grid's
// warps, in multiples of 32), lane l the run's pieces l, l + 32, ... Each lane locates its first piece with divisions
// (math::padded_cursor) and then carries its cursor forward, 256 elements a step, line by line (next_padded_line):
// the divisions that located every piece anew made the kernel compute-bound at 15% of the DRAM bandwidth
// (PERFORMANCE.md v16).
template <int XT, int YT, int ACT>
__device__ __forceinline__ void apply_padded_channels_first(const Params& p) {
  const math::Padding& pad = p.pad;
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  const i64 width = pad.dims[2], out_width = pad.out_dims[2], before = pad.before[2];
  const i64 lines = pad.out_s / out_width;  // output lines per row (sample, channel)
  const i64 row_count = p.n * p.c;
  const i64 x_total = row_count * p.s;
  const i64 total = row_count * pad.out_s;
  if (pad.out_s < kVec) {
    apply_padded_tiny_rows<XT, YT, ACT>(p, lines, total);
    return;
  }
  // Rows of at least 8 elements from here: a piece meets at most two rows, whose constants stay in registers.
  constexpr i64 kXVector = XT == kFP32 ? 4 : 8;  // elements of x in a 16-byte vector
  constexpr i64 kStep = kLanes * kVec;           // elements from a lane's piece to its next one
  const bool has_bias = p.input_bias != nullptr;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const i64 warps = static_cast<i64>(gridDim.x) * (blockDim.x / 32);
  const i64 warp = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const i64 pieces = (total + kVec - 1) / kVec;
  const i64 per_warp = ((pieces + warps - 1) / warps + kLanes - 1) / kLanes * kLanes;
  const i64 first_piece = warp * per_warp + lane;
  if (first_piece >= pieces) return;
  i64 start = first_piece * kVec;
  const i64 end = (warp + 1) * per_warp * kVec < total ? (warp + 1) * per_warp * kVec : total;
  i64 flat_line, position;
  divide_small(start, out_width, flat_line, position);
  PaddedCursor at = padded_cursor(p.pad, p.s, flat_line, lines);
  // The constants (and input bias) of the row last loaded.
  i64 loaded_row = -1;
  RowConstants rc_first{};
  float b_first = 0.0f;
  for (; start < end;) {
    const i64 first_row = at.row;
    if (first_row != loaded_row) {
      loaded_row = first_row;
      const i64 r = first_row < row_count ? first_row : 0;
      rc_first = rows[r];
      b_first = has_bias ? load_element<XT>(p.input_bias, r % p.c) : 0.0f;
    }
    const i64 w0 = position - before;
    const i64 window = at.x_line + w0;
    float v[kVec];
    RowConstants rc_second = rc_first;
    float b_second = b_first;
    unsigned shown = 0, second = 0;  // bit k: element k shows x; element k is of the second row
    if (p.pad_vectors && at.shown && position + kVec <= out_width && w0 >= 0 && w0 + kVec <= width &&
        (window & ~(kXVector - 1)) + (XT == kFP32 ? 12 : 16) <= x_total) {
      // The common case: 8 elements of one line, all inside x's line.
      load_window<XT>(p.x, window, v);
      if (has_bias) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[k] = add_in<XT>(v[k], b_first);
      }
      shown = 0xFFu;
    } else {
      // Near a border, across lines or at the end of y: the elements one at a time, on a copy of the cursor (the
      // arithmetic below is shared, so that a warp whose lanes took both branches diverges only here).
      PaddedCursor c = at;
      i64 q = position;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (q == out_width) {
          q = 0;
          next_padded_line(p.pad, p.s, c, lines);
          if (c.row != first_row && second == 0 && c.row < row_count) {
            rc_second = rows[c.row];
            if (has_bias) b_second = load_element<XT>(p.input_bias, c.row % p.c);
          }
        }
        if (c.row != first_row) second |= 1u << k;
        i64 w = q - before;
        const bool shows = c.shown && start + k < total && (pad.mode == kPadReplicate || (w >= 0 && w < width));
        w = w < 0 ? 0 : (w >= width ? width - 1 : w);
        v[k] = shows ? load_element<XT>(p.x, c.x_line + w) : 0.0f;
        if (has_bias) v[k] = add_in<XT>(v[k], c.row != first_row ? b_second : b_first);
        shown |= shows ? 1u << k : 0u;
        ++q;
      }
    }
    const auto row_of = [&](int k) -> const RowConstants& { return second & (1u << k) ? rc_second : rc_first; };
    transform_values<YT, ACT, false>(v, row_of, [&](int e) { return v[e]; });
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = shown & (1u << k) ? v[k] : pad.value;
    if (p.pad_vectors && start + kVec <= total) {
      store_vector<YT>(p.y, start, v);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (start + k < total) store_element<YT>(p.y, start + k, v[k]);
      }
    }
    // The lane's next piece: kStep elements on, lines followed one by one.
    start += kStep;
    if (start >= end) break;
    advance_padded(pad, p.s, lines, at, position, kStep);
  }
}

// Channels-last, 16-byte vectors: a lane's 8 channels of pixels at, at + pixels_per_step, ...
template <int XT, int YT, int ACT>
__device__ __forceinline__ void padded_pixels_vectorized(const Params& p, i64 x_line, i64 y_line, bool shown,
                                                         const RowConstants (&rc)[kVec], const RawVector<XT>& bias,
                                                         int first_pixel, int pixels_per_step) {
  const bool has_bias = p.input_bias != nullptr;
  const math::Padding& pad = p.pad;
  const i64 width = pad.dims[2], out_width = pad.out_dims[2], before = pad.before[2];
  // The constant border's bits, as store_element rounds it.
  const u32 border = YT == kFP32 ? float_canonical_bits(pad.value)
                                 : (YT == kBF16 ? float_to_bf16(pad.value) : float_to_fp16(pad.value)) * 0x10001u;
  const auto per_channel = [&](int e) -> const RowConstants& { return rc[e]; };
  constexpr int kInFlight = XT == kFP32 ? 2 : 4;  // vectors a lane loads before transforming them
  for (i64 at = first_pixel; at < out_width; at += kInFlight * pixels_per_step) {
    RawVector<XT> raw[kInFlight];
    bool shows[kInFlight];
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const i64 pixel = at + q * pixels_per_step;
      i64 w = pixel - before;
      shows[q] = shown && pixel < out_width && (pad.mode == kPadReplicate || (w >= 0 && w < width));
      w = w < 0 ? 0 : (w >= width ? width - 1 : w);
      if (shows[q]) raw[q] = load_raw<XT>(p.x, x_line + w * p.c);
    }
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const i64 pixel = at + q * pixels_per_step;
      if (pixel >= out_width) continue;
      if (shows[q]) {
        float v[kVec];
        unpack<XT>(has_bias ? add_raw<XT>(raw[q], bias) : raw[q], v);
        transform_values<YT, ACT, false>(v, per_channel, [&](int e) { return v[e]; });
        store_vector<YT>(p.y, y_line + pixel * p.c, v);
      } else {
        if constexpr (YT == kFP32) {
          float* at_y = static_cast<float*>(p.y) + y_line + pixel * p.c;
          store16(at_y, border, border, border, border);
          store16(at_y + 4, border, border, border, border);
        } else {
          store16(static_cast<u16*>(p.y) + y_line + pixel * p.c, border, border, border, border);
        }
      }
    }
  }
}

template <int XT, int YT, int ACT>
__device__ __forceinline__ void apply_padded_channels_last(const Params& p) {
  const math::Padding& pad = p.pad;
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  const int lane = threadIdx.x & 31;
  const i64 warps = static_cast<i64>(gridDim.x) * (blockDim.x / 32);
  const i64 first = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const i64 width = pad.dims[2], out_width = pad.out_dims[2], before = pad.before[2];
  const i64 lines = pad.out_s / out_width;
  constexpr i64 kSpan = 32 * kPadPerLane;  // channels of a slice
  const i64 slices = (p.c + kSpan - 1) / kSpan;
  // Vectorized: a pixel's vectors of the slice (at most 32) on lanes_per_pixel lanes, a power of two.
  const i64 vectors = p.c / kVec;
  int lanes_per_pixel = 32;
  while (lanes_per_pixel > 1 && lanes_per_pixel / 2 >= vectors) lanes_per_pixel /= 2;
  for (i64 item = first; item < p.n * lines * slices; item += warps) {
    i64 key, slice, sample, line, source = 0;
    divide_small(item, slices, key, slice);
    divide_small(key, lines, sample, line);
    const bool shown = padded_line(pad, line, source);
    const i64 x_row = (sample * p.s + source * width) * p.c;
    const i64 y_row = (sample * pad.out_s + line * out_width) * p.c;
    if (p.vectorized) {
      const i64 vector = slice * 32 + lane % lanes_per_pixel;
      if (vector >= vectors) continue;  // no shuffles below: idle lanes may leave
      RowConstants rc[kVec];
      RawVector<XT> bias = broadcast_raw<XT>(0u);
      if (shown) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) rc[e] = rows[sample * p.c + vector * kVec + e];
        if (p.input_bias != nullptr) {
          bias = raw_from_bits<XT>([&](int e) { return bias_bits<XT>(p, vector * kVec + e); });
        }
      }
      padded_pixels_vectorized<XT, YT, ACT>(p, x_row + vector * kVec, y_row + vector * kVec, shown, rc, bias,
                                            lane / lanes_per_pixel, 32 / lanes_per_pixel);
      continue;
    }
    // One element a lane (the fallback where vectors do not fit): the slice's channels 32 at a time, a channel a
    // lane, two pixels loaded before they are transformed.
    constexpr int kPixels = 2;
    for (int part = 0; part < kPadPerLane; ++part) {
      const i64 channel = slice * kSpan + 32 * part + lane;
      if (channel >= p.c) break;
      const RowConstants rc = shown ? rows[sample * p.c + channel] : RowConstants{};
      for (i64 at = 0; at < out_width; at += kPixels) {
        float v[kPixels];
        bool shows[kPixels];
#pragma unroll
        for (int q = 0; q < kPixels; ++q) {
          i64 w = at + q - before;
          shows[q] = shown && at + q < out_width && (pad.mode == kPadReplicate || (w >= 0 && w < width));
          w = w < 0 ? 0 : (w >= width ? width - 1 : w);
          v[q] = shows[q] ? biased<XT>(p, load_element<XT>(p.x, x_row + w * p.c + channel), channel) : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < kPixels; ++q) {
          if (at + q < out_width) {
            store_element<YT>(p.y, y_row + (at + q) * p.c + channel, shows[q] ? transform<ACT>(v[q], rc) : pad.value);
          }
        }
      }
    }
  }
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
