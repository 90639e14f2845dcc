// GPU tests (label "gpu"): the kernels against the CPU reference, bit for bit, for every dtype pair, every
// candidate launch configuration, both paths, both layouts and both activations; guard bytes around y; in place;
// caller workspace; graph capture; tensors of more than 2^31 elements in both layouts; errors that write
// nothing. Exits 77 (ctest: skipped) with the reason when there is no usable driver or device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu/silu_fast_check.hpp"
#include "cache/cache.hpp"
#include "runtime/compiler.hpp"
#include "tuning/config_table.hpp"
#include "base/device.hpp"
#include "base/driver.hpp"
#include "base/errors.hpp"
#include "runtime/kernels.hpp"
#include "runtime/modules.hpp"
#include "runtime/plan.hpp"
#include "runtime/validate.hpp"
#include "skip.hpp"
#include "skip_case.hpp"
#include "support.hpp"

using namespace testing;
using gnsilu::DType;
using gnsilu::Path;

namespace {

const gnsilu::detail::Driver& drv() { return gnsilu::detail::driver(); }

// Device memory with guard bytes on both sides (filled with a pattern and checked).
class DeviceMemory {
 public:
  static constexpr std::size_t kGuard = 4096;
  explicit DeviceMemory(std::size_t bytes, std::size_t offset = 0) : bytes_(bytes), offset_(offset) {
    GNSILU_CHECK(drv().cuMemAlloc_v2(&base_, bytes + 2 * kGuard + offset));
    GNSILU_CHECK(drv().cuMemsetD8_v2(base_, kPattern, bytes + 2 * kGuard + offset));
  }
  ~DeviceMemory() {
    if (base_) drv().cuMemFree_v2(base_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return reinterpret_cast<void*>(base_ + kGuard + offset_); }
  std::size_t size() const { return bytes_; }
  void upload(const void* data) { GNSILU_CHECK(drv().cuMemcpyHtoD_v2(base_ + kGuard + offset_, data, bytes_)); }
  void download(void* data) const { GNSILU_CHECK(drv().cuMemcpyDtoH_v2(data, base_ + kGuard + offset_, bytes_)); }
  void fill(unsigned char v) { GNSILU_CHECK(drv().cuMemsetD8_v2(base_ + kGuard + offset_, v, bytes_)); }
  bool guards_intact() const {
    std::vector<unsigned char> g(kGuard + offset_);
    GNSILU_CHECK(drv().cuMemcpyDtoH_v2(g.data(), base_, g.size()));
    if (std::any_of(g.begin(), g.end(), [](unsigned char c) { return c != kPattern; })) return false;
    std::vector<unsigned char> t(kGuard);
    GNSILU_CHECK(drv().cuMemcpyDtoH_v2(t.data(), base_ + kGuard + offset_ + bytes_, kGuard));
    return std::all_of(t.begin(), t.end(), [](unsigned char c) { return c == kPattern; });
  }

 private:
  static constexpr unsigned char kPattern = 0xA5;
  CUdeviceptr base_ = 0;
  std::size_t bytes_ = 0;
  std::size_t offset_ = 0;
};

void device_sync() { GNSILU_CHECK(drv().cuCtxSynchronize()); }

// Finalize in parts forced from `records` chunk records for the scope (plan.hpp: force_finalize_parts_from), by two
// launches or by one with atomics (force_finalize_atomic).
struct ForcedParts {
  ForcedParts(int64_t records, bool atomic) {
    gnsilu::detail::force_finalize_parts_from(records);
    gnsilu::detail::force_finalize_atomic(atomic);
  }
  ~ForcedParts() {
    gnsilu::detail::force_finalize_parts_from(0);
    gnsilu::detail::force_finalize_atomic(false);
  }
  ForcedParts(const ForcedParts&) = delete;
  ForcedParts& operator=(const ForcedParts&) = delete;
};

struct Shape {
  std::vector<int64_t> dims;
  int64_t groups;
  std::size_t misalign = 0;  // elements added to the x and y addresses (disables 16-byte vectors)
};

using gnsilu::Activation;
using gnsilu::Layout;

// N, C and S (the product of the spatial sizes) of a shape.
struct Extent {
  int64_t n, c, s;
};
Extent extent_of(const std::vector<int64_t>& dims) {
  int64_t s = 1;
  for (std::size_t i = 2; i < dims.size(); ++i) s *= dims[i];
  return {dims[0], dims[1], s};
}

int64_t numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

std::string shape_text(const Shape& s) {
  std::string out = gnsilu::cache::TunedShape{s.dims, s.groups}.text();
  if (s.misalign) out += " offset by " + std::to_string(s.misalign) + " elements";
  return out;
}

// A call over device tensors whose answer is known: x uploaded from `x`, the CPU reference's bf16 y in `expected`,
// and `problem` pointed at the device x and y (no affine parameters). `dims` must outlive the case.
struct ReferenceCase {
  HostTensor expected;
  DeviceMemory dx, dy;
  gnsilu::Problem problem;
  ReferenceCase(HostTensor& x, const std::vector<int64_t>& dims, int64_t groups,
                Layout layout = Layout::ChannelsFirst)
      : expected(DType::BF16, x.size()), dx(x.bytes.size()), dy(expected.bytes.size()) {
    problem.x = x.data();
    problem.x_dtype = x.dtype;
    problem.y = expected.data();
    problem.shape = dims;
    problem.num_groups = groups;
    problem.x_layout = problem.y_layout = layout;
    gnsilu::reference_group_norm_silu(problem);
    dx.upload(x.data());
    problem.x = dx.get();
    problem.y = dy.get();
  }
  // The call with `options` on the default stream into poisoned y: whether y then holds the reference's bits.
  bool matches(const gnsilu::LaunchOptions& options) {
    HostTensor got(DType::BF16, expected.size());
    dy.fill(0xFF);
    gnsilu::group_norm_silu(problem, nullptr, {}, options);
    device_sync();
    dy.download(got.data());
    return got.bytes == expected.bytes;
  }
};

const DType kTypes[] = {DType::BF16, DType::FP16, DType::FP32};

// Compile every variant the tests use, in parallel (NVRTC is thread-safe across programs).
void precompile_all() {
  CUdevice device = 0;
  GNSILU_CHECK(drv().cuCtxGetDevice(&device));
  const int arch = gnsilu::detail::device_info(device).arch();
  std::vector<gnsilu::detail::Variant> variants;
  for (DType x : kTypes)
    for (DType y : kTypes)
      for (const auto& c : gnsilu::candidate_configs())
        for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast})
          for (Activation activation : {Activation::SiLU, Activation::None})
            variants.push_back({x, y, c, layout, activation});
  std::vector<std::thread> pool;
  std::atomic<std::size_t> next{0};
  const unsigned workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  const auto started = std::chrono::steady_clock::now();
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next++) < variants.size();) gnsilu::detail::compiled_for(arch, variants[i]);
    });
  }
  for (auto& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  MESSAGE("compiled " << variants.size() << " variants for sm_" << arch << " in " << s << " s on " << workers << " threads");
}

}  // namespace

