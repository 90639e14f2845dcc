#include "plan.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "errors.hpp"
#include "gnsilu_math.cuh"
#include "kernels.hpp"

namespace gnsilu::detail {
namespace {

constexpr int64_t kFusedMaxChunks = 64;      // kernels/group_norm_silu.cu: kFusedMaxChunks
constexpr int64_t kFusedMaxChannels = 256;   // kernels/group_norm_silu.cu: kFusedMaxChannels
constexpr std::size_t kAlign = 256;
// Up to this many elements the single launch wins whenever it is eligible (launch latency dominates): on the
// H200, 1x512x32x32 bf16 ran 13.7 us fused and 14.3 us split, 1x512x64x64 31.5 us fused and 18.3 us split.
constexpr int64_t kFusedSmallElements = int64_t{1} << 20;

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Geometry make_geometry(std::span<const int64_t> shape, int64_t num_groups) {
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
  g.chunks_per_group = ceil_div(g.group_length, math::kChunk);
  g.chunks_total = g.groups_total * g.chunks_per_group;
  return g;
}

bool fused_eligible(const Geometry& g) {
  return g.chunks_per_group >= 1 && g.chunks_per_group <= kFusedMaxChunks && g.channels_per_group <= kFusedMaxChannels;
}

namespace {

struct Layout {
  std::size_t rows_offset = 0;
  std::size_t counters_offset = 0;
  std::size_t counters_bytes = 0;
  std::size_t total = 0;
};

// [chunk records][row constants][ticket (8 bytes), arrival counters and ready flags (4 bytes each per group)]
Layout layout_of(const Geometry& g) {
  Layout l;
  if (g.numel == 0) return l;
  l.rows_offset = round_up(static_cast<std::size_t>(g.chunks_total) * sizeof(math::ChunkRecord), kAlign);
  l.counters_offset = round_up(l.rows_offset + static_cast<std::size_t>(g.n * g.c) * sizeof(math::RowConstants), kAlign);
  l.counters_bytes = 8 + 8 * static_cast<std::size_t>(g.groups_total);
  l.total = round_up(l.counters_offset + l.counters_bytes, kAlign);
  return l;
}

}  // namespace

std::size_t workspace_bytes(const Geometry& g) { return layout_of(g).total; }

bool vectorizable(const Geometry& g, const void* x, const void* y) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return aligned(x) && aligned(y) && g.s % math::kVec == 0;
}

Path choose_path(const Geometry& g, Path requested, const Target& target) {
  const bool eligible = fused_eligible(g);
  if (requested == Path::Fused && !eligible) {
    throw_invalid("options.path", "the fused path takes groups of at most 64 Ki elements and 256 channels");
  }
  if (requested != Path::Auto) return requested;
  // One launch when the whole tensor is small (launch latency dominates) or when there are enough groups to
  // fill the device; three launches otherwise.
  const int sms = std::max(target.sms, 1);
  return eligible && (g.numel <= kFusedSmallElements || g.groups_total >= 2 * static_cast<int64_t>(sms))
             ? Path::Fused
             : Path::Split;
}

int64_t streamed_ahead(const Geometry& g, const Target& target) {
  const std::size_t group_bytes = static_cast<std::size_t>(g.group_length) * std::max<std::size_t>(target.x_size, 1);
  const int64_t fit = group_bytes == 0 ? 1 : static_cast<int64_t>(target.l2_bytes / 3 / group_bytes);
  return std::clamp<int64_t>(fit, 1, std::max<int64_t>(g.groups_total, 1));
}

Plan make_plan(const Geometry& g, const LaunchConfig& config, Path requested, const Target& target) {
  check_config(config);
  const int sms = std::max(target.sms, 1);
  Plan plan;
  plan.path = choose_path(g, requested, target);
  plan.threads = static_cast<unsigned>(config.warps * 32);
  const int64_t max_blocks = static_cast<int64_t>(config.programs_per_sm) * sms;

  kernel::Params& p = plan.params;
  p.n = g.n;
  p.c = g.c;
  p.g = g.g;
  p.s = g.s;
  p.channels_per_group = g.channels_per_group;
  p.group_length = g.group_length;
  p.groups_total = g.groups_total;
  p.chunks_per_group = g.chunks_per_group;
  p.chunks_total = g.chunks_total;

  if (plan.path == Path::Fused) {
    plan.fused_blocks = static_cast<unsigned>(std::min(g.groups_total, max_blocks));
    plan.workspace = 0;
    return plan;
  }
  const Layout layout = layout_of(g);
  plan.rows_offset = layout.rows_offset;
  plan.workspace = layout.total;
  const int64_t rows = g.n * g.c;
  const int64_t step = static_cast<int64_t>(plan.threads) * config.elems_per_load;
  // Rows of s elements are cut into spans of whole vectors.
  const auto set_spans = [&](int64_t spans) {
    spans = std::clamp<int64_t>(spans, 1, std::max<int64_t>(1, ceil_div(g.s, step)));
    int64_t span = ceil_div(g.s, spans);
    span = ceil_div(span, math::kVec) * math::kVec;  // spans start on vector boundaries
    p.spans_per_row = ceil_div(g.s, span);
    p.span_length = span;
    p.tiles_total = rows * p.spans_per_row;
  };

  if (plan.path == Path::Streamed) {
    // Items of about kStreamedItem elements: statistics items of whole chunks (a multiple of the chunks the
    // warps of a block take in one round), apply items of one row's span.
    const int64_t kStreamedItem = std::max<int64_t>(target.streamed_item, math::kChunk);
    const int64_t round = static_cast<int64_t>(config.warps) * config.stages;
    p.stats_item_chunks = std::max<int64_t>(round, kStreamedItem / math::kChunk / round * round);
    p.stats_items_per_group = ceil_div(g.chunks_per_group, p.stats_item_chunks);
    set_spans(ceil_div(g.s, kStreamedItem));
    p.apply_items_per_group = g.channels_per_group * p.spans_per_row;
    p.ahead = streamed_ahead(g, target);
    p.items_total = g.groups_total * (p.stats_items_per_group + p.apply_items_per_group);
    plan.streamed_blocks = static_cast<unsigned>(std::min<int64_t>(p.items_total, max_blocks));
    plan.counters_offset = layout.counters_offset;
    plan.counters_bytes = layout.counters_bytes;
    return plan;
  }
  // chunk_stats: one warp per `stages` chunks.
  const int64_t warps_needed = ceil_div(g.chunks_total, config.stages);
  plan.stats_blocks = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(warps_needed, config.warps), 1, max_blocks));
  // finalize: one block per group.
  plan.finalize_blocks = static_cast<unsigned>(std::min<int64_t>(g.groups_total, int64_t{1} << 20));
  plan.finalize_threads = 512;  // kernels/group_norm_silu.cu: kFinalizeThreads
  // apply: a few tiles per block of the grid.
  set_spans(ceil_div(max_blocks * 4, rows));
  plan.apply_blocks = static_cast<unsigned>(std::min<int64_t>(p.tiles_total, max_blocks));
  return plan;
}

}  // namespace gnsilu::detail
