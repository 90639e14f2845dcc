// The shared arithmetic (kernels/gnsilu_math.cuh) on the host: 16-bit conversions against independent
// roundings, the exponential and SiLU against long double.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <ios>
#include <random>

#include "kernels/gnsilu_math.cuh"
#include "support.hpp"

using namespace gnsilu::math;
using testing::ld;

namespace {

float from_bits(u32 u) { return float_of(u); }

// Independent rounding of a float to a 16-bit format's bits, through long double.
u16 expected_bits(float f, gnsilu::DType d) {
  if (std::isnan(f)) return 0x7FFF;
  const ld r = testing::round_to_format(f, testing::format_of(d));
  // Encode r (exactly representable) by searching the format's encoding through our exact decoders.
  const u16 sign = std::signbit(r) ? 0x8000 : 0;
  if (std::isinf(r)) return sign | (d == gnsilu::DType::BF16 ? 0x7F80 : 0x7C00);
  const ld a = std::fabs(r);
  // Binary search over the positive finite encodings, which are ordered like their values.
  u16 lo = 0, hi = d == gnsilu::DType::BF16 ? 0x7F7F : 0x7BFF;
  while (lo < hi) {
    const u16 mid = static_cast<u16>((lo + hi) / 2);
    const ld v = d == gnsilu::DType::BF16 ? bf16_to_float(mid) : fp16_to_float(mid);
    if (v < a) lo = static_cast<u16>(mid + 1);
    else hi = mid;
  }
  return static_cast<u16>(sign | lo);
}

}  // namespace

TEST_CASE("16-bit decoding is exact and encoding round-trips every value") {
  for (u32 h = 0; h < 0x10000; ++h) {
    const u16 b = static_cast<u16>(h);
    const float fb = bf16_to_float(b);
    const float fh = fp16_to_float(b);
    if (std::isnan(fb)) CHECK(float_to_bf16(fb) == 0x7FFF);
    else CHECK(float_to_bf16(fb) == b);
    if (std::isnan(fh)) CHECK(float_to_fp16(fh) == 0x7FFF);
    else CHECK(float_to_fp16(fh) == b);
  }
  // fp16 decoding against the compiler's _Float16.
  for (u32 h = 0; h < 0x10000; ++h) {
    _Float16 v;
    const u16 b = static_cast<u16>(h);
    std::memcpy(&v, &b, 2);
    const float f = static_cast<float>(v);
    if (std::isnan(f)) CHECK(std::isnan(fp16_to_float(b)));
    else CHECK(bits_of(f) == bits_of(fp16_to_float(b)));
  }
}

TEST_CASE("float to fp16 and bf16 round to nearest even, as _Float16 and an exact rounding do") {
  std::size_t checked = 0;
  // A stride through every float bit pattern plus the neighbourhoods of the interesting boundaries.
  auto check = [&](u32 u) {
    const float f = from_bits(u);
    const u16 h = float_to_fp16(f);
    const _Float16 compiler = static_cast<_Float16>(f);
    u16 cb;
    std::memcpy(&cb, &compiler, 2);
    if (std::isnan(f)) CHECK(h == 0x7FFF);
    else if (h != cb) FAIL_CHECK("fp16 of " << f << " (0x" << std::hex << u << "): got 0x" << h << ", _Float16 0x" << cb);
    const u16 b = float_to_bf16(f);
    const u16 eb = expected_bits(f, gnsilu::DType::BF16);
    if (b != eb) FAIL_CHECK("bf16 of " << f << " (0x" << std::hex << u << "): got 0x" << b << ", expected 0x" << eb);
    ++checked;
  };
  for (u64 u = 0; u <= 0xFFFFFFFFull; u += 65521) check(static_cast<u32>(u));
  const u32 edges[] = {0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x38800000u, 0x387FFFFFu, 0x387FC000u,
                       0x33800000u, 0x33000000u, 0x33000001u, 0x337FFFFFu, 0x7F7FFFFFu, 0x7F7F8000u, 0x7F7F7FFFu,
                       0x00000001u, 0x007FFFFFu, 0x00800000u, 0x7F800000u, 0x7FC00000u, 0x3F808000u, 0x3F818000u};
  for (u32 e : edges) {
    for (int d = -3; d <= 3; ++d) {
      check(e + static_cast<u32>(d));
      check((e + static_cast<u32>(d)) | 0x80000000u);
    }
  }
  MESSAGE("conversions checked on " << checked << " floats");
}

