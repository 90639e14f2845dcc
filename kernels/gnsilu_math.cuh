// gnsilu: the arithmetic of y = silu(group_norm(x)), shared by the GPU kernels and the CPU reference.
//
// Why this file exists. The library promises output bits that depend on nothing but the inputs: not on the
// launch configuration the tuner picks, not on the GPU, and equal to a CPU reference. That holds only if
// every step is an IEEE-754 correctly rounded basic operation (add, subtract, multiply, fma, divide, square
// root, conversion) applied in one fixed order. So:
//   * every function below is written out in such operations, with contraction off on both sides
//     (NVRTC --fmad=false, host -ffp-contract=off) and fma only where it is spelled fma32;
//   * the exponential is ours: the toolkit's expf and glibc's expf can differ in the last bit;
//   * 16-bit values are read and written as bits, with round-to-nearest-even written out (or done by the
//     hardware's conversion where it rounds the same way), and NaN outputs are canonical (0x7FFF bf16 and
//     fp16, 0x7FC00000 fp32) so that every platform stores the same bits.
//
// The statistics (gnsilu_exact.cuh): a group's mean and variance are its exact sum and sum of squares, divided by
// its size and rounded once to FP64. Exact sums do not depend on the order of the additions, so the kernels may cut
// a group any way they like: into chunks of up to 1024 elements that never straddle a channel (chunk geometry
// below; in NCHW a contiguous run, in channels-last a tile of pixels), reduced by warps, blocks or tiles in any
// order, or into regions of a tiled decode. None of that is part of the definition.
//
// Why the numbers are good: the statistics are exact up to their one rounding; the mean is applied as m32 = fp32(m)
// with the rounding error m - m32 folded into the shift in FP64; x - m32 is exact near the mean (Sterbenz); the
// pre-activation is computed around its zero crossing so that it keeps its relative accuracy where it is small
// (row_constants); SiLU is one exponential (< 1 ulp) and one division.
#pragma once

#if defined(__CUDACC__)
#define GNSILU_HD __host__ __device__ __forceinline__
#else
#define GNSILU_HD inline
#endif

namespace gnsilu {
namespace math {

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// dtype codes: the public enum gnsilu_dtype uses the same numbers.
enum : int { kNone = 0, kBF16 = 1, kFP16 = 2, kFP32 = 3 };
// Memory layouts (gnsilu_layout): channel-major (N, C, *spatial) or channels-last (N, *spatial, C).
enum : int { kChannelsFirst = 0, kChannelsLast = 1 };
// Activations after the normalization (gnsilu_activation): y = silu(v) or y = v.
enum : int { kSiLU = 0, kNoActivation = 1 };

inline constexpr int kChunk = 1024;           // elements per chunk record
inline constexpr int kVec = 8;                // elements per vector (16 bytes of 16-bit data)
inline constexpr int kLanes = 32;             // lanes of the warp that reduces a chunk
inline constexpr int kSlots = kChunk / (kVec * kLanes);  // vectors per lane: 4
inline constexpr int kPartials = 256;         // threads of the block that merges a group's records (finalize)

// ---- bits ------------------------------------------------------------------------------------------------
GNSILU_HD u32 bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  u32 u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
#endif
}
GNSILU_HD float float_of(u32 u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
#endif
}
GNSILU_HD u64 bits_of(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<u64>(__double_as_longlong(d));
#else
  u64 u;
  __builtin_memcpy(&u, &d, sizeof u);
  return u;
#endif
}
GNSILU_HD double double_of(u64 u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<i64>(u));
#else
  double d;
  __builtin_memcpy(&d, &u, sizeof d);
  return d;
#endif
}

// ---- correctly rounded operations, spelled out -------------------------------------------------------------
GNSILU_HD float fma32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}
GNSILU_HD double fma64(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return __builtin_fma(a, b, c);
#endif
}
GNSILU_HD float div32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
GNSILU_HD double div64(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
GNSILU_HD double sqrt64(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);
#endif
}
GNSILU_HD float narrow(double d) {  // FP64 -> FP32, nearest even
#if defined(__CUDA_ARCH__)
  return __double2float_rn(d);
#else
  return static_cast<float>(d);
#endif
}
GNSILU_HD bool is_finite(double v) { return v - v == 0.0; }
GNSILU_HD bool is_nan(float v) { return !(v == v); }

