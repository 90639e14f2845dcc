// gnsilu: exact group statistics, shared by the GPU kernels and the CPU reference.
//
// A group's statistics are defined by two exact sums, S1 = sum x and S2 = sum x^2 over its N elements (every
// input value is a dyadic rational, so both are exact dyadic rationals), and by nothing else: the mean is S1 / N
// and the variance (N S2 - S1^2) / N^2, each rounded once to FP64 (nearest even). Exact sums do not depend on the
// order in which elements are added, nor on how the group is cut into parts (chunks, blocks, tiles, frames, ranks):
// any split gives the same bits, so no reduction tree is part of the definition.
//
// The sums are held in a Record of 64-bit integers, in "carry-save" form: S1 = sum_j sum[j] 2^(32 j - 160) and
// S2 = sum_j squares[j] 2^(32 j - 320), where every limb of a normalized record but the top one lies in
// [0, 2^32) (the top limb is signed). The range covers every finite FP32 value (hence BF16 and FP16): the smallest
// FP32 subnormal is 2^-149 (its square 2^-298), and a group of fewer than 2^48 elements of magnitude below 2^128
// keeps S1 < 2^176 and S2 < 2^304 within the top limbs. A record merges with another by adding its fields one by
// one: integer addition, exact, associative and commutative. Each addition of an element or of a normalized record
// changes a limb by less than 2^32, so at least 2^31 of them may be added before a limb could overflow; normalize()
// propagates the carries and restores the bound. So the records of any number of parts (tiles, frames, processes:
// an all-reduce SUM of int64) merge to the bits of the whole.
//
// NaN and Inf are counted apart (nonfinite); a group holding one has NaN statistics, as before.
//
// Used by the statistics kernels (kernels/group_norm_silu.cu: reduce_chunk writes chunk records, merged_group_stats
// merges them) and by the CPU reference (src/api/reference.cpp: element by element); tests/kernels/test_exact.cpp
// checks the arithmetic on the CPU. docs/EXACT_STATISTICS.md explains the design.
#pragma once

#include "gnsilu_math.cuh"

