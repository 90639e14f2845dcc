// Geometry, argument validation, path choice, grid sizes and workspace layout: the host logic between an
// API call and its launches.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "gnsilu/gnsilu.hpp"
#include "kernels/gnsilu_math.cuh"
#include "base/launch_config.hpp"
#include "runtime/plan.hpp"
#include "runtime/validate.hpp"

using gnsilu::DType;
using gnsilu::Path;
using namespace gnsilu::detail;

TEST_CASE("geometry of images, videos, no spatial dimension and empty tensors") {
  const std::vector<int64_t> image{2, 512, 64, 64};
  Geometry g = make_geometry(image, 32);
  CHECK(g.n == 2);
  CHECK(g.c == 512);
  CHECK(g.s == 4096);
  CHECK(g.channels_per_group == 16);
  CHECK(g.group_length == 65536);
  CHECK(g.groups_total == 64);
  CHECK(g.chunks_per_group == 64);
  CHECK(g.chunks_total == 64 * 64);
  CHECK(g.numel == 2 * 512 * 4096);

  const std::vector<int64_t> video{1, 128, 5, 33, 31};
  g = make_geometry(video, 32);
  CHECK(g.s == 5 * 33 * 31);
  CHECK(g.group_length == 4 * 5 * 33 * 31);
  CHECK(g.chunks_per_group == (4 * 5 * 33 * 31 + 1023) / 1024);

  const std::vector<int64_t> flat{3, 6};
  g = make_geometry(flat, 3);
  CHECK(g.s == 1);
  CHECK(g.group_length == 2);

  const std::vector<int64_t> empty{0, 32, 8, 8};
  g = make_geometry(empty, 32);
  CHECK(g.numel == 0);
  CHECK(workspace_bytes(g) == 0);
  const std::vector<int64_t> empty_spatial{1, 32, 0, 8};
  CHECK(make_geometry(empty_spatial, 8).numel == 0);
}

TEST_CASE("bad shapes and group counts are refused, naming the argument") {
  const std::vector<int64_t> one{4};
  CHECK_THROWS_WITH_AS(make_geometry(one, 1), doctest::Contains("'ndim'"), gnsilu::Error);
  const std::vector<int64_t> shape{1, 30, 8};
  CHECK_THROWS_WITH_AS(make_geometry(shape, 4), doctest::Contains("'num_groups'"), gnsilu::Error);
  CHECK_THROWS_WITH_AS(make_geometry(shape, 0), doctest::Contains("'num_groups'"), gnsilu::Error);
  CHECK_THROWS_WITH_AS(make_geometry(shape, -3), doctest::Contains("'num_groups'"), gnsilu::Error);
  const std::vector<int64_t> negative{1, 32, -8};
  CHECK_THROWS_WITH_AS(make_geometry(negative, 32), doctest::Contains("'shape'"), gnsilu::Error);
  const std::vector<int64_t> no_channels{1, 0, 8};
  CHECK_THROWS_WITH_AS(make_geometry(no_channels, 1), doctest::Contains("'shape'"), gnsilu::Error);
  const std::vector<int64_t> huge{1 << 20, 1 << 20, 1 << 20, 1 << 20};
  CHECK_THROWS_WITH_AS(make_geometry(huge, 1), doctest::Contains("too many elements"), gnsilu::Error);
  try {
    make_geometry(one, 1);
  } catch (const gnsilu::Error& e) {
    CHECK(e.status() == gnsilu::Status::InvalidArgument);
  }
}

