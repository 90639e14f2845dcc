#include "base/launch_config.hpp"

#include <array>

#include "base/errors.hpp"

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

}  // namespace

std::span<const LaunchConfig> candidate_configs() { return kCandidates; }

LaunchConfig default_config(Path path) { return path == Path::Fused ? kCandidates[1] : kCandidates[0]; }

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
