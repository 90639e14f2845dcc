// One call, as the API builds it once after validation and hands it down: the problem, its geometry, the device,
// context and stream, the path (decided once, never Auto) and the caller's workspace. The tuning layer keys and
// tunes by it; the launcher launches it; the tuner builds its own for its scratch runs.
#pragma once

#include <cuda.h>

#include "base/device.hpp"
#include "gnsilu/gnsilu.hpp"
#include "runtime/plan.hpp"

namespace gnsilu::detail {

struct Call {
  const Problem& problem;
  const Geometry& geometry;
  const DeviceInfo& device;
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  Path path = Path::Split;    // decided by choose_path (Fused or Split)
  void* workspace = nullptr;  // at least workspace_bytes(geometry) bytes, or null for the library's own
  // group_stats and group_norm_apply (split path only): kernel::kStatsWrite writes each group's statistics to
  // group_stats and launches no apply; kernel::kStatsRead takes them from group_stats and launches no chunk_stats.
  int stats_mode = 0;
  void* group_stats = nullptr;
};

}  // namespace gnsilu::detail