// 2^e as a float, -126 <= e <= 127 (normal numbers only).
GNSILU_HD float pow2f(int e) { return float_of(static_cast<u32>(e + 127) << 23); }
// 2^e as a double, -1022 <= e <= 1023.
GNSILU_HD double pow2d(int e) { return double_of(static_cast<u64>(e + 1023) << 52); }
// floor(log2 |v|) for a normal float given the bits of |v|; -127 for zero and subnormals, 128 for Inf/NaN.
GNSILU_HD int exponent_of(u32 abs_bits) { return static_cast<int>(abs_bits >> 23) - 127; }
// Nearest integer (ties to even) of |v| < 2^22, as a float: the classic add-and-subtract of 1.5 * 2^23.
GNSILU_HD float round_to_int(float v) {
  const float magic = 12582912.0f;
  return (v + magic) - magic;
}

// ---- 16-bit formats, as bits ---------------------------------------------------------------------------
GNSILU_HD float bf16_to_float(u16 h) { return float_of(static_cast<u32>(h) << 16); }

// Largest magnitude so far: NaN is skipped (as fmax does), which cannot matter (a NaN poisons the chunk's
// sums and so its group), and costs one instruction on the GPU.
GNSILU_HD float max_abs(float top, float v) {
#if defined(__CUDA_ARCH__)
  return fmaxf(top, fabsf(v));
#else
  return __builtin_fmaxf(top, __builtin_fabsf(v));
#endif
}

// The fp16 bits shifted into a float's exponent and mantissa fields are the value times 2^-112 (subnormals
// included, as float subnormals); one exact multiplication rebiases. Inf and NaN take the all-ones exponent.
GNSILU_HD float fp16_to_float(u16 h) {
#if defined(__CUDA_ARCH__)
  float f;  // exact: the hardware conversion gives the same value in one instruction
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  const u32 sign = static_cast<u32>(h & 0x8000u) << 16;
  const u32 magnitude = static_cast<u32>(h & 0x7FFFu) << 13;
  const u32 scaled = bits_of(float_of(magnitude) * pow2f(112));
  const u32 special = 0x7F800000u | (magnitude & 0x007FE000u);
  return float_of(sign | ((h & 0x7C00u) == 0x7C00u ? special : scaled));
#endif
}

GNSILU_HD u16 float_to_bf16(float f) {
  u32 u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;  // canonical NaN
  u += 0x7FFFu + ((u >> 16) & 1u);                        // nearest even; overflow carries into Inf
  return static_cast<u16>(u >> 16);
}

GNSILU_HD u16 float_to_fp16(float f) {
  const u32 u = bits_of(f);
  const u32 sign = (u >> 16) & 0x8000u;
  u32 a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7FFFu;                 // canonical NaN
  if (a >= 0x477FF000u) return static_cast<u16>(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (a < 0x38800000u) {                               // below 2^-14: a multiple of 2^-24
    // |f| * 2^24 is exact (< 1024) and round_to_int rounds it to nearest even; 1024 becomes 2^-14.
    const float scaled = float_of(a) * pow2f(24);
    return static_cast<u16>(sign | static_cast<u32>(round_to_int(scaled)));
  }
  a -= 112u << 23;                                     // rebias the exponent from 127 to 15
  a += 0x0FFFu + ((a >> 13) & 1u);                     // nearest even on the 13 dropped bits
  return static_cast<u16>(sign | (a >> 13));
}

GNSILU_HD u32 float_canonical_bits(float f) { return is_nan(f) ? 0x7FC00000u : bits_of(f); }

// Two floats to two 16-bit values in one word (lo in the low half). From sm_80 the hardware conversion does
// it in one instruction with the same rounding (nearest even, overflow to Inf, subnormals kept) and the same
// NaN (0x7FFF: every NaN the kernels convert is an arithmetic result, all of whose payload bits are set).
GNSILU_HD u32 pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
#else
  return static_cast<u32>(float_to_bf16(lo)) | static_cast<u32>(float_to_bf16(hi)) << 16;
#endif
}
GNSILU_HD u32 pack_fp16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 out;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
#else
  return static_cast<u32>(float_to_fp16(lo)) | static_cast<u32>(float_to_fp16(hi)) << 16;
