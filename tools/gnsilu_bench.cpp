// gnsilu-bench: measurements on a GPU, printed as a table (and JSON with --json FILE).
//
//   gnsilu-bench shapes   [--shapes 1x512x128x128,...|--preset flux|layouts] [--dtypes bf16,fp16] [--groups 32]
//                         [--repeats 30] [--paths split,fused] [--configs e16w8s2p4,...] [--layouts nchw,nhwc]
//                         [--activations silu,none] [--tile-slice 16|32|64]
//       For each shape, dtype, layout and activation, in one run on the same tensors: a device-to-device copy of
//       x (the floor), gnsilu as an application sees it (tuned on first use, through the cache), the default
//       configuration, and every candidate configuration timed by hand; CUDA events, L2 flushed before every
//       timed run, median of the repeats. Bytes per element, GB/s and the ratio to the copy; with both layouts,
//       a last table of each shape's channels-last ratio next to its channel-major one. --tile-slice forces the
//       bytes per pixel of the channels-last statistics tiles (an experiment knob; the library chooses).
//   gnsilu-bench start    [--shape ...]   time to the first and second result in this process, and where the
//                                         configuration and kernels came from (cold or warm cache)
//   gnsilu-bench overhead                 host time of a call whose configuration is resolved (tiny tensor)
//   gnsilu-bench worker   [--shapes ...]  calls each shape once and prints what this process did (JSON), for
//                                         the many-processes-on-one-cache test
//   gnsilu-bench cubin    --json DIR      writes the CUBINs of the default variants for this GPU (for cuobjdump)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tuning/config_table.hpp"
#include "base/device.hpp"
#include "base/driver.hpp"
#include "cache/entries.hpp"
#include "base/errors.hpp"
#include "gnsilu/gnsilu.hpp"
#include "kernels/gnsilu_math.cuh"
#include "runtime/kernels.hpp"
#include "runtime/modules.hpp"
#include "runtime/plan.hpp"
#include "tuning/tuner.hpp"