TEST_CASE("every dtype pair, configuration, path, layout and activation gives the CPU reference's bits, and writes only y") {
  precompile_all();
  std::vector<Shape> shapes = {
      {{2, 64, 17, 19}, 32},          // odd spatial size: no vectors; C/G = 2; S <= 512: whole channels per chunk
      {{1, 32, 8, 8}, 32},            // C/G = 1
      {{3, 64, 16, 16}, 1},           // C/G = 64, one group per sample
      {{2, 48, 3, 5, 7}, 16},         // 5-D, C/G = 3
      {{1, 4}, 2},                    // no spatial dimension
      {{1, 1, 1}, 1},                 // one element
      {{1, 128, 64, 64}, 32},         // fused-eligible, vectorized
      {{2, 256, 40, 40}, 32},         // 12800-element groups; S = 1600: a 576-pixel last window
      {{1, 32, 256, 256}, 32},        // 64 chunks per group: the largest fused group
      {{1, 32, 300, 300}, 8},         // 360000-element groups: split only
      {{4, 128, 32, 32}, 32},         // N = 4
      {{2, 96, 24, 24}, 32, 1},       // pointers one element off 16-byte alignment (channels-last: gathered)
      {{1, 64, 72, 72}, 32, 4},       // 8-byte aligned 16-bit tensors, 16-byte aligned FP32 tensors
      {{1, 40, 40, 40}, 8},           // channels-last bf16 pixels of 80 bytes: tiles of 16-byte slices
      {{2, 1280, 8, 136}, 32},        // C/G = 40 (the widest VAE groups); S = 1088: a 64-pixel last window
      {{1, 320, 2049}, 32},           // three windows, the last of one pixel; C/G = 10
      {{1, 24, 1000}, 6},             // 512 < S < 1024: one chunk of 1000 per channel
      {{2, 20, 45, 30}, 5},           // C not a multiple of 8: element-wise channels-last apply, gathered chunks
      {{1, 64, 3, 20, 21}, 32},       // 5-D, S = 1260
  };
  // Random shapes too: N 1-3, 1-8 groups of 1-64 channels, 0-3 spatial dimensions of 1-40.
  std::mt19937 rng(20261129);
  for (int i = 0; i < 8; ++i) {
    Shape r;
    const int64_t groups = 1 + static_cast<int64_t>(rng() % 8);
    const int64_t per_group = 1 + static_cast<int64_t>(rng() % 64);
    r.dims = {1 + static_cast<int64_t>(rng() % 3), groups * per_group};
    const int spatial = static_cast<int>(rng() % 4);
    for (int d = 0; d < spatial; ++d) r.dims.push_back(1 + static_cast<int64_t>(rng() % 40));
    r.groups = groups;
    shapes.push_back(r);
  }
  const Data datas[] = {Data::Normal,  Data::LargeMean, Data::TinySpread, Data::WithNaN,  Data::WithInf,
                        Data::Subnormal, Data::Huge,     Data::Constant,   Data::WideRange};
  const DType params[] = {DType::FP32, DType::BF16, DType::FP16, DType::None};
  std::size_t runs = 0, mismatched = 0, shape_index = 0, layout_checks = 0;
  for (const Shape& shape : shapes) {
    const int64_t n = numel(shape.dims);
    const Extent e = extent_of(shape.dims);
    const auto geometry = gnsilu::detail::make_geometry(shape.dims, shape.groups);
    const DType pd = params[shape_index % 4];
    const Data data = datas[shape_index % (sizeof datas / sizeof datas[0])];
    ++shape_index;
    HostTensor w = make_parameter(pd == DType::None ? DType::FP32 : pd, static_cast<std::size_t>(shape.dims[1]), 7 + shape_index, 1.0f, 0.5f);
    HostTensor b = make_parameter(pd == DType::None ? DType::FP32 : pd, static_cast<std::size_t>(shape.dims[1]), 9 + shape_index, 0.0f, 0.5f);
    DeviceMemory dw(w.bytes.size()), db(b.bytes.size());
    dw.upload(w.data());
    db.upload(b.data());
    for (DType xd : kTypes) {
      // The same logical tensor in both layouts.
      const HostTensor x_first =
          make_input(xd, static_cast<std::size_t>(n), static_cast<std::size_t>(geometry.group_length), data, 100 + shape_index);
      const HostTensor x_last = relayout(x_first, e.n, e.c, e.s, true);
      for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast}) {
        const HostTensor& x = layout == Layout::ChannelsLast ? x_last : x_first;
        DeviceMemory dx(x.bytes.size(), shape.misalign * gnsilu::dtype_size(xd));
        dx.upload(x.data());
        for (Activation activation : {Activation::SiLU, Activation::None}) {
          for (DType yd : kTypes) {
            HostTensor expected(yd, static_cast<std::size_t>(n));
            gnsilu::Problem p;
            p.x = x.data();
            p.x_dtype = xd;
            p.y = expected.data();
            p.y_dtype = yd;
            p.shape = shape.dims;
            p.num_groups = shape.groups;
            p.weight = pd == DType::None ? nullptr : w.data();
            p.weight_dtype = pd;
            p.bias = pd == DType::None ? nullptr : b.data();
            p.bias_dtype = pd;
            p.x_layout = layout;
            p.y_layout = layout;
            p.activation = activation;
            gnsilu::reference_group_norm_silu(p);
            if (layout == Layout::ChannelsLast) {
              // The reference itself: its channels-last output is its channel-major one, relaid.
              gnsilu::Problem q = p;
              HostTensor first(yd, static_cast<std::size_t>(n));
              q.x = x_first.data();
              q.y = first.data();
              q.x_layout = q.y_layout = Layout::ChannelsFirst;
              gnsilu::reference_group_norm_silu(q);
              ++layout_checks;
              CHECK(relayout(expected, e.n, e.c, e.s, false).bytes == first.bytes);
            }

            DeviceMemory dy(expected.bytes.size(), shape.misalign * gnsilu::dtype_size(yd));
            p.x = dx.get();
            p.y = dy.get();
            p.weight = pd == DType::None ? nullptr : dw.get();
            p.bias = pd == DType::None ? nullptr : db.get();
            HostTensor got(yd, static_cast<std::size_t>(n));
            for (const auto& config : gnsilu::candidate_configs()) {
              for (Path path : {Path::Fused, Path::Split}) {
                if (path == Path::Fused && !gnsilu::detail::fused_eligible(geometry)) continue;
                dy.fill(0xFF);  // poison: 0xFFFF / 0xFFFFFFFF is a NaN no kernel stores (NaNs are canonical)
                gnsilu::LaunchOptions options;
                options.config = config;
                options.path = path;
                gnsilu::group_norm_silu(p, nullptr, {}, options);
                device_sync();
                dy.download(got.data());
                ++runs;
                const bool same = got.bytes == expected.bytes;
                const bool guards = dy.guards_intact();
                if (!same || !guards) {
                  ++mismatched;
                  std::size_t first = 0;
                  while (first < got.size() && got.bits(first) == expected.bits(first)) ++first;
                  FAIL_CHECK(shape_text(shape) << " (" << data_name(data) << ") " << std::string(gnsilu::dtype_name(xd)) << "->"
                                               << std::string(gnsilu::dtype_name(yd)) << " "
                                               << std::string(gnsilu::layout_name(layout)) << " "
                                               << std::string(gnsilu::activation_name(activation)) << " config e"
                                               << config.elems_per_load << " w" << config.warps << " s"
                                               << config.stages << " p" << config.programs_per_sm << " path "
                                               << (path == Path::Fused ? "fused" : "split") << ": bits "
                                               << (same ? "equal" : "differ from element " + std::to_string(first))
                                               << ", guards " << (guards ? "intact" : "OVERWRITTEN"));
                }
              }
            }
          }
        }
      }
    }
  }
  MESSAGE(runs << " runs over " << shapes.size() << " shapes (8 kinds of data), 9 dtype pairs, "
               << gnsilu::candidate_configs().size() << " configurations, both paths, both layouts and both "
               << "activations: " << runs - mismatched << " bit-identical to the CPU reference (whose channels-last "
               << "output equalled its channel-major one in " << layout_checks << " checks)");
  CHECK(mismatched == 0);
}

