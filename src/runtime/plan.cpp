#include "runtime/plan.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "base/errors.hpp"
#include "kernels/gnsilu_exact.cuh"
#include "kernels/gnsilu_math.cuh"
#include "runtime/kernels.hpp"

namespace gnsilu::detail {
namespace {

constexpr std::size_t kAlign = 256;
// Up to this many elements the single launch wins whenever it is eligible (launch latency dominates): on the
// H200, 1x512x32x32 bf16 ran 13.7 us fused and 14.3 us split, 1x512x64x64 31.5 us fused and 18.3 us split.
constexpr int64_t kFusedSmallElements = int64_t{1} << 20;
// Channels-last statistics tiles: bytes of channels per pixel a tile holds, the widest that divides a pixel's
// bytes (1024 pixels of it in shared memory: 32 KiB for the default).
constexpr int kTileSliceBytes[] = {32, 16};

std::atomic<int> forced_slice_bytes{0};
std::atomic<int64_t> forced_parts_from{0};
std::atomic<bool> forced_atomic{false};

// finalize in parts (finalize_parts): groups of at least kPartsFrom chunk records, in calls of at most kPartsMaxGroups
// groups, are merged in parts of about kAtomicPartChunks records (one a thread of finalize's block, so that a part's
// loads are one wave with no chain of additions behind them), at most kMaxParts a group, by one launch with atomics.
// Measured on an H100 (docs/PERFORMANCE.md, "Finalize"), bf16, against parts of 512 by two launches: one group of
// 16384 records 64.7 -> 63.0 us, of 65536 181.4 -> 179.1, of 262144 615.6 -> 611.6, four of 16384 178.6 -> 177.1;
// and the two launches against one block a group, earlier: 90 -> 73 us at one group of 16384 records. Below the
// threshold parts do not pay: one group of 4096 records 36.3 us in one block, 36.5 with atomics, 37.9 by two launches;
// 32 groups of 4096 records 327.9, 329.5 and 329.3. Forced parts (force_finalize_parts_from) take kPartChunks records
// a part and two launches unless force_finalize_atomic.
constexpr int64_t kPartsFrom = 16384;
constexpr int64_t kPartsMaxGroups = 4;
constexpr int64_t kPartChunks = 512;
constexpr int64_t kAtomicPartChunks = 256;
constexpr int64_t kMaxParts = 256;

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool aligned(std::uintptr_t address, std::size_t bytes) { return address % bytes == 0; }

// Bytes per pixel of a statistics tile's slice, or 0 when tiles cannot take the geometry: chunks must be one
// channel's pixels (s > 512), x 16-byte aligned, and a pixel's bytes a multiple of the slice.
int tile_slice_bytes(const Geometry& g, const Addresses& a) {
  const int64_t pixel_bytes = g.c * static_cast<int64_t>(a.x_size);
  if (g.chunk_channels != 1 || !aligned(a.x, 16) || pixel_bytes % 16 != 0) return 0;
  const int forced = forced_slice_bytes.load();
  if (forced != 0) return pixel_bytes % forced == 0 ? forced : 0;
  for (int bytes : kTileSliceBytes)
    if (pixel_bytes % bytes == 0) return bytes;
  return 0;
}

// Channels per vector in the channels-last fused kernel's apply: 8 or 4 when they divide a group's channels and
// x and y are aligned to the vector (at most 16 bytes), else 1.
int fused_width(const Geometry& g, const Addresses& a) {
  for (int w : {8, 4}) {
    const std::size_t wx = std::min<std::size_t>(16, w * a.x_size), wy = std::min<std::size_t>(16, w * a.y_size);
    if (g.channels_per_group % w == 0 && aligned(a.x, wx) && aligned(a.y, wy)) return w;
  }
  return 1;
}

}  // namespace

void force_tile_slice_bytes(int bytes) { forced_slice_bytes.store(bytes); }
void force_finalize_parts_from(int64_t records) { forced_parts_from.store(records); }
void force_finalize_atomic(bool on) { forced_atomic.store(on); }

Geometry make_geometry(std::span<const int64_t> shape, int64_t num_groups, Layout layout) {
  if (shape.data() == nullptr && !shape.empty()) throw_invalid("shape", "is null");
  if (shape.size() < 2) {
    throw_invalid("ndim", "the shape needs at least 2 dimensions (N, C, *spatial), got " + std::to_string(shape.size()));
  }
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) throw_invalid("shape", "dimension " + std::to_string(i) + " is negative (" + std::to_string(shape[i]) + ")");
  }
  Geometry g;
  g.n = shape[0];
  g.c = shape[1];
  if (num_groups <= 0) throw_invalid("num_groups", "must be at least 1, got " + std::to_string(num_groups));
  if (g.c == 0) throw_invalid("shape", "C (dimension 1) is 0; it must be a positive multiple of num_groups");
  if (g.c % num_groups != 0) {
    throw_invalid("num_groups", std::to_string(num_groups) + " does not divide C = " + std::to_string(g.c));
  }
  g.g = num_groups;
  // Products must fit comfortably in int64 and size_t: element counts, byte offsets of 4-byte elements, and the
  // workspace (about 48 bytes per element when every group is one element): at most 2^57 elements, and at most
  // as many (sample, channel) rows even when a spatial size is 0.
  constexpr int64_t limit = int64_t{1} << 57;
  int64_t s = 1;
  for (std::size_t i = 2; i < shape.size(); ++i) {
    if (shape[i] != 0 && s > limit / shape[i]) throw_invalid("shape", "the tensor has too many elements");
    s *= shape[i];
  }
  g.s = s;
  if (g.c != 0 && s > limit / g.c) throw_invalid("shape", "the tensor has too many elements");
  const int64_t per_sample = g.c * s;
  if (g.n != 0 && per_sample > limit / g.n) throw_invalid("shape", "the tensor has too many elements");
  if (g.n != 0 && g.c > limit / g.n) throw_invalid("shape", "the tensor has too many rows (N * C)");
  g.numel = g.n * per_sample;
  g.channels_per_group = g.c / g.g;
  g.group_length = g.channels_per_group * s;
  g.groups_total = g.n * g.g;
  g.chunk_channels = math::chunk_channels(s);
  g.chunks_per_row = math::chunks_per_channel(s);
  g.chunks_per_group = s == 0 ? 0 : math::chunks_per_group(s, g.channels_per_group);
  g.chunks_total = g.groups_total * g.chunks_per_group;
  g.layout = s == 1 || g.c == 1 ? Layout::ChannelsFirst : layout;
  g.y_numel = g.numel;
  return g;
}