namespace {

using gnsilu::DType;
using gnsilu::LaunchConfig;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
namespace gd = gnsilu::detail;

const gd::Driver& drv() { return gd::driver(); }

struct Args {
  std::string command;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DType> dtypes = {DType::BF16, DType::FP16};
  int64_t groups = 32;
  int repeats = 30;
  std::string json_path;
  std::vector<gnsilu::Path> paths = {gnsilu::Path::Split, gnsilu::Path::Fused};
  std::vector<LaunchConfig> configs;  // empty: the tuner's candidates
  std::vector<gnsilu::Layout> layouts = {gnsilu::Layout::ChannelsFirst};
  std::vector<gnsilu::Activation> activations = {gnsilu::Activation::SiLU};
  int tile_slice = 0;
};

// The shapes of the layouts benchmark (docs/PERFORMANCE.md): VAE channel counts with 32 groups (4, 8 and 16
// channels a group) and UNet-like ones (10, 20, 40), N = 1 and 4, 4-D and 5-D, 1 MiB to 1 GiB in bf16.
const std::vector<std::vector<int64_t>> kLayoutShapes = {
    {1, 128, 64, 64},    {1, 512, 64, 64},     {4, 128, 64, 64},     {1, 512, 128, 128},   {1, 320, 128, 128},
    {1, 640, 64, 64},    {1, 1280, 64, 64},    {1, 512, 256, 256},   {4, 320, 128, 128},   {1, 256, 512, 512},
    {1, 128, 1024, 1024}, {4, 512, 256, 256},  {1, 1280, 128, 128},  {1, 256, 1024, 1024}, {4, 128, 1024, 1024},
    {1, 128, 9, 360, 640}, {1, 256, 5, 180, 320}};

// "e16w8s2p4" (or "e16 w8 s2 p4")
LaunchConfig parse_config(const std::string& text) {
  LaunchConfig c;
  int* field = nullptr;
  std::string digits;
  const auto flush = [&] {
    if (field == nullptr || digits.empty()) throw std::runtime_error("bad configuration " + text);
    *field = std::stoi(digits);
    digits.clear();
  };
  for (char ch : text) {
    if (ch >= '0' && ch <= '9') {
      digits += ch;
      continue;
    }
    if (ch == ' ') continue;
    if (field != nullptr) flush();
    field = ch == 'e' ? &c.elems_per_load : ch == 'w' ? &c.warps : ch == 's' ? &c.stages : ch == 'p' ? &c.programs_per_sm : nullptr;
    if (field == nullptr) throw std::runtime_error("bad configuration " + text);
  }
  flush();
  return c;
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::string problem;
  auto dims = gnsilu::cache::shape_from_text(text, &problem);
  if (!dims) throw std::runtime_error("bad shape \"" + text + "\": " + problem);
  return *dims;
}

std::string shape_text(const std::vector<int64_t>& dims) { return gnsilu::cache::shape_to_text(dims); }

Args parse(int argc, char** argv) {
  Args a;
  a.command = argc > 1 ? argv[1] : "shapes";
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--shapes" || arg == "--shape") {
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) a.shapes.push_back(parse_shape(s));
    } else if (arg == "--dtypes") {
      a.dtypes.clear();
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) a.dtypes.push_back(s == "fp16" ? DType::FP16 : s == "fp32" ? DType::FP32 : DType::BF16);
    } else if (arg == "--groups") {
      a.groups = std::stoll(value());
    } else if (arg == "--repeats") {
      a.repeats = std::stoi(value());
    } else if (arg == "--paths") {
      a.paths.clear();
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) {
        if (s == "split") a.paths.push_back(gnsilu::Path::Split);
        else if (s == "fused") a.paths.push_back(gnsilu::Path::Fused);
        else throw std::runtime_error("unknown path " + s);
      }
    } else if (arg == "--configs") {
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) a.configs.push_back(parse_config(s));
    } else if (arg == "--layouts") {
      a.layouts.clear();
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) {
        gnsilu::Layout layout;
        if (!gnsilu::cache::layout_from_name(s, layout)) throw std::runtime_error("unknown layout " + s + " (nchw, nhwc)");
        a.layouts.push_back(layout);
      }
    } else if (arg == "--activations") {
      a.activations.clear();
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) {
        gnsilu::Activation activation;
        if (!gnsilu::cache::activation_from_name(s, activation)) {
          throw std::runtime_error("unknown activation " + s + " (silu, none)");
        }
        a.activations.push_back(activation);
      }
    } else if (arg == "--tile-slice") {
      a.tile_slice = std::stoi(value());
      if (a.tile_slice != 16 && a.tile_slice != 32 && a.tile_slice != 64) throw std::runtime_error("--tile-slice: 16, 32 or 64");
    } else if (arg == "--preset") {
      const std::string name = value();
      if (name == "layouts") a.shapes = kLayoutShapes;
      else if (name != "flux") throw std::runtime_error("unknown preset " + name + " (flux, layouts)");
    } else if (arg == "--json") {
      a.json_path = value();
    } else {
      throw std::runtime_error("unknown argument " + arg);
    }
  }
  if (a.shapes.empty()) {
    // The Flux VAE decoder's GroupNorm inputs at 1024x1024, and 1, 4, 16 MiB activations (bf16).
    a.shapes = {{1, 512, 32, 32}, {1, 512, 64, 64}, {1, 512, 128, 128}, {1, 512, 256, 256},
                {1, 256, 512, 512}, {1, 512, 512, 512}, {1, 128, 1024, 1024}, {1, 256, 1024, 1024}};
  }
  return a;
}