TEST_CASE(
    "an input bias gives the bits of the call on x + b: every path, configuration and layout, padded outputs, "
    "region statistics and in place") {
  // x + b is made on the host (plus_bias: the exact sum rounded once to x's dtype); the reference normalizes it
  // without a bias (and, checked too, gives the same bits given x and the bias); every GPU call is given x and the
  // bias. Shapes reach each place the kernels read x: full chunks of one channel and of several (S = 256), runs
  // with a short end, whole channels (S <= 512), gathered channels-last chunks (C % 8 != 0, misaligned), channels-
  // last tiles (1x64x33x35: a last window of 131 pixels, whose last 16-bit tile word holds one), the fused kernel's
  // vectors and elements; data with chunks summed element by element (WideRange) and with Inf; biases small and
  // large against x's spread.
  const std::vector<Shape> shapes = {
      {{2, 64, 17, 19}, 32},    {{1, 128, 16, 16}, 32},   {{1, 128, 64, 64}, 32},  {{1, 32, 300, 300}, 8},
      {{2, 96, 24, 24}, 32, 1}, {{1, 40, 40, 40}, 8},     {{2, 1280, 8, 136}, 32}, {{1, 24, 1000}, 6},
      {{2, 20, 45, 30}, 5},     {{1, 64, 3, 20, 21}, 32}, {{1, 64, 33, 35}, 32},
  };
  precompile_all();
  const Data datas[] = {Data::Normal, Data::WideRange, Data::WithInf, Data::TinySpread, Data::LargeMean};
  std::size_t runs = 0, mismatched = 0, index = 0;
  for (const Shape& shape : shapes) {
    const int64_t n = numel(shape.dims);
    const Extent e = extent_of(shape.dims);
    const auto geometry = gnsilu::detail::make_geometry(shape.dims, shape.groups);
    for (DType xd : kTypes) {
      const Data data = datas[index % (sizeof datas / sizeof datas[0])];
      const float spread = index % 2 ? 300.0f : 0.5f;
      ++index;
      const DType yd = xd == DType::FP32 ? DType::FP32 : DType::BF16;
      const HostTensor x_first = make_input(xd, static_cast<std::size_t>(n),
                                            static_cast<std::size_t>(geometry.group_length), data, 300 + index);
      const HostTensor b = make_parameter(xd, static_cast<std::size_t>(e.c), 310 + index, -1.0f, spread);
      DeviceMemory dbias(b.bytes.size());
      dbias.upload(b.data());
      for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast}) {
        const bool last = layout == Layout::ChannelsLast;
        const HostTensor x = last ? relayout(x_first, e.n, e.c, e.s, true) : x_first;
        const HostTensor xb = plus_bias(x, b, e.n, e.c, e.s, last);
        HostTensor expected(yd, static_cast<std::size_t>(n)), with(yd, static_cast<std::size_t>(n));
        gnsilu::Problem p;
        p.x = xb.data();
        p.x_dtype = xd;
        p.y = expected.data();
        p.y_dtype = yd;
        p.shape = shape.dims;
        p.num_groups = shape.groups;
        p.x_layout = p.y_layout = layout;
        gnsilu::reference_group_norm_silu(p);
        p.x = x.data();
        p.y = with.data();
        p.input_bias = b.data();
        gnsilu::reference_group_norm_silu(p);
        const std::string what = shape_text(shape) + " (" + data_name(data) + ") " + gnsilu::dtype_name(xd) + " " +
                                 gnsilu::layout_name(layout);
        CHECK_MESSAGE(with.bytes == expected.bytes, what << ": the reference with the bias");
        DeviceMemory dx(x.bytes.size(), shape.misalign * gnsilu::dtype_size(xd));
        DeviceMemory dy(expected.bytes.size(), shape.misalign * gnsilu::dtype_size(yd));
        dx.upload(x.data());
        p.x = dx.get();
        p.y = dy.get();
        p.input_bias = dbias.get();
        HostTensor got(yd, static_cast<std::size_t>(n));
        const auto check = [&](const std::string& how) {
          device_sync();
          dy.download(got.data());
          ++runs;
          const bool same = got.bytes == expected.bytes;
          const bool guards = dy.guards_intact();
          if (!same || !guards) {
            ++mismatched;
            std::size_t first = 0;
            while (first < got.size() && got.bits(first) == expected.bits(first)) ++first;
            FAIL_CHECK(what << " " << how << ": bits "
                            << (same ? "equal" : "differ from element " + std::to_string(first)) << ", guards "
                            << (guards ? "intact" : "OVERWRITTEN"));
          }
        };
        // A biased call takes the split path (the fused kernel has no bias): every configuration, the path chosen
        // by the library, and the fused path refused before anything is written.
        for (const auto& config : gnsilu::candidate_configs()) {
          dy.fill(0xFF);
          gnsilu::LaunchOptions options;
          options.config = config;
          options.path = Path::Split;
          gnsilu::group_norm_silu(p, nullptr, {}, options);
          check("split e" + std::to_string(config.elems_per_load) + " w" + std::to_string(config.warps) + " s" +
                std::to_string(config.stages));
        }
        dy.fill(0xFF);
        gnsilu::group_norm_silu(p, nullptr, {}, {});
        check("the library's path");
        if (gnsilu::detail::fused_eligible(geometry)) {
          dy.fill(0xFF);
          gnsilu::LaunchOptions fused;
          fused.path = Path::Fused;
          CHECK_THROWS_WITH_AS(gnsilu::group_norm_silu(p, nullptr, {}, fused), doctest::Contains("options.path"),
                               gnsilu::Error);
          device_sync();
          HostTensor untouched(yd, static_cast<std::size_t>(n));
          dy.download(untouched.data());
          CHECK_MESSAGE(std::all_of(untouched.bytes.begin(), untouched.bytes.end(),
                                    [](unsigned char byte) { return byte == 0xFF; }),
                        what << ": a refused fused call wrote y");
        }
        // Region statistics of the whole tensor, and the output applied from them. A group with a NaN or Inf is
        // recorded differently by the two (the GPU counts one nonfinite chunk and skips its sums, the reference
        // counts each nonfinite element: both make the group's statistics NaN), so those records are compared by
        // their count and their nonfinite mark; every other record word for word.
        std::vector<int64_t> want(static_cast<std::size_t>(e.n * shape.groups * gnsilu::kStatsWords)),
            stats(want.size());
        gnsilu::Problem hp = p;
        hp.x = xb.data();
        hp.input_bias = nullptr;
        gnsilu::reference_group_stats(hp, want.data());
        DeviceMemory dstats(want.size() * sizeof(int64_t));
        gnsilu::group_stats(p, static_cast<int64_t*>(dstats.get()));
        device_sync();
        dstats.download(stats.data());
        ++runs;
        std::size_t differ = 0;
        for (int64_t group = 0; group < e.n * shape.groups; ++group) {
          const int64_t* w = want.data() + group * gnsilu::kStatsWords;
          const int64_t* got_record = stats.data() + group * gnsilu::kStatsWords;
          const bool nonfinite = w[1] != 0;  // exact::Record: count, nonfinite, sum limbs, square limbs
          const bool same = nonfinite ? got_record[0] == w[0] && got_record[1] != 0
                                      : std::equal(w, w + gnsilu::kStatsWords, got_record);
          differ += same ? 0 : 1;
        }
        if (differ != 0) {
          ++mismatched;
          FAIL_CHECK(what << ": group_stats with the bias differ from the records of x + b in " << differ << " groups");
        }
        dy.fill(0xFF);
        gnsilu::group_norm_apply(p, static_cast<const int64_t*>(dstats.get()));
        check("group_norm_apply");
        // In place: y = x, the bias read as x is overwritten.
        if (yd == xd && shape.misalign == 0) {
          DeviceMemory dxy(x.bytes.size());
          dxy.upload(x.data());
          gnsilu::Problem ip = p;
          ip.x = ip.y = dxy.get();
          gnsilu::group_norm_silu(ip);
          device_sync();
          dxy.download(got.data());
          ++runs;
          if (got.bytes != expected.bytes) {
            ++mismatched;
            FAIL_CHECK(what << ": in place");
          }
        }
        // A padded output (replicate), where there are two spatial dimensions or more.
        if (shape.dims.size() >= 4 && shape.misalign == 0) {
          gnsilu::Problem pp = p;
          const std::vector<int64_t> pad = {1, 1, 1, 1};
          pp.pad = pad;
          pp.pad_mode = gnsilu::PadMode::Replicate;
          const auto y_n = static_cast<std::size_t>(gnsilu::detail::validate_problem(pp).y_numel);
          HostTensor want_padded(yd, y_n), got_padded(yd, y_n);
          gnsilu::Problem hq = pp;
          hq.x = xb.data();
          hq.y = want_padded.data();
          hq.input_bias = nullptr;
          gnsilu::reference_group_norm_silu(hq);
          DeviceMemory dpadded(got_padded.bytes.size());
          pp.y = dpadded.get();
          gnsilu::group_norm_silu(pp);
          device_sync();
          dpadded.download(got_padded.data());
          ++runs;
          if (got_padded.bytes != want_padded.bytes || !dpadded.guards_intact()) {
            ++mismatched;
            FAIL_CHECK(what << ": padded output");
          }
        }
      }
    }
  }
  MESSAGE(runs << " calls with an input bias over " << shapes.size() << " shapes: " << runs - mismatched
               << " gave the bits of the call on x + b");
  CHECK(mismatched == 0);
}

