// The CPU reference (the kernels' arithmetic and tree, on the host) against an independent long double
// computation: the fraction of outputs equal to the correctly rounded exact result, and the largest error
// in ulps, on random and adversarial inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "support.hpp"

using namespace testing;
using gnsilu::DType;

namespace {

struct Case {
  std::vector<int64_t> shape;
  int64_t groups;
};

struct Result {
  Accuracy accuracy;
  HostTensor y;
};

Result run_case(const Case& c, DType xd, DType yd, Data data, uint64_t seed, bool affine = true,
                DType pd = DType::FP32, double eps = 1e-6,
                gnsilu::Activation activation = gnsilu::Activation::SiLU) {
  int64_t numel = 1;
  for (auto d : c.shape) numel *= d;
  const int64_t n = c.shape[0], ch = c.shape[1], s = numel / (n * ch);
  const auto group_length = static_cast<std::size_t>(ch / c.groups * s);
  HostTensor x = make_input(xd, static_cast<std::size_t>(numel), group_length, data, seed);
  HostTensor w = make_parameter(pd, static_cast<std::size_t>(ch), seed + 1, 1.0f, 0.5f);
  HostTensor b = make_parameter(pd, static_cast<std::size_t>(ch), seed + 2, 0.0f, 0.5f);
  Result r{{}, HostTensor(yd, static_cast<std::size_t>(numel))};
  gnsilu::Problem p;
  p.x = x.data();
  p.x_dtype = xd;
  p.y = r.y.data();
  p.y_dtype = yd;
  p.shape = c.shape;
  p.num_groups = c.groups;
  p.weight = affine ? w.data() : nullptr;
  p.weight_dtype = pd;
  p.bias = affine ? b.data() : nullptr;
  p.bias_dtype = pd;
  p.eps = eps;
  p.activation = activation;
  gnsilu::reference_group_norm_silu(p);
  const auto exact = exact_reference(x, n, ch, s, c.groups, affine ? &w : nullptr, affine ? &b : nullptr, eps,
                                     activation == gnsilu::Activation::SiLU);
  r.accuracy = measure(r.y, exact);
  return r;
}

std::string label(DType xd, DType yd, Data d) {
  return std::string(gnsilu::dtype_name(xd)) + "->" + gnsilu::dtype_name(yd) + " " + data_name(d);
}

}  // namespace

TEST_CASE("16-bit outputs are correctly rounded almost everywhere, including a large mean against a small spread") {
  const Case shape{{2, 64, 24, 24}, 32};
  for (DType xd : {DType::BF16, DType::FP16, DType::FP32}) {
    for (DType yd : {DType::BF16, DType::FP16}) {
      for (Data d : {Data::Normal, Data::LargeMean, Data::TinySpread}) {
        const Result r = run_case(shape, xd, yd, d, 1234);
        MESSAGE(label(xd, yd, d) << ": correctly rounded " << 100.0 * r.accuracy.fraction() << "%, max error "
                                 << r.accuracy.max_ulps << " ulp");
        CHECK(r.accuracy.nan_mismatches == 0);
        CHECK(r.accuracy.fraction() >= 0.999);
        CHECK(r.accuracy.max_ulps < 1.0);
      }
    }
  }
}

// FP32 outputs: the statistics are exact to about 2^-28 of the spread, so where the pre-activation crosses zero
// the relative error of tiny outputs grows; away from the crossings the error stays within a few ulps.
TEST_CASE("FP32 outputs stay within a few ulps away from zero crossings") {
  const Case shape{{1, 32, 40, 40}, 8};
  for (DType xd : {DType::BF16, DType::FP16, DType::FP32}) {
    for (Data d : {Data::Normal, Data::LargeMean}) {
      const Result r = run_case(shape, xd, DType::FP32, d, 99);
      MESSAGE(label(xd, DType::FP32, d) << ": correctly rounded " << 100.0 * r.accuracy.fraction() << "%, max error "
                                        << r.accuracy.max_ulps_large << " ulp where |y| >= 2^-6, "
                                        << r.accuracy.max_ulps << " ulp anywhere");
      CHECK(r.accuracy.nan_mismatches == 0);
      CHECK(r.accuracy.fraction() >= 0.4);
      CHECK(r.accuracy.max_ulps_large < 16.0);
    }
  }
}

