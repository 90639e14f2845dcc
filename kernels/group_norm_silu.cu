// gnsilu: the GroupNorm+SiLU kernels, compiled at run time by NVRTC for the device's exact architecture.
//
// Two paths compute the same bits (gnsilu_math.cuh defines the arithmetic and the reduction tree):
//
//   split (three launches, any size):
//     chunk_stats  one warp per 1024-element chunk: loads the chunk into registers (4 x 16-byte vectors per
//                  lane), sums it, takes its pivot, then sums the centred values and their squares from the
//                  same registers: x is read once for the statistics. Writes a 16-byte record per chunk.
//     finalize     one warp per group: combines the group's records in FP64, writes per-(n, c) constants.
//     apply        tiles of (row, span): y = silu(fma(fma(x, u, -cu), k, shift)), 16-byte loads and stores.
//     Bytes moved: x twice and y once (6 per element in 16-bit), plus 16 bytes per 1024 elements of records.
//
//   fused (one launch, groups of at most 64 chunks and 256 channels):
//     one block per group: its warps compute the chunk records into shared memory, warp 0 combines them,
//     then the block applies the group; the second read of x mostly hits L2 (the group was just read).
//
// Launch constants are template parameters: WARPS (warps per block), EPL (elements per thread per step of the
// apply loops: 8, 16 or 32), STAGES (chunks a warp holds in flight in chunk_stats: 1 or 2). None of them
// changes the reduction tree, so none changes a bit of the output.
#include "gnsilu_math.cuh"
#include "gnsilu_params.cuh"

namespace gnsilu {
namespace kernel {

using namespace gnsilu::math;

constexpr int kFusedMaxChunks = 64;
// Blocks per multiprocessor the compiler must allow: at least 512 threads, so at most 128 registers a thread.
// Without it, ptxas for some architectures (sm_120) picks a 64-register cap and spills.
template <int WARPS>
constexpr int kMinBlocks = WARPS >= 16 ? 1 : 16 / WARPS;
constexpr int kFusedMaxChannels = 256;

struct alignas(16) Raw16 {
  u32 a, b, c, d;
};

// ---- vectors of 8 elements (16 bytes of 16-bit data, 32 of FP32) ----------------------------------------
template <int T>
__device__ __forceinline__ void load_vector(const void* base, i64 i, float (&v)[kVec]) {
  if constexpr (T == kFP32) {
    const Raw16* p = reinterpret_cast<const Raw16*>(static_cast<const float*>(base) + i);
    const Raw16 lo = p[0];
    const Raw16 hi = p[1];
    v[0] = float_of(lo.a); v[1] = float_of(lo.b); v[2] = float_of(lo.c); v[3] = float_of(lo.d);
    v[4] = float_of(hi.a); v[5] = float_of(hi.b); v[6] = float_of(hi.c); v[7] = float_of(hi.d);
  } else {
    const Raw16 q = *reinterpret_cast<const Raw16*>(static_cast<const u16*>(base) + i);
    const u32 w[4] = {q.a, q.b, q.c, q.d};
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

template <int T>
__device__ __forceinline__ void store_vector(void* base, i64 i, const float (&v)[kVec]) {
  if constexpr (T == kFP32) {
    Raw16* p = reinterpret_cast<Raw16*>(static_cast<float*>(base) + i);
    p[0] = Raw16{float_canonical_bits(v[0]), float_canonical_bits(v[1]), float_canonical_bits(v[2]),
                 float_canonical_bits(v[3])};
    p[1] = Raw16{float_canonical_bits(v[4]), float_canonical_bits(v[5]), float_canonical_bits(v[6]),
                 float_canonical_bits(v[7])};
  } else {
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const u32 lo = T == kBF16 ? float_to_bf16(v[2 * k]) : float_to_fp16(v[2 * k]);
      const u32 hi = T == kBF16 ? float_to_bf16(v[2 * k + 1]) : float_to_fp16(v[2 * k + 1]);
      w[k] = lo | (hi << 16);
    }
    *reinterpret_cast<Raw16*>(static_cast<u16*>(base) + i) = Raw16{w[0], w[1], w[2], w[3]};
  }
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
__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) {
    const int o = __shfl_xor_sync(0xFFFFFFFFu, v, h);
    v = o > v ? o : v;
  }
  return v;
}

// ---- one chunk, one warp ---------------------------------------------------------------------------------
// Loads chunk `chunk` (global index over all groups) into v: slot s of this lane holds elements
// (lane + 32 s) * 8 ... + 7 of the chunk; absent elements are +0.
template <int XT>
__device__ __forceinline__ int load_chunk(const Params& p, i64 chunk, int lane, float (&v)[kSlots][kVec]) {
  const i64 group = chunk / p.chunks_per_group;
  const i64 j = chunk - group * p.chunks_per_group;
  const int n = chunk_length(p.group_length, j);
  const i64 start = group * p.group_length + j * kChunk;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int first = (lane + kLanes * s) * kVec;
    if (p.vectorized && first + kVec <= n) {
      load_vector<XT>(p.x, start + first, v[s]);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[s][e] = first + e < n ? load_element<XT>(p.x, start + first + e) : 0.0f;
    }
  }
  return n;
}

// The chunk's record from the values in registers (every lane returns the same record).
template <int XT>
__device__ __forceinline__ ChunkRecord reduce_chunk(const float (&v)[kSlots][kVec], int n, int lane) {
  float part[kSlots];
  u32 top = 0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    float a[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      a[e] = v[s][e] * Scaling<XT>::kFirst;
      if constexpr (Scaling<XT>::kScaled) {
        const u32 m = bits_of(v[s][e]) & 0x7FFFFFFFu;
        top = m > top ? m : top;
      }
    }
    part[s] = tree8(a);
  }
  const float first = warp_sum(tree_slots(part[0], part[1], part[2], part[3]));
  if constexpr (Scaling<XT>::kScaled) top = warp_max(top);
  const Pivot pivot = chunk_pivot<XT>(first, top, n);

