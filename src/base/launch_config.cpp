#include "base/launch_config.hpp"

#include <array>

#include "base/errors.hpp"

namespace gnsilu {
namespace {

// What the tuner times; the order is part of test_compile's pass keys (its kernel names), so the defaults are named by
// index below rather than by place. On the H200 with the exact statistics, every candidate timed by hand on 21 split
// shapes from 1 to 1024 MiB, bf16 and fp16, both layouts (76 rows; docs/PERFORMANCE.md, "The tuner and the defaults"):
// e16 w4 s2 p8 was within 2.1% of each row's best from 64 MiB and 1.3% slower than the best in geometric mean (11% at
// most), where e16 w8 s1 p4 (the default before it) was 5.3% slower in geometric mean and up to 30% (the channels-last
// statistics). Small fused activations favour 16-warp blocks (0.6% from the best in geometric mean).
constexpr std::array<LaunchConfig, 6> kCandidates = {{
    {16, 8, 1, 4},
    {32, 16, 1, 2},
    {16, 4, 2, 8},
    {8, 4, 1, 8},
    {32, 8, 2, 2},
    {8, 4, 2, 8},
}};
constexpr std::size_t kSplitDefault = 2;  // e16 w4 s2 p8
constexpr std::size_t kFusedDefault = 1;  // e32 w16 s1 p2

}  // namespace

std::span<const LaunchConfig> candidate_configs() { return kCandidates; }

LaunchConfig default_config(Path path) {
  return path == Path::Fused ? kCandidates[kFusedDefault] : kCandidates[kSplitDefault];
}

namespace detail {

void check_config(const LaunchConfig& c) {
  if (c.elems_per_load != 8 && c.elems_per_load != 16 && c.elems_per_load != 32)
    throw_invalid("config.elems_per_load", "must be 8, 16 or 32, got " + std::to_string(c.elems_per_load));
  if (c.warps < 1 || c.warps > 32) throw_invalid("config.warps", "must be 1 to 32, got " + std::to_string(c.warps));
  if (c.stages != 1 && c.stages != 2) throw_invalid("config.stages", "must be 1 or 2, got " + std::to_string(c.stages));
  if (c.programs_per_sm < 1 || c.programs_per_sm > 64)
    throw_invalid("config.programs_per_sm", "must be 1 to 64, got " + std::to_string(c.programs_per_sm));
}

std::string to_string(const LaunchConfig& c) {
  std::string text = "e";  // appended, not "e" + std::to_string(...): GCC 12 warns (-Wrestrict) on the latter
  text += std::to_string(c.elems_per_load);
  text += " w";
  text += std::to_string(c.warps);
  text += " s";
  text += std::to_string(c.stages);
  text += " p";
  text += std::to_string(c.programs_per_sm);
  return text;
}

}  // namespace detail
}  // namespace gnsilu