TEST_CASE("subnormal, huge and constant inputs") {
  const Case shape{{1, 16, 33, 31}, 4};
  for (DType xd : {DType::BF16, DType::FP16, DType::FP32}) {
    for (Data d : {Data::Subnormal, Data::Huge, Data::Constant, Data::WideRange}) {
      const Result r = run_case(shape, xd, DType::BF16, d, 5);
      MESSAGE(label(xd, DType::BF16, d) << ": correctly rounded " << 100.0 * r.accuracy.fraction() << "%, max error "
                                        << r.accuracy.max_ulps << " ulp");
      CHECK(r.accuracy.nan_mismatches == 0);
      CHECK(r.accuracy.fraction() >= 0.999);
      CHECK(r.accuracy.max_ulps < 1.0);
    }
  }
}

TEST_CASE("NaN or Inf in a group makes that group NaN and leaves the others alone") {
  const Case shape{{2, 8, 16, 16}, 4};
  for (DType xd : {DType::BF16, DType::FP16, DType::FP32}) {
    for (Data d : {Data::WithNaN, Data::WithInf}) {
      const Result r = run_case(shape, xd, DType::FP16, d, 77);
      const std::size_t group_length = 2 * 16 * 16;
      for (std::size_t i = 0; i < r.y.size(); ++i) {
        const bool in_first = i < group_length;
        if (in_first) CHECK(r.y.bits(i) == 0x7FFFu);  // canonical NaN
        else CHECK_FALSE(std::isnan(r.y.get(i)));
      }
      CHECK(r.accuracy.nan_mismatches == 0);
    }
  }
}

TEST_CASE("huge groups, N > 1, 5-D, no affine, other parameter dtypes") {
  SUBCASE("one group of 2^20 elements") {
    const Result r = run_case({{1, 64, 128, 128}, 1}, DType::BF16, DType::BF16, Data::LargeMean, 3);
    MESSAGE("G=1, 2^20 elements: " << 100.0 * r.accuracy.fraction() << "%, max " << r.accuracy.max_ulps << " ulp");
    CHECK(r.accuracy.fraction() >= 0.999);
    CHECK(r.accuracy.max_ulps < 1.0);
  }
  SUBCASE("5-D video activation, N = 2") {
    const Result r = run_case({{2, 32, 3, 10, 12}, 8}, DType::FP16, DType::FP16, Data::Normal, 4, true, DType::BF16);
    CHECK(r.accuracy.fraction() >= 0.999);
    CHECK(r.accuracy.max_ulps < 1.0);
  }
  SUBCASE("no spatial dimension, no affine") {
    const Result r = run_case({{5, 12}, 3}, DType::FP32, DType::BF16, Data::Normal, 6, false);
    CHECK(r.accuracy.fraction() >= 0.99);
    CHECK(r.accuracy.max_ulps < 1.0);
  }
  SUBCASE("fp16 parameters, eps 1e-5") {
    const Result r = run_case({{3, 24, 7, 9}, 6}, DType::BF16, DType::FP16, Data::TinySpread, 8, true, DType::FP16, 1e-5);
    CHECK(r.accuracy.fraction() >= 0.999);
    CHECK(r.accuracy.max_ulps < 1.0);
  }
}

TEST_CASE("the result does not depend on the number of threads") {
  const std::vector<int64_t> shape{3, 16, 45, 47};
  HostTensor x = make_input(DType::BF16, 3 * 16 * 45 * 47, 4 * 45 * 47, Data::Normal, 11);
  HostTensor y1(DType::BF16, x.size()), y2(DType::BF16, x.size());
  gnsilu::Problem p;
  p.x = x.data();
  p.shape = shape;
  p.num_groups = 4;
  p.y = y1.data();
  gnsilu::reference_group_norm_silu(p, 1);
  p.y = y2.data();
  gnsilu::reference_group_norm_silu(p, 7);
  CHECK(y1.bytes == y2.bytes);
}

TEST_CASE("the reference checks its arguments like the GPU entry point") {
  float x[8] = {}, y[8] = {};
  const int64_t shape[] = {1, 8};
  gnsilu::Problem p;
  p.x = x;
  p.x_dtype = DType::FP32;
  p.y = y;
  p.y_dtype = DType::FP32;
  p.shape = shape;
  p.num_groups = 3;
  CHECK_THROWS_WITH_AS(gnsilu::reference_group_norm_silu(p), doctest::Contains("'num_groups'"), gnsilu::Error);
  p.num_groups = 2;
  p.eps = 0;
  CHECK_THROWS_WITH_AS(gnsilu::reference_group_norm_silu(p), doctest::Contains("'eps'"), gnsilu::Error);
}