void add_padding(Geometry& g, std::span<const int64_t> shape, std::span<const int64_t> pad, PadMode mode,
                 double value, Layout y_layout) {
  if (pad.empty()) return;
  if (pad.data() == nullptr) throw_invalid("pad", "is null");
  const std::size_t spatial = shape.size() - 2;
  if (pad.size() % 2 != 0 || pad.size() > 6) {
    throw_invalid("pad_count", "must be 0, 2, 4 or 6 (F.pad's widths, two per padded dimension), got " +
                                   std::to_string(pad.size()));
  }
  if (pad.size() / 2 > spatial) {
    throw_invalid("pad", std::to_string(pad.size()) + " widths pad " + std::to_string(pad.size() / 2) +
                             " dimensions, but x has " + std::to_string(spatial) + " spatial dimensions");
  }
  if (mode != PadMode::Constant && mode != PadMode::Replicate) {
    throw_invalid("pad_mode", "unknown mode " + std::to_string(static_cast<int>(mode)) +
                                  " (expected CONSTANT=0 or REPLICATE=1)");
  }
  math::Padding p{{1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1}, 1,
                  mode == PadMode::Replicate ? math::kPadReplicate : math::kPadConstant,
                  // A NaN border is the NaN every conversion of the kernels keeps: all payload bits set (so that
                  // apply_padded's vector stores and store_element round it alike; the sign and payload are lost
                  // in y's dtype anyway).
                  std::isnan(value) ? std::bit_cast<float>(0x7FFFFFFFu) : static_cast<float>(value)};
  // The leading spatial dimensions (all but the last three) are not padded: their product is `outer`.
  int64_t outer = 1;
  for (std::size_t i = 2; i + 3 < shape.size(); ++i) outer *= shape[i];
  constexpr int64_t limit = int64_t{1} << 57;
  for (int d = 0; d < 3; ++d) {
    const std::size_t dim = shape.size() - 3 + d;  // dimension d of the last three (absent ones have size 1)
    if (dim >= 2) p.dims[d] = shape[dim];
    const std::size_t k = 2 * (2 - d);  // F.pad lists the last dimension first
    if (k < pad.size()) {
      for (std::size_t j : {k, k + 1}) {
        if (pad[j] < 0 || pad[j] > limit) {
          throw_invalid("pad", "width " + std::to_string(j) + " is " + std::to_string(pad[j]) +
                                   "; widths are >= 0 (gnsilu pads, it does not crop)");
        }
      }
      p.before[d] = pad[k];
      p.after[d] = pad[k + 1];
      if (mode == PadMode::Replicate && p.dims[d] == 0 && p.before[d] + p.after[d] > 0) {
        throw_invalid("pad", "replicate padding of spatial dimension " + std::to_string(dim) +
                                 ", which is empty: there is no edge element to repeat");
      }
    }
    p.out_dims[d] = p.dims[d] + p.before[d] + p.after[d];
  }
  int64_t out_s = outer;
  for (int d = 0; d < 3; ++d) {
    if (p.out_dims[d] > limit || (p.out_dims[d] != 0 && out_s > limit / p.out_dims[d])) {
      throw_invalid("pad", "the padded output has too many elements");
    }
    out_s *= p.out_dims[d];
  }
  if (g.c != 0 && out_s > limit / g.c) throw_invalid("pad", "the padded output has too many elements");
  if (g.n != 0 && g.c * out_s > limit / g.n) throw_invalid("pad", "the padded output has too many elements");
  p.out_s = out_s;
  g.pad = p;
  g.y_numel = g.n * g.c * out_s;
  // The kernels' layout is y's: where y is channels-last, x is too or its two layouts are one memory (one pixel).
  if (y_layout == Layout::ChannelsLast && out_s != 1 && g.c != 1) g.layout = Layout::ChannelsLast;
  if (g.numel == 0 && g.y_numel != 0) {
    throw_invalid("pad", "x has no elements, so its output would be all border; gnsilu pads an output of x");
  }
}