namespace gnsilu {
namespace exact {

using math::i64;
using math::u32;
using math::u64;

inline constexpr int kSumLimbs = 11;     // S1: limbs of weight 2^(32 j + kSumBase), j = 0..10
inline constexpr int kSumBase = -160;
inline constexpr int kSquareLimbs = 19;  // S2: limbs of weight 2^(32 j + kSquareBase), j = 0..18
inline constexpr int kSquareBase = -320;
inline constexpr i64 kMaxCount = i64(1) << 48;  // elements of one group (the divisions below work in 16-bit steps)

struct alignas(16) Record {
  i64 count;                  // elements
  i64 nonfinite;              // of which NaN or Inf
  i64 sum[kSumLimbs];         // S1
  i64 squares[kSquareLimbs];  // S2
};
static_assert(sizeof(Record) == 256, "Record layout: 32 64-bit integers");
inline constexpr int kRecordWords = 32;

GNSILU_HD void clear(Record& r) {
  i64* w = &r.count;
  for (int i = 0; i < kRecordWords; ++i) w[i] = 0;
}

// r += o, field by field.
GNSILU_HD void merge(Record& r, const Record& o) {
  i64* w = &r.count;
  const i64* v = &o.count;
  for (int i = 0; i < kRecordWords; ++i) w[i] += v[i];
}

// ---- limbs ---------------------------------------------------------------------------------------------------
// Additions go through a sink: add(k, d) adds the signed 32-bit digit d (|d| < 2^32) at limb k of an array of L
// limbs. Limbs in memory of the caller's own (Limbs below) or a kernel's shared record (with atomics: integer
// addition commutes, so any order of the threads gives the same limbs).
template <int L>
struct Limbs {
  i64* limb;
  GNSILU_HD void operator()(int k, i64 d) const { limb[k] += d; }
};

// limbs += (negative ? -1 : 1) * mag * 2^p, for 0 <= p (p counted from the limbs' base): three 32-bit digits. A
// digit one past the top limb goes into the top limb times 2^32 (the ranges above keep it below 2^31 there, and no
// digit further up is ever nonzero).
template <int L, typename Add>
GNSILU_HD void deposit(const Add& add, u64 mag, bool negative, int p) {
  const int j = p >> 5;
  const int r = p & 31;
  const u64 lo = mag << r;
  const u64 hi = r == 0 ? 0ull : mag >> (64 - r);
  const auto put = [&](int k, i64 digit) {
    const i64 d = negative ? -digit : digit;
    if (d == 0) return;
    if (k < L) add(k, d);
    else add(L - 1, d * (i64(1) << 32));
  };
  put(j, static_cast<i64>(lo & 0xFFFFFFFFull));
  put(j + 1, static_cast<i64>(lo >> 32));
  put(j + 2, static_cast<i64>(hi));
}

// Carries propagated upwards: every limb but the top one in [0, 2^32), the value unchanged.
template <int L>
GNSILU_HD void normalize(i64 (&limb)[L]) {
  for (int j = 0; j + 1 < L; ++j) {
    const i64 carry = limb[j] >> 32;  // floor(limb / 2^32), also for negative limbs
    limb[j] -= carry * (i64(1) << 32);
    limb[j + 1] += carry;
  }
}
GNSILU_HD void normalize(Record& r) {
  normalize(r.sum);
  normalize(r.squares);
}

// Where a record's additions go: count, nonfinite, sum limbs, square limbs (each an add(k, d) as above, count and
// nonfinite as add(0, d)).
template <typename Count, typename Sum, typename Square>
struct Sink {
  Count count;
  Count nonfinite;
  Sum sum;
  Square squares;
};
struct CountTo {
  i64* word;
  GNSILU_HD void operator()(int, i64 d) const { *word += d; }
};
GNSILU_HD Sink<CountTo, Limbs<kSumLimbs>, Limbs<kSquareLimbs>> sink_of(Record& r) {
  return {CountTo{&r.count}, CountTo{&r.nonfinite}, Limbs<kSumLimbs>{r.sum}, Limbs<kSquareLimbs>{r.squares}};
}

// One element, given as the bits of its FP32 value (BF16 and FP16 values convert to FP32 exactly).
template <typename S>
GNSILU_HD void add_element_to(const S& sink, u32 bits) {
  const u32 a = bits & 0x7FFFFFFFu;
  sink.count(0, 1);
  if (a >= 0x7F800000u) {
    sink.nonfinite(0, 1);
    return;
  }
  if (a == 0) return;
  const u32 field = a >> 23;
  const u64 m = field != 0 ? ((a & 0x7FFFFFu) | 0x800000u) : a;  // value = m 2^e
  const int e = (field != 0 ? static_cast<int>(field) : 1) - 150;
  deposit<kSumLimbs>(sink.sum, m, (bits >> 31) != 0, e - kSumBase);
  deposit<kSquareLimbs>(sink.squares, m * m, false, 2 * e - kSquareBase);
}
GNSILU_HD void add_element(Record& r, u32 bits) { add_element_to(sink_of(r), bits); }

// ---- a chunk's exact sums, as the statistics kernels write them ------------------------------------------------
// The kernels cut a group into chunks of up to 1024 elements (gnsilu_math.cuh: chunk geometry) only to share out the
// work: a chunk's sums are exact, so the cut changes no bit. A chunk's record holds its sums as integers in a unit of
// its own: S1 = s1 2^e and S2 = s2 2^(2 e), s2 a nonnegative 128-bit integer, with every element |x| < 2^top, so
// |s1| < n 2^(top - e) and s2 < n 2^(2 (top - e)). The kernels keep top - e <= 44 (kMaxChunkSpan) and n <= 1024, so
// s1 < 2^54 and s2 < 2^98. A chunk holding an element the kernel's levels cannot represent exactly is marked escaped
// and summed element by element by the kernel that merges the records; one holding a NaN or an Inf only counts.
// Zero-length padding elements are +0 and add nothing.
inline constexpr unsigned kEscaped = 1;    // some element is too small for the levels: sum the chunk element by element
inline constexpr unsigned kNonfinite = 2;  // some element is NaN or Inf
inline constexpr int kMaxChunkSpan = 44;   // top - e of a chunk record

struct alignas(16) ChunkRecord {
  i64 s1;
  u64 s2_lo;  // s2, low and high 64 bits
  u64 s2_hi;
  short e;
  short top;
  unsigned short n;      // elements of the chunk
  unsigned short flags;  // kEscaped, kNonfinite
};
static_assert(sizeof(ChunkRecord) == 32, "ChunkRecord layout");

// ---- 128-bit two's complement integers ---------------------------------------------------------------------------
struct Wide {
  u64 lo, hi;
};
GNSILU_HD Wide wide_of(i64 v) { return {static_cast<u64>(v), v < 0 ? ~0ull : 0ull}; }
GNSILU_HD Wide wide_shl(Wide a, int k) {  // 0 <= k < 128
  if (k == 0) return a;
  if (k >= 64) return {0ull, a.lo << (k - 64)};
  return {a.lo << k, (a.hi << k) | (a.lo >> (64 - k))};
}
GNSILU_HD Wide wide_add(Wide a, Wide b) {
  const u64 lo = a.lo + b.lo;
  return {lo, a.hi + b.hi + (lo < a.lo ? 1u : 0u)};
}

// |v| 2^p, v < 2^127 in magnitude, into the limbs (five 32-bit digits at most).
template <int L, typename Add>
GNSILU_HD void deposit_wide(const Add& add, Wide v, int p) {
  const bool negative = static_cast<i64>(v.hi) < 0;
  if (negative) {
    v.lo = ~v.lo + 1;
    v.hi = ~v.hi + (v.lo == 0 ? 1u : 0u);
  }
  deposit<L>(add, v.lo, negative, p);
  deposit<L>(add, v.hi, negative, p + 64);
}

// Adds a chunk's record into a group's; returns false (adding nothing) for an escaped chunk, whose elements the
// caller adds. A chunk with a NaN or Inf counts its elements and one nonfinite.
template <typename S>
GNSILU_HD bool deposit_chunk_to(const S& sink, const ChunkRecord& c) {
  if ((c.flags & kNonfinite) != 0) {
    sink.count(0, c.n);
    sink.nonfinite(0, 1);
    return true;
  }
  if ((c.flags & kEscaped) != 0) return false;
  sink.count(0, c.n);
  deposit_wide<kSumLimbs>(sink.sum, wide_of(c.s1), c.e - kSumBase);
  deposit_wide<kSquareLimbs>(sink.squares, Wide{c.s2_lo, c.s2_hi}, 2 * c.e - kSquareBase);
  return true;
}
GNSILU_HD bool deposit_chunk(Record& r, const ChunkRecord& c) { return deposit_chunk_to(sink_of(r), c); }

// ---- the levels a chunk's elements are cut into (the kernels' reduce_chunk) -----------------------------------
// With every |x| of a chunk below 2^(a + 1), the grid 2^g, g = a - 21, holds each element that lies on it as an
// integer k, |k| < 2^22, which one FP32 FMA finds exactly (kernels/group_norm_silu.cu: reduce_chunk). A chunk whose
// nonzero elements all lie on it (for 16-bit inputs, every one within 14 (BF16) or 11 (FP16) binades of the largest)
// has s1 = sum k, s2 = sum k^2 and e = g. Other chunks take two levels: for 16-bit inputs an element goes to the
// first grid if its significand's last bit weighs at least 2^g (|x| >= 2^(g + P - 1)) and to the second, 2^(g + P -
// 23), otherwise (holding elements down to 2^(g + 2 P - 24): BF16 29 binades below the largest, FP16 23); for FP32
// inputs x = k1 2^g + k2 2^(g - 22) with k1 the nearest integer (elements down to 20 binades below the largest). No
// grid is finer than the format's smallest subnormal. Chunks of tiny values (BF16 and FP32, a < -84) are scaled by
// 2^64 first (exact), so that every grid's FP32 scale is a normal number.
inline constexpr int kTinyBelow = -84;
inline constexpr int kTinyShift = 64;
// FP16 chunks whose largest |x| is below 2^(kFP16WholeBelow + 1) take two levels whatever their elements: the second
// grid is then 2^-24, FP16's smallest subnormal, and holds every element below the first's threshold.
inline constexpr int kFP16WholeBelow = 9;

template <int XT>
struct LevelGrid {
  static constexpr int kSignificand = XT == 1 ? 8 : XT == 2 ? 11 : 24;
  static constexpr int kFloor = XT == 1 ? -133 : XT == 2 ? -24 : -149;  // every value is a multiple of 2^kFloor
  int shift;  // the chunk's values are scaled by 2^shift
  int g;      // first grid, of the scaled values
  int g2;     // second grid
  int threshold;  // 16-bit inputs: scaled |x| >= 2^threshold go to the first grid
};
template <int XT>
GNSILU_HD LevelGrid<XT> level_grid(int a) {
  using G = LevelGrid<XT>;
  LevelGrid<XT> l;
  l.shift = a < kTinyBelow ? kTinyShift : 0;
  const int floor = G::kFloor + l.shift;
  l.g = a + l.shift - 21 > floor ? a + l.shift - 21 : floor;
  const int wanted = XT == 3 ? l.g - 22 : l.g + G::kSignificand - 23;
  l.g2 = wanted > floor ? wanted : floor;
  l.threshold = l.g + G::kSignificand - 1;
  return l;
}

// A two-level chunk's record from its integer sums (sum1 = sum k1, sum12 = sum k1 k2, ...), in units of 2^(g2 - shift).
GNSILU_HD void set_two_levels(ChunkRecord& r, int g, int g2, int shift, i64 sum1, i64 sum2, i64 sum11, i64 sum12,
                              i64 sum22) {
  const int d = g - g2;  // 0 <= d <= 22
  r.e = static_cast<short>(g2 - shift);
  r.s1 = sum1 * (i64(1) << d) + sum2;
  const Wide s2 = wide_add(wide_add(wide_shl(wide_of(sum11), 2 * d), wide_shl(wide_of(sum12), d + 1)), wide_of(sum22));
  r.s2_lo = s2.lo;
  r.s2_hi = s2.hi;
}

// ---- a thread's running sums, in registers --------------------------------------------------------------------
// A kernel that merges many chunk records (or elements) keeps them in registers first: 128-bit two's complement
// sums of S1 in units of 2^e and of S2 in units of 2^(2 e), e the finest unit added. Each addition brings n elements
// below 2^top in magnitude; the sums then stay below weight 2^(top_max - e) and weight 2^(2 (top_max - e)), weight
// the elements added. An addition that would let the latter reach 2^126 first sends the sums to the sink (flush).
// Exact throughout, so the order of the additions changes nothing.
struct Accumulator {
  Wide s1;        // S1 in units of 2^e
  Wide s2;        // S2 in units of 2^(2 e)
  int e;          // the unit
  int top;        // every element added since the last flush is below 2^top
  i64 weight;     // elements added since the last flush
  i64 room;       // the most elements the sums may hold at this unit and top (acc_fits)
  i64 count;      // elements (summed apart: no flush needed)
  i64 nonfinite;
};
GNSILU_HD void acc_clear(Accumulator& a) {
  a.s1 = a.s2 = Wide{0, 0};
  a.e = a.top = 0;
  a.weight = 0;
  a.room = 0;
  a.count = a.nonfinite = 0;
}
GNSILU_HD int ceil_log2(i64 v) {  // v >= 1
  if (v <= 1) return 0;
  const u64 x = static_cast<u64>(v - 1);  // bits of v - 1
#if defined(__CUDA_ARCH__)
  return 64 - __clzll(static_cast<long long>(x));
#else
  return 64 - __builtin_clzll(x);
#endif
}
// Whether sums of `weight` elements below 2^top in units of 2^e stay below 2^126 (see above).
GNSILU_HD bool acc_fits(int top, int e, i64 weight) { return 2 * (top - e) + ceil_log2(weight) <= 125; }

template <typename S>
GNSILU_HD void acc_flush_sums(Accumulator& a, const S& sink) {
  if (a.weight == 0) return;
  deposit_wide<kSumLimbs>(sink.sum, a.s1, a.e - kSumBase);
  deposit_wide<kSquareLimbs>(sink.squares, a.s2, 2 * a.e - kSquareBase);
  a.s1 = a.s2 = Wide{0, 0};
  a.weight = 0;
}
template <typename S>
GNSILU_HD void acc_flush(Accumulator& a, const S& sink) {
  acc_flush_sums(a, sink);
  if (a.count != 0) sink.count(0, a.count);
  if (a.nonfinite != 0) sink.nonfinite(0, a.nonfinite);
  a.count = a.nonfinite = 0;
}
// s1 2^e and s2 2^(2 e) added: n elements below 2^top (acc_fits(top, e, n) must hold).
template <typename S>
GNSILU_HD void acc_add(Accumulator& a, int e, int top, i64 n, Wide s1, Wide s2, const S& sink) {
  if (a.weight != 0 && e == a.e && top <= a.top && a.weight + n <= a.room) {
    // The usual case: the same unit, within the bound already checked.
    a.s1 = wide_add(a.s1, s1);
    a.s2 = wide_add(a.s2, s2);
    a.weight += n;
    return;
  }
  if (a.weight != 0) {
    const int low = e < a.e ? e : a.e;
    const int high = top > a.top ? top : a.top;
    if (!acc_fits(high, low, a.weight + n)) acc_flush_sums(a, sink);
  }
  if (a.weight == 0) {
    a.e = e;
    a.top = top;
  } else {
    if (e < a.e) {
      a.s1 = wide_shl(a.s1, a.e - e);
      a.s2 = wide_shl(a.s2, 2 * (a.e - e));
      a.e = e;
    }
    if (top > a.top) a.top = top;
  }
  a.s1 = wide_add(a.s1, wide_shl(s1, e - a.e));
  a.s2 = wide_add(a.s2, wide_shl(s2, 2 * (e - a.e)));
  a.weight += n;
  // The most elements the sums may hold at this unit and top: 2 (top - e) + ceil_log2(room) <= 125.
  const int spare = 125 - 2 * (a.top - a.e);
  a.room = spare >= 62 ? (i64(1) << 62) : (i64(1) << spare);
}

// Another thread's sums (already flushed of nothing else: b's count and nonfinite are added too).
template <typename S>
GNSILU_HD void acc_merge(Accumulator& a, const Accumulator& b, const S& sink) {
  a.count += b.count;
  a.nonfinite += b.nonfinite;
  if (b.weight != 0) acc_add(a, b.e, b.top, b.weight, b.s1, b.s2, sink);
}

// A chunk record into a thread's sums; false (nothing added) for an escaped chunk.
template <typename S>
GNSILU_HD bool acc_add_chunk(Accumulator& a, const ChunkRecord& c, const S& sink) {
  if ((c.flags & kNonfinite) != 0) {
    a.count += c.n;
    a.nonfinite += 1;
    return true;
  }
  if ((c.flags & kEscaped) != 0) return false;
  a.count += c.n;
  acc_add(a, c.e, c.top, c.n, wide_of(c.s1), Wide{c.s2_lo, c.s2_hi}, sink);
  return true;
}

// An element (the bits of its FP32 value) into a thread's sums.
template <typename S>
GNSILU_HD void acc_add_element(Accumulator& a, u32 bits, const S& sink) {
  const u32 m_bits = bits & 0x7FFFFFFFu;
  a.count += 1;
  if (m_bits >= 0x7F800000u) {
    a.nonfinite += 1;
    return;
  }
  if (m_bits == 0) return;
  const u32 field = m_bits >> 23;
  const u64 m = field != 0 ? ((m_bits & 0x7FFFFFu) | 0x800000u) : m_bits;  // value = m 2^e, m < 2^24
  const int e = (field != 0 ? static_cast<int>(field) : 1) - 150;
  acc_add(a, e, e + 24, 1, wide_of((bits >> 31) != 0 ? -static_cast<i64>(m) : static_cast<i64>(m)), Wide{m * m, 0},
          sink);
}

// ---- a small unsigned big integer (32-bit limbs, little end first), for the one division per group ------------
// Loops run over the limbs in use only (n): for typical groups a few limbs, so the division costs a few hundred
// instructions. Division by the group size in 16-bit steps, each quotient digit from an FP64 estimate corrected
// exactly: the same integers on the host and the GPU.
inline constexpr int kBigLimbs = 30;  // 960 bits: N S2 - S1^2 (< 2^672) shifted left by up to 57 + 96 bits

struct Big {
  u32 d[kBigLimbs];
  int n;  // limbs in use: d[n ...] are zero, and d[n - 1] != 0 unless n == 0
};

GNSILU_HD int leading_zeros32(u32 v) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(v));
#else
  return v == 0 ? 32 : __builtin_clz(v);
#endif
}
GNSILU_HD void big_zero(Big& b) {
  for (int i = 0; i < kBigLimbs; ++i) b.d[i] = 0;
  b.n = 0;
}
GNSILU_HD void big_trim(Big& b) {
  while (b.n > 0 && b.d[b.n - 1] == 0) --b.n;
}
// Number of significant bits (0 for zero).
GNSILU_HD int big_bits(const Big& b) { return b.n == 0 ? 0 : 32 * b.n - leading_zeros32(b.d[b.n - 1]); }
GNSILU_HD int bits_of_u64(u64 v) {
  const u32 hi = static_cast<u32>(v >> 32);
  return hi != 0 ? 64 - leading_zeros32(hi) : 32 - leading_zeros32(static_cast<u32>(v));
}
// b <<= k (the result must fit).
GNSILU_HD void big_shift_left(Big& b, int k) {
  if (b.n == 0 || k == 0) return;
  const int words = k >> 5;
  const int r = k & 31;
  int top = b.n + words + 1;
  if (top > kBigLimbs) top = kBigLimbs;
  for (int i = top - 1; i >= 0; --i) {
    const int from = i - words;
    u32 v = 0;
    if (from >= 0 && from < b.n) v = b.d[from] << r;
    if (r != 0 && from - 1 >= 0 && from - 1 < b.n) v |= b.d[from - 1] >> (32 - r);
    b.d[i] = v;
  }
  b.n = top;
  big_trim(b);
}
// b = b * m, m < 2^32.
GNSILU_HD void big_mul_small(Big& b, u32 m) {
  u64 carry = 0;
  for (int i = 0; i < b.n; ++i) {
    const u64 t = static_cast<u64>(b.d[i]) * m + carry;
    b.d[i] = static_cast<u32>(t);
    carry = t >> 32;
  }
  if (carry != 0 && b.n < kBigLimbs) b.d[b.n++] = static_cast<u32>(carry);
  if (m == 0) b.n = 0;
}
// a += b.
GNSILU_HD void big_add(Big& a, const Big& b) {
  const int n = a.n > b.n ? a.n : b.n;
  u64 carry = 0;
  for (int i = 0; i < n; ++i) {
    const u64 t = static_cast<u64>(a.d[i]) + b.d[i] + carry;
    a.d[i] = static_cast<u32>(t);
    carry = t >> 32;
  }
  a.n = n;
  if (carry != 0 && n < kBigLimbs) a.d[a.n++] = static_cast<u32>(carry);
}
// out = a * b (the product must fit).
GNSILU_HD void big_mul(const Big& a, const Big& b, Big& out) {
  big_zero(out);
  for (int i = 0; i < a.n; ++i) {
    u64 carry = 0;
    int j = 0;
    for (; j < b.n && i + j < kBigLimbs; ++j) {
      const u64 t = static_cast<u64>(a.d[i]) * b.d[j] + out.d[i + j] + carry;
      out.d[i + j] = static_cast<u32>(t);
      carry = t >> 32;
    }
    if (i + j < kBigLimbs) out.d[i + j] = static_cast<u32>(carry);
  }
  out.n = a.n + b.n < kBigLimbs ? a.n + b.n : kBigLimbs;
  big_trim(out);
}
// a -= b (a >= b).
GNSILU_HD void big_sub(Big& a, const Big& b) {
  u32 borrow = 0;
  for (int i = 0; i < a.n; ++i) {
    const u64 sub = static_cast<u64>(i < b.n ? b.d[i] : 0u) + borrow;
    borrow = static_cast<u64>(a.d[i]) < sub ? 1u : 0u;
    a.d[i] = static_cast<u32>(static_cast<u64>(a.d[i]) - sub);
  }
  big_trim(a);
}
// floor(v / n) and v mod n for v < 2^48 and 0 < n < 2^32: an FP64 estimate (v is exact in FP64), corrected.
GNSILU_HD u64 divide_small(u64 v, u64 n, double inverse, u64& rem) {
  u64 q = static_cast<u64>(static_cast<double>(v) * inverse);
  i64 r = static_cast<i64>(v) - static_cast<i64>(q * n);
  while (r < 0) {
    --q;
    r += static_cast<i64>(n);
  }
  while (r >= static_cast<i64>(n)) {
    ++q;
    r -= static_cast<i64>(n);
  }
  rem = static_cast<u64>(r);
  return q;
}
// b = floor(b / n) for 0 < n < 2^48; returns whether the remainder was nonzero. In 16-bit steps, so that the
// running remainder (< n) times 2^16 stays below 2^64 (below 2^48 when n < 2^32: the FP64 estimate).
GNSILU_HD bool big_div_small(Big& b, u64 n) {
  u64 rem = 0;
  if (n < (u64(1) << 32)) {
    const double inverse = 1.0 / static_cast<double>(n);
    for (int i = b.n - 1; i >= 0; --i) {
      const u64 qh = divide_small((rem << 16) | (b.d[i] >> 16), n, inverse, rem);
      const u64 ql = divide_small((rem << 16) | (b.d[i] & 0xFFFFu), n, inverse, rem);
      b.d[i] = static_cast<u32>((qh << 16) | ql);
    }
  } else {
    for (int i = b.n - 1; i >= 0; --i) {
      const u64 hi = (rem << 16) | (b.d[i] >> 16);
      const u64 qh = hi / n;
      rem = hi - qh * n;
      const u64 lo = (rem << 16) | (b.d[i] & 0xFFFFu);
      const u64 ql = lo / n;
      rem = lo - ql * n;
      b.d[i] = static_cast<u32>((qh << 16) | ql);
    }
  }
  big_trim(b);
  return rem != 0;
}
// The nearest double (ties to even) of q 2^scale (+ a nonzero fraction below q's last bit when sticky), for q with
// at least 55 significant bits; the result must be a normal double.
GNSILU_HD double big_to_double(const Big& q, bool sticky, int scale) {
  const int bits = big_bits(q);
  // The top 64 bits as an integer (bit 63 the leading one); the bits below them into sticky.
  const int shift = bits - 64;  // >= 55 - 64: may be negative for q of 55 to 63 bits
  u64 top = 0;
  if (shift >= 0) {
    const int w = shift >> 5;
    const int r = shift & 31;
    const u64 lo = q.d[w];
    const u64 mid = w + 1 < q.n ? q.d[w + 1] : 0u;
    const u64 hi = w + 2 < q.n ? q.d[w + 2] : 0u;
    top = r == 0 ? (mid << 32) | lo : (lo >> r) | (mid << (32 - r)) | (hi << (64 - r));
    sticky = sticky || (r != 0 && (lo & ((u64(1) << r) - 1)) != 0);
    for (int i = 0; i < w && !sticky; ++i) sticky = q.d[i] != 0;
  } else {
    const u64 value = (q.n > 1 ? static_cast<u64>(q.d[1]) << 32 : 0u) | (q.n > 0 ? q.d[0] : 0u);
    top = value << (-shift);
  }
  u64 sig = top >> 11;  // 53 bits
  const u64 rest = top & 0x7FFu;
  int e = bits - 1 + scale;  // exponent of the leading bit
  if (rest > 0x400u || (rest == 0x400u && (sticky || (sig & 1u) != 0))) {
    ++sig;
    if (sig == (u64(1) << 53)) {
      sig >>= 1;
      ++e;
    }
  }
  return math::double_of((static_cast<u64>(e + 1023) << 52) | (sig & ((u64(1) << 52) - 1)));
}

