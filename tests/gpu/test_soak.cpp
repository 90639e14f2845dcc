// Soak (label "gpu"): GNSILU_SOAK_CALLS (default 100,000) calls with random shapes, dtype pairs, affine
// parameters and streams; every 1,000th output checked bit for bit against the CPU reference; host memory
// (resident set) and free device memory compared between the end of the warm-up and the end. Exits 77 without
// a GPU. Tuning is off (set_tune_policy): the soak exercises the call path, not the tuner. Prints one summary line and exits 1 on any mismatch, error or growth.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/driver.hpp"
#include "base/errors.hpp"
#include "skip.hpp"
#include "support.hpp"

using namespace testing;
using gnsilu::DType;

namespace {

const gnsilu::detail::Driver& drv() { return gnsilu::detail::driver(); }

constexpr std::size_t kMaxElements = std::size_t{1} << 20;
constexpr int kStreams = 4;
constexpr DType kTypes[] = {DType::BF16, DType::FP16, DType::FP32};

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

std::size_t free_device_bytes() {
  std::size_t free_bytes = 0, total = 0;
  GNSILU_CHECK(drv().cuMemGetInfo_v2(&free_bytes, &total));
  return free_bytes;
}

struct DeviceArray {
  CUdeviceptr p = 0;
  explicit DeviceArray(std::size_t bytes) { GNSILU_CHECK(drv().cuMemAlloc_v2(&p, bytes)); }
  ~DeviceArray() { drv().cuMemFree_v2(p); }
  void* get() const { return reinterpret_cast<void*>(p); }
};

struct Call {
  std::vector<int64_t> shape;
  int64_t groups = 1;
  DType x = DType::BF16, y = DType::BF16, w = DType::None, b = DType::None;
  int stream = 0;
};

Call random_call(std::mt19937_64& rng) {
  static const int64_t channels[] = {8, 32, 64, 96, 128, 256, 512};
  static const int64_t groups[] = {1, 2, 8, 16, 32};
  Call c;
  const int64_t n = std::uniform_int_distribution<int64_t>(1, 4)(rng);
  const int64_t ch = channels[rng() % 7];
  do c.groups = groups[rng() % 5]; while (ch % c.groups != 0);
  const int dims = static_cast<int>(rng() % 4);  // 0 to 3 spatial dimensions
  c.shape = {n, ch};
  int64_t total = n * ch;
  for (int d = 0; d < dims; ++d) {
    const int64_t limit = std::max<int64_t>(1, std::min<int64_t>(96, static_cast<int64_t>(kMaxElements) / total));
    const int64_t size = std::uniform_int_distribution<int64_t>(1, limit)(rng);
    c.shape.push_back(size);
    total *= size;
  }
  c.x = kTypes[rng() % 3];
  c.y = kTypes[rng() % 3];
  const DType params[] = {DType::None, DType::BF16, DType::FP16, DType::FP32};
  c.w = params[rng() % 4];
  c.b = params[rng() % 4];
  c.stream = static_cast<int>(rng() % kStreams);
  return c;
}

}  // namespace