struct Buffer {  // device memory, owned: freed once, never copied
  CUdeviceptr ptr = 0;
  std::size_t bytes = 0;
  explicit Buffer(std::size_t n) : bytes(n) { GNSILU_CU(drv().cuMemAlloc_v2(&ptr, n)); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (ptr) drv().cuMemFree_v2(ptr);
  }
  void* get() const { return reinterpret_cast<void*>(ptr); }
};

// Times `body` (which enqueues work on `stream`) with events, L2 flushed before each run; median in us.
struct Timer {
  gd::UniqueStream owned_stream = gd::make_stream();
  gd::UniqueEvent owned_start = gd::make_event(), owned_stop = gd::make_event();
  CUstream stream = owned_stream.get();
  CUevent start = owned_start.get(), stop = owned_stop.get();
  Buffer flush;
  unsigned char byte = 0;
  explicit Timer(std::size_t l2) : flush(std::max<std::size_t>(2 * l2, 1 << 20)) {}
  template <typename F>
  double median_us(int repeats, F&& body) {
    body();  // warm-up
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
      GNSILU_CU(drv().cuMemsetD8Async(flush.ptr, ++byte, flush.bytes, stream));
      GNSILU_CU(drv().cuEventRecord(start, stream));
      body();
      GNSILU_CU(drv().cuEventRecord(stop, stream));
      GNSILU_CU(drv().cuEventSynchronize(stop));
      float ms = 0;
      GNSILU_CU(drv().cuEventElapsedTime(&ms, start, stop));
      times.push_back(1000.0 * ms);
    }
    return gd::median_of(times);
  }
};

const gd::DeviceInfo& setup_device() {
  CUdevice device = 0;
  GNSILU_CU(drv().cuDeviceGet(&device, 0));
  CUcontext context = nullptr;
  GNSILU_CU(drv().cuDevicePrimaryCtxRetain(&context, device));
  GNSILU_CU(drv().cuCtxSetCurrent(context));
  return gd::device_info(device);
}

void fill_random(const Buffer& x, DType dtype, std::size_t n, uint64_t seed) {
  std::vector<unsigned char> host(n * gnsilu::dtype_size(dtype));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.2f, 1.3f);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    if (dtype == DType::FP32) std::memcpy(&host[4 * i], &v, 4);
    else {
      const uint16_t h = dtype == DType::BF16 ? gnsilu::math::float_to_bf16(v) : gnsilu::math::float_to_fp16(v);
      std::memcpy(&host[2 * i], &h, 2);
    }
  }
  GNSILU_CU(drv().cuMemcpyHtoD_v2(x.ptr, host.data(), host.size()));
}

// A problem over x and y of `dtype` (same shape), without affine parameters.
gnsilu::Problem problem_over(const Buffer& x, const Buffer& y, DType dtype, const std::vector<int64_t>& shape,
                             int64_t groups) {
  gnsilu::Problem p;
  p.x = x.get();
  p.x_dtype = dtype;
  p.y = y.get();
  p.y_dtype = dtype;
  p.shape = shape;
  p.num_groups = groups;
  return p;
}

