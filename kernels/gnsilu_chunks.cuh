// gnsilu kernels: a chunk of 1024 elements in one warp's registers: its loads (channel-major runs, full aligned
// chunks, channels-last gathers), the input bias added as it is loaded, and its exact sums (a ChunkRecord).
// A part of group_norm_silu.cu, compiled with it by NVRTC at run time.
#pragma once

#include "gnsilu_exact.cuh"
#include "gnsilu_vectors.cuh"

namespace gnsilu {
namespace kernel {

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
// is compiled as if the bias did not exist: a test per row or chunk cost 1-7% at small shapes, and both bodies in
// one kernel, branched at its top, still 2-7% (ptxas gives the two one register layout and one schedule;
// docs/PERFORMANCE.md, the input bias). A call with a bias takes the split path (the fused kernel has no bias).
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

}  // namespace kernel
}  // namespace gnsilu
