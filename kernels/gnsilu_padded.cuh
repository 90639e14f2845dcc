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
// - Channel-major: y as one flat sequence of pieces of 8 elements, a thread per piece. A piece inside one line and
//   inside x's line (most of them) reads its 8 elements of x from the two 16-byte vectors that hold them (three for
//   FP32); one near a border, across lines or at the end of y gathers them one at a time. Both then share the
//   transform and the store (one 16-byte vector where x and y are aligned), so a warp diverges only in the gather
//   (with a path of their own, one exact SiLU at a time, the kernel was compute-bound at 15% of the DRAM bandwidth
//   on the H200: PERFORMANCE.md v16). A piece is located with
//   divisions (math::divide_small); the next line follows without (next_line). A constant border stored through a
//   vector is rounded as store_element rounds it (the host makes a NaN border the canonical one, add_padding).
// - Channels-last: a warp per (sample, line, slice of 32 kPadPerLane channels). With 16-byte vectors (x and y
//   aligned, C a multiple of 8), a lane takes 8 consecutive channels, so lanes_per_pixel lanes cover a pixel's
//   channels of the slice and the warp walks 32 / lanes_per_pixel pixels at a time, four vectors in flight a lane
//   (two for FP32 x).
//   Otherwise a lane takes channels lane, lane + 32, ... one element at a time. The lanes keep their channels'
//   constants in registers. kPadPerLane: gnsilu_params.cuh. transform<ACT> gives transform_values' bits (it is the
//   exact path those take for an element whose fast SiLU is not decided).

// One of four words (or floats) by a runtime index 0..3: selects, where indexing an array would put it in memory.
template <typename T>
__device__ __forceinline__ T pick4(int i, T a, T b, T c, T d) {
  return i == 0 ? a : (i == 1 ? b : (i == 2 ? c : d));
}

// The 8 elements of x from element `first` (any alignment; x's base 16-byte aligned), from the aligned 16-byte
// vectors that hold them: two for 16-bit x, three for FP32. The caller makes sure those vectors lie inside x.
template <int XT>
__device__ __forceinline__ void load_window(const void* x, i64 first, float (&v)[kVec]) {
  if constexpr (XT == kFP32) {
    const float* base = static_cast<const float*>(x) + (first & ~i64{3});
    const int r = static_cast<int>(first & 3);
    const Raw16 q0 = load16(base), q1 = load16(base + 4);
    const Raw16 q2 = r != 0 ? load16(base + 8) : q1;
    const u32 w[12] = {q0.a, q0.b, q0.c, q0.d, q1.a, q1.b, q1.c, q1.d, q2.a, q2.b, q2.c, q2.d};
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = float_of(pick4(r, w[j], w[j + 1], w[j + 2], w[j + 3]));
  } else {
    const u16* base = static_cast<const u16*>(x) + (first & ~i64{7});
    const int r = static_cast<int>(first & 7);
    const Raw16 q0 = load16(base);
    const Raw16 q1 = r != 0 ? load16(base + 8) : q0;
    const u32 w[8] = {q0.a, q0.b, q0.c, q0.d, q1.a, q1.b, q1.c, q1.d};
    const int q = r >> 1;
    RawVector<XT> raw;
    u32 out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const u32 lo = pick4(q, w[j], w[j + 1], w[j + 2], w[j + 3]);
      const u32 hi = pick4(q, w[j + 1], w[j + 2], w[j + 3], w[j + 4]);
      out[j] = r & 1 ? permute(lo, hi, 0x5432) : lo;  // elements 2j + r, 2j + r + 1
    }
    raw.q[0] = Raw16{out[0], out[1], out[2], out[3]};
    unpack<XT>(raw, v);
  }
}

// Rows of fewer than 8 padded elements (a tiny spatial block): a thread per piece, each element with its own row's
// constants, located from scratch (math::padded_cursor).
template <int XT, int YT, int ACT>
__device__ __forceinline__ void apply_padded_tiny_rows(const Params& p, i64 lines, i64 total) {
  const math::Padding& pad = p.pad;
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  const i64 width = pad.dims[2], out_width = pad.out_dims[2], before = pad.before[2];
  const i64 threads = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 piece = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; piece * kVec < total; piece += threads) {
    const i64 start = piece * kVec;
    i64 flat_line, position;
    divide_small(start, out_width, flat_line, position);
    PaddedCursor at = padded_cursor(p.pad, p.s, flat_line, lines);
#pragma unroll 1
    for (int k = 0; k < kVec && start + k < total; ++k) {
      if (position == out_width) {
        position = 0;
        next_padded_line(p.pad, p.s, at, lines);
      }
      i64 w = position - before;
      const bool shows = at.shown && (pad.mode == kPadReplicate || (w >= 0 && w < width));
      w = w < 0 ? 0 : (w >= width ? width - 1 : w);
      store_element<YT>(
          p.y, start + k,
          shows ? transform<ACT>(biased<XT>(p, load_element<XT>(p.x, at.x_line + w), at.row % p.c), rows[at.row])
                : pad.value);
      ++position;
    }
  }
}