TEST_CASE("plain GroupNorm (no activation): correctly rounded, large means and tiny spreads included") {
  const Case shape{{2, 64, 24, 24}, 32};
  for (DType xd : {DType::BF16, DType::FP16, DType::FP32}) {
    for (DType yd : {DType::BF16, DType::FP16}) {
      for (Data d : {Data::Normal, Data::LargeMean, Data::TinySpread}) {
        const Result r = run_case(shape, xd, yd, d, 4321, true, DType::FP32, 1e-6, gnsilu::Activation::None);
        MESSAGE(label(xd, yd, d) << ", no activation: correctly rounded " << 100.0 * r.accuracy.fraction()
                                 << "%, max error " << r.accuracy.max_ulps << " ulp");
        CHECK(r.accuracy.nan_mismatches == 0);
        CHECK(r.accuracy.fraction() >= 0.999);
        CHECK(r.accuracy.max_ulps < 1.0);
      }
    }
  }
  // NaN in a group: that group NaN, the others finite.
  const Result r = run_case({{2, 8, 16, 16}, 4}, DType::BF16, DType::BF16, Data::WithNaN, 3, true, DType::FP32, 1e-6,
                            gnsilu::Activation::None);
  for (std::size_t i = 0; i < r.y.size(); ++i) {
    if (i < 2 * 16 * 16) CHECK(r.y.bits(i) == 0x7FFFu);
    else CHECK_FALSE(std::isnan(r.y.get(i)));
  }
}

TEST_CASE("channels-last gives, bit for bit, the channel-major output on the same logical tensor") {
  // Shapes whose chunks are runs of 1024 pixels, runs with a shorter last one (S not a multiple of 1024),
  // several whole channels (S <= 512), one element, 5-D, N > 1, C not a multiple of 8.
  const Case cases[] = {
      {{1, 64, 32, 32}, 32},    {{2, 40, 33, 35}, 8},   {{1, 96, 12, 12}, 32}, {{3, 20, 7, 9}, 5},
      {{1, 48, 3, 17, 21}, 16}, {{2, 16, 1, 1}, 4},     {{1, 8, 1000}, 2},     {{2, 24, 513}, 3},
      {{1, 32, 2049}, 1},       {{1, 12, 5, 180, 4}, 4},
  };
  std::size_t runs = 0;
  for (const auto& c : cases) {
    int64_t numel = 1;
    for (auto d : c.shape) numel *= d;
    const int64_t n = c.shape[0], ch = c.shape[1], s = numel / (n * ch);
    for (DType xd : {DType::BF16, DType::FP16, DType::FP32}) {
      for (DType yd : {DType::BF16, DType::FP32}) {
        for (auto activation : {gnsilu::Activation::SiLU, gnsilu::Activation::None}) {
          HostTensor x = make_input(xd, static_cast<std::size_t>(numel), static_cast<std::size_t>(ch / c.groups * s),
                                    Data::LargeMean, 17 + runs);
          HostTensor w = make_parameter(DType::BF16, static_cast<std::size_t>(ch), 5, 1.0f, 0.5f);
          HostTensor b = make_parameter(DType::BF16, static_cast<std::size_t>(ch), 6, 0.0f, 0.5f);
          HostTensor first(yd, x.size()), last(yd, x.size());
          HostTensor x_last = relayout(x, n, ch, s, true);
          gnsilu::Problem p;
          p.x = x.data();
          p.x_dtype = xd;
          p.y = first.data();
          p.y_dtype = yd;
          p.shape = c.shape;
          p.num_groups = c.groups;
          p.weight = w.data();
          p.weight_dtype = DType::BF16;
          p.bias = b.data();
          p.bias_dtype = DType::BF16;
          p.activation = activation;
          gnsilu::reference_group_norm_silu(p);
          p.x = x_last.data();
          p.y = last.data();
          p.x_layout = gnsilu::Layout::ChannelsLast;
          p.y_layout = gnsilu::Layout::ChannelsLast;
          gnsilu::reference_group_norm_silu(p);
          ++runs;
          CHECK_MESSAGE(relayout(last, n, ch, s, false).bytes == first.bytes,
                        "shape " << c.shape[0] << "x" << c.shape[1] << " S=" << s << " G=" << c.groups << " "
                                 << std::string(gnsilu::dtype_name(xd)) << "->" << std::string(gnsilu::dtype_name(yd))
                                 << " " << std::string(gnsilu::activation_name(activation)));
        }
      }
    }
  }
  MESSAGE(runs << " pairs of calls compared");
}