#endif
}

// ---- exp and SiLU --------------------------------------------------------------------------------------
// exp(a) = p * 2^k in FP32: a = k ln2 + r (Cody-Waite, exact first step), p = e^r from 1 + r + r^2 q(r) with
// q a Taylor polynomial through r^6/8!; p in [0.70, 1.42] has an error under one ulp. -104 <= a <= 89.
struct ExpParts {
  float p;
  int k;
};
GNSILU_HD ExpParts exp32_parts(float a) {
  const float ln2_hi = 0.693145751953125f;     // 0x3F317200: k * ln2_hi is exact for |k| < 2^9
  const float ln2_lo = 1.42860677e-06f;        // ln2 - ln2_hi
  // n = nearest integer of a log2(e), by adding 1.5 * 2^23: the sum's low mantissa bits hold n as an integer.
  const float shifted = a * 1.44269502f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  float r = fma32(-n, ln2_hi, a);
  r = fma32(-n, ln2_lo, r);
  float q = 2.48015873e-05f;                   // 1/8!
  q = fma32(q, r, 1.98412698e-04f);            // 1/7!
  q = fma32(q, r, 1.38888889e-03f);            // 1/6!
  q = fma32(q, r, 8.33333333e-03f);            // 1/5!
  q = fma32(q, r, 4.16666667e-02f);            // 1/4!
  q = fma32(q, r, 1.66666667e-01f);            // 1/3!
  q = fma32(q, r, 0.5f);                       // 1/2!
  return {1.0f + fma32(q, r * r, r), static_cast<int>(bits_of(shifted)) - 0x4B400000};
}

// m * 2^k for normal m of magnitude below 2^8 and -160 <= k <= 129: the first product is exact (the
// intermediate stays normal), the second rounds once, so subnormal results are rounded once and overflow
// rounds to Inf.
GNSILU_HD float scale_pow2(float m, int k) {
  const int k1 = k / 2;
  return (m * pow2f(k1)) * pow2f(k - k1);
}

// exp(a) in FP32 with an error under one ulp.
GNSILU_HD float exp32(float a) {
  if (is_nan(a)) return a + a;
  if (a > 89.0f) return float_of(0x7F800000u);
  if (a < -104.0f) return 0.0f;
  const ExpParts e = exp32_parts(a);
  return scale_pow2(e.p, e.k);
}

// silu(v) = v / (1 + exp(-v)), one IEEE division (PyTorch's FP32 formula). Below -80, where exp(-v) nears the
// top of the range (and overflows past -88.7, where PyTorch returns -0), v * exp(v) is the same to 1e-34
// relative and is computed as (v * p) * 2^k so that a result near the subnormal range is rounded once.
//
// In the division branch -v is clamped to at least -87: below that exp(-v) < 2^-125 and 1 + exp(-v) rounds to 1
// exactly as without the clamp (and a NaN v gives v / 1 = NaN), so 2^k is one normal float and exp(-v) = p 2^k
// is one multiplication rounded once: the value of exp32(-v) in fewer instructions. (A branch-free variant with
// exp(-|v|) for both signs measured 12% more instructions in the apply kernel on the H200: see PERFORMANCE.md.)
GNSILU_HD float silu32(float v) {
  if (v < -80.0f) {
    if (v < -120.0f) return -0.0f;
    const ExpParts e = exp32_parts(v);
    return scale_pow2(v * e.p, e.k);
  }
  const float a = -v > -87.0f ? -v : -87.0f;
  const ExpParts e = exp32_parts(a);  // -126 <= k <= 116
  return div32(v, 1.0f + e.p * pow2f(e.k));
}

// x + b in dtype T, both of T (the input bias, Params::input_bias): the FP32 sum rounded once to T, which is what
// PyTorch's x + b gives in T. For BF16 and FP16 it is also the exact sum rounded to T: FP32 holds at least 2p + 1
// bits of T's p, so rounding the sum twice rounds it as once (and sums of two FP16 subnormals are exact in FP32).
template <int T>
GNSILU_HD float add_in(float x, float b) {
  const float sum = x + b;
  if constexpr (T == kBF16)
    return bf16_to_float(float_to_bf16(sum));
  else if constexpr (T == kFP16)
    return fp16_to_float(float_to_fp16(sum));
  else
    return sum;
}

