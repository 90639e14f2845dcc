// Argument checks that need no GPU: dtypes, null pointers, shape and groups, eps. Shared by the GPU entry
// point and the CPU reference. Each failure is Error(InvalidArgument) naming the argument.
#pragma once

#include "gnsilu/gnsilu.hpp"
#include "runtime/plan.hpp"

namespace gnsilu::detail {

Geometry validate_problem(const Problem& problem);
// For group_stats: x, x_dtype, x_layout, shape and num_groups only (y, weight, bias, eps, activation are not read;
// x may be null when the shape holds no element).
Geometry validate_stats_problem(const Problem& problem);

}  // namespace gnsilu::detail
