// gnsilu-micro: the latencies and bandwidths issue 26's read-once design rests on, measured with gnsilu's own
// kernels (tools/micro/micro_kernels.hpp, compiled at run time by NVRTC as the library's are) on one GPU.
//
//   gnsilu-micro [--rounds 10000] [--buffer-mib 1024]
//       A table: a grid-wide barrier of co-resident blocks, a flag from block 0 to the last block, cluster barriers
//       and a reduction of 32-word records through distributed shared memory for clusters of 2 to 16 blocks (sm_90
//       and later), and slices of a large buffer loaded into shared memory with vector loads against bulk copies,
//       next to a device-to-device copy of the buffer. CUDA events around each launch (L2 flushed first), the
//       median of 5 launches; latencies are a launch's time over its rounds. Then a prototype of the read-once
//       kernel (micro_read_once: one cluster a group, the group in shared memory, FP32/FP64 sums, not gnsilu's exact
//       statistics) on issue 26's shapes, by cluster size and block size, next to a copy of the same bytes, with its
//       largest error against an FP64 reference of two groups (in BF16 units in the last place).
//   gnsilu-micro --compile-only ARCH
//       Compiles the kernels for ARCH (75, 90, ...) with NVRTC and exits: no GPU needed (CI runs it).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/driver.hpp"
#include "base/errors.hpp"
#include "common/device.hpp"
#include "kernels/gnsilu_math.cuh"
#include "micro/micro_kernels.hpp"
#include "runtime/compiler.hpp"
#include "runtime/modules.hpp"
#include "runtime/workspace.hpp"
#include "tuning/event_timer.hpp"

namespace {

namespace gd = gnsilu::detail;
namespace gm = gnsilu::micro;

constexpr std::size_t kKernels = std::size(gm::kKernelNames);
enum Kernel { kGridBarrier, kFlag, kClusterBarrier, kDsmemReduce, kLoadVector, kLoadBulk, kReadOnce };

gd::CompiledProgram compile_for(int arch) {
  gd::CompileRequest request;
  request.arch = arch;
  request.names.assign(std::begin(gm::kKernelNames), std::end(gm::kKernelNames));
  request.source = gm::kKernelSource;
  return gd::compile(request);
}

struct Options {
  unsigned rounds = 10000;
  std::size_t buffer_mib = 1024;
  int compile_only_arch = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value (or unknown argument)");
    const long value = std::strtol(argv[++i], nullptr, 10);
    if (value <= 0) throw std::invalid_argument(a + " needs a positive number, got " + argv[i]);
    if (a == "--rounds") o.rounds = static_cast<unsigned>(value);
    else if (a == "--buffer-mib") o.buffer_mib = static_cast<std::size_t>(value);
    else if (a == "--compile-only") o.compile_only_arch = static_cast<int>(value);
    else throw std::invalid_argument("unknown argument " + a);
  }
  return o;
}

class Micro {
 public:
  explicit Micro(const gnsilu::tools::PrimaryContext& gpu)
      : program_(compile_for(gpu.info().arch())),
        module_(gpu.context(), program_.image.data()),
        timer_(gpu.context(), static_cast<std::size_t>(gpu.info().l2_bytes)) {
    for (std::size_t k = 0; k < kKernels; ++k) {
      GNSILU_CHECK(gd::driver().cuModuleGetFunction(&functions_[k], module_.get(), program_.lowered_names[k].c_str()));
    }
  }

  // The median time of 5 launches of `kernel` (after one untimed), in microseconds; `clear` bytes at `state` zeroed
  // on the stream before each launch. cluster > 0: launched with that cluster size. Negative: the launch failed.
  double time_us(Kernel kernel, unsigned blocks, unsigned threads, void** args, unsigned shared = 0,
                 unsigned cluster = 0, CUdeviceptr state = 0, std::size_t clear = 0) {
    const gd::Driver& d = gd::driver();
    CUresult result = CUDA_SUCCESS;
    auto launch = [&] {
      if (clear > 0) GNSILU_CHECK(d.cuMemsetD8Async(state, 0, clear, timer_.stream()));
      CUlaunchAttribute attribute{};
      attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attribute.value.clusterDim.x = cluster;
      attribute.value.clusterDim.y = 1;
      attribute.value.clusterDim.z = 1;
      CUlaunchConfig config{};
      config.gridDimX = blocks;
      config.gridDimY = config.gridDimZ = 1;
      config.blockDimX = threads;
      config.blockDimY = config.blockDimZ = 1;
      config.sharedMemBytes = shared;
      config.hStream = timer_.stream();
      config.attrs = cluster > 0 ? &attribute : nullptr;
      config.numAttrs = cluster > 0 ? 1 : 0;
      if (result == CUDA_SUCCESS) result = d.cuLaunchKernelEx(&config, functions_[kernel], args, nullptr);
    };
    const double us = timer_.median_us(5, launch);
    if (result != CUDA_SUCCESS) {
      GNSILU_CHECK(d.cuCtxSynchronize());
      return -1;
    }
    return us;
  }