// A normalized limb array as sign and magnitude.
template <int L>
GNSILU_HD bool big_from_limbs(const i64 (&limb)[L], Big& out) {
  // Two's complement over the limbs: value = sum limb[j] 2^(32 j), limbs below the top in [0, 2^32).
  const bool negative = limb[L - 1] < 0;
  big_zero(out);
  u64 carry = negative ? 1 : 0;  // magnitude = ~value + 1 when negative
  for (int j = 0; j < L + 2 && j < kBigLimbs; ++j) {
    u32 word;
    if (j < L - 1) {
      word = static_cast<u32>(limb[j]);
    } else if (j == L - 1) {
      word = static_cast<u32>(static_cast<u64>(limb[L - 1]));
    } else {
      // The top limb's high 32 bits, then its sign extension.
      word = j == L ? static_cast<u32>(static_cast<u64>(limb[L - 1]) >> 32) : (negative ? 0xFFFFFFFFu : 0u);
    }
    if (negative) {
      const u64 t = static_cast<u64>(~word) + carry;
      word = static_cast<u32>(t);
      carry = t >> 32;
    }
    out.d[j] = word;
  }
  out.n = L + 2 < kBigLimbs ? L + 2 : kBigLimbs;
  big_trim(out);
  return negative;
}

// ---- the statistics of a record ----------------------------------------------------------------------------
struct Moments {
  double mean;      // S1 / N, rounded once
  double variance;  // (N S2 - S1^2) / N^2, rounded once
  bool finite;      // false: the group holds NaN or Inf (or no element)
};

