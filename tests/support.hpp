// Test support: host tensors of any dtype, random and adversarial inputs, and an independent high-precision
// reference (long double: 64-bit significand) with the correctly rounded result and error in ulps.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gnsilu/gnsilu.hpp"
#include "gnsilu/reference.hpp"
#include "kernels/gnsilu_math.cuh"

namespace testing {

using gnsilu::DType;
using ld = long double;

// Format of a dtype: significand bits (with the implicit one), smallest normal exponent, largest exponent.
struct Format {
  int precision;
  int emin;
  int emax;
};
inline Format format_of(DType d) {
  switch (d) {
    case DType::BF16: return {8, -126, 127};
    case DType::FP16: return {11, -14, 15};
    default: return {24, -126, 127};
  }
}

// v rounded to nearest (ties to even) in format f, overflow to Inf: computed exactly in long double.
inline ld round_to_format(ld v, const Format& f) {
  if (v == 0 || !std::isfinite(v)) return v;
  int ex = 0;
  std::frexp(v, &ex);  // |v| = m 2^ex, m in [0.5, 1)
  const int e = std::max(ex - 1, f.emin);
  const ld quantum = std::ldexp(ld{1}, e - (f.precision - 1));
  const ld r = std::nearbyint(v / quantum) * quantum;
  const ld largest = std::ldexp(ld{2} - std::ldexp(ld{1}, 1 - f.precision), f.emax);
  if (std::fabs(r) > largest) return std::copysign(std::numeric_limits<ld>::infinity(), v);
  return r;
}

// The unit in the last place of format f at |v| (v finite).
inline ld ulp_at(ld v, const Format& f) {
  int ex = 0;
  std::frexp(v == 0 ? ld{1e-300} : v, &ex);
  const int e = std::max(ex - 1, f.emin);
  return std::ldexp(ld{1}, std::min(e, f.emax) - (f.precision - 1));
}

// A host tensor stored as raw bits of its dtype.
struct HostTensor {
  DType dtype = DType::FP32;
  std::vector<unsigned char> bytes;
  HostTensor() = default;
  HostTensor(DType d, std::size_t n) : dtype(d), bytes(n * gnsilu::dtype_size(d)) {}
  std::size_t size() const { return bytes.size() / gnsilu::dtype_size(dtype); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  float get(std::size_t i) const {
    using namespace gnsilu::math;
    switch (dtype) {
      case DType::BF16: return load_element<kBF16>(bytes.data(), static_cast<i64>(i));
      case DType::FP16: return load_element<kFP16>(bytes.data(), static_cast<i64>(i));
      default: return load_element<kFP32>(bytes.data(), static_cast<i64>(i));
    }
  }
  // Stores v rounded to the dtype (nearest even).
  void set(std::size_t i, float v) {
    using namespace gnsilu::math;
    switch (dtype) {
      case DType::BF16: store_element<kBF16>(bytes.data(), static_cast<i64>(i), v); break;
      case DType::FP16: store_element<kFP16>(bytes.data(), static_cast<i64>(i), v); break;
      default: std::memcpy(bytes.data() + 4 * i, &v, 4); break;
    }
  }
  uint32_t bits(std::size_t i) const {
    if (dtype == DType::FP32) {
      uint32_t u;
      std::memcpy(&u, bytes.data() + 4 * i, 4);
      return u;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return h;
  }
};

// How x is drawn.
enum class Data {
  Normal,          // N(0, 1)
  LargeMean,       // 1000 + N(0, 1): the case where PyTorch's FP32 path loses most
  TinySpread,      // 1 + 1e-3 N(0, 1)
  Subnormal,       // values in the subnormal range of the dtype
  Huge,            // magnitudes near the top of the dtype's range
  WithNaN,         // N(0, 1) with a NaN in group 0
  WithInf,         // N(0, 1) with +Inf in group 0
  Constant,        // one value per group
  WideRange,       // N(0, 1) times 2^k, k uniform over 50 binades (26 in FP16): chunks of every kind of the exact
                   // statistics (one level, two levels, summed element by element)
};

inline const char* data_name(Data d) {
  switch (d) {
    case Data::Normal: return "normal";
    case Data::LargeMean: return "mean 1000, spread 1";
    case Data::TinySpread: return "mean 1, spread 1e-3";
    case Data::Subnormal: return "subnormal";
    case Data::Huge: return "huge";
    case Data::WithNaN: return "NaN in group 0";
    case Data::WithInf: return "Inf in group 0";
    case Data::Constant: return "constant groups";
    case Data::WideRange: return "magnitudes over 50 binades";
  }
  return "?";
}

inline HostTensor make_input(DType dtype, std::size_t n, std::size_t group_length, Data kind, uint64_t seed) {
  HostTensor t(dtype, n);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float subnormal_scale = dtype == DType::FP16 ? 2e-6f : 1e-39f;
  const float huge_scale = dtype == DType::FP16 ? 2e4f : 1e37f;
  for (std::size_t i = 0; i < n; ++i) {
    float v = normal(rng);
    switch (kind) {
      case Data::LargeMean: v = 1000.0f + v; break;
      case Data::TinySpread: v = 1.0f + 1e-3f * v; break;
      case Data::Subnormal: v = subnormal_scale * v; break;
      case Data::Huge: v = huge_scale * v; break;
      case Data::Constant: v = 0.5f + static_cast<float>(group_length ? i / group_length : 0); break;
      case Data::WideRange:
        v = std::ldexp(v, dtype == DType::FP16 ? static_cast<int>(rng() % 26) - 20 : static_cast<int>(rng() % 50) - 40);
        break;
      default: break;
    }
    t.set(i, v);
  }
  if (kind == Data::WithNaN && n > 0) t.set(std::min<std::size_t>(n - 1, group_length / 2), std::nanf(""));
  if (kind == Data::WithInf && n > 0) t.set(std::min<std::size_t>(n - 1, group_length / 3), INFINITY);
  return t;
}

inline HostTensor make_parameter(DType dtype, std::size_t c, uint64_t seed, float mean, float spread) {
  HostTensor t(dtype, c);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(mean, spread);
  for (std::size_t i = 0; i < c; ++i) t.set(i, normal(rng));
  return t;
}

// silu(group_norm(x)) (or group_norm(x) when !silu) in long double, two passes (mean, then centred squares),
// compensated sums. x and the result are channel-major.
inline std::vector<ld> exact_reference(const HostTensor& x, int64_t n, int64_t c, int64_t s, int64_t groups,
                                       const HostTensor* weight, const HostTensor* bias, double eps,
                                       bool silu = true) {
  std::vector<ld> out(x.size());
  const int64_t per_group = (c / groups) * s;
  for (int64_t g = 0; g < n * groups; ++g) {
    const std::size_t base = static_cast<std::size_t>(g * per_group);
    ld sum = 0, comp = 0;
    for (int64_t i = 0; i < per_group; ++i) {
      const ld v = x.get(base + static_cast<std::size_t>(i));
      const ld t = sum + v;
      comp += std::fabs(sum) >= std::fabs(v) ? (sum - t) + v : (v - t) + sum;
      sum = t;
    }
    const ld mean = (sum + comp) / static_cast<ld>(per_group);
    ld sq = 0, sq_comp = 0;
    for (int64_t i = 0; i < per_group; ++i) {
      const ld d = x.get(base + static_cast<std::size_t>(i)) - mean;
      const ld v = d * d;
      const ld t = sq + v;
      sq_comp += std::fabs(sq) >= std::fabs(v) ? (sq - t) + v : (v - t) + sq;
      sq = t;
    }
    const ld variance = (sq + sq_comp) / static_cast<ld>(per_group);
    const ld rstd = 1 / std::sqrt(variance + static_cast<ld>(eps));
    const int64_t channel0 = (g % groups) * (c / groups);
    for (int64_t k = 0; k < c / groups; ++k) {
      const std::size_t ch = static_cast<std::size_t>(channel0 + k);
      const ld w = weight ? static_cast<ld>(weight->get(ch)) : 1;
      const ld b = bias ? static_cast<ld>(bias->get(ch)) : 0;
      for (int64_t i = 0; i < s; ++i) {
        const std::size_t at = base + static_cast<std::size_t>(k * s + i);
        const ld y = (x.get(at) - mean) * rstd * w + b;
        out[at] = silu ? y / (1 + std::exp(-y)) : y;
      }
    }
  }
  return out;
}

// x + b[channel] for an input bias b (x's dtype), each sum rounded to x's dtype by round_to_format (the exact sum
// rounded once; independent of the library's math::add_in). Layout as x's (channels_last: (N, S, C)).
inline HostTensor plus_bias(const HostTensor& x, const HostTensor& b, int64_t n, int64_t c, int64_t s,
                            bool channels_last) {
  HostTensor out(x.dtype, x.size());
  const Format f = format_of(x.dtype);
  for (int64_t i = 0; i < n * c * s; ++i) {
    const int64_t channel = channels_last ? i % c : (i / s) % c;
    const ld sum =
        static_cast<ld>(x.get(static_cast<std::size_t>(i))) + static_cast<ld>(b.get(static_cast<std::size_t>(channel)));
    out.set(static_cast<std::size_t>(i), static_cast<float>(round_to_format(sum, f)));
  }
  return out;
}

// The same logical (n, c, s) tensor in the other layout: channel-major to channels-last (to_last) or back.
inline HostTensor relayout(const HostTensor& t, int64_t n, int64_t c, int64_t s, bool to_last) {
  HostTensor out(t.dtype, t.size());
  const std::size_t size = gnsilu::dtype_size(t.dtype);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t q = 0; q < s; ++q) {
        const auto first = static_cast<std::size_t>((i * c + k) * s + q);
        const auto last = static_cast<std::size_t>((i * s + q) * c + k);
        std::memcpy(out.bytes.data() + size * (to_last ? last : first), t.bytes.data() + size * (to_last ? first : last),
                    size);
      }
    }
  }
  return out;
}

