// System tests (label "gpu"): host threads on their own streams, one untuned key hit by several threads at
// once, an application's own contexts (one destroyed and replaced), several GPUs in one process, ranks on
// separate GPUs sharing one cache file, and resource faults (NVRTC failing, a launch failing, device memory
// exhausted for the workspace and for tuning). Exits 77 (ctest: skipped) without a usable driver and device;
// the multi-GPU cases say plainly when the machine has one GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.hpp"
#include "tuning/config_table.hpp"
#include "base/device.hpp"
#include "base/driver.hpp"
#include "base/errors.hpp"
#include "base/faults.hpp"
#include "runtime/modules.hpp"
#include "cache/store.hpp"
#include "skip.hpp"
#include "skip_case.hpp"
#include "support.hpp"

using namespace testing;
using gnsilu::DType;

namespace {

const gnsilu::detail::Driver& drv() { return gnsilu::detail::driver(); }

int device_count() {
  int n = 0;
  GNSILU_CHECK(drv().cuDeviceGetCount(&n));
  return n;
}

CUcontext primary(int ordinal) {
  CUdevice dev = 0;
  GNSILU_CHECK(drv().cuDeviceGet(&dev, ordinal));
  CUcontext ctx = nullptr;
  GNSILU_CHECK(drv().cuDevicePrimaryCtxRetain(&ctx, dev));
  return ctx;
}

// Device memory in the context current at construction (freed in that context).
class Buffer {
 public:
  explicit Buffer(std::size_t bytes) : bytes_(bytes) {
    GNSILU_CHECK(drv().cuCtxGetCurrent(&context_));
    GNSILU_CHECK(drv().cuMemAlloc_v2(&ptr_, std::max<std::size_t>(bytes, 1)));
  }
  ~Buffer() {
    if (ptr_ != 0 && drv().cuCtxPushCurrent_v2(context_) == CUDA_SUCCESS) {
      drv().cuMemFree_v2(ptr_);
      CUcontext popped = nullptr;
      drv().cuCtxPopCurrent_v2(&popped);
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr_); }
  void upload(const void* data) { GNSILU_CHECK(drv().cuMemcpyHtoD_v2(ptr_, data, bytes_)); }
  void fill(unsigned char v) { GNSILU_CHECK(drv().cuMemsetD8_v2(ptr_, v, bytes_)); }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(bytes_);
    GNSILU_CHECK(drv().cuMemcpyDtoH_v2(out.data(), ptr_, bytes_));
    return out;
  }

 private:
  CUcontext context_ = nullptr;
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

int64_t numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

// One problem with host inputs and the CPU reference's output bits.
struct Case {
  std::vector<int64_t> dims;
  int64_t groups;
  DType x_dtype, y_dtype;
  HostTensor x, weight, bias, expected;