// The big integers moments() works in, where the caller wants them (a kernel: shared memory, so that no thread keeps
// an array in local memory).
struct Scratch {
  Big s1, s2, x, square;
};

// ---- the rounding decided from a double-double estimate where it can be (Ziv) --------------------------------
// The exact quotients need big-integer divisions; almost always an estimate with about 100 correct bits already
// decides the rounding: if every value within the estimate's error bound rounds to the same double, that double is
// the correctly rounded result. Only where the exact value lies that close to a midpoint between two doubles (or,
// for the variance, where the cancellation in S2/N - mean^2 eats the estimate's bits) does the big-integer path
// run. Either way the result is the same double, on the host and on the GPU.
struct DD {
  double hi, lo;
};
GNSILU_HD DD two_sum(double a, double b) {
  const double s = a + b;
  const double bb = s - a;
  return {s, (a - (s - bb)) + (b - bb)};
}
// Limb i of b, zero beyond the limbs in use.
GNSILU_HD u64 big_limb(const Big& b, int i) { return i >= 0 && i < b.n ? b.d[i] : 0u; }
// Bits [k, k + count) of b's magnitude as an integer (1 <= count <= 64; bits below 0 read as zero): the three limbs
// that hold them, shifted (a record's rounding reads four such fields).
GNSILU_HD u64 big_field(const Big& b, int k, int count) {
  int skip = 0;  // bits of the field below bit 0 of b
  if (k < 0) {
    skip = -k;
    if (skip >= count) return 0;
    k = 0;
  }
  const int i = k >> 5;
  const int r = k & 31;
  const u64 low = big_limb(b, i) | (big_limb(b, i + 1) << 32);
  const u64 window = r == 0 ? low : (low >> r) | (big_limb(b, i + 2) << (64 - r));  // bits [k, k + 64)
  const int width = count - skip;
  const u64 field = width == 64 ? window : window & ((u64(1) << width) - 1);
  return field << skip;
}
// b 2^scale truncated to its top 106 bits, as hi + lo (both exact: 53-bit integers times powers of two).
GNSILU_HD DD big_to_dd(const Big& b, int scale) {
  const int n = big_bits(b);
  if (n == 0) return {0.0, 0.0};
  const u64 top = big_field(b, n - 53, 53);
  const u64 next = big_field(b, n - 106, 53);
  return {static_cast<double>(top) * math::pow2d(n - 53 + scale),
          static_cast<double>(next) * math::pow2d(n - 106 + scale)};
}
// Whether every value within err of a + b (b small against a) rounds to the same double; that double in `out`.
GNSILU_HD bool decided(double a, double b, double err, double& out) {
  const double low = a + (b - err);
  const double high = a + (b + err);
  out = a + b;
  return low == high && out == low;
}