TEST_CASE("channels-last statistics tiles of 16, 32 and 64 bytes a pixel give the reference's bits") {
  const std::vector<std::vector<int64_t>> shapes = {{1, 128, 48, 48}, {2, 320, 1100}, {1, 512, 33, 33}, {1, 1280, 1025}};
  std::size_t runs = 0, differ = 0;
  for (const auto& dims : shapes) {
    const Extent e = extent_of(dims);
    for (DType xd : kTypes) {
      const HostTensor x = relayout(make_input(xd, static_cast<std::size_t>(numel(dims)),
                                               static_cast<std::size_t>(e.c / 32 * e.s), Data::LargeMean, 31),
                                    e.n, e.c, e.s, true);
      HostTensor expected(DType::BF16, x.size()), got(DType::BF16, x.size());
      gnsilu::Problem p;
      p.x = x.data();
      p.x_dtype = xd;
      p.y = expected.data();
      p.shape = dims;
      p.x_layout = p.y_layout = Layout::ChannelsLast;
      gnsilu::reference_group_norm_silu(p);
      DeviceMemory dx(x.bytes.size()), dy(expected.bytes.size());
      dx.upload(x.data());
      p.x = dx.get();
      p.y = dy.get();
      for (int bytes : {16, 32, 64}) {
        gnsilu::detail::force_tile_slice_bytes(bytes);
        for (const auto& config : gnsilu::candidate_configs()) {
          gnsilu::LaunchOptions options;
          options.config = config;
          options.path = Path::Split;
          dy.fill(0xFF);
          gnsilu::group_norm_silu(p, nullptr, {}, options);
          device_sync();
          dy.download(got.data());
          ++runs;
          if (got.bytes != expected.bytes || !dy.guards_intact()) {
            ++differ;
            FAIL_CHECK(dims[1] << " channels, S = " << e.s << ", " << std::string(gnsilu::dtype_name(xd)) << ", slices of " << bytes
                               << " bytes, e" << config.elems_per_load << " w" << config.warps << ": differs");
          }
        }
      }
      gnsilu::detail::force_tile_slice_bytes(0);
    }
  }
  MESSAGE(runs << " runs with forced tile slices: " << runs - differ << " equal to the reference");
  CHECK(differ == 0);
}

TEST_CASE("finalize: groups of 1 to 4097 chunk records (records held in registers, and the loop beyond 4096) match the reference") {
  // finalize keeps a group's records in registers up to 1, 4 and 16 per thread (256, 1024, 4096 records) and
  // loops over them beyond; with parts forced from 2048 records (the library's rule starts at 16384), it merges them
  // in parts, by two launches and by one with atomics: groups at and next to each boundary, with a partial last chunk
  // where the length allows.
  const int64_t lengths[] = {1000,        256 * 1024,         256 * 1024 + 5,  1024 * 1024, 1024 * 1024 + 1024,
                             2047 * 1024, 2048 * 1024,        2048 * 1024 + 1, 4096 * 1024, 4096 * 1024 + 3,
                             4097 * 1024};
  std::size_t runs = 0, differ = 0;
  for (const bool atomic : {false, true}) {
    const ForcedParts forced(2048, atomic);
    for (const int64_t length : lengths) {
      for (auto [xd, data] : {std::pair{DType::BF16, Data::LargeMean}, std::pair{DType::FP32, Data::Normal}}) {
        const std::vector<int64_t> dims{1, 2, length};  // two groups of one channel
        const auto n = static_cast<std::size_t>(numel(dims));
        HostTensor x = make_input(xd, n, static_cast<std::size_t>(length), data, 77);
        ReferenceCase c(x, dims, 2);
        gnsilu::LaunchOptions split;
        split.path = Path::Split;
        split.config = gnsilu::default_config(Path::Split);
        ++runs;
        if (!c.matches(split)) {
          ++differ;
          FAIL_CHECK("group length " << length << " (" << (length + 1023) / 1024 << " records), x "
                                     << std::string(gnsilu::dtype_name(xd))
                                     << (atomic ? ", one launch with atomics" : "") << ": differs from the reference");
        }
      }
    }
  }
  MESSAGE(runs << " runs, groups of 1 to 4097 records: " << runs - differ << " equal to the reference");
  CHECK(differ == 0);
}

TEST_CASE("finalize in parts: large groups of every kind of data, in both layouts, give the reference's bits") {
  // Groups of many records are merged in parts by one launch of finalize whose parts add their records with atomics
  // (plan.cpp: finalize_parts), or by two launches, here forced from 2048 records so that the tensors stay small:
  // parts of unequal length (2931 records in 6 parts of two launches, 12 with atomics), chunks summed element by
  // element within a part (wide ranges), NaN and Inf in one part, a single group of 2^22 elements; last, the library's
  // rule unforced on a group of 2^24 elements. (The regions case below takes such groups through group_stats.)
  struct Shape {
    std::vector<int64_t> dims;
    int64_t groups;
  };
  const Shape shapes[] = {{{1, 3, 1000, 1000}, 1}, {{1, 64, 256, 256}, 1}, {{2, 64, 256, 256}, 2}};
  const Data kinds[] = {Data::Normal, Data::LargeMean, Data::WideRange, Data::WithNaN, Data::WithInf,
                        Data::TinySpread};
  std::size_t runs = 0, differ = 0;
  // One run: x (channel-major) in the layout asked, against the reference; a difference is reported with `what`.
  const auto run = [&](const HostTensor& x_first, const std::vector<int64_t>& dims, int64_t groups, bool last,
                       const gnsilu::LaunchOptions& options, const std::string& what) {
    const Extent e = extent_of(dims);
    HostTensor x = last ? relayout(x_first, e.n, e.c, e.s, true) : x_first;
    ReferenceCase c(x, dims, groups, last ? Layout::ChannelsLast : Layout::ChannelsFirst);
    ++runs;
    if (!c.matches(options)) {
      ++differ;
      FAIL_CHECK(what << (last ? ", channels-last" : "") << ": differs from the reference");
    }
  };
  gnsilu::LaunchOptions split;
  split.path = Path::Split;
  for (const bool atomic : {false, true}) {
    const ForcedParts forced(2048, atomic);
    for (const Shape& shape : shapes) {
      const gnsilu::detail::Geometry geometry = gnsilu::detail::make_geometry(shape.dims, shape.groups);
      REQUIRE(gnsilu::detail::finalize_parts(geometry).parts > 1);
      REQUIRE(gnsilu::detail::finalize_parts(geometry).atomic == atomic);
      const auto n = static_cast<std::size_t>(numel(shape.dims));
      const auto group_length = n / static_cast<std::size_t>(shape.dims[0] * shape.groups);
      for (const Data data : kinds) {
        for (const DType xd : {DType::BF16, DType::FP16}) {
          const HostTensor x_first = make_input(xd, n, group_length, data, 91);
          const std::string what = std::to_string(shape.dims[1]) + " channels, " + data_name(data) + ", x " +
                                   gnsilu::dtype_name(xd) + (atomic ? ", one launch with atomics" : "");
          for (const bool last : {false, true}) run(x_first, shape.dims, shape.groups, last, split, what);
        }
      }
    }
  }
  // The library's rule, unforced: one group of 2^24 elements (16384 records) takes one launch with atomics.
  {
    const std::vector<int64_t> dims{1, 16, 1024, 1024};
    const gnsilu::detail::Geometry geometry = gnsilu::detail::make_geometry(dims, 1);
    REQUIRE(gnsilu::detail::finalize_parts(geometry).parts > 1);
    REQUIRE(gnsilu::detail::finalize_parts(geometry).atomic);
    const auto n = static_cast<std::size_t>(numel(dims));
    for (const Data data : {Data::Normal, Data::LargeMean, Data::WithNaN}) {
      const HostTensor x_first = make_input(DType::BF16, n, n, data, 92);
      const std::string what = std::string("the library's rule, one group of 2^24 elements, ") + data_name(data);
      for (const bool last : {false, true}) run(x_first, dims, 1, last, gnsilu::LaunchOptions{}, what);
    }
  }
  MESSAGE(runs << " runs of groups merged in parts: " << runs - differ << " equal to the reference");
  CHECK(differ == 0);
}