TEST_CASE("problem validation: null pointers, dtypes, eps") {
  float x[64] = {}, y[64] = {};
  const std::vector<int64_t> shape{1, 4, 16};
  gnsilu::Problem p;
  p.x = x;
  p.x_dtype = DType::FP32;
  p.y = y;
  p.y_dtype = DType::FP32;
  p.shape = shape;
  p.num_groups = 2;
  CHECK_NOTHROW(validate_problem(p));
  auto expect = [&](const char* name) {
    CHECK_THROWS_WITH_AS(validate_problem(p), doctest::Contains((std::string("'") + name + "'").c_str()), gnsilu::Error);
  };
  p.x = nullptr;
  expect("x");
  p.x = x;
  p.y = nullptr;
  expect("y");
  p.y = y;
  p.x_dtype = static_cast<DType>(7);
  expect("x_dtype");
  p.x_dtype = DType::None;
  expect("x_dtype");
  p.x_dtype = DType::BF16;
  p.y_dtype = static_cast<DType>(-1);
  expect("y_dtype");
  p.y_dtype = DType::FP16;
  p.weight = x;
  p.weight_dtype = DType::None;
  expect("weight_dtype");
  p.weight_dtype = DType::BF16;
  p.bias = x;
  p.bias_dtype = static_cast<DType>(9);
  expect("bias_dtype");
  p.bias = nullptr;  // absent: its dtype is ignored
  CHECK_NOTHROW(validate_problem(p));
  p.x_dtype = DType::FP32;
  p.x = reinterpret_cast<const char*>(x) + 2;  // a float pointer off its 4-byte alignment
  expect("x");
  p.x = x;
  p.y = reinterpret_cast<char*>(y) + 1;
  expect("y");
  p.y = y;
  for (double eps : {0.0, -1e-6, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    p.eps = eps;
    expect("eps");
  }
}

TEST_CASE("the path: fused for small tensors and for many groups, split otherwise; forced paths") {
  const gnsilu::LaunchConfig config;
  const std::vector<int64_t> small{1, 512, 32, 32};        // 512 Ki elements, 16-chunk groups
  const std::vector<int64_t> large{1, 128, 1024, 1024};    // 2^20-element groups
  const std::vector<int64_t> many{16, 512, 64, 64};        // 512 groups of 64 chunks
  const std::vector<int64_t> few{1, 512, 64, 64};          // 2 Mi elements in 32 groups: split fills the GPU better
  CHECK(choose_path(make_geometry(small, 32), Path::Auto, 132) == Path::Fused);
  CHECK(choose_path(make_geometry(large, 32), Path::Auto, 132) == Path::Split);
  CHECK(choose_path(make_geometry(many, 32), Path::Auto, 132) == Path::Fused);
  CHECK(choose_path(make_geometry(few, 32), Path::Auto, 132) == Path::Split);
  CHECK(choose_path(make_geometry(small, 32), Path::Split, 132) == Path::Split);
  // The plan keeps the path it is given, decided once by the caller.
  CHECK(make_plan(make_geometry(small, 32), config, Path::Fused, 132).path == Path::Fused);
  CHECK(make_plan(make_geometry(small, 32), config, Path::Split, 132).path == Path::Split);
  // A request the geometry cannot take is refused by check_path, before any device is looked for; a plan asked for
  // an undecided or ineligible path is a bug of the caller (Internal), never a silent choice.
  CHECK_THROWS_WITH_AS(check_path(make_geometry(large, 32), Path::Fused), doctest::Contains("'options.path'"),
                       gnsilu::Error);
  CHECK_NOTHROW(check_path(make_geometry(small, 32), Path::Fused));
  // An input bias: the split path only (the fused kernel has none), chosen and forced.
  Geometry biased = make_geometry(small, 32);
  biased.biased = true;
  CHECK(choose_path(biased, Path::Auto, 132) == Path::Split);
  CHECK_THROWS_WITH_AS(check_path(biased, Path::Fused), doctest::Contains("input bias"), gnsilu::Error);
  for (Path undecided : {Path::Auto, Path::Fused}) {
    try {
      (void)make_plan(make_geometry(large, 32), config, undecided, 132);
      FAIL("a plan for an undecided or ineligible path");
    } catch (const gnsilu::Error& e) {
      CHECK(e.status() == gnsilu::Status::Internal);
    }
  }
  const std::vector<int64_t> wide_group{1, 512, 4, 4};  // 512 channels in one group: beyond the fused limit
  CHECK_FALSE(fused_eligible(make_geometry(wide_group, 1)));
}

TEST_CASE("split plans cover every chunk, group and element with the configured grid") {
  for (const auto& config : gnsilu::candidate_configs()) {
    for (const auto& dims : {std::vector<int64_t>{1, 128, 1024, 1024}, std::vector<int64_t>{2, 64, 17, 19},
                             std::vector<int64_t>{3, 4}, std::vector<int64_t>{1, 32, 300, 300}}) {
      const Geometry g = make_geometry(dims, dims[1] >= 32 ? 32 : 2);
      const Plan plan = make_plan(g, config, Path::Split, 132);
      const gnsilu::kernel::Params& p = plan.params;
      CHECK(plan.threads == static_cast<unsigned>(config.warps * 32));
      CHECK(plan.stats_blocks >= 1);
      CHECK(plan.stats_blocks <= static_cast<unsigned>(config.programs_per_sm * 132));
      CHECK(static_cast<int64_t>(plan.finalize_blocks) == std::min<int64_t>(g.groups_total, int64_t{1} << 20));
      CHECK(plan.finalize_threads == 256);
      CHECK(p.span_length % 8 == 0);
      CHECK(p.spans_per_row * p.span_length >= g.s);
      CHECK((p.spans_per_row - 1) * p.span_length < g.s);
      CHECK(p.tiles_total == g.n * g.c * p.spans_per_row);
      CHECK(plan.apply_blocks >= 1);
      CHECK(plan.rows_offset % 256 == 0);
      CHECK(plan.rows_offset >= static_cast<std::size_t>(g.chunks_total) * 32);
      CHECK(plan.workspace >= plan.rows_offset + static_cast<std::size_t>(g.n * g.c) * 16);
      CHECK(plan.workspace == gnsilu::workspace_size(dims, dims[1] >= 32 ? 32 : 2));
    }
  }
  // Configurations are checked once, where they enter (the API's options, the tuner's prepare): check_config.
  gnsilu::LaunchConfig bad;
  bad.warps = 0;
  CHECK_THROWS_WITH_AS(gnsilu::detail::check_config(bad), doctest::Contains("'config.warps'"), gnsilu::Error);
  bad = {};
  bad.elems_per_load = 12;
  CHECK_THROWS_WITH_AS(gnsilu::detail::check_config(bad), doctest::Contains("'config.elems_per_load'"), gnsilu::Error);
}

TEST_CASE("finalize merges groups of 16384 records and more in parts of 256 by one launch with atomics in calls of at "
          "most 4 groups, forced parts by two launches: every record in one part, the parts in the workspace") {
  using gnsilu::detail::finalize_parts;
  struct Case {
    std::vector<int64_t> dims;
    int64_t groups;
    int64_t parts;
    int64_t chunks;
    bool atomic;            // one launch with atomics (else two launches, where parts > 1)
    int64_t forced_from;    // force_finalize_parts_from (0: the library's rule)
    bool forced_atomic;     // force_finalize_atomic
  };
  const Case cases[] = {
      // The library's rule.
      {{1, 32, 256, 256}, 32, 1, 64, false, 0, false},       // 64 records a group: one block a group
      {{1, 4096, 1024}, 1, 1, 4096, false, 0, false},        // 4096 records: one block (parts do not pay there)
      {{1, 16383, 1024}, 1, 1, 16383, false, 0, false},      // just below the threshold
      {{1, 16384, 1024}, 1, 64, 256, true, 0, false},        // 16384 records: 64 parts of 256
      {{1, 64, 512, 512}, 1, 64, 256, true, 0, false},       // a single group of 2^24 elements: 16384 records
      {{1, 64, 1024, 1024}, 1, 256, 256, true, 0, false},    // 2^26 elements: 65536 records, 256 parts
      {{1, 1, int64_t{1} << 31}, 1, 256, 8192, true, 0, false},  // 2^21 records: still at most 256 parts
      {{1, 4, 4096, 4096}, 4, 64, 256, true, 0, false},      // 4 groups of 16384 records: in parts
      {{1, 5, 4096, 4096}, 5, 1, 16384, false, 0, false},    // 5 groups: one block a group
      {{4, 128, 1024, 1024}, 32, 1, 4096, false, 0, false},  // 4096 records a group, 128 groups: one block a group
      {{1, 16384, 1024}, 1, 64, 256, true, 0, true},         // force_finalize_atomic alone changes nothing
      // Forced parts, by two launches.
      {{1, 2047, 1024}, 1, 1, 2047, false, 2048, false},       // forced from 2048: just below
      {{1, 2048, 1024}, 1, 4, 512, false, 2048, false},        // 2048 records: 4 parts of 512
      {{1, 3, 1000, 1000}, 1, 6, 489, false, 2048, false},     // 3 x 977 = 2931 records: 6 parts, the last of 486
      {{4, 128, 1024, 1024}, 32, 8, 512, false, 2048, false},  // whatever the number of groups
      {{1, 16384, 1024}, 1, 32, 512, false, 16384, false},     // 16384 records: 32 parts of 512
      {{1, 1, int64_t{1} << 31}, 1, 256, 8192, false, 16384, false},  // at most 256 parts
      // Forced parts, by one launch with atomics.
      {{1, 3, 1000, 1000}, 1, 12, 245, true, 2048, true},      // 2931 records: 12 parts, the last of 236
      {{4, 128, 1024, 1024}, 32, 16, 256, true, 2048, true},   // 128 groups of 4096 records
      {{1, 200, 1024}, 1, 1, 200, false, 1, true},             // forced from 1 record, but one part: no atomics
  };
  for (const Case& c : cases) {
    CAPTURE(c.dims[1]);
    CAPTURE(c.forced_from);
    CAPTURE(c.forced_atomic);
    gnsilu::detail::force_finalize_parts_from(c.forced_from);
    gnsilu::detail::force_finalize_atomic(c.forced_atomic);
    const Geometry g = make_geometry(c.dims, c.groups);
    const auto parts = finalize_parts(g);
    CHECK(parts.parts == c.parts);
    CHECK(parts.chunks == c.chunks);
    CHECK(parts.atomic == c.atomic);
    CHECK((parts.parts - 1) * parts.chunks < g.chunks_per_group);  // no part is empty
    CHECK(parts.parts * parts.chunks >= g.chunks_per_group);       // every record in a part
    const Plan plan = make_plan(g, gnsilu::default_config(Path::Split), Path::Split, 132);
    CHECK(plan.params.parts_per_group == parts.parts);
    CHECK(plan.params.part_chunks == parts.chunks);
    CHECK(plan.finalize_atomic == c.atomic);
    CHECK(plan.params.finalize_stage == gnsilu::kernel::kFinalizeWhole);  // launch.cpp sets the stage per launch
    if (parts.parts > 1) {
      CHECK(static_cast<int64_t>(plan.finalize_part_blocks) == g.groups_total * parts.parts);
      CHECK(plan.parts_offset % 256 == 0);
      CHECK(plan.parts_offset >= plan.rows_offset + static_cast<std::size_t>(g.n * g.c) * 16);
    } else {
      CHECK(plan.finalize_part_blocks == 0u);
      CHECK(plan.workspace >= plan.rows_offset + static_cast<std::size_t>(g.n * g.c) * 16);
    }
    if (c.atomic) {
      // An accumulator (32 words) and a 32-bit counter a group, zeroed by chunk_stats, inside the workspace.
      const int64_t words = g.groups_total * 32 + (g.groups_total * 4 + 7) / 8;
      CHECK(plan.params.zero_words == words);
      CHECK(plan.workspace >= plan.parts_offset + static_cast<std::size_t>(words) * 8);
    } else {
      CHECK(plan.params.zero_words == 0);
      if (parts.parts > 1)
        CHECK(plan.workspace >= plan.parts_offset + static_cast<std::size_t>(g.groups_total * parts.parts) * 256);
    }
    CHECK(plan.workspace == gnsilu::workspace_size(c.dims, c.groups));
  }
  gnsilu::detail::force_finalize_atomic(false);
  gnsilu::detail::force_finalize_parts_from(0);
}

TEST_CASE("16-byte vectors need aligned pointers and rows of a multiple of 8 elements") {
  alignas(16) static unsigned char buffer[64];
  const Geometry aligned = make_geometry(std::vector<int64_t>{1, 4, 16}, 2);
  CHECK(vectorizable(aligned, buffer, buffer + 32));
  CHECK_FALSE(vectorizable(aligned, buffer + 2, buffer + 32));
  CHECK_FALSE(vectorizable(aligned, buffer, buffer + 8));
  CHECK_FALSE(vectorizable(make_geometry(std::vector<int64_t>{1, 4, 12}, 2), buffer, buffer + 32));
}

TEST_CASE("chunks never straddle a channel, cover each group once, and are the runs of 1024 where S allows") {
  using namespace gnsilu::math;
  for (int64_t s : {1, 2, 3, 7, 63, 100, 256, 300, 511, 512, 513, 1000, 1023, 1024, 1025, 2048, 3000, 4096, 288000}) {
    for (int64_t cpg : {1, 3, 4, 5, 16, 40}) {
      const int64_t length = cpg * s;
      const int64_t count = chunks_per_group(s, cpg);
      std::vector<int> covered(static_cast<std::size_t>(length), 0);
      bool runs_of_1024 = true;  // chunk j is group elements [1024 j, 1024 j + 1024)
      int64_t next = 0;          // chunks in order tile the group in channel-major order
      for (int64_t j = 0; j < count; ++j) {
        const ChunkPlace c = chunk_place(s, cpg, j);
        REQUIRE(c.channels >= 1);
        REQUIRE(c.pixels >= 1);
        CHECK(c.channels * c.pixels <= kChunk);
        CHECK((c.channels == 1 || c.pixels == s));  // one channel's run, or whole channels
        const int64_t start = c.first_channel * s + c.first_pixel;
        CHECK(start == next);
        next = start + (c.channels == 1 ? c.pixels : c.channels * s);
        if (start != 1024 * j || (c.channels * c.pixels != kChunk && next != length)) runs_of_1024 = false;
        for (int64_t k = 0; k < c.channels; ++k)
          for (int64_t q = 0; q < c.pixels; ++q) ++covered[static_cast<std::size_t>((c.first_channel + k) * s + c.first_pixel + q)];
      }
      CHECK(next == length);
      CHECK(std::all_of(covered.begin(), covered.end(), [](int v) { return v == 1; }));
      // Where S is a multiple of 1024 or divides it (and whole chunks of channels fit the group), the chunks are the
      // runs of 1024 consecutive elements of the group: the results of those shapes are those of earlier versions.
      if (s % 1024 == 0 || (1024 % s == 0 && (s >= 1024 || cpg % (1024 / s) == 0))) {
        CHECK_MESSAGE(runs_of_1024, "S=" << s << " C/G=" << cpg);
      }
    }
  }
  CHECK(chunk_channels(300) == 3);
  CHECK(chunks_per_channel(300) == 1);
  CHECK(chunk_channels(1500) == 1);
  CHECK(chunks_per_channel(1500) == 2);
  const Geometry g = make_geometry(std::vector<int64_t>{1, 256, 5, 180, 320}, 32);
  CHECK(g.chunks_per_row == 282);  // 281 full chunks and one of 256 pixels per channel
  CHECK(g.chunks_per_group == 8 * 282);
  CHECK_FALSE(g.full_chunks());
  CHECK(make_geometry(std::vector<int64_t>{1, 128, 64, 64}, 32).full_chunks());
  CHECK(make_geometry(std::vector<int64_t>{1, 512, 16, 16}, 32).full_chunks());  // 4 channels of 256 per chunk
  CHECK_FALSE(make_geometry(std::vector<int64_t>{1, 96, 16, 16}, 32).full_chunks());  // 3 channels: 768 + ...
}

TEST_CASE("layouts: the geometry's layout, and mixed layouts only where they are the same memory") {
  using gnsilu::Layout;
  CHECK(make_geometry(std::vector<int64_t>{1, 64, 8, 8}, 32, Layout::ChannelsLast).layout == Layout::ChannelsLast);
  CHECK(make_geometry(std::vector<int64_t>{4, 64}, 32, Layout::ChannelsLast).layout == Layout::ChannelsFirst);
  CHECK(make_geometry(std::vector<int64_t>{4, 64, 1, 1}, 32, Layout::ChannelsLast).layout == Layout::ChannelsFirst);
  CHECK(make_geometry(std::vector<int64_t>{4, 1, 9, 9}, 1, Layout::ChannelsLast).layout == Layout::ChannelsFirst);
  float x[64] = {}, y[64] = {};
  const std::vector<int64_t> shape{1, 4, 16};
  gnsilu::Problem p;
  p.x = x;
  p.x_dtype = DType::FP32;
  p.y = y;
  p.y_dtype = DType::FP32;
  p.shape = shape;
  p.num_groups = 2;
  p.x_layout = Layout::ChannelsLast;
  p.y_layout = Layout::ChannelsLast;
  CHECK(validate_problem(p).layout == Layout::ChannelsLast);
  p.y_layout = Layout::ChannelsFirst;
  CHECK_THROWS_WITH_AS(validate_problem(p), doctest::Contains("'y_layout'"), gnsilu::Error);
  p.x_layout = static_cast<Layout>(2);
  CHECK_THROWS_WITH_AS(validate_problem(p), doctest::Contains("'x_layout'"), gnsilu::Error);
  p.x_layout = Layout::ChannelsFirst;
  p.y_layout = static_cast<Layout>(-1);
  CHECK_THROWS_WITH_AS(validate_problem(p), doctest::Contains("'y_layout'"), gnsilu::Error);
  p.y_layout = Layout::ChannelsFirst;
  p.activation = static_cast<gnsilu::Activation>(3);
  CHECK_THROWS_WITH_AS(validate_problem(p), doctest::Contains("'activation'"), gnsilu::Error);
  p.activation = gnsilu::Activation::None;
  CHECK_NOTHROW(validate_problem(p));
  const std::vector<int64_t> flat{2, 4};  // no spatial dimension: the layouts are the same memory
  p.shape = flat;
  p.x_layout = Layout::ChannelsLast;
  CHECK(validate_problem(p).layout == Layout::ChannelsFirst);
}

namespace {

// What apply_channels_last does with a plan: every (sample, pixel, column) visited by exactly one thread.
bool channels_last_apply_covers(const Geometry& g, const Plan& plan) {
  const gnsilu::kernel::Params& p = plan.params;
  if (p.cl_tx < 1 || p.cl_ty < 1 || static_cast<unsigned>(p.cl_tx * p.cl_ty) > plan.threads) return false;
  std::vector<int> seen(static_cast<std::size_t>(g.n * g.s * p.cl_columns), 0);
  for (int64_t item = 0; item < p.cl_apply_items; ++item) {
    const int64_t block = item % p.cl_blocks_per_sample, key = item / p.cl_blocks_per_sample;
    const int64_t sample = key % g.n, slice = key / g.n;
    for (int t = 0; t < p.cl_tx * p.cl_ty; ++t) {
      const int64_t column = slice * p.cl_tx + t % p.cl_tx;
      if (column >= p.cl_columns) continue;
      const int64_t end = std::min<int64_t>((block + 1) * p.cl_block_pixels, g.s);
      for (int64_t pixel = block * p.cl_block_pixels + t / p.cl_tx; pixel < end; pixel += p.cl_ty) {
        ++seen[static_cast<std::size_t>((sample * g.s + pixel) * p.cl_columns + column)];
      }
    }
  }
  return std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; });
}

}  // namespace

