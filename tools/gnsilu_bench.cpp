// gnsilu-bench: measurements on a GPU, printed as a table (and JSON with --json FILE).
//
//   gnsilu-bench shapes   [--shapes 1x512x128x128,...|--preset flux|layouts] [--dtypes bf16,fp16] [--groups 32]
//                         [--repeats 30] [--paths split,fused] [--configs e16w8s2p4,...] [--layouts nchw,nhwc]
//                         [--activations silu,none] [--tile-slice 16|32|64] [--parts-from RECORDS]
//                         [--finalize-atomic]
//       For each shape, dtype, layout and activation, in one run on the same tensors: a device-to-device copy of
//       x (the floor), gnsilu as an application sees it (tuned on first use, through the cache), the default
//       configuration, and every candidate configuration timed by hand; CUDA events, L2 flushed before every
//       timed run, all of them timed in the same rounds (each once a round, in turn, so that no run follows a run
//       of itself, as in an application), median of the rounds. Bytes per element, GB/s and the ratio to the
//       copy; with both layouts, a last table of each shape's channels-last ratio next to its channel-major one.
//       --tile-slice forces the bytes per pixel of the channels-last statistics tiles (an experiment knob; the
//       library chooses). --parts-from merges every group of at least RECORDS chunk records (1024 elements each)
//       in parts of 512 by two launches, whatever the number of groups (plan.cpp's finalize_parts); with
//       --finalize-atomic, those parts take one launch with atomics (kFinalizeAtomic, parts of 256 records, as the
//       library's rule does from 16384 records in calls of at most 4 groups).
//   gnsilu-bench after    [the options of shapes; --paths takes its first path, split by default]
//       Each configuration timed right after one untimed run of a predecessor (a copy of x, or each configuration,
//       itself included): how much what ran just before changes a call's time (docs/PERFORMANCE.md, "Tuning and
//       timing").
//   gnsilu-bench start    [--shape ...]   time to the first and second result in this process, and where the
//                                         configuration and kernels came from (cold or warm cache)
//   gnsilu-bench overhead                 host time of a call whose configuration is resolved (tiny tensor)
//   gnsilu-bench worker   [--shapes ...]  calls each shape once and prints what this process did (JSON), for
//                                         the many-processes-on-one-cache test
//   gnsilu-bench cubin    --json DIR      writes the CUBINs of the default variants for this GPU (for cuobjdump)
//   gnsilu-bench check    [--shapes 1x128x1024x1024] [--dtypes bf16] [--groups 32] [--layouts nchw,nhwc]
//                         [--activations silu] [--repeats 20] [--json FILE]
//       For each shape, dtype, layout and activation: gnsilu through the public API (as an application calls it)
//       on random inputs, timed like the tables (CUDA events, L2 flushed before every timed run, median), and
//       every output compared bit for bit with the CPU reference (gnsilu::reference_group_norm_silu). Exit 1 when
//       any output differs; without a GPU it says so, runs nothing and exits 0.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/names.hpp"
#include "tuning/config_table.hpp"
#include "base/device.hpp"
#include "base/driver.hpp"
#include "cache/entries.hpp"
#include "base/errors.hpp"
#include "common/device.hpp"
#include "common/random_fill.hpp"
#include "common/timing.hpp"
#include "gnsilu/gnsilu.hpp"
#include "gnsilu/reference.hpp"
#include "runtime/kernels.hpp"
#include "runtime/modules.hpp"
#include "runtime/plan.hpp"
#include "runtime/workspace.hpp"
#include "tuning/tuner.hpp"