int main() {
  if (!gpu_present_or_say_why()) return 77;
  const char* env = std::getenv("GNSILU_SOAK_CALLS");
  const long calls = env != nullptr ? std::atol(env) : 100000;
  try {
    // The default configurations only: a tuned winner would load another module mid-run (device memory).
    gnsilu::set_tune_policy(gnsilu::TunePolicy::Never);
    CUdevice dev = 0;
    GNSILU_CHECK(drv().cuDeviceGet(&dev, 0));
    CUcontext ctx = nullptr;
    GNSILU_CHECK(drv().cuDevicePrimaryCtxRetain(&ctx, dev));
    GNSILU_CHECK(drv().cuCtxSetCurrent(ctx));

    // Inputs: one x per dtype (host copies kept for the reference), weight and bias per dtype, y per stream.
    std::vector<HostTensor> host_x, host_w, host_b;
    std::vector<std::unique_ptr<DeviceArray>> dev_x, dev_w, dev_b, dev_y;
    for (int t = 0; t < 3; ++t) {
      host_x.push_back(make_input(kTypes[t], kMaxElements, 4096, Data::Normal, 100 + static_cast<uint64_t>(t)));
      host_w.push_back(make_parameter(kTypes[t], 512, 200 + static_cast<uint64_t>(t), 1.0f, 0.3f));
      host_b.push_back(make_parameter(kTypes[t], 512, 300 + static_cast<uint64_t>(t), 0.0f, 0.2f));
      for (auto* pair : {&host_x, &host_w, &host_b}) {
        auto& vec = pair == &host_x ? dev_x : pair == &host_w ? dev_w : dev_b;
        const HostTensor& h = pair->back();
        vec.push_back(std::make_unique<DeviceArray>(h.bytes.size()));
        GNSILU_CHECK(drv().cuMemcpyHtoD_v2(vec.back()->p, h.data(), h.bytes.size()));
      }
    }
    std::vector<CUstream> streams(kStreams);
    for (auto& s : streams) {
      GNSILU_CHECK(drv().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
      dev_y.push_back(std::make_unique<DeviceArray>(kMaxElements * 4));
    }
    auto index = [](DType d) { return d == DType::BF16 ? 0 : d == DType::FP16 ? 1 : 2; };
    auto problem_of = [&](const Call& c) {
      gnsilu::Problem p;
      p.x = dev_x[static_cast<std::size_t>(index(c.x))]->get();
      p.x_dtype = c.x;
      p.y = dev_y[static_cast<std::size_t>(c.stream)]->get();
      p.y_dtype = c.y;
      p.shape = c.shape;
      p.num_groups = c.groups;
      if (c.w != DType::None) p.weight = dev_w[static_cast<std::size_t>(index(c.w))]->get(), p.weight_dtype = c.w;
      if (c.b != DType::None) p.bias = dev_b[static_cast<std::size_t>(index(c.b))]->get(), p.bias_dtype = c.b;
      return p;
    };

    // Warm-up: every dtype pair on every stream, with the largest workspace, so that modules and workspaces exist.
    for (int s = 0; s < kStreams; ++s) {
      for (DType x : kTypes) {
        for (DType y : kTypes) {
          Call c;
          c.shape = {4, 512, 512};  // 1 Mi elements, 128 groups: the most workspace a soak call needs
          c.groups = 32;
          c.x = x;
          c.y = y;
          c.stream = s;
          gnsilu::group_norm_silu(problem_of(c), streams[static_cast<std::size_t>(s)]);
          c.shape = {1, 64, 8, 8};  // and the fused path
          gnsilu::group_norm_silu(problem_of(c), streams[static_cast<std::size_t>(s)]);
        }
      }
    }
    GNSILU_CHECK(drv().cuCtxSynchronize());

    std::mt19937_64 rng(20261129);
    long checked = 0, mismatched = 0;
    std::size_t rss_start = 0, device_start = 0;
    const auto started = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) {
      const Call c = random_call(rng);
      gnsilu::group_norm_silu(problem_of(c), streams[static_cast<std::size_t>(c.stream)]);
      if (i == 1000) {  // after the first check: the host side is warm too
        GNSILU_CHECK(drv().cuCtxSynchronize());
        rss_start = resident_bytes();
        device_start = free_device_bytes();
      }
      if (i % 1000 == 999) {
        GNSILU_CHECK(drv().cuStreamSynchronize(streams[static_cast<std::size_t>(c.stream)]));
        std::size_t n = 1;
        for (auto d : c.shape) n *= static_cast<std::size_t>(d);
        HostTensor got(c.y, n), expected(c.y, n);
        GNSILU_CHECK(drv().cuMemcpyDtoH_v2(got.data(), dev_y[static_cast<std::size_t>(c.stream)]->p, got.bytes.size()));
        gnsilu::Problem p = problem_of(c);
        p.x = host_x[static_cast<std::size_t>(index(c.x))].data();
        p.y = expected.data();
        if (p.weight) p.weight = host_w[static_cast<std::size_t>(index(c.w))].data();
        if (p.bias) p.bias = host_b[static_cast<std::size_t>(index(c.b))].data();
        gnsilu::reference_group_norm_silu(p);
        ++checked;
        if (got.bytes != expected.bytes) {
          ++mismatched;
          std::string shape;
          for (auto d : c.shape) shape += std::to_string(d) + " ";
          std::printf("MISMATCH at call %ld: shape %sG=%lld %s>%s\n", i, shape.c_str(),
                      static_cast<long long>(c.groups), gnsilu::dtype_name(c.x), gnsilu::dtype_name(c.y));
        }
      }
    }
    GNSILU_CHECK(drv().cuCtxSynchronize());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const std::size_t rss_end = resident_bytes(), device_end = free_device_bytes();
    const long long rss_growth = static_cast<long long>(rss_end) - static_cast<long long>(rss_start);
    const long long device_growth = static_cast<long long>(device_start) - static_cast<long long>(device_end);
    std::printf("soak: %ld calls on %d streams in %.1f s, %ld checked against the CPU reference, %ld mismatched; "
                "host resident %.1f -> %.1f MiB (%+lld bytes), device memory in use %+lld bytes\n",
                calls, kStreams, seconds, checked, mismatched, rss_start / 1048576.0, rss_end / 1048576.0, rss_growth,
                device_growth);
    for (auto s : streams) drv().cuStreamDestroy_v2(s);
    // Flat: no device memory taken after the warm-up; the resident set within 8 MiB (allocator noise).
    const bool ok = mismatched == 0 && checked == calls / 1000 && device_growth == 0 && rss_growth < (8ll << 20);
    std::printf("%s\n", ok ? "PASSED" : "FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
}