// The mean and variance from the estimates a ~ |S1| and b ~ S2 (each its top 106 bits), where they decide them (see
// above); false for each they do not decide.
GNSILU_HD void estimate_from(DD a, bool negative, DD b, u64 n, bool& mean_done, double& mean, bool& variance_done,
                             double& variance) {
  const double count = static_cast<double>(n);  // exact: n < 2^48
  const double eps = math::pow2d(-98);          // far above the estimate's error (about 2^-102 relative)
  // S1 / n: q1 + q2, q1 rounded, q2 from q1's exact remainder.
  const double q1 = a.hi / count;
  const double q2 = (math::fma64(-q1, count, a.hi) + a.lo) / count;
  double m = 0.0;
  mean_done = a.hi == 0.0 || decided(q1, q2, (q1 < 0 ? -q1 : q1) * eps, m);
  mean = negative ? -m : m;
  // S2 / n - (S1 / n)^2, from the same estimates.
  const double p1 = b.hi / count;
  const double p2 = (math::fma64(-p1, count, b.hi) + b.lo) / count;
  const double m1 = q1 * q1;  // the square of the mean's estimate, as a double-double
  const double m2 = math::fma64(q1, q1, -m1) + 2.0 * q1 * q2;
  const DD d = two_sum(p1, -m1);
  const double tail = d.lo + (p2 - m2);
  const double err = (p1 + m1) * eps;
  double v = 0.0;
  variance_done = decided(d.hi, tail, err, v) && (d.hi + (tail - err)) > 0.0;
  variance = v;
}
GNSILU_HD void estimate_moments(const Big& s1, bool negative, const Big& s2, u64 n, bool& mean_done, double& mean,
                                bool& variance_done, double& variance) {
  estimate_from(big_to_dd(s1, kSumBase), negative, big_to_dd(s2, kSquareBase), n, mean_done, mean, variance_done,
                variance);
}

