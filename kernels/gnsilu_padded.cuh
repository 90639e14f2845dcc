// gnsilu kernels: the padded output's apply loops (apply_padded: the interior and the border of F.pad's output in
// one pass), channel-major and channels-last. A part of group_norm_silu.cu, compiled with it by NVRTC at run time.
#pragma once

#include "gnsilu_loops.cuh"

namespace gnsilu {
namespace kernel {

// y with a border (Params::pad), after finalize. The padded output is cut into lines: the W' positions of one
// (outer, d', h') of the last three spatial dimensions, which all show one line of x (math::padded_line) or, on a
// constant border, none. An element inside, or on a replicate border, is y of the element of x it shows, computed as
// apply computes it (transform_values with its row's constants), so the border holds F.pad's copy of the unpadded
// output's bits; a constant border is the value rounded to y's dtype. LAYOUT is y's (the variant's: where x's two
// layouts are one memory, the host picks y's). One layout per instance: with both in one kernel ptxas spilled on
// sm_100 and later.
// - Channel-major: a block per tile of y (whole lines, staged in shared memory; apply_padded_channels_first says
//   how), pieces of 8 elements on x's alignment, stores of 16 bytes on y's.
// - Channels-last: a warp per (sample, line, slice of 32 kPadPerLane channels). With 16-byte vectors (x and y
//   aligned, C a multiple of 8), a lane takes 8 consecutive channels, so lanes_per_pixel lanes cover a pixel's
//   channels of the slice and the warp walks 32 / lanes_per_pixel pixels at a time, four vectors in flight a lane
//   (two for FP32 x).
//   Otherwise a lane takes channels lane, lane + 32, ... one element at a time. The lanes keep their channels'
//   constants in registers. kPadPerLane: gnsilu_params.cuh. transform<ACT> gives transform_values' bits (it is the
//   exact path those take for an element whose fast SiLU is not decided).

// A staged element of y: its bits.
template <int YT>
struct StageOf {
  using type = u16;
};
template <>
struct StageOf<kFP32> {
  using type = u32;
};

// Channel-major: a block stages a tile of y (math::padded_tiling: whole lines, or a segment of one long line) in
// shared memory as y's bits, then stores the tile with 16-byte vectors on y's own alignment.
// 1. The tile's lines: the line of x each shows (or none) and its row, one thread a line, into shared memory.
// 2. The elements inside x's line: pieces of 8 on x's own 16-byte alignment (a line of x starts anywhere), a thread
//    a piece: one vector load, the transform as apply's (transform_values with the row's constants), the
//    elements written to their places in the tile. A line on a constant border takes the same pieces and writes
//    the constant.
// 3. The border positions of each line (before and after the interior: a few a line): one element a thread, a
//    replicate border computed from its edge element of x as the interior's, a constant one the constant.
// 4. The tile to y: aligned 16-byte vectors from the staged bits, the unaligned head and tail element by element.
// Every thread's work is uniform except at a tile's edges, and a piece never meets a line's border: the flat walk
// of y that located each element in its line (the kernel before this one; docs/PERFORMANCE.md, the padded output)
// spent 85 instructions an element on borders, line crossings and divergence.
template <int XT, int YT, int ACT>
__device__ __forceinline__ void apply_padded_channels_first(const Params& p) {
  using Stage = typename StageOf<YT>::type;
  constexpr i64 kCapacity = kPadTileBytes / static_cast<i64>(sizeof(Stage));
  __shared__ alignas(16) Stage stage[kCapacity];
  __shared__ i64 line_x[kPadTileLines];  // index in x of the line's first element, -1 on a constant border
  __shared__ i64 line_row[kPadTileLines];
  const math::Padding& pad = p.pad;
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  const i64 width = pad.dims[2], out_width = pad.out_dims[2], before = pad.before[2];
  const i64 lines_per_row = pad.out_s / out_width;
  const i64 x_total = p.n * p.c * p.s;
  const PaddedTiling tiling = padded_tiling(pad, p.n * p.c, kCapacity);
  const i64 border_count = before + pad.after[2];
  const u32 constant = output_bits<YT>(pad.value);
  const bool has_bias = p.input_bias != nullptr;
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  for (i64 tile = blockIdx.x; tile < tiling.tiles; tile += gridDim.x) {
    i64 first_line, count, q_begin, seg_len;
    if (tiling.segments == 1) {
      first_line = tile * tiling.per_tile;
      count = tiling.lines - first_line < tiling.per_tile ? tiling.lines - first_line : tiling.per_tile;
      q_begin = 0;
      seg_len = out_width;
    } else {
      i64 segment;
      divide_small(tile, tiling.segments, first_line, segment);
      count = 1;
      q_begin = segment * tiling.segment;
      seg_len = out_width - q_begin < tiling.segment ? out_width - q_begin : tiling.segment;
    }
    const i64 y_begin = first_line * out_width + q_begin;  // the tile is y's elements [y_begin, y_begin + y_count)
    const i64 y_count = count * seg_len;
    // 1. The lines.
    for (i64 t = tid; t < count; t += threads) {
      i64 row, line, source = 0;
      divide_small(first_line + t, lines_per_row, row, line);
      line_x[t] = padded_line(pad, line, source) ? row * p.s + source * width : -1;
      line_row[t] = row;
    }
    __syncthreads();
    // 2. The interior: x's positions [xs, xe) of each line land at before + w - q_begin of its place in the tile.
    const i64 xs = q_begin - before > 0 ? q_begin - before : 0;
    const i64 xe = q_begin + seg_len - before < width ? q_begin + seg_len - before : width;
    if (xs < xe) {
      // Item (t, m): piece m of the tile's line t. A thread takes items tid, tid + threads, ... kBatch at a time,
      // their loads issued before any is transformed (one load in flight a thread left the kernel at 19% of the
      // DRAM bandwidth).
      constexpr int kBatch = XT == kFP32 ? 2 : 4;
      const int pieces = static_cast<int>((xe - xs + kVec - 1) / kVec + 1);  // a line's pieces: at most this many
      const int lines = static_cast<int>(count);
      const int step_t = threads / pieces, step_m = threads % pieces;  // from an item to the thread's next
      const int row_place = static_cast<int>(before - q_begin);         // x's position w lands at row_place + w
      int t = tid / pieces, m = tid % pieces;
      while (t < lines) {
        int ts[kBatch], ms[kBatch];
        RawVector<XT> raw[kBatch];
#pragma unroll
        for (int q = 0; q < kBatch; ++q) {
          ts[q] = t;
          ms[q] = m;
          if (t < lines) {
            const i64 x_line = line_x[t];
            const i64 first = (((x_line >= 0 ? x_line : 0) + xs) & ~i64{kVec - 1}) + m * kVec;
            if (x_line >= 0 && p.pad_vectors && first + kVec <= x_total) raw[q] = load_raw<XT>(p.x, first);
          }
          t += step_t;
          m += step_m;
          if (m >= pieces) {
            m -= pieces;
            ++t;
          }
        }
#pragma unroll
        for (int q = 0; q < kBatch; ++q) {
          if (ts[q] >= lines) continue;
          const i64 x_line = line_x[ts[q]];
          const i64 base = x_line >= 0 ? x_line : 0;
          const i64 first = ((base + xs) & ~i64{kVec - 1}) + ms[q] * kVec;  // the piece's first element, in x
          // Its elements j in [lo, hi) are positions xs <= w < xe of the line; element j lands at stage[at + j].
          const i64 w = first - base;
          const int lo = xs - w > 0 ? static_cast<int>(xs - w) : 0;
          const int hi = xe - w < kVec ? static_cast<int>(xe - w) : kVec;
          if (hi <= 0) continue;
          const int at = ts[q] * static_cast<int>(seg_len) + row_place + static_cast<int>(w);
          if (x_line < 0) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              if (j >= lo && j < hi) stage[at + j] = static_cast<Stage>(constant);
            }
            continue;
          }
          float v[kVec];
          if (p.pad_vectors && first + kVec <= x_total) {
            unpack<XT>(raw[q], v);
          } else {
#pragma unroll
            for (int j = 0; j < kVec; ++j) v[j] = first + j < x_total ? load_element<XT>(p.x, first + j) : 0.0f;
          }
          const i64 row = line_row[ts[q]];
          if (has_bias) {
            const float b = load_element<XT>(p.input_bias, row % p.c);
#pragma unroll
            for (int j = 0; j < kVec; ++j) v[j] = add_in<XT>(v[j], b);
          }
          const RowConstants& rc = rows[row];
          transform_values<YT, ACT, false>(v, [&](int) -> const RowConstants& { return rc; },
                                           [&](int e) { return v[e]; });
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            if (j >= lo && j < hi) stage[at + j] = static_cast<Stage>(output_bits<YT>(v[j]));
          }
        }
      }
    }
    // 3. The border positions of each line inside the tile's segment.
    for (i64 item = tid; item < count * border_count; item += threads) {
      i64 t, k;
      divide_small(item, border_count, t, k);
      const i64 q = k < before ? k : width + k;  // the position in the line
      if (q < q_begin || q >= q_begin + seg_len) continue;
      const i64 x_line = line_x[t];
      u32 bits = constant;
      if (x_line >= 0 && pad.mode == kPadReplicate) {
        const i64 row = line_row[t];
        const i64 w = k < before ? 0 : width - 1;
        bits = output_bits<YT>(transform<ACT>(biased<XT>(p, load_element<XT>(p.x, x_line + w), row % p.c), rows[row]));
      }
      stage[t * seg_len + q - q_begin] = static_cast<Stage>(bits);
    }
    __syncthreads();
    // 4. The tile to y.
    constexpr i64 kPerVector = 16 / static_cast<i64>(sizeof(Stage));  // elements in 16 bytes of y
    const i64 y_end = y_begin + y_count;
    i64 aligned_begin = (y_begin + kPerVector - 1) & ~(kPerVector - 1);
    i64 aligned_end = y_end & ~(kPerVector - 1);
    if (!p.pad_vectors || aligned_begin >= aligned_end) aligned_begin = aligned_end = y_end;
    Stage* y = static_cast<Stage*>(p.y);
    for (i64 i = aligned_begin + tid * kPerVector; i < aligned_end; i += threads * kPerVector) {
      const Stage* from = stage + (i - y_begin);
      u32 w[4];
      if constexpr (YT == kFP32) {
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = from[j];
      } else if (((i - y_begin) & 1) == 0) {
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = reinterpret_cast<const u32*>(from)[j];
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = static_cast<u32>(from[2 * j]) | static_cast<u32>(from[2 * j + 1]) << 16;
      }
      store16(y + i, w[0], w[1], w[2], w[3]);
    }
    // The head [y_begin, aligned_begin) and the tail [aligned_end, y_end): fewer than 2 kPerVector elements, or
    // the whole tile where y is not 16-byte aligned.
    const i64 head = aligned_begin - y_begin;
    const i64 rest = head + (y_end - aligned_end);
    for (i64 k = tid; k < rest; k += threads) {
      const i64 i = k < head ? y_begin + k : aligned_end + (k - head);
      y[i] = stage[i - y_begin];
    }
    __syncthreads();
  }
}