TEST_CASE("channels-last plans: statistics tiles or gathered chunks, apply items covering every element once") {
  using gnsilu::Layout;
  const Addresses aligned{0, 0, 2, 2};
  for (const auto& config : gnsilu::candidate_configs()) {
    for (const auto& dims : {std::vector<int64_t>{1, 128, 64, 64}, std::vector<int64_t>{2, 320, 9, 45},
                             std::vector<int64_t>{1, 1280, 32, 33}, std::vector<int64_t>{1, 40, 3, 20, 21},
                             std::vector<int64_t>{3, 20, 7, 9}, std::vector<int64_t>{1, 96, 12, 12}}) {
      const Geometry g = make_geometry(dims, dims[1] % 32 == 0 ? 32 : 4, Layout::ChannelsLast);
      REQUIRE(g.layout == Layout::ChannelsLast);
      const Plan plan = make_plan(g, config, Path::Split, 132, aligned);
      const gnsilu::kernel::Params& p = plan.params;
      CAPTURE(dims[1]);
      CAPTURE(g.s);
      CHECK(plan.stats_blocks >= 1);
      CHECK(plan.stats_blocks <= static_cast<unsigned>(config.programs_per_sm * 132));
      const bool tiles = g.s > 512 && (g.c * 2) % 16 == 0;
      CHECK((p.cl_stats_items > 0) == tiles);
      if (tiles) {
        CHECK(p.cl_slices * p.cl_slice_vectors * 16 == g.c * 2);
        CHECK(p.cl_stats_items == g.n * g.chunks_per_row * p.cl_slices);
        CHECK(plan.stats_shared_bytes == 1024u * static_cast<unsigned>(p.cl_slice_vectors) * 16u);
        CHECK(plan.stats_shared_bytes <= 64u * 1024u);
      }
      CHECK(p.vectorized == (g.c % 8 == 0 ? 1 : 0));
      CHECK(p.cl_columns == (p.vectorized ? g.c / 8 : g.c));
      CHECK(channels_last_apply_covers(g, plan));
      CHECK(plan.apply_blocks >= 1);
      CHECK(plan.workspace == gnsilu::workspace_size(dims, dims[1] % 32 == 0 ? 32 : 4));
    }
  }
  // Tiles need x 16-byte aligned and pixels of whole slices; fp32 slices hold 4 channels a vector.
  const Geometry g = make_geometry(std::vector<int64_t>{1, 64, 40, 40}, 32, Layout::ChannelsLast);
  CHECK(make_plan(g, {}, Path::Split, 132, Addresses{8, 0, 2, 2}).params.cl_stats_items == 0);
  const Plan fp32 = make_plan(g, {}, Path::Split, 132, Addresses{0, 0, 4, 4});
  CHECK(fp32.params.cl_slices * fp32.params.cl_slice_vectors * 16 == 64 * 4);
  // Forced slice widths (tests, gnsilu-bench), and back to the library's choice.
  for (int bytes : {16, 32, 64}) {
    force_tile_slice_bytes(bytes);
    const Plan forced = make_plan(g, {}, Path::Split, 132, aligned);
    CHECK(forced.params.cl_slice_vectors * 16 == bytes);
    CHECK(forced.stats_shared_bytes == 1024u * static_cast<unsigned>(bytes));
  }
  force_tile_slice_bytes(0);
  CHECK(make_plan(g, {}, Path::Split, 132, aligned).params.cl_slice_vectors == 2);
}