// ---- the same from a thread's running sums (no record): the kernels' usual case --------------------------------
GNSILU_HD int bits_of_wide(Wide v) { return v.hi != 0 ? 64 + bits_of_u64(v.hi) : v.lo != 0 ? bits_of_u64(v.lo) : 0; }
// Bits [k, k + count) of v as an integer (count <= 53; bits below 0 read as zero).
GNSILU_HD u64 wide_field(Wide v, int k, int count) {
  u64 x;
  if (k <= -64) return 0;
  if (k < 0) x = v.lo << -k;
  else if (k == 0) x = v.lo;
  else if (k < 64) x = (v.lo >> k) | (v.hi << (64 - k));
  else x = v.hi >> (k - 64);
  return x & ((u64(1) << count) - 1);
}
// |v| 2^scale truncated to its top 106 bits, as hi + lo (both exact), for v >= 0 below 2^127.
GNSILU_HD DD wide_to_dd(Wide v, int scale) {
  const int n = bits_of_wide(v);
  if (n == 0) return {0.0, 0.0};
  return {static_cast<double>(wide_field(v, n - 53, 53)) * math::pow2d(n - 53 + scale),
          static_cast<double>(wide_field(v, n - 106, 53)) * math::pow2d(n - 106 + scale)};
}

// The statistics of a group with a NaN or an infinity (or no element, or too many): NaN, so that every output is NaN.
GNSILU_HD math::GroupStats nan_stats() {
  math::GroupStats s;
  s.mean = math::double_of(0x7FF8000000000000ull);
  s.rstd = s.mean;
  s.mean32 = math::float_of(0x7FC00000u);
  s.apply_e = 0;
  return s;
}

