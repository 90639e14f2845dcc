// Exact group statistics (kernels/gnsilu_exact.cuh): records of exact sums that merge to the same bits however a
// group is cut, and the mean and variance rounded once from them, checked against an independent oracle (128-bit
// integers) where the sums fit in one.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gnsilu_exact.cuh"

namespace {

using gnsilu::exact::Record;
__extension__ typedef unsigned __int128 u128;  // __extension__: -Wpedantic knows no __int128
__extension__ typedef __int128 i128;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
float bf16(float f) {  // the nearest bf16 value (ties to even), as a float
  uint32_t u = bits(f);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return from_bits(u & 0xFFFF0000u);
}

Record record_of(const std::vector<float>& v, std::size_t first = 0, std::size_t last = SIZE_MAX) {
  Record r;
  gnsilu::exact::clear(r);
  for (std::size_t i = first; i < std::min(last, v.size()); ++i) gnsilu::exact::add_element(r, bits(v[i]));
  return r;
}

gnsilu::exact::Moments moments_of(Record r) {
  gnsilu::exact::Scratch scratch;
  return gnsilu::exact::moments(r, scratch);
}

bool same(Record a, Record b) {
  gnsilu::exact::normalize(a);
  gnsilu::exact::normalize(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// The nearest double (ties to even) of num / den * 2^scale, num and den positive and below 2^100, by 128-bit long
// division: independent of gnsilu_exact.cuh's big integers.
double oracle_quotient(u128 num, u128 den, int scale) {
  // Shift so that the quotient has 60 to 61 significant bits.
  int k = 0;
  while ((num / den) < (u128(1) << 60)) {
    if (num < (u128(1) << 126)) {
      num <<= 1;
      ++k;
    } else {
      den >>= 1;  // never reached for the ranges used here
      FAIL("oracle out of range");
    }
  }
  while ((num / den) >= (u128(1) << 61)) {
    den <<= 1;
    --k;
  }
  const u128 q = num / den;
  const bool rest = q * den != num;
  // q has 61 bits: keep 53, round on the 8 below.
  const uint64_t low = static_cast<uint64_t>(q & 0xFF);
  uint64_t sig = static_cast<uint64_t>(q >> 8);
  const bool round_up = low > 0x80 || (low == 0x80 && (rest || (sig & 1))) ;
  if (round_up) ++sig;
  return std::ldexp(static_cast<double>(sig), 8 + scale - k);
}

// Exact sums of values that are multiples of 2^-30 below 2^16 in magnitude, as 128-bit integers (fewer than 4096
// of them: n s2 < 2^12 2^12 2^92).
struct Sums {
  i128 s1 = 0;  // units 2^-30
  i128 s2 = 0;  // units 2^-60
  int64_t n = 0;
};
Sums oracle_sums(const std::vector<float>& v) {
  Sums s;
  for (float f : v) {
    const i128 q = static_cast<i128>(std::ldexp(static_cast<double>(f), 30));
    REQUIRE(static_cast<double>(q) == std::ldexp(static_cast<double>(f), 30));
    REQUIRE(std::fabs(f) < 65536.0f);
    s.s1 += q;
    s.s2 += q * q;
    s.n += 1;
  }
  return s;
}

}  // namespace

TEST_CASE("a record is the same whatever the split and the order of merging") {
  std::mt19937_64 random(7);
  std::vector<float> v(20000);
  // Values across the FP32 range: subnormals, tiny, ordinary, huge, both signs, exact zeros, and bf16 ones.
  std::uniform_int_distribution<int> exponent(-160, 127);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < v.size(); ++i) {
    switch (i % 5) {
      case 0: v[i] = normal(random); break;
      case 1: v[i] = bf16(1000.0f + normal(random)); break;
      case 2: v[i] = from_bits(static_cast<uint32_t>(random()) & 0xFF7FFFFFu); break;  // any finite bits
      case 3: v[i] = std::ldexp(normal(random), std::max(-149, exponent(random) / 2)); break;
      default: v[i] = (random() & 1) ? 0.0f : -0.0f; break;
    }
    if (!std::isfinite(v[i])) v[i] = 1.0f;
  }
  const Record whole = record_of(v);
  const auto whole_moments = moments_of(whole);
  REQUIRE(whole_moments.finite);
  for (int trial = 0; trial < 20; ++trial) {
    // A random partition into contiguous parts, merged in a random order, some normalized first.
    std::vector<std::size_t> cuts = {0, v.size()};
    const int parts = 1 + static_cast<int>(random() % 40);
    for (int p = 0; p < parts; ++p) cuts.push_back(random() % v.size());
    std::sort(cuts.begin(), cuts.end());
    std::vector<Record> records;
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      records.push_back(record_of(v, cuts[c], cuts[c + 1]));
      if (random() % 2) gnsilu::exact::normalize(records.back());
    }
    std::shuffle(records.begin(), records.end(), random);
    Record merged;
    gnsilu::exact::clear(merged);
    for (const auto& r : records) gnsilu::exact::merge(merged, r);
    CHECK(same(merged, whole));
    const auto m = moments_of(merged);
    CHECK(m.mean == whole_moments.mean);
    CHECK(m.variance == whole_moments.variance);
  }
  // A permutation of the elements: the same record.
  std::vector<float> shuffled = v;
  std::shuffle(shuffled.begin(), shuffled.end(), random);
  CHECK(same(record_of(shuffled), whole));
}