struct Accuracy {
  std::size_t count = 0;
  std::size_t correctly_rounded = 0;
  double max_ulps = 0;          // over finite expected results
  double max_ulps_large = 0;    // over results with |exact| >= 2^-6 (away from zero crossings)
  std::size_t nan_mismatches = 0;  // NaN expected xor NaN produced
  double fraction() const { return count ? static_cast<double>(correctly_rounded) / static_cast<double>(count) : 1.0; }
};

// Compares y (any dtype) with the exact values: equal to the correctly rounded value, and error in ulps.
inline Accuracy measure(const HostTensor& y, const std::vector<ld>& exact) {
  Accuracy a;
  const Format f = format_of(y.dtype);
  for (std::size_t i = 0; i < exact.size(); ++i) {
    ++a.count;
    const ld e = exact[i];
    const ld got = y.get(i);
    if (std::isnan(e) || std::isnan(got)) {
      if (std::isnan(e) && std::isnan(got)) ++a.correctly_rounded;
      else ++a.nan_mismatches;
      continue;
    }
    const ld rounded = round_to_format(e, f);
    if (rounded == got && std::signbit(rounded) == std::signbit(got)) ++a.correctly_rounded;
    if (std::isinf(rounded) || std::isinf(got)) {
      if (rounded != got) a.max_ulps = std::max(a.max_ulps, 1e9);
      continue;
    }
    const double ulps = static_cast<double>(std::fabs(got - e) / ulp_at(e, f));
    a.max_ulps = std::max(a.max_ulps, ulps);
    if (std::fabs(e) >= 0.015625L) a.max_ulps_large = std::max(a.max_ulps_large, ulps);
  }
  return a;
}

}  // namespace testing