int run_shapes(const Args& a) {
  const gd::DeviceInfo& dev = setup_device();
  std::printf("GPU: %s (sm_%d, %d SMs, L2 %d MiB); median of %d runs, L2 flushed before each\n", dev.name.c_str(),
              dev.arch(), dev.sms, dev.l2_bytes >> 20, a.repeats);
  if (a.tile_slice != 0) std::printf("channels-last statistics tiles forced to %d bytes a pixel\n", a.tile_slice);
  gd::force_tile_slice_bytes(a.tile_slice);
  Timer timer(static_cast<std::size_t>(dev.l2_bytes));
  json rows = json::array();
  std::vector<std::string> lines;
  // (shape, dtype, activation) -> ratio to the copy per layout, for the last table.
  std::map<std::string, std::map<std::string, double>> by_layout;
  // One row: the shape in one dtype, layout and activation, with its own copy of the same bytes.
  const auto bench = [&](const std::vector<int64_t>& shape, DType dtype, gnsilu::Layout layout,
                         gnsilu::Activation activation) {
    const auto g = gd::make_geometry(shape, a.groups, layout);
    const std::size_t n = static_cast<std::size_t>(g.numel);
    const std::size_t bytes = n * gnsilu::dtype_size(dtype);
    Buffer x(bytes), y(bytes), w(4 * shape[1]), b(4 * shape[1]);
    fill_random(x, dtype, n, 7);
    std::vector<float> params(static_cast<std::size_t>(shape[1]), 1.0f);
    GNSILU_CU(drv().cuMemcpyHtoD_v2(w.ptr, params.data(), 4 * params.size()));
    std::fill(params.begin(), params.end(), 0.1f);
    GNSILU_CU(drv().cuMemcpyHtoD_v2(b.ptr, params.data(), 4 * params.size()));
    gnsilu::Problem p = problem_over(x, y, dtype, shape, a.groups);
    p.weight = w.get();
    p.bias = b.get();
    p.x_layout = p.y_layout = layout;
    p.activation = activation;

    const double copy = timer.median_us(a.repeats, [&] {
      GNSILU_CU(drv().cuMemcpyDtoDAsync_v2(y.ptr, x.ptr, bytes, timer.stream));
    });
    const auto tuned_before = gd::counters().tuned.load();
    const auto t0 = Clock::now();
    gnsilu::group_norm_silu(p, timer.stream);  // resolves (and maybe tunes) the configuration
    GNSILU_CU(drv().cuStreamSynchronize(timer.stream));
    const double first_call_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const bool tuned_now = gd::counters().tuned.load() > tuned_before;
    const double app = timer.median_us(a.repeats, [&] { gnsilu::group_norm_silu(p, timer.stream); });
    // Every candidate on every path that can run: the library's path ("best by hand" and the default), and the
    // fastest of the other paths.
    const gnsilu::Path chosen = gd::choose_path(g, gnsilu::Path::Auto, dev.sms);
    json candidates = json::array();
    double best = 1e30, def = 0;
    LaunchConfig best_config;
    std::map<std::string, double> path_best;
    std::map<std::string, std::string> path_best_config;
    std::vector<LaunchConfig> configs = a.configs;
    if (configs.empty()) configs.assign(gnsilu::candidate_configs().begin(), gnsilu::candidate_configs().end());
    for (gnsilu::Path path : a.paths) {
      if (path == gnsilu::Path::Fused && !gd::fused_eligible(g)) continue;
      double fastest = 1e30;
      LaunchConfig fastest_config;
      for (const auto& c : configs) {
        gnsilu::LaunchOptions o;
        o.config = c;
        o.path = path;
        const double t = timer.median_us(a.repeats, [&] { gnsilu::group_norm_silu(p, timer.stream, {}, o); });
        candidates.push_back({{"config", gd::to_string(c)}, {"path", gnsilu::path_name(path)}, {"us", t}});
        if (t < fastest) {
          fastest = t;
          fastest_config = c;
        }
        if (path != chosen) continue;
        if (c == gnsilu::default_config(chosen)) def = t;
        if (t < best) {
          best = t;
          best_config = c;
        }
      }
      path_best[gnsilu::path_name(path)] = fastest;
      path_best_config[gnsilu::path_name(path)] = gd::to_string(fastest_config);
    }
    std::string others;
    for (const auto& [name, us] : path_best) {
      if (name == gnsilu::path_name(chosen)) continue;
      char item[80];
      std::snprintf(item, sizeof item, "%s%s %.1f (%s)", others.empty() ? "" : ", ", name.c_str(), us,
                    path_best_config[name].c_str());
      others += item;
    }
    const double gbps = 2.0 * static_cast<double>(bytes) / (app * 1e-6) / 1e9;
    const std::string path = gnsilu::path_name(chosen);
    const std::string kind = std::string(gnsilu::layout_name(layout)) +
                             (activation == gnsilu::Activation::None ? " gn" : "");
    by_layout[shape_text(shape) + " " + gnsilu::dtype_name(dtype) +
              (activation == gnsilu::Activation::None ? " (no activation)" : "")][gnsilu::layout_name(layout)] =
        app / copy;
    char line[512];
    std::snprintf(line, sizeof line, "%-18s %-5s %-7s %7.1f %8.1f %9.1f %6.2fx %9.1f %9.1f %-14s %7.0f %-8s %s%s",
                  shape_text(shape).c_str(), gnsilu::dtype_name(dtype), kind.c_str(), bytes / 1048576.0, copy, app,
                  app / copy, def, best, gd::to_string(best_config).c_str(), gbps, path.c_str(), others.c_str(),
                  tuned_now ? " (tuned now)" : "");
    lines.push_back(line);
    std::printf("%s\n", line);
    std::fflush(stdout);
    rows.push_back({{"shape", shape_text(shape)}, {"dtype", gnsilu::dtype_name(dtype)}, {"groups", a.groups},
                    {"layout", gnsilu::layout_name(layout)}, {"activation", gnsilu::activation_name(activation)},
                    {"mib", bytes / 1048576.0}, {"copy_us", copy}, {"gnsilu_us", app}, {"ratio_to_copy", app / copy},
                    {"default_us", def}, {"best_by_hand_us", best}, {"best_by_hand", gd::to_string(best_config)},
                    {"gnsilu_gbps_x_plus_y", gbps}, {"path", path}, {"tuned_in_this_run", tuned_now},
                    {"first_call_s", first_call_s}, {"best_by_hand_per_path_us", path_best},
                    {"candidates", candidates}});
  };
  for (DType dtype : a.dtypes)
    for (const auto& shape : a.shapes)
      for (gnsilu::Activation activation : a.activations)
        for (gnsilu::Layout layout : a.layouts) bench(shape, dtype, layout, activation);
  gd::force_tile_slice_bytes(0);
  std::printf("\n%-18s %-5s %-7s %7s %8s %9s %7s %9s %9s %-14s %7s %-8s %s\n", "shape", "dtype", "layout", "MiB",
              "copy us", "gnsilu us", "/copy", "default", "best hand", "best config", "GB/s", "path",
              "other paths (best by hand, us)");
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  if (a.layouts.size() > 1) {
    std::printf("\n%-40s %10s %10s %10s\n", "shape (gnsilu as tuned, ratio to the copy)", "nchw", "nhwc", "nhwc/nchw");
    for (const auto& [name, ratios] : by_layout) {
      const auto first = ratios.find("nchw"), last = ratios.find("nhwc");
      if (first == ratios.end() || last == ratios.end()) continue;
      std::printf("%-40s %9.2fx %9.2fx %10.3f\n", name.c_str(), first->second, last->second, last->second / first->second);
    }
  }
  if (!a.json_path.empty()) std::ofstream(a.json_path) << rows.dump(1) << "\n";
  return 0;
}

