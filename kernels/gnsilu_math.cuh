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
// The reduction tree (part of the definition of the result, independent of any launch configuration and of
// the memory layout):
//   * group (n, g) holds L = (C/G) * S elements of x (S: product of the spatial sizes), in channel-major order
//     (element i is channel i / S of the group, position i % S) whatever the layout in memory;
//   * it is cut into chunks that never straddle a channel: for S > 512, each channel's S positions into runs of
//     kChunk = 1024 (the last one shorter); for S <= 512, m = floor(1024 / S) whole channels per chunk (the
//     group's last chunk fewer). So a chunk is one rectangle of channels x positions in either layout: NCHW
//     holds it as one contiguous run, channels-last as a tile of pixels (chunk_geometry below). Where S is a
//     multiple of 1024 or divides it these are the runs of 1024 consecutive elements of the group that gnsilu
//     used before layouts existed, so those results did not change; absent elements count as +0;
//   * element i of a chunk belongs to vector i/8 (8 contiguous elements), to lane (i/8) % 32 and to slot
//     i/256 of that lane. A chunk sum adds the 8 elements of a vector pairwise (bits 0, 1, 2 of i), then the
//     4 slots of a lane (bit 9, then bit 8), then the 32 lanes (bits 7 down to 3: a warp butterfly);
//   * a chunk gives a record {c, R, Q, E}: c a pivot near the chunk mean (its first-pass sum over n, rounded
//     to 12 significant bits; 0 if that sum is not finite), and with
//     d = x*2^-E - c*2^-E, R = sum d and Q = sum d*d, each with that tree (in FP64 above the vectors);
//     2^E bounds |x| + |c| so nothing overflows;
//   * a group's mean and sum of squared deviations come from its records in FP64: partial p (of 256) adds
//     records p, p+256, p+512, ... in order, then the partials are combined pairwise, p with p + 128, then
//     with p + 64, ... down to p + 1 (a block of 256 threads does it with shared memory and a butterfly; one
//     warp does the first three levels within each lane).
// A warp that holds a chunk in registers computes exactly this tree; so does the CPU reference.
//
// Why the numbers are good: the pivot makes the second sum centred (no cancellation however large the mean
// is against the spread); the mean is exact to FP64 rounding of sums of small centred terms; the mean is
// applied as m32 = fp32(m) with the rounding error m - m32 folded into the shift in FP64; x - m32 is exact
// near the mean (Sterbenz); the pre-activation is computed around its zero crossing so that it keeps its
// relative accuracy where it is small (row_constants); SiLU is one exponential (< 1 ulp) and one division.
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

constexpr int kChunk = 1024;           // elements per chunk record
constexpr int kVec = 8;                // elements per vector (one tree leaf group)
constexpr int kLanes = 32;             // lanes of a chunk
constexpr int kSlots = kChunk / (kVec * kLanes);  // vectors per lane: 4
constexpr int kPartials = 256;         // partial sums of the records of a group
static_assert(kSlots == 4, "the lane tree below is written for 4 slots");

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

// ---- loads and stores by dtype code ----------------------------------------------------------------------
template <int T>
GNSILU_HD float load_element(const void* p, i64 i) {
  static_assert(T == kBF16 || T == kFP16 || T == kFP32, "dtype");
  if constexpr (T == kBF16) return bf16_to_float(static_cast<const u16*>(p)[i]);
  else if constexpr (T == kFP16) return fp16_to_float(static_cast<const u16*>(p)[i]);
  else return static_cast<const float*>(p)[i];
}

template <int T>
GNSILU_HD void store_element(void* p, i64 i, float v) {
  static_assert(T == kBF16 || T == kFP16 || T == kFP32, "dtype");
  if constexpr (T == kBF16) static_cast<u16*>(p)[i] = float_to_bf16(v);
  else if constexpr (T == kFP16) static_cast<u16*>(p)[i] = float_to_fp16(v);
  else static_cast<u32*>(p)[i] = float_canonical_bits(v);
}

// A per-channel parameter (weight or bias) of any dtype, as a double; `fallback` when absent.
GNSILU_HD double load_parameter(const void* p, int dtype, i64 i, double fallback) {
  if (p == nullptr || dtype == kNone) return fallback;
  if (dtype == kBF16) return static_cast<double>(bf16_to_float(static_cast<const u16*>(p)[i]));
  if (dtype == kFP16) return static_cast<double>(fp16_to_float(static_cast<const u16*>(p)[i]));
  return static_cast<double>(static_cast<const float*>(p)[i]);
}