TEST_CASE("exp32 is within one ulp of exp everywhere it is finite, and exact at the special points") {
  CHECK(exp32(0.0f) == 1.0f);
  CHECK(exp32(-0.0f) == 1.0f);
  CHECK(std::isnan(exp32(NAN)));
  CHECK(exp32(INFINITY) == INFINITY);
  CHECK(exp32(-INFINITY) == 0.0f);
  CHECK(exp32(89.0f) == INFINITY);
  CHECK(exp32(88.7f) < INFINITY);
  CHECK(exp32(-104.5f) == 0.0f);
  const testing::Format f32 = testing::format_of(gnsilu::DType::FP32);
  double worst = 0;
  std::size_t exact = 0, total = 0;
  for (u32 u = 0; u < 0xFFFFFFFFu - 4093; u += 4093) {
    const float a = from_bits(u);
    if (std::isnan(a) || a > 88.72f || a < -103.9f) continue;
    const ld e = std::exp(static_cast<ld>(a));
    const float got = exp32(a);
    const ld rounded = testing::round_to_format(e, f32);
    if (e < std::ldexp(1.0L, -126)) {  // subnormal results: at most one subnormal step off
      CHECK(std::fabs(static_cast<ld>(got) - e) <= std::ldexp(1.0L, -149));
      continue;
    }
    const double ulps = static_cast<double>(std::fabs(got - e) / testing::ulp_at(e, f32));
    worst = std::max(worst, ulps);
    exact += rounded == got;
    ++total;
  }
  MESSAGE("exp32: max error " << worst << " ulp, correctly rounded " << 100.0 * exact / total << "% of " << total);
  CHECK(worst < 1.0);
  CHECK(exact > total * 0.97);
}

TEST_CASE("silu32 is within 2.5 ulps of silu in long double") {
  const testing::Format f32 = testing::format_of(gnsilu::DType::FP32);
  double worst = 0;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-90.0f, 90.0f);
  std::normal_distribution<float> narrow(0.0f, 3.0f);
  for (int i = 0; i < 2000000; ++i) {
    const float v = i % 2 ? wide(rng) : narrow(rng);
    const ld y = static_cast<ld>(v) / (1 + std::exp(-static_cast<ld>(v)));
    const float got = silu32(v);
    if (std::fabs(y) < std::ldexp(1.0L, -126)) continue;
    worst = std::max(worst, static_cast<double>(std::fabs(got - y) / testing::ulp_at(y, f32)));
  }
  MESSAGE("silu32: max error " << worst << " ulp");
  CHECK(worst <= 2.5);
  CHECK(silu32(0.0f) == 0.0f);
  CHECK(silu32(200.0f) == 200.0f);
  CHECK(silu32(-200.0f) == 0.0f);
  CHECK(std::isnan(silu32(NAN)));
}

TEST_CASE("round_to_int rounds halves to even") {
  CHECK(round_to_int(0.5f) == 0.0f);
  CHECK(round_to_int(1.5f) == 2.0f);
  CHECK(round_to_int(2.5f) == 2.0f);
  CHECK(round_to_int(-2.5f) == -2.0f);
  CHECK(round_to_int(-150.2f) == -150.0f);
  CHECK(round_to_int(1023.5f) == 1024.0f);
}

