// Statistics of regions, merged, then applied (issue 24, item 2), on the CPU reference: for random partitions of a
// tensor's spatial box into sub-boxes, each copied out as a tensor of its own, the records of the regions added
// together and applied to the whole tensor give group_norm_silu's bits, and applied to each region give that
// region's part of the whole output. Any order and grouping of the additions gives the same records.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <vector>

#include "support.hpp"

using namespace testing;
using gnsilu::DType;

namespace {

constexpr int kWords = gnsilu::kStatsWords;

// A box of the spatial domain: [lo[d], hi[d]) along each of up to 3 spatial dimensions.
struct Box {
  std::array<int64_t, 3> lo{}, hi{};
  int64_t volume(int dims) const {
    int64_t v = 1;
    for (int d = 0; d < dims; ++d) v *= hi[d] - lo[d];
    return v;
  }
};

// Random guillotine cuts of `box` into at most `pieces` boxes (some may be empty when a cut lands on an edge).
void cut(const Box& box, int dims, int pieces, std::mt19937_64& random, std::vector<Box>& out) {
  const int d = static_cast<int>(random() % dims);
  const int64_t extent = box.hi[d] - box.lo[d];
  if (pieces <= 1 || extent < 1) {
    out.push_back(box);
    return;
  }
  const int64_t at = box.lo[d] + static_cast<int64_t>(random() % (extent + 1));  // may be an edge: an empty box
  Box a = box, b = box;
  a.hi[d] = at;
  b.lo[d] = at;
  const int left = 1 + static_cast<int>(random() % (pieces - 1));
  cut(a, dims, left, random, out);
  cut(b, dims, pieces - left, random, out);
}

struct Tensor {
  int64_t n, c;
  std::vector<int64_t> spatial;  // 1 to 3 sizes
  bool channels_last;
  HostTensor data;
  std::vector<int64_t> shape() const {
    std::vector<int64_t> s{n, c};
    s.insert(s.end(), spatial.begin(), spatial.end());
    return s;
  }
  int64_t pixels() const {
    int64_t p = 1;
    for (auto v : spatial) p *= v;
    return p;
  }
  int64_t pixel_of(const std::array<int64_t, 3>& at) const {  // row-major over the spatial sizes
    int64_t p = 0;
    for (std::size_t d = 0; d < spatial.size(); ++d) p = p * spatial[d] + at[d];
    return p;
  }
  std::size_t index(int64_t sample, int64_t channel, int64_t pixel) const {
    const int64_t s = pixels();
    return static_cast<std::size_t>(channels_last ? (sample * s + pixel) * c + channel : (sample * c + channel) * s + pixel);
  }
};

// The region `box` of t as a tensor of its own (same n, c and layout).
Tensor region_of(const Tensor& t, const Box& box) {
  const int dims = static_cast<int>(t.spatial.size());
  Tensor r{t.n, t.c, {}, t.channels_last, {}};
  for (int d = 0; d < dims; ++d) r.spatial.push_back(box.hi[d] - box.lo[d]);
  r.data = HostTensor(t.data.dtype, static_cast<std::size_t>(t.n * t.c * box.volume(dims)));
  const std::size_t size = gnsilu::dtype_size(t.data.dtype);
  std::array<int64_t, 3> at{};
  for (int64_t q = 0; q < r.pixels(); ++q) {
    int64_t rest = q;
    for (int d = dims - 1; d >= 0; --d) {
      at[d] = box.lo[d] + rest % r.spatial[d];
      rest /= r.spatial[d];
    }
    const int64_t source_pixel = t.pixel_of(at);
    for (int64_t sample = 0; sample < t.n; ++sample) {
      for (int64_t channel = 0; channel < t.c; ++channel) {
        std::memcpy(r.data.bytes.data() + r.index(sample, channel, q) * size,
                    t.data.bytes.data() + t.index(sample, channel, source_pixel) * size, size);
      }
    }
  }
  return r;
}

gnsilu::Problem problem_of(const Tensor& x, void* y, DType yd, int64_t groups, const std::vector<int64_t>& shape,
                           const HostTensor* w, const HostTensor* b) {
  gnsilu::Problem p;
  p.x = x.data.data();
  p.x_dtype = x.data.dtype;
  p.y = y;
  p.y_dtype = yd;
  p.shape = shape;
  p.num_groups = groups;
  p.weight = w != nullptr ? w->data() : nullptr;
  p.weight_dtype = DType::BF16;
  p.bias = b != nullptr ? b->data() : nullptr;
  p.bias_dtype = DType::BF16;
  p.eps = 1e-6;
  p.x_layout = p.y_layout = x.channels_last ? gnsilu::Layout::ChannelsLast : gnsilu::Layout::ChannelsFirst;
  return p;
}

std::vector<int64_t> stats_of(const Tensor& t, int64_t groups) {
  const auto shape = t.shape();
  std::vector<int64_t> s(static_cast<std::size_t>(t.n * groups * kWords));
  gnsilu::reference_group_stats(problem_of(t, nullptr, t.data.dtype, groups, shape, nullptr, nullptr), s.data(), 1);
  return s;
}

}  // namespace