TEST_CASE("channels-last fused kernel: vectors of 8, 4 or 1 channels by the group width and the alignment") {
  using gnsilu::Layout;
  const auto width = [](int64_t c, int64_t groups, const Addresses& a) {
    const Geometry g = make_geometry(std::vector<int64_t>{1, c, 16, 16}, groups, Layout::ChannelsLast);
    return make_plan(g, {}, Path::Fused, 132, a).params.cl_fused_width;
  };
  CHECK(width(512, 32, Addresses{0, 0, 2, 2}) == 8);    // 16 channels a group
  CHECK(width(128, 32, Addresses{0, 0, 2, 2}) == 4);    // 4 channels a group
  CHECK(width(128, 32, Addresses{8, 0, 2, 2}) == 4);    // 8-byte vectors of 4 bf16 channels
  CHECK(width(512, 32, Addresses{8, 0, 2, 2}) == 4);    // x only 8-byte aligned: no 16-byte vectors
  CHECK(width(128, 32, Addresses{0, 4, 2, 4}) == 1);    // an fp32 y 4-byte aligned
  CHECK(width(96, 32, Addresses{0, 0, 2, 2}) == 1);     // 3 channels a group
  CHECK(width(320, 32, Addresses{0, 0, 4, 4}) == 1);    // 10 channels a group
  CHECK(width(640, 32, Addresses{0, 0, 4, 2}) == 4);    // 20
}