// A group's statistics straight from sums held whole in one accumulator (nothing flushed: S1 = a.s1 2^a.e and S2 =
// a.s2 2^(2 a.e)), where the estimate decides them; false otherwise (the caller then flushes the sums into a record
// and takes group_stats). The same bits as group_stats of that record.
GNSILU_HD bool stats_from_sums(const Accumulator& a, double eps, math::GroupStats& s) {
  if (a.nonfinite != 0 || a.count <= 0 || a.count >= kMaxCount) {
    s = nan_stats();
    return true;
  }
  Wide s1 = a.weight != 0 ? a.s1 : Wide{0, 0};
  const Wide s2 = a.weight != 0 ? a.s2 : Wide{0, 0};
  const bool negative = static_cast<i64>(s1.hi) < 0;
  if (negative) {
    s1.lo = ~s1.lo + 1;
    s1.hi = ~s1.hi + (s1.lo == 0 ? 1u : 0u);
  }
  const int e = a.weight != 0 ? a.e : 0;
  // S1 and S2 stay within FP64's range: |S1| < 2^176 and S2 < 2^304 (see Record) hold for any group.
  bool mean_done = false, variance_done = false;
  double mean = 0.0, variance = 0.0;
  estimate_from(wide_to_dd(s1, e), negative, wide_to_dd(s2, 2 * e), static_cast<u64>(a.count), mean_done, mean,
                variance_done, variance);
  if (!mean_done || !variance_done) return false;
  s.mean = mean;
  s.rstd = math::div64(1.0, math::sqrt64(variance + eps));
  s.mean32 = math::narrow(mean);
  const int s2_bits = bits_of_wide(s2);
  s.apply_e = s2_bits != 0 && s2_bits - 1 + 2 * e >= 252 ? 1 : 0;  // S2 >= 2^252 (apply_exponent)
  return true;
}

