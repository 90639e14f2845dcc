// gnsilu kernels: channels-last statistics through shared-memory tiles (a tile of pixels x a slice of channels,
// transposed so that each channel's window reduces as a channel-major chunk does). A part of group_norm_silu.cu,
// compiled with it by NVRTC at run time.
#pragma once

#include "gnsilu_loops.cuh"

namespace gnsilu {
namespace kernel {

// ---- channels-last statistics tiles ------------------------------------------------------------------------
// Item (sample, window k, slice): pixels [1024 k, 1024 k + pixels) of the slice's K channels, which are K whole
// chunks (one channel per chunk: S > 512). The tile sits in shared memory channel-major: row c holds channel c's
// window as NCHW would, 16-bit values two to a word (FP32 one), so that a warp reads its chunk's vector u (pixels
// 8u ... 8u + 7) as one 16-byte load (FP32: two) and reduces it with reduce_chunk, the NCHW kernel's code.
// O = cl_slice_vectors 16-byte vectors per pixel of the slice (K = O * 8 channels in 16-bit, O * 4 in FP32).
// Writes transpose: a thread loads vector o of a pixel pair (16-bit: the same 8 channels of pixels 2a and 2a + 1,
// joined into words by PRMT) or of one pixel (FP32), and stores one word per channel. The word index is XOR-ed
// with (32 / O) * o, which keeps groups of 4 words (16 bytes) together and puts the O vectors of a warp's stores
// in distinct banks; readers apply the same XOR.
template <int XT>
struct Tile {
  static constexpr int kBytes = XT == kFP32 ? 4 : 2;
  static constexpr int kRowWords = kChunk * kBytes / 4;   // one channel's window: 512 or 1024 words
  static constexpr int kChannelsPerVector = 16 / kBytes;  // 8 or 4
};

__device__ __forceinline__ int log2_small(int v) { return v >= 4 ? 2 : v >= 2 ? 1 : 0; }

// Where one thread's units of a tile go (store_tile).
struct TileUnits {
  const char* at;   // the first unit's first vector in x
  i64 step_bytes;   // from a unit to the thread's next one
  i64 pixel_bytes;  // from a pixel to the next (16-bit units hold two)
  u32* row;         // the thread's vector's first row in the tile
  u32 first_word, word_step, swizzle;
  int first_pixel, pixel_step, count, pixels;
  Raw16 bias;  // with an input bias: the biases of the thread's vector's channels (raw bits of x's dtype)
};

// A batch of 4 of a thread's units (j0 ... j0 + 3) held in registers between their loads and their stores.
template <int XT>
struct HeldUnits {
  Raw16 a[4], b[4];  // b: the second pixel of a 16-bit unit
};

// Loads units j0 ... j0 + 3, `at` pointing at unit j0. FULL: a whole window in whole batches (the common case),
// with no test per unit; otherwise units past the count or the window's pixels are zero.
template <int XT, bool FULL>
__device__ __forceinline__ void load_units(const TileUnits& u, const char* at, int j0, HeldUnits<XT>& h) {
  const Raw16 zero{0u, 0u, 0u, 0u};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = j0 + q;
    const int pixel = u.first_pixel + j * u.pixel_step;
    const char* unit = at + q * u.step_bytes;
    if constexpr (FULL) {
      h.a[q] = load16(unit);
      if constexpr (XT != kFP32) h.b[q] = load16(unit + u.pixel_bytes);
    } else {
      h.a[q] = j < u.count && pixel < u.pixels ? load16(unit) : zero;
      if constexpr (XT != kFP32) h.b[q] = j < u.count && pixel + 1 < u.pixels ? load16(unit + u.pixel_bytes) : zero;
    }
  }
}

// Stores units j0 ... j0 + 3 into the tile, one word per channel. BIAS: the input bias is added to the units'
// pixels (those past the window's stay +0), here, where only this batch's registers are live (added to a chunk
// after the tile, with the next item's units held, the 16-bit instances spilled on sm_75).
template <int XT, bool FULL, bool BIAS>
__device__ __forceinline__ void store_units(const TileUnits& u, int j0, const HeldUnits<XT>& h) {
  using T = Tile<XT>;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = j0 + q;
    if (FULL || j < u.count) {
      u32* words = u.row + ((u.first_word + static_cast<u32>(j) * u.word_step) ^ u.swizzle);
      Raw16 a = h.a[q];
      if constexpr (BIAS) {
        const int pixel = u.first_pixel + j * u.pixel_step;
        if (FULL || pixel < u.pixels) a = add_words<XT>(a, u.bias);
      }
      const u32 wa[4] = {a.a, a.b, a.c, a.d};
      if constexpr (XT == kFP32) {
#pragma unroll
        for (int k = 0; k < 4; ++k) words[k * T::kRowWords] = wa[k];
      } else {
        Raw16 b = h.b[q];
        if constexpr (BIAS) {
          const int pixel = u.first_pixel + j * u.pixel_step;
          if (FULL || pixel + 1 < u.pixels) b = add_words<XT>(b, u.bias);
        }
        const u32 wb[4] = {b.a, b.b, b.c, b.d};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          words[(2 * k) * T::kRowWords] = permute(wa[k], wb[k], 0x5410u);
          words[(2 * k + 1) * T::kRowWords] = permute(wa[k], wb[k], 0x7632u);
        }
      }
    }
  }
}

