// gnsilu-run: the main job until the gnsilu-tune CLI exists. Compiles every kernel variant (all dtype pairs,
// all candidate configurations) for the local GPU, runs the default configuration once on a Flux-VAE-sized
// activation (1x128x1024x1024 bf16, 32 groups), checks it bit for bit against the CPU reference and prints
// the time. Without a GPU it compiles everything for sm_90 and says plainly that nothing ran.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/device.hpp"
#include "base/driver.hpp"
#include "base/errors.hpp"
#include "gnsilu/gnsilu.hpp"
#include "gnsilu/reference.hpp"
#include "kernels/gnsilu_math.cuh"
#include "runtime/kernels.hpp"
#include "runtime/modules.hpp"
#include "runtime/workspace.hpp"

namespace {

using gnsilu::DType;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Compiles all 9 dtype pairs x all candidate configurations for `arch`, in parallel; returns the count.
std::size_t compile_everything(int arch) {
  const DType types[] = {DType::BF16, DType::FP16, DType::FP32};
  std::vector<gnsilu::detail::Variant> variants;
  for (DType x : types)
    for (DType y : types)
      for (const auto& c : gnsilu::candidate_configs()) variants.push_back({x, y, c});
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next++) < variants.size();) gnsilu::detail::compiled_for(arch, variants[i]);
    });
  }
  for (auto& t : pool) t.join();
  return variants.size();
}

int run_on_gpu() {
  const auto& d = gnsilu::detail::driver();
  CUdevice device = 0;
  GNSILU_CU(d.cuDeviceGet(&device, 0));
  CUcontext context = nullptr;
  GNSILU_CU(d.cuDevicePrimaryCtxRetain(&context, device));
  GNSILU_CU(d.cuCtxSetCurrent(context));
  const auto& info = gnsilu::detail::device_info(device);
  std::printf("GPU: %s (sm_%d, %d SMs)\n", info.name.c_str(), info.arch(), info.sms);

  auto t = Clock::now();
  const std::size_t compiled = compile_everything(info.arch());
  std::printf("compiled %zu kernel variants for sm_%d in %.1f s\n", compiled, info.arch(), seconds_since(t));

  const std::vector<int64_t> shape{1, 128, 1024, 1024};
  const std::size_t n = 128u * 1024u * 1024u;
  std::vector<uint16_t> x(n), y(n), expected(n);
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.3f, 1.7f);
  for (auto& v : x) v = gnsilu::math::float_to_bf16(normal(rng));
  std::vector<float> weight(128), bias(128);
  for (auto& v : weight) v = 1.0f + 0.2f * normal(rng);
  for (auto& v : bias) v = 0.1f * normal(rng);

  gnsilu::Problem p;
  p.x = x.data();
  p.y = expected.data();
  p.shape = shape;
  p.weight = weight.data();
  p.bias = bias.data();
  t = Clock::now();
  gnsilu::reference_group_norm_silu(p);
  std::printf("CPU reference: %.2f s\n", seconds_since(t));

  const gnsilu::detail::DeviceBuffer x_buffer(context, 2 * n), y_buffer(context, 2 * n),
      w_buffer(context, 4 * 128), b_buffer(context, 4 * 128);
  const CUdeviceptr dx = x_buffer.get(), dy = y_buffer.get(), dw = w_buffer.get(), db = b_buffer.get();
  GNSILU_CU(d.cuMemcpyHtoD_v2(dx, x.data(), 2 * n));
  GNSILU_CU(d.cuMemcpyHtoD_v2(dw, weight.data(), 4 * 128));
  GNSILU_CU(d.cuMemcpyHtoD_v2(db, bias.data(), 4 * 128));
  p.x = reinterpret_cast<void*>(dx);
  p.y = reinterpret_cast<void*>(dy);
  p.weight = reinterpret_cast<void*>(dw);
  p.bias = reinterpret_cast<void*>(db);

  const gnsilu::detail::UniqueEvent start_event = gnsilu::detail::make_event(),
                                    stop_event = gnsilu::detail::make_event();
  CUevent start = start_event.get(), stop = stop_event.get();
  gnsilu::group_norm_silu(p);  // first call: module load, workspace
  GNSILU_CU(d.cuCtxSynchronize());
  std::vector<float> times;
  for (int i = 0; i < 20; ++i) {
    GNSILU_CU(d.cuEventRecord(start, nullptr));
    gnsilu::group_norm_silu(p);
    GNSILU_CU(d.cuEventRecord(stop, nullptr));
    GNSILU_CU(d.cuEventSynchronize(stop));
    float ms = 0;
    GNSILU_CU(d.cuEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  GNSILU_CU(d.cuMemcpyDtoH_v2(y.data(), dy, 2 * n));
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) differ += y[i] != expected[i];
  std::printf("1x128x1024x1024 bf16, 32 groups: %.1f us (median of 20, warm L2), %zu of %zu outputs differ from the CPU reference\n",
              1000.0 * times[times.size() / 2], differ, n);
  return differ == 0 ? 0 : 1;
}

}  // namespace

int main() {
  try {
    std::string why;
    bool gpu = gnsilu::detail::driver_available(&why);
    if (gpu) {
      try {
        gnsilu::check_device();
      } catch (const gnsilu::Error& e) {
        gpu = false;
        why = e.what();
      }
    }
    if (gpu) return run_on_gpu();
    const auto t = Clock::now();
    const std::size_t compiled = compile_everything(90);
    std::printf("compiled %zu kernel variants for sm_90 in %.1f s\n", compiled, seconds_since(t));
    std::printf("no GPU here (%s): nothing ran\n", why.c_str());
    return 0;
  } catch (const gnsilu::Error& e) {
    std::fprintf(stderr, "gnsilu-run: %s\n", e.what());
    return 1;
  }
}