TEST_CASE("the mean and the variance are the exact ones rounded once (against 128-bit integers)") {
  std::mt19937_64 random(11);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    // Values on the grid 2^-30, below 2^16: offset means against small spreads, tiny spreads, mixed scales.
    const double offset = trial % 3 == 0 ? 0.0 : std::ldexp(std::clamp(normal(random), -3.9, 3.9), static_cast<int>(random() % 13));
    const int spread = -static_cast<int>(random() % 24);
    const std::size_t n = 1 + random() % 4000;
    std::vector<float> v(n);
    for (auto& f : v) {
      f = trial % 2 ? bf16(static_cast<float>(offset + std::ldexp(normal(random), spread)))
                    : static_cast<float>(offset + std::ldexp(normal(random), spread));
      f = static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(static_cast<double>(f), 30)), -30));
    }
    const Sums s = oracle_sums(v);
    const auto m = moments_of(record_of(v));
    REQUIRE(m.finite);
    // mean = s1 2^-40 / n
    const double mean = s.s1 == 0 ? 0.0
                                  : (s.s1 < 0 ? -1.0 : 1.0) *
                                        oracle_quotient(static_cast<u128>(s.s1 < 0 ? -s.s1 : s.s1),
                                                        static_cast<u128>(s.n), -30);
    CHECK_MESSAGE(m.mean == mean, "trial " << trial);
    // variance = (n s2 - s1^2) 2^-80 / n^2
    const i128 x = static_cast<i128>(s.n) * s.s2 - s.s1 * s.s1;
    REQUIRE(x >= 0);
    const double variance =
        x == 0 ? 0.0 : oracle_quotient(static_cast<u128>(x), static_cast<u128>(s.n) * static_cast<u128>(s.n), -60);
    CHECK_MESSAGE(m.variance == variance, "trial " << trial << ": " << m.variance << " against " << variance);
  }
}

