// The C++ API: validate, find the context and device, check the pointers, plan, find the kernels, launch.
#include <algorithm>
#include <array>
#include <string>

#include "cache.hpp"
#include "config_table.hpp"
#include "device.hpp"
#include "driver.hpp"
#include "errors.hpp"
#include "gnsilu/gnsilu.hpp"
#include "kernels.hpp"
#include "launch.hpp"
#include "plan.hpp"
#include "validate.hpp"
#include "workspace.hpp"

#ifndef GNSILU_VERSION_STRING
#define GNSILU_VERSION_STRING "0.0.0"
#endif

namespace gnsilu {
namespace {

// What the tuner times. The split path's default first, then the fused path's. On the H200 with the v6
// kernels, 8-warp blocks (e16 w8 s1 p4) were the fastest or within 1.5% of it for every split shape timed
// from 4 MiB to 1 GiB (bf16 and fp16), where 4-warp blocks with two chunks in flight (the earlier default)
// were up to 10% slower (docs/PERFORMANCE.md, v7); small fused activations favour 16-warp blocks.
constexpr std::array<LaunchConfig, 6> kCandidates = {{
    {16, 8, 1, 4},
    {32, 16, 1, 2},
    {16, 4, 2, 8},
    {8, 4, 1, 8},
    {32, 8, 2, 2},
    {8, 4, 2, 8},
}};

void check_pointers(const Problem& p, const detail::Geometry& g, const detail::DeviceInfo& dev,
                    const Workspace& ws, std::size_t needed) {
  const std::size_t x_bytes = static_cast<std::size_t>(g.numel) * dtype_size(p.x_dtype);
  const std::size_t y_bytes = static_cast<std::size_t>(g.numel) * dtype_size(p.y_dtype);
  detail::check_device_range("x", p.x, x_bytes, dev);
  detail::check_device_range("y", p.y, y_bytes, dev);
  const std::size_t w_bytes = p.weight != nullptr ? static_cast<std::size_t>(g.c) * dtype_size(p.weight_dtype) : 0;
  const std::size_t b_bytes = p.bias != nullptr ? static_cast<std::size_t>(g.c) * dtype_size(p.bias_dtype) : 0;
  if (p.weight != nullptr) detail::check_device_range("weight", p.weight, w_bytes, dev);
  if (p.bias != nullptr) detail::check_device_range("bias", p.bias, b_bytes, dev);
  const detail::Range x{p.x, x_bytes}, y{p.y, y_bytes}, w{p.weight, w_bytes}, b{p.bias, b_bytes},
      work{ws.data, ws.bytes};
  if (y.overlaps(x) && !(p.x == p.y && dtype_size(p.x_dtype) == dtype_size(p.y_dtype))) {
    detail::throw_invalid("y", "overlaps x; only exact in-place (y == x with dtypes of one size) is allowed");
  }
  if (y.overlaps(w)) detail::throw_invalid("y", "overlaps weight");
  if (y.overlaps(b)) detail::throw_invalid("y", "overlaps bias");
  if (ws.data != nullptr) {
    if (ws.bytes < needed) {
      detail::throw_invalid("workspace_bytes", std::to_string(ws.bytes) + " is too small: this shape needs " +
                                                   std::to_string(needed) + " (see workspace_size)");
    }
    detail::check_device_range("workspace", ws.data, ws.bytes, dev);
    for (const auto& [other, name] : {std::pair{x, "x"}, std::pair{y, "y"}, std::pair{w, "weight"}, std::pair{b, "bias"}}) {
      if (work.overlaps(other)) detail::throw_invalid("workspace", std::string("overlaps ") + name);
    }
  } else if (ws.bytes != 0) {
    detail::throw_invalid("workspace", "is null but workspace_bytes is " + std::to_string(ws.bytes));
  }
}

}  // namespace

std::span<const LaunchConfig> candidate_configs() { return kCandidates; }

LaunchConfig default_config(Path path) { return path == Path::Fused ? kCandidates[1] : kCandidates[0]; }

std::size_t workspace_size(std::span<const int64_t> shape, int64_t num_groups) {
  return detail::workspace_bytes(detail::make_geometry(shape, num_groups));
}

std::size_t workspace_size(const Problem& problem) {
  return detail::workspace_bytes(detail::make_geometry(problem.shape, problem.num_groups, problem.x_layout));
}

void group_norm_silu(const Problem& problem, gnsilu_stream stream, Workspace workspace, const LaunchOptions& options) {
  const detail::Geometry g = detail::validate_problem(problem);
  if (options.config) detail::check_config(*options.config);
  if (options.path == Path::Fused && !detail::fused_eligible(g)) {
    detail::throw_invalid("options.path", "the fused path takes groups of at most 64 Ki elements and 256 channels");
  }
  if (g.numel == 0) return;

  detail::driver();
  detail::ContextScope scope(problem.x);
  const detail::DeviceInfo& dev = detail::device_info(scope.device());
  if (dev.arch() < 75) {
    throw Error(Status::UnsupportedDevice, "gnsilu: " + dev.name + " has compute capability " +
                                               std::to_string(dev.major) + "." + std::to_string(dev.minor) +
                                               "; gnsilu needs 7.5 or newer");
  }
  check_pointers(problem, g, dev, workspace, detail::workspace_bytes(g));

  const Path path = detail::choose_path(g, options.path, dev.sms);
  const LaunchConfig config =
      options.config ? *options.config
                     : detail::config_for({problem, g, dev, scope.context(), stream, path},
                                          options.tune.value_or(detail::process_tune_policy()));
  detail::launch_problem(problem, g, dev, scope.context(), stream, workspace.data, config, path);
}

void check_device() {
  const detail::Driver& d = detail::driver();
  int count = 0;
  GNSILU_CU(d.cuDeviceGetCount(&count));
  if (count == 0) throw Error(Status::NoDevice, "gnsilu: no CUDA device");
  bool any = false;
  for (int i = 0; i < count; ++i) {
    CUdevice device = 0;
    GNSILU_CU(d.cuDeviceGet(&device, i));
    if (detail::device_info(device).arch() >= 75) any = true;
  }
  if (!any) throw Error(Status::UnsupportedDevice, "gnsilu: no CUDA device of compute capability 7.5 or newer");
}

void release_workspaces() { detail::release_internal_workspaces(); }

void set_tune_policy(TunePolicy policy) {
  if (policy != TunePolicy::OnFirstUse && policy != TunePolicy::CachedOnly && policy != TunePolicy::Never) {
    detail::throw_invalid("policy", "unknown tuning policy " + std::to_string(static_cast<int>(policy)));
  }
  detail::set_process_tune_policy(policy);
}

TunePolicy tune_policy() { return detail::process_tune_policy(); }

void set_cache_paths(const std::string& user_path, std::span<const std::string> shared_paths) {
  cache::Settings settings = cache::settings_from_environment();
  settings.user_path = user_path;
  settings.shared_paths.assign(shared_paths.begin(), shared_paths.end());
  cache::configure_process_cache(settings);
}

const char* version() { return GNSILU_VERSION_STRING; }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::BF16: return "bf16";
    case DType::FP16: return "fp16";
    case DType::FP32: return "fp32";
    case DType::None: return "none";
  }
  return "unknown";
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::ChannelsFirst: return "nchw";
    case Layout::ChannelsLast: return "nhwc";
  }
  return "unknown";
}

const char* activation_name(Activation activation) {
  switch (activation) {
    case Activation::SiLU: return "silu";
    case Activation::None: return "none";
  }
  return "unknown";
}

const char* path_name(Path path) {
  switch (path) {
    case Path::Auto: return "auto";
    case Path::Fused: return "fused";
    case Path::Split: return "split";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::BF16:
    case DType::FP16: return 2;
    case DType::FP32: return 4;
    default: return 0;
  }
}

}  // namespace gnsilu