  double pr[kSlots];
  double pq[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    float d[kVec];
    float dd[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int i = (lane + kLanes * s) * kVec + e;
      d[e] = i < n ? centred(v[s][e], pivot) : 0.0f;
      dd[e] = d[e] * d[e];
    }
    pr[s] = static_cast<double>(tree8(d));
    pq[s] = static_cast<double>(tree8(dd));
  }
  ChunkRecord r;
  r.r = warp_sum(tree_slots(pr[0], pr[1], pr[2], pr[3]));
  r.c = pivot.c;
  r.q = warp_sum(tree_slots(pq[0], pq[1], pq[2], pq[3]));
  r.e = pivot.e;
  r.unused[0] = 0;
  r.unused[1] = 0;
  return r;
}

// A group's statistics from its records, by one warp (records in global or shared memory).
__device__ __forceinline__ GroupStats group_stats_warp(const ChunkRecord* records, i64 count, i64 length,
                                                       double eps, int lane) {
  double sum = 0.0;
  int max_e = -1000;
  for (i64 j = lane; j < count; j += kLanes) {
    const ChunkRecord r = records[j];
    sum = sum + record_sum(r, chunk_length(length, j));
    max_e = r.e > max_e ? r.e : max_e;
  }
  sum = warp_sum(sum);
  max_e = warp_max(max_e);
  const double mean = div64(sum, static_cast<double>(length));
  double squares = 0.0;
  for (i64 j = lane; j < count; j += kLanes) {
    squares = squares + record_squares(records[j], chunk_length(length, j), mean);
  }
  squares = warp_sum(squares);
  return group_stats(sum, squares, length, max_e, eps);
}

__device__ __forceinline__ RowConstants channel_constants(const Params& p, const GroupStats& s, i64 channel) {
  return row_constants(s, load_parameter(p.weight, p.weight_dtype, channel, 1.0),
                       load_parameter(p.bias, p.bias_dtype, channel, 0.0));
}

// y over elements [begin, end) of one row (one set of constants), EPL elements per thread per step.
template <int XT, int YT, int THREADS, int EPL>
__device__ __forceinline__ void apply_row(const Params& p, i64 begin, i64 end, const RowConstants& rc, int tid) {
  constexpr int kVecs = EPL / kVec;
  if (p.vectorized) {
    for (i64 i = begin + static_cast<i64>(tid) * kVec; i < end; i += static_cast<i64>(THREADS) * kVec * kVecs) {
      float v[kVecs][kVec];
#pragma unroll
      for (int q = 0; q < kVecs; ++q) {
        const i64 at = i + static_cast<i64>(q) * THREADS * kVec;
        if (at < end) load_vector<XT>(p.x, at, v[q]);
      }
#pragma unroll
      for (int q = 0; q < kVecs; ++q) {
        const i64 at = i + static_cast<i64>(q) * THREADS * kVec;
        if (at < end) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) v[q][e] = transform(v[q][e], rc);
          store_vector<YT>(p.y, at, v[q]);
        }
      }
    }
  } else {
    for (i64 i = begin + tid; i < end; i += THREADS) store_element<YT>(p.y, i, transform(load_element<XT>(p.x, i), rc));
  }
}