// ---- loads and stores by dtype code ----------------------------------------------------------------------
template <int T>
GNSILU_HD float load_element(const void* p, i64 i) {
  static_assert(T == kBF16 || T == kFP16 || T == kFP32, "dtype");
  if constexpr (T == kBF16) return bf16_to_float(static_cast<const u16*>(p)[i]);
  else if constexpr (T == kFP16) return fp16_to_float(static_cast<const u16*>(p)[i]);
  else return static_cast<const float*>(p)[i];
}

// The bits dtype T stores for v (16-bit dtypes in the low half): the one rounding of every output.
template <int T>
GNSILU_HD u32 output_bits(float v) {
  static_assert(T == kBF16 || T == kFP16 || T == kFP32, "dtype");
  if constexpr (T == kBF16) return float_to_bf16(v);
  else if constexpr (T == kFP16) return float_to_fp16(v);
  else return float_canonical_bits(v);
}

template <int T>
GNSILU_HD void store_element(void* p, i64 i, float v) {
  if constexpr (T == kFP32) static_cast<u32*>(p)[i] = output_bits<T>(v);
  else static_cast<u16*>(p)[i] = static_cast<u16>(output_bits<T>(v));
}

// A per-channel parameter (weight or bias) of any dtype, as a double; `fallback` when absent.
GNSILU_HD double load_parameter(const void* p, int dtype, i64 i, double fallback) {
  if (p == nullptr || dtype == kNone) return fallback;
  if (dtype == kBF16) return static_cast<double>(bf16_to_float(static_cast<const u16*>(p)[i]));
  if (dtype == kFP16) return static_cast<double>(fp16_to_float(static_cast<const u16*>(p)[i]));
  return static_cast<double>(static_cast<const float*>(p)[i]);
}

// q = a / b and r = a % b for a >= 0, b >= 1, in 32-bit arithmetic when both fit (the common case): a 64-bit
// division is a subroutine call on the GPU.
GNSILU_HD void divide_small(i64 a, i64 b, i64& q, i64& r) {
  if (((a | b) >> 32) == 0) {
    const u32 ua = static_cast<u32>(a), ub = static_cast<u32>(b);
    const u32 uq = ua / ub;
    q = uq;
    r = ua - uq * ub;
  } else {
    q = a / b;
    r = a - q * b;
  }
}