  CUfunction function(Kernel k) const { return functions_[k]; }
  CUstream stream() const { return timer_.stream(); }
  double copy_us(CUdeviceptr to, CUdeviceptr from, std::size_t bytes) {
    return timer_.median_us(5, [&] { GNSILU_CHECK(gd::driver().cuMemcpyDtoDAsync_v2(to, from, bytes, timer_.stream())); });
  }

 private:
  gd::CompiledProgram program_;
  gd::ModuleHandle module_;
  gd::EventTimer timer_;
  std::array<CUfunction, kKernels> functions_{};
};

void row(const std::string& what, double value, const char* unit) {
  if (value < 0) std::printf("  %-66s %12s\n", what.c_str(), "not launched");
  else std::printf("  %-66s %9.3f %s\n", what.c_str(), value, unit);
}

// The largest |y - reference| of group `group`, in units of BF16's last place at the reference (FP64 statistics and
// SiLU, rounded to BF16 for the comparison's unit only).
double group_error_ulps(const std::vector<std::uint16_t>& x, const std::vector<std::uint16_t>& y, std::size_t group,
                        std::size_t group_elems, double eps) {
  const std::size_t first = group * group_elems;
  double s1 = 0, s2 = 0;
  for (std::size_t i = 0; i < group_elems; ++i) {
    const double v = gnsilu::math::bf16_to_float(x[first + i]);
    s1 += v;
    s2 += v * v;
  }
  const double mean = s1 / static_cast<double>(group_elems);
  const double rstd = 1.0 / std::sqrt(s2 / static_cast<double>(group_elems) - mean * mean + eps);
  double worst = 0;
  for (std::size_t i = 0; i < group_elems; ++i) {
    const double t = (gnsilu::math::bf16_to_float(x[first + i]) - mean) * rstd;
    const double ref = t / (1.0 + std::exp(-t));
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(ref), 1e-30)) - 7);
    worst = std::max(worst, std::fabs(gnsilu::math::bf16_to_float(y[first + i]) - ref) / ulp);
  }
  return worst;
}