TEST_CASE("adversarial groups: constants, a large mean against a tiny spread, the ends of the range") {
  // A constant group: its value as the mean, variance 0, at every magnitude.
  for (float c : {1.0f, -3.5f, 1000.0f, 65504.0f, 3.40282347e38f, -3.40282347e38f, 1.0e-45f, 1.17549435e-38f}) {
    const auto m = moments_of(record_of(std::vector<float>(777, c)));
    REQUIRE(m.finite);
    CHECK(m.mean == static_cast<double>(c));
    CHECK(m.variance == 0.0);
  }
  // Two values a and b, equally often: mean (a + b) / 2 and variance ((a - b) / 2)^2, exactly representable here.
  const float pairs[][2] = {{1024.0f, 1024.0f + 0.125f}, {1.0e30f, -1.0e30f}, {3.40282347e38f, 3.0e38f},
                            {1.0e-45f, 3.0e-45f}, {65504.0f, -65504.0f}};
  for (const auto& p : pairs) {
    std::vector<float> v;
    for (int i = 0; i < 1000; ++i) v.push_back(p[i % 2]);
    const auto m = moments_of(record_of(v));
    const double a = p[0], b = p[1];
    CHECK(m.mean == (a + b) / 2);                    // exact in FP64 for these pairs
    CHECK(m.variance == ((a - b) / 2) * ((a - b) / 2));
  }
  // bf16 inputs around 1000 with spread 2^-2: the variance is that of the exact values, not of their rounding.
  std::vector<float> v;
  for (int i = 0; i < 4096; ++i) v.push_back(bf16(1000.0f + (i % 2 ? 4.0f : -4.0f)));
  const auto m = moments_of(record_of(v));
  CHECK(m.mean == 1000.0);
  CHECK(m.variance == 16.0);
}

TEST_CASE("NaN and Inf make a group's statistics NaN; they are counted, and merge like the rest") {
  std::vector<float> v(100, 1.0f);
  v[50] = std::numeric_limits<float>::quiet_NaN();
  Record r = record_of(v);
  CHECK(r.count == 100);
  CHECK(r.nonfinite == 1);
  CHECK_FALSE(moments_of(r).finite);
  gnsilu::exact::Scratch scratch;
  const auto stats = gnsilu::exact::group_stats(r, 1e-6, scratch);
  CHECK(std::isnan(stats.mean));
  CHECK(std::isnan(stats.rstd));
  v[50] = -std::numeric_limits<float>::infinity();
  CHECK(record_of(v).nonfinite == 1);
  Record a = record_of(v, 0, 50), b = record_of(v, 50);
  CHECK(a.nonfinite == 0);
  gnsilu::exact::merge(a, b);
  CHECK(same(a, record_of(v)));
}

TEST_CASE("limbs: negative sums, carries, and the bound that keeps 2^31 additions safe") {
  // Alternating large positive and negative deposits leave negative intermediate limbs; normalization restores
  // every limb below the top to [0, 2^32) without changing the value.
  std::vector<float> v = {1.0f, -3.0f, 1.0e-40f, -2.0e-40f, 5.0e20f, -5.0e20f, -1.0f};
  Record r = record_of(v);
  gnsilu::exact::normalize(r);
  for (int j = 0; j + 1 < gnsilu::exact::kSumLimbs; ++j) {
    CHECK(r.sum[j] >= 0);
    CHECK(r.sum[j] < (int64_t(1) << 32));
  }
  CHECK(r.sum[gnsilu::exact::kSumLimbs - 1] < 0);  // the sum is negative: the sign sits in the top limb
  const auto m = moments_of(r);
  const double exact_sum = 1.0 - 3.0 + static_cast<double>(1.0e-40f) - static_cast<double>(2.0e-40f) - 1.0;
  CHECK(m.mean == doctest::Approx(exact_sum / 7).epsilon(1e-15));
  // One element changes a limb by less than 2^32.
  Record one;
  gnsilu::exact::clear(one);
  gnsilu::exact::add_element(one, bits(-3.40282347e38f));
  for (int j = 0; j < gnsilu::exact::kSumLimbs; ++j) CHECK(std::abs(one.sum[j]) < (int64_t(1) << 32));
  for (int j = 0; j < gnsilu::exact::kSquareLimbs; ++j) CHECK(std::abs(one.squares[j]) < (int64_t(1) << 32));
}