TEST_CASE("regions: apply(x, sum of stats(region)) is group_norm_silu(x), and each region's part of it") {
  std::mt19937_64 random(29);
  const struct {
    std::vector<int64_t> spatial;
    int64_t n, c, groups;
  } cases[] = {
      {{16, 24}, 2, 8, 4}, {{5, 33, 17}, 1, 12, 3}, {{1030}, 1, 4, 2}, {{3, 9, 40}, 2, 6, 6}, {{7, 7}, 1, 32, 8},
  };
  int partitions = 0, regions_total = 0, empty = 0;
  for (const auto& k : cases) {
    for (DType xd : {DType::BF16, DType::FP16, DType::FP32}) {
      for (bool last : {false, true}) {
        for (Data data : {Data::Normal, Data::LargeMean, Data::WideRange, Data::WithNaN}) {
          Tensor x{k.n, k.c, k.spatial, last, {}};
          const int64_t numel = k.n * k.c * x.pixels();
          x.data = make_input(xd, static_cast<std::size_t>(numel), static_cast<std::size_t>(k.c / k.groups * x.pixels()),
                              data, 100 + partitions);
          HostTensor w = make_parameter(DType::BF16, static_cast<std::size_t>(k.c), 3, 1.0f, 0.5f);
          HostTensor b = make_parameter(DType::BF16, static_cast<std::size_t>(k.c), 4, 0.0f, 0.5f);
          const auto shape = x.shape();
          HostTensor whole(DType::BF16, static_cast<std::size_t>(numel));
          gnsilu::reference_group_norm_silu(problem_of(x, whole.data(), DType::BF16, k.groups, shape, &w, &b), 1);
          // The tensor's own statistics, through stats and apply.
          const std::vector<int64_t> own = stats_of(x, k.groups);
          HostTensor y(DType::BF16, static_cast<std::size_t>(numel));
          gnsilu::reference_group_norm_apply(problem_of(x, y.data(), DType::BF16, k.groups, shape, &w, &b), own.data(), 1);
          REQUIRE(y.bytes == whole.bytes);
          // A random partition into regions; their records added in a random order.
          const int dims = static_cast<int>(k.spatial.size());
          Box box;
          for (int d = 0; d < dims; ++d) box.hi[d] = k.spatial[d];
          std::vector<Box> boxes;
          cut(box, dims, 1 + static_cast<int>(random() % 7), random, boxes);
          std::shuffle(boxes.begin(), boxes.end(), random);
          std::vector<int64_t> merged(own.size(), 0);
          std::vector<Tensor> parts;
          for (const Box& piece : boxes) {
            parts.push_back(region_of(x, piece));
            empty += piece.volume(dims) == 0;
            const std::vector<int64_t> s = stats_of(parts.back(), k.groups);
            for (std::size_t i = 0; i < s.size(); ++i) merged[i] += s[i];
          }
          ++partitions;
          regions_total += static_cast<int>(boxes.size());
          HostTensor from_regions(DType::BF16, static_cast<std::size_t>(numel));
          gnsilu::reference_group_norm_apply(
              problem_of(x, from_regions.data(), DType::BF16, k.groups, shape, &w, &b), merged.data(), 1);
          CHECK_MESSAGE(from_regions.bytes == whole.bytes,
                        gnsilu::dtype_name(xd) << (last ? " nhwc " : " nchw ") << data_name(data) << ", "
                                               << boxes.size() << " regions");
          // Each region normalized with the merged statistics is its part of the whole output.
          const Tensor whole_y{k.n, k.c, k.spatial, last, whole};
          for (std::size_t r = 0; r < boxes.size(); ++r) {
            if (boxes[r].volume(dims) == 0) continue;
            const auto part_shape = parts[r].shape();
            HostTensor part_y(DType::BF16, parts[r].data.size());
            gnsilu::reference_group_norm_apply(
                problem_of(parts[r], part_y.data(), DType::BF16, k.groups, part_shape, &w, &b), merged.data(), 1);
            CHECK(part_y.bytes == region_of(whole_y, boxes[r]).data.bytes);
          }
        }
      }
    }
  }
  MESSAGE(partitions << " partitions into " << regions_total << " regions (" << empty << " empty)");
  CHECK(empty > 0);
}