namespace {

using gnsilu::DType;
using gnsilu::LaunchConfig;
using gnsilu::tools::Clock;
using json = nlohmann::json;
namespace gd = gnsilu::detail;
namespace gt = gnsilu::tools;

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
  long long parts_from = 0;
  bool finalize_atomic = false;
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
  const bool check = a.command == "check";
  if (check) {  // its own defaults: the main job's check (what gnsilu-run ran), in both layouts
    a.dtypes = {DType::BF16};
    a.layouts = {gnsilu::Layout::ChannelsFirst, gnsilu::Layout::ChannelsLast};
    a.repeats = 20;
  }
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
      for (std::string s; std::getline(in, s, ',');) {
        const auto dtype = gnsilu::detail::dtype_from_name(s);
        if (!dtype) throw std::runtime_error("--dtypes: unknown dtype \"" + s + "\" (bf16, fp16, fp32)");
        a.dtypes.push_back(*dtype);
      }
    } else if (arg == "--groups") {
      a.groups = std::stoll(value());
    } else if (arg == "--repeats") {
      a.repeats = std::stoi(value());
    } else if (arg == "--paths") {
      a.paths.clear();
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) {
        const auto path = gnsilu::detail::path_from_name(s);
        if (!path || *path == gnsilu::Path::Auto) throw std::runtime_error("--paths: unknown path \"" + s + "\" (split, fused)");
        a.paths.push_back(*path);
      }
    } else if (arg == "--configs") {
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) a.configs.push_back(parse_config(s));
    } else if (arg == "--layouts") {
      a.layouts.clear();
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) {
        const auto layout = gnsilu::detail::layout_from_name(s);
        if (!layout) throw std::runtime_error("--layouts: unknown layout \"" + s + "\" (nchw, nhwc)");
        a.layouts.push_back(*layout);
      }
    } else if (arg == "--activations") {
      a.activations.clear();
      std::stringstream in(value());
      for (std::string s; std::getline(in, s, ',');) {
        const auto activation = gnsilu::detail::activation_from_name(s);
        if (!activation) throw std::runtime_error("--activations: unknown activation \"" + s + "\" (silu, none)");
        a.activations.push_back(*activation);
      }
    } else if (arg == "--parts-from") {
      a.parts_from = std::stoll(value());
      if (a.parts_from < 1) throw std::runtime_error("--parts-from: a number of chunk records, at least 1");
    } else if (arg == "--finalize-atomic") {
      a.finalize_atomic = true;
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
  if (a.shapes.empty() && check) a.shapes = {{1, 128, 1024, 1024}};
  if (a.shapes.empty()) {
    // The Flux VAE decoder's GroupNorm inputs at 1024x1024, and 1, 4, 16 MiB activations (bf16).
    a.shapes = {{1, 512, 32, 32}, {1, 512, 64, 64}, {1, 512, 128, 128}, {1, 512, 256, 256},
                {1, 256, 512, 512}, {1, 512, 512, 512}, {1, 128, 1024, 1024}, {1, 256, 1024, 1024}};
  }
  return a;
}

void* ptr(const gd::DeviceBuffer& b) { return reinterpret_cast<void*>(b.get()); }

// gnsilu-bench's inputs: normal(0.2, 1.3) of std::mt19937_64, every element drawn.
void fill_random(const gd::DeviceBuffer& x, DType dtype, std::size_t n, uint64_t seed) {
  gt::fill_device(x.get(), n, dtype, gt::NormalSpec{gt::Engine::Mt19937_64, seed, 0.2f, 1.3f});
}

// A problem over x and y of `dtype` (same shape), without affine parameters.
gnsilu::Problem problem_over(const gd::DeviceBuffer& x, const gd::DeviceBuffer& y, DType dtype,
                             const std::vector<int64_t>& shape, int64_t groups) {
  gnsilu::Problem p;
  p.x = ptr(x);
  p.x_dtype = dtype;
  p.y = ptr(y);
  p.y_dtype = dtype;
  p.shape = shape;
  p.num_groups = groups;
  return p;
}