// ---- split path ------------------------------------------------------------------------------------------
template <int XT, int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) chunk_stats(const Params p) {
  static_assert(WARPS >= 1 && WARPS <= 32, "WARPS");
  static_assert(STAGES == 1 || STAGES == 2, "STAGES");
  const int lane = threadIdx.x & 31;
  const i64 warp = static_cast<i64>(blockIdx.x) * WARPS + threadIdx.x / 32;
  const i64 warps = static_cast<i64>(gridDim.x) * WARPS;
  ChunkRecord* records = static_cast<ChunkRecord*>(p.records);
  for (i64 first = warp * STAGES; first < p.chunks_total; first += warps * STAGES) {
    float v[STAGES][kSlots][kVec];
    int n[STAGES];
#pragma unroll
    for (int s = 0; s < STAGES; ++s) n[s] = first + s < p.chunks_total ? load_chunk<XT>(p, first + s, lane, v[s]) : 0;
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      if (n[s] > 0) {
        const ChunkRecord r = reduce_chunk<XT>(v[s], n[s], lane);
        if (lane == 0) records[first + s] = r;
      }
    }
  }
}

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) finalize(const Params p) {
  const int lane = threadIdx.x & 31;
  const i64 group = static_cast<i64>(blockIdx.x) * WARPS + threadIdx.x / 32;
  if (group >= p.groups_total) return;
  const ChunkRecord* records = static_cast<const ChunkRecord*>(p.records) + group * p.chunks_per_group;
  const GroupStats s = group_stats_warp(records, p.chunks_per_group, p.group_length, p.eps, lane);
  const i64 sample = group / p.g;
  const i64 first_channel = (group - sample * p.g) * p.channels_per_group;
  RowConstants* rows = static_cast<RowConstants*>(p.rows);
  for (i64 k = lane; k < p.channels_per_group; k += kLanes) {
    rows[sample * p.c + first_channel + k] = channel_constants(p, s, first_channel + k);
  }
}

template <int XT, int YT, int WARPS, int EPL>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) apply(const Params p) {
  static_assert(EPL == 8 || EPL == 16 || EPL == 32, "EPL");
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  for (i64 t = blockIdx.x; t < p.tiles_total; t += gridDim.x) {
    const i64 row = t / p.spans_per_row;
    const i64 span = t - row * p.spans_per_row;
    const RowConstants rc = rows[row];
    const i64 begin = span * p.span_length;
    const i64 end = begin + p.span_length < p.s ? begin + p.span_length : p.s;
    apply_row<XT, YT, WARPS * 32, EPL>(p, row * p.s + begin, row * p.s + end, rc, threadIdx.x);
  }
}

// ---- fused path ------------------------------------------------------------------------------------------
template <int XT, int YT, int WARPS, int EPL>
__global__ void __launch_bounds__(WARPS * 32, kMinBlocks<WARPS>) fused(const Params p) {
  constexpr int kThreads = WARPS * 32;
  constexpr int kVecs = EPL / kVec;
  __shared__ ChunkRecord records[kFusedMaxChunks];
  __shared__ RowConstants rows[kFusedMaxChannels];
  __shared__ GroupStats stats;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32;
  const int chunks = static_cast<int>(p.chunks_per_group);
  const int channels = static_cast<int>(p.channels_per_group);
  const int length = static_cast<int>(p.group_length);  // <= 64 * 1024
  const unsigned s = static_cast<unsigned>(p.s);
  for (i64 group = blockIdx.x; group < p.groups_total; group += gridDim.x) {
    for (int j = warp; j < chunks; j += WARPS) {
      float v[kSlots][kVec];
      const int n = load_chunk<XT>(p, group * p.chunks_per_group + j, lane, v);
      const ChunkRecord r = reduce_chunk<XT>(v, n, lane);
      if (lane == 0) records[j] = r;
    }
    __syncthreads();
    if (warp == 0) {
      const GroupStats g = group_stats_warp(records, chunks, length, p.eps, lane);
      if (lane == 0) stats = g;
    }
    __syncthreads();
    const i64 sample = group / p.g;
    const i64 first_channel = (group - sample * p.g) * p.channels_per_group;
    for (int k = threadIdx.x; k < channels; k += kThreads) rows[k] = channel_constants(p, stats, first_channel + k);
    __syncthreads();
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
#pragma unroll
            for (int e = 0; e < kVec; ++e) v[q][e] = transform(v[q][e], rc);
            store_vector<YT>(p.y, base + at, v[q]);
          }
        }
      }
    } else {
      for (int i = threadIdx.x; i < length; i += kThreads) {
        const RowConstants rc = rows[static_cast<unsigned>(i) / s];
        store_element<YT>(p.y, base + i, transform(load_element<XT>(p.x, base + i), rc));
      }
    }
    __syncthreads();  // the shared records and constants are rewritten for the next group
  }
}

}  // namespace kernel
}  // namespace gnsilu
