// A padded output (Problem::pad): y = F.pad(output, pad, mode, value) on the CPU reference, against the unpadded
// output padded here by an independent loop (F.pad's definition: widths listed last dimension first); the widths'
// checks; the C struct's new fields (an older caller's struct reads no padding); the plan of a padded call.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gnsilu/gnsilu.h"
#include "gnsilu/reference.hpp"
#include "runtime/plan.hpp"
#include "runtime/validate.hpp"
#include "support.hpp"

using namespace testing;
using gnsilu::DType;
using gnsilu::Layout;
using gnsilu::PadMode;

namespace {

int64_t product(const std::vector<int64_t>& v, std::size_t from) {
  int64_t p = 1;
  for (std::size_t i = from; i < v.size(); ++i) p *= v[i];
  return p;
}

// F.pad(t, pad, mode, value) of a (N, C, *spatial) tensor stored in `layout`, written out index by index.
HostTensor pad_independently(const HostTensor& t, const std::vector<int64_t>& shape, const std::vector<int64_t>& pad,
                             PadMode mode, float value, bool channels_last) {
  std::vector<int64_t> out_shape = shape;
  for (std::size_t k = 0; k < pad.size() / 2; ++k) out_shape[shape.size() - 1 - k] += pad[2 * k] + pad[2 * k + 1];
  const int64_t n = shape[0], c = shape[1], s = product(shape, 2), out_s = product(out_shape, 2);
  HostTensor out(t.dtype, static_cast<std::size_t>(n * c * out_s));
  const std::size_t rank = shape.size();
  std::vector<int64_t> index(rank - 2);
  for (int64_t q = 0; q < out_s; ++q) {
    int64_t rest = q;
    for (std::size_t d = rank; d-- > 2;) {
      index[d - 2] = rest % out_shape[d];
      rest /= out_shape[d];
    }
    bool border = false;
    int64_t source = 0;
    for (std::size_t d = 2; d < rank; ++d) {
      const std::size_t k = rank - 1 - d;  // F.pad's pair for dimension d
      int64_t i = index[d - 2] - (k < pad.size() / 2 ? pad[2 * k] : 0);
      if (i < 0 || i >= shape[d]) {
        border = true;
        i = i < 0 ? 0 : shape[d] - 1;
      }
      source = source * shape[d] + i;
    }
    for (int64_t sample = 0; sample < n; ++sample) {
      for (int64_t channel = 0; channel < c; ++channel) {
        const int64_t to = channels_last ? (sample * out_s + q) * c + channel : (sample * c + channel) * out_s + q;
        const int64_t from = channels_last ? (sample * s + source) * c + channel : (sample * c + channel) * s + source;
        const std::size_t size = gnsilu::dtype_size(t.dtype);
        if (border && mode == PadMode::Constant) {
          out.set(static_cast<std::size_t>(to), value);
        } else {
          std::memcpy(out.bytes.data() + to * size, t.bytes.data() + from * size, size);
        }
      }
    }
  }
  return out;
}

struct PadCase {
  std::vector<int64_t> shape;
  int64_t groups;
  std::vector<int64_t> pad;
};

}  // namespace