TEST_CASE("an input bias: the output, padded outputs and region statistics are those of x + b rounded to x's dtype") {
  // x + b computed on the host by plus_bias (the exact sum rounded once), then normalized without a bias, against
  // the reference given x and input_bias b: bit for bit, in both layouts, on shapes with runs of 1024, whole
  // channels per chunk and short last runs; biases small and large against x's spread (the sum's rounding then
  // shows); x with NaN and Inf.
  const Case cases[] = {{{2, 64, 17, 19}, 32}, {{1, 32, 2049}, 4}, {{3, 20, 7, 9}, 5}, {{1, 48, 3, 17, 21}, 16}};
  const Data datas[] = {Data::Normal, Data::TinySpread, Data::WideRange, Data::WithInf, Data::WithNaN};
  std::size_t runs = 0;
  for (const auto& c : cases) {
    int64_t numel = 1;
    for (auto d : c.shape) numel *= d;
    const int64_t n = c.shape[0], ch = c.shape[1], s = numel / (n * ch);
    for (DType xd : {DType::BF16, DType::FP16, DType::FP32}) {
      for (Data data : datas) {
        for (float spread : {0.5f, 300.0f}) {
          const HostTensor x0 = make_input(xd, static_cast<std::size_t>(numel),
                                           static_cast<std::size_t>(ch / c.groups * s), data, 41 + runs);
          const HostTensor b = make_parameter(xd, static_cast<std::size_t>(ch), 43 + runs, -1.0f, spread);
          for (bool last : {false, true}) {
            const HostTensor x = last ? relayout(x0, n, ch, s, true) : x0;
            const HostTensor xb = plus_bias(x, b, n, ch, s, last);
            HostTensor with(DType::BF16, x.size()), plain(DType::BF16, x.size());
            gnsilu::Problem p;
            p.x = x.data();
            p.x_dtype = xd;
            p.y = with.data();
            p.y_dtype = DType::BF16;
            p.shape = c.shape;
            p.num_groups = c.groups;
            p.x_layout = p.y_layout = last ? gnsilu::Layout::ChannelsLast : gnsilu::Layout::ChannelsFirst;
            p.input_bias = b.data();
            gnsilu::reference_group_norm_silu(p);
            gnsilu::Problem q = p;
            q.x = xb.data();
            q.y = plain.data();
            q.input_bias = nullptr;
            gnsilu::reference_group_norm_silu(q);
            const std::string what = "shape " + std::to_string(c.shape[0]) + "x" + std::to_string(ch) +
                                     " S=" + std::to_string(s) + " " + gnsilu::dtype_name(xd) + " " + data_name(data) +
                                     " spread " + std::to_string(spread) + (last ? " channels-last" : "");
            CHECK_MESSAGE(with.bytes == plain.bytes, what);
            // Region statistics of the whole tensor read the bias too.
            std::vector<int64_t> sw(static_cast<std::size_t>(n * c.groups * gnsilu::kStatsWords)), sp(sw.size());
            gnsilu::reference_group_stats(p, sw.data());
            gnsilu::reference_group_stats(q, sp.data());
            CHECK_MESSAGE(sw == sp, what << " (statistics)");
            // A padded output (replicate on the last dimension, constant on the one before where there is one).
            const std::vector<int64_t> pad = {1, 2, 1, 0};
            if (c.shape.size() >= 4) {
              std::vector<int64_t> out_shape = c.shape;
              out_shape[out_shape.size() - 1] += 3;
              out_shape[out_shape.size() - 2] += 1;
              int64_t out_numel = 1;
              for (auto d : out_shape) out_numel *= d;
              HostTensor pw(DType::BF16, static_cast<std::size_t>(out_numel)), pp(DType::BF16, pw.size());
              for (auto mode : {gnsilu::PadMode::Replicate, gnsilu::PadMode::Constant}) {
                gnsilu::Problem pa = p, pb = q;
                pa.pad = pb.pad = pad;
                pa.pad_mode = pb.pad_mode = mode;
                pa.y = pw.data();
                pb.y = pp.data();
                gnsilu::reference_group_norm_silu(pa);
                gnsilu::reference_group_norm_silu(pb);
                CHECK_MESSAGE(pw.bytes == pp.bytes, what << " (padded)");
              }
            }
            ++runs;
          }
        }
      }
    }
  }
  MESSAGE(runs << " calls with an input bias compared with calls on x + b");
}