bool fused_eligible(const Geometry& g) {
  return !g.padded() && !g.biased && g.chunks_per_group >= 1 && g.chunks_per_group <= kernel::kFusedMaxChunks &&
         g.channels_per_group <= kernel::kFusedMaxChannels;
}

void check_path(const Geometry& g, Path requested) {
  if (requested == Path::Fused && g.padded()) {
    throw_invalid("options.path", "a padded output takes the split path (apply_padded); the fused path has none");
  }
  if (requested == Path::Fused && g.biased) {
    throw_invalid("options.path", "an input bias takes the split path; the fused path has none");
  }
  if (requested == Path::Fused && !fused_eligible(g)) {
    throw_invalid("options.path", "the fused path takes groups of at most " +
                                      std::to_string(kernel::kFusedMaxChunks * math::kChunk / 1024) +
                                      " Ki elements and " + std::to_string(kernel::kFusedMaxChannels) + " channels");
  }
}

FinalizeParts finalize_parts(const Geometry& g) {
  const int64_t forced = forced_parts_from.load();
  const bool in_parts = forced > 0 ? g.chunks_per_group >= forced
                                   : g.chunks_per_group >= kPartsFrom && g.groups_total <= kPartsMaxGroups;
  if (!in_parts) return {1, g.chunks_per_group, false};
  const bool atomic = forced == 0 || forced_atomic.load();
  const int64_t wanted = std::min(ceil_div(g.chunks_per_group, atomic ? kAtomicPartChunks : kPartChunks), kMaxParts);
  const int64_t chunks = ceil_div(g.chunks_per_group, wanted);
  const int64_t parts = ceil_div(g.chunks_per_group, chunks);  // every part holds at least one record
  // A group of one part needs no merge of parts (one block a group, as below the rule).
  return {parts, chunks, atomic && parts > 1};
}

namespace {
// kFinalizeAtomic's words in the workspace, which chunk_stats zeroes: an accumulator (exact::Record) a group, then a
// 32-bit arrival counter a group.
int64_t atomic_words(const Geometry& g) {
  return g.groups_total * exact::kRecordWords + ceil_div(g.groups_total * 4, 8);
}
}  // namespace

kernel::Params params_of(const Geometry& g) {
  kernel::Params p{};
  p.n = g.n;
  p.c = g.c;
  p.g = g.g;
  p.s = g.s;
  p.channels_per_group = g.channels_per_group;
  p.group_length = g.group_length;
  p.groups_total = g.groups_total;
  p.chunks_per_group = g.chunks_per_group;
  p.chunks_total = g.chunks_total;
  p.chunk_channels = g.chunk_channels;
  p.chunks_per_row = g.chunks_per_row;
  p.full_chunks = g.full_chunks() ? 1 : 0;
  return p;
}