TEST_CASE("a padded output is F.pad of the unpadded output, bit for bit, in both layouts and modes") {
  const PadCase cases[] = {
      {{1, 8, 3, 6, 10}, 4, {1, 1, 1, 1, 2, 0}},  // the causal conv's (W, W, H, H, T - 1, 0)
      {{2, 6, 5, 7}, 3, {1, 1, 1, 1}},            // 4-D, replicate or zero around H and W
      {{1, 4, 2, 3, 4}, 2, {0, 3, 2, 0, 0, 4}},   // wider than the dimensions (replicate repeats the edge)
      {{1, 4, 9}, 1, {2, 5}},                     // 3-D
      {{1, 4, 2, 2, 3, 5}, 2, {1, 0, 0, 1, 1, 1}},  // 6-D: the leading spatial dimension is not padded
      {{2, 4, 4, 4}, 4, {0, 0}},                  // widths of zero: y is x's shape
      {{1, 16, 1, 1}, 4, {1, 1, 1, 1}},           // one pixel: x's layouts are one memory, y's are not
      {{1, 1, 3, 5}, 1, {2, 1}},                  // one channel
  };
  std::size_t runs = 0;
  for (const auto& c : cases) {
    const int64_t n = c.shape[0], ch = c.shape[1], s = product(c.shape, 2), numel = n * ch * s;
    for (DType xd : {DType::BF16, DType::FP32}) {
      for (DType yd : {DType::BF16, DType::FP16}) {
        for (PadMode mode : {PadMode::Replicate, PadMode::Constant}) {
          for (bool last : {false, true}) {
            const auto activation = runs % 2 == 0 ? gnsilu::Activation::SiLU : gnsilu::Activation::None;
            HostTensor x0 = make_input(xd, static_cast<std::size_t>(numel), static_cast<std::size_t>(ch / c.groups * s),
                                       Data::LargeMean, 31 + runs);
            HostTensor x = last ? relayout(x0, n, ch, s, true) : x0;
            HostTensor w = make_parameter(DType::FP32, static_cast<std::size_t>(ch), 7, 1.0f, 0.5f);
            HostTensor b = make_parameter(DType::FP32, static_cast<std::size_t>(ch), 8, 0.0f, 0.5f);
            HostTensor plain(yd, static_cast<std::size_t>(numel));
            gnsilu::Problem p;
            p.x = x.data();
            p.x_dtype = xd;
            p.y = plain.data();
            p.y_dtype = yd;
            p.shape = c.shape;
            p.num_groups = c.groups;
            p.weight = w.data();
            p.bias = b.data();
            p.activation = activation;
            p.x_layout = p.y_layout = last ? Layout::ChannelsLast : Layout::ChannelsFirst;
            gnsilu::reference_group_norm_silu(p);
            const float value = 0.3f;
            // y's layout: x's, except with one pixel, where x's layouts are one memory and y's the caller's choice
            const bool y_last = last && ch != 1;
            const HostTensor expected = pad_independently(plain, c.shape, c.pad, mode, value, y_last);
            HostTensor padded(yd, expected.size());
            std::memset(padded.data(), 0xEE, padded.bytes.size());
            p.y = padded.data();
            p.pad = c.pad;
            p.pad_mode = mode;
            p.pad_value = value;
            gnsilu::reference_group_norm_silu(p);
            ++runs;
            CHECK_MESSAGE(padded.bytes == expected.bytes,
                          "shape " << c.shape.size() << "-D C=" << ch << " pad " << c.pad.size() << " widths "
                                   << (mode == PadMode::Replicate ? "replicate" : "constant") << " "
                                   << (last ? "channels-last " : "channel-major ") << gnsilu::dtype_name(xd) << "->"
                                   << gnsilu::dtype_name(yd));
          }
        }
      }
    }
  }
  MESSAGE(runs << " padded outputs compared");
}

TEST_CASE("a constant border is the value rounded to y's dtype; the apply of given statistics pads too") {
  const std::vector<int64_t> shape{1, 4, 2, 3};
  HostTensor x = make_input(DType::BF16, 24, 12, Data::Normal, 3);
  HostTensor y(DType::BF16, 4 * 4 * 5);
  gnsilu::Problem p;
  p.x = x.data();
  p.y = y.data();
  p.shape = shape;
  p.num_groups = 2;
  const std::vector<int64_t> pad{1, 1, 1, 1};
  p.pad = pad;
  p.pad_value = 1.0 / 3.0;
  gnsilu::reference_group_norm_silu(p);
  HostTensor third(DType::BF16, 1);
  third.set(0, static_cast<float>(1.0 / 3.0));
  CHECK(y.bits(0) == third.bits(0));
  CHECK(y.bits(4 * 4 * 5 - 1) == third.bits(0));
  // group_norm_apply with the group's own records: the same padded bits.
  std::vector<int64_t> stats(2 * gnsilu::kStatsWords);
  gnsilu::Problem region = p;
  region.pad = {};
  gnsilu::reference_group_stats(region, stats.data());
  HostTensor again(DType::BF16, y.size());
  p.y = again.data();
  gnsilu::reference_group_norm_apply(p, stats.data());
  CHECK(again.bytes == y.bytes);
}