TEST_CASE("regions: records merge to the same words in any order and grouping; frames are regions") {
  std::mt19937_64 random(31);
  Tensor x{2, 8, {6, 10, 12}, false, {}};
  x.data = make_input(DType::BF16, static_cast<std::size_t>(2 * 8 * x.pixels()), 0, Data::WideRange, 5);
  std::vector<std::vector<int64_t>> records;
  for (int64_t t = 0; t < 6; ++t) {  // one frame at a time
    Box frame;
    frame.lo = {t, 0, 0};
    frame.hi = {t + 1, 10, 12};
    const Tensor f = region_of(x, frame);
    records.push_back(stats_of(f, 4));
    // A frame's own statistics applied to it: the frame normalized as a tensor of its own (per-frame GroupNorm).
    const auto shape = f.shape();
    HostTensor a(DType::FP32, f.data.size()), b(DType::FP32, f.data.size());
    gnsilu::reference_group_norm_apply(problem_of(f, a.data(), DType::FP32, 4, shape, nullptr, nullptr),
                                       records.back().data(), 1);
    gnsilu::reference_group_norm_silu(problem_of(f, b.data(), DType::FP32, 4, shape, nullptr, nullptr), 1);
    CHECK(a.bytes == b.bytes);
  }
  const std::vector<int64_t> whole = stats_of(x, 4);
  for (int trial = 0; trial < 20; ++trial) {
    // Random pairwise merges (a random tree) in a random order.
    std::vector<std::vector<int64_t>> pool = records;
    while (pool.size() > 1) {
      const std::size_t i = random() % pool.size();
      std::size_t j = random() % (pool.size() - 1);
      if (j >= i) ++j;
      for (std::size_t k = 0; k < pool[i].size(); ++k) pool[i][k] += pool[j][k];
      pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(j));
    }
    // Records written by stats are normalized; a sum of them is not, but its value (and so its statistics) is
    // the whole tensor's: compare through apply.
    const auto shape = x.shape();
    HostTensor from_frames(DType::BF16, x.data.size()), direct(DType::BF16, x.data.size());
    gnsilu::reference_group_norm_apply(problem_of(x, from_frames.data(), DType::BF16, 4, shape, nullptr, nullptr),
                                       pool[0].data(), 1);
    gnsilu::reference_group_norm_apply(problem_of(x, direct.data(), DType::BF16, 4, shape, nullptr, nullptr),
                                       whole.data(), 1);
    CHECK(from_frames.bytes == direct.bytes);
    // Element counts and the NaN counts add exactly.
    for (int64_t g = 0; g < 2 * 4; ++g) CHECK(pool[0][static_cast<std::size_t>(g * kWords)] == whole[static_cast<std::size_t>(g * kWords)]);
  }
}

TEST_CASE("regions: argument errors name the argument") {
  std::vector<int64_t> shape{1, 8, 4, 4};
  HostTensor x(DType::BF16, 128), y(DType::BF16, 128);
  std::vector<int64_t> empty_shape{1, 8, 0, 4};
  std::vector<int64_t> stats(4 * kWords);
  gnsilu::Problem p;
  p.x = x.data();
  p.y = y.data();
  p.shape = shape;
  p.num_groups = 4;
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const gnsilu::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message([&] { gnsilu::reference_group_stats(p, nullptr); }).find("'stats'") != std::string::npos);
  CHECK(message([&] { gnsilu::reference_group_norm_apply(p, nullptr); }).find("'stats'") != std::string::npos);
  gnsilu::Problem bad = p;
  bad.num_groups = 3;
  CHECK(message([&] { gnsilu::reference_group_stats(bad, stats.data()); }).find("'num_groups'") != std::string::npos);
  bad = p;
  bad.x = nullptr;
  CHECK(message([&] { gnsilu::reference_group_stats(bad, stats.data()); }).find("'x'") != std::string::npos);
  // group_stats reads neither y nor eps: a null y and a zero eps are fine.
  gnsilu::Problem only_x = p;
  only_x.y = nullptr;
  only_x.eps = 0.0;
  CHECK(message([&] { gnsilu::reference_group_stats(only_x, stats.data()); }) == "no error");
  // An empty region may have a null x, and has records of zeros (a count of 0).
  gnsilu::Problem empty = p;
  empty.x = nullptr;
  empty.shape = empty_shape;
  stats.assign(stats.size(), 7);
  CHECK(message([&] { gnsilu::reference_group_stats(empty, stats.data()); }) == "no error");
  CHECK(std::all_of(stats.begin(), stats.end(), [](int64_t v) { return v == 0; }));
  // The GPU entry points check the same before they look for a device.
  CHECK(message([&] { gnsilu::group_stats(p, nullptr); }).find("'stats'") != std::string::npos);
  CHECK(message([&] { gnsilu::group_norm_apply(p, nullptr); }).find("'stats'") != std::string::npos);
}