// All of a thread's units into the tile, a batch of 4 at a time.
template <int XT, bool FULL, bool BIAS>
__device__ __forceinline__ void store_tile_units(const TileUnits& u) {
  const char* at = u.at;
  for (int j0 = 0; j0 < u.count; j0 += 4) {
    HeldUnits<XT> h;
    load_units<XT, FULL>(u, at, j0, h);
    store_units<XT, FULL, BIAS>(u, j0, h);
    at += 4 * u.step_bytes;
  }
}

// A thread's units of item `item`'s tile, and the item's place: (sample, window, slice).
template <int XT, int THREADS, bool BIAS>
__device__ __forceinline__ TileUnits tile_units(const Params& p, i64 item, u32* tile, i64& sample, i64& window,
                                                i64& slice) {
  using T = Tile<XT>;
  constexpr int kPixelsPerUnit = XT == kFP32 ? 1 : 2;
  i64 rest;
  divide_small(item, p.cl_slices, rest, slice);
  divide_small(rest, p.chunks_per_row, sample, window);
  const i64 left = p.s - window * kChunk;
  const int shift = log2_small(p.cl_slice_vectors);
  const int vectors = p.cl_slice_vectors;
  const int units = (kChunk / kPixelsPerUnit) << shift;
  // A thread's units are tid, tid + THREADS, ...: all the same vector o of a pixel (THREADS is a multiple of the
  // vectors per pixel), at unit rows (tid >> shift) + j (THREADS >> shift). Addresses and words advance by
  // constants, so a unit costs its loads, PRMTs and stores and a few adds.
  const int o = static_cast<int>(threadIdx.x) & (vectors - 1);
  TileUnits u;
  u.count = THREADS <= units ? units / THREADS : (static_cast<int>(threadIdx.x) < units ? 1 : 0);
  u.pixels = static_cast<int>(left < kChunk ? left : kChunk);
  u.first_pixel = (static_cast<int>(threadIdx.x) >> shift) * kPixelsPerUnit;
  u.pixel_step = (THREADS >> shift) * kPixelsPerUnit;
  u.pixel_bytes = p.c * T::kBytes;
  const i64 slice_channels = static_cast<i64>(vectors) * T::kChannelsPerVector;
  u.at = static_cast<const char*>(p.x) +
         ((sample * p.s + window * kChunk + u.first_pixel) * p.c + slice * slice_channels) * T::kBytes + o * 16;
  u.step_bytes = u.pixel_step * u.pixel_bytes;
  u.swizzle = static_cast<u32>(o) * (32u >> shift);
  u.row = tile + o * T::kChannelsPerVector * T::kRowWords;
  u.first_word = static_cast<u32>(u.first_pixel / kPixelsPerUnit);
  u.word_step = static_cast<u32>(THREADS >> shift);
  if constexpr (BIAS) {
    const i64 first = slice * slice_channels + o * T::kChannelsPerVector;  // the vector's first channel
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (XT == kFP32)
        w[k] = bias_bits<XT>(p, first + k);
      else
        w[k] = bias_bits<XT>(p, first + 2 * k) | (bias_bits<XT>(p, first + 2 * k + 1) << 16);
    }
    u.bias = Raw16{w[0], w[1], w[2], w[3]};
  }
  return u;
}