TEST_CASE("padding's arguments are checked, each error naming its field, and y untouched") {
  const std::vector<int64_t> shape{1, 4, 3, 5};
  struct Bad {
    std::vector<int64_t> pad;
    PadMode mode;
    const char* name;
    std::vector<int64_t> shape;
  };
  const Bad cases[] = {
      {{1}, PadMode::Constant, "'pad_count'", shape},
      {{1, 1, 1, 1, 1, 1, 1, 1}, PadMode::Constant, "'pad_count'", shape},
      {{1, 1, 1, 1, 1, 1}, PadMode::Constant, "'pad'", shape},  // 3 dimensions padded, x has 2
      {{1, -1}, PadMode::Replicate, "'pad'", shape},
      {{1, 1}, static_cast<PadMode>(2), "'pad_mode'", shape},
      {{1, 1}, PadMode::Replicate, "'pad'", {1, 4, 3, 0}},  // nothing to replicate
      {{1, 1}, PadMode::Constant, "'pad'", {1, 4, 3, 0}},   // x empty, y a border only
  };
  for (const auto& bad : cases) {
    HostTensor x(DType::FP32, 60), y(DType::FP32, 200);
    std::memset(y.data(), 0x5A, y.bytes.size());
    const auto before = y.bytes;
    gnsilu::Problem p;
    p.x = x.data();
    p.x_dtype = p.y_dtype = DType::FP32;
    p.y = y.data();
    p.shape = bad.shape;
    p.num_groups = 2;
    p.pad = bad.pad;
    p.pad_mode = bad.mode;
    try {
      gnsilu::reference_group_norm_silu(p);
      FAIL("accepted: " << bad.name);
    } catch (const gnsilu::Error& e) {
      CHECK(e.status() == gnsilu::Status::InvalidArgument);
      CHECK_MESSAGE(std::string(e.what()).find(bad.name) != std::string::npos, e.what());
    }
    CHECK(y.bytes == before);
  }
  // The fused path has no padded output: refused before any device is looked for.
  HostTensor x(DType::FP32, 60), y(DType::FP32, 140);
  gnsilu::Problem p;
  p.x = x.data();
  p.x_dtype = p.y_dtype = DType::FP32;
  p.y = y.data();
  p.shape = shape;
  p.num_groups = 2;
  const std::vector<int64_t> pad{1, 1};
  p.pad = pad;
  gnsilu::LaunchOptions options;
  options.path = gnsilu::Path::Fused;
  try {
    gnsilu::group_norm_silu(p, nullptr, {}, options);
    FAIL("a padded call on the fused path was accepted");
  } catch (const gnsilu::Error& e) {
    CHECK(std::string(e.what()).find("'options.path'") != std::string::npos);
  }
}

TEST_CASE("the C struct: pad, pad_count, pad_mode, pad_value; an older caller's smaller struct reads no padding") {
  gnsilu_problem c;
  gnsilu_problem_init(&c);
  CHECK(c.pad == nullptr);
  CHECK(c.pad_count == 0);
  CHECK(c.pad_mode == GNSILU_PAD_CONSTANT);
  CHECK(c.pad_value == 0.0);
  const int64_t shape[] = {1, 4, 3, 5};
  const int64_t pad[] = {1, 1, 2, 0};
  std::vector<float> x(60, 1.0f), y(4 * 5 * 7, 9.0f);
  c.x = x.data();
  c.x_dtype = c.y_dtype = GNSILU_FP32;
  c.y = y.data();
  c.shape = shape;
  c.ndim = 4;
  c.num_groups = 2;
  c.pad = pad;
  c.pad_count = 4;
  c.pad_mode = GNSILU_PAD_REPLICATE;
  REQUIRE_MESSAGE(gnsilu_reference_group_norm(&c, 1) == GNSILU_SUCCESS, gnsilu_last_error());
  for (float v : y) CHECK(v == 0.0f);  // constant groups: silu(0) everywhere, border included
  // pad_count without pad, a negative count: errors naming the field.
  c.pad = nullptr;
  CHECK(gnsilu_reference_group_norm(&c, 1) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(std::strstr(gnsilu_last_error(), "'pad'") != nullptr);
  c.pad = pad;
  c.pad_count = -2;
  CHECK(gnsilu_reference_group_norm(&c, 1) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(std::strstr(gnsilu_last_error(), "'pad_count'") != nullptr);
  // A struct of the first version (up to `activation`): its caller knows no padding, and gets none even where the
  // bytes past its struct hold widths.
  c.pad_count = 4;
  std::vector<float> unpadded(60, 9.0f);
  c.y = unpadded.data();
  c.struct_size = offsetof(gnsilu_problem, pad);
  REQUIRE_MESSAGE(gnsilu_reference_group_norm(&c, 1) == GNSILU_SUCCESS, gnsilu_last_error());
  for (float v : unpadded) CHECK(v == 0.0f);
  // A size that ends inside a field (here pad_count): that field keeps its default (0: no padding), never half of it.
  std::fill(unpadded.begin(), unpadded.end(), 9.0f);
  c.struct_size = offsetof(gnsilu_problem, pad_count) + 2;
  REQUIRE_MESSAGE(gnsilu_reference_group_norm(&c, 1) == GNSILU_SUCCESS, gnsilu_last_error());
  for (float v : unpadded) CHECK(v == 0.0f);
}

TEST_CASE("the plan of a padded call: the split path, apply_padded over y, the widths in the parameters") {
  const std::vector<int64_t> shape{1, 64, 3, 40, 64};
  const std::vector<int64_t> pad{1, 1, 1, 1, 2, 0};
  for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast}) {
    gnsilu::detail::Geometry g = gnsilu::detail::make_geometry(shape, 32, layout);
    CHECK(gnsilu::detail::fused_eligible(g));
    gnsilu::detail::add_padding(g, shape, pad, PadMode::Replicate, 0.0, layout);
    CHECK(g.padded());
    CHECK_FALSE(gnsilu::detail::fused_eligible(g));
    CHECK(g.y_numel == 64 * 5 * 42 * 66);
    CHECK(g.layout == layout);
    CHECK(gnsilu::detail::choose_path(g, gnsilu::Path::Auto, 132) == gnsilu::Path::Split);
    CHECK_THROWS_WITH_AS(gnsilu::detail::check_path(g, gnsilu::Path::Fused), doctest::Contains("'options.path'"),
                         gnsilu::Error);
    const auto plan = gnsilu::detail::make_plan(g, gnsilu::default_config(gnsilu::Path::Auto), gnsilu::Path::Split, 132);
    CHECK(plan.path == gnsilu::Path::Split);
    CHECK(plan.padded_blocks >= 1);
    // A block per tile of whole lines (channel-major: 64 x 5 x 42 lines of 66 elements, 8192 / 66 = 124 lines a
    // tile of 16-bit y) or a warp per line and slice of 256 channels (channels-last: 5 x 42 lines), 256 threads a
    // block, at most 8 blocks per multiprocessor.
    CHECK(plan.padded_blocks == (layout == Layout::ChannelsFirst ? (64 * 5 * 42 + 123) / 124 : (5 * 42 + 7) / 8));
    CHECK(plan.params.pad.out_s == 5 * 42 * 66);
    CHECK(plan.params.pad.before[0] == 2);
    CHECK(plan.params.pad.after[0] == 0);
    CHECK(plan.params.pad.before[2] == 1);
    CHECK(g.layout == layout);  // the kernels' layout: apply_padded<..., LAYOUT, ...> writes y in it
    CHECK(plan.workspace == gnsilu::detail::workspace_bytes(g));
  }
}