TEST_CASE("rounding: a quotient on a tie goes to even, and any remainder, of either division, breaks the tie") {
  // Q = 2^60 + 2^7: its top 53 bits are 2^52, followed by a 1 and zeros, a tie. Records built by hand with
  // N = 3, so that the exact quotient is Q plus a third.
  const int64_t q_high = int64_t(1) << 28;  // 2^60 = limb 1 (2^32) times 2^28
  Record r;
  gnsilu::exact::clear(r);
  r.count = 3;
  // Mean: S1 = (3 Q + 1) 2^-160 and N = 3: S1 / N = (Q + 1/3) 2^-160, above the tie: rounds up.
  r.sum[0] = 3 * 128 + 1;
  r.sum[1] = 3 * q_high;
  auto m = moments_of(r);
  CHECK(m.mean == std::ldexp(static_cast<double>((int64_t(1) << 52) + 1), 8 - 160));
  // Exactly on the tie (S1 = 3 Q): to even.
  r.sum[0] = 3 * 128;
  m = moments_of(r);
  CHECK(m.mean == std::ldexp(1.0, 60 - 160));
  // Variance with S1 = 0: X = 3 S2 and X / 9 = S2 / 3. S2 = 3 Q + 1: the first division by 3 is exact, the second
  // leaves 1/3: above the tie, rounds up. S2 = 3 Q: on the tie, to even.
  r.sum[0] = r.sum[1] = 0;
  r.squares[0] = 3 * 128 + 1;
  r.squares[1] = 3 * q_high;
  m = moments_of(r);
  CHECK(m.mean == 0.0);
  CHECK(m.variance == std::ldexp(static_cast<double>((int64_t(1) << 52) + 1), 8 - 320));
  r.squares[0] = 3 * 128;
  m = moments_of(r);
  CHECK(m.variance == std::ldexp(1.0, 60 - 320));
  // And below the tie (S2 = 3 Q - 1): down.
  r.squares[0] = 3 * 128 - 1;
  m = moments_of(r);
  CHECK(m.variance == std::ldexp(1.0, 60 - 320));
}

TEST_CASE("a thread's running sums (exact::Accumulator) give the record of element-by-element additions") {
  std::mt19937_64 random(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(50000);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const int k = static_cast<int>(random() % 200) - 150;  // magnitudes over 200 binades, subnormals included
    v[i] = std::ldexp(normal(random), i % 3 == 0 ? k : 0);
    if (!std::isfinite(v[i])) v[i] = 0.0f;
  }
  v[77] = std::numeric_limits<float>::infinity();
  const Record expected = record_of(v);
  // Each element added with a looser bound than its own (top raised by `slack`, counted as `weight` elements), which
  // moves the flushes and the units but no bit.
  for (int slack : {0, 3, 24}) {
    for (int weight : {1, 7, 1 << 16}) {
      Record r;
      gnsilu::exact::clear(r);
      const auto sink = gnsilu::exact::sink_of(r);
      gnsilu::exact::Accumulator acc;
      gnsilu::exact::acc_clear(acc);
      for (float f : v) {
        const uint32_t b = bits(f);
        const uint32_t m = b & 0x7FFFFFFFu;
        if (m >= 0x7F800000u || m == 0) {
          gnsilu::exact::acc_add_element(acc, b, sink);
          continue;
        }
        // The element's own decomposition, through acc_add with this bound.
        const uint32_t field = m >> 23;
        const uint64_t mant = field ? ((m & 0x7FFFFFu) | 0x800000u) : m;
        const int e = (field ? static_cast<int>(field) : 1) - 150;
        acc.count += 1;
        gnsilu::exact::acc_add(acc, e, e + 24 + slack, weight,
                               gnsilu::exact::wide_of((b >> 31) ? -static_cast<int64_t>(mant) : static_cast<int64_t>(mant)),
                               gnsilu::exact::Wide{mant * mant, 0}, sink);
      }
      gnsilu::exact::acc_flush(acc, sink);
      CHECK_MESSAGE(same(r, expected), "slack " << slack << ", weight " << weight);
    }
  }
}