// ---- padded output: y is the output with a border on the last three spatial dimensions -------------------
// (PyTorch's F.pad(y, ...) of the unpadded output, written by the same launch.) A position of a channel's padded
// spatial block reads the element of x it shows: itself inside, the nearest edge element for replicate padding;
// a constant border reads nothing. Dimensions before the last three (and absent ones, of size 1) are not padded.
enum : int { kPadNone = 0, kPadConstant = 1, kPadReplicate = 2 };
struct Padding {
  i64 dims[3];      // x's last three spatial sizes, outermost first (1 for a dimension x does not have)
  i64 before[3];    // elements added before and after each of them
  i64 after[3];
  i64 out_dims[3];  // dims + before + after
  i64 out_s;        // padded spatial elements per channel (the leading spatial dimensions times out_dims)
  int mode;         // kPadNone, kPadConstant (the border is `value`) or kPadReplicate
  float value;      // the constant border, before its rounding to y's dtype
};
// Whether output line (outer, d_out, h_out) (the out_dims[2] positions of one (outer, d', h') of a channel's padded
// block) shows a line of x, which is then line *source (its first element at *source * dims[2] of x's channel);
// false where the line lies on a constant border. A shown line's positions show x's elements clamped (replicate)
// or, on a constant border, none (padded_source).
GNSILU_HD bool padded_line_at(const Padding& pad, i64 outer, i64 d_out, i64 h_out, i64& source) {
  i64 d = d_out - pad.before[0], h = h_out - pad.before[1];
  const bool inside = d >= 0 && d < pad.dims[0] && h >= 0 && h < pad.dims[1];
  if (!inside && pad.mode != kPadReplicate) return false;
  d = d < 0 ? 0 : (d >= pad.dims[0] ? pad.dims[0] - 1 : d);
  h = h < 0 ? 0 : (h >= pad.dims[1] ? pad.dims[1] - 1 : h);
  source = (outer * pad.dims[0] + d) * pad.dims[1] + h;
  return true;
}
// The same for line `line` of a channel's padded block (0 <= line < out_s / out_dims[2]).
GNSILU_HD bool padded_line(const Padding& pad, i64 line, i64& source) {
  i64 rest, h_out, outer, d_out;
  divide_small(line, pad.out_dims[1], rest, h_out);
  divide_small(rest, pad.out_dims[0], outer, d_out);
  return padded_line_at(pad, outer, d_out, h_out, source);
}
// Channel-major apply_padded's tiles: y as one flat sequence of lines (out_dims[2] elements each, out_s / out_dims[2]
// a row of (sample, channel)), cut into tiles that a block stages in shared memory before it stores them. A tile
// is a run of whole lines (at most kPadTileLines, at most `capacity` elements) or, where one line is longer than
// `capacity`, one segment of a line. Either way a tile is one contiguous range of y. The host sizes the grid from
// the same function (src/runtime/plan.cpp).
inline constexpr i64 kPadTileLines = 256;
struct PaddedTiling {
  i64 lines;     // lines in all of y
  i64 per_tile;  // lines a tile (1 where lines are cut into segments)
  i64 segment;   // elements of a line a tile takes (out_dims[2] where a tile holds whole lines)
  i64 segments;  // tiles a line (1 where a tile holds whole lines)
  i64 tiles;
};
GNSILU_HD PaddedTiling padded_tiling(const Padding& pad, i64 rows, i64 capacity) {
  PaddedTiling t{};
  const i64 width = pad.out_dims[2];
  t.lines = rows * (pad.out_s / width);
  if (width <= capacity) {
    t.per_tile = capacity / width < kPadTileLines ? capacity / width : kPadTileLines;
    t.segment = width;
    t.segments = 1;
    t.tiles = (t.lines + t.per_tile - 1) / t.per_tile;
  } else {
    t.per_tile = 1;
    t.segment = capacity;
    t.segments = (width + capacity - 1) / capacity;
    t.tiles = t.lines * t.segments;
  }
  return t;
}
// Whether padded position q (0 <= q < out_s) shows an element of x, which is then at position *source of x's
// channel; false for the constant border.
GNSILU_HD bool padded_source(const Padding& pad, i64 q, i64& source) {
  i64 coordinate[3];
  i64 outer = q;
  for (int d = 2; d >= 0; --d) {
    const i64 next = outer / pad.out_dims[d];
    coordinate[d] = outer - next * pad.out_dims[d] - pad.before[d];
    outer = next;
  }
  i64 at = outer;
  for (int d = 0; d < 3; ++d) {
    i64 k = coordinate[d];
    if (k < 0 || k >= pad.dims[d]) {
      if (pad.mode != kPadReplicate) return false;
      k = k < 0 ? 0 : pad.dims[d] - 1;
    }
    at = at * pad.dims[d] + k;
  }
  source = at;
  return true;
}

// ---- chunk geometry: how the kernels share out a group (no part of the definition of the result) ------------
// Channels per chunk: 1 when S > 512 (a chunk is a run of one channel's positions), else floor(1024 / S).
GNSILU_HD i64 chunk_channels(i64 s) { return s > kChunk / 2 || s < 1 ? 1 : kChunk / s; }
// Chunks per channel: ceil(S / 1024) when S > 512, else 1.
GNSILU_HD i64 chunks_per_channel(i64 s) { return s > kChunk / 2 ? (s + kChunk - 1) / kChunk : 1; }
// Chunks per group of `channels_per_group` channels.
GNSILU_HD i64 chunks_per_group(i64 s, i64 channels_per_group) {
  const i64 m = chunk_channels(s);
  return chunks_per_channel(s) * ((channels_per_group + m - 1) / m);
}