// Channel-major: each warp takes one run of consecutive pieces of y (the pieces divided evenly among the grid's
// warps, in multiples of 32), lane l the run's pieces l, l + 32, ... Each lane locates its first piece with divisions
// (math::padded_cursor) and then carries its cursor forward, 256 elements a step, line by line (next_padded_line):
// the divisions that located every piece anew made the kernel compute-bound at 15% of the DRAM bandwidth
// (PERFORMANCE.md v16).
template <int XT, int YT, int ACT>
__device__ __forceinline__ void apply_padded_channels_first(const Params& p) {
  const math::Padding& pad = p.pad;
  const RowConstants* rows = static_cast<const RowConstants*>(p.rows);
  const i64 width = pad.dims[2], out_width = pad.out_dims[2], before = pad.before[2];
  const i64 lines = pad.out_s / out_width;  // output lines per row (sample, channel)
  const i64 row_count = p.n * p.c;
  const i64 x_total = row_count * p.s;
  const i64 total = row_count * pad.out_s;
  if (pad.out_s < kVec) {
    apply_padded_tiny_rows<XT, YT, ACT>(p, lines, total);
    return;
  }
  // Rows of at least 8 elements from here: a piece meets at most two rows, whose constants stay in registers.
  constexpr i64 kXVector = XT == kFP32 ? 4 : 8;  // elements of x in a 16-byte vector
  constexpr i64 kStep = kLanes * kVec;           // elements from a lane's piece to its next one
  const bool has_bias = p.input_bias != nullptr;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const i64 warps = static_cast<i64>(gridDim.x) * (blockDim.x / 32);
  const i64 warp = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const i64 pieces = (total + kVec - 1) / kVec;
  const i64 per_warp = ((pieces + warps - 1) / warps + kLanes - 1) / kLanes * kLanes;
  const i64 first_piece = warp * per_warp + lane;
  if (first_piece >= pieces) return;
  i64 start = first_piece * kVec;
  const i64 end = (warp + 1) * per_warp * kVec < total ? (warp + 1) * per_warp * kVec : total;
  i64 flat_line, position;
  divide_small(start, out_width, flat_line, position);
  PaddedCursor at = padded_cursor(p.pad, p.s, flat_line, lines);
  // The constants (and input bias) of the row last loaded.
  i64 loaded_row = -1;
  RowConstants rc_first{};
  float b_first = 0.0f;
  for (; start < end;) {
    const i64 first_row = at.row;
    if (first_row != loaded_row) {
      loaded_row = first_row;
      const i64 r = first_row < row_count ? first_row : 0;
      rc_first = rows[r];
      b_first = has_bias ? load_element<XT>(p.input_bias, r % p.c) : 0.0f;
    }
    const i64 w0 = position - before;
    const i64 window = at.x_line + w0;
    float v[kVec];
    RowConstants rc_second = rc_first;
    float b_second = b_first;
    unsigned shown = 0, second = 0;  // bit k: element k shows x; element k is of the second row
    if (p.pad_vectors && at.shown && position + kVec <= out_width && w0 >= 0 && w0 + kVec <= width &&
        (window & ~(kXVector - 1)) + (XT == kFP32 ? 12 : 16) <= x_total) {
      // The common case: 8 elements of one line, all inside x's line.
      load_window<XT>(p.x, window, v);
      if (has_bias) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[k] = add_in<XT>(v[k], b_first);
      }
      shown = 0xFFu;
    } else {
      // Near a border, across lines or at the end of y: the elements one at a time, on a copy of the cursor (the
      // arithmetic below is shared, so that a warp whose lanes took both branches diverges only here).
      PaddedCursor c = at;
      i64 q = position;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (q == out_width) {
          q = 0;
          next_padded_line(p.pad, p.s, c, lines);
          if (c.row != first_row && second == 0 && c.row < row_count) {
            rc_second = rows[c.row];
            if (has_bias) b_second = load_element<XT>(p.input_bias, c.row % p.c);
          }
        }
        if (c.row != first_row) second |= 1u << k;
        i64 w = q - before;
        const bool shows = c.shown && start + k < total && (pad.mode == kPadReplicate || (w >= 0 && w < width));
        w = w < 0 ? 0 : (w >= width ? width - 1 : w);
        v[k] = shows ? load_element<XT>(p.x, c.x_line + w) : 0.0f;
        if (has_bias) v[k] = add_in<XT>(v[k], c.row != first_row ? b_second : b_first);
        shown |= shows ? 1u << k : 0u;
        ++q;
      }
    }
    const auto row_of = [&](int k) -> const RowConstants& { return second & (1u << k) ? rc_second : rc_first; };
    transform_values<YT, ACT, false>(v, row_of, [&](int e) { return v[e]; });
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = shown & (1u << k) ? v[k] : pad.value;
    if (p.pad_vectors && start + kVec <= total) {
      store_vector<YT>(p.y, start, v);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (start + k < total) store_element<YT>(p.y, start + k, v[k]);
      }
    }
    // The lane's next piece: kStep elements on, lines followed one by one.
    start += kStep;
    if (start >= end) break;
    advance_padded(pad, p.s, lines, at, position, kStep);
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
  const u32 border = YT == kFP32 ? float_canonical_bits(pad.value)
                                 : (YT == kBF16 ? float_to_bf16(pad.value) : float_to_fp16(pad.value)) * 0x10001u;
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