// A chunk's record as reduce_chunk (kernels/group_norm_silu.cu) builds it, from the same level geometry
// (exact::level_grid, exact::set_two_levels), with the FMAs' integers found in FP64 instead (x 2^-g is exact there):
// the model checks the bounds the kernel relies on (|k| < 2^22, the record's span) as it goes.
template <int XT>
gnsilu::exact::ChunkRecord model_chunk(const std::vector<float>& v) {
  namespace ex = gnsilu::exact;
  ex::ChunkRecord r{};
  r.n = static_cast<unsigned short>(v.size());
  uint32_t top = 0;
  for (float f : v) top = std::max(top, bits(f) & 0x7FFFFFFFu);
  const int field = static_cast<int>(top >> 23);
  const int a = std::max(field, 1) - 127;
  r.top = static_cast<short>(a + 1);
  if (top >= 0x7F800000u) {
    r.flags = ex::kNonfinite;
    return r;
  }
  const auto integral = [](double y) { return y == std::floor(y); };
  const bool fp16_whole = XT == 2 && a <= ex::kFP16WholeBelow;  // two levels, and the second holds every element
  if (XT != 3 && !fp16_whole && a >= ex::kTinyBelow) {
    const int g = a - 21;
    bool all = true;
    int64_t s1 = 0, s2 = 0;
    for (float f : v) {
      const double y = std::ldexp(static_cast<double>(f), -g);
      REQUIRE(std::fabs(y) < 4194304.0);
      if (!integral(y)) {
        all = false;
        break;
      }
      s1 += static_cast<int64_t>(y);
      s2 += static_cast<int64_t>(y) * static_cast<int64_t>(y);
    }
    if (all) {
      r.e = static_cast<short>(g);
      r.s1 = s1;
      r.s2_lo = static_cast<uint64_t>(s2);
      return r;
    }
  }
  const ex::LevelGrid<XT> l = ex::level_grid<XT>(a);
  REQUIRE(l.g2 <= l.g);
  REQUIRE(l.g - l.g2 <= 22);
  int64_t sum1 = 0, sum2 = 0, sum11 = 0, sum12 = 0, sum22 = 0;
  for (float f : v) {
    const double x = std::ldexp(static_cast<double>(f), l.shift);
    double k1, rest;
    if (XT != 3) {
      const bool high = std::fabs(x) >= std::ldexp(1.0, l.threshold);
      k1 = high ? std::ldexp(x, -l.g) : 0.0;
      REQUIRE(integral(k1));  // the first grid holds every element above the threshold
      rest = high ? 0.0 : x;
    } else {
      k1 = std::nearbyint(std::ldexp(x, -l.g));  // as the FMA rounds: to nearest, ties to even
      rest = x - std::ldexp(k1, l.g);            // exact in FP64
    }
    REQUIRE(std::fabs(k1) <= 4194304.0);
    const double k2 = std::ldexp(rest, -l.g2);
    REQUIRE(std::fabs(k2) < 4194304.0);
    if (!integral(k2)) {
      REQUIRE_FALSE(fp16_whole);
      r.flags = ex::kEscaped;
      return r;
    }
    const auto i1 = static_cast<int64_t>(k1), i2 = static_cast<int64_t>(k2);
    sum1 += i1;
    sum2 += i2;
    sum11 += i1 * i1;
    sum12 += i1 * i2;
    sum22 += i2 * i2;
  }
  ex::set_two_levels(r, l.g, l.g2, l.shift, sum1, sum2, sum11, sum12, sum22);
  REQUIRE(r.top - r.e <= ex::kMaxChunkSpan);
  return r;
}

uint16_t fp16_bits_of(float f) { return gnsilu::math::float_to_fp16(f); }
float fp16(float f) { return gnsilu::math::fp16_to_float(fp16_bits_of(f)); }

