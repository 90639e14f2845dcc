// gnsilu: the CPU reference. The same arithmetic (kernels/gnsilu_math.cuh) and the same exact statistics
// (kernels/gnsilu_exact.cuh, summed element by element) as the GPU kernels, so its output is bit-identical to
// theirs; tests compare the two, and the tuner can check a candidate against it. Pointers in `problem` are host
// pointers here.
#pragma once

#include "gnsilu/gnsilu.hpp"

namespace gnsilu {

// Computes y on the host with `threads` threads (0: one per hardware thread). Throws Error on bad input,
// with the same checks as group_norm_silu apart from the device ones.
GNSILU_API void reference_group_norm_silu(const Problem& problem, unsigned threads = 0);

// group_stats and group_norm_apply (gnsilu.hpp) on the host: the same records and the same bits.
GNSILU_API void reference_group_stats(const Problem& region, int64_t* stats, unsigned threads = 0);
GNSILU_API void reference_group_norm_apply(const Problem& problem, const int64_t* stats, unsigned threads = 0);

}  // namespace gnsilu
