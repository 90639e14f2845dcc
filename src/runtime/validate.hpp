// Argument checks that need no GPU: dtypes, null pointers, shape and groups, eps. Shared by the GPU entry
// point and the CPU reference. Each failure is Error(InvalidArgument) naming the argument.
#pragma once

#include "gnsilu/gnsilu.hpp"
#include "runtime/plan.hpp"

namespace gnsilu::detail {

Geometry validate_problem(const Problem& problem);

}  // namespace gnsilu::detail