TEST_CASE("chunk records: the levels' integer sums give the chunk's exact record, in every input format") {
  namespace ex = gnsilu::exact;
  std::mt19937_64 random(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int one_grid = 0, two_levels = 0, escaped = 0, nonfinite = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int format = 1 + trial % 3;  // 1 bf16, 2 fp16, 3 fp32
    std::vector<float> v(1 + random() % 1024);
    const int spread = static_cast<int>(random() % 48);
    const int centre = trial % 7 == 0 ? -110 - static_cast<int>(random() % 30) : static_cast<int>(random() % 40) - 20;
    for (auto& f : v) {
      const float x = random() % 11 == 0 ? 0.0f
                                         : std::ldexp(normal(random), centre + static_cast<int>(random() % (spread + 1)) - spread / 2);
      f = format == 1 ? bf16(x) : format == 2 ? fp16(x) : x;
      if (!std::isfinite(f)) f = 0.0f;
    }
    if (trial % 97 == 5) v[random() % v.size()] = trial % 2 ? std::numeric_limits<float>::infinity() : std::nanf("");
    const ex::ChunkRecord c = format == 1 ? model_chunk<1>(v) : format == 2 ? model_chunk<2>(v) : model_chunk<3>(v);
    Record from_chunk;
    ex::clear(from_chunk);
    if (c.flags & ex::kEscaped) {
      ++escaped;
      CHECK_FALSE(ex::deposit_chunk(from_chunk, c));
      continue;
    }
    if (c.flags & ex::kNonfinite) ++nonfinite;
    else if (c.top - c.e <= 22) ++one_grid;
    else ++two_levels;
    CHECK(ex::deposit_chunk(from_chunk, c));
    if (c.flags & ex::kNonfinite) {
      // Its sums do not matter (the group's statistics are NaN): only the counts.
      const Record elements = record_of(v);
      CHECK(from_chunk.count == elements.count);
      CHECK(from_chunk.nonfinite == 1);
      CHECK(elements.nonfinite >= 1);
      continue;
    }
    CHECK_MESSAGE(same(from_chunk, record_of(v)), "trial " << trial << " format " << format);
    // And through a thread's running sums.
    Record through;
    ex::clear(through);
    const auto sink = ex::sink_of(through);
    ex::Accumulator acc;
    ex::acc_clear(acc);
    CHECK(ex::acc_add_chunk(acc, c, sink));
    ex::acc_flush(acc, sink);
    CHECK(same(through, from_chunk));
  }
  MESSAGE("chunks: " << one_grid << " on one grid, " << two_levels << " on two levels, " << escaped << " escaped, "
                     << nonfinite << " nonfinite");
  CHECK(one_grid > 300);
  CHECK(two_levels > 300);
  CHECK(escaped > 10);
  CHECK(nonfinite > 10);
}