namespace {
// The split path's workspace: chunk records, then row constants, then (finalize in parts, from finalize_parts) the
// parts' records (`parts` a group), or with atomics each group's accumulator and arrival counter (atomic_words).
struct WorkspaceLayout {
  std::size_t rows_offset = 0;
  std::size_t parts_offset = 0;
  std::size_t bytes = 0;
};
WorkspaceLayout workspace_layout(const Geometry& g, const FinalizeParts& parts) {
  WorkspaceLayout w;
  if (g.numel == 0) return w;
  w.rows_offset = round_up(static_cast<std::size_t>(g.chunks_total) * sizeof(exact::ChunkRecord), kAlign);
  const std::size_t rows = static_cast<std::size_t>(g.n * g.c) * sizeof(math::RowConstants);
  w.parts_offset = round_up(w.rows_offset + rows, kAlign);
  const std::size_t part_records =
      parts.atomic     ? static_cast<std::size_t>(atomic_words(g)) * sizeof(int64_t)
      : parts.parts > 1 ? static_cast<std::size_t>(g.groups_total * parts.parts) * sizeof(exact::Record)
                        : 0;
  w.bytes = round_up(w.parts_offset + part_records, kAlign);
  return w;
}
}  // namespace

std::size_t split_workspace_bytes(const Geometry& g) { return workspace_layout(g, finalize_parts(g)).bytes; }

bool vectorizable(const Geometry& g, const Addresses& a) {
  const int64_t row = g.layout == Layout::ChannelsLast ? g.c : g.s;
  return aligned(a.x, 16) && aligned(a.y, 16) && row % math::kVec == 0;
}

Path choose_path(const Geometry& g, Path requested, int sms) {
  if (requested != Path::Auto) return requested;  // checked by the caller (check_path)
  const bool eligible = fused_eligible(g);
  // One launch when the whole tensor is small (launch latency dominates) or when there are enough groups to
  // fill the device; three launches otherwise.
  return eligible && (g.numel <= kFusedSmallElements || g.groups_total >= 2 * static_cast<int64_t>(std::max(sms, 1)))
             ? Path::Fused
             : Path::Split;
}