  Case(std::vector<int64_t> d, int64_t g, DType xd, DType yd, uint64_t seed) : dims(std::move(d)), groups(g), x_dtype(xd), y_dtype(yd) {
    const auto n = static_cast<std::size_t>(numel(dims));
    x = make_input(xd, n, n / static_cast<std::size_t>(dims[0] * groups), Data::Normal, seed);
    weight = make_parameter(DType::FP32, static_cast<std::size_t>(dims[1]), seed + 1, 1.0f, 0.2f);
    bias = make_parameter(DType::FP32, static_cast<std::size_t>(dims[1]), seed + 2, 0.0f, 0.1f);
    expected = HostTensor(yd, n);
    gnsilu::Problem p = problem(x.data(), expected.data(), weight.data(), bias.data());
    gnsilu::reference_group_norm_silu(p);
  }
  gnsilu::Problem problem(const void* px, void* py, const void* pw, const void* pb) const {
    gnsilu::Problem p;
    p.x = px;
    p.x_dtype = x_dtype;
    p.y = py;
    p.y_dtype = y_dtype;
    p.shape = dims;
    p.num_groups = groups;
    p.weight = pw;
    p.bias = pb;
    return p;
  }
  std::size_t y_bytes() const { return expected.bytes.size(); }
  std::string text() const {
    std::string s = gnsilu::cache::TunedShape{dims, groups}.text() + " ";
    s += gnsilu::dtype_name(x_dtype);
    s += '>';
    s += gnsilu::dtype_name(y_dtype);
    return s;
  }
};

// A case's inputs on the device of the current context.
struct OnDevice {
  Buffer x, weight, bias;
  explicit OnDevice(const Case& c) : x(c.x.bytes.size()), weight(c.weight.bytes.size()), bias(c.bias.bytes.size()) {
    x.upload(c.x.data());
    weight.upload(c.weight.data());
    bias.upload(c.bias.data());
  }
  gnsilu::Problem problem(const Case& c, const Buffer& y) const {
    return c.problem(x.get(), y.get(), weight.get(), bias.get());
  }
};

std::string temp_dir() {
  char pattern[] = "/tmp/gnsilu-system-XXXXXX";
  return mkdtemp(pattern);
}

struct Stream {
  CUstream s = nullptr;
  Stream() { GNSILU_CHECK(drv().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)); }
  ~Stream() { drv().cuStreamDestroy_v2(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void sync() const { GNSILU_CHECK(drv().cuStreamSynchronize(s)); }
};

std::vector<Case> mixed_cases() {
  std::vector<Case> cases;
  cases.emplace_back(std::vector<int64_t>{1, 64, 32, 32}, 32, DType::BF16, DType::BF16, 1);    // fused
  cases.emplace_back(std::vector<int64_t>{2, 128, 48, 48}, 32, DType::FP16, DType::FP16, 2);   // fused, N = 2
  cases.emplace_back(std::vector<int64_t>{1, 32, 256, 256}, 8, DType::BF16, DType::FP32, 3);   // split
  cases.emplace_back(std::vector<int64_t>{1, 96, 17, 19}, 32, DType::FP32, DType::BF16, 4);    // no vectors
  cases.emplace_back(std::vector<int64_t>{1, 512, 64, 64}, 32, DType::FP16, DType::FP16, 5);   // 8 MiB: tunes
  return cases;
}

// How many of `cases` are large enough to be tuned on first use (GNSILU_TUNE_MIN_BYTES' default, 8 MiB of x
// and y); the mixed cases have one key each.
std::size_t tunable(const std::vector<Case>& cases) {
  std::size_t n = 0;
  for (const auto& c : cases) {
    n += static_cast<std::size_t>(numel(c.dims)) * (gnsilu::dtype_size(c.x_dtype) + gnsilu::dtype_size(c.y_dtype)) >=
         (std::size_t{8} << 20);
  }
  return n;
}

// The flux-sized keys of the ranks test (all above the tuning threshold).
const std::vector<std::vector<int64_t>> kRankShapes = {{1, 512, 128, 128}, {1, 256, 256, 256}, {1, 128, 512, 512}};

// Rank mode of this binary: on device rank % count, run every rank shape once, print what happened.
int rank_main(int rank) {
  const int count = device_count();
  const int ordinal = rank % count;
  GNSILU_CHECK(drv().cuCtxSetCurrent(primary(ordinal)));
  std::vector<std::unique_ptr<Buffer>> keep;
  for (const auto& d : kRankShapes) {
    const auto n = static_cast<std::size_t>(numel(d));
    auto x = std::make_unique<Buffer>(2 * n), y = std::make_unique<Buffer>(2 * n);
    x->fill(0x3C);
    gnsilu::Problem p;
    p.x = x->get();
    p.y = y->get();
    p.shape = d;
    gnsilu::group_norm_silu(p);
    keep.push_back(std::move(x));
    keep.push_back(std::move(y));
  }
  GNSILU_CHECK(drv().cuCtxSynchronize());
  const auto& c = gnsilu::detail::counters();
  std::printf("device=%d tuned=%llu found=%llu defaulted=%llu\n", ordinal,
              static_cast<unsigned long long>(c.tuned.load()), static_cast<unsigned long long>(c.found_in_cache.load()),
              static_cast<unsigned long long>(c.defaulted.load()));
  return 0;
}

// A hog of device memory: everything but `leave` bytes of what is free now (released on destruction).
struct MemoryHog {
  std::vector<std::unique_ptr<Buffer>> blocks;
  explicit MemoryHog(std::size_t leave) {
    std::size_t free_bytes = 0, total = 0;
    GNSILU_CHECK(drv().cuMemGetInfo_v2(&free_bytes, &total));
    for (std::size_t chunk = std::size_t{1} << 30; chunk >= 4096; chunk /= 4) {
      for (;;) {
        GNSILU_CHECK(drv().cuMemGetInfo_v2(&free_bytes, &total));
        if (free_bytes < leave + chunk) break;
        CUdeviceptr probe = 0;
        if (drv().cuMemAlloc_v2(&probe, chunk) != CUDA_SUCCESS) break;
        drv().cuMemFree_v2(probe);
        blocks.push_back(std::make_unique<Buffer>(chunk));
      }
    }
  }
  std::size_t free_now() const {
    std::size_t free_bytes = 0, total = 0;
    GNSILU_CHECK(drv().cuMemGetInfo_v2(&free_bytes, &total));
    return free_bytes;
  }
};

}  // namespace

TEST_CASE("resource faults: NVRTC failing, a launch failing, no memory for the workspace or for tuning") {
  GNSILU_CHECK(drv().cuCtxSetCurrent(primary(0)));
  gnsilu::set_cache_paths("");  // memory only: every new variant needs NVRTC
  gnsilu::detail::clear_config_table();
  const Case c({1, 64, 40, 40}, 16, DType::FP32, DType::FP16, 11);
  OnDevice in(c);
  Buffer y(c.y_bytes());
  gnsilu::LaunchOptions unusual;  // a variant no other test compiles
  unusual.config = gnsilu::LaunchConfig{8, 2, 2, 3};
  unusual.path = gnsilu::Path::Split;

  SUBCASE("NVRTC fails: CompileError with NVRTC's log, nothing written, the next call compiles") {
    y.fill(0xAB);
    gnsilu::detail::inject_fault(gnsilu::detail::Fault::Compile, 1);
    try {
      gnsilu::group_norm_silu(in.problem(c, y), nullptr, {}, unusual);
      FAIL("no error");
    } catch (const gnsilu::CompileError& e) {
      CHECK(std::string(e.what()).find("NVRTC") != std::string::npos);
      CHECK(e.log().find("gnsilu-injected-fault") != std::string::npos);
      MESSAGE("compile error as reported: " << std::string(e.what()).substr(0, 160));
    }
    const auto untouched = y.download();
    CHECK(std::all_of(untouched.begin(), untouched.end(), [](unsigned char b) { return b == 0xAB; }));
    gnsilu::group_norm_silu(in.problem(c, y), nullptr, {}, unusual);
    GNSILU_CHECK(drv().cuCtxSynchronize());
    CHECK(y.download() == c.expected.bytes);
  }
  SUBCASE("the C API reports NVRTC failing as GNSILU_ERROR_COMPILE") {
    gnsilu::detail::inject_fault(gnsilu::detail::Fault::Compile, 1);
    const int64_t shape[] = {1, 64, 40, 40};
    // Another unusual variant, through the library's own configuration (the C API has no config argument):
    // the default configuration of a dtype pair not compiled yet in this process.
    Buffer y32(static_cast<std::size_t>(numel(c.dims)) * 4);
    const gnsilu_status s = gnsilu_group_norm_silu(in.x.get(), GNSILU_FP32, y32.get(), GNSILU_FP32, shape, 4, 16,
                                                   nullptr, GNSILU_NONE, nullptr, GNSILU_NONE, 1e-6, nullptr, 0, nullptr);
    CHECK(s == GNSILU_ERROR_COMPILE);
    CHECK(std::string(gnsilu_last_error()).find("NVRTC") != std::string::npos);
    gnsilu::detail::inject_fault(gnsilu::detail::Fault::Compile, 0);
  }
  SUBCASE("a launch fails: CudaError naming cuLaunchKernel, then calls work again") {
    gnsilu::detail::inject_fault(gnsilu::detail::Fault::Launch, 1);
    try {
      gnsilu::group_norm_silu(in.problem(c, y), nullptr, {}, unusual);
      FAIL("no error");
    } catch (const gnsilu::CudaError& e) {
      CHECK(e.result() == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
      CHECK(std::string(e.what()).find("cuLaunchKernel") != std::string::npos);
    }
    gnsilu::group_norm_silu(in.problem(c, y), nullptr, {}, unusual);
    GNSILU_CHECK(drv().cuCtxSynchronize());
    CHECK(y.download() == c.expected.bytes);
  }
  SUBCASE("launches failing while tuning: the tuner falls back, the call gives the right bits") {
    const Case big({1, 512, 64, 64}, 32, DType::BF16, DType::BF16, 12);
    OnDevice bin(big);
    Buffer by(big.y_bytes());
    gnsilu::set_cache_paths(temp_dir() + "/faults.sqlite");
    gnsilu::detail::clear_config_table();
    gnsilu::detail::inject_fault(gnsilu::detail::Fault::Launch, 1);  // the tuner's first launch
    gnsilu::group_norm_silu(bin.problem(big, by));
    gnsilu::detail::inject_fault(gnsilu::detail::Fault::Launch, 0);
    GNSILU_CHECK(drv().cuCtxSynchronize());
    CHECK(by.download() == big.expected.bytes);
    gnsilu::set_cache_paths("");
  }
  SUBCASE("no device memory for a new stream's workspace: OutOfMemory, nothing written; then it works") {
    gnsilu::group_norm_silu(in.problem(c, y), nullptr, {}, unusual);  // kernels loaded before memory runs out
    GNSILU_CHECK(drv().cuCtxSynchronize());
    Stream fresh;
    y.fill(0xCD);
    {
      MemoryHog hog(0);
      MESSAGE("device memory left free: " << hog.free_now() << " bytes");
      try {
        gnsilu::group_norm_silu(in.problem(c, y), fresh.s, {}, unusual);
        fresh.sync();
        MESSAGE("the workspace still fitted in what was left");
      } catch (const gnsilu::Error& e) {
        CHECK(e.status() == gnsilu::Status::OutOfMemory);
        MESSAGE("as reported: " << std::string(e.what()));
        const auto untouched = y.download();
        CHECK(std::all_of(untouched.begin(), untouched.end(), [](unsigned char b) { return b == 0xCD; }));
      }
    }
    gnsilu::group_norm_silu(in.problem(c, y), fresh.s, {}, unusual);
    fresh.sync();
    CHECK(y.download() == c.expected.bytes);
  }
  SUBCASE("too little device memory to tune: the default configuration, the right bits") {
    const std::vector<int64_t> dims{1, 32, 1024, 1024};  // one group of 32 Mi elements: 128 MiB to tune
    const auto n = static_cast<std::size_t>(numel(dims));
    Buffer x(2 * n), y1(2 * n), y2(2 * n);
    std::vector<uint16_t> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = gnsilu::math::float_to_bf16(static_cast<float>(i % 1013) * 0.01f - 5.0f);
    x.upload(host.data());
    gnsilu::Problem p;
    p.x = x.get();
    p.shape = dims;
    p.num_groups = 1;
    p.y = y1.get();
    gnsilu::LaunchOptions fixed;
    fixed.config = gnsilu::default_config(gnsilu::Path::Split);
    gnsilu::group_norm_silu(p, nullptr, {}, fixed);
    GNSILU_CHECK(drv().cuCtxSynchronize());
    gnsilu::set_cache_paths(temp_dir() + "/oom.sqlite");
    gnsilu::detail::clear_config_table();
    const auto defaulted = gnsilu::detail::counters().defaulted.load();
    {
      MemoryHog hog(std::size_t{48} << 20);
      p.y = y2.get();
      gnsilu::group_norm_silu(p);
      GNSILU_CHECK(drv().cuCtxSynchronize());
    }
    CHECK(gnsilu::detail::counters().defaulted.load() == defaulted + 1);
    CHECK(y2.download() == y1.download());
    gnsilu::set_cache_paths("");
  }
}

TEST_CASE("eight host threads on their own streams get the single-threaded bits, tuning included") {
  GNSILU_CHECK(drv().cuCtxSetCurrent(primary(0)));
  gnsilu::set_cache_paths(temp_dir() + "/threads.sqlite");
  gnsilu::detail::clear_config_table();
  const std::vector<Case> cases = mixed_cases();
  std::vector<std::unique_ptr<OnDevice>> inputs;
  for (const auto& c : cases) inputs.push_back(std::make_unique<OnDevice>(c));
  const CUcontext ctx = primary(0);
  const auto tuned = gnsilu::detail::counters().tuned.load();
  std::atomic<int> mismatches{0}, calls{0};
  std::mutex errors_mutex;
  std::vector<std::string> errors;
  std::latch start(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      try {
        GNSILU_CHECK(drv().cuCtxSetCurrent(ctx));
        Stream stream;
        std::vector<std::unique_ptr<Buffer>> ys;
        for (const auto& c : cases) ys.push_back(std::make_unique<Buffer>(c.y_bytes()));
        start.arrive_and_wait();
        for (int round = 0; round < 20; ++round) {
          for (std::size_t k = 0; k < cases.size(); ++k) {
            const std::size_t i = (k + static_cast<std::size_t>(t)) % cases.size();
            ys[i]->fill(0);
            gnsilu::group_norm_silu(inputs[i]->problem(cases[i], *ys[i]), stream.s);
            calls++;
          }
          stream.sync();
          for (std::size_t i = 0; i < cases.size(); ++i) mismatches += ys[i]->download() != cases[i].expected.bytes;
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(errors_mutex);
        errors.push_back(e.what());
      }
    });
  }
  for (auto& th : threads) th.join();
  MESSAGE(calls.load() << " calls from 8 threads on 8 streams, " << mismatches.load() << " outputs differ");
  for (const auto& e : errors) MESSAGE("error: " << e);
  CHECK(errors.empty());
  CHECK(mismatches.load() == 0);
  CHECK(calls.load() == 8 * 20 * static_cast<int>(cases.size()));
  CHECK(gnsilu::detail::counters().tuned.load() - tuned == tunable(cases));  // once per key, not per thread
  gnsilu::set_cache_paths("");
}

TEST_CASE("four threads hitting the same untuned key at once tune it once") {
  GNSILU_CHECK(drv().cuCtxSetCurrent(primary(0)));
  gnsilu::set_cache_paths(temp_dir() + "/same-key.sqlite");
  gnsilu::detail::clear_config_table();
  const Case c({1, 256, 128, 128}, 32, DType::BF16, DType::BF16, 21);
  OnDevice in(c);
  const CUcontext ctx = primary(0);
  const auto tuned = gnsilu::detail::counters().tuned.load();
  std::atomic<int> mismatches{0}, failures{0};
  std::latch start(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      try {
        GNSILU_CHECK(drv().cuCtxSetCurrent(ctx));
        Stream stream;
        Buffer y(c.y_bytes());
        start.arrive_and_wait();
        gnsilu::group_norm_silu(in.problem(c, y), stream.s);
        stream.sync();
        mismatches += y.download() != c.expected.bytes;
      } catch (const std::exception&) {
        failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  CHECK(mismatches.load() == 0);
  CHECK(gnsilu::detail::counters().tuned.load() == tuned + 1);
  gnsilu::set_cache_paths("");
}

TEST_CASE("an application's own context is used, and a destroyed one replaced by another is handled") {
  using CreateV4 = CUresult (*)(CUcontext*, void*, unsigned, CUdevice);
  using Destroy = CUresult (*)(CUcontext);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
  REQUIRE(lib != nullptr);
  auto create = reinterpret_cast<CreateV4>(dlsym(lib, "cuCtxCreate_v4"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(lib, "cuCtxDestroy_v2"));
  REQUIRE(reinterpret_cast<void*>(create) != nullptr);
  REQUIRE(reinterpret_cast<void*>(destroy) != nullptr);
  const std::vector<Case> cases = mixed_cases();
  CUdevice dev = 0;
  GNSILU_CHECK(drv().cuDeviceGet(&dev, 0));
  std::vector<CUcontext> seen;
  for (int round = 0; round < 3; ++round) {
    CUcontext ctx = nullptr;
    GNSILU_CHECK(create(&ctx, nullptr, 0, dev));  // current on this thread from now on
    seen.push_back(ctx);
    {
      Stream stream;
      for (const auto& c : cases) {
        OnDevice in(c);
        Buffer y(c.y_bytes());
        gnsilu::group_norm_silu(in.problem(c, y));  // the context's legacy stream
        GNSILU_CHECK(drv().cuCtxSynchronize());
        CHECK_MESSAGE(y.download() == c.expected.bytes, c.text() << " in context " << round);
        y.fill(0);
        gnsilu::group_norm_silu(in.problem(c, y), stream.s);
        stream.sync();
        CHECK_MESSAGE(y.download() == c.expected.bytes, c.text() << " on a stream of context " << round);
      }
    }
    GNSILU_CHECK(destroy(ctx));
  }
  MESSAGE("contexts created: " << seen.size() << ", handles reused: " << std::string(seen[0] == seen[1] || seen[1] == seen[2] ? "yes" : "no"));
  GNSILU_CHECK(drv().cuCtxSetCurrent(primary(0)));
}

TEST_CASE("two GPUs in one process: interleaved calls from four threads give one GPU's bits") {
  const int count = device_count();
  if (count < 2) GNSILU_SKIP_CASE("the machine has " + std::to_string(count) + " GPU; several GPUs are needed");
  gnsilu::set_cache_paths(temp_dir() + "/two-gpus.sqlite");
  gnsilu::detail::clear_config_table();
  const std::vector<Case> cases = mixed_cases();
  const CUcontext ctx[2] = {primary(0), primary(1)};
  std::vector<std::unique_ptr<OnDevice>> inputs[2];
  for (int d = 0; d < 2; ++d) {
    GNSILU_CHECK(drv().cuCtxSetCurrent(ctx[d]));
    for (const auto& c : cases) inputs[d].push_back(std::make_unique<OnDevice>(c));
  }
  const auto tuned = gnsilu::detail::counters().tuned.load();
  std::atomic<int> mismatches{0}, calls{0};
  std::mutex errors_mutex;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      try {
        std::unique_ptr<Stream> streams[2];
        std::vector<std::unique_ptr<Buffer>> ys[2];
        for (int d = 0; d < 2; ++d) {
          GNSILU_CHECK(drv().cuCtxSetCurrent(ctx[d]));
          streams[d] = std::make_unique<Stream>();
          for (const auto& c : cases) ys[d].push_back(std::make_unique<Buffer>(c.y_bytes()));
        }
        for (int i = 0; i < 60; ++i) {
          const int d = (t + i) % 2;
          const std::size_t k = static_cast<std::size_t>(i) % cases.size();
          GNSILU_CHECK(drv().cuCtxSetCurrent(ctx[d]));
          ys[d][k]->fill(0);
          gnsilu::group_norm_silu(inputs[d][k]->problem(cases[k], *ys[d][k]), streams[d]->s);
          streams[d]->sync();
          calls++;
          mismatches += ys[d][k]->download() != cases[k].expected.bytes;
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(errors_mutex);
        errors.push_back(e.what());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& e : errors) MESSAGE("error: " << e);
  CHECK(errors.empty());
  CHECK(mismatches.load() == 0);
  // Each device has its own loaded kernels; identical GPUs share tuned entries (one tuning per key).
  const auto& info0 = gnsilu::detail::device_info(0);
  const auto& info1 = gnsilu::detail::device_info(1);
  const gnsilu::detail::Variant v{DType::BF16, DType::BF16, gnsilu::default_config(gnsilu::Path::Split)};
  CHECK(&gnsilu::detail::kernels_for(ctx[0], info0, v) != &gnsilu::detail::kernels_for(ctx[1], info1, v));
  const bool identical = gnsilu::detail::identity_of(info0) == gnsilu::detail::identity_of(info1);
  MESSAGE(calls.load() << " calls on " << info0.name << " and " << info1.name << " (identical: " << identical
                       << "), tuned " << gnsilu::detail::counters().tuned.load() - tuned << " keys");
  CHECK(gnsilu::detail::counters().tuned.load() - tuned == (identical ? 1u : 2u) * tunable(cases));
  // The device comes from the current context and is checked against the pointers.
  GNSILU_CHECK(drv().cuCtxSetCurrent(ctx[0]));
  Buffer y0(cases[0].y_bytes());
  try {
    gnsilu::group_norm_silu(cases[0].problem(inputs[1][0]->x.get(), y0.get(), inputs[1][0]->weight.get(),
                                             inputs[1][0]->bias.get()));
    FAIL("x on device 1 was accepted in device 0's context");
  } catch (const gnsilu::Error& e) {
    CHECK(e.status() == gnsilu::Status::InvalidArgument);
    CHECK(std::string(e.what()).find("x") != std::string::npos);
    MESSAGE("as reported: " << std::string(e.what()));
  }
  gnsilu::set_cache_paths("");
}

TEST_CASE("two ranks started together share one cache file: each key tuned once per device identity") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/ranks.sqlite";
  const int count = device_count();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      setenv("GNSILU_CACHE", path.c_str(), 1);
      setenv("GNSILU_TUNE_WAIT_MS", "120000", 1);
      const std::string out = dir + "/rank" + std::to_string(r);
      if (!std::freopen((out + ".out").c_str(), "w", stdout) || !std::freopen((out + ".err").c_str(), "w", stderr)) _exit(3);
      execl("/proc/self/exe", "test_system", "--rank", std::to_string(r).c_str(), static_cast<char*>(nullptr));
      _exit(4);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  unsigned long long tuned = 0, found = 0, defaulted = 0;
  for (int r = 0; r < 2; ++r) {
    int device = -1;
    unsigned long long t = 0, f = 0, d = 0;
    FILE* file = std::fopen((dir + "/rank" + std::to_string(r) + ".out").c_str(), "r");
    REQUIRE(file != nullptr);
    CHECK(std::fscanf(file, "device=%d tuned=%llu found=%llu defaulted=%llu", &device, &t, &f, &d) == 4);
    std::fclose(file);
    std::ifstream err(dir + "/rank" + std::to_string(r) + ".err");
    const std::string errors((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
    CHECK_MESSAGE(errors.find("warn") == std::string::npos, "rank " << r << " stderr: " << errors);
    MESSAGE("rank " << r << " on device " << device << ": tuned " << t << ", found " << f << ", defaulted " << d);
    tuned += t;
    found += f;
    defaulted += d;
  }
  bool identical = true;
  if (count >= 2) {
    identical = gnsilu::detail::identity_of(gnsilu::detail::device_info(0)) ==
                gnsilu::detail::identity_of(gnsilu::detail::device_info(1));
  }
  MESSAGE("2 ranks on " << std::min(count, 2) << " GPU(s), identical devices: " << identical);
  CHECK(defaulted == 0);
  CHECK(tuned == (identical ? 1u : 2u) * kRankShapes.size());
  CHECK(tuned + found == 2 * kRankShapes.size());
  gnsilu::cache::Store store(path, gnsilu::cache::Store::Mode::ReadOnly);
  CHECK(store.all_tuning().size() == (identical ? 1u : 2u) * kRankShapes.size());
}

REGISTER_LISTENER("case-counter", 1, testing::CaseCounter);

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "--rank") {
    try {
      return rank_main(std::atoi(argv[2]));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank: %s\n", e.what());
      return 1;
    }
  }
  if (!gpu_present_or_say_why()) return 77;
  try {
    const int count = device_count();
    for (int i = 0; i < count; ++i) {
      const auto& info = gnsilu::detail::device_info(i);
      std::printf("device %d: %s, sm_%d, %d SMs\n", i, info.name.c_str(), info.arch(), info.sms);
    }
    GNSILU_CHECK(drv().cuCtxSetCurrent(primary(0)));
  } catch (const gnsilu::Error& e) {
    std::printf("SKIPPED: %s\n", e.what());
    return 77;
  }
  doctest::Context context(argc, argv);
  return testing::run_cases(context);  // 77 where every case that ran skipped itself (the two-GPU case on one GPU)
}