TEST_CASE("chunk records of many chunks merge through thread sums and warp-style combination to the same record") {
  // Records of very different units (tiny chunks next to large ones) through one Accumulator, with flushes.
  namespace ex = gnsilu::exact;
  std::mt19937_64 random(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> all;
  Record through;
  ex::clear(through);
  const auto sink = ex::sink_of(through);
  ex::Accumulator acc, other;
  ex::acc_clear(acc);
  ex::acc_clear(other);
  for (int chunk = 0; chunk < 400; ++chunk) {
    std::vector<float> v(1024);
    const int centre = static_cast<int>(random() % 200) - 120;
    for (auto& f : v) f = bf16(std::ldexp(normal(random), centre));
    const ex::ChunkRecord c = model_chunk<1>(v);
    if (c.flags != 0) continue;
    all.insert(all.end(), v.begin(), v.end());
    CHECK(ex::acc_add_chunk(chunk % 2 ? acc : other, c, sink));
  }
  ex::acc_merge(acc, other, sink);
  ex::acc_flush(acc, sink);
  CHECK(same(through, record_of(all)));
}

TEST_CASE("big_field reads the bits a bit-by-bit walk reads, at every offset and width") {
  // The rounding from a record takes its top 106 bits as two 53-bit fields (big_to_dd); big_field reads each from
  // the three limbs that hold it. Oracle: the bits one at a time, those below bit 0 and above the limbs in use zero.
  namespace ex = gnsilu::exact;
  const auto oracle = [](const ex::Big& b, int k, int count) {
    uint64_t v = 0;
    for (int i = count - 1; i >= 0; --i) {
      const int bit = k + i;
      const uint64_t one = bit >= 0 && (bit >> 5) < b.n ? (b.d[bit >> 5] >> (bit & 31)) & 1u : 0u;
      v = (v << 1) | one;
    }
    return v;
  };
  std::mt19937_64 random(29);
  int fields = 0, differ = 0;
  for (int trial = 0; trial < 400; ++trial) {
    ex::Big b;
    ex::big_zero(b);
    b.n = 1 + static_cast<int>(random() % ex::kBigLimbs);
    for (int i = 0; i < b.n; ++i) {
      const uint64_t r = random();
      // Runs of ones and zeros as well as random words: carries and masks show at the limbs' edges.
      b.d[i] = trial % 3 == 0 ? 0xFFFFFFFFu : trial % 3 == 1 ? static_cast<uint32_t>(r) : static_cast<uint32_t>(r & (r >> 7));
    }
    ex::big_trim(b);
    const int top = 32 * b.n;
    for (int k = -70; k <= top + 2; k += 1 + static_cast<int>(random() % 5)) {
      for (const int count : {1, 31, 32, 33, 53, 63, 64}) {
        ++fields;
        if (ex::big_field(b, k, count) != oracle(b, k, count)) {
          ++differ;
          FAIL_CHECK("limbs " << b.n << ", bits [" << k << ", " << k + count << ")");
        }
      }
    }
  }
  MESSAGE(fields << " fields read");
  CHECK(differ == 0);
}

TEST_CASE("the rounding decided from the double-double estimate is the exact one, and undecided cases fall back") {
  // Every record: moments() with the estimate and without it (big integers only) give the same bits.
  std::mt19937_64 random(17);
  std::normal_distribution<double> normal(0.0, 1.0);
  int cases = 0;
  auto compare = [&](const Record& record, const char* what) {
    Record a = record, b = record;
    gnsilu::exact::Scratch wa, wb;
    const auto fast = gnsilu::exact::moments(a, wa, true);
    const auto exact = gnsilu::exact::moments(b, wb, false);
    ++cases;
    CHECK_MESSAGE(fast.finite == exact.finite, what);
    CHECK_MESSAGE(std::memcmp(&fast.mean, &exact.mean, sizeof(double)) == 0, what << ": mean " << fast.mean << " against " << exact.mean);
    CHECK_MESSAGE(std::memcmp(&fast.variance, &exact.variance, sizeof(double)) == 0,
                  what << ": variance " << fast.variance << " against " << exact.variance);
  };
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t n = 1 + random() % 3000;
    const double offset = trial % 4 == 0 ? 0.0 : std::ldexp(normal(random), static_cast<int>(random() % 60) - 30);
    const int spread = static_cast<int>(random() % 120) - 80;
    std::vector<float> v(n);
    for (auto& f : v) {
      f = static_cast<float>(offset + std::ldexp(normal(random), spread));
      if (trial % 3 == 1) f = bf16(f);
      if (!std::isfinite(f)) f = 0.0f;
    }
    compare(record_of(v), "random");
  }
  // Constants, two values, and ties built by hand (where the estimate cannot decide).
  compare(record_of(std::vector<float>(1000, 3.0f)), "constant");
  compare(record_of(std::vector<float>(7, -1.0e-45f)), "subnormal constant");
  compare(record_of({1.0f, 1.0f + 1.1920929e-07f}), "two neighbours");
  Record tie;
  gnsilu::exact::clear(tie);
  tie.count = 3;
  tie.sum[0] = 3 * 128 + 1;
  tie.sum[1] = 3 * (int64_t(1) << 28);
  tie.squares[0] = 3 * 128 + 1;
  tie.squares[1] = 3 * (int64_t(1) << 28);
  compare(tie, "a third above a tie");
  tie.sum[0] = tie.squares[0] = 3 * 128;
  compare(tie, "on a tie");
  MESSAGE(cases << " records compared");
}