// A row's tensors: x (random), y, weight 1 and bias 0.1 (FP32), and the problem over them; the copy of x and a
// candidate's call on them.
struct RowTensors {
  gd::DeviceBuffer x, y, w, b;
  std::size_t bytes = 0;
  gnsilu::Problem p;
  RowTensors(CUcontext context, const std::vector<int64_t>& shape, DType dtype, int64_t groups, gnsilu::Layout layout,
             gnsilu::Activation activation)
      : x(context, bytes_of(shape, dtype)), y(context, bytes_of(shape, dtype)),
        w(context, 4 * static_cast<std::size_t>(shape[1])), b(context, 4 * static_cast<std::size_t>(shape[1])),
        bytes(bytes_of(shape, dtype)) {
    const std::size_t n = bytes / gnsilu::dtype_size(dtype), channels = static_cast<std::size_t>(shape[1]);
    fill_random(x, dtype, n, 7);
    std::vector<float> params(channels, 1.0f);
    GNSILU_CHECK(drv().cuMemcpyHtoD_v2(w.get(), params.data(), 4 * params.size()));
    std::fill(params.begin(), params.end(), 0.1f);
    GNSILU_CHECK(drv().cuMemcpyHtoD_v2(b.get(), params.data(), 4 * params.size()));
    p = problem_over(x, y, dtype, shape, groups);
    p.weight = ptr(w);
    p.bias = ptr(b);
    p.x_layout = p.y_layout = layout;
    p.activation = activation;
  }
  // y = x by the driver: the floor each row is compared with.
  void copy(CUstream stream) const { GNSILU_CHECK(drv().cuMemcpyDtoDAsync_v2(y.get(), x.get(), bytes, stream)); }
  // The call on a forced path and configuration: a candidate timed by hand.
  void run(CUstream stream, gnsilu::Path path, const LaunchConfig& c) const {
    gnsilu::LaunchOptions o;
    o.config = c;
    o.path = path;
    gnsilu::group_norm_silu(p, stream, {}, o);
  }
  static std::size_t bytes_of(const std::vector<int64_t>& shape, DType dtype) {
    std::size_t n = 1;
    for (int64_t d : shape) n *= static_cast<std::size_t>(d);
    return n * gnsilu::dtype_size(dtype);
  }
};