TEST_CASE("add_in: x + b in each dtype is the exact sum rounded once to it (the input bias)") {
  // Pairs of values of the dtype: random bits (every binade, subnormals, opposite signs, far exponents), halfway
  // cases, cancellations, overflow; each against the exact sum rounded by testing::round_to_format (long double
  // holds the sum of two FP32 values rounded once, which rounds again to FP32 or less as the exact sum would).
  std::mt19937 rng(20261203);
  std::size_t checked = 0;
  const auto check = [&](gnsilu::DType d, u32 xa, u32 xb) {
    float a, b, got;
    if (d == gnsilu::DType::FP32) {
      a = float_of(xa), b = float_of(xb);
      got = add_in<kFP32>(a, b);
    } else if (d == gnsilu::DType::BF16) {
      a = bf16_to_float(static_cast<u16>(xa)), b = bf16_to_float(static_cast<u16>(xb));
      got = add_in<kBF16>(a, b);
    } else {
      a = fp16_to_float(static_cast<u16>(xa)), b = fp16_to_float(static_cast<u16>(xb));
      got = add_in<kFP16>(a, b);
    }
    ++checked;
    if (std::isnan(a) || std::isnan(b) || (std::isinf(a) && std::isinf(b) && (a > 0) != (b > 0))) {
      CHECK(std::isnan(got));
      return;
    }
    const ld want = testing::round_to_format(static_cast<ld>(a) + static_cast<ld>(b), testing::format_of(d));
    // Exact zero sums are +0 (round to nearest), -0 only for -0 + -0: compare the sign too.
    if (static_cast<ld>(got) != want || std::signbit(got) != std::signbit(static_cast<float>(want))) {
      FAIL_CHECK(gnsilu::dtype_name(d) << ": " << a << " + " << b << " gave " << got << ", expected "
                                       << static_cast<double>(want));
    }
  };
  for (gnsilu::DType d : {gnsilu::DType::BF16, gnsilu::DType::FP16, gnsilu::DType::FP32}) {
    const u32 mask = d == gnsilu::DType::FP32 ? 0xFFFFFFFFu : 0xFFFFu;
    for (int i = 0; i < 400000; ++i) check(d, rng() & mask, rng() & mask);
    // Near each other (cancellation, ties at the last bit): x and x's neighbours, either sign.
    for (int i = 0; i < 100000; ++i) {
      const u32 x = rng() & mask, delta = rng() % 5;
      const u32 sign = d == gnsilu::DType::FP32 ? 0x80000000u : 0x8000u;
      check(d, x, (x + delta) ^ (i % 2 ? sign : 0u));
    }
  }
  // Fixed cases: signed zeros, the largest value plus half its ulp (a tie that rounds up to Inf), a tie to even.
  check(gnsilu::DType::BF16, 0x8000u, 0x0000u);          // -0 + +0 = +0
  check(gnsilu::DType::BF16, 0x8000u, 0x8000u);          // -0 + -0 = -0
  check(gnsilu::DType::BF16, 0x7F7Fu, 0x7373u);          // max + 2^103.8: past max + ulp / 2, Inf
  check(gnsilu::DType::FP16, 0x7BFFu, 0x4F80u);          // 65504 + 30: rounds to 65504 (the tie point is 65520)
  check(gnsilu::DType::FP16, 0x7BFFu, 0x4C00u);          // 65504 + 16
  check(gnsilu::DType::FP16, 0x3C00u, 0x1000u);          // 1 + 2^-11: a tie, to even (1)
  check(gnsilu::DType::FP32, 0x3F800000u, 0x33800000u);  // 1 + 2^-24: a tie, to even
  CHECK(std::signbit(add_in<kBF16>(-0.0f, 0.0f)) == false);
  CHECK(std::signbit(add_in<kFP32>(-0.0f, -0.0f)) == true);
  MESSAGE("add_in checked on " << checked << " pairs");
}

TEST_CASE("padded_tiling: every element of y in exactly one tile, each a contiguous range that fits the stage") {
  // Channel-major apply_padded stages tile t as y's elements [first_line * width + segment * segment_length, ...):
  // whole lines (at most kPadTileLines, at most `capacity` elements) or one segment of a line longer than capacity.
  // Walked here as the kernel walks them: the tiles in order must cover y once, each within capacity.
  std::mt19937 rng(7);
  auto pick = [](std::mt19937& r, i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(r); };
  int cases = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    Padding pad{};
    i64 lead = pick(rng, 1, 3);
    for (int d = 0; d < 3; ++d) {
      pad.dims[d] = d == 2 && trial % 5 == 0 ? pick(rng, 1, 40000) : pick(rng, 1, 40);
      pad.before[d] = pick(rng, 0, 3);
      pad.after[d] = pick(rng, 0, 3);
      pad.out_dims[d] = pad.dims[d] + pad.before[d] + pad.after[d];
    }
    pad.out_s = lead * pad.out_dims[0] * pad.out_dims[1] * pad.out_dims[2];
    const i64 rows = pick(rng, 1, 6);
    const i64 capacity = trial % 2 == 0 ? 8192 : 4096;
    const PaddedTiling t = padded_tiling(pad, rows, capacity);
    const i64 width = pad.out_dims[2];
    REQUIRE(t.lines == rows * pad.out_s / width);
    i64 next = 0;  // the first element of y no tile has covered yet
    for (i64 tile = 0; tile < t.tiles; ++tile) {
      i64 begin, count;
      if (t.segments == 1) {
        const i64 first = tile * t.per_tile;
        const i64 lines = std::min(t.per_tile, t.lines - first);
        REQUIRE(lines >= 1);
        REQUIRE(lines <= kPadTileLines);
        begin = first * width;
        count = lines * width;
      } else {
        const i64 line = tile / t.segments, segment = tile % t.segments;
        begin = line * width + segment * t.segment;
        count = std::min(t.segment, width - segment * t.segment);
        REQUIRE(count >= 1);
      }
      REQUIRE(begin == next);
      REQUIRE(count <= capacity);
      next = begin + count;
    }
    REQUIRE(next == rows * pad.out_s);
    ++cases;
  }
  MESSAGE(cases << " tilings walked");
}
