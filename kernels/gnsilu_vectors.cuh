// gnsilu kernels: raw 16-byte vectors of 8 elements (loads, stores, unpacking, 16-bit pairs) and warp butterflies.
// A part of group_norm_silu.cu (which says what the kernels do), compiled with it by NVRTC at run time.
#pragma once

#include "gnsilu_math.cuh"
#include "gnsilu_params.cuh"

namespace gnsilu {
namespace kernel {

using namespace gnsilu::math;

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

}  // namespace kernel
}  // namespace gnsilu
