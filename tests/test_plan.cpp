// Geometry, argument validation, path choice, grid sizes and workspace layout: the host logic between an
// API call and its launches.
#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "gnsilu/gnsilu.hpp"
#include "plan.hpp"
#include "validate.hpp"

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
  CHECK(make_plan(make_geometry(small, 32), config, Path::Auto, 132).path == Path::Fused);
  CHECK(make_plan(make_geometry(large, 32), config, Path::Auto, 132).path == Path::Split);
  CHECK(make_plan(make_geometry(many, 32), config, Path::Auto, 132).path == Path::Fused);
  CHECK(make_plan(make_geometry(few, 32), config, Path::Auto, 132).path == Path::Split);
  CHECK(make_plan(make_geometry(small, 32), config, Path::Split, 132).path == Path::Split);
  CHECK_THROWS_WITH_AS(make_plan(make_geometry(large, 32), config, Path::Fused, 132), doctest::Contains("'options.path'"),
                       gnsilu::Error);
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
  gnsilu::LaunchConfig bad;
  bad.warps = 0;
  CHECK_THROWS_WITH_AS(make_plan(make_geometry(std::vector<int64_t>{1, 4}, 2), bad, Path::Auto, 132),
                       doctest::Contains("'config.warps'"), gnsilu::Error);
  bad = {};
  bad.elems_per_load = 12;
  CHECK_THROWS_WITH_AS(make_plan(make_geometry(std::vector<int64_t>{1, 4}, 2), bad, Path::Auto, 132),
                       doctest::Contains("'config.elems_per_load'"), gnsilu::Error);
}

TEST_CASE("16-byte vectors need aligned pointers and rows of a multiple of 8 elements") {
  alignas(16) static unsigned char buffer[64];
  const Geometry aligned = make_geometry(std::vector<int64_t>{1, 4, 16}, 2);
  CHECK(vectorizable(aligned, buffer, buffer + 32));
  CHECK_FALSE(vectorizable(aligned, buffer + 2, buffer + 32));
  CHECK_FALSE(vectorizable(aligned, buffer, buffer + 8));
  CHECK_FALSE(vectorizable(make_geometry(std::vector<int64_t>{1, 4, 12}, 2), buffer, buffer + 32));
}