int run_shapes(const Args& a) {
  const gt::PrimaryContext gpu;
  const gd::DeviceInfo& dev = gpu.info();
  std::printf(
      "GPU: %s (sm_%d, %d SMs, L2 %d MiB); median of %d rounds timing the copy, the call and every candidate in turn, "
      "L2 flushed before each run\n",
      dev.name.c_str(), dev.arch(), dev.sms, dev.l2_bytes >> 20, a.repeats);
  if (a.tile_slice != 0) std::printf("channels-last statistics tiles forced to %d bytes a pixel\n", a.tile_slice);
  gd::force_tile_slice_bytes(a.tile_slice);
  if (a.parts_from != 0) std::printf("finalize in parts forced for groups of %lld records and more\n", a.parts_from);
  gd::force_finalize_parts_from(a.parts_from);
  if (a.finalize_atomic) std::printf("groups in parts merged by one launch with atomics\n");
  gd::force_finalize_atomic(a.finalize_atomic);
  gt::EventTimer timer(gpu.context(), static_cast<std::size_t>(dev.l2_bytes));
  json rows = json::array();
  std::vector<std::string> lines;
  // (shape, dtype, activation) -> ratio to the copy per layout, for the last table.
  std::map<std::string, std::map<std::string, double>> by_layout;
  // One row: the shape in one dtype, layout and activation, with its own copy of the same bytes.
  const auto bench = [&](const std::vector<int64_t>& shape, DType dtype, gnsilu::Layout layout,
                         gnsilu::Activation activation) {
    const auto g = gd::make_geometry(shape, a.groups, layout);
    const RowTensors rt(gpu.context(), shape, dtype, a.groups, layout, activation);
    const std::size_t bytes = rt.bytes;
    const gnsilu::Problem& p = rt.p;

    const auto tuned_before = gd::counters().tuned.load();
    const auto t0 = Clock::now();
    gnsilu::group_norm_silu(p, timer.stream());  // resolves (and maybe tunes) the configuration
    GNSILU_CHECK(drv().cuStreamSynchronize(timer.stream()));
    const double first_call_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const bool tuned_now = gd::counters().tuned.load() > tuned_before;
    // Timed in the same interleaved rounds (each run after another one, as in an application): the copy, the
    // library's call, and every candidate on every path that can run: the library's path ("best by hand" and the
    // default), and the fastest of the other paths.
    const gnsilu::Path chosen = gd::choose_path(g, gnsilu::Path::Auto, dev.sms);
    std::vector<LaunchConfig> configs = a.configs;
    if (configs.empty()) configs.assign(gnsilu::candidate_configs().begin(), gnsilu::candidate_configs().end());
    std::vector<std::pair<gnsilu::Path, LaunchConfig>> timed;
    // The copy runs twice a round, before and after the library's call, so that neither the call nor any candidate
    // follows a run of its own configuration (the call's is one of the candidates).
    const auto copy_x = [&] { rt.copy(timer.stream()); };
    std::vector<std::function<void()>> bodies = {copy_x, [&] { gnsilu::group_norm_silu(p, timer.stream()); }, copy_x};
    for (gnsilu::Path path : a.paths) {
      if (path == gnsilu::Path::Fused && !gd::fused_eligible(g)) continue;
      for (const auto& c : configs) {
        timed.emplace_back(path, c);
        bodies.push_back([&rt, &timer, path, c] { rt.run(timer.stream(), path, c); });
      }
    }
    const std::vector<double> medians = timer.interleaved_medians_us(a.repeats, bodies);
    const double copy = medians[0], app = medians[1];
    json candidates = json::array();
    double best = 1e30, def = 0;
    LaunchConfig best_config;
    std::map<std::string, double> path_best;
    std::map<std::string, std::string> path_best_config;
    for (std::size_t k = 0; k < timed.size(); ++k) {
      const auto& [path, c] = timed[k];
      const double t = medians[3 + k];
      const std::string name = gnsilu::path_name(path);
      candidates.push_back({{"config", gd::to_string(c)}, {"path", name}, {"us", t}});
      if (!path_best.contains(name) || t < path_best[name]) {
        path_best[name] = t;
        path_best_config[name] = gd::to_string(c);
      }
      if (path != chosen) continue;
      if (c == gnsilu::default_config(chosen)) def = t;
      if (t < best) {
        best = t;
        best_config = c;
      }
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
  gd::force_finalize_parts_from(0);
  gd::force_finalize_atomic(false);
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
  const gt::PrimaryContext gpu;
  json out = {{"pid", getpid()}};
  json calls = json::array();
  for (DType dtype : a.dtypes) {
    for (const auto& shape : a.shapes) {
      const auto g = gd::make_geometry(shape, a.groups);
      const std::size_t bytes = static_cast<std::size_t>(g.numel) * gnsilu::dtype_size(dtype);
      const gd::DeviceBuffer x(gpu.context(), bytes), y(gpu.context(), bytes);
      fill_random(x, dtype, static_cast<std::size_t>(g.numel), 3);
      const gnsilu::Problem p = problem_over(x, y, dtype, shape, a.groups);
      auto t = Clock::now();
      gnsilu::group_norm_silu(p);
      GNSILU_CHECK(drv().cuCtxSynchronize());
      const double first = std::chrono::duration<double>(Clock::now() - t).count();
      t = Clock::now();
      gnsilu::group_norm_silu(p);
      GNSILU_CHECK(drv().cuCtxSynchronize());
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

// What ran just before a call changes its time (docs/PERFORMANCE.md, "Tuning and timing"): each configuration c timed
// right after one untimed run of a predecessor (a copy of x, or any configuration, c itself included), every pair once
// a round, rounds interleaved, L2 flushed between the predecessor and the timed run as before every timed run; the
// median per pair.
int run_after(const Args& a) {
  const gt::PrimaryContext gpu;
  const gd::DeviceInfo& dev = gpu.info();
  const gnsilu::Path path = a.paths.front();
  const gnsilu::Activation activation = a.activations.front();
  std::vector<LaunchConfig> configs = a.configs;
  if (configs.empty()) configs.assign(gnsilu::candidate_configs().begin(), gnsilu::candidate_configs().end());
  std::printf("GPU: %s (sm_%d, %d SMs, L2 %d MiB); %s path; each configuration (rows) timed right after a predecessor "
              "(columns), median of %d rounds, us\n",
              dev.name.c_str(), dev.arch(), dev.sms, dev.l2_bytes >> 20, gnsilu::path_name(path), a.repeats);
  gt::EventTimer timer(gpu.context(), static_cast<std::size_t>(dev.l2_bytes));
  json rows = json::array();
  for (DType dtype : a.dtypes) {
    for (const auto& shape : a.shapes) {
      for (gnsilu::Layout layout : a.layouts) {
        const auto g = gd::make_geometry(shape, a.groups, layout);
        if (path == gnsilu::Path::Fused && !gd::fused_eligible(g)) continue;
        const RowTensors rt(gpu.context(), shape, dtype, a.groups, layout, activation);
        const auto run = [&](const LaunchConfig& c) { rt.run(timer.stream(), path, c); };
        // Predecessor 0 is the copy, predecessor 1 + k configuration k.
        const std::size_t preds = configs.size() + 1;
        std::vector<std::vector<std::vector<double>>> times(configs.size(),
                                                            std::vector<std::vector<double>>(preds));
        for (const auto& c : configs) run(c);  // warm-up: compiled, loaded
        for (int r = 0; r < a.repeats; ++r) {
          for (std::size_t ci = 0; ci < configs.size(); ++ci) {
            for (std::size_t pi = 0; pi < preds; ++pi) {
              if (pi == 0) rt.copy(timer.stream());
              else run(configs[pi - 1]);
              times[ci][pi].push_back(timer.time_us([&] { run(configs[ci]); }));
            }
          }
        }
        std::printf("\n%s %s %s (%.1f MiB)\n%-14s %9s", shape_text(shape).c_str(), gnsilu::dtype_name(dtype),
                    gnsilu::layout_name(layout), rt.bytes / 1048576.0, "after:", "copy");
        for (const auto& c : configs) std::printf(" %13s", gd::to_string(c).c_str());
        std::printf("\n");
        json matrix = json::array();
        for (std::size_t ci = 0; ci < configs.size(); ++ci) {
          std::printf("%-14s", gd::to_string(configs[ci]).c_str());
          json medians = json::array();
          for (std::size_t pi = 0; pi < preds; ++pi) {
            const double us = gd::median_of(times[ci][pi]);
            medians.push_back(us);
            std::printf(pi == 0 ? " %9.1f" : " %13.1f", us);
          }
          std::printf("\n");
          matrix.push_back({{"config", gd::to_string(configs[ci])}, {"us_after_copy_then_each_config", medians}});
        }
        std::fflush(stdout);
        json names = json::array();
        for (const auto& c : configs) names.push_back(gd::to_string(c));
        rows.push_back({{"shape", shape_text(shape)}, {"dtype", gnsilu::dtype_name(dtype)},
                        {"layout", gnsilu::layout_name(layout)}, {"path", gnsilu::path_name(path)},
                        {"activation", gnsilu::activation_name(activation)}, {"mib", rt.bytes / 1048576.0},
                        {"configs", names}, {"rows", matrix}});
      }
    }
  }
  if (!a.json_path.empty()) std::ofstream(a.json_path) << rows.dump(1) << "\n";
  return 0;
}

// Writes the CUBIN of each kernel variant of the default configurations for this GPU into `dir`.
int run_cubin(const std::string& dir) {
  const gt::PrimaryContext gpu;
  const gd::DeviceInfo& dev = gpu.info();
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

// Median host microseconds a call of `call` over 20 rounds of `calls` calls, the context synchronized between rounds.
template <class F>
double host_us_per_call(F&& call, int calls = 500) {
  std::vector<double> per_call;
  for (int round = 0; round < 20; ++round) {
    const auto t = Clock::now();
    for (int i = 0; i < calls; ++i) call();
    per_call.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / calls);
    GNSILU_CHECK(drv().cuCtxSynchronize());
  }
  return gd::median_of(per_call);
}

// An empty kernel whose one parameter has the size of the kernels' Params, for the cost of a launch alone.
std::string noop_ptx() {
  return ".version 7.8\n.target sm_75\n.address_size 64\n.visible .entry gnsilu_noop(.param .align 8 .b8 p[" +
         std::to_string(sizeof(gnsilu::kernel::Params)) + "])\n{\n  ret;\n}\n";
}

// The host time of a resolved call (1x32x8x8 bf16: the GPU keeps up, so nothing waits for it), whole and by the
// driver calls it makes: context and device, the library's check of one pointer (check_device_range: the call makes
// four, x, y, weight and bias), the capture query, and a launch of an empty kernel with and without programmatic
// stream serialization (the split path launches chunk_stats plainly, finalize and apply with it on sm_90+; the fused
// path launches one kernel).
int run_overhead() {
  const gt::PrimaryContext gpu;
  const std::vector<int64_t> shape{1, 32, 8, 8};
  const gd::DeviceBuffer x(gpu.context(), 2 * 2048), y(gpu.context(), 2 * 2048), w(gpu.context(), 2 * 32),
      b(gpu.context(), 2 * 32);
  fill_random(x, DType::BF16, 2048, 1);
  fill_random(w, DType::BF16, 32, 2);
  fill_random(b, DType::BF16, 32, 3);
  gnsilu::Problem p;
  p.x = ptr(x);
  p.y = ptr(y);
  p.weight = ptr(w);
  p.bias = ptr(b);
  p.weight_dtype = p.bias_dtype = DType::BF16;
  p.shape = shape;
  gnsilu::LaunchOptions split, fused;
  split.path = gnsilu::Path::Split;
  fused.path = gnsilu::Path::Fused;
  for (const auto& o : {gnsilu::LaunchOptions{}, split, fused}) gnsilu::group_norm_silu(p, nullptr, {}, o);  // resolve
  GNSILU_CHECK(drv().cuCtxSynchronize());
  std::printf("host time of a call with its configuration resolved (1x32x8x8 bf16 with weight and bias; median of 20 "
              "rounds of 500 calls), us per call:\n");
  std::printf("  %-58s %7.2f\n", "group_norm_silu, path chosen by the library",
              host_us_per_call([&] { gnsilu::group_norm_silu(p); }));
  std::printf("  %-58s %7.2f\n", "group_norm_silu, split path (3 launches)",
              host_us_per_call([&] { gnsilu::group_norm_silu(p, nullptr, {}, split); }));
  std::printf("  %-58s %7.2f\n", "group_norm_silu, fused path (1 launch)",
              host_us_per_call([&] { gnsilu::group_norm_silu(p, nullptr, {}, fused); }));
  const gd::Driver& d = drv();
  std::printf("  %-58s %7.2f\n", "  cuCtxGetCurrent + cuCtxGetDevice", host_us_per_call([&] {
                CUcontext c = nullptr;
                CUdevice dev = 0;
                GNSILU_CHECK(d.cuCtxGetCurrent(&c));
                GNSILU_CHECK(d.cuCtxGetDevice(&dev));
              }));
  std::printf("  %-58s %7.2f\n", "  check_device_range (cuPointerGetAttributes, one pointer)", host_us_per_call([&] {
                gd::check_device_range("x", p.x, 2 * 2048, gpu.info());
              }));
  std::printf("  %-58s %7.2f\n", "  cuStreamIsCapturing", host_us_per_call([&] {
                CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
                GNSILU_CHECK(d.cuStreamIsCapturing(nullptr, &capture));
              }));
  const std::string ptx = noop_ptx();
  const gd::ModuleHandle module(gpu.context(), ptx.c_str());
  CUfunction noop = nullptr;
  GNSILU_CHECK(d.cuModuleGetFunction(&noop, module.get(), "gnsilu_noop"));
  gnsilu::kernel::Params params{};
  void* args[] = {&params};
  std::printf("  %-58s %7.2f\n", "  cuLaunchKernel (empty kernel, 1 block, a Params argument)", host_us_per_call([&] {
                GNSILU_CHECK(d.cuLaunchKernel(noop, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
              }));
  std::printf("  %-58s %7.2f\n", "  cuLaunchKernelEx (the same, programmatic serialization)", host_us_per_call([&] {
                CUlaunchAttribute attribute{};
                attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                attribute.value.programmaticStreamSerializationAllowed = 1;
                CUlaunchConfig config{};
                config.gridDimX = config.gridDimY = config.gridDimZ = 1;
                config.blockDimX = 32;
                config.blockDimY = config.blockDimZ = 1;
                config.attrs = &attribute;
                config.numAttrs = 1;
                GNSILU_CHECK(d.cuLaunchKernelEx(&config, noop, args, nullptr));
              }));
  GNSILU_CHECK(d.cuCtxSynchronize());
  return 0;
}

// gnsilu-run's inputs (the main job's check before gnsilu-bench had one): normal(0.3, 1.7) of std::mt19937 seeded
// 2026, drawn for x, then the weights (1 + 0.2 n), then the biases (0.1 n).
const gt::NormalSpec kCheckInputs{gt::Engine::Mt19937, 2026, 0.3f, 1.7f};

int run_check(const Args& a) {
  // A shape the groups do not fit is a usage error, GPU or not.
  for (const auto& shape : a.shapes)
    for (gnsilu::Layout layout : a.layouts) gd::make_geometry(shape, a.groups, layout);
  std::string why;
  if (!gt::gpu_present(why)) {
    std::printf("gnsilu-bench check: no GPU here (%s): nothing ran\n", why.c_str());
    return 0;
  }
  const gt::PrimaryContext gpu;
  const gd::DeviceInfo& dev = gpu.info();
  std::printf("GPU: %s (sm_%d, %d SMs, L2 %d MiB); gnsilu as an application calls it, median of %d runs (CUDA "
              "events, L2 flushed before each), every output compared bit for bit with the CPU reference\n",
              dev.name.c_str(), dev.arch(), dev.sms, dev.l2_bytes >> 20, a.repeats);
  std::fflush(stdout);
  gt::EventTimer timer(gpu.context(), static_cast<std::size_t>(dev.l2_bytes));
  json rows = json::array();
  std::size_t failed_rows = 0;
  for (DType dtype : a.dtypes) {
    for (const auto& shape : a.shapes) {
      const auto g = gd::make_geometry(shape, a.groups);
      const std::size_t n = static_cast<std::size_t>(g.numel), size = gnsilu::dtype_size(dtype);
      const std::size_t bytes = n * size, c = static_cast<std::size_t>(shape[1]);
      // The same inputs for every layout and activation of the shape: its own draws, so a row does not depend
      // on the rows before it.
      gt::NormalSource source(kCheckInputs);
      std::vector<unsigned char> x(bytes), y(bytes), expected(bytes);
      source.fill(x.data(), n, dtype);
      std::vector<float> weight(c), bias(c);
      for (auto& v : weight) v = 1.0f + 0.2f * source.next();
      for (auto& v : bias) v = 0.1f * source.next();
      const gd::DeviceBuffer dx(gpu.context(), bytes), dy(gpu.context(), bytes), dw(gpu.context(), 4 * c),
          db(gpu.context(), 4 * c);
      GNSILU_CHECK(drv().cuMemcpyHtoD_v2(dx.get(), x.data(), bytes));
      GNSILU_CHECK(drv().cuMemcpyHtoD_v2(dw.get(), weight.data(), 4 * c));
      GNSILU_CHECK(drv().cuMemcpyHtoD_v2(db.get(), bias.data(), 4 * c));
      GNSILU_CHECK(drv().cuCtxSynchronize());  // the copies are done before the timer's stream reads them
      for (gnsilu::Activation activation : a.activations) {
        for (gnsilu::Layout layout : a.layouts) {
          gnsilu::Problem p;
          p.x = x.data();
          p.x_dtype = dtype;
          p.y = expected.data();
          p.y_dtype = dtype;
          p.shape = shape;
          p.num_groups = a.groups;
          p.weight = weight.data();
          p.bias = bias.data();
          p.x_layout = p.y_layout = layout;
          p.activation = activation;
          auto t = Clock::now();
          gnsilu::reference_group_norm_silu(p);
          const double reference_s = gt::seconds_since(t);

          p.x = ptr(dx);
          p.y = ptr(dy);
          p.weight = ptr(dw);
          p.bias = ptr(db);
          // No output left over from the row before.
          GNSILU_CHECK(drv().cuMemsetD8Async(dy.get(), 0xff, bytes, timer.stream()));
          const auto tuned_before = gd::counters().tuned.load();
          t = Clock::now();
          gnsilu::group_norm_silu(p, timer.stream());  // resolves (and maybe tunes) the configuration
          GNSILU_CHECK(drv().cuStreamSynchronize(timer.stream()));
          const double first_call_s = gt::seconds_since(t);
          const bool tuned_now = gd::counters().tuned.load() > tuned_before;
          const double us = timer.median_us(a.repeats, [&] { gnsilu::group_norm_silu(p, timer.stream()); });
          GNSILU_CHECK(drv().cuMemcpyDtoH_v2(y.data(), dy.get(), bytes));  // the last timed run's output

          std::size_t differ = 0, first = n;
          for (std::size_t i = 0; i < n; ++i) {
            if (std::memcmp(&y[i * size], &expected[i * size], size) != 0) {
              if (differ++ == 0) first = i;
            }
          }
          failed_rows += differ != 0;
          const std::string kind = std::string(gnsilu::layout_name(layout)) +
                                   (activation == gnsilu::Activation::None ? " gn" : "");
          std::printf("%-18s %-5s %-7s %lld groups: %9.1f us, %zu of %zu outputs differ from the CPU reference%s "
                      "(reference %.1f s, first call %.2f s)\n",
                      shape_text(shape).c_str(), gnsilu::dtype_name(dtype), kind.c_str(),
                      static_cast<long long>(a.groups), us, differ, n, tuned_now ? ", tuned now" : "", reference_s,
                      first_call_s);
          if (differ != 0) {
            uint32_t got = 0, want = 0;
            std::memcpy(&got, &y[first * size], size);
            std::memcpy(&want, &expected[first * size], size);
            std::printf("  first difference at element %zu: 0x%0*x, the reference 0x%0*x\n", first,
                        static_cast<int>(2 * size), got, static_cast<int>(2 * size), want);
          }
          std::fflush(stdout);
          rows.push_back({{"shape", shape_text(shape)}, {"dtype", gnsilu::dtype_name(dtype)}, {"groups", a.groups},
                          {"layout", gnsilu::layout_name(layout)},
                          {"activation", gnsilu::activation_name(activation)}, {"gnsilu_us", us},
                          {"repeats", a.repeats}, {"outputs", n}, {"outputs_differ", differ},
                          {"tuned_in_this_run", tuned_now}, {"first_call_s", first_call_s},
                          {"reference_s", reference_s}});
        }
      }
    }
  }
  if (!a.json_path.empty()) std::ofstream(a.json_path) << rows.dump(1) << "\n";
  if (failed_rows != 0) {
    std::printf("%zu of %zu rows differ from the CPU reference\n", failed_rows, rows.size());
    return 1;
  }
  std::printf("all %zu rows bit for bit equal to the CPU reference\n", rows.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    if (a.command == "check") return run_check(a);  // says so and exits 0 without a GPU
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
    if (a.command == "after") return run_after(a);
    std::fprintf(stderr, "gnsilu-bench: unknown command %s (shapes, after, start, overhead, worker, cubin, check)\n", a.command.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gnsilu-bench: %s\n", e.what());
    return 1;
  }
}