template <int XT, bool BIAS>
__device__ __forceinline__ void store_tile(const TileUnits& u) {
  if (u.pixels == kChunk && u.count % 4 == 0)
    store_tile_units<XT, true, BIAS>(u);
  else
    store_tile_units<XT, false, BIAS>(u);
}

// Channel c's chunk of the tile, in reduce_chunk's raw layout.
template <int XT>
__device__ __forceinline__ void tile_chunk(const u32* tile, int c, int shift, int pixels, int lane, ChunkData<XT>& d) {
  using T = Tile<XT>;
  const u32 swizzle = (32u >> shift) * static_cast<u32>(c / T::kChannelsPerVector);
  const u32* row = tile + c * T::kRowWords;
  d.n = pixels;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const u32 u = static_cast<u32>(lane + kLanes * s);
    if constexpr (XT == kFP32) {
      d.raw[s].q[0] = *reinterpret_cast<const Raw16*>(row + ((8u * u) ^ swizzle));
      d.raw[s].q[1] = *reinterpret_cast<const Raw16*>(row + ((8u * u + 4u) ^ swizzle));
    } else {
      d.raw[s].q[0] = *reinterpret_cast<const Raw16*>(row + ((4u * u) ^ swizzle));
    }
  }
}

// The K chunks of a tile in shared memory, reduced by the block's warps.
template <int XT, int WARPS>
__device__ __forceinline__ void reduce_tile(const Params& p, const u32* tile, i64 sample, i64 window, i64 slice,
                                            int pixels) {
  using T = Tile<XT>;
  const int lane = threadIdx.x & 31;
  const int shift = log2_small(p.cl_slice_vectors);
  const int slice_channels = p.cl_slice_vectors * T::kChannelsPerVector;
  exact::ChunkRecord* records = static_cast<exact::ChunkRecord*>(p.records);
  for (int c = static_cast<int>(threadIdx.x) / 32; c < slice_channels; c += WARPS) {
    ChunkData<XT> d;
    tile_chunk<XT>(tile, c, shift, pixels, lane, d);
    const i64 row = sample * p.c + slice * slice_channels + c;
    finish_chunk<XT, false>(d, row * p.chunks_per_row + window, lane, records);
  }
}

// The block's items item, item + gridDim, ... With at most 4 units a thread (the default 8-warp blocks), the next
// item's loads are issued before this item is reduced, so that a block always has loads in flight; otherwise each
// item is loaded, then reduced.
template <int XT, int WARPS, bool BIAS>
__device__ __forceinline__ void chunk_stats_tiles(const Params& p) {
  constexpr int kThreads = WARPS * 32;
  extern __shared__ Raw16 dynamic_shared[];
  u32* tile = reinterpret_cast<u32*>(dynamic_shared);
  i64 item = blockIdx.x;
  if (item >= p.cl_stats_items) return;
  i64 sample, window, slice;
  TileUnits u = tile_units<XT, kThreads, BIAS>(p, item, tile, sample, window, slice);
  if (u.count <= 4) {
    // One batch a thread (count <= 4): its loads for the next item are in flight while this item is reduced.
    HeldUnits<XT> held;
    load_units<XT, false>(u, u.at, 0, held);
    for (;;) {
      store_units<XT, false, BIAS>(u, 0, held);
      __syncthreads();
      const i64 next = item + gridDim.x;
      i64 next_sample = 0, next_window = 0, next_slice = 0;
      TileUnits following = u;
      if (next < p.cl_stats_items) {
        following = tile_units<XT, kThreads, BIAS>(p, next, tile, next_sample, next_window, next_slice);
        load_units<XT, false>(following, following.at, 0, held);
      }
      reduce_tile<XT, WARPS>(p, tile, sample, window, slice, u.pixels);
      __syncthreads();  // the tile is rewritten for the next item
      if (next >= p.cl_stats_items) return;
      item = next;
      u = following;
      sample = next_sample;
      window = next_window;
      slice = next_slice;
    }
  }
  for (;;) {
    store_tile<XT, BIAS>(u);
    __syncthreads();
    reduce_tile<XT, WARPS>(p, tile, sample, window, slice, u.pixels);
    __syncthreads();  // the tile is rewritten for the next item
    item += gridDim.x;
    if (item >= p.cl_stats_items) return;
    u = tile_units<XT, kThreads, BIAS>(p, item, tile, sample, window, slice);
  }
}

}  // namespace kernel
}  // namespace gnsilu