TEST_CASE("the fast 16-bit SiLU decides like silu32 for every FP32 input") {
  CUdevice device = 0;
  GNSILU_CHECK(drv().cuCtxGetDevice(&device));
  gnsilu::detail::CompileRequest request;
  request.arch = gnsilu::detail::device_info(device).arch();
  request.names = {"gnsilu::kernel::silu_fast_check<0>"};
  request.source = gnsilu_test::kSiluFastCheckSource;
  const auto program = gnsilu::detail::compile(request);
  CUmodule module = nullptr;
  GNSILU_CHECK(drv().cuModuleLoadData(&module, program.image.data()));
  CUfunction check = nullptr;
  GNSILU_CHECK(drv().cuModuleGetFunction(&check, module, program.lowered_names[0].c_str()));
  DeviceMemory counts(6 * sizeof(unsigned long long));
  counts.fill(0);
  unsigned long long first = 0, count = 1ull << 32;
  CUdeviceptr out = reinterpret_cast<CUdeviceptr>(counts.get());
  void* args[] = {&first, &count, &out};
  const auto started = std::chrono::steady_clock::now();
  GNSILU_CHECK(drv().cuLaunchKernel(check, 132 * 16, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  device_sync();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  unsigned long long c[6] = {};
  counts.download(c);
  drv().cuModuleUnload(module);
  MESSAGE("all 2^32 FP32 inputs in " << seconds << " s: decided fast " << 100.0 * c[0] / 4294967296.0 << "% for bf16, "
                                    << 100.0 * c[1] / 4294967296.0 << "% for fp16; wrongly: " << c[2] << " bf16, "
                                    << c[3] << " fp16; largest distance from silu32 " << c[4]
                                    << " FP32 ulps, " << c[5] / 10.0 << "% of the margin allowed");
  CHECK(c[2] == 0);
  CHECK(c[3] == 0);
  CHECK(c[5] < 1000);
}

TEST_CASE("in place, a caller workspace and the default path match the reference, in both layouts") {
  const std::vector<int64_t> dims{2, 64, 48, 48};
  const auto n = static_cast<std::size_t>(numel(dims));
  for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast}) {
    for (auto [xd, yd] : {std::pair{DType::BF16, DType::BF16}, std::pair{DType::FP16, DType::BF16}, std::pair{DType::FP32, DType::FP32}}) {
      for (Path path : {Path::Auto, Path::Fused, Path::Split}) {
        HostTensor x = make_input(xd, n, 2 * 48 * 48, Data::Normal, 5);
        HostTensor expected(yd, n), got(yd, n);
        gnsilu::Problem p;
        p.x = x.data();
        p.x_dtype = xd;
        p.y = expected.data();
        p.y_dtype = yd;
        p.shape = dims;
        p.num_groups = 32;
        p.x_layout = p.y_layout = layout;
        gnsilu::reference_group_norm_silu(p);
        DeviceMemory buffer(x.bytes.size());
        buffer.upload(x.data());
        p.x = buffer.get();
        p.y = buffer.get();
        gnsilu::LaunchOptions options;
        options.path = path;
        gnsilu::group_norm_silu(p, nullptr, {}, options);
        device_sync();
        buffer.download(got.data());
        CHECK_MESSAGE(got.bytes == expected.bytes,
                      std::string(gnsilu::layout_name(layout)) << " in place, path " << std::string(gnsilu::path_name(path)));
        CHECK(buffer.guards_intact());

        const std::size_t ws_bytes = gnsilu::workspace_size(p);
        DeviceMemory ws(ws_bytes), dx(x.bytes.size()), dy(got.bytes.size());
        dx.upload(x.data());
        p.x = dx.get();
        p.y = dy.get();
        gnsilu::group_norm_silu(p, nullptr, {ws.get(), ws_bytes}, options);
        device_sync();
        dy.download(got.data());
        CHECK(got.bytes == expected.bytes);
        CHECK(ws.guards_intact());
      }
    }
  }
}

TEST_CASE("a padded output gives the reference's bits in both layouts and modes, and writes only y") {
  struct PadCase {
    std::vector<int64_t> dims;
    int64_t groups;
    std::vector<int64_t> pad;
    std::size_t misalign = 0;  // elements added to the x and y addresses (no 16-byte vectors)
  };
  // HunyuanVideo's causal conv padding on a decoder-like 5-D tensor (rows of whole vectors and not), a 4-D one,
  // widths past the dimensions, one pixel, a 6-D tensor whose leading spatial dimension is not padded, and rows of
  // 3 and 10 padded elements, lines longer than a channel-major tile stages (segments of a line) and x and y off
  // their 16-byte alignment; in channels-last, 8-channel vectors on 2 to 32 lanes a pixel, two slices of 256
  // channels, and channel counts that are not multiples of 8 (one element a lane).
  const PadCase cases[] = {
      {{1, 128, 3, 40, 64}, 32, {1, 1, 1, 1, 2, 0}}, {{2, 64, 5, 33, 17}, 32, {1, 1, 1, 1, 2, 0}},
      {{1, 96, 70, 90}, 32, {1, 1, 1, 1}},           {{1, 32, 2, 3, 4}, 8, {0, 5, 4, 0, 1, 6}},
      {{3, 64, 1, 1}, 16, {1, 1, 1, 1}},             {{1, 16, 2, 3, 4, 5}, 4, {1, 1, 1, 1, 1, 1}},
      {{1, 320, 2, 9, 37}, 32, {1, 1, 1, 1, 2, 0}},  {{2, 36, 3, 5, 7}, 4, {2, 1, 0, 3}},
      // Rows shorter than a warp's 32 elements and than 8 (a lane's elements then span several rows and lines).
      {{2, 8, 1, 2}, 4, {1, 0}},                     {{1, 16, 3, 1}, 4, {0, 1, 1, 1}},
      {{1, 8, 2, 9000}, 4, {3, 2, 1, 0}},            {{1, 64, 3, 20, 30}, 32, {1, 1, 1, 1, 2, 0}, 1},
      {{1, 8, 2, 5000}, 4, {0, 7, 1, 1}, 3},
  };
  std::size_t runs = 0;
  for (const auto& c : cases) {
    const auto n = static_cast<std::size_t>(numel(c.dims));
    for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast}) {
      for (auto [xd, yd] : {std::pair{DType::BF16, DType::BF16}, std::pair{DType::FP16, DType::FP32},
                            std::pair{DType::FP32, DType::BF16}}) {
        for (gnsilu::PadMode mode : {gnsilu::PadMode::Replicate, gnsilu::PadMode::Constant}) {
          const auto activation = runs % 3 == 2 ? gnsilu::Activation::None : gnsilu::Activation::SiLU;
          const int64_t group_length = n / static_cast<std::size_t>(c.dims[0] * c.groups);
          HostTensor x = make_input(xd, n, static_cast<std::size_t>(group_length), Data::LargeMean, 40 + runs);
          HostTensor w = make_parameter(DType::FP32, static_cast<std::size_t>(c.dims[1]), 9, 1.0f, 0.5f);
          HostTensor b = make_parameter(DType::FP32, static_cast<std::size_t>(c.dims[1]), 10, 0.0f, 0.5f);
          gnsilu::Problem p;
          p.x = x.data();
          p.x_dtype = xd;
          p.y_dtype = yd;
          p.shape = c.dims;
          p.num_groups = c.groups;
          p.weight = w.data();
          p.bias = b.data();
          p.x_layout = p.y_layout = layout;
          p.activation = activation;
          p.pad = c.pad;
          p.pad_mode = mode;
          p.pad_value = -0.75;
          p.y = x.data();  // a placeholder for the checks that give y's size (validate reads no memory)
          const gnsilu::detail::Geometry g = gnsilu::detail::validate_problem(p);
          const auto y_n = static_cast<std::size_t>(g.y_numel);
          HostTensor expected(yd, y_n), got(yd, y_n);
          p.y = expected.data();
          gnsilu::reference_group_norm_silu(p);
          DeviceMemory dx(x.bytes.size(), c.misalign * gnsilu::dtype_size(xd));
          DeviceMemory dy(got.bytes.size(), c.misalign * gnsilu::dtype_size(yd));
          DeviceMemory dw(w.bytes.size()), db(b.bytes.size());
          dx.upload(x.data());
          dw.upload(w.data());
          db.upload(b.data());
          p.x = dx.get();
          p.y = dy.get();
          p.weight = dw.get();
          p.bias = db.get();
          gnsilu::group_norm_silu(p);
          device_sync();
          dy.download(got.data());
          ++runs;
          const std::string what = std::to_string(c.dims.size()) + "-D C=" + std::to_string(c.dims[1]) + " " +
                                   gnsilu::layout_name(layout) + " " + gnsilu::dtype_name(xd) + "->" +
                                   gnsilu::dtype_name(yd) +
                                   (mode == gnsilu::PadMode::Replicate ? " replicate" : " constant") +
                                   (c.misalign != 0 ? " misaligned" : "");
          CHECK_MESSAGE(got.bytes == expected.bytes, what);
          CHECK_MESSAGE(dy.guards_intact(), what);
          // The same statistics given (group_norm_apply): the same padded bits.
          std::vector<int64_t> stats(static_cast<std::size_t>(g.groups_total) * gnsilu::kStatsWords);
          DeviceMemory dstats(stats.size() * sizeof(int64_t));
          gnsilu::Problem region = p;
          region.pad = {};
          gnsilu::group_stats(region, static_cast<int64_t*>(dstats.get()));
          dy.fill(0);
          gnsilu::group_norm_apply(p, static_cast<const int64_t*>(dstats.get()));
          device_sync();
          dy.download(got.data());
          CHECK_MESSAGE(got.bytes == expected.bytes, what << " (group_norm_apply)");
        }
      }
    }
  }
  MESSAGE(runs << " padded calls compared");
  // A padded output may not be written in place, and a y too small for the border is refused before any launch.
  const std::vector<int64_t> dims{1, 32, 8, 8};
  const std::vector<int64_t> pad{1, 1, 1, 1};
  DeviceMemory buffer(2 * 32 * 10 * 10);
  buffer.fill(0x3C);
  gnsilu::Problem p;
  p.x = buffer.get();
  p.y = buffer.get();
  p.shape = dims;
  p.pad = pad;
  CHECK_THROWS_WITH_AS(gnsilu::group_norm_silu(p), doctest::Contains("'y'"), gnsilu::Error);
  // y placed so that x's shape would end exactly at the allocation's end (past the guard) and the border past it.
  p.y = static_cast<char*>(buffer.get()) + buffer.size();
  CHECK_THROWS_WITH_AS(gnsilu::group_norm_silu(p), doctest::Contains("allocation"), gnsilu::Error);
  std::vector<unsigned char> after(buffer.size());
  buffer.download(after.data());
  CHECK(std::all_of(after.begin(), after.end(), [](unsigned char v) { return v == 0x3C; }));
  CHECK(buffer.guards_intact());
}

