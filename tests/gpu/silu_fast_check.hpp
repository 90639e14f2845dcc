// The self-check kernel of the fast 16-bit SiLU (tests/gpu/test_gpu.cpp runs it over all 2^32 FP32 inputs). It
// is a test's program, not the library's: NVRTC compiles it on its own, including the library's kernel source,
// so changing it changes no cache key.
#pragma once

namespace gnsilu_test {

inline constexpr const char* kSiluFastCheckSource = R"gnsilu(
#include "group_norm_silu.cu"

namespace gnsilu {
namespace kernel {

// ---- self-check of the fast 16-bit SiLU -------------------------------------------------------------------
// For the FP32 bit patterns [first, first + count): how often transform_values takes its fast decision and
// whether the decision gives silu32's 16-bit rounding. counts: [0] decided for bf16, [1] for fp16, [2] bf16
// decided wrongly, [3] fp16 decided wrongly, [4] largest distance of the estimate from silu32 in FP32 ulps
// (|v| <= 64), [5] largest ratio of that distance to the margin silu16_decided allows, in thousandths (below
// 1000: silu32(v) always lies within the margin). Run by tests/gpu/test_gpu.cpp over all 2^32.
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
)gnsilu";

}  // namespace gnsilu_test