TEST_CASE("the estimate decides the usual groups by itself") {
  // Counted, not timed: of random N(mu, sigma) groups, the estimate decides both statistics in nearly every one.
  std::mt19937_64 random(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int decided_both = 0, total = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<float> v(4096);
    const float mu = trial % 2 ? 0.0f : 1000.0f;
    for (auto& f : v) f = bf16(mu + normal(random));
    Record r = record_of(v);
    gnsilu::exact::normalize(r);
    gnsilu::exact::Scratch w;
    const bool negative = gnsilu::exact::big_from_limbs(r.sum, w.s1);
    gnsilu::exact::big_from_limbs(r.squares, w.s2);
    bool mean_done = false, variance_done = false;
    double mean = 0, variance = 0;
    gnsilu::exact::estimate_moments(w.s1, negative, w.s2, static_cast<uint64_t>(r.count), mean_done, mean,
                                    variance_done, variance);
    ++total;
    if (mean_done && variance_done) ++decided_both;
  }
  MESSAGE(decided_both << " of " << total << " groups decided by the estimate");
  CHECK(decided_both >= total - 5);
}

TEST_CASE("statistics straight from a thread's sums are group_stats' bits, or declined") {
  // Random groups (bf16 values over many binades, offsets, constants) summed into one Accumulator without a flush:
  // stats_from_sums gives the bits group_stats gives from the record of the same elements, or declines (constants,
  // and offsets that dwarf the spread, leave the estimate undecided: the kernels then take the record).
  namespace ex = gnsilu::exact;
  std::mt19937_64 random(23);
  std::normal_distribution<double> normal(0.0, 1.0);
  int decided = 0, declined = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    const std::size_t n = 1 + random() % 2000;
    const double offset = trial % 3 == 0 ? 0.0 : std::ldexp(normal(random), static_cast<int>(random() % 40) - 20);
    const int spread = static_cast<int>(random() % 60) - 40;
    std::vector<float> v(n, trial % 50 == 7 ? 0.75f : 0.0f);
    if (trial % 50 != 7) {
      for (auto& f : v) {
        f = bf16(static_cast<float>(offset + std::ldexp(normal(random), spread)));
        if (!std::isfinite(f)) f = 0.0f;
      }
    }
    if (trial % 101 == 3) v[0] = std::nanf("");
    Record record;
    ex::clear(record);
    const auto sink = ex::sink_of(record);
    ex::Accumulator acc;
    ex::acc_clear(acc);
    for (float f : v) ex::acc_add_element(acc, bits(f), sink);
    bool flushed = false;  // some sums went to the record: not the case under test
    for (int64_t limb : record.sum) flushed |= limb != 0;
    for (int64_t limb : record.squares) flushed |= limb != 0;
    if (flushed) continue;
    gnsilu::math::GroupStats fast{};
    const bool ok = ex::stats_from_sums(acc, 1e-5, fast);
    Record whole = record_of(v);
    ex::Scratch scratch;
    const gnsilu::math::GroupStats exact = ex::group_stats(whole, 1e-5, scratch);
    if (!ok) {
      ++declined;
      continue;
    }
    ++decided;
    CHECK(std::memcmp(&fast.mean, &exact.mean, sizeof(double)) == 0);
    CHECK(std::memcmp(&fast.rstd, &exact.rstd, sizeof(double)) == 0);
    CHECK(bits(fast.mean32) == bits(exact.mean32));
    CHECK(fast.apply_e == exact.apply_e);
  }
  MESSAGE(decided << " groups decided from the sums, " << declined << " declined");
  CHECK(decided > 1000);
}