// ---- the chunk tree ----------------------------------------------------------------------------------
// One vector of 8: bits 0, 1, 2 of the element index, pairwise.
GNSILU_HD float tree8(const float (&v)[kVec]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
// The 4 slots of a lane: slot bit 1 (element bit 9) first, then slot bit 0 (element bit 8).
GNSILU_HD float tree_slots(float s0, float s1, float s2, float s3) { return (s0 + s2) + (s1 + s3); }

// Whether the second pass scales by 2^-E: BF16 and FP32 inputs can reach 3.4e38 and their squares would
// overflow FP32 sums; FP16 inputs (|x| <= 65504) never do, and skip it.
template <int XT>
struct Scaling {
  static constexpr bool kScaled = XT != kFP16;
};

// A float rounded (nearest even) to 12 significant bits; values that would round past the largest float are
// truncated instead.
GNSILU_HD float round_to_12_bits(float f) {
  const u32 u = bits_of(f);
  const u32 rounded = (u + 0x7FFu + ((u >> 12) & 1u)) & ~0xFFFu;
  return float_of((rounded & 0x7F800000u) == 0x7F800000u && (u & 0x7F800000u) != 0x7F800000u ? u & ~0xFFFu : rounded);
}

// The pivot of a chunk from its first-pass sum (of x * 2^-11 or x) and the largest |x| bits. The pivot has
// 12 significant bits so that d = x - c is exact for 16-bit x within a wide range around it: with d exact and
// its vector sums exact, the sum of d over a chunk (R, accumulated in FP64 above the vectors) is exact for
// typical 16-bit data, and the group mean is exact to FP64 rounding.
struct Pivot {
  float c;   // the chunk mean in FP32, clamped to the finite range, rounded to 12 significant bits
  float t;   // 2^-E
  float ct;  // c * 2^-E
  int e;     // E
};

// The first pass sums x as it is: if that overflows (|x| near the top of the FP32 range) or meets a NaN, the
// pivot is 0, which the second pass handles exactly (a NaN then poisons R and so the group).
template <int XT>
GNSILU_HD Pivot chunk_pivot(float first_sum, float largest_abs, int n) {
  const u32 max_abs_bits = bits_of(largest_abs);
  // Dividing by 1024 and multiplying by 2^-10 round the same exact quotient once: the same bits, and a full
  // chunk (n known to be kChunk at compile time) skips the division.
  float mean = n == kChunk ? first_sum * (1.0f / kChunk) : div32(first_sum, static_cast<float>(n));
  if (!(mean - mean == 0.0f)) mean = 0.0f;
  Pivot p;
  p.c = round_to_12_bits(mean);
  if constexpr (Scaling<XT>::kScaled) {
    const int ex = exponent_of(max_abs_bits);
    const int ec = exponent_of(bits_of(p.c) & 0x7FFFFFFFu);
    int e = (ex > ec ? ex : ec) + 2;  // |x| + |c| < 2^E
    if (e > 126) e = 126;
    if (e < -125) e = -125;
    p.e = e;
    p.t = pow2f(-e);
  } else {
    p.e = 0;
    p.t = 1.0f;
  }
  p.ct = p.c * p.t;
  return p;
}

// The centred value of an element: d = x * 2^-E - c * 2^-E, rounded once.
GNSILU_HD float centred(float x, const Pivot& p) { return fma32(x, p.t, -p.ct); }

// A chunk's record, as stored between the statistics and the apply step.
struct alignas(16) ChunkRecord {
  double r;  // sum of d: FP32 within each vector of 8, FP64 above
  double q;  // sum of d * d: likewise
  float c;   // pivot
  int e;     // E
  int n;     // elements in the chunk (1 to kChunk)
  int unused;
};
static_assert(sizeof(ChunkRecord) == 32, "ChunkRecord layout");

// ---- chunk geometry (see the reduction tree above) -----------------------------------------------------------
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

// The slots of a lane for the FP64 part of R: the same tree as tree_slots.
GNSILU_HD double tree_slots(double s0, double s1, double s2, double s3) { return (s0 + s2) + (s1 + s3); }

// ---- group statistics from records (FP64) --------------------------------------------------------------
// n * c + R * 2^E: the chunk's sum of x (the products are exact, one rounding in the sum).
GNSILU_HD double record_sum(const ChunkRecord& r) {
  return static_cast<double>(r.n) * static_cast<double>(r.c) + r.r * pow2d(r.e);
}
// The chunk's sum of (x - m)^2 = Q 2^2E + delta (2 R 2^E + n delta), delta = c - m.
GNSILU_HD double record_squares(const ChunkRecord& r, double m) {
  const double scale = pow2d(r.e);
  const double delta = static_cast<double>(r.c) - m;
  const double linear = 2.0 * (r.r * scale) + static_cast<double>(r.n) * delta;
  return (r.q * scale) * scale + delta * linear;
}

struct GroupStats {
  double mean;    // m
  double rstd;    // 1 / sqrt(var + eps); NaN when the group holds NaN or Inf
  float mean32;   // fp32(m)
  int apply_e;    // the apply step computes with x * 2^-apply_e (1 only when |x| may reach 2^126)
};

GNSILU_HD GroupStats group_stats(double sum, double squares, i64 length, int max_e, double eps) {
  GroupStats s;
  s.mean = div64(sum, static_cast<double>(length));
  double variance = div64(squares, static_cast<double>(length));
  if (variance < 0.0) variance = 0.0;
  const double largest = 3.4028234663852886e38;
  if (!is_finite(s.mean) || !is_finite(variance)) {
    const double nan = double_of(0x7FF8000000000000ull);
    s.mean = nan;
    s.rstd = nan;
    s.mean32 = float_of(0x7FC00000u);
    s.apply_e = 0;
    return s;
  }
  s.rstd = div64(1.0, sqrt64(variance + eps));
  double m = s.mean;
  if (m > largest) m = largest;
  if (m < -largest) m = -largest;
  s.mean32 = narrow(m);
  s.apply_e = max_e >= 126 ? 1 : 0;
  return s;
}

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
// change: tests/gpu/test_gpu.cpp runs silu_fast_check (tests/gpu/silu_fast_check.hpp) over every FP32 v on the GPU (largest distance seen:
// 59 ulps at |v| <= 64, under 80% of the margin everywhere; decisions wrong: none). The host never uses this:
// the CPU reference always runs silu32.
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
// Two ways to handle the undecided elements, which give the same bits (PERFORMANCE.md, v6, has the timings):
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
