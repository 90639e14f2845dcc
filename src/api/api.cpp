// The C++ API: validate, find the context and device, check the pointers, plan, find the kernels, launch.
#include <algorithm>
#include <array>
#include <string>

#include "cache/cache.hpp"
#include "tuning/config_table.hpp"
#include "base/device.hpp"
#include "base/driver.hpp"
#include "base/errors.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/kernels.hpp"
#include "runtime/launch.hpp"
#include "runtime/plan.hpp"
#include "runtime/validate.hpp"
#include "runtime/workspace.hpp"


namespace gnsilu {
namespace {


// The device a call runs on, checked (compute capability 7.5 or newer).
const detail::DeviceInfo& usable_device(const detail::ContextScope& scope) {
  const detail::DeviceInfo& dev = detail::device_info(scope.device());
  if (dev.arch() < 75) {
    throw Error(Status::UnsupportedDevice, "gnsilu: " + dev.name + " has compute capability " +
                                               std::to_string(dev.major) + "." + std::to_string(dev.minor) +
                                               "; gnsilu needs 7.5 or newer");
  }
  return dev;
}

void check_pointers(const Problem& p, const detail::Geometry& g, const detail::DeviceInfo& dev,
                    const Workspace& ws, std::size_t needed) {
  const std::size_t x_bytes = static_cast<std::size_t>(g.numel) * dtype_size(p.x_dtype);
  const std::size_t y_bytes = static_cast<std::size_t>(g.y_numel) * dtype_size(p.y_dtype);
  detail::check_device_range("x", p.x, x_bytes, dev);
  detail::check_device_range("y", p.y, y_bytes, dev);
  const std::size_t w_bytes = p.weight != nullptr ? static_cast<std::size_t>(g.c) * dtype_size(p.weight_dtype) : 0;
  const std::size_t b_bytes = p.bias != nullptr ? static_cast<std::size_t>(g.c) * dtype_size(p.bias_dtype) : 0;
  if (p.weight != nullptr) detail::check_device_range("weight", p.weight, w_bytes, dev);
  if (p.bias != nullptr) detail::check_device_range("bias", p.bias, b_bytes, dev);
  const std::size_t ib_bytes = p.input_bias != nullptr ? static_cast<std::size_t>(g.c) * dtype_size(p.x_dtype) : 0;
  if (p.input_bias != nullptr) detail::check_device_range("input_bias", p.input_bias, ib_bytes, dev);
  const detail::Range x{p.x, x_bytes}, y{p.y, y_bytes}, w{p.weight, w_bytes}, b{p.bias, b_bytes},
      ib{p.input_bias, ib_bytes}, work{ws.data, ws.bytes};
  if (y.overlaps(x) && g.padded()) detail::throw_invalid("y", "overlaps x; a padded output cannot be in place");
  if (y.overlaps(x) && !(p.x == p.y && dtype_size(p.x_dtype) == dtype_size(p.y_dtype))) {
    detail::throw_invalid("y", "overlaps x; only exact in-place (y == x with dtypes of one size) is allowed");
  }
  if (y.overlaps(w)) detail::throw_invalid("y", "overlaps weight");
  if (y.overlaps(b)) detail::throw_invalid("y", "overlaps bias");
  if (y.overlaps(ib)) detail::throw_invalid("input_bias", "overlaps y");
  if (ws.data != nullptr) {
    if (ws.bytes < needed) {
      detail::throw_invalid("workspace_bytes", std::to_string(ws.bytes) + " is too small: this shape needs " +
                                                   std::to_string(needed) + " (see workspace_size)");
    }
    detail::check_device_range("workspace", ws.data, ws.bytes, dev);
    for (const auto& [other, name] : {std::pair{x, "x"}, std::pair{y, "y"}, std::pair{w, "weight"},
                                      std::pair{b, "bias"}, std::pair{ib, "input_bias"}}) {
      if (work.overlaps(other)) detail::throw_invalid("workspace", std::string("overlaps ") + name);
    }
  } else if (ws.bytes != 0) {
    detail::throw_invalid("workspace", "is null but workspace_bytes is " + std::to_string(ws.bytes));
  }
}

}  // namespace

std::size_t workspace_size(std::span<const int64_t> shape, int64_t num_groups) {
  return detail::workspace_bytes(detail::make_geometry(shape, num_groups));
}

std::size_t workspace_size(const Problem& problem) {
  return detail::workspace_bytes(detail::make_geometry(problem.shape, problem.num_groups, problem.x_layout));
}

void group_norm_silu(const Problem& problem, gnsilu_stream stream, Workspace workspace, const LaunchOptions& options) {
  const detail::Geometry g = detail::validate_problem(problem);
  if (options.config) detail::check_config(*options.config);
  detail::check_path(g, options.path);  // before the device: a bad request is refused without a GPU
  if (g.numel == 0) return;

  detail::driver();
  detail::ContextScope scope(problem.x);
  const detail::DeviceInfo& dev = usable_device(scope);
  check_pointers(problem, g, dev, workspace, detail::workspace_bytes(g));

  const detail::Call call{problem, g, dev, scope.context(), stream, detail::choose_path(g, options.path, dev.sms),
                          workspace.data};
  const LaunchConfig config =
      options.config ? *options.config : detail::config_for(call, options.tune.value_or(detail::process_tune_policy()));
  detail::launch_call(call, config);
}

namespace {

std::size_t stats_bytes(const detail::Geometry& g) {
  return static_cast<std::size_t>(g.groups_total) * kStatsWords * sizeof(int64_t);
}

}  // namespace

void group_stats(const Problem& region, int64_t* stats, gnsilu_stream stream, Workspace workspace) {
  const detail::Geometry g = detail::validate_stats_problem(region);
  if (stats == nullptr) detail::throw_invalid("stats", "is null");
  if (g.groups_total == 0) return;
  detail::driver();
  detail::ContextScope scope(region.x != nullptr ? static_cast<const void*>(region.x) : stats);
  const detail::DeviceInfo& dev = usable_device(scope);
  // Checked as a call that writes y over x in place: nothing but x is read, and y is never written.
  Problem p = region;
  p.y = const_cast<void*>(region.x);
  p.y_dtype = region.x_dtype;
  p.y_layout = region.x_layout;
  p.weight = p.bias = nullptr;
  const std::size_t bytes = stats_bytes(g);
  detail::check_device_range("stats", stats, bytes, dev);
  if (g.numel != 0) check_pointers(p, g, dev, workspace, detail::workspace_bytes(g));
  const detail::Range out{stats, bytes}, x{region.x, static_cast<std::size_t>(g.numel) * dtype_size(region.x_dtype)},
      work{workspace.data, workspace.bytes};
  if (out.overlaps(x)) detail::throw_invalid("stats", "overlaps x");
  if (out.overlaps(work)) detail::throw_invalid("stats", "overlaps workspace");
  const detail::Range ib{region.input_bias,
                         region.input_bias != nullptr ? static_cast<std::size_t>(g.c) * dtype_size(region.x_dtype) : 0};
  if (out.overlaps(ib)) detail::throw_invalid("stats", "overlaps input_bias");
  if (g.numel == 0) {  // groups of no element: records of zeros
    GNSILU_CHECK(detail::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(stats), 0, bytes,
                                                  static_cast<CUstream>(stream)));
    return;
  }
  detail::Call call{p, g, dev, scope.context(), stream, Path::Split, workspace.data};
  call.stats_mode = kernel::kStatsWrite;
  call.group_stats = stats;
  detail::launch_call(call, default_config(Path::Split));
}