// Chunk j of a group: channels [first_channel, first_channel + channels) of the group and positions
// [first_pixel, first_pixel + pixels) of each; one of channels and (pixels < S) is 1 / false.
struct ChunkPlace {
  i64 first_channel;  // within the group
  i64 channels;
  i64 first_pixel;
  i64 pixels;
};
GNSILU_HD ChunkPlace chunk_place(i64 s, i64 channels_per_group, i64 j) {
  const i64 m = chunk_channels(s);
  const i64 r = chunks_per_channel(s);
  const i64 block = j / r;
  const i64 k = j - block * r;
  ChunkPlace c;
  c.first_channel = block * m;
  const i64 left = channels_per_group - c.first_channel;
  c.channels = left < m ? left : m;
  c.first_pixel = k * kChunk;
  const i64 rest = s - c.first_pixel;
  c.pixels = rest < kChunk ? rest : kChunk;
  return c;
}

struct GroupStats {
  double mean;    // m
  double rstd;    // 1 / sqrt(var + eps); NaN when the group holds NaN or Inf
  float mean32;   // fp32(m)
  int apply_e;    // the apply step computes with x * 2^-apply_e (1 only when |x| may reach 2^126)
};

// What the apply step needs per (sample, channel): y = silu(fma(fma(x, u, -z), k, c)).
//
// The pre-activation v = (x - m) * s + b (s = w * rstd) crosses zero at x0 = m - b / s. Written as
// v = (x - x0_hi) * s - (x0 - x0_hi) * s with x0_hi = fp32(x0), the first difference is exact near the
// crossing (Sterbenz) and rounds relative to |x - x0| elsewhere, so v keeps a few-ulp relative error even
// where it is tiny; the plain form (x - m32) * s + (b - (m - m32) s) loses all relative accuracy there.
// The mean's rounding is corrected either way (x0 and the second term are computed in FP64). The plain
// form remains for s = 0 or a crossing beyond 2^126, and for NaN statistics (which make v NaN).
struct alignas(16) RowConstants {
  float u;  // 2^-apply_e
  float z;  // x0_hi * u, or m32 * u
  float k;  // fp32(s * 2^apply_e)
  float c;  // fp32(-(x0 - x0_hi) * s), or fp32(b - (m - m32) * s)
};

GNSILU_HD RowConstants row_constants(const GroupStats& st, double weight, double bias) {
  RowConstants rc;
  rc.u = pow2f(-st.apply_e);
  const double s = weight * st.rstd;
  rc.k = narrow(s * pow2d(st.apply_e));
  const double x0 = s != 0.0 ? st.mean - div64(bias, s) : 0.0;
  const double limit = 8.507059173023462e37;  // 2^126
  if (s != 0.0 && is_finite(x0) && x0 < limit && x0 > -limit) {
    const float x0_hi = narrow(x0);
    rc.z = x0_hi * rc.u;
    rc.c = narrow(-((x0 - static_cast<double>(x0_hi)) * s));
  } else {
    rc.z = st.mean32 * rc.u;
    rc.c = narrow(bias - (st.mean - static_cast<double>(st.mean32)) * s);
  }
  return rc;
}

// The pre-activation v = (x - mean) * s + b of one element, around the zero crossing (see RowConstants).
GNSILU_HD float preactivation(float x, const RowConstants& rc) {
  const float t = fma32(x, rc.u, -rc.z);
  return fma32(t, rc.k, rc.c);
}

// y of one element, before its rounding to the output dtype.
template <int ACT = kSiLU>
GNSILU_HD float transform(float x, const RowConstants& rc) {
  static_assert(ACT == kSiLU || ACT == kNoActivation, "activation");
  if constexpr (ACT == kSiLU) return silu32(preactivation(x, rc));
  else return preactivation(x, rc);
}