// Channels-last, 16-byte vectors: a lane's 8 channels of pixels at, at + pixels_per_step, ...
template <int XT, int YT, int ACT>
__device__ __forceinline__ void padded_pixels_vectorized(const Params& p, i64 x_line, i64 y_line, bool shown,
                                                         const RowConstants (&rc)[kVec], const RawVector<XT>& bias,
                                                         int first_pixel, int pixels_per_step) {
  const bool has_bias = p.input_bias != nullptr;
  const math::Padding& pad = p.pad;
  const i64 width = pad.dims[2], out_width = pad.out_dims[2], before = pad.before[2];
  // The constant border's bits, as store_element rounds it.
  const u32 border = output_bits<YT>(pad.value) * (YT == kFP32 ? 1u : 0x10001u);  // two 16-bit elements a word
  const auto per_channel = [&](int e) -> const RowConstants& { return rc[e]; };
  constexpr int kInFlight = XT == kFP32 ? 2 : 4;  // vectors a lane loads before transforming them
  for (i64 at = first_pixel; at < out_width; at += kInFlight * pixels_per_step) {
    RawVector<XT> raw[kInFlight];
    bool shows[kInFlight];
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const i64 pixel = at + q * pixels_per_step;
      i64 w = pixel - before;
      shows[q] = shown && pixel < out_width && (pad.mode == kPadReplicate || (w >= 0 && w < width));
      w = w < 0 ? 0 : (w >= width ? width - 1 : w);
      if (shows[q]) raw[q] = load_raw<XT>(p.x, x_line + w * p.c);
    }
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const i64 pixel = at + q * pixels_per_step;
      if (pixel >= out_width) continue;
      if (shows[q]) {
        float v[kVec];
        unpack<XT>(has_bias ? add_raw<XT>(raw[q], bias) : raw[q], v);
        transform_values<YT, ACT, false>(v, per_channel, [&](int e) { return v[e]; });
        store_vector<YT>(p.y, y_line + pixel * p.c, v);
      } else {
        if constexpr (YT == kFP32) {
          float* at_y = static_cast<float*>(p.y) + y_line + pixel * p.c;
          store16(at_y, border, border, border, border);
          store16(at_y + 4, border, border, border, border);
        } else {
          store16(static_cast<u16*>(p.y) + y_line + pixel * p.c, border, border, border, border);
        }
      }
    }
  }
}