TEST_CASE("a call captured into a CUDA graph replays to the same bits, in both layouts") {
  for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast}) {
    const std::vector<int64_t> dims{1, 128, 96, 96};
    const auto n = static_cast<std::size_t>(numel(dims));
    HostTensor x = make_input(DType::BF16, n, 4 * 96 * 96, Data::LargeMean, 8);
    HostTensor got(DType::BF16, n);
    ReferenceCase c(x, dims, 32, layout);
    const gnsilu::Problem& p = c.problem;
    DeviceMemory& dy = c.dy;
    const HostTensor& expected = c.expected;
    gnsilu::LaunchOptions split;
    split.path = Path::Split;  // the path that needs a workspace
    gnsilu::group_norm_silu(p, nullptr, {}, split);  // compile and warm outside the capture
    device_sync();
    dy.fill(0xFF);
    CUstream stream = nullptr;
    GNSILU_CHECK(drv().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    // The graph API is not in the library's driver table: resolve what this test needs here.
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(handle != nullptr);
    auto begin = reinterpret_cast<decltype(&cuStreamBeginCapture_v2)>(dlsym(handle, "cuStreamBeginCapture_v2"));
    auto end = reinterpret_cast<decltype(&cuStreamEndCapture)>(dlsym(handle, "cuStreamEndCapture"));
    auto instantiate = reinterpret_cast<decltype(&cuGraphInstantiateWithFlags)>(dlsym(handle, "cuGraphInstantiateWithFlags"));
    auto graph_launch = reinterpret_cast<decltype(&cuGraphLaunch)>(dlsym(handle, "cuGraphLaunch"));
    auto exec_destroy = reinterpret_cast<decltype(&cuGraphExecDestroy)>(dlsym(handle, "cuGraphExecDestroy"));
    auto graph_destroy = reinterpret_cast<decltype(&cuGraphDestroy)>(dlsym(handle, "cuGraphDestroy"));
    REQUIRE((begin && end && instantiate && graph_launch && exec_destroy && graph_destroy));
    GNSILU_CHECK(begin(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    gnsilu::group_norm_silu(p, stream, {}, split);
    CUgraph graph = nullptr;
    GNSILU_CHECK(end(stream, &graph));
    CUgraphExec exec = nullptr;
    GNSILU_CHECK(instantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) GNSILU_CHECK(graph_launch(exec, stream));
    GNSILU_CHECK(drv().cuStreamSynchronize(stream));
    dy.download(got.data());
    CHECK(got.bytes == expected.bytes);
    exec_destroy(exec);
    graph_destroy(graph);
    drv().cuStreamDestroy_v2(stream);
  }
}

TEST_CASE("bad arguments on the device are refused and write nothing") {
  const std::vector<int64_t> dims{1, 32, 16, 16};
  const auto n = static_cast<std::size_t>(numel(dims));
  HostTensor x = make_input(DType::BF16, n, 256, Data::Normal, 3);
  DeviceMemory buffer(4 * n);  // room for overlapping views
  buffer.upload(std::vector<unsigned char>(4 * n, 0x3C).data());
  auto* base = static_cast<char*>(buffer.get());
  gnsilu::Problem p;
  p.x = base;
  p.y = base + 2 * 8;  // overlaps x, not in place
  p.shape = dims;
  CHECK_THROWS_WITH_AS(gnsilu::group_norm_silu(p), doctest::Contains("'y'"), gnsilu::Error);
  p.y = base + 2 * n;
  std::vector<unsigned char> host(16);
  p.weight = host.data();  // host memory
  CHECK_THROWS_WITH_AS(gnsilu::group_norm_silu(p), doctest::Contains("'weight'"), gnsilu::Error);
  p.weight = nullptr;
  CHECK_THROWS_WITH_AS(gnsilu::group_norm_silu(p, nullptr, {base + 3 * n, 16}), doctest::Contains("'workspace_bytes'"),
                       gnsilu::Error);
  p.y = base + 4 * n - 100;  // runs past the allocation
  CHECK_THROWS_WITH_AS(gnsilu::group_norm_silu(p), doctest::Contains("allocation"), gnsilu::Error);
  p.x_dtype = DType::FP32;
  p.y = base + 2 * 8;  // partial overlap with a dtype of another size
  CHECK_THROWS_WITH_AS(gnsilu::group_norm_silu(p), doctest::Contains("'y'"), gnsilu::Error);
  device_sync();
  std::vector<unsigned char> after(4 * n);
  buffer.download(after.data());
  CHECK(std::all_of(after.begin(), after.end(), [](unsigned char c) { return c == 0x3C; }));
  CHECK(buffer.guards_intact());
}

TEST_CASE("a tensor of more than 2^31 elements matches the reference in both layouts") {
  const std::vector<int64_t> dims{1, 32, 8192, 8200};  // 2,149,580,800 elements
  const auto n = static_cast<std::size_t>(numel(dims));
  REQUIRE(n > (std::size_t{1} << 31));
  std::size_t free_bytes = 0, total = 0;
  GNSILU_CHECK(drv().cuMemGetInfo_v2(&free_bytes, &total));
  if (free_bytes < 4 * n + (std::size_t{1} << 30)) {
    GNSILU_SKIP_CASE("needs " + std::to_string(4 * n + (std::size_t{1} << 30)) + " bytes of device memory, " +
                     std::to_string(free_bytes) + " free");
  }
  HostTensor x(DType::BF16, n);
  {
    // A cheap fill: a deterministic pattern per element (not zeros), with group-dependent offsets.
    auto* h = reinterpret_cast<uint16_t*>(x.data());
    uint64_t state = 12345;
    for (std::size_t i = 0; i < n; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float v = static_cast<float>(static_cast<int>(state >> 40) - (1 << 23)) * 1.1920929e-7f +
                      static_cast<float>(i / (n / 32)) * 0.25f;
      h[i] = gnsilu::math::float_to_bf16(v);
    }
  }
  HostTensor expected(DType::BF16, n), got(DType::BF16, n);
  DeviceMemory dx(x.bytes.size()), dy(got.bytes.size());
  dx.upload(x.data());
  // The same memory read in both layouts (channels-last: 32 channels of each of the 8192 x 8200 pixels).
  for (Layout layout : {Layout::ChannelsFirst, Layout::ChannelsLast}) {
    gnsilu::Problem p;
    p.x = x.data();
    p.y = expected.data();
    p.shape = dims;
    p.x_layout = p.y_layout = layout;
    const auto started = std::chrono::steady_clock::now();
    gnsilu::reference_group_norm_silu(p);
    MESSAGE(std::string(gnsilu::layout_name(layout)) << ": CPU reference of " << n << " elements: "
                                        << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
                                        << " s");
    p.x = dx.get();
    p.y = dy.get();
    dy.fill(0xFF);
    gnsilu::group_norm_silu(p);
    device_sync();
    dy.download(got.data());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) differ += got.bits(i) != expected.bits(i);
    MESSAGE(std::string(gnsilu::layout_name(layout)) << ": " << n << " elements: " << differ << " differ from the reference");
    CHECK(differ == 0);
    CHECK(dy.guards_intact());
  }
}

namespace {

// The shapes of the tuning tests: Flux VAE decoder GroupNorm inputs (bf16, 32 groups), all above the tuning
// threshold.
const std::vector<std::vector<int64_t>> kFluxShapes = {
    {1, 512, 128, 128}, {1, 512, 256, 256}, {1, 256, 512, 512}, {1, 128, 1024, 1024}};

struct Flux {
  std::vector<int64_t> dims;
  DeviceMemory x, y;
  gnsilu::Problem problem;
  explicit Flux(const std::vector<int64_t>& d, DType dtype = DType::BF16)
      : dims(d), x(static_cast<std::size_t>(numel(d)) * 2), y(static_cast<std::size_t>(numel(d)) * 2) {
    std::vector<uint16_t> host(static_cast<std::size_t>(numel(d)));
    uint64_t state = 99;
    for (auto& h : host) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float v = static_cast<float>(static_cast<int>(state >> 41) - (1 << 22)) * 4.7e-7f;
      h = dtype == DType::BF16 ? gnsilu::math::float_to_bf16(v) : gnsilu::math::float_to_fp16(v);
    }
    x.upload(host.data());
    problem.x = x.get();
    problem.x_dtype = dtype;
    problem.y = y.get();
    problem.y_dtype = dtype;
    problem.shape = dims;
  }
};

std::string temp_cache_path(const char* tag) {
  char pattern[] = "/tmp/gnsilu-gpu-cache-XXXXXX";
  const std::string dir = mkdtemp(pattern);
  return dir + "/" + tag + ".sqlite";
}

// Worker mode of this binary (the many-processes test): resolve every Flux shape once, print what happened.
int worker() {
  for (const auto& d : kFluxShapes) {
    Flux f(d);
    gnsilu::group_norm_silu(f.problem);
  }
  device_sync();
  const auto& c = gnsilu::detail::counters();
  std::printf("tuned=%llu found=%llu defaulted=%llu waited=%llu\n", static_cast<unsigned long long>(c.tuned.load()),
              static_cast<unsigned long long>(c.found_in_cache.load()),
              static_cast<unsigned long long>(c.defaulted.load()),
              static_cast<unsigned long long>(c.waited_for_other_process.load()));
  return 0;
}

}  // namespace