void group_norm_apply(const Problem& problem, const int64_t* stats, gnsilu_stream stream, Workspace workspace) {
  const detail::Geometry g = detail::validate_problem(problem);
  if (stats == nullptr) detail::throw_invalid("stats", "is null");
  if (g.numel == 0) return;
  detail::driver();
  detail::ContextScope scope(problem.x);
  const detail::DeviceInfo& dev = usable_device(scope);
  check_pointers(problem, g, dev, workspace, detail::workspace_bytes(g));
  const std::size_t bytes = stats_bytes(g);
  detail::check_device_range("stats", stats, bytes, dev);
  const detail::Range in{stats, bytes},
      y{problem.y, static_cast<std::size_t>(g.y_numel) * dtype_size(problem.y_dtype)},
      work{workspace.data, workspace.bytes};
  if (in.overlaps(y)) detail::throw_invalid("stats", "overlaps y");
  if (in.overlaps(work)) detail::throw_invalid("stats", "overlaps workspace");
  detail::Call call{problem, g, dev, scope.context(), stream, Path::Split, workspace.data};
  call.stats_mode = kernel::kStatsRead;
  call.group_stats = const_cast<int64_t*>(stats);  // read only (kStatsRead)
  detail::launch_call(call, default_config(Path::Split));
}

void check_device() {
  const detail::Driver& d = detail::driver();
  int count = 0;
  GNSILU_CHECK(d.cuDeviceGetCount(&count));
  if (count == 0) throw Error(Status::NoDevice, "gnsilu: no CUDA device");
  bool any = false;
  for (int i = 0; i < count; ++i) {
    CUdevice device = 0;
    GNSILU_CHECK(d.cuDeviceGet(&device, i));
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

}  // namespace gnsilu