template <int XT, int YT, int ACT>
__device__ __forceinline__ void apply_padded_channels_last(const Params& p) {
  const math::Padding& pad = p.pad;
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  const int lane = threadIdx.x & 31;
  const i64 warps = static_cast<i64>(gridDim.x) * (blockDim.x / 32);
  const i64 first = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const i64 width = pad.dims[2], out_width = pad.out_dims[2], before = pad.before[2];
  const i64 lines = pad.out_s / out_width;
  constexpr i64 kSpan = 32 * kPadPerLane;  // channels of a slice
  const i64 slices = (p.c + kSpan - 1) / kSpan;
  // Vectorized: a pixel's vectors of the slice (at most 32) on lanes_per_pixel lanes, a power of two.
  const i64 vectors = p.c / kVec;
  int lanes_per_pixel = 32;
  while (lanes_per_pixel > 1 && lanes_per_pixel / 2 >= vectors) lanes_per_pixel /= 2;
  for (i64 item = first; item < p.n * lines * slices; item += warps) {
    i64 key, slice, sample, line, source = 0;
    divide_small(item, slices, key, slice);
    divide_small(key, lines, sample, line);
    const bool shown = padded_line(pad, line, source);
    const i64 x_row = (sample * p.s + source * width) * p.c;
    const i64 y_row = (sample * pad.out_s + line * out_width) * p.c;
    if (p.vectorized) {
      const i64 vector = slice * 32 + lane % lanes_per_pixel;
      if (vector >= vectors) continue;  // no shuffles below: idle lanes may leave
      RowConstants rc[kVec];
      RawVector<XT> bias = broadcast_raw<XT>(0u);
      if (shown) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) rc[e] = rows[sample * p.c + vector * kVec + e];
        if (p.input_bias != nullptr) {
          bias = raw_from_bits<XT>([&](int e) { return bias_bits<XT>(p, vector * kVec + e); });
        }
      }
      padded_pixels_vectorized<XT, YT, ACT>(p, x_row + vector * kVec, y_row + vector * kVec, shown, rc, bias,
                                            lane / lanes_per_pixel, 32 / lanes_per_pixel);
      continue;
    }
    // One element a lane (the fallback where vectors do not fit): the slice's channels 32 at a time, a channel a
    // lane, two pixels loaded before they are transformed.
    constexpr int kPixels = 2;
    for (int part = 0; part < kPadPerLane; ++part) {
      const i64 channel = slice * kSpan + 32 * part + lane;
      if (channel >= p.c) break;
      const RowConstants rc = shown ? rows[sample * p.c + channel] : RowConstants{};
      for (i64 at = 0; at < out_width; at += kPixels) {
        float v[kPixels];
        bool shows[kPixels];
#pragma unroll
        for (int q = 0; q < kPixels; ++q) {
          i64 w = at + q - before;
          shows[q] = shown && at + q < out_width && (pad.mode == kPadReplicate || (w >= 0 && w < width));
          w = w < 0 ? 0 : (w >= width ? width - 1 : w);
          v[q] = shows[q] ? biased<XT>(p, load_element<XT>(p.x, x_row + w * p.c + channel), channel) : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < kPixels; ++q) {
          if (at + q < out_width) {
            store_element<YT>(p.y, y_row + (at + q) * p.c + channel, shows[q] ? transform<ACT>(v[q], rc) : pad.value);
          }
        }
      }
    }
  }
}

}  // namespace kernel
}  // namespace gnsilu