TEST_CASE("tuning on first use: Flux VAE shapes are tuned once, remembered, and change no bits") {
  const std::string path = temp_cache_path("tune");
  gnsilu::set_cache_paths(path);
  gnsilu::detail::clear_config_table();
  auto& counters = gnsilu::detail::counters();
  for (auto [dtype, layout] : {std::pair{DType::BF16, Layout::ChannelsFirst}, std::pair{DType::FP16, Layout::ChannelsFirst},
                               std::pair{DType::BF16, Layout::ChannelsLast}}) {
    for (const auto& d : kFluxShapes) {
      Flux f(d, dtype);
      f.problem.x_layout = f.problem.y_layout = layout;
      const auto tuned = counters.tuned.load();
      gnsilu::group_norm_silu(f.problem);  // tunes this key
      device_sync();
      const bool tuned_now = counters.tuned.load() > tuned;
      std::vector<unsigned char> tuned_out(f.y.size()), default_out(f.y.size());
      f.y.download(tuned_out.data());
      gnsilu::LaunchOptions fixed;
      fixed.config = gnsilu::default_config(gnsilu::Path::Auto);
      f.y.fill(0xFF);
      gnsilu::group_norm_silu(f.problem, nullptr, {}, fixed);
      device_sync();
      f.y.download(default_out.data());
      CHECK(tuned_out == default_out);
      const auto geometry = gnsilu::detail::make_geometry(d, 32, layout);
      const auto& device = gnsilu::detail::device_info(0);
      const auto key = gnsilu::detail::tuning_key(device, geometry, dtype, dtype,
                                                  gnsilu::detail::choose_path(geometry, gnsilu::Path::Auto, device.sms));
      CHECK(key.layout == layout);
      auto entry = gnsilu::cache::process_cache()->find_tuning(key);
      REQUIRE(entry.has_value());
      CHECK(entry->key.layout == layout);
      MESSAGE((std::string(gnsilu::dtype_name(dtype)) + " " + gnsilu::layout_name(layout)) << " " << shape_text({d, 32})
                                        << std::string(tuned_now ? " tuned" : " (key already tuned)")
                                        << " on " << entry->tuned_shape << ": e" << entry->winner.elems_per_load << " w"
                                        << entry->winner.warps << " s" << entry->winner.stages << " p"
                                        << entry->winner.programs_per_sm << ", " << entry->best_us << " us vs default "
                                        << entry->default_us << " us (noise " << entry->noise_us << " us)");
      CHECK(entry->candidates.size() == gnsilu::candidate_configs().size());
    }
  }
  // A new process would find everything in the file: forget the in-memory table and look again.
  gnsilu::detail::clear_config_table();
  const auto tuned = counters.tuned.load(), found = counters.found_in_cache.load();
  for (const auto& d : kFluxShapes) {
    Flux f(d);
    gnsilu::group_norm_silu(f.problem);
  }
  device_sync();
  CHECK(counters.tuned.load() == tuned);
  CHECK(counters.found_in_cache.load() > found);
}

TEST_CASE("policies: cached-only and never do not tune; a call under graph capture does not tune") {
  gnsilu::set_cache_paths(temp_cache_path("policy"));
  gnsilu::detail::clear_config_table();
  auto& counters = gnsilu::detail::counters();
  Flux f(kFluxShapes[1]);
  const auto tuned = counters.tuned.load();
  gnsilu::LaunchOptions o;
  o.tune = gnsilu::TunePolicy::CachedOnly;
  gnsilu::group_norm_silu(f.problem, nullptr, {}, o);
  o.tune = gnsilu::TunePolicy::Never;
  gnsilu::group_norm_silu(f.problem, nullptr, {}, o);
  device_sync();
  CHECK(counters.tuned.load() == tuned);
  gnsilu::set_cache_paths("");
}