Plan make_plan(const Geometry& g, const LaunchConfig& config, Path path, int sms, const Addresses& a) {
  // The caller decided the path (choose_path) and checked the configuration (check_config): asserted, not redone.
  if (path == Path::Auto || (path == Path::Fused && !fused_eligible(g))) {
    throw Error(Status::Internal, std::string("gnsilu: a plan was asked for the ") + path_name(path) +
                                      " path, which was not decided for this geometry (choose_path)");
  }
  if (sms < 1) sms = 1;
  Plan plan;
  plan.path = path;
  plan.threads = static_cast<unsigned>(config.warps * 32);
  const int64_t threads = plan.threads;
  const int64_t max_blocks = static_cast<int64_t>(config.programs_per_sm) * sms;
  const bool last = g.layout == Layout::ChannelsLast;

  plan.params = params_of(g);
  kernel::Params& p = plan.params;
  // finalize's merge, decided once here: the parameters, the launches (launch.cpp) and the workspace follow it.
  const FinalizeParts parts = finalize_parts(g);
  p.parts_per_group = parts.parts;
  p.part_chunks = parts.chunks;
  p.zero_words = parts.atomic ? atomic_words(g) : 0;
  plan.finalize_atomic = parts.atomic;
  p.vectorized = vectorizable(g, a) ? 1 : 0;

  if (plan.path == Path::Fused) {
    plan.fused_blocks = static_cast<unsigned>(std::min(g.groups_total, max_blocks));
    if (last) p.cl_fused_width = fused_width(g, a);
    plan.workspace = 0;
    return plan;
  }
  // chunk_stats: channels-last tiles of (sample, window, slice), or one warp per `stages` chunks.
  const int slice_bytes = last ? tile_slice_bytes(g, a) : 0;
  if (slice_bytes != 0) {
    p.cl_slice_vectors = slice_bytes / 16;
    p.cl_slices = g.c * static_cast<int64_t>(a.x_size) / slice_bytes;
    p.cl_stats_items = g.n * g.chunks_per_row * p.cl_slices;
    plan.stats_blocks = static_cast<unsigned>(std::clamp<int64_t>(p.cl_stats_items, 1, max_blocks));
    plan.stats_shared_bytes = static_cast<unsigned>(math::kChunk * slice_bytes);
  } else {
    const int64_t warps_needed = ceil_div(g.chunks_total, config.stages);
    plan.stats_blocks = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(warps_needed, config.warps), 1, max_blocks));
  }
  // finalize: one block of 256 threads per group; for groups of many records first one per part of a group's.
  plan.finalize_blocks = static_cast<unsigned>(std::min<int64_t>(g.groups_total, int64_t{1} << 20));
  plan.finalize_threads = static_cast<unsigned>(math::kPartials);
  if (p.parts_per_group > 1) {
    plan.finalize_part_blocks =
        static_cast<unsigned>(std::min<int64_t>(g.groups_total * p.parts_per_group, int64_t{1} << 20));
  }
  const int64_t wanted_tiles = max_blocks * 4;
  if (last) {
    // apply: ((slice of columns, sample), block of pixels) items, a few per block of the grid, each at least
    // kMinSteps steps of every thread (a thread keeps its column's constants across the items of one column).
    constexpr int64_t kMinSteps = 4;
    const int64_t columns = p.vectorized ? g.c / math::kVec : g.c;
    const int64_t tx = std::min(columns, threads);
    p.cl_columns = columns;
    p.cl_tx = static_cast<int>(tx);
    p.cl_ty = static_cast<int>(threads / tx);
    p.cl_column_slices = ceil_div(columns, tx);
    const int64_t per_step = p.cl_ty * static_cast<int64_t>(p.vectorized ? config.elems_per_load / math::kVec : math::kVec);
    int64_t blocks = std::clamp<int64_t>(ceil_div(wanted_tiles, g.n * p.cl_column_slices), 1,
                                         std::max<int64_t>(1, ceil_div(g.s, per_step * kMinSteps)));
    p.cl_block_pixels = ceil_div(g.s, blocks);
    p.cl_blocks_per_sample = ceil_div(g.s, p.cl_block_pixels);
    p.cl_apply_items = g.n * p.cl_blocks_per_sample * p.cl_column_slices;
    plan.apply_blocks = static_cast<unsigned>(std::min<int64_t>(p.cl_apply_items, max_blocks));
  } else {
    // apply: rows of s elements cut into spans so that there are a few tiles per block of the grid.
    const int64_t rows = g.n * g.c;
    const int64_t step = threads * config.elems_per_load;
    int64_t spans = std::clamp<int64_t>(ceil_div(wanted_tiles, rows), 1, std::max<int64_t>(1, ceil_div(g.s, step)));
    int64_t span = ceil_div(g.s, spans);
    span = ceil_div(span, math::kVec) * math::kVec;  // spans start on vector boundaries
    spans = ceil_div(g.s, span);
    p.spans_per_row = spans;
    p.span_length = span;
    p.tiles_total = rows * spans;
    plan.apply_blocks = static_cast<unsigned>(std::min<int64_t>(p.tiles_total, max_blocks));
  }
  if (g.padded()) {
    // apply_padded in place of apply: a block per tile of y (channel-major: whole lines staged in shared memory,
    // math::padded_tiling; vectors need x and y 16-byte aligned, whatever s) or a warp per (line, slice of channels)
    // (channels-last), a grid-stride loop over them with 8 blocks per multiprocessor at most.
    p.pad = g.pad;
    const int64_t lines = g.pad.out_s / g.pad.out_dims[2];
    p.pad_vectors = aligned(a.x, 16) && aligned(a.y, 16) ? 1 : 0;
    const int64_t staged = kernel::kPadTileBytes / static_cast<int64_t>(std::max<std::size_t>(a.y_size, 1));
    const int64_t blocks = last ? ceil_div(g.n * lines * ceil_div(g.c, kPaddedSliceChannels) * 32, int64_t{kPaddedThreads})
                                : math::padded_tiling(g.pad, g.n * g.c, staged).tiles;
    plan.padded_blocks = static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{8} * sms));
  }
  const WorkspaceLayout w = workspace_layout(g, parts);
  plan.rows_offset = w.rows_offset;
  plan.parts_offset = w.parts_offset;
  plan.workspace = w.bytes;
  return plan;
}

}  // namespace gnsilu::detail