// From a record, which it normalizes in place.
GNSILU_HD Moments moments(Record& r, Scratch& w, bool estimate = true) {
  Moments out;
  out.mean = 0.0;
  out.variance = 0.0;
  out.finite = r.nonfinite == 0 && r.count > 0 && r.count < kMaxCount;
  if (!out.finite) return out;
  normalize(r);
  const u64 n = static_cast<u64>(r.count);
  const int n_bits = bits_of_u64(n);
  const bool negative = big_from_limbs(r.sum, w.s1);
  big_from_limbs(r.squares, w.s2);
  bool mean_done = false, variance_done = false;
  if (estimate) estimate_moments(w.s1, negative, w.s2, n, mean_done, out.mean, variance_done, out.variance);
  if (mean_done && variance_done) return out;
  // The mean: floor(|S1| 2^k / n) with at least 55 significant bits.
  if (!mean_done && w.s1.n != 0) {
    w.x = w.s1;
    int k = 56 + n_bits - big_bits(w.s1);
    if (k < 0) k = 0;
    big_shift_left(w.x, k);
    const bool sticky = big_div_small(w.x, n);
    const double m = big_to_double(w.x, sticky, kSumBase - k);
    out.mean = negative ? -m : m;
  }
  // The variance: X = n S2 - S1^2 (in units of 2^-320), floor(X 2^k / n^2) with at least 55 significant bits.
  if (variance_done) return out;
  big_mul(w.s1, w.s1, w.square);
  w.x = w.s2;
  big_mul_small(w.x, static_cast<u32>(n & 0xFFFFFFFFu));
  if ((n >> 32) != 0) {
    w.s1 = w.s2;  // S1 is no longer needed: the high half of n times S2
    big_mul_small(w.s1, static_cast<u32>(n >> 32));
    big_shift_left(w.s1, 32);
    big_add(w.x, w.s1);
  }
  big_sub(w.x, w.square);
  out.variance = 0.0;
  if (w.x.n != 0) {
    int k = 57 + 2 * n_bits - big_bits(w.x);
    if (k < 0) k = 0;
    big_shift_left(w.x, k);
    const bool sticky_a = big_div_small(w.x, n);
    const bool sticky_b = big_div_small(w.x, n);
    out.variance = big_to_double(w.x, sticky_a || sticky_b, kSquareBase - k);
  }
  return out;
}

// Whether the apply step must scale x by 2^-1 (|x| may reach 2^126: then S2 >= 2^252). For a normalized record.
GNSILU_HD int apply_exponent(const Record& r) {
  // Limb j weighs 2^(32 j - 320): limb 18 is 2^256 and up, and limb 17 holds 2^224 ... 2^255 (its top 4 bits are
  // 2^252 ... 2^255).
  if (r.squares[kSquareLimbs - 1] != 0) return 1;
  return (static_cast<u64>(r.squares[17]) >> 28) != 0 ? 1 : 0;
}

// The statistics the apply step uses (gnsilu_math.cuh: GroupStats), from a record, which it normalizes in place.
GNSILU_HD math::GroupStats group_stats(Record& record, double eps, Scratch& scratch) {
  const Moments m = moments(record, scratch);
  math::GroupStats s;
  if (!m.finite) return nan_stats();
  s.mean = m.mean;
  s.rstd = math::div64(1.0, math::sqrt64(m.variance + eps));
  s.mean32 = math::narrow(m.mean);  // |S1 / N| <= max |x| <= the largest float, and so is its rounding
  s.apply_e = apply_exponent(record);
  return s;
}

}  // namespace exact
}  // namespace gnsilu