TEST_CASE("eight processes started together on one cache file tune each key once") {
  const std::string path = temp_cache_path("eight");
  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  for (int i = 0; i < 8; ++i) {
    outputs.push_back(path + ".out" + std::to_string(i));
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // A fresh process image: this one holds a CUDA context, which a forked child must not use.
      setenv("GNSILU_CACHE", path.c_str(), 1);
      unsetenv("GNSILU_CACHE_SHARED");  // one file under test: a shared file of the environment must not answer
      setenv("GNSILU_TUNE_WAIT_MS", "120000", 1);
      setenv("GNSILU_LOG_LEVEL", "warn", 1);
      if (!std::freopen(outputs.back().c_str(), "w", stdout)) _exit(3);
      execl("/proc/self/exe", "test_gpu", "--worker", static_cast<char*>(nullptr));
      _exit(4);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  CHECK(failed == 0);
  unsigned long long tuned = 0, found = 0, defaulted = 0, waited = 0;
  for (const auto& out : outputs) {
    unsigned long long t = 0, f = 0, d = 0, w = 0;
    FILE* file = std::fopen(out.c_str(), "r");
    REQUIRE(file != nullptr);
    const int read = std::fscanf(file, "tuned=%llu found=%llu defaulted=%llu waited=%llu", &t, &f, &d, &w);
    std::fclose(file);
    CHECK(read == 4);
    tuned += t;
    found += f;
    defaulted += d;
    waited += w;
  }
  MESSAGE("8 processes x " << kFluxShapes.size() << " keys: tuned " << tuned << ", found in the cache " << found
                           << " (after waiting: " << waited << "), defaulted " << defaulted);
  CHECK(tuned == kFluxShapes.size());
  CHECK(found == 7 * kFluxShapes.size());
  CHECK(defaulted == 0);
  gnsilu::cache::Store store(path, gnsilu::cache::Store::Mode::ReadOnly);
  CHECK(store.all_tuning().size() == kFluxShapes.size());
}

REGISTER_LISTENER("case-counter", 1, testing::CaseCounter);

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") {
    try {
      CUdevice device = 0;
      GNSILU_CHECK(drv().cuDeviceGet(&device, 0));
      CUcontext context = nullptr;
      GNSILU_CHECK(drv().cuDevicePrimaryCtxRetain(&context, device));
      GNSILU_CHECK(drv().cuCtxSetCurrent(context));
      return worker();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "worker: %s\n", e.what());
      return 1;
    }
  }
  if (!gpu_present_or_say_why()) return 77;
  try {
    CUdevice device = 0;
    GNSILU_CHECK(drv().cuDeviceGet(&device, 0));
    CUcontext context = nullptr;
    GNSILU_CHECK(drv().cuDevicePrimaryCtxRetain(&context, device));
    GNSILU_CHECK(drv().cuCtxSetCurrent(context));
    const auto& info = gnsilu::detail::device_info(device);
    std::printf("device 0: %s, sm_%d, %d SMs\n", info.name.c_str(), info.arch(), info.sms);
  } catch (const gnsilu::Error& e) {
    std::printf("SKIPPED: %s\n", e.what());
    return 77;
  }
  doctest::Context context(argc, argv);
  return testing::run_cases(context);  // 77 where every case that ran skipped itself (the 2^31 case, memory short)
}

TEST_CASE("regions: group_stats writes the reference's records, and group_norm_apply of their sum gives the whole "
          "call's bits") {
  // The GPU side of tests/api/test_regions.cpp: each region of a random partition of the spatial box, uploaded as a
  // tensor of its own, gives the CPU reference's records word for word (both normalized); their sum applied to the
  // whole tensor gives group_norm_silu's bits, and applied to a region, that region's part of them.
  std::mt19937_64 random(41);
  // The last: groups of 2048 records, merged in parts by finalize (plan.cpp: finalize_parts; forced from 2048), by two
  // launches and by one with atomics.
  const std::vector<std::vector<int64_t>> shapes = {{1, 64, 40, 52}, {2, 32, 3, 24, 20}, {1, 128, 33, 31},
                                                    {1, 8, 2048, 1024}};
  std::size_t regions = 0, differ = 0;
  for (const bool atomic : {false, true}) {
    const ForcedParts forced(2048, atomic);
    for (const auto& dims : shapes) {
      const Extent e = extent_of(dims);
      const int64_t groups = 8;
      for (DType xd : kTypes) {
        for (bool last : {false, true}) {
          HostTensor x = make_input(xd, static_cast<std::size_t>(numel(dims)), static_cast<std::size_t>(e.c / groups * e.s),
                                    Data::WideRange, 43 + regions);
          if (last) x = relayout(x, e.n, e.c, e.s, true);
          const Layout layout = last ? Layout::ChannelsLast : Layout::ChannelsFirst;
          gnsilu::Problem p;
          p.x = x.data();
          p.x_dtype = xd;
          p.shape = dims;
          p.num_groups = groups;
          p.x_layout = p.y_layout = layout;
          HostTensor whole(DType::BF16, x.size());
          p.y = whole.data();
          gnsilu::reference_group_norm_silu(p);
          // Regions: slabs along the outermost spatial dimension, cut at random places (some empty).
          const int64_t outer = dims[2], inner = e.s / dims[2];
          std::vector<int64_t> cuts{0, outer};
          for (int k = 0; k < 3; ++k) cuts.push_back(static_cast<int64_t>(random() % (outer + 1)));
          std::sort(cuts.begin(), cuts.end());
          const std::size_t size = gnsilu::dtype_size(xd);
          std::vector<int64_t> merged(static_cast<std::size_t>(e.n * groups * gnsilu::kStatsWords), 0);
          struct Part {
            std::vector<int64_t> shape;
            HostTensor x;
            int64_t first, count;
          };
          std::vector<Part> parts;
          for (std::size_t r = 0; r + 1 < cuts.size(); ++r) {
            Part part{dims, HostTensor(xd, 0), cuts[r], cuts[r + 1] - cuts[r]};
            part.shape[2] = part.count;
            const int64_t ps = part.count * inner;
            part.x = HostTensor(xd, static_cast<std::size_t>(e.n * e.c * ps));
            for (int64_t n = 0; n < e.n; ++n) {
              for (int64_t c = 0; c < e.c; ++c) {
                for (int64_t q = 0; q < ps; ++q) {
                  const int64_t from_pixel = part.first * inner + q;
                  const std::size_t to = static_cast<std::size_t>(last ? (n * ps + q) * e.c + c : (n * e.c + c) * ps + q);
                  const std::size_t from =
                      static_cast<std::size_t>(last ? (n * e.s + from_pixel) * e.c + c : (n * e.c + c) * e.s + from_pixel);
                  std::memcpy(part.x.bytes.data() + to * size, x.bytes.data() + from * size, size);
                }
              }
            }
            gnsilu::Problem rp = p;
            rp.x = part.x.data();
            rp.shape = part.shape;
            rp.y = nullptr;
            std::vector<int64_t> expected(merged.size()), got(merged.size());
            gnsilu::reference_group_stats(rp, expected.data());
            DeviceMemory dstats(merged.size() * sizeof(int64_t));
            std::unique_ptr<DeviceMemory> dx;
            if (ps != 0) {
              dx = std::make_unique<DeviceMemory>(part.x.bytes.size());
              dx->upload(part.x.data());
            }
            rp.x = dx ? dx->get() : nullptr;
            gnsilu::group_stats(rp, static_cast<int64_t*>(dstats.get()));
            device_sync();
            dstats.download(got.data());
            ++regions;
            if (got != expected || !dstats.guards_intact()) {
              ++differ;
              FAIL_CHECK(shape_text(Shape{part.shape, groups}) << " " << gnsilu::dtype_name(xd) << (last ? " nhwc" : " nchw")
                                                              << (atomic ? ", one launch with atomics" : "")
                                                            << ": the records differ from the reference's");
            }
            for (std::size_t i = 0; i < merged.size(); ++i) merged[i] += got[i];
            parts.push_back(std::move(part));
          }
          DeviceMemory dmerged(merged.size() * sizeof(int64_t)), dx(x.bytes.size()), dy(whole.bytes.size());
          dmerged.upload(merged.data());
          dx.upload(x.data());
          gnsilu::Problem ap = p;
          ap.x = dx.get();
          ap.y = dy.get();
          gnsilu::group_norm_apply(ap, static_cast<const int64_t*>(dmerged.get()));
          device_sync();
          HostTensor got(DType::BF16, x.size());
          dy.download(got.data());
          if (got.bytes != whole.bytes || !dy.guards_intact()) {
            ++differ;
            FAIL_CHECK(shape_text(Shape{dims, groups}) << " " << gnsilu::dtype_name(xd)
                                                      << (atomic ? ", one launch with atomics" : "")
                                                    << ": apply of the merged records differs from the whole call");
          }
          // The first non-empty region normalized with the merged records: its slab of the whole output.
          for (const Part& part : parts) {
            if (part.count == 0) continue;
            DeviceMemory px(part.x.bytes.size()), py(part.x.size() * 2);
            px.upload(part.x.data());
            gnsilu::Problem pp = p;
            pp.x = px.get();
            pp.y = py.get();
            pp.shape = part.shape;
            gnsilu::group_norm_apply(pp, static_cast<const int64_t*>(dmerged.get()));
            device_sync();
            HostTensor part_y(DType::BF16, part.x.size()), expected_y(DType::BF16, part.x.size());
            py.download(part_y.data());
            gnsilu::Problem rp = pp;
            rp.x = part.x.data();
            rp.y = expected_y.data();
            gnsilu::reference_group_norm_apply(rp, merged.data());
            CHECK(part_y.bytes == expected_y.bytes);
            break;
          }
        }
      }
    }
  }
  MESSAGE(regions << " regions: " << regions - differ << " with the reference's records");
  CHECK(differ == 0);
}