json counters_json() {
  const auto& c = gd::counters();
  return {{"tuned", c.tuned.load()},         {"found_in_cache", c.found_in_cache.load()},
          {"defaulted", c.defaulted.load()}, {"waited_for_other_process", c.waited_for_other_process.load()},
          {"compiled", c.compiled.load()},   {"kernels_from_cache", c.kernels_from_cache.load()}};
}

int run_start(const Args& a, bool worker) {
  const auto t_start = Clock::now();
  const gd::DeviceInfo& dev = setup_device();
  (void)dev;
  json out = {{"pid", getpid()}};
  json calls = json::array();
  for (DType dtype : a.dtypes) {
    for (const auto& shape : a.shapes) {
      const auto g = gd::make_geometry(shape, a.groups);
      const std::size_t bytes = static_cast<std::size_t>(g.numel) * gnsilu::dtype_size(dtype);
      Buffer x(bytes), y(bytes);
      fill_random(x, dtype, static_cast<std::size_t>(g.numel), 3);
      const gnsilu::Problem p = problem_over(x, y, dtype, shape, a.groups);
      auto t = Clock::now();
      gnsilu::group_norm_silu(p);
      GNSILU_CU(drv().cuCtxSynchronize());
      const double first = std::chrono::duration<double>(Clock::now() - t).count();
      t = Clock::now();
      gnsilu::group_norm_silu(p);
      GNSILU_CU(drv().cuCtxSynchronize());
      const double second = std::chrono::duration<double>(Clock::now() - t).count();
      calls.push_back({{"shape", shape_text(shape)}, {"dtype", gnsilu::dtype_name(dtype)}, {"first_call_s", first},
                       {"second_call_s", second}});
      if (!worker) {
        std::printf("%-18s %-5s first call %.3f s, second %.6f s\n", shape_text(shape).c_str(),
                    gnsilu::dtype_name(dtype), first, second);
      }
    }
  }
  out["calls"] = calls;
  out["counters"] = counters_json();
  out["process_s"] = std::chrono::duration<double>(Clock::now() - t_start).count();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// Writes the CUBIN of each kernel variant of the default configurations for this GPU into `dir`.
int run_cubin(const std::string& dir) {
  const gd::DeviceInfo& dev = setup_device();
  for (DType t : {DType::BF16, DType::FP16}) {
    for (gnsilu::Path path : {gnsilu::Path::Split, gnsilu::Path::Fused}) {
      for (gnsilu::Layout layout : {gnsilu::Layout::ChannelsFirst, gnsilu::Layout::ChannelsLast}) {
        const gd::Variant v{t, t, gnsilu::default_config(path), layout};
        const auto& program = gd::compiled_for(dev.arch(), v);
        const std::string file = dir + "/" + gd::code_name(v) + ".cubin";
        std::ofstream(file, std::ios::binary).write(program.image.data(), static_cast<std::streamsize>(program.image.size()));
        std::printf("%s\n", file.c_str());
      }
    }
  }
  return 0;
}

int run_overhead() {
  setup_device();
  const std::vector<int64_t> shape{1, 32, 8, 8};
  Buffer x(2 * 2048), y(2 * 2048);
  fill_random(x, DType::BF16, 2048, 1);
  gnsilu::Problem p;
  p.x = x.get();
  p.y = y.get();
  p.shape = shape;
  gnsilu::group_norm_silu(p);  // resolve the configuration, compile, load
  GNSILU_CU(drv().cuCtxSynchronize());
  std::vector<double> per_call;
  for (int round = 0; round < 20; ++round) {
    const int calls = 500;
    const auto t = Clock::now();
    for (int i = 0; i < calls; ++i) gnsilu::group_norm_silu(p);
    per_call.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / calls);
    GNSILU_CU(drv().cuCtxSynchronize());
  }
  std::printf("host time of a call with its configuration resolved (1x32x8x8 bf16, 500 calls a round, 20 rounds): "
              "median %.2f us, min %.2f us per call\n",
              gd::median_of(per_call), *std::min_element(per_call.begin(), per_call.end()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    std::string why;
    if (!gd::driver_available(&why)) {
      std::fprintf(stderr, "gnsilu-bench: %s\n", why.c_str());
      return 2;
    }
    if (a.command == "shapes") return run_shapes(a);
    if (a.command == "start") return run_start(a, false);
    if (a.command == "worker") return run_start(a, true);
    if (a.command == "overhead") return run_overhead();
    if (a.command == "cubin") return run_cubin(a.json_path.empty() ? "." : a.json_path);
    std::fprintf(stderr, "gnsilu-bench: unknown command %s (shapes, start, overhead, worker)\n", a.command.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gnsilu-bench: %s\n", e.what());
    return 1;
  }
}