// micro_read_once on issue 26's shapes (BF16, 32 groups): each cluster size that divides a group into slices that
// fit a block's shared memory, 256 and 512 threads a block, against a copy of the tensor.
void read_once_table(Micro& m, const gnsilu::tools::PrimaryContext& gpu) {
  const gd::DeviceInfo& dev = gpu.info();
  if (dev.arch() < 90) {
    std::printf("read-once prototype: needs sm_90 (clusters, bulk copies); not measured\n");
    return;
  }
  const gd::Driver& d = gd::driver();
  int optin = 0;
  GNSILU_CHECK(d.cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev.device));
  const int usable = optin - 1024;  // the kernel's static shared memory: barriers, sums (< 1 KiB)
  GNSILU_CHECK(d.cuFuncSetAttribute(m.function(kReadOnce), CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
  GNSILU_CHECK(d.cuFuncSetAttribute(m.function(kReadOnce), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, usable));
  struct Shape {
    std::size_t n, c, h, w;
  };
  const Shape shapes[] = {{1, 512, 64, 64},   {2, 320, 96, 96},   {1, 512, 128, 128}, {1, 128, 256, 256},
                          {1, 256, 256, 256}, {4, 512, 128, 128}, {1, 512, 256, 256}, {1, 256, 512, 512}};
  constexpr std::size_t kGroups = 32, kPieces = 8;  // kPieces: micro_read_once's bulk copies a slice
  constexpr float kEps = 1e-6f;
  std::printf("read-once prototype (BF16, %zu groups, NCHW; %d bytes of shared memory a block at most):\n", kGroups,
              usable);
  std::printf("  %-18s %8s %7s %8s %6s %10s %10s %8s %8s %10s\n", "shape", "group", "cluster", "threads", "store",
              "slice KiB", "us", "copy us", "x copy", "max ulps");
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (const Shape& sh : shapes) {
    const std::size_t elems = sh.n * sh.c * sh.h * sh.w, bytes = elems * 2;
    const std::size_t group_elems = sh.c / kGroups * sh.h * sh.w, groups = sh.n * kGroups;
    std::vector<std::uint16_t> hx(elems), hy(elems);
    for (auto& v : hx) {  // 3 + a spread of about 1: a mean large against the spread
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = gnsilu::math::float_to_bf16(3.0f + static_cast<float>(static_cast<std::int32_t>(state >> 32)) * 0x1p-31f);
    }
    const gd::DeviceBuffer x(gpu.context(), bytes), y(gpu.context(), bytes);
    GNSILU_CHECK(d.cuMemcpyHtoD_v2(x.get(), hx.data(), bytes));
    const double copy = m.copy_us(y.get(), x.get(), bytes);
    const std::string name = std::to_string(sh.n) + "x" + std::to_string(sh.c) + "x" + std::to_string(sh.h) + "x" +
                             std::to_string(sh.w);
    bool any = false;
    double best = 0;
    std::string best_what;
    for (unsigned cluster : {1u, 2u, 4u, 8u, 16u}) {
      if (group_elems % (8 * kPieces * cluster) != 0) continue;
      const std::size_t slice_bytes = group_elems * 2 / cluster;
      if (slice_bytes > static_cast<std::size_t>(usable)) continue;
      for (unsigned threads : {256u, 512u}) for (unsigned bulk_store : {0u, 1u}) {
        any = true;
        GNSILU_CHECK(d.cuMemsetD8_v2(y.get(), 0, bytes));
        CUdeviceptr xp = x.get(), yp = y.get();
        unsigned long long ge = group_elems;
        float eps = kEps;
        void* args[] = {&xp, &yp, &ge, &eps, &bulk_store};
        const double us = m.time_us(kReadOnce, static_cast<unsigned>(groups * cluster), threads, args,
                                    static_cast<unsigned>(slice_bytes), cluster);
        double ulps = -1;
        if (us >= 0) {
          GNSILU_CHECK(d.cuMemcpyDtoH_v2(hy.data(), y.get(), bytes));
          ulps = std::max(group_error_ulps(hx, hy, 0, group_elems, kEps),
                          group_error_ulps(hx, hy, groups - 1, group_elems, kEps));
        }
        const char* store = bulk_store ? "bulk" : "vector";
        if (us < 0) {
          std::printf("  %-18s %6zu K %7u %8u %6s %10.1f %10s\n", name.c_str(), group_elems * 2 / 1024, cluster,
                      threads, store, slice_bytes / 1024.0, "not launched");
        } else {
          std::printf("  %-18s %6zu K %7u %8u %6s %10.1f %10.2f %8.2f %8.2f %10.1f\n", name.c_str(),
                      group_elems * 2 / 1024, cluster, threads, store, slice_bytes / 1024.0, us, copy, us / copy, ulps);
          if (best == 0 || us < best) {
            best = us;
            best_what = "cluster " + std::to_string(cluster) + ", " + std::to_string(threads) + " threads, " + store +
                        " stores";
          }
        }
      }
    }
    if (best > 0) {
      std::printf("  %-18s best %.2f us = %.2fx the copy (%s)\n", name.c_str(), best, best / copy, best_what.c_str());
    }
    if (!any) {
      std::printf("  %-18s %6zu K  does not fit: a group needs more than 16 blocks' shared memory (copy %.2f us)\n",
                  name.c_str(), group_elems * 2 / 1024, copy);
    }
  }
}

int run(const Options& o) {
  const gnsilu::tools::PrimaryContext gpu;
  const gd::DeviceInfo& dev = gpu.info();
  Micro m(gpu);
  const gd::Driver& d = gd::driver();
  const auto sms = static_cast<unsigned>(dev.sms);
  unsigned rounds = o.rounds;
  std::printf("gnsilu-micro on %s (sm_%d, %u SMs, %d KiB L2); %u rounds a launch, median of 5 launches\n",
              dev.name.c_str(), dev.arch(), sms, dev.l2_bytes / 1024, rounds);

  const gd::DeviceBuffer state(gpu.context(), 64 * 1024 * 8);
  CUdeviceptr state_ptr = state.get();
  std::printf("latencies (a launch's time over its rounds):\n");
  for (unsigned per_sm : {1u, 2u}) {
    void* args[] = {&state_ptr, &rounds};
    const double us = m.time_us(kGridBarrier, sms * per_sm, 128, args, 0, 0, state_ptr, 8);
    row("grid barrier, " + std::to_string(sms * per_sm) + " blocks (" + std::to_string(per_sm) + " a SM)",
        us < 0 ? us : us * 1e3 / rounds, "ns");
  }
  {
    void* args[] = {&state_ptr, &rounds};
    const double us = m.time_us(kFlag, sms, 32, args, 0, 0, state_ptr, 8);
    row("flag from block 0 to block " + std::to_string(sms - 1) + " (one way: half a round trip)",
        us < 0 ? us : us * 1e3 / (2.0 * rounds), "ns");
  }
  if (dev.arch() >= 90) {
    GNSILU_CHECK(d.cuFuncSetAttribute(m.function(kClusterBarrier), CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
    GNSILU_CHECK(d.cuFuncSetAttribute(m.function(kDsmemReduce), CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
    for (unsigned size : {2u, 4u, 8u, 16u}) {
      const unsigned blocks = std::max(1u, sms / size) * size;
      void* args[] = {&rounds, &state_ptr};
      const double us = m.time_us(kClusterBarrier, blocks, 128, args, 0, size);
      row("cluster barrier, clusters of " + std::to_string(size), us < 0 ? us : us * 1e3 / rounds, "ns");
    }
    for (unsigned size : {1u, 2u, 4u, 8u, 16u}) {
      const unsigned blocks = std::max(1u, sms / size) * size;
      void* args[] = {&rounds, &state_ptr};
      const double us = m.time_us(kDsmemReduce, blocks, 128, args, 0, size);
      row("32-word records summed into block 0 of clusters of " + std::to_string(size) + " (2 barriers a round)",
          us < 0 ? us : us * 1e3 / rounds, "ns");
    }
  } else {
    std::printf("  (clusters and distributed shared memory need sm_90: not measured)\n");
  }

  const std::size_t bytes = o.buffer_mib << 20;
  const gd::DeviceBuffer x(gpu.context(), bytes), y(gpu.context(), bytes);
  GNSILU_CHECK(d.cuMemsetD8_v2(x.get(), 1, bytes));
  const double copy = m.copy_us(y.get(), x.get(), bytes);
  std::printf("a %zu MiB buffer read into shared memory a slice at a time (GB/s of bytes read):\n", o.buffer_mib);
  row("device-to-device copy (reads and writes the buffer; bytes read)", bytes / copy / 1e3, "GB/s");
  CUdeviceptr x_ptr = x.get();
  unsigned long long n16 = bytes / 16;
  for (unsigned slice_kib : {16u, 32u, 64u, 128u}) {
    unsigned slice16 = slice_kib * 1024 / 16;
    const unsigned shared = slice_kib * 1024;
    const unsigned per_sm = std::clamp(200u / slice_kib, 1u, 8u);
    for (Kernel k : {kLoadVector, kLoadBulk}) {
      if (k == kLoadBulk && dev.arch() < 90) continue;
      GNSILU_CHECK(d.cuFuncSetAttribute(m.function(k), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        static_cast<int>(shared)));
      void* args[] = {&x_ptr, &n16, &slice16, &state_ptr};
      const double us = m.time_us(k, sms * per_sm, 256, args, shared);
      row(std::string(k == kLoadVector ? "vector loads" : "bulk copies (cp.async.bulk)") + ", slices of " +
              std::to_string(slice_kib) + " KiB, " + std::to_string(per_sm) + " blocks a SM",
          us < 0 ? us : bytes / us / 1e3, "GB/s");
    }
  }
  read_once_table(m, gpu);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (o.compile_only_arch > 0) {
      const gd::CompiledProgram p = compile_for(o.compile_only_arch);
      std::printf("gnsilu-micro: %zu kernels compiled for sm_%d (%s, %zu bytes)\n", p.lowered_names.size(),
                  o.compile_only_arch, p.is_cubin ? "CUBIN" : "PTX", p.image.size());
      return 0;
    }
    std::string why;
    if (!gnsilu::tools::gpu_present(why)) {
      std::printf("gnsilu-micro: no GPU here (%s); nothing measured\n", why.c_str());
      return 77;
    }
    return run(o);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gnsilu-micro: %s\nusage: gnsilu-micro [--rounds N] [--buffer-mib N] | --compile-only ARCH\n",
                 e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gnsilu-micro: %s\n", e.what());
    return 1;
  }
}