TEST_CASE("the C struct: input_bias is read (since 0.3); an older caller's smaller struct reads none; checks name it") {
  gnsilu_problem c;
  gnsilu_problem_init(&c);
  CHECK(c.input_bias == nullptr);
  const int64_t shape[] = {1, 4, 3, 5};
  std::vector<float> x(60, 1.0f), y(60, 9.0f);
  const float input_bias[] = {0.0f, 2.0f, 5.0f, 5.0f};  // group 0: 1 and 3 (mean 2, spread 1); group 1: 6 everywhere
  c.x = x.data();
  c.x_dtype = c.y_dtype = GNSILU_FP32;
  c.y = y.data();
  c.shape = shape;
  c.ndim = 4;
  c.num_groups = 2;
  c.input_bias = input_bias;
  REQUIRE_MESSAGE(gnsilu_reference_group_norm(&c, 1) == GNSILU_SUCCESS, gnsilu_last_error());
  for (int i = 0; i < 15; ++i) CHECK(y[i] == doctest::Approx(-0.2689414).epsilon(1e-5));  // silu(-1)
  for (int i = 15; i < 30; ++i) CHECK(y[i] == doctest::Approx(0.7310586).epsilon(1e-5));  // silu(1)
  for (int i = 30; i < 60; ++i) CHECK(y[i] == 0.0f);
  // A struct that ends before input_bias (0.2's): no bias, whatever lies past it.
  c.struct_size = offsetof(gnsilu_problem, input_bias);
  REQUIRE_MESSAGE(gnsilu_reference_group_norm(&c, 1) == GNSILU_SUCCESS, gnsilu_last_error());
  for (float v : y) CHECK(v == 0.0f);  // constant groups
  // Misaligned for x's dtype: refused, naming it, y untouched.
  c.struct_size = sizeof c;
  std::fill(y.begin(), y.end(), 9.0f);
  c.input_bias = reinterpret_cast<const unsigned char*>(input_bias) + 2;
  CHECK(gnsilu_reference_group_norm(&c, 1) == GNSILU_ERROR_INVALID_ARGUMENT);
  CHECK(std::strstr(gnsilu_last_error(), "'input_bias'") != nullptr);
  for (float v : y) CHECK(v == 9.0f);
}