#if defined(__CUDA_ARCH__)
// ---- SiLU for a 16-bit output, decided fast where it can be --------------------------------------------
// A bf16 or fp16 output needs silu32(v) rounded to 16 bits, and nothing more. silu_estimate(v) uses the
// hardware's approximate 2^x and reciprocal (two MUFU instructions instead of silu32's polynomial and IEEE
// division); for |v| <= 64 it stays within a few dozen FP32 ulps of silu32(v) (the rounding of v log2(e),
// ex2.approx, rcp.approx and three roundings, plus silu32's own error). silu16_decided(v, f) accepts f when
// the FP32 bits that rounding to 16 bits drops lie farther from the rounding midpoint than the margin
// 1.25 |v| + 16 ulps (fp16: f also normal, where the rounding position is fixed): then silu32(v), within the
// margin of f, rounds to the same 16-bit value, and silu32 need not run; otherwise it does. Output bits never
// change: tests/gpu/test_gpu.cpp runs silu_fast_check (tests/gpu/silu_fast_check.hpp) over every FP32 v on the GPU
// (largest distance seen: 59 ulps at |v| <= 64, under 80% of the margin everywhere; decisions wrong: none). The host
// never uses this: the CPU reference always runs silu32.
__device__ __forceinline__ float silu_estimate(float v) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * -1.44269504f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return v * r;
}

template <int T>
__device__ __forceinline__ bool silu16_decided(float v, float f) {
  static_assert(T == kBF16 || T == kFP16, "16-bit outputs only");
  constexpr u32 kDropped = T == kBF16 ? 0xFFFFu : 0x1FFFu;  // FP32 mantissa bits below the 16-bit value's
  constexpr float kMidpoint = T == kBF16 ? 32768.0f : 4096.0f;
  // The dropped bits as an exact float (2^23 + bits - 2^23), less the midpoint. (bits & kDropped) | 2^23's
  // exponent is one LOP3 with both constants in registers; written as C++ it compiles to two.
  u32 dropped;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(dropped) : "r"(bits_of(f)), "r"(kDropped), "r"(0x4B000000u));
  const float from_midpoint = float_of(dropped) - (8388608.0f + kMidpoint);
  const float a = fabsf(v);
  const bool decided = (a <= 64.0f) & (fabsf(from_midpoint) > fma32(a, 1.25f, 16.0f));
  if constexpr (T == kFP16) return decided & (fabsf(f) >= 6.103515625e-05f);  // 2^-14: normal fp16
  return decided;
}

// y for N elements of x: with no activation the pre-activation; with SiLU, silu32 for FP32 outputs, and for
// 16-bit outputs the estimate where it decides the rounding, silu32 for the elements where it does not. v holds
// x on entry and y on return; rc_of(e) gives element e's constants (one set for a channel-major vector, one per
// channel for a channels-last one).
//
// Two ways to handle the undecided elements, giving the same bits (timings: docs/PERFORMANCE.md, "The apply pass"):
//   REDECIDE: the common path only notes whether any element was undecided, with no per-element bookkeeping;
//     the rare path decides again element by element, x_of(e) giving element e of x again. Faster in the
//     split path's apply for bf16 outputs (16 dropped bits: undecided elements are rare).
//   otherwise: an undecided element keeps its x in v and only those elements run silu32. Faster for fp16
//     (13 dropped bits: ~0.5% of elements undecided, so most warps meet one in some lane) and in the fused
//     kernel.
template <int YT, int ACT, bool REDECIDE, int N, typename RcOf, typename XOf>
__device__ __forceinline__ void transform_values(float (&v)[N], RcOf rc_of, XOf x_of) {
  static_assert(N <= 32, "undecided elements are a 32-bit mask");
  if constexpr (ACT == kNoActivation) {
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = preactivation(v[e], rc_of(e));
  } else if constexpr (YT == kFP32) {
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = transform(v[e], rc_of(e));
  } else if constexpr (REDECIDE) {
    bool undecided = false;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float pre = preactivation(v[e], rc_of(e));
      const float f = silu_estimate(pre);
      undecided |= !silu16_decided<YT>(pre, f);
      v[e] = f;
    }
    if (undecided) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float pre = preactivation(x_of(e), rc_of(e));
        if (!silu16_decided<YT>(pre, silu_estimate(pre))) v[e] = silu32(pre);
      }
    }
  } else {
    unsigned undecided = 0;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float pre = preactivation(v[e], rc_of(e));
      const float f = silu_estimate(pre);
      if (silu16_decided<YT>(pre, f)) v[e] = f;
      else undecided |= 1u << e;
    }
    if (undecided != 0) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        if (undecided & (1u << e)) v[e] = transform(v[e], rc_of(e));
      }
    }
  }
}
#endif

}  // namespace math
}  // namespace gnsilu
